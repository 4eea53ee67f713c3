"""The capability vocabulary shared by backends, communication strategies, schedulers and
``resolve`` (DESIGN 4): what a layer asks (:class:`Problem`), where it runs
(:class:`Deployment`), the answer of a ``can_implement`` (:class:`Eligibility` with a closed
:class:`RejectReason`), and which scheduler drives a backend (:class:`SchedulerKind`).

It sits below ``moerun.backends`` and ``moerun.comm`` so neither imports the other for it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from moerun.quant import QuantConfig
from moerun.routing_config import Activation

__all__ = ["SchedulerKind", "RejectReason", "Eligibility", "Problem", "Deployment"]


class SchedulerKind(str, enum.Enum):
    """Which scheduler drives a backend (DESIGN 4)."""

    EXTERNAL_COMM = "external_comm"  # the host issues dispatch and combine
    FUSED_COMM = "fused_comm"  # communication inside the kernel (no such backend yet)


class RejectReason(str, enum.Enum):
    """Closed set of reasons a candidate (backend or strategy) was not chosen."""

    NOT_REQUESTED = "not_requested"  # the user asked for another candidate by name
    PACKAGE_MISSING = "package_missing"  # an optional library is not importable
    DEVICE = "device"  # wrong device type or compute capability
    DTYPE = "dtype"
    SHAPE = "shape"  # hidden/intermediate size, strides, top-k limits
    ACTIVATION = "activation"
    NON_DIVISIBLE_EP = "non_divisible_ep"  # S % ep_size != 0 not declared supported
    TOPOLOGY = "topology"  # group size / process-group backend not supported
    INTERPRETER = "interpreter"  # Triton on CPU without TRITON_INTERPRET=1, or bf16 under it
    WORKLOAD = "workload"  # is_workload_feasible said no for this forward
    LOWER_PRIORITY = "lower_priority"  # eligible, but a higher-priority candidate won
    UNIMPLEMENTED = "unimplemented"  # declared by the design, not built yet
    QUANT = "quant"  # an FP8 block-scaled layer, and the candidate has no such path


@dataclass(frozen=True, kw_only=True)
class Eligibility:
    """Answer of ``can_implement``: ``ok`` or a closed-enum ``reason`` plus free-text detail."""

    ok: bool
    reason: RejectReason | None = None
    detail: str = ""

    @classmethod
    def yes(cls) -> "Eligibility":
        """An eligible answer (``ok=True``). Pure; host only."""
        return cls(ok=True)

    @classmethod
    def no(cls, reason: RejectReason, detail: str) -> "Eligibility":
        """An ineligible answer with its ``reason`` and a human-readable ``detail``.

        Pure; host only."""
        return cls(ok=False, reason=reason, detail=detail)


@dataclass(frozen=True, kw_only=True)
class Problem:
    """The math of one layer, as backends and strategies see it.

    Fields: ``num_experts`` E, ``num_slots`` S, ``top_k`` K, ``hidden_size`` H,
    ``intermediate_size`` I, ``dtype``, ``activation``, ``device_type`` ("cpu"/"cuda"),
    ``shared_intermediate_size`` (0 = no shared expert), ``apply_router_weight_on_input``
    (Llama 4: the routed input is scaled by the routing weight), ``quant`` (the FP8
    block-scaled :class:`~moerun.quant.QuantConfig` of the routed experts; None = unquantized).
    """

    num_experts: int
    num_slots: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    dtype: torch.dtype
    activation: Activation
    device_type: str
    shared_intermediate_size: int = 0
    apply_router_weight_on_input: bool = False
    quant: QuantConfig | None = None


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """Where the layer runs: ``rank``, ``world_size``, ``comm_backend`` ("none", "gloo",
    "nccl"), ``num_local_slots`` on this rank, ``divisible`` (S % world_size == 0)."""

    rank: int
    world_size: int
    comm_backend: str
    num_local_slots: int
    divisible: bool
