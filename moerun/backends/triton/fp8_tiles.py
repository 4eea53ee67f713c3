"""Tile helpers shared by the fp8 kernels (``fp8.py``, ``fp8_paired.py``): the in-register
form of ``moerun.quant.quantize_rows`` for one 128-column group, and the rounding of fp32
values to the layer's activation dtype. ``@triton.jit`` device functions only."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["quantize_tile", "round_to"]


@triton.jit
def quantize_tile(xf, EPS: tl.constexpr, QMAX: tl.constexpr):
    """fp32 ``[BM, G]`` -> (e4m3 codes, fp32 scale ``[BM]``) as ``moerun.quant`` defines."""
    amax = tl.max(tl.abs(xf), axis=1)
    scale = tl.maximum(amax, EPS) / QMAX
    q = tl.minimum(tl.maximum(xf / scale[:, None], -QMAX), QMAX)
    return q.to(tl.float8e4nv), scale


@triton.jit
def round_to(v, MID: tl.constexpr):
    """fp32 rounded to the activation dtype (``MID``: 0 fp32, 1 fp16, 2 bf16), kept fp32."""
    if MID == 1:
        v = v.to(tl.float16).to(tl.float32)
    elif MID == 2:
        v = v.to(tl.bfloat16).to(tl.float32)
    return v
