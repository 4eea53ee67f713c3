"""The per-layer balancer seam the scheduler calls (DESIGN 8), and the do-nothing balancer.

A scheduler calls, per chunk: ``start_wait_gpu`` (gated) -> routing -> ``done_wait_gpu``
(gated) -> ``update_statistic`` -> ``route`` -> ... -> ``start_set_cpu`` (gated) -> combine ->
``done_set_cpu`` (gated). Gating (first chunk of the first repeat / last chunk of the last
repeat) is the scheduler's job; a balancer just does what each hook means.
"""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["LayerBalancerHooks", "NullLayerBalancer"]


class LayerBalancerHooks(Protocol):
    """What a layer needs from its load balancer.

    ``num_slots``: physical slots ``S`` (``== E`` without redundancy).
    ``local_experts(start, end)``: logical expert id held by each slot in ``[start, end)``.
    ``update_statistic(topk_ids [n, K] int32 logical, -1 = padding)``: device counters.
    ``route(topk_ids [n, K] logical, row_offset) -> [n, K] int32 physical slot ids`` (``-1``
    kept), ``row_offset`` = global index of the chunk's first row (rank-identical formula).
    """

    num_slots: int

    def local_experts(self, start: int, end: int) -> list[int]: ...
    def start_wait_gpu(self) -> None: ...
    def done_wait_gpu(self) -> None: ...
    def update_statistic(self, topk_ids: torch.Tensor) -> None: ...
    def route(self, topk_ids: torch.Tensor, row_offset: int) -> torch.Tensor: ...
    def start_set_cpu(self) -> None: ...
    def done_set_cpu(self) -> None: ...


class NullLayerBalancer:
    """No load balancing: slot ``s`` holds logical expert ``s``; every hook does nothing.

    ``route`` returns the ids unchanged (int32). No host sync; graph-safe.
    """

    def __init__(self, num_experts: int) -> None:
        self.num_slots = num_experts

    def local_experts(self, start: int, end: int) -> list[int]:
        return list(range(start, end))

    def start_wait_gpu(self) -> None:
        pass

    def done_wait_gpu(self) -> None:
        pass

    def update_statistic(self, topk_ids: torch.Tensor) -> None:
        pass

    def route(self, topk_ids: torch.Tensor, row_offset: int) -> torch.Tensor:
        return topk_ids

    def start_set_cpu(self) -> None:
        pass

    def done_set_cpu(self) -> None:
        pass
