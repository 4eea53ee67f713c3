"""The environment, probed once and frozen (DESIGN 6).

``can_implement`` functions read this object instead of probing the machine themselves, so
selection is a pure function of (problem, deployment, env).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass

import torch

__all__ = ["Env", "get_env", "probe_env"]


def _version(pkg: str) -> str | None:
    if importlib.util.find_spec(pkg) is None:
        return None
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True, kw_only=True)
class Env:
    """What the machine offers.

    Fields:
        torch_version: ``torch.__version__``.
        cuda_available: ``torch.cuda.is_available()``.
        device_capability: ``(major, minor)`` of GPU 0, or None without CUDA.
        device_name: name of GPU 0 or ``"cpu"``.
        num_gpus: visible CUDA devices.
        triton_version / nvtx_version / deep_ep_version / transformers_version: installed
            versions, None when the package is not importable.
        triton_interpret: ``TRITON_INTERPRET=1`` was set when probed (Triton runs on CPU).
        has_grouped_mm: ``torch._grouped_mm`` exists.
        has_green_context: ``torch.cuda.GreenContext`` exists and CUDA is available (SM
            partitions for the shared expert's side work, DESIGN 4.3).
    """

    torch_version: str
    cuda_available: bool
    device_capability: tuple[int, int] | None
    device_name: str
    num_gpus: int
    triton_version: str | None
    nvtx_version: str | None
    deep_ep_version: str | None
    transformers_version: str | None
    triton_interpret: bool
    has_grouped_mm: bool
    has_green_context: bool = False

    def describe(self) -> str:
        """One line: torch, the device and its compute capability, triton, nvtx and deep_ep.

        Pure; host only."""
        return (
            f"torch {self.torch_version}, device {self.device_name}"
            f"{'' if self.device_capability is None else f' sm{self.device_capability[0]}{self.device_capability[1]}'}"
            f", triton {self.triton_version or 'missing'}"
            f"{' (interpreter)' if self.triton_interpret else ''}"
            f", nvtx {self.nvtx_version or 'missing'}, deep_ep {self.deep_ep_version or 'missing'}"
        )


def probe_env() -> Env:
    """Probe the machine now (no caching). Side effects: none beyond import-spec lookups."""
    cuda = torch.cuda.is_available()
    return Env(
        torch_version=torch.__version__,
        cuda_available=cuda,
        device_capability=torch.cuda.get_device_capability(0) if cuda else None,
        device_name=torch.cuda.get_device_name(0) if cuda else "cpu",
        num_gpus=torch.cuda.device_count() if cuda else 0,
        triton_version=_version("triton"),
        nvtx_version=_version("nvtx"),
        deep_ep_version=_version("deep_ep"),
        transformers_version=_version("transformers"),
        triton_interpret=os.environ.get("TRITON_INTERPRET", "0") == "1",
        has_grouped_mm=hasattr(torch, "_grouped_mm"),
        has_green_context=cuda and hasattr(torch.cuda, "GreenContext"),
    )


@functools.lru_cache(maxsize=1)
def get_env() -> Env:
    """The process-wide :class:`Env`, probed on first call and frozen afterwards.

    Host only; the first call queries the CUDA driver (device name, capability, count) and the
    installed packages, then is cached."""
    return probe_env()
