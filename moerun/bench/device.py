"""The ``--device`` flag of ``moerun bench`` (both its matrices: bf16 and ``--dtype fp8``)."""

from __future__ import annotations

import torch

__all__ = ["device_of"]


def device_of(flag: str) -> str:
    """``"auto"`` -> ``"cuda"`` when available, else ``"cpu"``; ``"cuda"`` without a GPU is a
    ValueError naming the flag; ``"cpu"`` as is. No device work."""
    if flag == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if flag == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return flag
