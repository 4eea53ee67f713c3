"""NVTX emission backends of :mod:`traces.nvtx` and the attached-tool check (private).

A backend has ``start(name) -> handle``, ``end(handle)``, ``mark(name)`` and ``enabled``
(False: the tracer skips the calls). Which one a process uses is decided once, in
:mod:`traces.nvtx`; see its module docstring for the order and the attached-tool rule.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["NVTX_DOMAIN", "NullBackend", "NvtxPackageBackend", "TorchCudaNvtxBackend",
           "nvtx_tool_attached", "NVTX_PACKAGE_API"]

# NVTX domain of every moerun range when the ``nvtx`` package is the backend.
NVTX_DOMAIN = "moerun"
NVTX_PACKAGE_API = ("start_range", "end_range", "mark")

# ----------------------------------------------------------------------------------------------
# Backends: start(name) -> handle, end(handle), mark(name). ``enabled`` False skips the calls.


class NullBackend:
    """No NVTX emission (CPU without the ``nvtx`` package)."""

    __slots__ = ()
    name = "none"
    enabled = False

    def start(self, name: str) -> None:
        return None

    def end(self, handle: Any) -> None:
        pass

    def mark(self, name: str) -> None:
        pass


class NvtxPackageBackend:
    """The ``nvtx`` PyPI package: ``start_range``/``end_range``/``mark`` in domain "moerun".

    With no tool attached the package's domain is a dummy and these calls return at once
    (``start_range`` returns None, which ``end_range`` ignores).
    """

    __slots__ = ("_module",)
    name = "nvtx"
    enabled = True

    def __init__(self, module: Any) -> None:
        self._module = module

    def start(self, name: str) -> Any:
        return self._module.start_range(message=name, domain=NVTX_DOMAIN)

    def end(self, handle: Any) -> None:
        self._module.end_range(handle)

    def mark(self, name: str) -> None:
        self._module.mark(message=name, domain=NVTX_DOMAIN)


class TorchCudaNvtxBackend:
    """``torch.cuda.nvtx.range_start``/``range_end``/``mark`` (default NVTX domain)."""

    __slots__ = ()
    name = "torch.cuda.nvtx"
    enabled = True

    def start(self, name: str) -> int:
        return torch.cuda.nvtx.range_start(name)

    def end(self, handle: int) -> None:
        torch.cuda.nvtx.range_end(handle)

    def mark(self, name: str) -> None:
        torch.cuda.nvtx.mark(name)


_TOOL_VARS = ("NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH", "NSYS_PROFILING_SESSION_ID")


def nvtx_tool_attached() -> bool:
    """An NVTX tool will receive ranges: ``MOERUN_NVTX`` (``1``/``0``) decides if set, else
    one of NVTX's injection variables or Nsight Systems' session variable is set. Pure read
    of the environment; no side effects."""
    forced = os.environ.get("MOERUN_NVTX")
    if forced is not None and forced.strip() != "":
        return forced.strip() not in ("0", "false", "False", "off")
    return any(os.environ.get(v) for v in _TOOL_VARS)
