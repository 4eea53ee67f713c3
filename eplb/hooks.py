"""The per-layer balancer seam the scheduler calls (DESIGN 8), and the do-nothing balancer.

A scheduler calls, per chunk: ``start_wait_gpu`` (gated) -> routing -> ``done_wait_gpu``
(gated) -> ``update_statistic`` -> ``route`` -> ... -> ``start_set_cpu`` (gated) -> combine ->
``done_set_cpu`` (gated). Gating (first chunk of the first repeat / last chunk of the last
repeat) is the scheduler's job; a balancer just does what each hook means. Every hook gets
the forward's context first (:class:`HookContext`): per-forward state (the streams used, the
collective cursor, the events recorded after the experts) lives there, never on the balancer.

A balancer with ``enabled = False`` (:class:`NullLayerBalancer`) is not called at all: the
scheduler emits no hook ranges and makes no hook calls for it (DESIGN 4.1 step 5).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

__all__ = ["HookContext", "LayerBalancerHooks", "NullLayerBalancer"]


class HookContext(Protocol):
    """What a balancer hook may read and write of the scheduler's ``ForwardContext``.

    ``streams``: the CUDA streams the forward issued work on, main first (``()`` on CPU).
    ``cursor``: the forward's ``moerun.comm.CollectiveCursor`` (EPLB collectives issue on it).
    ``experts_done``: events ``start_set_cpu`` records after the last ``run_experts``;
    ``done_set_cpu`` orders the migration after them.
    """

    streams: tuple[Any, ...]
    cursor: Any
    experts_done: list[Any]


class LayerBalancerHooks(Protocol):
    """What a layer needs from its load balancer.

    ``enabled``: False = the scheduler skips every hook (no calls, no ranges).
    ``num_slots``: physical slots ``S`` (``== E`` without redundancy).
    ``local_experts(start, end)``: logical expert id held by each slot in ``[start, end)``.
    ``update_statistic(ctx, topk_ids [n, K] int32 logical, -1 = padding)``: device counters.
    ``route(ctx, topk_ids [n, K] logical, row_offset) -> [n, K] int32 physical slot ids``
    (``-1`` kept), ``row_offset`` = global index of the chunk's first row (rank-identical).
    """

    enabled: bool
    num_slots: int

    def local_experts(self, start: int, end: int) -> list[int]:
        """Logical expert id held by each slot in ``[start, end)``.

        May host sync (called at load time)."""
        ...

    def start_wait_gpu(self, ctx: HookContext) -> None:
        """Before routing (first chunk): order the current stream after a pending migration.

        Stream ordering only; no host sync."""
        ...

    def done_wait_gpu(self, ctx: HookContext) -> None:
        """After routing (first chunk): start this forward's statistics. Host only."""
        ...

    def update_statistic(self, ctx: HookContext, topk_ids: torch.Tensor) -> None:
        """Count ``topk_ids [n, K]`` (int32 logical ids, ``-1`` = padding) into the window.

        Device counters only; no host sync; capturable."""
        ...

    def route(self, ctx: HookContext, topk_ids: torch.Tensor,
              row_offset: int) -> torch.Tensor:
        """Logical ``topk_ids [n, K]`` -> ``[n, K]`` int32 physical slot ids (``-1`` kept);
        ``row_offset``: global index of the chunk's first row.

        Device only; no host sync; capturable."""
        ...

    def start_set_cpu(self, ctx: HookContext) -> None:
        """After the last ``run_experts`` (last chunk): record ``ctx.experts_done``.

        Records events; no host sync."""
        ...

    def done_set_cpu(self, ctx: HookContext) -> None:
        """After the combine (last chunk): rebalance and migrate when due.

        May be a collective on ``ctx.cursor`` with host syncs (a due rebalance)."""
        ...


class NullLayerBalancer:
    """No load balancing: slot ``s`` holds logical expert ``s``.

    ``enabled`` is False, so the scheduler never calls its hooks; they exist (and do nothing)
    so the seam stays a real class. ``route`` returns the ids unchanged. No host sync.
    """

    enabled = False

    def __init__(self, num_experts: int) -> None:
        self.num_slots = num_experts

    def local_experts(self, start: int, end: int) -> list[int]:
        """The identity: slot ``s`` holds expert ``s``. Pure; host only."""
        return list(range(start, end))

    def start_wait_gpu(self, ctx: HookContext) -> None:
        """Nothing to wait on. No-op: no device work, no host sync."""
        pass

    def done_wait_gpu(self, ctx: HookContext) -> None:
        """No statistics to start. No-op: no device work, no host sync."""
        pass

    def update_statistic(self, ctx: HookContext, topk_ids: torch.Tensor) -> None:
        """No statistics kept. No-op: no device work, no host sync."""
        pass

    def route(self, ctx: HookContext, topk_ids: torch.Tensor, row_offset: int) -> torch.Tensor:
        """``topk_ids`` unchanged (slot ``s`` holds expert ``s``). Pure; no device work."""
        return topk_ids

    def start_set_cpu(self, ctx: HookContext) -> None:
        """No events to record. No-op: no device work, no host sync."""
        pass

    def done_set_cpu(self, ctx: HookContext) -> None:
        """Never rebalances. No-op: no collective, no host sync."""
        pass
