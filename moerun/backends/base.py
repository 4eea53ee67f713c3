"""The backend interface: pure device compute over this rank's expert slots (DESIGN 6).

Legend: ``M`` rows given to the backend (tokens after dispatch), ``H`` hidden, ``I``
intermediate, ``S_local`` slots on this rank, ``K`` top-k.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from typing import ClassVar

import torch

from moerun.config import Activation
from moerun.env import Env

__all__ = [
    "SchedulerKind",
    "RejectReason",
    "Eligibility",
    "Problem",
    "Deployment",
    "Backend",
]


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


@dataclass(frozen=True, kw_only=True)
class Eligibility:
    """Answer of ``can_implement``: ``ok`` or a closed-enum ``reason`` plus free-text detail."""

    ok: bool
    reason: RejectReason | None = None
    detail: str = ""

    @classmethod
    def yes(cls) -> "Eligibility":
        return cls(ok=True)

    @classmethod
    def no(cls, reason: RejectReason, detail: str) -> "Eligibility":
        return cls(ok=False, reason=reason, detail=detail)


@dataclass(frozen=True, kw_only=True)
class Problem:
    """The math of one layer, as backends and strategies see it.

    Fields: ``num_experts`` E, ``num_slots`` S, ``top_k`` K, ``hidden_size`` H,
    ``intermediate_size`` I, ``dtype``, ``activation``, ``device_type`` ("cpu"/"cuda"),
    ``shared_intermediate_size`` (0 = no shared expert).
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


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """Where the layer runs: ``rank``, ``world_size``, ``comm_backend`` ("none", "gloo",
    "nccl"), ``num_local_slots`` on this rank, ``divisible`` (S % world_size == 0)."""

    rank: int
    world_size: int
    comm_backend: str
    num_local_slots: int
    divisible: bool


class Backend(abc.ABC):
    """Computes ``out[t] = sum_j w[t, j] * expert_{ids[t, j]}(x[t])`` over local slots.

    Rows whose id is ``-1`` (another rank's slot, or a padded row) contribute nothing. A
    backend never communicates and holds no per-forward state.

    Class-level declarations (data, read by ``resolve``):
        name: registry name.
        scheduler_kind: :class:`SchedulerKind`.
        supports_non_divisible_ep: may run when ``S % ep_size != 0``.
        supports_fused_shared: can fold the shared expert in as extra expert groups.
    """

    name: ClassVar[str]
    scheduler_kind: ClassVar[SchedulerKind] = SchedulerKind.EXTERNAL_COMM
    supports_non_divisible_ep: ClassVar[bool] = False
    supports_fused_shared: ClassVar[bool] = False

    @classmethod
    @abc.abstractmethod
    def can_implement(cls, problem: Problem, deployment: Deployment, env: Env) -> Eligibility:
        """Pure static check; no device work, no probing (``env`` was probed once)."""

    @abc.abstractmethod
    def run_experts(
        self,
        x: torch.Tensor,
        w13: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Expert compute for this rank's slots.

        Args:
            x: ``[M, H]`` activations (fp32/fp16/bf16; fp64 for the reference).
            w13: ``[S_local, 2*I, H]`` gate rows then up rows.
            w2: ``[S_local, H, I]``.
            topk_weights: ``[M, K]`` fp32.
            topk_ids: ``[M, K]`` int32 local slot ids in ``[0, S_local)`` or ``-1``.

        Returns:
            ``[M, H]`` in ``x.dtype``: the weighted sum over this rank's (t, j) pairs; rows with
            no local pair are exactly zero. Runs on the current stream; no collective.
        """

    def workspace_bytes(self, problem: Problem, rows: int) -> int:
        """Peak temporary bytes for ``rows`` rows of one chunk (for the resolution report)."""
        elt = torch.empty((), dtype=problem.dtype).element_size()
        k, h, i = problem.top_k, problem.hidden_size, problem.intermediate_size
        # gathered rows + gate/up activations + expert outputs, per (t, j) pair, plus fp32 sum
        return rows * k * (h + 2 * i + h) * elt + rows * h * 4
