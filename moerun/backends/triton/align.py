"""Token -> expert alignment on the device: the expert-sorted, block-padded row order.

Legend: ``M`` tokens, ``K`` top-k, ``P = M*K`` (token, j) pairs, ``S`` slots, ``BM`` rows per
block. Pair ``p = t*K + j`` is routed to slot ``topk_ids.flat[p]`` (``-1`` or ``>= S``: not
local, excluded).

Layout produced (``BM = 4``; slot 0 gets pairs {5, 0}, slot 1 none, slot 2 gets {3}; ``P = 6``
so the sentinel is 6)::

    sorted_ids   [ 0  5  6  6 | 3  6  6  6 | 6 ... ]   pair ids, sentinel P in padding
    expert_ids   [ 0          | 2          | -1 ... ]  one slot per block, -1 past the end
    num_post     [ 8 ]                                 rows used = sum_s ceil(c_s/BM)*BM

Order inside a slot's segment is unspecified (the kernel claims positions with atomics; the
torch twin keeps pair order). Buffers are sized by the static bound
``P + min(S, P)*(BM-1)`` rows (rounded up to whole blocks), so nothing depends on the routing
and the whole call is CUDA-graph capturable: no ``bincount``/``nonzero``/``.item()``.

Two kernels, one launch either way (programs past the aligning ones zero an optional fp32
accumulator -- the ``"atomic"`` combine's ``[M, H]`` sum -- so zeroing costs no launch):

* ``P <= SINGLE_MAX_PAIRS`` (decode): ONE program aligns -- counts by ``tl.histogram``, segment
  starts by ``tl.cumsum``, rows claimed with atomics on its own cursor scratch. No zeroed
  scratch, so the call stays at one launch.
* larger ``P``: ``G <= #SMs`` programs, each over its own pairs: a rank inside the slot is
  claimed with an atomic on a counter array zeroed by a ``torch.zeros`` memset just before;
  then a grid barrier (an arrival counter; every program is resident, ``G`` never exceeds
  the SM count) after which each program reads the final counts, derives the segment starts
  and scatters its pairs. The single program's serial chain over all pairs measured
  ~280 us at P = 65536 (H200); the grid version does the same work in parallel.
  Under the interpreter programs run one after another, so ``G`` is 1 there;
  ``MOERUN_TRITON_ALIGN_GRID=0`` forces the single kernel everywhere.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from moerun._triton.compat import patch_interpreter
from moerun._triton.device import sm_count
from moerun._triton.launch import FastLauncher, cdiv, next_pow2
from moerun._triton.gdc import pdl_prologue

patch_interpreter()

__all__ = ["Alignment", "align_programs", "max_blocks_for", "moe_align", "moe_align_torch"]

# ---------------------------------------------------------------- constants
SINGLE_MAX_PAIRS = 1024  # up to this many pairs the single-program kernel aligns
ALIGN_CHUNK = 2048  # pairs per step of the single aligning program
GRID_CHUNK = 1024  # pairs per step of each program of the grid kernel
COUNTER_STRIDE = 32  # int32s between the grid kernel's slot counters (one 128-B line each)
ZERO_BLOCK = 8192  # fp32 elements each zeroing program clears
SINGLE_WARPS = 16
GRID_WARPS = 4
_USE_HISTOGRAM = [True]  # flipped once if tl.histogram fails to compile for this target
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Alignment:
    """Result of :func:`moe_align` (all device tensors, int32).

    Fields:
        sorted_ids: ``[max_blocks*BM]`` pair id per row, sentinel ``num_pairs`` in padding.
        expert_ids: ``[max_blocks]`` slot of each block; ``-1`` past ``num_post``.
        num_post: ``[1]`` rows in use (a multiple of ``block_m``).
        block_m: rows per block; ``num_pairs``: ``M*K``; ``max_blocks``: static block bound.
    """

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_post: torch.Tensor
    block_m: int
    num_pairs: int
    max_blocks: int


# ---------------------------------------------------------------- config ("generator")
def max_blocks_for(num_pairs: int, num_slots: int, block_m: int) -> int:
    """Static upper bound on blocks: every non-empty slot wastes at most ``BM-1`` rows.

    Pure; host only."""
    rows = num_pairs + min(num_slots, num_pairs) * (block_m - 1)
    return max(1, cdiv(rows, block_m))


def align_programs(num_pairs: int, device: torch.device) -> int:
    """Aligning programs for ``num_pairs``: 1 (single kernel) or ``G`` (grid kernel).

    Host only: reads ``TRITON_INTERPRET`` / ``MOERUN_TRITON_ALIGN_GRID`` and caches the device's
    SM count (a properties query); no device work, no sync."""
    if num_pairs <= SINGLE_MAX_PAIRS or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return 1
    if os.environ.get("MOERUN_TRITON_ALIGN_GRID", "1") == "0":  # escape hatch: single kernel
        return 1
    if device.type != "cuda":
        return 1
    return max(2, min(sm_count(device), cdiv(num_pairs, GRID_CHUNK)))


# ---------------------------------------------------------------- kernels
@triton.jit
def _zero_fp32(zero_ptr, zero_numel, idx, ZERO_BLOCK: tl.constexpr):
    offs = idx.to(tl.int64) * ZERO_BLOCK + tl.arange(0, ZERO_BLOCK)
    tl.store(zero_ptr + offs, tl.zeros([ZERO_BLOCK], tl.float32), mask=offs < zero_numel)


@triton.jit
def _fill_padding(sorted_ids_ptr, expert_ids_ptr, num_pairs, max_rows, max_blocks, first, step,
                  CHUNK: tl.constexpr):
    """Rows ``first, first+step, ...`` (in CHUNKs) become padding; their blocks unused (-1)."""
    for start in range(first, max_rows, step):
        offs = start + tl.arange(0, CHUNK)
        tl.store(sorted_ids_ptr + offs, tl.full([CHUNK], 0, tl.int32) + num_pairs,
                 mask=offs < max_rows)
    for start in range(first, max_blocks, step):
        offs = start + tl.arange(0, CHUNK)
        tl.store(expert_ids_ptr + offs, tl.full([CHUNK], -1, tl.int32), mask=offs < max_blocks)


@triton.jit
def _segments(counts, BLOCK_M: tl.constexpr):
    """Per-slot counts -> (padded segment starts, blocks per slot, rows in use)."""
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    starts = tl.cumsum(padded, 0) - padded
    return starts, padded // BLOCK_M, tl.sum(padded, 0)


@triton.jit
def _block_map(expert_ids_ptr, slots, starts, nblk, first, step, BLOCK_M: tl.constexpr):
    """Block ``starts[s]/BM + j`` belongs to slot ``s`` for ``j < nblk[s]``: scattered with
    one vector store per ``j`` (j = first, first+step, ...), no search."""
    base = starts // BLOCK_M
    for j in range(first, tl.max(nblk, 0), step):
        tl.store(expert_ids_ptr + base + j, slots, mask=j < nblk)


@triton.jit(do_not_specialize=["num_pairs", "num_slots", "max_rows", "max_blocks", "zero_numel"])
def _moe_align_single_kernel(
    # inputs
    topk_ids_ptr,  # [P] int32
    num_pairs, num_slots,
    # outputs
    sorted_ids_ptr,  # [max_rows] int32
    expert_ids_ptr,  # [max_blocks] int32
    num_post_ptr,  # [1] int32
    cursor_ptr,  # [S_P2] int32 scratch (fully written before use)
    max_rows, max_blocks,
    # optional fp32 accumulator to zero (programs 1..)
    zero_ptr, zero_numel,
    # meta
    BLOCK_M: tl.constexpr, S_P2: tl.constexpr, CHUNK: tl.constexpr,
    ZERO_BLOCK: tl.constexpr, USE_HISTOGRAM: tl.constexpr,
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    pid = tl.program_id(0)
    if pid > 0:
        _zero_fp32(zero_ptr, zero_numel, pid - 1, ZERO_BLOCK)
        return

    # 0. every row starts as padding, every block unused
    _fill_padding(sorted_ids_ptr, expert_ids_ptr, num_pairs, max_rows, max_blocks, 0, CHUNK,
                  CHUNK)
    tl.debug_barrier()

    # 1. per-slot counts (excluded ids: -1 and >= S)
    slots = tl.arange(0, S_P2)
    if USE_HISTOGRAM:
        counts = tl.zeros([S_P2], tl.int32)
        for start in range(0, num_pairs, CHUNK):
            offs = start + tl.arange(0, CHUNK)
            ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=-1)
            ok = (ids >= 0) & (ids < num_slots)
            counts += tl.histogram(tl.where(ok, ids, 0), S_P2, mask=ok)
    else:  # fallback where tl.histogram does not compile: atomics on the cursor scratch
        tl.store(cursor_ptr + slots, tl.zeros([S_P2], tl.int32))
        tl.debug_barrier()
        for start in range(0, num_pairs, CHUNK):
            offs = start + tl.arange(0, CHUNK)
            ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=-1)
            ok = (ids >= 0) & (ids < num_slots)
            tl.atomic_add(cursor_ptr + tl.where(ok, ids, 0), 1, mask=ok, sem="relaxed")
        tl.debug_barrier()
        counts = tl.atomic_add(cursor_ptr + slots, 0, sem="relaxed")  # read at L2
        tl.debug_barrier()

    # 2. segment starts, block -> slot, cursors
    starts, nblk, total = _segments(counts, BLOCK_M)
    tl.store(num_post_ptr, total)
    _block_map(expert_ids_ptr, slots, starts, nblk, 0, 1, BLOCK_M)
    tl.store(cursor_ptr + slots, starts)
    tl.debug_barrier()  # cursors and padding visible to every thread before the scatter

    # 3. scatter pair ids to claimed rows
    for start in range(0, num_pairs, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=-1)
        ok = (ids >= 0) & (ids < num_slots)
        pos = tl.atomic_add(cursor_ptr + tl.where(ok, ids, 0), 1, mask=ok, sem="relaxed")
        tl.store(sorted_ids_ptr + pos, offs, mask=ok)


@triton.jit(do_not_specialize=["num_pairs", "num_slots", "max_rows", "max_blocks", "zero_numel",
                               "num_align"])
def _moe_align_grid_kernel(
    # inputs
    topk_ids_ptr,  # [P] int32
    num_pairs, num_slots,
    # outputs
    sorted_ids_ptr,  # [max_rows] int32
    expert_ids_ptr,  # [max_blocks] int32
    num_post_ptr,  # [1] int32
    counts_ptr,  # [(S_P2 + 1) * CSTRIDE] int32, ZEROED: per-slot counters, arrival counter
    scratch_ptr,  # [P + G*S_P2] int32: ranks, then each program's copy of the starts
    max_rows, max_blocks, num_align,
    # optional fp32 accumulator to zero (programs G..)
    zero_ptr, zero_numel,
    # meta
    BLOCK_M: tl.constexpr, S_P2: tl.constexpr, CHUNK: tl.constexpr, CSTRIDE: tl.constexpr,
    ZERO_BLOCK: tl.constexpr,
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    pid = tl.program_id(0)
    if pid >= num_align:
        _zero_fp32(zero_ptr, zero_numel, pid - num_align, ZERO_BLOCK)
        return
    step = num_align * CHUNK
    arrive_ptr = counts_ptr + S_P2 * CSTRIDE

    # 0. this program's share of the padding rows and unused blocks
    _fill_padding(sorted_ids_ptr, expert_ids_ptr, num_pairs, max_rows, max_blocks, pid * CHUNK,
                  step, CHUNK)
    # 1. rank of each of this program's pairs inside its slot; one 128-byte line per counter
    #    so the slots' atomics spread over L2 slices
    for start in range(pid * CHUNK, num_pairs, step):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=-1)
        ok = (ids >= 0) & (ids < num_slots)
        rank = tl.atomic_add(counts_ptr + tl.where(ok, ids, 0) * CSTRIDE, 1, mask=ok,
                             sem="relaxed")
        tl.store(scratch_ptr + offs, rank, mask=ok)

    # grid barrier: every aligning program is resident (num_align <= #SMs, 4 warps each).
    # NOTE: a spin barrier; it relies on all num_align programs being scheduled, which holds
    # while other kernels sharing the GPU eventually finish (they never wait on this one).
    # Poll with volatile loads (no RMW traffic on the arrival line), then one acquire RMW.
    tl.debug_barrier()
    tl.atomic_add(arrive_ptr, 1, sem="release")
    arrived = tl.load(arrive_ptr, volatile=True)
    while arrived < num_align:
        arrived = tl.load(arrive_ptr, volatile=True)
    tl.atomic_add(arrive_ptr, 0, sem="acquire")
    tl.debug_barrier()

    # 2. final counts -> starts (every program), num_post, block map (shared out by j)
    slots = tl.arange(0, S_P2)
    counts = tl.atomic_add(counts_ptr + slots * CSTRIDE, 0, sem="relaxed")  # read at L2
    starts, nblk, total = _segments(counts, BLOCK_M)
    if pid == 0:
        tl.store(num_post_ptr, total)
    _block_map(expert_ids_ptr, slots, starts, nblk, pid, num_align, BLOCK_M)
    my_starts = scratch_ptr + num_pairs + pid * S_P2
    tl.store(my_starts + slots, starts)
    tl.debug_barrier()

    # 3. scatter this program's pairs
    for start in range(pid * CHUNK, num_pairs, step):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(topk_ids_ptr + offs, mask=offs < num_pairs, other=-1)
        ok = (ids >= 0) & (ids < num_slots)
        rank = tl.load(scratch_ptr + offs, mask=ok, other=0)
        base = tl.load(my_starts + tl.where(ok, ids, 0), mask=ok, other=0)
        tl.store(sorted_ids_ptr + base + rank, offs, mask=ok)


_LAUNCH_SINGLE = FastLauncher(_moe_align_single_kernel)
_LAUNCH_GRID = FastLauncher(_moe_align_grid_kernel)


# ---------------------------------------------------------------- launcher
def moe_align(topk_ids: torch.Tensor, num_slots: int, block_m: int,
              zero: torch.Tensor | None = None, programs: int | None = None,
              grid_kernel: bool | None = None) -> Alignment:
    """Align (token, j) pairs to expert blocks on the device.

    Args:
        topk_ids: ``[M, K]`` int32, contiguous; ``-1`` (or ``>= num_slots``) pairs excluded.
        num_slots: ``S``, the local slot count.
        block_m: ``BM`` rows per block (a power of two >= 16).
        zero: optional contiguous fp32 tensor zeroed by the same launch.
        programs: aligning programs (default :func:`align_programs`).
        grid_kernel: force the grid kernel (True; tests run it with ``programs=1`` under the
            interpreter) or the single one (False); default: grid iff ``programs > 1``.

    Returns: :class:`Alignment`. One kernel launch (plus one small memset for the grid
    kernel). Stream: current. Host sync: none (capture-safe).
    """
    if topk_ids.dtype != torch.int32 or not topk_ids.is_contiguous() or topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be a contiguous 2-D int32 tensor, got "
                         f"{topk_ids.dtype} {tuple(topk_ids.shape)}")
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m={block_m!r} must be a power of two >= 16")
    if zero is not None and (zero.dtype != torch.float32 or not zero.is_contiguous()):
        raise ValueError("zero must be a contiguous fp32 tensor")
    dev = topk_ids.device
    num_pairs = topk_ids.numel()
    max_blocks = max_blocks_for(num_pairs, num_slots, block_m)
    max_rows = max_blocks * block_m
    s_p2 = max(32, next_pow2(num_slots))
    # NOTE: one allocation for every int32 output (and the single kernel's cursor scratch),
    # each part starting on a 16-byte boundary: host time, not device time, is what a decode
    # step spends here (each torch.empty costs ~4 µs of host time on the H200 machine)
    blocks_pad = cdiv(max_blocks, 4) * 4
    buf = torch.empty(max_rows + blocks_pad + 4 + s_p2, dtype=torch.int32, device=dev)
    sorted_ids = buf.narrow(0, 0, max_rows)  # NOTE: narrow, not split (~5x the host cost)
    expert_ids = buf.narrow(0, max_rows, max_blocks)
    num_post = buf.narrow(0, max_rows + blocks_pad, 1)
    cursor = buf.narrow(0, max_rows + blocks_pad + 4, s_p2)
    zero_numel = 0 if zero is None else zero.numel()
    n_zero = cdiv(zero_numel, ZERO_BLOCK)
    g = programs or align_programs(num_pairs, dev)
    if grid_kernel is False:
        g = 1
    if g > 1 or grid_kernel:
        counts = torch.zeros((s_p2 + 1) * COUNTER_STRIDE, dtype=torch.int32, device=dev)  # memset
        scratch = torch.empty(num_pairs + g * s_p2, dtype=torch.int32, device=dev)
        _LAUNCH_GRID(
            (g + n_zero,),
            topk_ids, num_pairs, num_slots, sorted_ids, expert_ids, num_post, counts, scratch,
            max_rows, max_blocks, g, zero if zero is not None else counts, zero_numel,
            # BLOCK_M, S_P2, CHUNK, CSTRIDE, ZERO_BLOCK
            block_m, s_p2, GRID_CHUNK, COUNTER_STRIDE, ZERO_BLOCK,
            num_warps=GRID_WARPS,
        )
        return Alignment(sorted_ids=sorted_ids, expert_ids=expert_ids, num_post=num_post,
                         block_m=block_m, num_pairs=num_pairs, max_blocks=max_blocks)

    # decode sizes: a narrower program (fewer warps to synchronise, shorter chains)
    chunk = min(ALIGN_CHUNK, max(256, next_pow2(max(num_pairs, max_rows // 4))))
    warps = 4 if chunk <= 512 else SINGLE_WARPS

    def launch(use_histogram: bool):
        _LAUNCH_SINGLE(
            (1 + n_zero,),
            topk_ids, num_pairs, num_slots,
            sorted_ids, expert_ids, num_post, cursor, max_rows, max_blocks,
            zero if zero is not None else cursor, zero_numel,
            # BLOCK_M, S_P2, CHUNK, ZERO_BLOCK, USE_HISTOGRAM
            block_m, s_p2, chunk, ZERO_BLOCK, use_histogram,
            num_warps=warps,
        )

    if _USE_HISTOGRAM[0]:
        try:
            launch(True)
        except Exception as e:  # noqa: BLE001 -- a compile error surfaces on first launch
            if "histogram" not in repr(e).lower() and "Compilation" not in type(e).__name__:
                raise
            _USE_HISTOGRAM[0] = False  # a property of the target, so for the process
            _LOG.warning("moe_align: tl.histogram does not compile on this target (%s: %s); "
                         "the alignment counts with atomics from now on (same result)",
                         type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            launch(False)
    else:
        launch(False)
    return Alignment(sorted_ids=sorted_ids, expert_ids=expert_ids, num_post=num_post,
                     block_m=block_m, num_pairs=num_pairs, max_blocks=max_blocks)


# ---------------------------------------------------------------- torch twin
def moe_align_torch(topk_ids: torch.Tensor, num_slots: int, block_m: int) -> Alignment:
    """Pure-torch twin of :func:`moe_align` (pair order kept inside each segment).

    Capture-safe too: counts by ``scatter_add_``, a stable sort, ``searchsorted``; no sync.
    """
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    num_pairs = flat.numel()
    max_blocks = max_blocks_for(num_pairs, num_slots, block_m)
    max_rows = max_blocks * block_m
    ok = (flat >= 0) & (flat < num_slots)
    key = torch.where(ok, flat, torch.full_like(flat, num_slots))  # excluded pairs sort last
    counts = torch.zeros(num_slots + 1, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, key, torch.ones_like(key))
    padded = (counts + block_m - 1) // block_m * block_m
    padded[num_slots] = 0
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.sort(key, stable=True).indices
    skey = key[order]
    first = torch.cumsum(counts, 0) - counts  # first sorted index of each slot
    rank = torch.arange(num_pairs, device=dev) - first[skey]
    dest = torch.where(skey < num_slots, starts[skey] + rank, torch.full_like(rank, max_rows))
    sorted_ids = torch.full((max_rows + 1,), num_pairs, dtype=torch.int64, device=dev)
    sorted_ids.scatter_(0, dest, order)
    row0 = torch.arange(max_blocks, device=dev) * block_m
    slot = torch.searchsorted(ends[:num_slots].contiguous(), row0, right=True)
    expert_ids = torch.where(slot < num_slots, slot, torch.full_like(slot, -1))
    num_post = ends[num_slots - 1:num_slots].to(torch.int32) if num_slots > 0 else \
        torch.zeros(1, dtype=torch.int32, device=dev)
    return Alignment(sorted_ids=sorted_ids[:max_rows].to(torch.int32),
                     expert_ids=expert_ids.to(torch.int32), num_post=num_post,
                     block_m=block_m, num_pairs=num_pairs, max_blocks=max_blocks)
