"""Per-device properties the Triton launchers size and route by, cached per CUDA device index
(a properties query costs about 12 µs of host time; the values never change in a process).
Host only; imports no Triton."""

from __future__ import annotations

import functools

import torch

__all__ = ["sm_count", "capability_major"]


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def sm_count(device: torch.device) -> int:
    """SMs of the CUDA ``device`` (a persistent grid's size, the aligning grid's bound).
    Host only: a cached properties query; no device work, no sync."""
    return _sm_count(_index(device))


def capability_major(device: torch.device) -> int:
    """Compute capability major of the CUDA ``device``. Host only: a cached properties query;
    no device work, no sync."""
    return _capability_major(_index(device))


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def _capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]
