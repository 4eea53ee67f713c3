"""The fp8 direct decode path (``ExpertsConfig.kernel == "direct"`` in an fp8 file): two
launches and no alignment, as the bf16 one (``gate_up.gate_up_direct``, ``down.down_direct``).

Legend as ``fp8.py``; ``P = M*K`` (token, j) pairs.

* :func:`gate_up_fp8_direct` -- program ``(n, p)`` computes pair ``p``'s
  ``silu(x[t] W_g^T) * (x[t] W_u^T)`` for ``BLOCK_N`` intermediate columns of slot
  ``e = topk_ids[p]`` in one 16-row tile with row 0 live; ``x[t]`` is quantized per 128-column
  group in registers as it is loaded (or read as e4m3 rows with scales, ``QuantizedRows``),
  each K step scaled by the row's activation scale and the tile's one weight scale. The
  intermediate is written *unweighted* in the activation dtype, like the grouped fp8 path's;
  the launch also zeroes the arrival counters of the per-pair down form.
* ``down.down_direct(..., w2_scale=, topk_weights=)`` -- the bf16 direct down kernels with
  ``FP8``: each row is re-quantized in registers per group, and the routing weight enters
  each K step's scale; the per-token form (``combine="reduce"``) or the per-pair form
  (``"atomic"``: fp32 partials, the K-th arrival sums in pair order).

So the numbers are the grouped fp8 path's (``moerun.quant``'s quantization, the weight applied
after the quantized dot) up to summation order. Excluded pairs (``-1`` / ``>= S``) load no
weights; a token with none gets zeros. No host sync, current stream, capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moerun._triton.compat import patch_interpreter
from moerun._triton.gdc import pdl_prologue
from moerun._triton.launch import FastLauncher, cdiv, next_pow2
from moerun.backends.triton.configs import FP8_GROUP, ExpertsConfig, GateUpConfig
from moerun.backends.triton.direct_tiles import direct_acc, direct_scaled_dot
from moerun.backends.triton.fp8_checks import check_w13_fp8
from moerun.backends.triton.fp8_tiles import load_act_tile
from moerun.backends.triton.gate_up import DIRECT_BLOCK_M
from moerun.quant import AMAX_EPS, FP8_MAX, QuantizedRows

patch_interpreter()

__all__ = ["gate_up_fp8_direct", "run_experts_fp8_direct"]


@triton.jit
def _gate_up_fp8_direct_kernel(
    x_ptr,  # [M, H] e4m3 (A_FP8) or the activation dtype
    xs_ptr,  # [M, H/G] fp32 (read iff A_FP8)
    w_ptr,  # [S, 2I, H] e4m3
    ws_ptr,  # [S, 2I/G, H/G] fp32
    act_ptr,  # [M*K, I] out, the activation dtype
    topk_ids_ptr,  # [M*K] int32
    zero_ptr, zero_numel,  # int32 buffer zeroed iff ZBLOCK (the per-pair down's counters)
    inter, hidden, num_slots,
    stride_xm, stride_xsm, stride_we, stride_wn, stride_wse, stride_wsn, stride_am,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr,
    A_FP8: tl.constexpr, EPS: tl.constexpr, QMAX: tl.constexpr, ZBLOCK: tl.constexpr,
    SWAP_AB: tl.constexpr,  # weights x rows^T: the weight rows on the MMA's M side
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    pid_n = tl.program_id(0)
    pair = tl.program_id(1)
    if ZBLOCK > 0:  # every program zeroes its share, excluded pairs' programs too
        prog = pair * tl.num_programs(0) + pid_n
        offs_z = prog * ZBLOCK + tl.arange(0, ZBLOCK)
        tl.store(zero_ptr + offs_z, tl.zeros([ZBLOCK], dtype=tl.int32), mask=offs_z < zero_numel)
    expert = tl.load(topk_ids_ptr + pair).to(tl.int64)
    if (expert < 0) | (expert >= num_slots):
        return
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows == 0
    tok = (pair // TOP_K + rows * 0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # BLOCK_N divides G, G divides I
    offs_k = tl.arange(0, G)
    a_ptrs = x_ptr + tok[:, None] * stride_xm + offs_k[None, :]
    as_ptrs = xs_ptr + tok * stride_xsm
    g_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn \
        + offs_k[:, None]
    u_ptrs = g_ptrs + inter * stride_wn
    # the tile's columns lie in one weight block: one scalar scale per K step
    gs0 = ws_ptr + expert * stride_wse + ((pid_n * BLOCK_N) // G) * stride_wsn
    us0 = gs0 + (inter // G) * stride_wsn
    # SWAP_AB: [BN, BM] accumulators, an e4m3 wgmma (M = BN weight rows) per dot
    acc_g = direct_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    acc_u = direct_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    for k in range(0, hidden // G):
        a, a_s = load_act_tile(a_ptrs, as_ptrs, k, row_ok, A_FP8, EPS, QMAX)
        g = tl.load(g_ptrs)
        u = tl.load(u_ptrs)
        acc_g = direct_scaled_dot(acc_g, a, g, a_s * tl.load(gs0 + k), SWAP_AB)
        acc_u = direct_scaled_dot(acc_u, a, u, a_s * tl.load(us0 + k), SWAP_AB)
        a_ptrs += G
        g_ptrs += G
        u_ptrs += G
    if SWAP_AB:
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)
    act = acc_g * tl.sigmoid(acc_g) * acc_u
    out_ptrs = act_ptr + (pair + rows * 0)[:, None].to(tl.int64) * stride_am + offs_n[None, :]
    tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=row_ok[:, None])


_LAUNCH = FastLauncher(_gate_up_fp8_direct_kernel)

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def gate_up_fp8_direct(x: torch.Tensor | QuantizedRows, w13: torch.Tensor,
                       w13_scale: torch.Tensor, topk_ids: torch.Tensor, cfg: GateUpConfig,
                       out_dtype: torch.dtype, *,
                       zero: torch.Tensor | None = None, swap_ab: bool = False) -> torch.Tensor:
    """``act[p] = silu(x[t] W_g[e]^T) * (x[t] W_u[e]^T)`` for every pair ``p = t*K + j``,
    ``e = topk_ids[t, j]``, with fp8 block-scaled dots; no alignment.

    Args:
        x: ``QuantizedRows`` (``[M, H]`` e4m3 + ``[M, H/128]`` fp32) or ``[M, H]``
            fp32/fp16/bf16 (quantized in registers, as ``moerun.quant.quantize_rows``).
        w13: ``[S, 2I, H]`` e4m3, last dim contiguous; ``w13_scale [S, 2I/128, H/128]`` fp32.
        topk_ids: ``[M, K]`` int32 contiguous (``-1`` / ``>= S``: excluded, row not written).
        cfg: the tile (``block_n`` dividing 128; ``block_k`` is always 128).
        out_dtype: the activation dtype of ``act``.
        zero: optional contiguous int32 buffer the launch also zeroes (the per-pair down's
            arrival counters).
        swap_ab: compute ``W x^T`` (``ExpertsConfig.swap_ab``): the tile's weight rows are
            the MMA's M side, so on sm90 a ``block_n`` of 64 or 128 runs e4m3 wgmmas.

    Returns: ``act [M*K, I]`` in ``out_dtype`` (unweighted; rows of excluded pairs not
    written). One launch; current stream; no host sync; capture-safe.
    """
    a_fp8 = isinstance(x, QuantizedRows)
    xd = x.data if a_fp8 else x
    xs = x.scale if a_fp8 else xd  # unread when not a_fp8
    m, h = xd.shape
    s = w13.shape[0]
    inter = w13.shape[1] // 2
    g = FP8_GROUP
    check_w13_fp8(xd, w13, w13_scale)
    if g % cfg.block_n or cfg.paired:
        raise ValueError(f"GateUpConfig block_n={cfg.block_n}, paired={cfg.paired}: the fp8 "
                         f"direct gate/up needs an unpaired tile of a block_n dividing {g}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != m or topk_ids.dtype != torch.int32 \
            or not topk_ids.is_contiguous():
        raise ValueError(f"topk_ids must be a contiguous int32 [{m}, K] tensor")
    if out_dtype not in _DTYPES:
        raise ValueError(f"out_dtype={out_dtype}: use fp32, fp16 or bf16")
    if zero is not None and (zero.dtype != torch.int32 or not zero.is_contiguous()):
        raise ValueError("zero must be a contiguous int32 tensor")
    pairs = topk_ids.numel()
    out = torch.empty(pairs, inter, dtype=out_dtype, device=xd.device)
    if pairs == 0:
        return out
    n_tiles = inter // cfg.block_n
    znum = 0 if zero is None else zero.numel()
    zblock = max(16, next_pow2(cdiv(znum, pairs * n_tiles))) if znum else 0
    _LAUNCH(
        (n_tiles, pairs),
        xd, xs, w13, w13_scale, out, topk_ids, xd if zero is None else zero, znum,
        inter, h, s,
        xd.stride(0), xs.stride(0), w13.stride(0), w13.stride(1), w13_scale.stride(0),
        w13_scale.stride(1), out.stride(0),
        # TOP_K, BLOCK_M, BLOCK_N, G, A_FP8, EPS, QMAX, ZBLOCK, SWAP_AB
        topk_ids.shape[1], DIRECT_BLOCK_M, cfg.block_n, g, a_fp8, AMAX_EPS, FP8_MAX, zblock,
        swap_ab,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def run_experts_fp8_direct(x: torch.Tensor | QuantizedRows, w13: torch.Tensor,
                           w2: torch.Tensor, w13_scale: torch.Tensor, w2_scale: torch.Tensor,
                           topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                           cfg: ExpertsConfig, out_dtype: torch.dtype) -> torch.Tensor:
    """``out[t] = sum_j w[t, j] * expert_{ids[t, j]}(x[t])`` with the fp8 direct kernels:
    ``cfg.kernel == "direct"``; ``combine`` ``"reduce"`` (per-token down) or ``"atomic"``
    (per-pair down with arrival counters zeroed by the gate/up launch). Arguments as
    ``fp8.run_experts_fp8``. Returns ``[M, H]`` in ``out_dtype``. 2 launches; no host sync."""
    from moerun.backends.triton.down import down_direct

    xd = x.data if isinstance(x, QuantizedRows) else x
    m, h = xd.shape
    cnt = None
    if cfg.combine == "atomic":  # the per-pair down: one arrival counter per (token, N tile)
        cnt = torch.empty(m * cdiv(h, cfg.down.block_n), dtype=torch.int32, device=xd.device)
    act = gate_up_fp8_direct(x, w13, w13_scale, topk_ids, cfg.gate_up, out_dtype, zero=cnt,
                             swap_ab=cfg.swap_ab)
    return down_direct(act, w2, topk_ids, cfg.down, counters=cnt, w2_scale=w2_scale,
                       topk_weights=topk_weights, swap_ab=cfg.swap_ab)
