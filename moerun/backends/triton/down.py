"""Down grouped GEMM with the routing weight applied in the epilogue.

Legend as ``gate_up.py``: ``act [R, I]`` in aligned row order, ``w2 [S, H, I]``.

Program ``(m, n, s)`` multiplies aligned rows ``[m*BM, (m+1)*BM)`` (one slot ``e``) by
``w2[e, n*BN:(n+1)*BN, :]^T`` over the ``s``-th of ``SPLIT_K`` interleaved slices of ``I``,
scales row ``r`` by ``topk_weights.flat[pair(r)]`` and then either

* ``ATOMIC``: adds it (fp32, relaxed atomics) into ``acc[tok(r), n*BN:...]`` -- the top-k
  reduction happens in the accumulator, nothing ``[M, K, H]``-sized is written; split-K slices
  add into the same place (decode: more programs than blocks x tiles);
* else: stores it as row ``pair(r)`` of ``y [M*K, H]`` (x.dtype), for ``combine.moe_sum``.

The A operand needs no gather (rows are contiguous in aligned order).

Direct rows (:func:`down_direct`, the ``kernel="direct"`` decode path; the routing weight
is already in ``act``, applied by ``gate_up_direct``), two forms, no sum launch either way:

* per token (``combine="reduce"``): program ``(n, t)`` sums ``act[t*K + j] @ w2[e_j,
  n*BN:...]^T`` over token ``t``'s ``K`` pairs in ONE loop of ``K * ceil(I / BK)`` steps (one
  pipeline for all of them) and writes ``out[t, n*BN:...]`` in x.dtype;
* per pair (``combine="atomic"``): program ``(n, p)`` computes pair ``p``'s fp32 partial,
  stores it, and takes a ticket on the arrival counter of ``(t, n)`` (zeroed by the gate/up
  launch); the program that arrives K-th sums the token's K partials in pair order (so the
  result does not depend on the arrival order) and writes ``out[t, n*BN:...]``. ``K`` times
  the programs of the per-token form, for decode shapes whose ``H / BN`` alone is too few.

Excluded pairs load no weights and add nothing. With ``FP8`` (an e4m3 ``w2`` and its block
scales: the fp8 direct path of ``fp8_direct.py``) both forms quantize each row per
128-column group in registers and fold the routing weight into each K step's scale (``act``
is unweighted there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moerun._triton.compat import patch_interpreter
from moerun._triton.launch import FastLauncher, cdiv, next_pow2
from moerun._triton.gdc import pdl_prologue
from moerun.backends.triton.direct_tiles import direct_acc, direct_dot, direct_scaled_dot
from moerun.backends.triton.down_tiles import store_down_rows
from moerun.backends.triton.fp8_tiles import quantize_tile

from moerun.backends.base import FusedShared
from moerun.backends.reference import slot_w2
from moerun.backends.triton.align import Alignment
from moerun.backends.triton.configs import FP8_GROUP, DownConfig
from moerun.backends.triton.fp8_checks import check_w2_fp8
from moerun.backends.triton.gate_up import DIRECT_BLOCK_M, dot_precision, grouped_pid
from moerun.quant import AMAX_EPS, FP8_MAX

patch_interpreter()

__all__ = ["down", "down_torch", "down_direct", "down_direct_torch"]


# ---------------------------------------------------------------- kernel
@triton.jit(do_not_specialize=["num_pairs", "max_blocks"])
def _down_kernel(
    # tensors
    act_ptr,  # [R, I]
    w2_ptr,  # [S, H, I]
    sw2_ptr,  # [H, Is] shared expert (read iff SHARED)
    out_ptr,  # ATOMIC: [M, H] fp32 accumulator; else [M*K, H] x.dtype
    topk_weights_ptr,  # [M*K] fp32
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,  # alignment
    # sizes
    num_pairs, hidden, inter, max_blocks, num_routed,
    # strides in elements (last dims contiguous); s_stride_n: the shared tensor's row stride
    stride_am, stride_we, stride_wn, stride_om, s_stride_n,
    # meta
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
    ATOMIC: tl.constexpr, PRECISION: tl.constexpr, SHARED: tl.constexpr,
    SWAP_AB: tl.constexpr,  # w2 tile x rows^T (direct_tiles.py): the weight rows on M
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = grouped_pid(pid, max_blocks, tl.cdiv(hidden, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_post_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_nw = offs_n % hidden
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    if SHARED == 0:
        w_base = w2_ptr + expert * stride_we
        row_stride = stride_wn
    else:
        if expert >= num_routed:  # a shared slot: columns [j*I, (j+1)*I) of [H, Is]
            w_base = sw2_ptr + (expert - num_routed) * inter
            row_stride = s_stride_n if SHARED == 2 else stride_wn
        else:
            w_base = w2_ptr + expert * stride_we
            row_stride = stride_wn
    b_ptrs = w_base + offs_nw[None, :].to(tl.int64) * row_stride + offs_k[:, None]

    acc = direct_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    for k in range(0, tl.cdiv(inter, BLOCK_K * SPLIT_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = offs_k < inter - k * (BLOCK_K * SPLIT_K)
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        acc = direct_dot(acc, a, b, PRECISION, SWAP_AB)
        a_ptrs += BLOCK_K * SPLIT_K
        b_ptrs += BLOCK_K * SPLIT_K
    if SWAP_AB:
        acc = tl.trans(acc)

    store_down_rows(acc, out_ptr, topk_weights_ptr, sorted_ids_ptr, offs_m, offs_n, num_pairs,
                    hidden, stride_om, TOP_K, ATOMIC)


_LAUNCH = FastLauncher(_down_kernel)


@triton.jit
def _down_direct_kernel(
    act_ptr,  # [M*K, I], weighted rows of gate_up_direct
    w2_ptr,  # [S, H, I]
    out_ptr,  # [M, H] x.dtype
    topk_ids_ptr,  # [M*K] int32
    ws_ptr,  # [S, H/BK, I/BK] fp32 block scales (read iff FP8)
    tw_ptr,  # [M*K] fp32 routing weights (read iff FP8: act is unweighted there)
    hidden, inter, num_slots,
    stride_am, stride_we, stride_wn, stride_om, stride_wse, stride_wsn,
    TOP_K: tl.constexpr, K_P2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
    FP8: tl.constexpr, EPS: tl.constexpr, QMAX: tl.constexpr,
    SWAP_AB: tl.constexpr,  # w2 tile x rows^T: the weight rows on the MMA's M side
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    pid_n = tl.program_id(0)
    tok = tl.program_id(1).to(tl.int64)
    offs_j = tl.arange(0, K_P2)
    ids = tl.load(topk_ids_ptr + tok * TOP_K + offs_j, mask=offs_j < TOP_K, other=-1)
    rows = tl.arange(0, BLOCK_M)
    row0 = rows == 0
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_nw = (offs_n % hidden).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    steps = tl.cdiv(inter, BLOCK_K)
    acc = direct_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    for it in range(0, TOP_K * steps):
        j = it // steps
        k0 = (it - j * steps) * BLOCK_K
        e = tl.sum(tl.where(offs_j == j, ids, 0))
        ok = (e >= 0) & (e < num_slots)
        pair = tok * TOP_K + j
        a_ptrs = act_ptr + pair * stride_am + k0 + offs_k[None, :] + rows[:, None] * 0
        b_ptrs = w2_ptr + e.to(tl.int64) * stride_we + offs_nw[None, :] * stride_wn \
            + k0 + offs_k[:, None]
        if FP8:  # BLOCK_K = G, BLOCK_N <= G: one weight scale per step; row 0 quantized
            af = tl.load(a_ptrs, mask=row0[:, None] & ok, other=0.0).to(tl.float32)
            aq, a_s = quantize_tile(af, EPS, QMAX)
            b = tl.load(b_ptrs, mask=ok, other=0.0)
            w_s = tl.load(ws_ptr + e.to(tl.int64) * stride_wse
                          + ((pid_n * BLOCK_N) // BLOCK_K) * stride_wsn + k0 // BLOCK_K,
                          mask=ok, other=0.0) * tl.load(tw_ptr + pair, mask=ok, other=0.0)
            acc = direct_scaled_dot(acc, aq, b, a_s * w_s, SWAP_AB)
        elif EVEN_K:
            a = tl.load(a_ptrs, mask=row0[:, None] & ok, other=0.0)
            b = tl.load(b_ptrs, mask=ok, other=0.0)
            acc = direct_dot(acc, a, b, PRECISION, SWAP_AB)
        else:
            k_ok = offs_k < inter - k0
            a = tl.load(a_ptrs, mask=row0[:, None] & k_ok[None, :] & ok, other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & ok, other=0.0)
            acc = direct_dot(acc, a, b, PRECISION, SWAP_AB)
    if SWAP_AB:
        acc = tl.trans(acc)
    dst = out_ptr + tok * stride_om + offs_n[None, :] + rows[:, None] * 0
    tl.store(dst, acc.to(out_ptr.dtype.element_ty),
             mask=row0[:, None] & (offs_n < hidden)[None, :])


_LAUNCH_DIRECT = FastLauncher(_down_direct_kernel)


@triton.jit
def _down_direct_pairs_kernel(
    act_ptr,  # [M*K, I], weighted rows of gate_up_direct
    w2_ptr,  # [S, H, I]
    out_ptr,  # [M, H] x.dtype
    part_ptr,  # [M*K, H] fp32 scratch: each pair's partial
    cnt_ptr,  # [M, ceil(H/BN)] int32 arrival counters, zero on entry
    topk_ids_ptr,  # [M*K] int32
    ws_ptr,  # [S, H/BK, I/BK] fp32 block scales (read iff FP8)
    tw_ptr,  # [M*K] fp32 routing weights (read iff FP8: act is unweighted there)
    hidden, inter, num_slots,
    stride_am, stride_we, stride_wn, stride_om, stride_pm, stride_wse, stride_wsn,
    TOP_K: tl.constexpr, K_P2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
    FP8: tl.constexpr, EPS: tl.constexpr, QMAX: tl.constexpr,
    SWAP_AB: tl.constexpr,  # w2 tile x rows^T: the weight rows on the MMA's M side
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    pid_n = tl.program_id(0)
    pair = tl.program_id(1).to(tl.int64)
    tok = pair // TOP_K
    e = tl.load(topk_ids_ptr + pair)
    ok = (e >= 0) & (e < num_slots)
    rows = tl.arange(0, BLOCK_M)
    row0 = rows == 0
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < hidden
    offs_nw = (offs_n % hidden).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + pair * stride_am + offs_k[None, :] + rows[:, None] * 0
    b_ptrs = w2_ptr + tl.where(ok, e, 0).to(tl.int64) * stride_we \
        + offs_nw[None, :] * stride_wn + offs_k[:, None]
    acc = direct_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    steps = tl.where(ok, tl.cdiv(inter, BLOCK_K), 0)  # excluded pairs load nothing
    ws0 = ws_ptr + tl.where(ok, e, 0).to(tl.int64) * stride_wse \
        + ((pid_n * BLOCK_N) // BLOCK_K) * stride_wsn
    wp = tl.load(tw_ptr + pair, mask=ok & FP8, other=0.0)  # the pair's weight (FP8 only)
    for k in range(0, steps):
        if FP8:  # BLOCK_K = G, BLOCK_N <= G: one weight scale per step; row 0 quantized
            af = tl.load(a_ptrs, mask=row0[:, None], other=0.0).to(tl.float32)
            aq, a_s = quantize_tile(af, EPS, QMAX)
            b = tl.load(b_ptrs)
            acc = direct_scaled_dot(acc, aq, b, a_s * (tl.load(ws0 + k) * wp), SWAP_AB)
        elif EVEN_K:
            a = tl.load(a_ptrs, mask=row0[:, None], other=0.0)
            b = tl.load(b_ptrs)
            acc = direct_dot(acc, a, b, PRECISION, SWAP_AB)
        else:
            k_ok = offs_k < inter - k * BLOCK_K
            a = tl.load(a_ptrs, mask=row0[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
            acc = direct_dot(acc, a, b, PRECISION, SWAP_AB)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if SWAP_AB:
        acc = tl.trans(acc)
    tl.store(part_ptr + pair * stride_pm + offs_n, tl.sum(acc, axis=0), mask=n_ok)
    # every thread's partial stored before the ticket (release); the K-th arrival reads all
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt_ptr + tok * tl.num_programs(0) + pid_n, 1, sem="acq_rel")
    if ticket == TOP_K - 1:
        tl.debug_barrier()
        offs_j = tl.arange(0, K_P2)
        ids = tl.load(topk_ids_ptr + tok * TOP_K + offs_j, mask=offs_j < TOP_K, other=-1)
        live = (ids >= 0) & (ids < num_slots)
        parts = tl.load(part_ptr + (tok * TOP_K + offs_j)[:, None] * stride_pm + offs_n[None, :],
                        mask=live[:, None] & n_ok[None, :], other=0.0, cache_modifier=".cg")
        tl.store(out_ptr + tok * stride_om + offs_n,
                 tl.sum(parts, axis=0).to(out_ptr.dtype.element_ty), mask=n_ok)


_LAUNCH_DIRECT_PAIRS = FastLauncher(_down_direct_pairs_kernel)


# ---------------------------------------------------------------- launcher
def _check_w2(act: torch.Tensor, w2: torch.Tensor) -> None:
    inter = act.shape[1]
    if w2.shape[2] != inter or w2.dtype != act.dtype or w2.stride(2) != 1 or act.stride(1) != 1:
        raise ValueError(f"w2 {tuple(w2.shape)} {w2.dtype} does not match act "
                         f"{tuple(act.shape)} {act.dtype} (expected [S, H, {inter}], "
                         f"contiguous last dim)")


def down(act: torch.Tensor, w2: torch.Tensor, align: Alignment, topk_weights: torch.Tensor,
         top_k: int, cfg: DownConfig, *, atomic_out: torch.Tensor | None = None,
         out: torch.Tensor | None = None, shared: FusedShared | None = None,
         swap_ab: bool = False) -> torch.Tensor:
    """Weighted down projection of the aligned rows.

    Args:
        act: ``[max_blocks*BM, I]`` from :func:`gate_up`.
        w2: ``[S, H, I]`` act.dtype, last dim contiguous.
        align: the alignment ``act`` was built with.
        topk_weights: ``[M, K]`` fp32 contiguous.
        top_k: ``K``.
        cfg: tile; ``cfg.split_k > 1`` needs ``atomic_out``.
        atomic_out: a zeroed fp32 ``[M, H]`` accumulator to add into (the ``"atomic"``
            combine); the call returns it.
        out: else an optional ``[M*K, H]`` act.dtype buffer for the per-pair rows (rows of
            ``-1`` pairs are not written).
        shared: the fused shared expert (its ``w2 [H, Is]``; slots ``S..S+n-1``).
        swap_ab: compute ``W x^T`` (``ExpertsConfig.swap_ab``; ``direct_tiles.py``): at
            ``block_m`` 16/32 a ``block_n`` of 64 or more then runs wgmmas on sm90.

    Returns: ``atomic_out`` or ``y [M*K, H]``. One launch; current stream; no host sync.
    """
    rows, inter = act.shape
    s, h, _ = w2.shape
    _check_w2(act, w2)
    if topk_weights.dtype != torch.float32 or not topk_weights.is_contiguous() or \
            topk_weights.numel() != align.num_pairs:
        raise ValueError("topk_weights must be a contiguous fp32 [M, K] tensor")
    m = align.num_pairs // top_k
    if cfg.split_k > 1 and atomic_out is None:
        raise ValueError("split_k > 1 needs atomic_out (the fp32 accumulator)")
    if atomic_out is not None:
        if atomic_out.shape != (m, h) or atomic_out.dtype != torch.float32 or \
                not atomic_out.is_contiguous():
            raise ValueError(f"atomic_out must be a contiguous fp32 [{m}, {h}] tensor")
        dst = atomic_out
    else:
        if out is None:
            out = torch.empty(align.num_pairs, h, dtype=act.dtype, device=act.device)
        elif out.shape != (align.num_pairs, h) or out.dtype != act.dtype or out.stride(1) != 1:
            raise ValueError(f"out must be [{align.num_pairs}, {h}] {act.dtype}")
        dst = out
    mode, sw2 = 0, w2
    if shared is not None:
        sw2 = shared.w2
        if sw2.dtype != act.dtype or sw2.shape[0] != h or sw2.stride(1) != 1 \
                or sw2.shape[1] % inter or shared.first_slot != s:
            raise ValueError(f"shared w2 {tuple(sw2.shape)} {sw2.dtype} must be [{h}, Is] "
                             f"{act.dtype}, Is a multiple of {inter}, first_slot == S={s}")
        mode = 1 if sw2.stride(0) == w2.stride(1) else 2
    grid = (align.max_blocks * cdiv(h, cfg.block_n), cfg.split_k)
    _LAUNCH(
        grid,
        act, w2, sw2, dst, topk_weights, align.sorted_ids, align.expert_ids, align.num_post,
        align.num_pairs, h, inter, align.max_blocks, s,
        act.stride(0), w2.stride(0), w2.stride(1), dst.stride(0), sw2.stride(0),
        # TOP_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, EVEN_K, ATOMIC, PRECISION,
        # SHARED, SWAP_AB
        top_k, align.block_m, cfg.block_n, cfg.block_k, cfg.group_m, cfg.split_k,
        inter % (cfg.block_k * cfg.split_k) == 0, atomic_out is not None,
        dot_precision(act.dtype), mode, swap_ab,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return dst


def down_direct(act: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor, cfg: DownConfig,
                out: torch.Tensor | None = None, *,
                counters: torch.Tensor | None = None,
                w2_scale: torch.Tensor | None = None,
                topk_weights: torch.Tensor | None = None, swap_ab: bool = False) -> torch.Tensor:
    """``out[t] = sum_j act[t*K + j] @ w2[topk_ids[t, j]]^T`` over token ``t``'s local pairs
    (the ``kernel="direct"`` decode path; ``act`` from ``gate_up_direct``, weights applied).

    Args:
        act: ``[M*K, I]``, last dim contiguous. w2: ``[S, H, I]`` act.dtype, or e4m3 with
            ``w2_scale``.
        topk_ids: ``[M, K]`` int32 contiguous (``-1`` / ``>= S``: excluded, its row unread).
        cfg: the tile (``split_k`` must be 1; ``group_m`` unused).
        out: optional ``[M, H]`` act.dtype buffer.
        counters: None -- the per-token form (``M * ceil(H / BN)`` programs); or an int32
            ``[M * ceil(H / BN)]`` buffer of zeros (zeroed by ``gate_up_direct(zero=)``) --
            the per-pair form (``M * K * ceil(H / BN)`` programs, an fp32 ``[M*K, H]``
            scratch, the K-th arrival of each (token, N tile) sums in pair order).
        w2_scale: ``[S, H/128, I/128]`` fp32 block scales of an e4m3 ``w2`` (the fp8 path,
            ``fp8_direct.py``): each row of ``act`` is quantized per 128-column group in
            registers (``moerun.quant``'s numbers) and the dots are scaled; needs
            ``cfg.block_k == 128`` and ``cfg.block_n`` dividing 128. ``act`` is then the
            *unweighted* intermediate (as in the grouped fp8 path) and ``topk_weights``
            (``[M, K]`` fp32 contiguous) enter each step's scale.
        swap_ab: compute ``W x^T`` (``ExpertsConfig.swap_ab``): the tile's weight rows on
            the MMA's M side, so on sm90 a ``block_n`` of 64 or 128 runs wgmmas (e4m3 ones
            for the fp8 path).

    Returns: ``out [M, H]`` act.dtype (zeros for a token with no local pair). One launch;
    current stream; no host sync; capture-safe.
    """
    pairs, inter = act.shape
    s, h, _ = w2.shape
    fp8 = w2_scale is not None
    if fp8:
        _check_w2_fp8(act, w2, w2_scale, cfg)
        if topk_weights is None or topk_weights.dtype != torch.float32 or \
                topk_weights.numel() != pairs or not topk_weights.is_contiguous():
            raise ValueError("the fp8 direct down needs topk_weights, a contiguous fp32 "
                             f"[M, K] tensor of {pairs} pairs")
    else:
        _check_w2(act, w2)
    if topk_ids.dim() != 2 or topk_ids.numel() != pairs or topk_ids.dtype != torch.int32 \
            or not topk_ids.is_contiguous():
        raise ValueError(f"topk_ids must be a contiguous int32 [M, K] tensor of {pairs} pairs")
    if cfg.split_k != 1:
        raise ValueError(f"DownConfig.split_k={cfg.split_k}: the direct down kernel has no "
                         "split-K (use split_k=1)")
    m, k = topk_ids.shape
    if out is None:
        out = torch.empty(m, h, dtype=act.dtype, device=act.device)
    elif out.shape != (m, h) or out.dtype != act.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {h}] {act.dtype}")
    n_tiles = cdiv(h, cfg.block_n)
    if counters is not None and (counters.dtype != torch.int32 or counters.numel() != m * n_tiles
                                 or not counters.is_contiguous()):
        raise ValueError(f"counters must be a contiguous int32 tensor of M * ceil(H / block_n) "
                         f"= {m * n_tiles} zeros")
    if m == 0:
        return out
    ws = w2_scale if fp8 else w2  # unread without FP8
    tw = topk_weights if fp8 else topk_ids
    ws_strides = (ws.stride(0), ws.stride(1))
    # the fp8 dot's precision argument is unused; PRECISION only names the float dots'
    prec = "ieee" if fp8 else dot_precision(act.dtype)
    meta = (k, max(2, next_pow2(k)), DIRECT_BLOCK_M, cfg.block_n, cfg.block_k,
            inter % cfg.block_k == 0, prec, fp8, AMAX_EPS, FP8_MAX, swap_ab)
    if counters is not None:
        part = torch.empty(pairs, h, dtype=torch.float32, device=act.device)
        _LAUNCH_DIRECT_PAIRS(
            (n_tiles, pairs),
            act, w2, out, part, counters, topk_ids, ws, tw, h, inter, s,
            act.stride(0), w2.stride(0), w2.stride(1), out.stride(0), part.stride(0),
            *ws_strides, *meta,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        return out
    _LAUNCH_DIRECT(
        (n_tiles, m),
        act, w2, out, topk_ids, ws, tw, h, inter, s,
        act.stride(0), w2.stride(0), w2.stride(1), out.stride(0), *ws_strides, *meta,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def _check_w2_fp8(act: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                  cfg: DownConfig) -> None:
    check_w2_fp8(act, w2, w2_scale)
    if act.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"act {act.dtype}: the fp8 direct down quantizes fp32/fp16/bf16 rows")
    if cfg.block_k != FP8_GROUP or FP8_GROUP % cfg.block_n:
        raise ValueError(f"DownConfig block_k={cfg.block_k}, block_n={cfg.block_n}: the fp8 "
                         f"direct down needs block_k={FP8_GROUP} and a block_n dividing "
                         f"{FP8_GROUP}")


# ---------------------------------------------------------------- torch twin
def down_torch(act: torch.Tensor, w2: torch.Tensor, align: Alignment,
               topk_weights: torch.Tensor, top_k: int, *, atomic: bool,
               shared: FusedShared | None = None) -> torch.Tensor:
    """Pure-torch twin of :func:`down` (fp32 math; a host sync per block to pick the slot).

    Returns the fp32 ``[M, H]`` sum when ``atomic``, else ``y [M*K, H]`` act.dtype with zero
    rows for excluded pairs (the kernel leaves those unwritten).
    """
    rows, inter = act.shape
    h = w2.shape[1]
    bm = align.block_m
    p = align.num_pairs
    y = torch.zeros(p + 1, h, dtype=torch.float32, device=act.device)  # row P = padding sink
    wflat = torch.cat([topk_weights.reshape(-1).float(), topk_weights.new_zeros(1)])
    for b in range(align.max_blocks):
        pair = align.sorted_ids[b * bm:(b + 1) * bm].long().clamp(max=p)
        e = int(align.expert_ids[b].clamp(min=0))  # NOTE: host sync (twin only)
        live = (align.expert_ids[b] >= 0) & (b * bm < align.num_post[0])
        yb = (act[b * bm:(b + 1) * bm].float() @ slot_w2(e, w2, shared).float().t()) \
            * wflat[pair][:, None]
        y.index_add_(0, pair, torch.where(live, yb, torch.zeros_like(yb)))
    y = y[:p]
    if atomic:
        return y.view(p // top_k, top_k, h).sum(1)
    return y.to(act.dtype)


def down_direct_torch(act: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor
                      ) -> torch.Tensor:
    """Pure-torch twin of :func:`down_direct` (fp32 math, act.dtype result)."""
    m, k = topk_ids.shape
    s = w2.shape[0]
    ids = topk_ids.reshape(-1).long()
    ok = (ids >= 0) & (ids < s)
    y = torch.einsum("pi,phi->ph", act.float(), w2[ids.clamp(0, max(s - 1, 0))].float())
    y = torch.where(ok[:, None], y, torch.zeros_like(y))
    return y.view(m, k, -1).sum(1).to(act.dtype)
