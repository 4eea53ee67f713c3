"""Tile helpers shared by the fp8 kernels (``fp8.py``, ``fp8_paired.py``): the in-register
form of ``moerun.quant.quantize_rows`` for one 128-column group, the rounding of fp32
values to the layer's activation dtype, a block's gathered rows and the gate/up kernels'
activation tile of one K step. ``@triton.jit`` device functions only."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["quantize_tile", "round_to", "block_rows", "load_act_tile"]


@triton.jit
def quantize_tile(xf, EPS: tl.constexpr, QMAX: tl.constexpr):
    """fp32 ``[BM, G]`` -> (e4m3 codes, fp32 scale ``[BM]``) as ``moerun.quant`` defines.
    Device code (inlined into the calling kernel), registers only."""
    amax = tl.max(tl.abs(xf), axis=1)
    scale = tl.maximum(amax, EPS) * (1.0 / QMAX)  # the fp32 reciprocal, as moerun.quant
    q = tl.minimum(tl.maximum(xf / scale[:, None], -QMAX), QMAX)
    return q.to(tl.float8e4nv), scale


@triton.jit
def round_to(v, MID: tl.constexpr):
    """fp32 rounded to the activation dtype (``MID``: 0 fp32, 1 fp16, 2 bf16), kept fp32.
    Device code (inlined into the calling kernel), registers only."""
    if MID == 1:
        v = v.to(tl.float16).to(tl.float32)
    elif MID == 2:
        v = v.to(tl.bfloat16).to(tl.float32)
    return v


@triton.jit
def block_rows(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M: tl.constexpr, TOP_K: tl.constexpr):
    """Aligned block ``pid_m``'s rows: ``(offs_m, pair, row_ok, tok)`` -- the aligned row
    indices, their (token, k) pair ids, which are real pairs (the rest pad the expert's last
    block), and each row's token (int64). Device code (inlined into the calling kernel):
    one global load."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m)
    row_ok = pair < num_pairs
    tok = (pair // TOP_K).to(tl.int64)
    return offs_m, pair, row_ok, tok


@triton.jit
def load_act_tile(a_ptrs, as_ptrs, k, row_ok, A_FP8: tl.constexpr, EPS: tl.constexpr,
                  QMAX: tl.constexpr):
    """K step ``k``'s activation tile ``(e4m3 [BM, G], fp32 scale [BM])`` of the gathered rows
    at ``a_ptrs``: loaded with its scales (``A_FP8``: rows quantized already, scales at
    ``as_ptrs + k``) or quantized in registers (one tile is one group); padding rows are 0.
    Device code (inlined into the calling kernel): global loads only."""
    if A_FP8:
        a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
        a_s = tl.load(as_ptrs + k, mask=row_ok, other=0.0)
    else:
        xf = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)
        a, a_s = quantize_tile(xf, EPS, QMAX)
    return a, a_s
