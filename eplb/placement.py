"""Placement maps (DESIGN 8): ``phy2log [L, S]``, ``log2phy [L, E, R_max]`` (padded -1),
``logcnt [L, E]``, and conversions between them.

Slot ``s`` lives on rank ``s // (S / num_ranks)``. ``log2phy`` lists each expert's slots in
ascending slot order, so replica ``i`` of expert ``e`` is ``log2phy[l, e, i]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Placement", "placement_from_phy2log", "default_phy2log"]


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where every logical expert lives.

    Fields: ``phy2log [L, S]`` int64 logical expert of each slot; ``log2phy [L, E, R_max]``
    int64 slots of each expert, ascending, padded with -1; ``logcnt [L, E]`` int64 replicas.
    """

    phy2log: torch.Tensor
    log2phy: torch.Tensor
    logcnt: torch.Tensor

    @property
    def num_layers(self) -> int:
        return self.phy2log.shape[0]

    @property
    def num_slots(self) -> int:
        return self.phy2log.shape[1]

    @property
    def num_experts(self) -> int:
        return self.logcnt.shape[1]


def placement_from_phy2log(phy2log: torch.Tensor, num_experts: int,
                           max_replicas: int | None = None) -> Placement:
    """Build the inverse maps of ``phy2log [L, S]``.

    ``max_replicas`` pads ``log2phy`` to a fixed width (default: the largest count). Raises
    ValueError when an expert id is out of range, an expert has no slot, or a count exceeds
    ``max_replicas``. Host loops; not for the hot path.

    Host only: copies ``phy2log`` to the CPU first (a host sync if it is on a device).
    """
    if phy2log.dim() != 2:
        raise ValueError(f"phy2log must be [L, S], got shape {tuple(phy2log.shape)}")
    p2l = phy2log.to(torch.int64).cpu()
    layers, slots = p2l.shape
    if p2l.numel() and (int(p2l.min()) < 0 or int(p2l.max()) >= num_experts):
        raise ValueError(f"phy2log holds ids outside [0, num_experts={num_experts})")
    logcnt = torch.zeros(layers, num_experts, dtype=torch.int64)
    logcnt.scatter_add_(1, p2l, torch.ones_like(p2l))
    if bool((logcnt == 0).any()):
        missing = (logcnt == 0).nonzero()[0].tolist()
        raise ValueError(f"phy2log leaves logical expert {missing[1]} of layer {missing[0]} "
                         "without a slot; every expert needs at least one replica")
    width = int(logcnt.max()) if max_replicas is None else max_replicas
    if int(logcnt.max()) > width:
        raise ValueError(f"an expert has {int(logcnt.max())} replicas > max_replicas={width}")
    log2phy = torch.full((layers, num_experts, width), -1, dtype=torch.int64)
    for layer in range(layers):
        fill = [0] * num_experts
        for s, e in enumerate(p2l[layer].tolist()):
            log2phy[layer, e, fill[e]] = s
            fill[e] += 1
    return Placement(phy2log=p2l, log2phy=log2phy, logcnt=logcnt)


def default_phy2log(num_layers: int, num_experts: int, num_slots: int) -> torch.Tensor:
    """Round-robin placement ``slot s -> expert s mod E`` for every layer (``[L, S]`` int64).

    Pure; host only (a CPU tensor)."""
    row = torch.arange(num_slots, dtype=torch.int64) % num_experts
    return row.expand(num_layers, num_slots).clone()
