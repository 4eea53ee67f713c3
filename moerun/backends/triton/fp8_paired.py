"""The paired fp8 gate/up tile (``GateUpConfig.paired``; DESIGN 11a, issue 12).

The gate/up GEMM of ``fp8.gate_up_fp8`` as ONE dot per 128-deep K step over ``BLOCK_N``
weight rows gathered interleaved: column ``2j`` is gate row ``j``, column ``2j + 1`` up row
``j`` of the tile's ``BLOCK_N / 2`` intermediate columns (the weights stay in their ``[S, 2I,
H]`` layout; the loads gather the rows, and each column's fp32 weight scale likewise). One
accumulator instead of two, so 128-row tiles fit the register rule
(``configs.fp8_tile_fits`` with one accumulator). The epilogue reshapes the accumulator to
``[BM, BLOCK_N / 2, 2]``, splits gate from up, and writes ``silu(gate) * up`` in the
activation dtype; at prefill sizes ``fp8.run_experts_fp8`` then quantizes it in one launch
for the down GEMM. Same scaled K step as ``fp8.py``; legend as there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moerun._triton.compat import patch_interpreter
from moerun._triton.launch import FastLauncher
from moerun._triton.gdc import pdl_prologue
from moerun.backends.triton.align import Alignment
from moerun.backends.triton.configs import FP8_GROUP, GateUpConfig
from moerun.backends.triton.fp8_tiles import block_rows, load_act_tile
from moerun.backends.triton.gate_up import grouped_pid
from moerun.quant import AMAX_EPS, FP8_MAX

patch_interpreter()

__all__ = ["gate_up_paired"]

GROUP = FP8_GROUP


@triton.jit(do_not_specialize=["num_pairs", "max_blocks"])
def _gate_up_paired_kernel(
    x_ptr,  # [M, H] e4m3 (A_FP8) or the activation dtype
    xs_ptr,  # [M, H/G] fp32 (read iff A_FP8)
    w_ptr,  # [S, 2I, H] e4m3
    ws_ptr,  # [S, 2I/G, H/G] fp32
    act_ptr,  # [R, I] out, the activation dtype
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    num_pairs, inter, hidden, max_blocks,
    stride_xm, stride_xsm, stride_we, stride_wn, stride_wse, stride_wsn, stride_am,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr,
    GROUP_M: tl.constexpr, A_FP8: tl.constexpr, EPS: tl.constexpr, QMAX: tl.constexpr,
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    # one dot over BLOCK_N interleaved weight rows: column 2j is gate row j, 2j + 1 up row j
    HALF: tl.constexpr = BLOCK_N // 2
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_pid(pid, max_blocks, inter // HALF, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_post_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_m, pair, row_ok, tok = block_rows(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M, TOP_K)
    offs_c = tl.arange(0, BLOCK_N)
    wrow = pid_n * HALF + offs_c // 2 + (offs_c % 2) * inter
    offs_k = tl.arange(0, G)

    a_ptrs = x_ptr + tok[:, None] * stride_xm + offs_k[None, :]
    as_ptrs = xs_ptr + tok * stride_xsm
    b_ptrs = w_ptr + expert * stride_we + wrow[None, :].to(tl.int64) * stride_wn \
        + offs_k[:, None]
    bs_ptrs = ws_ptr + expert * stride_wse + (wrow // G) * stride_wsn

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, hidden // G):
        a, a_s = load_act_tile(a_ptrs, as_ptrs, k, row_ok, A_FP8, EPS, QMAX)
        b = tl.load(b_ptrs)
        b_s = tl.load(bs_ptrs + k)
        acc += tl.dot(a, b) * (a_s[:, None] * b_s[None, :])
        a_ptrs += G
        b_ptrs += G

    gate, up = tl.split(tl.reshape(acc, (BLOCK_M, HALF, 2)))
    act = gate * tl.sigmoid(gate) * up
    offs_o = pid_n * HALF + tl.arange(0, HALF)
    out_ptrs = act_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_o[None, :]
    tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty))


_GATE_UP_PAIRED = FastLauncher(_gate_up_paired_kernel)


def gate_up_paired(xd: torch.Tensor, xs: torch.Tensor, a_fp8: bool, w13: torch.Tensor,
                   w13_scale: torch.Tensor, align: Alignment, top_k: int, cfg: GateUpConfig,
                   out_dtype: torch.dtype) -> torch.Tensor:
    """``act [max_blocks*BM, I]`` in ``out_dtype`` with the paired tile ``cfg``.

    Called by :func:`moerun.backends.triton.fp8.gate_up_fp8` (which checks the shapes, dtypes
    and strides of ``xd [M, H]``, its scales ``xs [M, H/128]`` (read iff ``a_fp8``), ``w13
    [S, 2I, H]`` e4m3 and ``w13_scale [S, 2I/128, H/128]``); this checks the tile. Rows in
    aligned order, rows of blocks past ``num_post`` unwritten. One launch; current stream; no
    host sync.
    """
    rows = align.max_blocks * align.block_m
    h = xd.shape[1]
    inter = w13.shape[1] // 2
    half = cfg.block_n // 2
    if cfg.block_n < 32 or inter % half:
        raise ValueError(f"paired gate/up tile block_n={cfg.block_n}: needs >= 32 and I={inter} "
                         f"a multiple of block_n / 2")
    out = torch.empty(rows, inter, dtype=out_dtype, device=xd.device)
    _GATE_UP_PAIRED(
        (align.max_blocks * (inter // half),),
        xd, xs, w13, w13_scale, out, align.sorted_ids, align.expert_ids, align.num_post,
        align.num_pairs, inter, h, align.max_blocks,
        xd.stride(0), xs.stride(0), w13.stride(0), w13.stride(1), w13_scale.stride(0),
        w13_scale.stride(1), out.stride(0),
        # TOP_K, BLOCK_M, BLOCK_N, G, GROUP_M, A_FP8, EPS, QMAX
        top_k, align.block_m, cfg.block_n, GROUP, cfg.group_m, a_fp8, AMAX_EPS, FP8_MAX,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
