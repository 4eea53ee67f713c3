"""The backend interface: pure device compute over this rank's expert slots (DESIGN 6).

Legend: ``M`` rows given to the backend (tokens after dispatch), ``H`` hidden, ``I``
intermediate, ``S_local`` slots on this rank, ``K`` top-k.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from moerun.capability import (
    Deployment,
    Eligibility,
    Problem,
    RejectReason,
    SchedulerKind,
)
from moerun.env import Env
from moerun.quant import ExpertQuant, QuantConfig, QuantizedRows, quantize_rows

__all__ = [
    "SchedulerKind",
    "RejectReason",
    "Eligibility",
    "Problem",
    "Deployment",
    "FusedShared",
    "Backend",
    "backend_eligibility",
]


@dataclass(frozen=True, eq=False, kw_only=True)
class FusedShared:
    """The shared expert as extra slots of one ``run_experts`` call (the ``FUSED`` order).

    Fields:
        w13: ``[2*Is, H]`` the shared expert's gate rows, then its up rows (its own tensor:
            nothing is copied into the routed weights).
        w2: ``[H, Is]``.
        first_slot: ``S``: ids ``S .. S + n - 1`` in ``topk_ids`` name the shared slots.
        num_slots: ``n = Is / I``: slot ``j`` is the ``I``-wide slice ``[j*I, (j+1)*I)`` of the
            shared intermediate (gate rows ``j*I..``, up rows ``Is + j*I..``, w2 columns
            ``j*I..``), so the sum over the n slots is the whole shared MLP.
    """

    w13: torch.Tensor
    w2: torch.Tensor
    first_slot: int
    num_slots: int


class Backend(abc.ABC):
    """Computes ``out[t] = sum_j w[t, j] * expert_{ids[t, j]}(x[t])`` over local slots.

    Rows whose id is ``-1`` (another rank's slot, or a padded row) contribute nothing. A
    backend never communicates and holds no per-forward state.

    Class-level declarations (data, read by ``resolve``):
        name: registry name.
        scheduler_kind: :class:`SchedulerKind`.
        supports_non_divisible_ep: may run when ``S % ep_size != 0``.
        supports_fused_shared: ``run_experts`` accepts ``shared=`` (:class:`FusedShared`).
        supports_fp8_block: ``run_experts`` accepts ``quant=`` (:class:`~moerun.quant.
            ExpertQuant`): e4m3 weights with fp32 per-block scales and already quantized
            rows (DESIGN 11a). ``resolve`` rejects a backend without it for a quantized layer
            (:func:`backend_eligibility`, reason ``QUANT``).
        fuses_activation_quant: with ``quant=``, ``run_experts`` also takes activation-dtype
            rows and quantizes them itself, identically to :meth:`quantize_rows` (fused into
            its first kernel where it can); the scheduler then skips its ``quantize`` step
            where no rows travel (one rank).
    """

    name: ClassVar[str]
    scheduler_kind: ClassVar[SchedulerKind] = SchedulerKind.EXTERNAL_COMM
    supports_non_divisible_ep: ClassVar[bool] = False
    supports_fused_shared: ClassVar[bool] = False
    supports_fp8_block: ClassVar[bool] = False
    fuses_activation_quant: ClassVar[bool] = False

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
        shared: FusedShared | None = None,
        *,
        quant: ExpertQuant | None = None,
    ) -> torch.Tensor:
        """Expert compute for this rank's slots.

        Args:
            x: ``[M, H]`` activations (fp32/fp16/bf16; fp64 for the reference); with
                ``quant``, a :class:`~moerun.quant.QuantizedRows` (e4m3 ``[M, H]`` plus fp32
                ``[M, H/g]`` scales), always quantized by the caller
                (:meth:`quantize_rows`).
            w13: ``[S_local, 2*I, H]`` gate rows then up rows (e4m3 with ``quant``).
            w2: ``[S_local, H, I]`` (e4m3 with ``quant``).
            topk_weights: ``[M, K]`` fp32.
            topk_ids: ``[M, K]`` int32 local slot ids in ``[0, S_local)`` or ``-1``; with
                ``shared``, also ``[S_local, S_local + n)`` for the shared slots.
            shared: the shared expert's slots (only where ``supports_fused_shared``; never
                together with ``quant``).
            quant: the FP8 block-scaled path (only where ``supports_fp8_block``): the
                weight scales, the :class:`~moerun.quant.QuantConfig` and the output dtype.

        Returns:
            ``[M, H]`` in ``x.dtype`` (with ``quant``: in ``quant.out_dtype``): the weighted
            sum over this rank's (t, j) pairs; rows with no local pair are exactly zero. Runs
            on the current stream; no collective.
        """

    def quantize_rows(self, x: torch.Tensor, config: QuantConfig) -> QuantizedRows:
        """Quantize activations ``x [M, H]`` (any float dtype) per row and
        ``config.act_group`` columns to e4m3 (:func:`moerun.quant.quantize_rows`, the numbers
        of DESIGN 11a; a backend may override it with a kernel that gives the same bytes).

        Returns :class:`~moerun.quant.QuantizedRows` on ``x.device``. Runs on the current
        stream; no host sync; no collective; capturable. A zero row gets zero codes and the
        scale :data:`moerun.quant.ZERO_ROW_SCALE`.
        """
        return quantize_rows(x, config.act_group)

    def shared_mlp_add(self, shared_expert: Any, x: torch.Tensor,
                       routed: torch.Tensor) -> torch.Tensor:
        """``shared_expert(x) + routed`` for ``x``, ``routed [T, H]`` in x.dtype, the shared
        output rounded to x.dtype before the add (the ``SEQUENTIAL`` order's last step). The
        default is the shared expert's torch form (``SharedExpert.add_to``); a backend may
        compute it with its own kernels (same numbers up to the GEMMs' rounding). Returns a
        new tensor; ``routed`` is not modified. Current stream; no host sync; capturable."""
        return shared_expert.add_to(routed, x)

    @classmethod
    def eligibility(cls, problem: Problem, deployment: Deployment, env: Env) -> Eligibility:
        """:func:`backend_eligibility` of this class (declarations, then ``can_implement``).

        Pure; host only."""
        return backend_eligibility(cls, problem, deployment, env)

    def kernel_config(self, *, num_slots: int, hidden: int, intermediate: int, num_tokens: int,
                      top_k: int, dtype: torch.dtype) -> str:
        """Where the kernel configuration of a call of this shape comes from, in words
        (``"tuned (<file>)"``, ``"heuristic"``); ``""`` for a backend without tuned configs.
        ``num_slots`` is the local slot count the kernels run (``w13.shape[0]``). Host only."""
        return ""

    @classmethod
    def config_report(cls, problem: Problem, deployment: Deployment, env: Env
                      ) -> tuple[str, ...]:
        """Lines for the resolution report: which kernel configuration each T bucket of this
        layer's local shape (``deployment.num_local_slots`` slots) uses and where it comes
        from; ``()`` for a backend without tuned configs. May read the backend's shipped
        config files; no device work."""
        return ()

    def workspace_bytes(self, problem: Problem, rows: int) -> int:
        """Peak temporary bytes for ``rows`` rows of one chunk (for the resolution report).

        Pure; host only (arithmetic, no allocation on the device)."""
        elt = torch.empty((), dtype=problem.dtype).element_size()
        k, h, i = problem.top_k, problem.hidden_size, problem.intermediate_size
        # gathered rows + gate/up activations + expert outputs, per (t, j) pair, plus fp32 sum
        return rows * k * (h + 2 * i + h) * elt + rows * h * 4


def backend_eligibility(cls: type[Backend], problem: Problem, deployment: Deployment,
                        env: Env) -> Eligibility:
    """Whether backend class ``cls`` can run ``problem``: its declared capabilities first
    (a quantized problem needs ``supports_fp8_block``, else ``RejectReason.QUANT``), then its
    own pure ``can_implement``. What ``resolve`` and ``fused_experts`` ask. Pure."""
    if problem.quant is not None and not cls.supports_fp8_block:
        return Eligibility.no(
            RejectReason.QUANT,
            f"{cls.name} has no FP8 block-scaled path (supports_fp8_block=False); the "
            "'reference' backend runs it on any device")
    return cls.can_implement(problem, deployment, env)
