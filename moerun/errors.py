"""Exceptions raised by moerun (bottom of the dependency graph: imports nothing from moerun)."""

from __future__ import annotations

__all__ = ["MoERunError", "CommTimeoutError", "LayerClosedError", "LayerStepMismatch",
           "EPLBStepMismatch"]


class MoERunError(RuntimeError):
    """Base class of moerun's runtime errors (user input errors are ValueError/TypeError)."""


class CommTimeoutError(MoERunError):
    """A collective did not complete within its budget, or a peer was lost.

    The layer that raised it is poisoned: its process group is unusable (gloo cannot recover
    after a timeout). Close the layer and build a new one on a new group (DESIGN 13).

    Attributes:
        layer: ``layer_idx`` of the layer (None when unset).
        step: the layer's forward counter when the collective was issued.
        phase: the phase that was waiting (``"counts"``, ``"validate"``, ``"dispatch"``, ...).
        rank: the rank that raised.
        missing_ranks: ranks that never announced this (layer, step, phase) in the c10d store;
            ``None`` when the Mapping carries no store.
    """

    def __init__(
        self,
        *,
        layer: int | None,
        step: int,
        phase: str,
        rank: int,
        missing_ranks: list[int] | None,
        detail: str = "",
    ) -> None:
        self.layer = layer
        self.step = step
        self.phase = phase
        self.rank = rank
        self.missing_ranks = missing_ranks
        missing = "unknown (no store in Mapping)" if missing_ranks is None else missing_ranks
        msg = (
            f"collective timed out or a peer was lost: layer={layer} step={step} "
            f"phase={phase!r} rank={rank} missing_ranks={missing}"
        )
        if detail:
            msg += f" ({detail})"
        msg += "; the layer is poisoned: close it and rebuild on a new process group"
        super().__init__(msg)


class LayerClosedError(MoERunError):
    """``forward`` on a layer that cannot run: closed, poisoned by a communication failure, or
    without loaded weights, on this rank or (agreed, issue 14) on a peer.

    Attributes:
        ranks: the ranks whose layer is closed / poisoned / not loaded (None when unknown).
    """

    def __init__(self, message: str, *, ranks: list[int] | None = None) -> None:
        self.ranks = ranks
        super().__init__(message)


class LayerStepMismatch(MoERunError):
    """Ranks disagree on a layer's forward counter (agreed validation, issue 14): some rank
    skipped or repeated a forward of this layer, so budgets, store keys and EPLB due steps
    would differ across ranks.

    Attributes:
        ranks: the ranks whose counter differs from the most common one.
        steps: every rank's counter, by rank.
    """

    def __init__(self, message: str, *, ranks: list[int], steps: list[int]) -> None:
        self.ranks = ranks
        self.steps = steps
        super().__init__(message)


class EPLBStepMismatch(MoERunError):
    """Ranks disagree on the EPLB step or per-layer forward counts at a rebalance."""

    def __init__(self, message: str, *, ranks: list[int]) -> None:
        self.ranks = ranks
        super().__init__(message)
