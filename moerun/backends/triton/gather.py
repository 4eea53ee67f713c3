"""``gather_rows``: the rows of ``x`` copied into aligned (expert-block) order, so the
persistent kernels' A operand goes through TMA too (``GateUpConfig.a_tma``), and each placed
pair's aligned row (the fp8 ws path's inverse map, ``fp8_quant.gather_rows_fp8``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moerun._triton.compat import patch_interpreter
from moerun._triton.gdc import pdl_prologue
from moerun._triton.launch import FastLauncher, cdiv, next_pow2
from moerun.backends.triton.align import Alignment

patch_interpreter()

__all__ = ["gather_rows"]

GATHER_BLOCK_M = 16
GATHER_BLOCK_H = 512


@triton.jit(do_not_specialize=["num_pairs", "max_rows"])
def _gather_rows_kernel(
    x_ptr,  # [M, H]
    xs_ptr,  # [R, H] out: row r = x[sorted_ids[r] // K], zeros for padding rows
    sorted_ids_ptr, num_post_ptr,
    rows_ptr,  # [M*K] int32 out (MAP only): each placed pair's row r
    num_pairs, hidden, max_rows,
    stride_xm, stride_sm,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, MAP: tl.constexpr,
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    if tl.program_id(0) * BLOCK_M >= tl.load(num_post_ptr):
        return
    pair = tl.load(sorted_ids_ptr + offs_m, mask=offs_m < max_rows, other=num_pairs)
    row_ok = pair < num_pairs
    if MAP:
        tl.store(rows_ptr + pair, offs_m, mask=row_ok)
    tok = (pair // TOP_K).to(tl.int64)
    for h0 in range(0, hidden, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        h_ok = offs_h < hidden
        v = tl.load(x_ptr + tok[:, None] * stride_xm + offs_h[None, :],
                    mask=row_ok[:, None] & h_ok[None, :], other=0.0)
        tl.store(xs_ptr + offs_m[:, None].to(tl.int64) * stride_sm + offs_h[None, :], v,
                 mask=(offs_m < max_rows)[:, None] & h_ok[None, :])


_LAUNCH_GATHER = FastLauncher(_gather_rows_kernel)


def gather_rows(x: torch.Tensor, align: Alignment, top_k: int,
                out: torch.Tensor | None = None,
                pair_rows: torch.Tensor | None = None) -> torch.Tensor:
    """``xs[r] = x[sorted_ids[r] // K]`` for the used rows, zeros for padding rows.

    Args:
        x: ``[M, H]``, last dim contiguous. align: the alignment (``M*K`` pairs). top_k: K.
        out: optional ``[R, H]`` x.dtype buffer (a row stride of 16 bytes' multiple).
        pair_rows: optional ``[M*K]`` int32 contiguous buffer that receives the inverse map,
            ``sorted_ids[pair_rows[p]] == p`` for every placed pair (excluded pairs' entries
            are left as they were).

    Returns: ``xs [R, H]`` x.dtype; rows of blocks past ``num_post`` are not written. One
    launch (a program per 16 rows, those past ``num_post`` exit at once); no host sync.
    """
    h = x.shape[1]
    rows = align.max_blocks * align.block_m
    if out is None:
        out = torch.empty(rows, h, dtype=x.dtype, device=x.device)
    elif out.shape != (rows, h) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{rows}, {h}] {x.dtype}")
    if pair_rows is not None and (pair_rows.dtype != torch.int32 or not pair_rows.is_contiguous()
                                  or pair_rows.numel() != align.num_pairs):
        raise ValueError(f"pair_rows must be a contiguous int32 tensor of {align.num_pairs} "
                         "entries")
    _LAUNCH_GATHER(
        (cdiv(rows, GATHER_BLOCK_M),),
        x, out, align.sorted_ids, align.num_post,
        align.sorted_ids if pair_rows is None else pair_rows, align.num_pairs, h, rows,
        x.stride(0), out.stride(0),
        top_k, GATHER_BLOCK_M, min(GATHER_BLOCK_H, max(16, next_pow2(h))), pair_rows is not None,
        num_warps=4,
    )
    return out
