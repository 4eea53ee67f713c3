"""Operand checks shared by the fp8 kernels' launchers (``fp8.py``, ``fp8_direct.py`` and the
fp8 mode of ``down.down_direct``): shapes, dtypes, block-scale layouts and the 128-column
groups. Host only; each raises ValueError naming the argument. Its own module so that every
launcher imports it without importing another launcher (no import cycle)."""

from __future__ import annotations

import torch

from moerun.backends.triton.configs import FP8_GROUP as GROUP
from moerun.quant import FP8_DTYPE

__all__ = ["check_groups_fp8", "check_w13_fp8", "check_w2_fp8"]


def check_groups_fp8(name: str, size: int) -> None:
    """``size`` (the argument ``name``) is a multiple of the 128-column group. Pure; host only."""
    if size % GROUP:
        raise ValueError(f"{name}={size} must be a multiple of {GROUP} for the fp8 kernels")


def check_w13_fp8(xd: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor) -> None:
    """The gate/up operands of every fp8 kernel (grouped, paired, direct): ``xd [M, H]``
    rows (e4m3 or float, contiguous last dim), e4m3 ``w13 [S, 2I, H]`` and fp32
    ``w13_scale [S, 2I/128, H/128]``, H and I multiples of 128. Raises ValueError naming the
    argument; host only."""
    h = xd.shape[1]
    s, two_i, h2 = w13.shape
    if h2 != h or w13.dtype != FP8_DTYPE or w13.stride(2) != 1:
        raise ValueError(f"w13 {tuple(w13.shape)} {w13.dtype} must be [S, 2I, {h}] "
                         f"{FP8_DTYPE} with a contiguous last dimension")
    check_groups_fp8("H", h)
    check_groups_fp8("I", two_i // 2)
    if tuple(w13_scale.shape) != (s, two_i // GROUP, h // GROUP) or \
            w13_scale.dtype != torch.float32:
        raise ValueError(f"w13_scale {list(w13_scale.shape)} {w13_scale.dtype} must be "
                         f"[{s}, {two_i // GROUP}, {h // GROUP}] float32")
    if xd.stride(1) != 1 or w13_scale.stride(2) != 1:
        raise ValueError("x and w13_scale need a contiguous last dimension")


def check_w2_fp8(ad: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor) -> None:
    """The down operands of every fp8 kernel (grouped, direct): ``ad [R, I]`` (contiguous
    last dim), e4m3 ``w2 [S, H, I]`` and fp32 ``w2_scale [S, H/128, I/128]``, H and I
    multiples of 128. Raises ValueError naming the argument; host only."""
    inter = ad.shape[1]
    s, h, i2 = w2.shape
    if i2 != inter or w2.dtype != FP8_DTYPE or w2.stride(2) != 1 or ad.stride(1) != 1:
        raise ValueError(f"w2 {tuple(w2.shape)} {w2.dtype} must be [S, H, {inter}] "
                         f"{FP8_DTYPE}; act and w2 need a contiguous last dimension")
    check_groups_fp8("H", h)
    check_groups_fp8("I", inter)
    if tuple(w2_scale.shape) != (s, h // GROUP, inter // GROUP) or \
            w2_scale.dtype != torch.float32 or w2_scale.stride(2) != 1:
        raise ValueError(f"w2_scale {list(w2_scale.shape)} {w2_scale.dtype} must be "
                         f"[{s}, {h // GROUP}, {inter // GROUP}] float32, contiguous last dim")
