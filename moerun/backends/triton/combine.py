"""Top-k reduction for the ``"reduce"`` combine: ``out[t] = sum_j y[t*K + j]`` over local j.

Legend: ``M`` tokens, ``K`` top-k, ``H`` hidden. ``y [M*K, H]`` holds the weighted per-pair
rows written by the down GEMM; rows of excluded pairs (``-1`` or ``>= S``) were never written,
so they are skipped by id, not by value. Tokens with no local pair get exact zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moerun._triton.compat import patch_interpreter
from moerun._triton.launch import FastLauncher, cdiv, next_pow2
from moerun._triton.gdc import pdl_prologue

patch_interpreter()

__all__ = ["moe_sum", "moe_sum_torch"]

# ---------------------------------------------------------------- constants / config
SUM_BLOCK_T = 4
SUM_BLOCK_H = 1024
SUM_WARPS = 4


# ---------------------------------------------------------------- kernel
@triton.jit(do_not_specialize=["num_tokens", "num_slots"])
def _moe_sum_kernel(
    y_ptr,  # [M*K, H] (or [R, H] with ROWS)
    ids_ptr,  # [M*K] int32
    rows_ptr,  # [M*K] int32: pair -> row of y (ROWS only)
    out_ptr,  # [M, H]
    num_tokens, hidden, num_slots,
    stride_y, stride_o,
    TOP_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr,
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    t_ok = offs_t < num_tokens
    h_ok = offs_h < hidden
    acc = tl.zeros([BLOCK_T, BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        pair = offs_t * TOP_K + j
        e = tl.load(ids_ptr + pair, mask=t_ok, other=-1)
        ok = (e >= 0) & (e < num_slots)
        row = pair
        if ROWS:
            row = tl.load(rows_ptr + pair, mask=ok, other=0)
        v = tl.load(y_ptr + row[:, None].to(tl.int64) * stride_y + offs_h[None, :],
                    mask=ok[:, None] & h_ok[None, :], other=0.0)
        acc += v.to(tl.float32)
    dst = out_ptr + offs_t[:, None].to(tl.int64) * stride_o + offs_h[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=t_ok[:, None] & h_ok[None, :])


_LAUNCH = FastLauncher(_moe_sum_kernel)


# ---------------------------------------------------------------- launcher
def moe_sum(y: torch.Tensor, topk_ids: torch.Tensor, num_slots: int,
            out: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Sum the K per-pair rows of each token (fp32 accumulation in j order, one launch, no
    sync).

    Args:
        y: ``[M*K, H]`` per-pair rows, last dim contiguous; with ``rows``, ``[R, H]``.
        topk_ids: ``[M, K]`` int32 contiguous; pairs with ids outside ``[0, S)`` are skipped.
        num_slots: ``S``.
        out: optional ``[M, H]`` y.dtype buffer.
        rows: optional ``[M*K]`` int32 contiguous: pair ``p``'s row is ``y[rows[p]]`` (read
            for the pairs not skipped only), e.g. rows in aligned order.

    Returns: ``[M, H]`` y.dtype.

    Side effects: one launch on the current stream; no host sync; capturable.
    """
    m, k = topk_ids.shape
    p, h = y.shape
    if (rows is None and p != m * k) or y.stride(1) != 1:
        raise ValueError(f"y {tuple(y.shape)} must be [{m * k}, H] with a contiguous last dim")
    if rows is not None and (rows.dtype != torch.int32 or not rows.is_contiguous()
                             or rows.numel() != m * k):
        raise ValueError(f"rows must be a contiguous int32 tensor of {m * k} pair rows")
    if topk_ids.dtype != torch.int32 or not topk_ids.is_contiguous():
        raise ValueError("topk_ids must be a contiguous int32 tensor")
    if out is None:
        out = torch.empty(m, h, dtype=y.dtype, device=y.device)
    block_h = min(SUM_BLOCK_H, next_pow2(h))
    grid = (cdiv(m, SUM_BLOCK_T), cdiv(h, block_h))
    _LAUNCH(grid, y, topk_ids, topk_ids if rows is None else rows, out, m, h, num_slots,
            y.stride(0), out.stride(0),
            k, SUM_BLOCK_T, block_h, rows is not None,  # TOP_K, BLOCK_T, BLOCK_H, ROWS
            num_warps=SUM_WARPS)
    return out


# ---------------------------------------------------------------- torch twin
def moe_sum_torch(y: torch.Tensor, topk_ids: torch.Tensor, num_slots: int) -> torch.Tensor:
    """Pure-torch twin of :func:`moe_sum` (no sync)."""
    m, k = topk_ids.shape
    ok = (topk_ids >= 0) & (topk_ids < num_slots)
    yv = y.view(m, k, -1).float()
    return torch.where(ok[:, :, None], yv, torch.zeros_like(yv)).sum(1).to(y.dtype)
