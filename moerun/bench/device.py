"""The ``--device`` flag of ``moerun bench`` (both its matrices: bf16 and ``--dtype fp8``) and
the device words of every bench header."""

from __future__ import annotations

import os

import torch

__all__ = ["device_of", "device_text"]


def device_of(flag: str) -> str:
    """``"auto"`` -> ``"cuda"`` when available, else ``"cpu"``; ``"cuda"`` without a GPU is a
    ValueError naming the flag; ``"cpu"`` as is. No device work."""
    if flag == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if flag == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return flag


def device_text(device: torch.device) -> str:
    """The run header's device words: GPU name and sm, torch, triton and whether PDL is on
    (``moerun._triton.pdl``); a CPU's cores and threads. Host only."""
    from moerun.env import get_env

    env = get_env()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        cap = torch.cuda.get_device_capability(device)
        text = f"{name} (sm{cap[0]}{cap[1]}), torch {torch.__version__}"
        if env.triton_version is not None:  # programmatic dependent launch, moerun._triton.pdl
            from moerun._triton.pdl import pdl_enabled

            on = pdl_enabled(device.index if device.index is not None
                             else torch.cuda.current_device())
            return f"{text}, triton {env.triton_version}, PDL {'on' if on else 'off'}"
    else:
        text = f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} threads), " \
               f"torch {torch.__version__}"
    return f"{text}, triton {env.triton_version or 'missing'}"
