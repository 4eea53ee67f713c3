"""The pure EPLB placement policy: which logical expert each physical slot holds (DESIGN 8).

Legend: ``L`` layers, ``E`` logical experts, ``S`` physical slots, ``R`` ranks (``num_ranks``),
``N`` nodes, ``G`` expert groups, ``P = S / R`` slots per rank, ``R_max`` most replicas of one
expert. Slot ``s`` lives on rank ``s // P``; rank ``j`` on node ``j // (R / N)``; group ``g`` is
experts ``[g * E / G, (g + 1) * E / G)``.

:func:`rebalance` aims past DeepSeek's published EPLB on two fronts: the known load is packed to
(near) perfect balance by LPT plus swap local search, and among near-equal packings it picks
replica counts and packings whose rank loads move together when the per-expert load drifts
(hot experts on every rank, ranks built from many medium replicas). See :mod:`eplb._packing`
for the steps and :mod:`eplb._counts` for the drift model.

Pure: no RNG, no global state, inputs never modified; CPU only, no device work (a CUDA
``load`` is copied to the host: a device->host sync), so it may run on a worker thread.
Cost: ~50-100 ms per layer of 256 experts on one CPU core (host loops plus small torch ops).
"""

from __future__ import annotations

import torch

from eplb._counts import assign_groups
from eplb._packing import MIGRATION_TOL, plan_domain
from eplb.placement import Placement, placement_from_phy2log

__all__ = ["rebalance", "default_placement"]


def default_placement(num_experts: int, num_slots: int, num_groups: int, num_nodes: int,
                      num_ranks: int, num_layers: int = 1) -> Placement:
    """The identity-like placement used before any load is known (and for an empty window).

    Global policy (``num_groups % num_nodes != 0``): slot ``s`` holds expert ``s mod E``
    (:func:`eplb.placement.default_phy2log`). Hierarchical: node ``n``'s ``S / N`` slots cycle
    through node ``n``'s own experts ``[n * E / N, (n + 1) * E / N)``, so groups stay whole
    (the same as the global one when ``N == 1``). Both are the identity when ``S == E``.

    Pure; host only (CPU tensors).
    """
    _check_sizes(num_experts, num_slots, num_groups, num_nodes, num_ranks)
    nodes = num_nodes if num_groups % num_nodes == 0 else 1
    per_node_e, per_node_s = num_experts // nodes, num_slots // nodes
    s = torch.arange(num_slots)
    row = (s // per_node_s) * per_node_e + (s % per_node_s) % per_node_e
    return placement_from_phy2log(row.expand(num_layers, num_slots).clone(), num_experts)


def rebalance(load: torch.Tensor, num_slots: int, num_groups: int, num_nodes: int,
              num_ranks: int, old_phy2log: torch.Tensor | None = None) -> Placement:
    """Plan the expert placement for every layer from one statistics window.

    Args:
        load: ``[L, E]`` any real dtype, non-negative and finite: tokens routed to each logical
            expert over the window. Only ratios within a layer matter.
        num_slots: physical slots ``S``; a multiple of ``num_ranks`` and ``>= E``.
        num_groups: expert groups ``G`` (``E % G == 0``); ``1`` for models without groups.
        num_nodes: nodes ``N`` (``num_ranks % N == 0``).
        num_ranks: expert-parallel ranks ``R``.
        old_phy2log: ``[L, S]`` integer, the current placement (every expert at least once per
            layer), or ``None``. With it, replicas that stay on a rank keep their slot (slots
            are permuted within each rank to keep as many as possible); a plan repaired from
            the old one (fewer slots moved) is preferred when it scores within
            ``MIGRATION_TOL`` (1%) of the fresh plan (see :mod:`eplb._packing`), and groups
            keep their old node while the most loaded node stays within 1% of the best split.
            Replica counts always follow ``load``.

    Returns:
        :class:`Placement`; ``log2phy`` lists each expert's slots in ascending order.

    Policy: hierarchical when ``G % N == 0``: each group whole on one node (groups go to nodes
    by an exact search minimising the most loaded node for up to 16 groups and 8 nodes, LPT
    beyond; a node takes between 1 and ``(S / N) // (E / G)`` groups, so unequal group counts
    are allowed when the slots leave room), then each node replicates and packs its own experts
    on its own ranks. Global otherwise: all ranks, and no node holds more than
    ``ceil(r_e / N)`` replicas of an expert while that is possible. Either way no rank holds more
    than ``ceil(r_e / R)`` replicas of an expert while that is possible. Deterministic: no RNG,
    ties broken by lowest index. An empty window (a layer whose load is all zero) keeps that
    layer's old placement, or :func:`default_placement` when ``old_phy2log`` is ``None``.

    Raises:
        TypeError: ``load``/``old_phy2log`` not tensors of a real/integer dtype.
        ValueError: a size that does not divide, ``S < E``, negative or non-finite load,
            an ``old_phy2log`` of the wrong shape or missing an expert.

    Host only: copies ``load`` to the CPU first (a host sync if it is on a device); no collective.
    """
    w_LE = _check_load(load)
    L, E = w_LE.shape
    _check_sizes(E, num_slots, num_groups, num_nodes, num_ranks)
    old_LS = None if old_phy2log is None else _check_old(old_phy2log, L, E, num_slots)
    default = default_placement(E, num_slots, num_groups, num_nodes, num_ranks).phy2log[0]
    P = num_slots // num_ranks
    rows = []
    for layer in range(L):
        old_row = None if old_LS is None else old_LS[layer].tolist()
        w = w_LE[layer].tolist()
        if sum(w) == 0.0:
            rows.append(default.tolist() if old_row is None else old_row)
            continue
        if num_groups % num_nodes == 0:
            rank_experts = _hierarchical(w, num_groups, num_nodes, num_ranks, P, old_row)
        else:
            rank_experts = _global(w, num_nodes, num_ranks, P, old_row)
        rows.append(_slots(rank_experts, P, old_row))
    phy2log = torch.tensor(rows, dtype=torch.int64).reshape(L, num_slots)
    return placement_from_phy2log(phy2log, E)


def _global(w: list[float], num_nodes: int, num_ranks: int, P: int,
            old_row: list[int] | None) -> list[list[int]]:
    per_node = num_ranks // num_nodes
    old = None if old_row is None else [old_row[j * P:(j + 1) * P] for j in range(num_ranks)]
    plan = plan_domain(w, num_ranks, P, [j // per_node for j in range(num_ranks)], old)
    return plan.rank_experts


def _hierarchical(w: list[float], num_groups: int, num_nodes: int, num_ranks: int, P: int,
                  old_row: list[int] | None) -> list[list[int]]:
    E = len(w)
    size = E // num_groups
    per_node = num_ranks // num_nodes
    group_load = [sum(w[g * size:(g + 1) * size]) for g in range(num_groups)]
    old_node = None
    if old_row is not None:
        votes = [[0] * num_nodes for _ in range(num_groups)]
        for s, e in enumerate(old_row):
            votes[e // size][(s // P) // per_node] += 1
        old_node = [max(range(num_nodes), key=lambda n: (v[n], -n)) for v in votes]
    node_of = assign_groups(group_load, num_nodes, (per_node * P) // size, old_node,
                            tol=MIGRATION_TOL)
    out: list[list[int]] = []
    for n in range(num_nodes):
        experts = [e for g in range(num_groups) if node_of[g] == n
                   for e in range(g * size, (g + 1) * size)]
        local = {e: i for i, e in enumerate(experts)}
        ranks = range(n * per_node, (n + 1) * per_node)
        old = None if old_row is None else [
            [local.get(e, -1) for e in old_row[j * P:(j + 1) * P]] for j in ranks]
        plan = plan_domain([w[e] for e in experts], per_node, P, [0] * per_node, old)
        out.extend([experts[i] for i in lst] for lst in plan.rank_experts)
    return out


def _slots(rank_experts: list[list[int]], P: int, old_row: list[int] | None) -> list[int]:
    """Order each rank's experts into its slots, keeping every old slot whose expert stays."""
    row: list[int] = []
    for j, experts in enumerate(rank_experts):
        assert len(experts) == P
        if old_row is None:
            row.extend(sorted(experts))
            continue
        left: dict[int, int] = {}
        for e in experts:
            left[e] = left.get(e, 0) + 1
        slots = [-1] * P
        for i, e in enumerate(old_row[j * P:(j + 1) * P]):
            if left.get(e, 0) > 0:
                slots[i] = e
                left[e] -= 1
        rest = iter(sorted(e for e, k in left.items() for _ in range(k)))
        row.extend(e if e >= 0 else next(rest) for e in slots)
    return row


def _check_load(load: torch.Tensor) -> torch.Tensor:
    if not isinstance(load, torch.Tensor):
        raise TypeError(f"load must be a torch.Tensor [L, E], got {type(load).__name__}")
    if load.is_complex():
        raise TypeError(f"load must be real, got dtype {load.dtype}")
    if load.dim() != 2 or 0 in load.shape:
        raise ValueError(f"load must have shape [L, E] with L, E >= 1, got {tuple(load.shape)}")
    w = load.detach().to("cpu", torch.float64)               # NOTE: device->host sync if CUDA
    if not bool(torch.isfinite(w).all()):
        raise ValueError("load has NaN or infinite entries; pass token counts per expert")
    if bool((w < 0).any()):
        raise ValueError(f"load must be non-negative, got min {float(w.min())}")
    return w


def _check_sizes(E: int, num_slots: int, num_groups: int, num_nodes: int, num_ranks: int) -> None:
    for name, v in (("num_slots", num_slots), ("num_groups", num_groups),
                    ("num_nodes", num_nodes), ("num_ranks", num_ranks)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if num_slots % num_ranks:
        raise ValueError(f"num_slots={num_slots} must be divisible by num_ranks={num_ranks} "
                         "(every rank holds the same number of slots)")
    if E % num_groups:
        raise ValueError(f"num_groups={num_groups} must divide num_experts={E} "
                         "(the experts are load.shape[1])")
    if num_ranks % num_nodes:
        raise ValueError(f"num_nodes={num_nodes} must divide num_ranks={num_ranks} "
                         "(every node has the same number of ranks)")
    if num_slots < E:
        raise ValueError(f"num_slots={num_slots} must be >= num_experts={E} "
                         "(every expert needs a slot)")


def _check_old(old: torch.Tensor, L: int, E: int, S: int) -> torch.Tensor:
    if not isinstance(old, torch.Tensor):
        raise TypeError("old_phy2log must be a torch.Tensor [L, S] or None, got "
                        f"{type(old).__name__}")
    if old.dtype.is_floating_point or old.is_complex() or old.dtype == torch.bool:
        raise TypeError(f"old_phy2log must have an integer dtype, got {old.dtype}")
    if tuple(old.shape) != (L, S):
        raise ValueError(f"old_phy2log must have shape [L, S] = {[L, S]}, got {list(old.shape)}")
    old = old.detach().to("cpu", torch.int64)
    if old.numel() and (int(old.min()) < 0 or int(old.max()) >= E):
        raise ValueError(f"old_phy2log entries must be expert ids in [0, {E}), got "
                         f"[{int(old.min())}, {int(old.max())}]")
    for layer in range(L):
        seen = torch.bincount(old[layer], minlength=E)
        if bool((seen == 0).any()):
            missing = int((seen == 0).nonzero()[0, 0])
            raise ValueError(f"old_phy2log layer {layer} has no slot for expert {missing}; "
                             "a placement must hold every expert")
    return old
