"""Replica counts and group-to-node assignment for the EPLB policy (DESIGN 8).

Private helpers of :mod:`eplb.policy`; pure functions on Python lists, deterministic.

Legend: ``n`` experts of one balancing domain (all experts, or one node's groups), ``R`` ranks
of the domain, ``w`` the experts' loads, ``r`` their replica counts (``sum(r) == S`` slots).

The drift model used to refine counts (and by the robust search in :mod:`eplb._packing`):
between two rebalances every expert's load is multiplied by an independent factor of mean ~1
and coefficient of variation ``cv``. With tokens split evenly over an expert's replicas and the
``r`` replicas spread as evenly as possible over the ``R`` ranks, rank ``j``'s deviation from
the mean rank load has variance ``cv**2 * sum_e w_e**2 * (n_ej / r_e - 1/R)**2`` (``n_ej``
copies of ``e`` on rank ``j``). Summed over ranks that is
``cv**2 * sum_e w_e**2 * share_variance(r_e, R)``. An expert with one copy on every rank
(``r_e == R``) contributes nothing: its drift moves every rank alike and cancels in max/mean.
Two copies already halve an expert's contribution, so with few spare slots the optimum doubles
many heavy experts; with more it puts the hottest on every rank.
"""

from __future__ import annotations

import heapq
import math

import torch

__all__ = ["assign_groups", "greedy_counts", "share_variance", "variance_counts"]

# DFS nodes visited before the exact group-to-node search settles for its best so far.
_GROUP_SEARCH_BUDGET = 50_000
# Exact group-to-node search only up to this size; LPT beyond it.
_EXACT_MAX_GROUPS = 16
_EXACT_MAX_NODES = 8


def greedy_counts(w: list[float], num_slots: int) -> list[int]:
    """DeepSeek's rule: each redundant slot goes to the expert with the largest load per replica.

    Ties go to the lower expert id. Returns ``r`` with ``sum(r) == num_slots``, all ``>= 1``.
    """
    counts = [1] * len(w)
    heap = [(-w[e], e) for e in range(len(w))]
    heapq.heapify(heap)
    for _ in range(num_slots - len(w)):
        _, e = heapq.heappop(heap)
        counts[e] += 1
        heapq.heappush(heap, (-w[e] / counts[e], e))
    return counts


def share_variance(r: int, num_ranks: int) -> float:
    """``sum_j (n_j / r - 1/R)**2``: ``r`` copies spread evenly (``q`` or ``q + 1`` per rank)."""
    q, m = divmod(r, num_ranks)
    hi = (q + 1) / r - 1.0 / num_ranks
    lo = q / r - 1.0 / num_ranks
    return m * hi * hi + (num_ranks - m) * lo * lo


def variance_counts(w: list[float], num_slots: int, num_ranks: int,
                    cap: float) -> list[int] | None:
    """Counts minimising the drift variance ``sum_e w_e**2 * share_variance(r_e, R)``.

    Every replica must carry at most ``cap`` load (``r_e >= ceil(w_e / cap)``), which keeps the
    items small enough to pack; the remaining slots are spent by an exact knapsack DP over all
    experts (heaviest first; on ties the fewest copies and the heavier expert win).
    Returns ``None`` when ``cap`` needs more than ``num_slots`` replicas.
    """
    n = len(w)
    if cap <= 0.0:
        return None
    counts = [max(1, math.ceil(x / cap - 1e-9)) for x in w]
    spare = num_slots - sum(counts)
    if spare < 0:
        return None
    if spare == 0:
        return counts
    order = sorted(range(n), key=lambda e: (-w[e], e))
    kmax = max(min(spare, 2 * num_ranks), math.ceil(spare / n))
    table = torch.tensor([0.0] + [share_variance(r, num_ranks)
                                  for r in range(1, max(counts) + kmax + 1)], dtype=torch.float64)
    w_t = torch.tensor([w[e] for e in order], dtype=torch.float64)
    base = torch.tensor([counts[e] for e in order])
    cost = (w_t * w_t)[:, None] * table[base[:, None] + torch.arange(kmax + 1)]   # [n, kmax+1]
    inf = float("inf")
    best = torch.full((spare + 1,), inf, dtype=torch.float64)
    best[0] = 0.0
    prev = torch.arange(spare + 1)[:, None] - torch.arange(kmax + 1)[None, :]   # budget before
    valid = prev >= 0
    prev = prev.clamp(min=0).flatten()
    choice = torch.empty(n, spare + 1, dtype=torch.int64)
    # NOTE: index_select/argmin/gather, not advanced indexing or min(dim): those open an
    # OpenMP region per call, slow on busy cores (see eplb._packing).
    for i in range(n):
        total = torch.where(valid, best.index_select(0, prev).view(spare + 1, kmax + 1)
                            + cost[i][None, :], inf)
        arg = total.argmin(dim=1)                            # first minimum: fewest copies
        best = total.gather(1, arg[:, None])[:, 0]
        choice[i] = arg
    assert math.isfinite(best[spare].item())
    x = spare
    for i in range(n - 1, -1, -1):
        k = int(choice[i, x])
        counts[order[i]] += k
        x -= k
    assert x == 0 and sum(counts) == num_slots
    return counts


def assign_groups(group_load: list[float], num_nodes: int, max_per_node: int,
                  old_node: list[int] | None, tol: float) -> list[int]:
    """Node of each group: groups stay whole; each node takes ``1..max_per_node`` groups.

    Up to 16 groups and 8 nodes: the exact minimum of the largest node load by depth-first
    branch and bound (groups heaviest first, LPT as the starting bound, empty nodes
    interchangeable); the search stops after ``_GROUP_SEARCH_BUDGET`` nodes and keeps its best
    (LPT at worst). Larger: LPT. With ``old_node`` (each group's node in the previous placement)
    the groups keep their old node when they can: a second exact search keeps as many as it can
    while the largest node load stays within ``(1 + tol)`` of the minimum (beyond the exact
    sizes, the old assignment is kept whole if it is within that bound).
    """
    g_count = len(group_load)
    order = sorted(range(g_count), key=lambda g: (-group_load[g], g))
    best = _lpt_groups(group_load, order, num_nodes, max_per_node)
    exact = g_count <= _EXACT_MAX_GROUPS and num_nodes <= _EXACT_MAX_NODES
    if exact:
        best = _min_max_search(group_load, order, num_nodes, max_per_node, best)
    if old_node is None:
        return best
    limit = _max_node(group_load, best, num_nodes)
    limit = limit * (1.0 + tol) + 1e-12 * max(1.0, limit)
    if not exact:
        cnt = [old_node.count(n) for n in range(num_nodes)]
        fits = all(0 <= n < num_nodes for n in old_node) and all(
            1 <= c <= max_per_node for c in cnt)
        return list(old_node) if fits and _max_node(group_load, old_node, num_nodes) <= limit \
            else best
    kept = _keep_search(group_load, order, num_nodes, max_per_node, old_node, limit)
    return kept if kept is not None else best


def _max_node(group_load: list[float], node_of: list[int], num_nodes: int) -> float:
    loads = [0.0] * num_nodes
    for g, n in enumerate(node_of):
        loads[n] += group_load[g]
    return max(loads)


def _lpt_groups(group_load, order, num_nodes, max_per_node) -> list[int]:
    loads = [0.0] * num_nodes
    cnt = [0] * num_nodes
    node_of = [0] * len(group_load)
    for g in order:
        n = min((n for n in range(num_nodes) if cnt[n] < max_per_node),
                key=lambda n: (loads[n], cnt[n], n))
        node_of[g] = n
        loads[n] += group_load[g]
        cnt[n] += 1
    return node_of


def _feasible(cnt: list[int], left: int, max_per_node: int) -> bool:
    """Can ``left`` more groups give every node at least one without passing the cap?"""
    empty = sum(1 for c in cnt if c == 0)
    room = sum(max_per_node - c for c in cnt)
    return empty <= left <= room


def _min_max_search(group_load, order, num_nodes, max_per_node, start) -> list[int]:
    total = sum(group_load)
    # The node with the heaviest group holds at least `least` groups.
    least = max(1, len(order) - (num_nodes - 1) * max_per_node)
    lightest = sorted(group_load[g] for g in order[1:])
    lower = max(total / num_nodes, group_load[order[0]] + sum(lightest[:least - 1]))
    eps = 1e-12 * max(1.0, total)
    best_val = _max_node(group_load, start, num_nodes)
    best = list(start)
    if best_val <= lower + eps:
        return best
    loads = [0.0] * num_nodes
    cnt = [0] * num_nodes
    node_of = [0] * len(group_load)
    visits = 0

    def dfs(i: int, cur_max: float) -> bool:                  # True: stop searching
        nonlocal best_val, best, visits
        visits += 1
        if visits > _GROUP_SEARCH_BUDGET:
            return True
        if i == len(order):
            if cur_max < best_val - eps:
                best_val, best = cur_max, list(node_of)
                return best_val <= lower + eps
            return False
        g = order[i]
        seen_empty = False
        for n in range(num_nodes):
            if cnt[n] >= max_per_node:
                continue
            if cnt[n] == 0:
                if seen_empty:                                # empty nodes are interchangeable
                    continue
                seen_empty = True
            before = loads[n]
            new = before + group_load[g]
            if max(cur_max, new) >= best_val - eps:
                continue
            cnt[n] += 1
            loads[n] = new
            node_of[g] = n
            ok = _feasible(cnt, len(order) - i - 1, max_per_node)
            stop = ok and dfs(i + 1, max(cur_max, new))
            cnt[n] -= 1
            loads[n] = before
            if stop:
                return True
        return False

    dfs(0, 0.0)
    return best


def _keep_search(group_load, order, num_nodes, max_per_node, old_node, limit) -> list[int] | None:
    """Fewest groups off their old node, every node load ``<= limit``; ``None`` if none found."""
    loads = [0.0] * num_nodes
    cnt = [0] * num_nodes
    node_of = [0] * len(group_load)
    best_moved = len(order) + 1
    best: list[int] | None = None
    visits = 0

    def dfs(i: int, moved: int) -> bool:
        nonlocal best_moved, best, visits
        visits += 1
        if visits > _GROUP_SEARCH_BUDGET:
            return True
        if moved >= best_moved:
            return False
        if i == len(order):
            best_moved, best = moved, list(node_of)
            return moved == 0
        g = order[i]
        prefer = old_node[g] if 0 <= old_node[g] < num_nodes else 0
        for n in [prefer] + [m for m in range(num_nodes) if m != prefer]:
            before = loads[n]
            new = before + group_load[g]
            if cnt[n] >= max_per_node or new > limit:
                continue
            cnt[n] += 1
            loads[n] = new
            node_of[g] = n
            ok = _feasible(cnt, len(order) - i - 1, max_per_node)
            stop = ok and dfs(i + 1, moved + (n != old_node[g]))
            cnt[n] -= 1
            loads[n] = before
            if stop:
                return True
        return False

    dfs(0, 0)
    return best
