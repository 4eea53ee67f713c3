"""The grouped down GEMM's epilogue, shared by the bf16/fp16/fp32 kernel (``down.py``) and the
fp8 one (``fp8.py``). ``@triton.jit`` device functions only."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["store_down_rows"]


@triton.jit
def store_down_rows(acc, out_ptr, topk_weights_ptr, sorted_ids_ptr, offs_m, offs_n,
                    num_pairs, hidden, stride_om, TOP_K: tl.constexpr, ATOMIC: tl.constexpr):
    """The epilogue of an aligned block's down tile ``acc [BM, BN]`` (fp32; rows
    ``offs_m``, columns ``offs_n``): row ``r`` times its pair's routing weight, then either
    added (fp32, relaxed atomics) into row ``pair(r) // TOP_K`` of the ``[M, H]``
    accumulator (``ATOMIC``) or stored as row ``pair(r)`` of ``y [M*K, H]`` in out's dtype.
    Padding rows and columns past ``hidden`` are left alone.

    Device code (inlined into its caller's kernel); side effect: writes ``out_ptr`` (relaxed
    atomics with ``ATOMIC``)."""
    pair = tl.load(sorted_ids_ptr + offs_m)
    row_ok = pair < num_pairs
    w = tl.load(topk_weights_ptr + pair, mask=row_ok, other=0.0)
    acc = acc * w[:, None]
    mask = row_ok[:, None] & (offs_n < hidden)[None, :]
    if ATOMIC:
        tok = (pair // TOP_K).to(tl.int64)
        tl.atomic_add(out_ptr + tok[:, None] * stride_om + offs_n[None, :], acc, mask=mask,
                      sem="relaxed")
    else:
        dst = out_ptr + pair[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=mask)
