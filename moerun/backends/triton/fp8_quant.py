"""The activation quantization kernel of the fp8 path (DESIGN 11a): per row and 128-column
group to e4m3, :func:`moerun.quant.quantize_rows` as its torch twin. Its own module so that
both kernel families (``fp8.py``, ``fp8_ws.py``) use it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from moerun._triton.compat import patch_interpreter
from moerun._triton.gdc import pdl_prologue
from moerun._triton.launch import FastLauncher, cdiv
from moerun.backends.triton.align import Alignment
from moerun.backends.triton.configs import FP8_GROUP
from moerun.backends.triton.fp8_checks import check_groups_fp8
from moerun.backends.triton.fp8_tiles import quantize_tile
from moerun.quant import AMAX_EPS, FP8_DTYPE, FP8_MAX, QuantizedRows

patch_interpreter()

__all__ = ["GatheredRows", "quantize_rows_fp8", "gather_rows_fp8"]

GROUP = FP8_GROUP


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, rows, stride_xm, stride_qm, stride_sm,
                          BLOCK_R: tl.constexpr, G: tl.constexpr, EPS: tl.constexpr,
                          QMAX: tl.constexpr,
                          PDL: tl.constexpr):  # supplied by FastLauncher (moerun._triton.pdl)
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    pid_r = tl.program_id(0)
    grp = tl.program_id(1)
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = grp * G + tl.arange(0, G)
    ok = offs_r < rows
    r64 = offs_r.to(tl.int64)
    xf = tl.load(x_ptr + r64[:, None] * stride_xm + offs_c[None, :], mask=ok[:, None],
                 other=0.0).to(tl.float32)
    q, scale = quantize_tile(xf, EPS, QMAX)
    tl.store(q_ptr + r64[:, None] * stride_qm + offs_c[None, :], q, mask=ok[:, None])
    tl.store(s_ptr + r64 * stride_sm + grp, scale, mask=ok)


_QUANT = FastLauncher(_quantize_rows_kernel)


def quantize_rows_fp8(x: torch.Tensor) -> QuantizedRows:
    """``x [M, H]`` (fp32/fp16/bf16, last dim contiguous, ``H % 128 == 0``) -> e4m3 rows and
    fp32 ``[M, H/128]`` scales, as :func:`moerun.quant.quantize_rows`. One launch; current
    stream; no host sync."""
    m, h = x.shape
    check_groups_fp8("x.shape[1]", h)
    if x.stride(1) != 1:
        raise ValueError("x needs a contiguous last dimension")
    q = torch.empty(m, h, dtype=FP8_DTYPE, device=x.device)
    s = torch.empty(m, h // GROUP, dtype=torch.float32, device=x.device)
    if m:
        block_r = 16
        _QUANT((cdiv(m, block_r), h // GROUP), x, q, s, m, x.stride(0), q.stride(0),
               s.stride(0), block_r, GROUP, AMAX_EPS, FP8_MAX, num_warps=4, num_stages=2)
    return QuantizedRows(data=q, scale=s, group=GROUP)



@dataclass(frozen=True, kw_only=True, slots=True)
class GatheredRows:
    """What :func:`gather_rows_fp8` returns.

    Fields:
        rows: ``[R, H]`` codes / ``[R, H/128]`` scales in aligned order: row ``r`` is token
            ``sorted_ids[r] // top_k``'s row, for the ``num_post[0]`` rows in use (padding
            rows are zero codes with scale 0; rows past ``num_post`` are unwritten).
        pair_rows: ``[M*top_k]`` int32, the inverse map: ``sorted_ids[pair_rows[p]] == p``
            for every pair the alignment placed (excluded pairs' entries are unwritten).
    """

    rows: QuantizedRows
    pair_rows: torch.Tensor


def gather_rows_fp8(q: QuantizedRows, align: Alignment, top_k: int) -> GatheredRows:
    """Quantized rows in aligned order, and each pair's aligned row: ``persistent.gather_rows``
    of the codes (writing the inverse map) and of the scales.

    ``q [M, H]`` with ``[M, H/128]`` scales, ``align`` of ``moe_align``; see
    :class:`GatheredRows` for the result. Two launches; current stream; no host sync;
    capturable. Twin: a loop over the alignment (tests)."""
    from moerun.backends.triton.persistent import gather_rows

    rows = torch.empty(align.num_pairs, dtype=torch.int32, device=q.data.device)
    data = gather_rows(q.data.view(torch.uint8), align, top_k, pair_rows=rows)
    scale = gather_rows(q.scale, align, top_k)
    return GatheredRows(rows=QuantizedRows(data=data.view(FP8_DTYPE), scale=scale,
                                           group=q.group), pair_rows=rows)
