"""Persistent grouped GEMMs with TMA descriptors: the prefill (compute-bound) kernels of
:class:`TritonExperts` (issue 11 item 1; ``ExpertsConfig.kernel == "persistent"``).

Legend as ``gate_up.py``: ``M`` tokens, ``K`` top-k, ``H`` hidden, ``I`` intermediate, ``S``
slots, ``BM`` rows per block, ``R = max_blocks*BM`` aligned rows, ``P = M*K`` pairs.

Same math and the same buffers as ``gate_up.py`` / ``down.py`` (their torch twins are the
twins of these kernels too), different schedule:

* a grid of ``G <= #SMs`` programs, each looping over output tiles ``tile = pid, pid + G,
  ...`` up to the tiles **in use**: ``(num_post / BM) * N_tiles``, read on the device, so the
  unused blocks past ``num_post`` (expert id ``-1``) cost nothing, not even a launch of an
  early-exiting program, and nothing is synced to the host;
* tiles in ``GROUP_M`` order over the used blocks (``grouped_pid``): consecutive tiles taken
  by the ``G`` programs at once are the N tiles of ``GROUP_M`` neighbouring blocks, which are
  mostly one expert's blocks, so its weight tiles are read from HBM once and from L2 after;
* the weights through TMA: device-side descriptors (``tl.make_tensor_descriptor``) over
  ``w13`` seen as ``[S, 2, I, H]`` (gate rows, then up rows) with ``[1, 2, BN, BK]`` boxes and
  over ``w2 [S, H, I]`` with ``[1, BN, BK]`` boxes (a box never crosses into the next slot, or
  from the gate rows into the up rows, and any row stride of dim 0 works; out-of-range
  rows/columns read as zeros, which is also the K and N tails);
* gate/up as **one dot per K step**: the box holds a gate tile and the up tile of the same
  columns stacked, ``[2 BN, BK]``, so ``a @ b.T`` gives ``[gate | up]`` in one
  ``[BM, 2 BN]`` accumulator (n256 wgmmas per warp group at ``BN = 128``, 8 warps: each
  A tile is read from shared memory once, not once per half), split in the epilogue;
  the same products in the same K order as two dots, so the same bits (measured,
  docs/DECISIONS.md "Gate/up as one dot");
* gate/up's A operand: rows of ``x`` gathered by pointer (``sorted_ids // K``), as today --
  or, with ``GateUpConfig.a_tma``, rows first copied into aligned order by
  :func:`gather_rows` (one extra launch, ``R*H`` elements written and read back) so A goes
  through TMA too; the sweep decides;
* down's A operand (the aligned intermediate ``act [R, I]``) through TMA; the routing weight
  in the epilogue; per-pair rows ``y [P, H]`` written for ``combine.moe_sum`` (a scattered
  store: rows ``pair(r)``);
* with ``ExpertsConfig.tail_split``, the tiles of the last, partly filled round cut along K
  over the idle programs (``tail_split.py``; the partials summed in a fixed order);
* pipelining knobs from the config: ``num_stages`` on the K loop, ``flatten`` on the tile
  loop (``tl.range``). No warp specialization: the config field exists only so that
  :class:`~moerun.backends.triton.configs.ExpertsConfig` can refuse ``True`` by name --
  Triton 3.6 on sm90 specializes the loop at ``num_warps=4`` and the results came out wrong
  on the H200 (NaN or wrong rows, depending on the tile; docs/DECISIONS.md, "No warp
  specialization").

NOTE: device-side descriptors need Triton's per-launch global scratch (128 B per descriptor
per program); :class:`~moerun._triton.launch.FastLauncher` allocates it from torch's caching
allocator on the launch stream (capture-safe).

TMA needs 16-byte aligned bases and row strides (``H * elt`` and ``I * elt`` multiples of 16);
:func:`tma_compatible` says whether a call qualifies, ``TritonExperts`` falls back to the
grouped kernels otherwise.
"""

from __future__ import annotations

import logging
import os

import torch
import triton
import triton.language as tl

from moerun._triton.compat import patch_interpreter
from moerun._triton.device import sm_count
from moerun._triton.launch import FastLauncher, cdiv
from moerun._triton.gdc import pdl_prologue
from moerun.backends.triton.align import Alignment
from moerun.backends.triton.configs import DownConfig, GateUpConfig
from moerun.backends.triton.down_tiles import store_down_rows
from moerun.backends.triton.gate_up import dot_precision, grouped_pid
from moerun.backends.triton.gather import gather_rows
from moerun.backends.triton.tail_split import (
    TAIL_MIN_STEPS,
    TailScratch,
    tail_buffers,
    tail_plan,
    tail_reduce,
    tail_scratch,
    tail_unit,
)

patch_interpreter()

__all__ = [
    "down_persistent",
    "gate_up_persistent",
    "gather_rows",
    "persistent_programs",
    "run_persistent",
    "tma_compatible",
]

log = logging.getLogger("moerun")


def persistent_programs(max_tiles: int, device: torch.device, programs: int = 0) -> int:
    """Programs of one persistent launch: ``programs`` if given (tests force a tiny count),
    else the device's SM count (4 under the interpreter, where programs run one after
    another); never more than ``max_tiles``, the static tile bound.

    Host only: reads ``TRITON_INTERPRET`` and caches the device's SM count (a properties query);
    no device work, no sync."""
    if programs <= 0:
        if device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1":
            programs = 4
        else:
            programs = sm_count(device)
    return max(1, min(programs, max_tiles))


def tma_compatible(*tensors: torch.Tensor) -> bool:
    """Every tensor qualifies for a TMA descriptor: 16-byte aligned base, contiguous last
    dim, every other stride a multiple of 16 bytes. Host only."""
    for t in tensors:
        elt = t.element_size()
        if t.data_ptr() % 16 or t.stride(-1) != 1:
            return False
        if any((s * elt) % 16 for s in t.stride()[:-1]):
            return False
    return True


# ---------------------------------------------------------------- kernels
@triton.jit
def _gate_up_tile(x_ptr, a_desc, w_desc, sorted_ids_ptr, expert_ids_ptr, tile, k_lo, k_hi,
                  used_blocks, num_n, num_pairs, hidden, stride_xm,
                  TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
                  PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr, A_TMA: tl.constexpr):
    """K steps ``[k_lo, k_hi)`` of gate/up tile ``tile``: ``(acc, row0, n0)``, ``acc`` the fp32
    ``[BM, 2 BN]`` ``[gate | up]`` sums. Device code (inlined): global/TMA loads only."""
    pid_m, pid_n = grouped_pid(tile, used_blocks, num_n, GROUP_M)
    expert = tl.load(expert_ids_ptr + pid_m)
    row0 = pid_m * BLOCK_M
    offs_m = row0 + tl.arange(0, BLOCK_M)
    n0 = pid_n * BLOCK_N
    offs_k = tl.arange(0, BLOCK_K)
    if not A_TMA:
        pair = tl.load(sorted_ids_ptr + offs_m)
        row_ok = pair < num_pairs
        tok = (pair // TOP_K).to(tl.int64)
        a_ptrs = x_ptr + tok[:, None] * stride_xm + offs_k[None, :]
    acc = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)  # [gate | up]
    for k in tl.range(k_lo, k_hi, num_stages=NUM_STAGES):
        if A_TMA:
            a = a_desc.load([row0, k * BLOCK_K])
        elif EVEN_K:
            a = tl.load(a_ptrs + k * BLOCK_K, mask=row_ok[:, None], other=0.0)
        else:
            k_ok = offs_k < hidden - k * BLOCK_K
            a = tl.load(a_ptrs + k * BLOCK_K, mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)
        b = w_desc.load([expert, 0, n0, k * BLOCK_K]).reshape(2 * BLOCK_N, BLOCK_K)
        acc = tl.dot(a, b.T, acc, input_precision=PRECISION)
    return acc, row0, n0


@triton.jit
def _gate_up_store(acc, act_ptr, row0, n0, inter, stride_am,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The gate/up epilogue: ``silu(gate) * up`` of ``acc`` into ``act[row0:, n0:]``. Device
    code (inlined): one masked store."""
    acc_g, acc_u = tl.split(acc.reshape(BLOCK_M, 2, BLOCK_N).permute(0, 2, 1))
    act = acc_g * tl.sigmoid(acc_g) * acc_u  # silu(gate) * up, fp32
    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    out_ptrs = act_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_n[None, :]
    tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=(offs_n < inter)[None, :])


@triton.jit(do_not_specialize=["num_pairs", "max_rows", "num_slots", "num_programs"])
def _gate_up_persistent_kernel(
    # tensors
    x_ptr,  # [M, H] (A_TMA: [R, H], rows in aligned order)
    w13_ptr,  # [S, 2I, H]
    act_ptr,  # [R, I] out
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,  # alignment
    ws_ptr,  # [G, BM * 2BN] fp32 tail partials (iff TAIL_SPLIT)
    cnt_ptr,  # [G] int32 tail arrival counters, zero on entry (iff TAIL_SPLIT)
    # sizes
    num_pairs, inter, hidden, max_rows, num_slots, num_programs, tail_min_steps,
    # strides in elements (last dims contiguous)
    stride_xm, stride_we, stride_wn, stride_am,
    # meta
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
    NUM_STAGES: tl.constexpr, FLATTEN: tl.constexpr, A_TMA: tl.constexpr,
    TAIL_SPLIT: tl.constexpr,  # tail_split.py: the last round's tiles cut along K
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    # w13 [S, 2I, H] seen as [S, 2, I, H] (gate rows, then up rows): one box brings a gate
    # tile and the up tile of the same columns, stacked as [2 BN, BK], for ONE dot per K step
    w_desc = tl.make_tensor_descriptor(w13_ptr, shape=[num_slots, 2, inter, hidden],
                                       strides=[stride_we, inter * stride_wn, stride_wn, 1],
                                       block_shape=[1, 2, BLOCK_N, BLOCK_K])
    if A_TMA:
        a_desc = tl.make_tensor_descriptor(x_ptr, shape=[max_rows, hidden],
                                           strides=[stride_xm, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
    else:
        a_desc = x_ptr  # unused: A rows are gathered by pointer
    num_n = tl.cdiv(inter, BLOCK_N)
    used_blocks = tl.load(num_post_ptr) // BLOCK_M
    num_tiles = used_blocks * num_n
    k_tiles = tl.cdiv(hidden, BLOCK_K)
    main = num_tiles
    if TAIL_SPLIT:
        main, rem, parts = tail_plan(num_tiles, num_programs, k_tiles, tail_min_steps)
    for tile in tl.range(tl.program_id(0), main, num_programs, flatten=FLATTEN):
        acc, row0, n0 = _gate_up_tile(
            x_ptr, a_desc, w_desc, sorted_ids_ptr, expert_ids_ptr, tile, 0, k_tiles,
            used_blocks, num_n, num_pairs, hidden, stride_xm, TOP_K, BLOCK_M, BLOCK_N,
            BLOCK_K, GROUP_M, EVEN_K, PRECISION, NUM_STAGES, A_TMA)
        _gate_up_store(acc, act_ptr, row0, n0, inter, stride_am, BLOCK_M, BLOCK_N)
    if TAIL_SPLIT:  # tail_split.py: at most one part of a tail tile per program
        live, t, k_lo, k_hi = tail_unit(rem, parts, k_tiles)
        if live:
            acc, row0, n0 = _gate_up_tile(
                x_ptr, a_desc, w_desc, sorted_ids_ptr, expert_ids_ptr, main + t, k_lo, k_hi,
                used_blocks, num_n, num_pairs, hidden, stride_xm, TOP_K, BLOCK_M, BLOCK_N,
                BLOCK_K, GROUP_M, EVEN_K, PRECISION, NUM_STAGES, A_TMA)
            total, last = tail_reduce(acc, ws_ptr, cnt_ptr, t, parts, BLOCK_M, 2 * BLOCK_N)
            if last:
                _gate_up_store(total, act_ptr, row0, n0, inter, stride_am, BLOCK_M, BLOCK_N)


@triton.jit
def _down_tile(a_desc, w_desc, expert_ids_ptr, tile, k_lo, k_hi, used_blocks, num_n,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, PRECISION: tl.constexpr, NUM_STAGES: tl.constexpr):
    """K steps ``[k_lo, k_hi)`` of down tile ``tile``: ``(acc, row0, n0)``, ``acc`` fp32
    ``[BM, BN]``, unweighted. Device code (inlined): TMA loads only."""
    pid_m, pid_n = grouped_pid(tile, used_blocks, num_n, GROUP_M)
    expert = tl.load(expert_ids_ptr + pid_m)
    row0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(k_lo, k_hi, num_stages=NUM_STAGES):
        a = a_desc.load([row0, k * BLOCK_K])
        b = w_desc.load([expert, n0, k * BLOCK_K]).reshape(BLOCK_N, BLOCK_K)
        acc = tl.dot(a, b.T, acc, input_precision=PRECISION)
    return acc, row0, n0


@triton.jit
def _down_store(acc, out_ptr, topk_weights_ptr, sorted_ids_ptr, row0, n0, num_pairs, hidden,
                stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The down epilogue of the tile at ``(row0, n0)``: the grouped kernels' per-pair form
    (``down_tiles.store_down_rows``: ``acc`` times each row's routing weight, stored as the
    rows of its pairs). Device code (inlined): a scattered masked store."""
    store_down_rows(acc, out_ptr, topk_weights_ptr, sorted_ids_ptr, row0 + tl.arange(0, BLOCK_M),
                    n0 + tl.arange(0, BLOCK_N), num_pairs, hidden, stride_om, 1, False)


@triton.jit(do_not_specialize=["num_pairs", "max_rows", "num_slots", "num_programs"])
def _down_persistent_kernel(
    # tensors
    act_ptr,  # [R, I]
    w2_ptr,  # [S, H, I]
    out_ptr,  # [P, H] x.dtype: weighted per-pair rows
    topk_weights_ptr,  # [P] fp32
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,  # alignment
    ws_ptr,  # [G, BM * BN] fp32 tail partials (iff TAIL_SPLIT)
    cnt_ptr,  # [G] int32 tail arrival counters, zero on entry (iff TAIL_SPLIT)
    # sizes
    num_pairs, hidden, inter, max_rows, num_slots, num_programs, tail_min_steps,
    # strides in elements (last dims contiguous)
    stride_am, stride_we, stride_wn, stride_om,
    # meta
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PRECISION: tl.constexpr,
    NUM_STAGES: tl.constexpr, FLATTEN: tl.constexpr,
    TAIL_SPLIT: tl.constexpr,  # tail_split.py: the last round's tiles cut along K
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    a_desc = tl.make_tensor_descriptor(act_ptr, shape=[max_rows, inter], strides=[stride_am, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w2_ptr, shape=[num_slots, hidden, inter],
                                       strides=[stride_we, stride_wn, 1],
                                       block_shape=[1, BLOCK_N, BLOCK_K])
    num_n = tl.cdiv(hidden, BLOCK_N)
    used_blocks = tl.load(num_post_ptr) // BLOCK_M
    num_tiles = used_blocks * num_n
    k_tiles = tl.cdiv(inter, BLOCK_K)
    main = num_tiles
    if TAIL_SPLIT:
        main, rem, parts = tail_plan(num_tiles, num_programs, k_tiles, tail_min_steps)
    for tile in tl.range(tl.program_id(0), main, num_programs, flatten=FLATTEN):
        acc, row0, n0 = _down_tile(a_desc, w_desc, expert_ids_ptr, tile, 0, k_tiles,
                                   used_blocks, num_n, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                                   PRECISION, NUM_STAGES)
        _down_store(acc, out_ptr, topk_weights_ptr, sorted_ids_ptr, row0, n0, num_pairs,
                    hidden, stride_om, BLOCK_M, BLOCK_N)
    if TAIL_SPLIT:  # tail_split.py: at most one part of a tail tile per program
        live, t, k_lo, k_hi = tail_unit(rem, parts, k_tiles)
        if live:
            acc, row0, n0 = _down_tile(a_desc, w_desc, expert_ids_ptr, main + t, k_lo, k_hi,
                                       used_blocks, num_n, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                                       PRECISION, NUM_STAGES)
            total, last = tail_reduce(acc, ws_ptr, cnt_ptr, t, parts, BLOCK_M, BLOCK_N)
            if last:
                _down_store(total, out_ptr, topk_weights_ptr, sorted_ids_ptr, row0, n0,
                            num_pairs, hidden, stride_om, BLOCK_M, BLOCK_N)


_LAUNCH_GATE_UP = FastLauncher(_gate_up_persistent_kernel)
_LAUNCH_DOWN = FastLauncher(_down_persistent_kernel)


# ---------------------------------------------------------------- launchers
def gate_up_persistent(x: torch.Tensor, w13: torch.Tensor, align: Alignment, top_k: int,
                       cfg: GateUpConfig, *, programs: int = 0,
                       out: torch.Tensor | None = None, tail_split: bool = False,
                       tail: TailScratch | None = None,
                       tail_min_steps: int = TAIL_MIN_STEPS) -> torch.Tensor:
    """:func:`~moerun.backends.triton.gate_up.gate_up` as a persistent TMA kernel (same
    result, same ``act`` layout; module docstring for the schedule).

    Args:
        x: ``[M, H]`` fp32/fp16/bf16, last dim contiguous. w13: ``[S, 2I, H]`` same dtype,
            TMA-compatible (:func:`tma_compatible`). align: from :func:`moe_align` with
            ``M*K`` pairs. top_k: ``K``. cfg: tile and pipeline knobs (``cfg.a_tma``: gather
            ``x`` into aligned order first, one extra launch). programs: persistent programs
            (0: the SM count). out: optional ``[R, I]`` buffer. tail_split: cut the tiles of
            the last, partly filled round along K over the idle programs (``tail_split.py``).
            tail: its scratch (:func:`tail_scratch`; allocated, counters zeroed, when
            omitted). tail_min_steps: a part's overhead in K steps (tests force 1).

    Returns: ``act [R, I]`` x.dtype; rows of blocks past ``num_post`` are not written. One
    launch (two with ``a_tma``; plus a memset with ``tail_split`` and no ``tail``);
    current stream; no host sync; capture-safe.
    """
    m, h = x.shape
    s, two_i, h2 = w13.shape
    inter = two_i // 2
    if h2 != h or two_i % 2 or w13.dtype != x.dtype:
        raise ValueError(f"w13 {tuple(w13.shape)} {w13.dtype} does not match x {tuple(x.shape)} "
                         f"{x.dtype}: expected [S, 2*I, {h}] {x.dtype}")
    if x.stride(1) != 1 or not tma_compatible(w13):
        raise ValueError("x needs a contiguous last dimension and w13 16-byte aligned strides "
                         "(TMA)")
    if align.num_pairs != m * top_k:
        raise ValueError(f"alignment covers {align.num_pairs} pairs, expected {m}*{top_k}")
    rows = align.max_blocks * align.block_m
    if out is None:
        out = torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    elif out.shape != (rows, inter) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{rows}, {inter}] {x.dtype}")
    a = x
    if cfg.a_tma:
        a = gather_rows(x, align, top_k)
        if not tma_compatible(a):
            raise ValueError(f"a_tma needs H * {x.element_size()} bytes to be a multiple of 16")
    g = persistent_programs(align.max_blocks * cdiv(inter, cfg.block_n), x.device, programs)
    ws, cnt = tail_buffers(tail, tail_split, g, align.block_m * 2 * cfg.block_n, 0, a)
    _LAUNCH_GATE_UP(
        (g,),
        a, w13, out, align.sorted_ids, align.expert_ids, align.num_post, ws, cnt,
        align.num_pairs, inter, h, rows, s, g, tail_min_steps,
        a.stride(0), w13.stride(0), w13.stride(1), out.stride(0),
        # TOP_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K, PRECISION, NUM_STAGES, FLATTEN,
        # A_TMA, TAIL_SPLIT
        top_k, align.block_m, cfg.block_n, cfg.block_k, cfg.group_m, h % cfg.block_k == 0,
        dot_precision(x.dtype), cfg.num_stages, cfg.flatten, cfg.a_tma, tail_split,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def down_persistent(act: torch.Tensor, w2: torch.Tensor, align: Alignment,
                    topk_weights: torch.Tensor, top_k: int, cfg: DownConfig, *,
                    programs: int = 0, out: torch.Tensor | None = None,
                    tail_split: bool = False, tail: TailScratch | None = None,
                    tail_min_steps: int = TAIL_MIN_STEPS) -> torch.Tensor:
    """:func:`~moerun.backends.triton.down.down` (per-pair rows, no split-K) as a persistent
    TMA kernel.

    Args:
        act: ``[R, I]`` from a gate/up kernel, TMA-compatible. w2: ``[S, H, I]`` act.dtype,
            TMA-compatible. align: the alignment ``act`` was built with. topk_weights:
            ``[M, K]`` fp32 contiguous. top_k: ``K``. cfg: tile and pipeline knobs
            (``split_k`` must be 1). programs: persistent programs (0: the SM count).
            out: optional ``[M*K, H]`` act.dtype buffer. tail_split, tail, tail_min_steps:
            as :func:`gate_up_persistent` (the second half of ``tail``'s counters).

    Returns: ``y [M*K, H]`` act.dtype, ``w * (act @ w2[e]^T)`` per pair; rows of excluded
    pairs are not written (``combine.moe_sum`` skips them by id). One launch (plus a memset
    with ``tail_split`` and no ``tail``); current stream; no host sync; capture-safe.
    """
    rows, inter = act.shape
    s, h, i2 = w2.shape
    if i2 != inter or w2.dtype != act.dtype or not tma_compatible(act, w2):
        raise ValueError(f"w2 {tuple(w2.shape)} {w2.dtype} does not match act "
                         f"{tuple(act.shape)} {act.dtype} (expected [S, H, {inter}], "
                         f"16-byte aligned strides for TMA)")
    if topk_weights.dtype != torch.float32 or not topk_weights.is_contiguous() or \
            topk_weights.numel() != align.num_pairs:
        raise ValueError("topk_weights must be a contiguous fp32 [M, K] tensor")
    if cfg.split_k != 1:
        raise ValueError(f"down_persistent: split_k={cfg.split_k} unsupported (use 1)")
    if rows != align.max_blocks * align.block_m:
        raise ValueError(f"act has {rows} rows, the alignment {align.max_blocks * align.block_m}")
    if out is None:
        out = torch.empty(align.num_pairs, h, dtype=act.dtype, device=act.device)
    elif out.shape != (align.num_pairs, h) or out.dtype != act.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{align.num_pairs}, {h}] {act.dtype}")
    g = persistent_programs(align.max_blocks * cdiv(h, cfg.block_n), act.device, programs)
    ws, cnt = tail_buffers(tail, tail_split, g, align.block_m * cfg.block_n, 1, act)
    _LAUNCH_DOWN(
        (g,),
        act, w2, out, topk_weights, align.sorted_ids, align.expert_ids, align.num_post, ws, cnt,
        align.num_pairs, h, inter, rows, s, g, tail_min_steps,
        act.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        # BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, PRECISION, NUM_STAGES, FLATTEN, TAIL_SPLIT
        align.block_m, cfg.block_n, cfg.block_k, cfg.group_m, dot_precision(act.dtype),
        cfg.num_stages, cfg.flatten, tail_split,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


# ---------------------------------------------------------------- the experts call
_FALLBACKS_LOGGED: set = set()  # (reason, w13 shape, dtype) already logged; host-only data


def run_persistent(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                   topk_weights: torch.Tensor, topk_ids: torch.Tensor, cfg,
                   shared=None) -> torch.Tensor | None:
    """``TritonExperts.run_experts`` for a ``kernel="persistent"`` config: align, persistent
    gate/up (plus :func:`gather_rows` with ``a_tma``), persistent down, ``moe_sum`` -- 4
    launches (5); no host sync; capture-safe.

    Args: as ``run_experts`` after its checks (``topk_weights`` fp32 and ``topk_ids`` int32,
    both contiguous ``[M, K]``); ``cfg`` the bucket's :class:`ExpertsConfig`.

    Returns ``None`` (logged once per reason and shape; the caller runs the grouped kernels)
    when the call has the fused shared expert or strides TMA cannot take (``H * elt`` or
    ``I * elt`` not a multiple of 16, unaligned bases)."""
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum

    elt = x.element_size()
    ok = shared is None and tma_compatible(w13, w2) and (w2.shape[2] * elt) % 16 == 0
    if not ok:
        why = "the fused shared expert" if shared is not None else "strides TMA cannot take"
        key = (why, tuple(w13.shape), x.dtype)
        if key not in _FALLBACKS_LOGGED:
            _FALLBACKS_LOGGED.add(key)
            log.warning("moerun: TritonExperts config selects the persistent kernels but the "
                        "call has %s (w13 %s %s); running the grouped kernels", why,
                        tuple(w13.shape), x.dtype)
        return None
    s, k = w13.shape[0], topk_ids.shape[1]
    tail = None
    if cfg.tail_split:  # scratch for both launches; its counters zeroed by the alignment
        tail = tail_scratch(cfg, persistent_programs(1 << 30, x.device, cfg.programs),
                            x.device)
    align = moe_align(topk_ids, s, cfg.block_m, zero=None if tail is None else tail.zero)  # 1
    act = gate_up_persistent(x, w13, align, k, cfg.gate_up, programs=cfg.programs,
                             tail_split=cfg.tail_split, tail=tail)  # launch 2
    y = down_persistent(act, w2, align, topk_weights, k, cfg.down, programs=cfg.programs,
                        tail_split=cfg.tail_split, tail=tail)  # launch 3
    return moe_sum(y, topk_ids, s)  # launch 4
