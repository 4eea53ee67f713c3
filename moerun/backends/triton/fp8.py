"""Block-scaled FP8 grouped GEMMs for :class:`TritonExperts` (DESIGN 11a, issue 12).

Legend as ``gate_up.py``: ``M`` rows, ``K`` top-k, ``H`` hidden, ``I`` intermediate, ``S``
slots, ``R`` aligned rows; ``G = 128`` the quantization group (``QuantConfig.act_group``, the
column width of a weight block). Weights are e4m3 with an fp32 ``scale_inv`` per 128 x 128
block; activations are quantized per row and 128-column group (``moerun.quant`` defines the
numbers; its functions are the torch twin).

Four kernels, each one launch (the paired one in ``fp8_paired.py``; the tile helpers
shared by all in ``fp8_tiles.py``):

* ``quantize_rows_fp8`` (``fp8_quant.py``, re-exported here) -- ``x [M, H]`` -> e4m3
  ``[M, H]`` + fp32 ``[M, H/G]``; used before a dispatch that moves fp8 rows (post-quant
  dispatch).
* ``gate_up_fp8`` -- as ``gate_up.gate_up``, with ``BLOCK_K = G``: each K step loads one
  activation scale per row and one weight scale per output column, ``acc += dot(a_fp8,
  w_fp8) * a_scale * w_scale`` (fp32; a tile of at most 128 columns lies in one weight
  block, so its step loads ONE weight scale and multiplies by a per-row vector, the
  ``rowscale`` form of ``benchmarks/fp8_gemm_probe.py``; the down GEMM likewise),
  ``silu(gate) * up`` in the epilogue, written in the
  layer's activation dtype. The activations are either already fp8 (``QuantizedRows``) or
  quantized in registers as they are loaded (the activation quantization fused into this
  kernel: each 128-column tile is exactly one group, so its row amax is local).
* ``gate_up_fp8`` with a ``paired`` tile -- the same GEMM as one dot over interleaved
  gate/up weight rows (``fp8_paired.py``); its intermediate is written in the activation
  dtype and, at prefill sizes, quantized by ``quantize_rows_fp8`` for the down GEMM.
* ``down_fp8`` -- as ``down.down``, with ``BLOCK_K = G``: the intermediate is re-quantized in
  registers per row and 128-column group as it is loaded (one tile = one group), then the
  same scaled dot; routing weight in the epilogue, atomic fp32 sum or per-pair rows.

No host sync, current stream, capturable (the alignment and combine are the bf16 path's).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moerun._triton.compat import patch_interpreter
from moerun._triton.launch import FastLauncher, cdiv
from moerun._triton.device import capability_major
from moerun._triton.gdc import pdl_prologue
from moerun.backends.triton.align import Alignment
from moerun.backends.triton.configs import (
    FP8_GROUP,
    FP8_PREQUANT_BLOCK_M,
    DownConfig,
    ExpertsConfig,
    GateUpConfig,
    fp8_intermediate,
)
from moerun.backends.triton.direct_tiles import (direct_acc, direct_scaled_dot,
                                                  outer_scaled_dot)
from moerun.backends.triton.fp8_checks import check_w2_fp8, check_w13_fp8
from moerun.backends.triton.down_tiles import store_down_rows
from moerun.backends.triton.fp8_paired import gate_up_paired
from moerun.backends.triton.fp8_quant import quantize_rows_fp8
from moerun.backends.triton.fp8_tiles import block_rows, load_act_tile, quantize_tile, round_to
from moerun.backends.triton.gate_up import grouped_pid
from moerun.quant import AMAX_EPS, FP8_DTYPE, FP8_MAX, QuantizedRows

patch_interpreter()

__all__ = ["GROUP", "quantize_rows_fp8", "gate_up_fp8", "down_fp8", "run_experts_fp8"]

#: The quantization group and the K tile of both GEMMs.
GROUP = FP8_GROUP


# ---------------------------------------------------------------- kernels
@triton.jit(do_not_specialize=["num_pairs", "max_blocks"])
def _gate_up_fp8_kernel(
    x_ptr,  # [M, H] e4m3 (A_FP8) or the activation dtype
    xs_ptr,  # [M, H/G] fp32 (read iff A_FP8)
    w_ptr,  # [S, 2I, H] e4m3
    ws_ptr,  # [S, 2I/G, H/G] fp32
    act_ptr,  # [R, I] out: e4m3 (OUT_FP8) or the activation dtype
    acts_ptr,  # [R, I/G] fp32 out (written iff OUT_FP8)
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    num_pairs, inter, hidden, max_blocks,
    stride_xm, stride_xsm, stride_we, stride_wn, stride_wse, stride_wsn, stride_am,
    stride_asm,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr,
    GROUP_M: tl.constexpr, A_FP8: tl.constexpr, OUT_FP8: tl.constexpr, MID: tl.constexpr,
    EPS: tl.constexpr, QMAX: tl.constexpr,
    SWAP_AB: tl.constexpr,  # weights x rows^T (direct_tiles.py): the weight rows on M
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_pid(pid, max_blocks, tl.cdiv(inter, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_post_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_m, pair, row_ok, tok = block_rows(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M, TOP_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_nw = offs_n % inter
    offs_k = tl.arange(0, G)

    a_ptrs = x_ptr + tok[:, None] * stride_xm + offs_k[None, :]
    as_ptrs = xs_ptr + tok * stride_xsm
    g_ptrs = w_ptr + expert * stride_we + offs_nw[None, :].to(tl.int64) * stride_wn \
        + offs_k[:, None]
    u_ptrs = g_ptrs + inter * stride_wn
    gs_ptrs = ws_ptr + expert * stride_wse + (offs_nw // G) * stride_wsn
    us_ptrs = gs_ptrs + (inter // G) * stride_wsn

    acc_g = direct_acc(BLOCK_M, BLOCK_N, SWAP_AB)  # SWAP_AB: [BN, BM]
    acc_u = direct_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    # BLOCK_N <= G: the tile's columns lie in one weight block, so a step's weight scale is
    # one scalar and the step's scale a [BLOCK_M] vector (no [BM, BN] outer product)
    gs0 = ws_ptr + expert * stride_wse + ((pid_n * BLOCK_N) // G) * stride_wsn
    us0 = gs0 + (inter // G) * stride_wsn
    for k in range(0, hidden // G):
        a, a_s = load_act_tile(a_ptrs, as_ptrs, k, row_ok, A_FP8, EPS, QMAX)
        g = tl.load(g_ptrs)
        u = tl.load(u_ptrs)
        if BLOCK_N <= G:
            acc_g = direct_scaled_dot(acc_g, a, g, a_s * tl.load(gs0 + k), SWAP_AB)
            acc_u = direct_scaled_dot(acc_u, a, u, a_s * tl.load(us0 + k), SWAP_AB)
        else:
            g_s = tl.load(gs_ptrs + k)
            u_s = tl.load(us_ptrs + k)
            acc_g = outer_scaled_dot(acc_g, a, g, a_s, g_s, SWAP_AB)
            acc_u = outer_scaled_dot(acc_u, a, u, a_s, u_s, SWAP_AB)
        a_ptrs += G
        g_ptrs += G
        u_ptrs += G
    if SWAP_AB:
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)

    act = acc_g * tl.sigmoid(acc_g) * acc_u
    out_ptrs = act_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_n[None, :]
    if OUT_FP8:  # BLOCK_N == G: this tile is one group of each row; round like the bf16 path
        act = round_to(act, MID)
        q, a_scale = quantize_tile(act, EPS, QMAX)
        tl.store(out_ptrs, q)
        tl.store(acts_ptr + offs_m.to(tl.int64) * stride_asm + pid_n, a_scale)
    else:
        tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=(offs_n < inter)[None, :])


@triton.jit(do_not_specialize=["num_pairs", "max_blocks"])
def _down_fp8_kernel(
    act_ptr,  # [R, I] e4m3 (A_FP8) or the activation dtype
    acts_ptr,  # [R, I/G] fp32 (read iff A_FP8)
    w_ptr,  # [S, H, I] e4m3
    ws_ptr,  # [S, H/G, I/G] fp32
    out_ptr,  # ATOMIC: [M, H] fp32; else [M*K, H]
    topk_weights_ptr,  # [M*K] fp32
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    num_pairs, hidden, inter, max_blocks,
    stride_am, stride_asm, stride_we, stride_wn, stride_wse, stride_wsn, stride_om,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, ATOMIC: tl.constexpr, A_FP8: tl.constexpr,
    EPS: tl.constexpr, QMAX: tl.constexpr,
    SWAP_AB: tl.constexpr,  # weights x rows^T (direct_tiles.py): the weight rows on M
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
    offs_k = pid_k * G + tl.arange(0, G)
    a_ptrs = act_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    b_ptrs = w_ptr + expert * stride_we + offs_nw[None, :].to(tl.int64) * stride_wn \
        + offs_k[:, None]
    bs_ptrs = ws_ptr + expert * stride_wse + (offs_nw // G) * stride_wsn + pid_k
    bs0 = ws_ptr + expert * stride_wse + ((pid_n * BLOCK_N) // G) * stride_wsn + pid_k
    as_ptrs = acts_ptr + offs_m.to(tl.int64) * stride_asm + pid_k

    acc = direct_acc(BLOCK_M, BLOCK_N, SWAP_AB)  # SWAP_AB: [BN, BM]
    for k in range(0, inter // (G * SPLIT_K)):
        if A_FP8:
            a = tl.load(a_ptrs)
            a_s = tl.load(as_ptrs + k * SPLIT_K)
        else:
            af = tl.load(a_ptrs).to(tl.float32)
            a, a_s = quantize_tile(af, EPS, QMAX)
        b = tl.load(b_ptrs)
        if BLOCK_N <= G:  # one weight block per tile and step: a scalar scale
            acc = direct_scaled_dot(acc, a, b, a_s * tl.load(bs0 + k * SPLIT_K), SWAP_AB)
        else:
            b_s = tl.load(bs_ptrs + k * SPLIT_K)
            acc = outer_scaled_dot(acc, a, b, a_s, b_s, SWAP_AB)
        a_ptrs += G * SPLIT_K
        b_ptrs += G * SPLIT_K
    if SWAP_AB:
        acc = tl.trans(acc)

    store_down_rows(acc, out_ptr, topk_weights_ptr, sorted_ids_ptr, offs_m, offs_n, num_pairs,
                    hidden, stride_om, TOP_K, ATOMIC)


_GATE_UP = FastLauncher(_gate_up_fp8_kernel)
_DOWN = FastLauncher(_down_fp8_kernel)


# ---------------------------------------------------------------- configs
# ---------------------------------------------------------------- launchers
_MID = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def gate_up_fp8(x: torch.Tensor | QuantizedRows, w13: torch.Tensor, w13_scale: torch.Tensor,
                align: Alignment, top_k: int, cfg: GateUpConfig, out_dtype: torch.dtype, *,
                fp8_out: bool = False, swap_ab: bool = False) -> torch.Tensor | QuantizedRows:
    """``act[r] = silu(x W_g^T) * (x W_u^T)`` per aligned row with fp8 block-scaled GEMMs.

    Args:
        x: ``QuantizedRows`` (``[M, H]`` e4m3 + ``[M, H/128]`` fp32) or ``[M, H]``
            fp32/fp16/bf16 (quantized in registers, identically).
        w13: ``[S, 2I, H]`` e4m3, last dim contiguous; ``w13_scale [S, 2I/128, H/128]`` fp32.
        align: from ``moe_align`` with ``M*K`` pairs; ``top_k``: ``K``.
        cfg: tile (``block_k`` is ignored: always 128); with ``cfg.paired`` one dot over
            ``block_n`` interleaved gate/up weight rows (``block_n / 2`` intermediate columns
            per tile, written in ``out_dtype``). ``out_dtype``: the activation dtype.
        fp8_out: write ``act`` already quantized (needs ``cfg.block_n == 128`` and not
            ``paired``: one tile is one group of each row); the values are rounded to
            ``out_dtype`` first, so the codes equal quantizing the ``out_dtype`` result.
        swap_ab: compute ``W x^T`` (``ExpertsConfig.swap_ab``; ``direct_tiles.py``; not with
            ``paired``): at ``block_m`` 16/32 a ``block_n`` of 64 or more then runs e4m3
            wgmmas on sm90.

    Returns ``act [max_blocks*BM, I]`` in ``out_dtype``, or as :class:`QuantizedRows` with
    ``fp8_out``; rows in aligned order (rows of unused blocks unwritten). One launch;
    current stream; no host sync.
    """
    a_fp8 = isinstance(x, QuantizedRows)
    xd = x.data if a_fp8 else x
    xs = x.scale if a_fp8 else xd  # unread when not a_fp8
    m, h = xd.shape
    inter = w13.shape[1] // 2
    check_w13_fp8(xd, w13, w13_scale)
    if align.num_pairs != m * top_k:
        raise ValueError(f"alignment covers {align.num_pairs} pairs, expected {m}*{top_k}")
    if out_dtype not in _MID:
        raise ValueError(f"out_dtype={out_dtype}: use fp32, fp16 or bf16")
    if fp8_out and cfg.paired:
        raise ValueError("fp8_out with a paired gate/up tile: its intermediate is written in "
                         "the activation dtype; quantize it with quantize_rows_fp8")
    if fp8_out and cfg.block_n != GROUP:
        raise ValueError(f"fp8_out needs cfg.block_n == {GROUP}, got {cfg.block_n}")
    if swap_ab and cfg.paired:
        raise ValueError("swap_ab with a paired gate/up tile: the paired kernel has one "
                         "product form; use an unpaired tile")
    rows = align.max_blocks * align.block_m
    if cfg.paired:
        return gate_up_paired(xd, xs, a_fp8, w13, w13_scale, align, top_k, cfg, out_dtype)
    out = torch.empty(rows, inter, dtype=FP8_DTYPE if fp8_out else out_dtype,
                      device=xd.device)
    scale = torch.empty(rows, inter // GROUP, dtype=torch.float32, device=xd.device) \
        if fp8_out else out
    grid = (align.max_blocks * cdiv(inter, cfg.block_n),)
    _GATE_UP(
        grid,
        xd, xs, w13, w13_scale, out, scale, align.sorted_ids, align.expert_ids,
        align.num_post,
        align.num_pairs, inter, h, align.max_blocks,
        xd.stride(0), xs.stride(0), w13.stride(0), w13.stride(1), w13_scale.stride(0),
        w13_scale.stride(1), out.stride(0), scale.stride(0),
        # TOP_K, BLOCK_M, BLOCK_N, G, GROUP_M, A_FP8, OUT_FP8, MID, EPS, QMAX, SWAP_AB
        top_k, align.block_m, cfg.block_n, GROUP, cfg.group_m, a_fp8, fp8_out,
        _MID[out_dtype], AMAX_EPS, FP8_MAX, swap_ab,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return QuantizedRows(data=out, scale=scale, group=GROUP) if fp8_out else out


def down_fp8(act: torch.Tensor | QuantizedRows, w2: torch.Tensor, w2_scale: torch.Tensor,
             align: Alignment, topk_weights: torch.Tensor, top_k: int, cfg: DownConfig, *,
             out_dtype: torch.dtype | None = None,
             atomic_out: torch.Tensor | None = None, swap_ab: bool = False) -> torch.Tensor:
    """Weighted fp8 down projection of the aligned rows.

    Args:
        act: ``[max_blocks*BM, I]`` from :func:`gate_up_fp8`: in the activation dtype
            (re-quantized per row and 128-column group in registers as it is loaded), or
            :class:`QuantizedRows` (already quantized by the gate/up epilogue).
        w2: ``[S, H, I]`` e4m3; ``w2_scale [S, H/128, I/128]`` fp32.
        align, topk_weights (``[M, K]`` fp32 contiguous), top_k: as ``down.down``.
        cfg: tile (``block_k`` ignored: 128); ``split_k`` must divide ``I/128`` and needs
            ``atomic_out``.
        out_dtype: dtype of the per-pair rows (default ``act.dtype``; required for
            :class:`QuantizedRows` without ``atomic_out``).
        atomic_out: a zeroed fp32 ``[M, H]`` accumulator; else new ``[M*K, H]`` rows.
        swap_ab: compute ``W x^T`` (``ExpertsConfig.swap_ab``; ``direct_tiles.py``).

    Returns ``atomic_out`` or ``y [M*K, H]``. One launch; current stream; no host sync.
    """
    a_fp8 = isinstance(act, QuantizedRows)
    ad = act.data if a_fp8 else act
    asc = act.scale if a_fp8 else ad  # unread when not a_fp8
    rows, inter = ad.shape
    h = w2.shape[1]
    check_w2_fp8(ad, w2, w2_scale)
    if topk_weights.dtype != torch.float32 or not topk_weights.is_contiguous() or \
            topk_weights.numel() != align.num_pairs:
        raise ValueError("topk_weights must be a contiguous fp32 [M, K] tensor")
    split = cfg.split_k
    if (inter // GROUP) % split:
        raise ValueError(f"split_k={split} must divide I/128={inter // GROUP}")
    m = align.num_pairs // top_k
    if split > 1 and atomic_out is None:
        raise ValueError("split_k > 1 needs atomic_out (the fp32 accumulator)")
    if atomic_out is not None:
        if atomic_out.shape != (m, h) or atomic_out.dtype != torch.float32 or \
                not atomic_out.is_contiguous():
            raise ValueError(f"atomic_out must be a contiguous fp32 [{m}, {h}] tensor")
        dst = atomic_out
    else:
        dtype = out_dtype or (None if a_fp8 else ad.dtype)
        if dtype is None:
            raise ValueError("down_fp8 of QuantizedRows needs out_dtype or atomic_out")
        dst = torch.empty(align.num_pairs, h, dtype=dtype, device=ad.device)
    grid = (align.max_blocks * cdiv(h, cfg.block_n), split)
    _DOWN(
        grid,
        ad, asc, w2, w2_scale, dst, topk_weights, align.sorted_ids, align.expert_ids,
        align.num_post,
        align.num_pairs, h, inter, align.max_blocks,
        ad.stride(0), asc.stride(0), w2.stride(0), w2.stride(1), w2_scale.stride(0),
        w2_scale.stride(1), dst.stride(0),
        # TOP_K, BLOCK_M, BLOCK_N, G, GROUP_M, SPLIT_K, ATOMIC, A_FP8, EPS, QMAX, SWAP_AB
        top_k, align.block_m, cfg.block_n, GROUP, cfg.group_m, split, atomic_out is not None,
        a_fp8, AMAX_EPS, FP8_MAX, swap_ab,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return dst


# ---------------------------------------------------------------- the whole expert path
#: From this ``block_m`` on the activations are quantized by one kernel before the gate/up
#: GEMM and, with 128-column gate/up tiles, the intermediate is written in fp8
#: (``configs.FP8_PREQUANT_BLOCK_M`` / ``configs.fp8_intermediate``: the one definition,
#: which ``moerun tune --dtype fp8`` plans with).
PREQUANT_BLOCK_M = FP8_PREQUANT_BLOCK_M


def _ws_supported(device: torch.device) -> bool:
    """``kernel="ws"`` runs the Gluon kernels of ``fp8_ws.py`` here (CUDA compute capability
    9.x; contiguous weights and scales, checked by the caller), else the grouped ones with the
    same tiles. Host only; imports no Gluon."""
    return device.type == "cuda" and capability_major(device) == 9


def run_experts_fp8(x: torch.Tensor | QuantizedRows, w13: torch.Tensor, w2: torch.Tensor,
                    w13_scale: torch.Tensor, w2_scale: torch.Tensor,
                    topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                    cfg: ExpertsConfig, out_dtype: torch.dtype) -> torch.Tensor:
    """``out[t] = sum_j w[t, j] * expert_{ids[t, j]}(x[t])`` with the fp8 GEMMs.

    ``topk_ids [M, K]`` int32 contiguous (``-1`` skipped), ``topk_weights [M, K]`` fp32
    contiguous, ``cfg`` an fp8 config (``configs.fp8_default_config`` or a tuned fp8 file).
    Returns ``[M, H]`` in ``out_dtype``. 4 launches (alignment, gate/up, down, cast or sum;
    a ``kernel="direct"`` config: 2, ``fp8_direct.py``; ``kernel="ws"`` on sm90: the Gluon
    kernels of ``fp8_ws.py``, 7 to 9),
    plus the activation quantization for an unquantized ``x`` when ``cfg.block_m >=
    PREQUANT_BLOCK_M`` and the intermediate's quantization after a ``paired`` gate/up tile
    there; no host sync.
    """
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum

    if cfg.kernel == "ws" and out_dtype != torch.float32 and _ws_supported(w13.device) \
            and all(t.is_contiguous() for t in (w13, w2, w13_scale, w2_scale)):
        # (strided or broadcast weights, e.g. the tuner's compile problem: no TMA over them,
        # so the grouped kernels with the same tiles below)
        from moerun.backends.triton.fp8_ws import run_experts_fp8_ws

        return run_experts_fp8_ws(x, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids,
                                  gate_up_cols=cfg.gate_up.block_n,
                                  down_cols=cfg.down.block_n,
                                  gate_up_stages=cfg.gate_up.num_stages,
                                  down_stages=cfg.down.num_stages,
                                  group_m=cfg.gate_up.group_m, out_dtype=out_dtype,
                                  skip_padding=cfg.skip_padding)
    if cfg.kernel == "direct":  # decode: 2 launches, no alignment (fp8_direct.py)
        from moerun.backends.triton.fp8_direct import run_experts_fp8_direct

        return run_experts_fp8_direct(x, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids,
                                      cfg, out_dtype)
    xd = x.data if isinstance(x, QuantizedRows) else x
    m, h = xd.shape
    s = w13.shape[0]
    k = topk_ids.shape[1]
    prefill = cfg.block_m >= PREQUANT_BLOCK_M
    if prefill and not isinstance(x, QuantizedRows):
        x = quantize_rows_fp8(x)
    atomic = cfg.combine == "atomic"
    acc = torch.empty(m, h, dtype=torch.float32, device=xd.device) if atomic else None
    align = moe_align(topk_ids, s, cfg.block_m, zero=acc)
    f8 = fp8_intermediate(cfg.block_m, cfg.gate_up)
    paired = cfg.gate_up.paired
    act = gate_up_fp8(x, w13, w13_scale, align, k, cfg.gate_up, out_dtype,
                      fp8_out=f8 and not paired, swap_ab=cfg.swap_ab)
    if f8 and paired:  # the paired tile writes out_dtype: quantize it in one launch
        act = quantize_rows_fp8(act)
    if atomic:
        down_fp8(act, w2, w2_scale, align, topk_weights, k, cfg.down, atomic_out=acc,
                 swap_ab=cfg.swap_ab)
        return acc if out_dtype == torch.float32 else acc.to(out_dtype)
    y = down_fp8(act, w2, w2_scale, align, topk_weights, k, cfg.down, out_dtype=out_dtype,
                 swap_ab=cfg.swap_ab)
    return moe_sum(y, topk_ids, s)
