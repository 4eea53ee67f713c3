"""The backend interface: pure device compute over this rank's expert slots (DESIGN 6).

Legend: ``M`` rows given to the backend (tokens after dispatch), ``H`` hidden, ``I``
intermediate, ``S_local`` slots on this rank, ``K`` top-k.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import torch

from moerun.capability import (
    Deployment,
    Eligibility,
    Problem,
    RejectReason,
    SchedulerKind,
)
from moerun.env import Env

__all__ = [
    "SchedulerKind",
    "RejectReason",
    "Eligibility",
    "Problem",
    "Deployment",
    "Backend",
]


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
