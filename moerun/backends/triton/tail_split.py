"""The tail split of the persistent kernels (``ExpertsConfig.tail_split``): the tiles of the
last, partly filled round are cut along K over the idle programs.

A persistent launch of ``G`` programs walks ``tiles`` output tiles as ``tile = pid, pid + G,
...``, so it takes ``ceil(tiles / G)`` tile-times while the work is ``tiles / G`` of them.
When the last round holds ``rem = tiles % G`` tiles, ``G - rem`` programs idle through it:
mixtral T=1024's down GEMM has 2-3 blocks of 128 rows per expert, 16 tiles of 256 columns
each, about 300 tiles on 132 SMs: three rounds for 2.3 rounds of work.

With the split, the first ``main = tiles - rem`` tiles run as before, and each of the
``rem`` tail tiles is cut into ``parts = min(TAIL_MAX_PARTS, G // rem)`` equal ranges of its
K steps, one per program (``rem * parts <= G`` units) -- when that pays: a part's
``k_tiles / parts`` steps plus about ``min_steps`` of overhead (a pipeline fill, the
partials' round trip) under a whole tile's ``k_tiles``; otherwise the tail tiles run whole.
Units run in tile order with the part fastest, so part ``j`` of neighbouring tiles (the
``GROUP_M`` blocks that share a weight tile) runs at the same time over the same K steps and
reads that weight slice from L2, as whole tiles do. (A stream-K tail, which spreads all
``rem * k_tiles`` steps evenly over every program, ranges straddling tiles, was measured
slower; the reading, not profiled, is that its programs leave that lockstep. See
docs/DECISIONS.md, "The persistent kernels' tail split".)

Every unit stores its fp32 partial ``[BM, W]`` in its scratch slot, then takes a ticket on
its tile's arrival counter; the unit that arrives last sums the tile's ``parts`` partials
**in part order** (so the bits do not depend on the arrival order) and runs the epilogue.
Everything is decided on the device from the tiles in use: no host sync, graph-capturable;
counters must be zero on entry (``moe_align`` zeroes them in its launch).

Device helpers, inlined into the kernels of ``persistent.py``, and the host side of their
scratch (:class:`TailScratch`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

__all__ = ["tail_plan", "tail_unit", "tail_reduce", "TAIL_MIN_STEPS", "TAIL_MAX_PARTS",
           "TailScratch", "tail_scratch", "tail_buffers"]

#: about what a part costs besides its K steps (a pipeline fill, the partials' round trip), in
#: K steps; also the shortest part
TAIL_MIN_STEPS = 16
#: the most parts a tail tile is cut into (and its device-code twin: jit code reads only
#: constexpr globals)
TAIL_MAX_PARTS = 4
_MAX_PARTS = tl.constexpr(TAIL_MAX_PARTS)


@triton.jit
def tail_plan(num_tiles, num_programs, k_tiles, min_steps):
    """``(main, rem, parts)``: the tiles walked whole, the tail tiles and the parts each is cut
    into (``parts == 1``: no split, ``main == num_tiles``). Device code; pure."""
    rem = num_tiles % num_programs
    parts = tl.minimum(num_programs // tl.maximum(rem, 1), _MAX_PARTS)
    pays = (rem > 0) & (parts > 1) & (k_tiles // tl.maximum(parts, 1) + min_steps < k_tiles)
    parts = tl.where(pays, parts, 1)
    return tl.where(pays, num_tiles - rem, num_tiles), rem, parts


@triton.jit
def tail_unit(rem, parts, k_tiles):
    """This program's tail unit: ``(live, t, k_lo, k_hi)``: whether it has one, its tail tile
    ``t`` (add ``main`` for the tile index) and its K steps ``[k_lo, k_hi)`` (part ``pid %
    parts``, ranges as even as integer division makes them). Device code; pure."""
    unit = tl.program_id(0)
    live = (parts > 1) & (unit < rem * parts)
    part = unit % parts
    return live, unit // parts, part * k_tiles // parts, (part + 1) * k_tiles // parts


@triton.jit
def tail_reduce(acc, ws_ptr, cnt_ptr, t, parts, BLOCK_M: tl.constexpr, WIDTH: tl.constexpr):
    """Store this program's fp32 partial ``acc [BM, WIDTH]`` in slot ``pid`` of ``ws [G, BM *
    WIDTH]``, take a ticket on counter ``t`` of ``cnt`` (int32, zero on entry) and return
    ``(total, last)``: ``last`` for the unit that arrived last, ``total`` the sum of the tile's
    ``parts`` partials in part order (zeros elsewhere).

    Device code: global stores, one acq_rel atomic, and (last only) ``parts`` L1-bypassing
    loads; two CTA barriers order every thread's store before the ticket and the ticket
    before the loads (the pattern of ``down._down_direct_pairs_kernel``)."""
    offs = tl.arange(0, BLOCK_M)[:, None] * WIDTH + tl.arange(0, WIDTH)[None, :]
    row = BLOCK_M * WIDTH
    tl.store(ws_ptr + tl.program_id(0).to(tl.int64) * row + offs, acc)
    tl.debug_barrier()  # every thread's partial stored before the ticket (release)
    ticket = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel")
    last = ticket == parts - 1
    total = tl.zeros_like(acc)
    if last:
        tl.debug_barrier()
        for p in range(0, parts):
            total += tl.load(ws_ptr + (t * parts + p).to(tl.int64) * row + offs,
                             cache_modifier=".cg")
    return total, last


@dataclass(frozen=True)
class TailScratch:
    """Scratch of the tail split (``tail_split.py``) for one call's two persistent launches.

    Fields: ``partials`` fp32, ``programs`` slots of the wider of the two GEMMs' tiles
    (the launches run one after the other on one stream, so they share it); ``zero`` fp32
    ``[2 * programs]``, to be zeroed before the first launch (``moe_align(zero=...)``), read
    as int32 arrival counters: the first half gate/up's, the second down's; ``programs`` the
    persistent grid both launches use."""

    partials: torch.Tensor
    zero: torch.Tensor
    programs: int


def tail_scratch(cfg, programs: int, device: torch.device) -> TailScratch:
    """The :class:`TailScratch` of an ``ExpertsConfig`` (``cfg.tail_split``) for launches
    of at most ``programs`` programs (``persistent.persistent_programs``). One uninitialised
    allocation; no device work."""
    n = programs * cfg.block_m * max(2 * cfg.gate_up.block_n, cfg.down.block_n)
    buf = torch.empty(n + 2 * programs, dtype=torch.float32, device=device)  # one allocation
    return TailScratch(partials=buf.narrow(0, 0, n), zero=buf.narrow(0, n, 2 * programs),
                       programs=programs)


def tail_buffers(tail: TailScratch | None, tail_split: bool, programs: int, row: int,
                 half: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(partials, counters)`` for one launch of ``programs`` programs whose tiles hold ``row``
    fp32 elements: ``like`` twice without the split (the kernel reads neither), else
    ``tail``'s (counters: half ``half`` of its zeroed ones), or fresh ones when ``tail`` is
    None (zeroed counters: one memset). Host only; no sync."""
    if not tail_split:
        return like, like
    if tail is None:
        return (torch.empty(programs * row, dtype=torch.float32, device=like.device),
                torch.zeros(programs, dtype=torch.int32, device=like.device))
    if tail.programs < programs or tail.partials.numel() < programs * row:
        raise ValueError(f"tail scratch for {tail.programs} programs / "
                         f"{tail.partials.numel()} partials is too small for {programs} "
                         f"programs of {row}-element tiles")
    cnt = tail.zero.view(torch.int32).narrow(0, half * tail.programs, programs)
    return tail.partials, cnt
