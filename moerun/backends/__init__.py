"""Expert-compute backends (DESIGN 6): pure device compute over this rank's slots."""

from __future__ import annotations

from moerun.backends.base import (
    Backend,
    Deployment,
    Eligibility,
    Problem,
    RejectReason,
    SchedulerKind,
    backend_eligibility,
)
from moerun.backends.reference import ReferenceExperts, reference_moe

__all__ = [
    "Backend",
    "Deployment",
    "Eligibility",
    "Problem",
    "RejectReason",
    "SchedulerKind",
    "backend_eligibility",
    "ReferenceExperts",
    "reference_moe",
    "BACKEND_NAMES",
    "backend_class",
    "backend_candidates",
]

#: Every name ``backend=`` accepts besides ``"auto"`` and a Backend instance or class.
BACKEND_NAMES = ("reference", "triton", "grouped_mm")


def backend_class(name: str) -> type[Backend]:
    """The backend class registered as ``name`` (imported lazily: triton is optional).

    Raises ValueError for an unknown name, listing the valid ones.

    Host only; imports the backend's module on first use (no device work).
    """
    if name == "reference":
        return ReferenceExperts
    if name == "grouped_mm":
        from moerun.backends.grouped_mm import GroupedMMExperts

        return GroupedMMExperts
    if name == "triton":
        from moerun.backends.triton import TritonExperts

        return TritonExperts
    raise ValueError(f"backend={name!r} is unknown; valid: 'auto', "
                     f"{', '.join(repr(n) for n in BACKEND_NAMES)} or a Backend instance")


def backend_candidates() -> list[type[Backend]]:
    """Backends in ``"auto"`` priority order (fastest first; the first eligible one wins).

    TritonExperts (fused kernels, CUDA; on CPU only under ``TRITON_INTERPRET=1``), then
    GroupedMMExperts (``torch._grouped_mm``), then the ReferenceExperts oracle.
    """
    return [backend_class("triton"), backend_class("grouped_mm"), ReferenceExperts]
