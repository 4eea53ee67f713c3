"""Expert-compute backends (DESIGN 6): pure device compute over this rank's slots."""

from __future__ import annotations

from moerun.backends.base import (
    Backend,
    Deployment,
    Eligibility,
    Problem,
    RejectReason,
    SchedulerKind,
)
from moerun.backends.reference import ReferenceExperts, reference_moe

__all__ = [
    "Backend",
    "Deployment",
    "Eligibility",
    "Problem",
    "RejectReason",
    "SchedulerKind",
    "ReferenceExperts",
    "reference_moe",
    "BACKEND_NAMES",
    "backend_class",
    "backend_candidates",
]

#: Every name ``backend=`` accepts besides ``"auto"`` and a Backend instance.
BACKEND_NAMES = ("reference", "triton", "grouped_mm")

# Names reserved for backends that do not exist yet; asking for one is a clear error.
_NOT_YET = {
    "triton": "TritonExperts is not implemented yet (fused Triton kernels are a later issue); "
              "use backend='reference'",
    "grouped_mm": "GroupedMMExperts is not implemented yet (a later issue); "
                  "use backend='reference'",
}


def backend_class(name: str) -> type[Backend]:
    """The backend class registered as ``name``.

    Raises ValueError for an unknown name (listing the valid ones) or a reserved one.
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"backend={name!r} is unknown; valid: 'auto', "
                         f"{', '.join(repr(n) for n in BACKEND_NAMES)} or a Backend instance")
    if name in _NOT_YET:
        raise ValueError(f"backend={name!r}: {_NOT_YET[name]}")
    return ReferenceExperts


def backend_candidates() -> list[type[Backend]]:
    """Implemented backends in ``"auto"`` priority order (fastest first)."""
    return [ReferenceExperts]
