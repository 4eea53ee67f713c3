"""Tile helpers of the two product forms (``ExpertsConfig.swap_ab``) of the direct decode
kernels and of the grouped ones at 16/32-row tiles:
``x W^T`` into a ``[BM, BN]`` accumulator, or ``W x^T`` into ``[BN, BM]`` so that the tile's
weight rows are the MMA's M side (wgmmas on sm90 for ``BN`` >= 64 at a 16-row token tile,
e4m3 ones for fp8). Used by ``gate_up.py``, ``down.py``, ``fp8_direct.py`` and ``fp8.py``.
``@triton.jit`` device functions only: inlined, registers and shared memory, no global
memory."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["direct_acc", "direct_dot", "direct_scaled_dot", "outer_scaled_dot"]


@triton.jit
def direct_acc(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    """The zero fp32 accumulator: ``[BN, BM]`` with ``SWAP_AB``, else ``[BM, BN]``."""
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    return acc


@triton.jit
def direct_dot(acc, a, b, PRECISION: tl.constexpr, SWAP_AB: tl.constexpr):
    """``acc + a @ b`` (``a [BM, BK]`` rows, ``b [BK, BN]`` weights), or with ``SWAP_AB``
    ``acc + b^T @ a^T`` into the ``[BN, BM]`` accumulator."""
    if SWAP_AB:
        acc = tl.dot(tl.trans(b), tl.trans(a), acc, input_precision=PRECISION)
    else:
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def direct_scaled_dot(acc, aq, b, row_scale, SWAP_AB: tl.constexpr):
    """An fp8 K step: ``acc + (aq @ b) * row_scale[:, None]`` (``aq`` e4m3 ``[BM, BK]``,
    ``b`` e4m3 ``[BK, BN]``, ``row_scale [BM]``: the row's activation scale times the tile's
    one weight scale), or its transpose into the ``[BN, BM]`` accumulator with ``SWAP_AB``."""
    if SWAP_AB:
        acc += tl.dot(tl.trans(b), tl.trans(aq)) * row_scale[None, :]
    else:
        acc += tl.dot(aq, b) * row_scale[:, None]
    return acc


@triton.jit
def outer_scaled_dot(acc, aq, b, row_scale, col_scale, SWAP_AB: tl.constexpr):
    """An fp8 K step of a tile wider than one weight block: ``acc + (aq @ b) *
    (row_scale[:, None] * col_scale[None, :])`` (``col_scale [BN]``: each column's weight
    block scale), or its transpose into the ``[BN, BM]`` accumulator with ``SWAP_AB``."""
    if SWAP_AB:
        acc += tl.dot(tl.trans(b), tl.trans(aq)) * (col_scale[:, None] * row_scale[None, :])
    else:
        acc += tl.dot(aq, b) * (row_scale[:, None] * col_scale[None, :])
    return acc
