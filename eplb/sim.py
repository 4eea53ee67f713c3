"""EPLB simulator: synthetic and recorded loads, imbalance figures, DeepSeek's EPLB as baseline.

The ``moerun eplb-sim`` command is :mod:`eplb.sim_cli`. Everything here is CPU-only and
deterministic for a given seed (each generator is a local ``torch.Generator``).

Legend: ``L`` layers, ``E`` experts, ``S`` slots, ``R`` ranks, ``D`` drift draws, ``T`` windows.

Figures:

- *imbalance* of a placement on a load: ``max_r load_r / mean_r load_r`` with each expert's
  tokens split evenly over its replicas (what DESIGN 8's routing does); 1.0 for an all-zero
  layer. *Before* is the no-redundancy contiguous placement (``S == E``, expert ``e`` on rank
  ``e // (E / R)``).
- *moved*: slots whose logical expert changed between two placements; bytes moved are that
  times one expert's bytes, a full reload is ``S`` times.
- *drift*: plan on ``A``, measure on ``A * exp(sigma * N(0, 1))`` drawn per expert.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import torch

from eplb.placement import Placement, placement_from_phy2log
from eplb.policy import _check_load, _check_sizes, default_placement, rebalance

__all__ = [
    "CaseResult", "DriftResult", "deepseek_rebalance", "uniform_load", "zipf_load", "hot_load",
    "drift_factors", "rank_loads", "imbalance", "contiguous_imbalance", "slots_moved",
    "hierarchical_bound", "simulate_known", "simulate_drift", "simulate_sequence",
]

Policy = Callable[..., Placement]


# ----------------------------------------------------------------------------- loads


def _sample(probs_LE: torch.Tensor, tokens: int, gen: torch.Generator) -> torch.Tensor:
    """Token counts ``[L, E]`` int64: ``tokens`` draws per layer from ``probs_LE``."""
    L, E = probs_LE.shape
    if tokens <= 0:
        return torch.zeros(L, E, dtype=torch.int64)
    ids = torch.multinomial(probs_LE, tokens, replacement=True, generator=gen)
    return torch.zeros(L, E, dtype=torch.int64).scatter_add_(1, ids, torch.ones_like(ids))


def uniform_load(num_experts: int, tokens: int, seed: int, num_layers: int = 1) -> torch.Tensor:
    """``[L, E]`` int64 token counts, every expert equally likely.

    Pure; host only (CPU tensors, own generator)."""
    gen = torch.Generator().manual_seed(seed)
    return _sample(torch.full((num_layers, num_experts), 1.0 / num_experts,
                              dtype=torch.float64), tokens, gen)


def zipf_load(num_experts: int, s: float, tokens: int, seed: int,
              num_layers: int = 1) -> torch.Tensor:
    """``[L, E]`` int64 token counts: P(k-th most popular) ∝ ``k**-s`` over a random permutation
    of the experts (one per layer). Pure; host only (CPU tensors, own generator)."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.arange(1, num_experts + 1, dtype=torch.float64) ** (-s)
    p = p / p.sum()
    probs = torch.empty(num_layers, num_experts, dtype=torch.float64)
    for layer in range(num_layers):
        probs[layer, torch.randperm(num_experts, generator=gen)] = p
    return _sample(probs, tokens, gen)


def hot_load(num_experts: int, tokens: int, seed: int, hot_share: float = 0.3,
             num_layers: int = 1) -> torch.Tensor:
    """``[L, E]`` int64 token counts: expert 0 draws ``hot_share`` of tokens, the rest uniform.

    Pure; host only (CPU tensors, own generator)."""
    gen = torch.Generator().manual_seed(seed)
    probs = torch.full((num_layers, num_experts), (1.0 - hot_share) / max(num_experts - 1, 1),
                       dtype=torch.float64)
    probs[:, 0] = hot_share if num_experts > 1 else 1.0
    return _sample(probs, tokens, gen)


def drift_factors(num_experts: int, sigma: float, draws: int, seed: int,
                  num_layers: int = 1) -> torch.Tensor:
    """``[D, L, E]`` float64 log-normal(0, sigma) factors, one per expert per draw.

    Pure; host only (CPU tensors, own generator)."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(draws, num_layers, num_experts, generator=gen, dtype=torch.float64)
    return torch.exp(sigma * z)


# ----------------------------------------------------------------------------- metrics


def rank_loads(phy2log: torch.Tensor, load: torch.Tensor, num_ranks: int) -> torch.Tensor:
    """``[..., L, R]`` float64 rank loads of ``phy2log [L, S]`` on ``load [..., L, E]``.

    Pure; host only (CPU tensors)."""
    L, S = phy2log.shape
    E = load.shape[-1]
    cnt = torch.zeros(L, E, dtype=torch.float64).scatter_add_(
        1, phy2log, torch.ones(L, S, dtype=torch.float64))
    share = torch.zeros(L, E, num_ranks, dtype=torch.float64)  # fraction of e's tokens on rank
    rank = (torch.arange(S) // (S // num_ranks)).expand(L, S)
    share.view(L, -1).scatter_add_(1, phy2log * num_ranks + rank,
                                   1.0 / cnt.gather(1, phy2log))
    return torch.einsum("...le,ler->...lr", load.to(torch.float64), share)


def imbalance(phy2log: torch.Tensor, load: torch.Tensor, num_ranks: int) -> torch.Tensor:
    """``[..., L]`` max/mean rank load (1.0 where a layer's load is all zero).

    Pure; host only (CPU tensors)."""
    rl = rank_loads(phy2log, load, num_ranks)
    mean = rl.mean(-1)
    return torch.where(mean > 0, rl.max(-1).values / mean.clamp(min=1e-300), 1.0)


def contiguous_imbalance(load: torch.Tensor, num_ranks: int) -> torch.Tensor:
    """``[..., L]`` imbalance of the no-redundancy placement (slot ``e`` = expert ``e``).

    Pure; host only (CPU tensors)."""
    L, E = load.shape[-2:]
    if E % num_ranks:
        raise ValueError(f"experts={E} must be a multiple of ranks={num_ranks} for the "
                         "no-redundancy 'before' placement")
    return imbalance(torch.arange(E).expand(L, E), load, num_ranks)


def slots_moved(old_phy2log: torch.Tensor, new_phy2log: torch.Tensor) -> torch.Tensor:
    """``[L]`` int64: slots whose logical expert changed (each moves one expert's weights).

    Pure; no host sync."""
    return (old_phy2log != new_phy2log).sum(-1)


def hierarchical_bound(load_E: torch.Tensor, num_slots: int, num_groups: int, num_nodes: int,
                       num_ranks: int) -> float:
    """Lower bound on the max rank load with groups kept whole on nodes (one layer).

    ``max(total / R, min over group->node splits of max node load / (R / N))``, the split
    exhaustive over every assignment where each node takes between 1 and
    ``(S / N) // (E / G)`` groups (``N ** G <= 2**20``).

    Host only (``.tolist()`` / ``float()`` of ``load_E``: a host sync if it is on a device).
    """
    if num_nodes ** num_groups > 2 ** 20:
        raise ValueError(f"exhaustive bound over {num_nodes}**{num_groups} splits is too large")
    E = load_E.numel()
    size = E // num_groups
    cap = (num_slots // num_nodes) // size
    groups = load_E.to(torch.float64).reshape(num_groups, size).sum(1).tolist()
    best = float("inf")
    for assign in itertools.product(range(num_nodes), repeat=num_groups):
        counts = [assign.count(n) for n in range(num_nodes)]
        if min(counts) < 1 or max(counts) > cap:
            continue
        node = [0.0] * num_nodes
        for g, n in enumerate(assign):
            node[n] += groups[g]
        best = min(best, max(node))
    total = float(load_E.to(torch.float64).sum())
    return max(best / (num_ranks // num_nodes), total / num_ranks)


# ----------------------------------------------------------------------------- DeepSeek EPLB


def _balanced_packing(weight_LN: torch.Tensor, num_packs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's packing: items heaviest first onto the lightest pack that has room.

    Every pack gets ``N / num_packs`` items. Returns (pack, position in pack), each ``[L, N]``.
    """
    L, n = weight_LN.shape
    per = n // num_packs
    if per == 1:
        return torch.arange(n).expand(L, n).clone(), torch.zeros(L, n, dtype=torch.int64)
    order = weight_LN.sort(dim=-1, descending=True, stable=True).indices
    pack = torch.full((L, n), -1, dtype=torch.int64)
    pos = torch.full((L, n), -1, dtype=torch.int64)
    for layer in range(L):
        sums = [0.0] * num_packs
        used = [0] * num_packs
        row = weight_LN[layer].tolist()
        for item in order[layer].tolist():
            p = min((q for q in range(num_packs) if used[q] < per), key=sums.__getitem__)
            pack[layer, item], pos[layer, item] = p, used[p]
            sums[p] += row[item]
            used[p] += 1
    return pack, pos


def _replicate(weight_LN: torch.Tensor, num_phy: int):
    """DeepSeek's replication: each redundant slot to the expert with the max load per replica.

    Returns ``phy2log [L, num_phy]``, each slot's replica index ``[L, num_phy]``, counts ``[L, N]``.
    """
    L, n = weight_LN.shape
    phy2log = torch.arange(num_phy).repeat(L, 1)
    replica = torch.zeros(L, num_phy, dtype=torch.int64)
    cnt = torch.ones(L, n, dtype=torch.int64)
    rows = torch.arange(L)
    for i in range(n, num_phy):
        pick = (weight_LN / cnt).max(dim=-1).indices
        phy2log[:, i] = pick
        replica[:, i] = cnt[rows, pick]
        cnt[rows, pick] += 1
    return phy2log, replica, cnt


def _inverse(perm: torch.Tensor) -> torch.Tensor:
    inv = torch.empty_like(perm)
    return inv.scatter_(1, perm, torch.arange(perm.shape[1]).expand(perm.shape).contiguous())


def _deepseek_hierarchical(w_LE: torch.Tensor, S: int, G: int, N: int, R: int) -> torch.Tensor:
    L, E = w_LE.shape
    size, per_node_g, per_rank = E // G, G // N, S // R
    # 1. groups -> nodes by balanced packing; relabel experts node-major ("mlog").
    group_pack, group_pos = _balanced_packing(w_LE.reshape(L, G, size).sum(-1), N)
    log2mlog = (((group_pack * per_node_g + group_pos) * size).unsqueeze(-1)
                + torch.arange(size)).flatten(-2)
    mlog2log = _inverse(log2mlog)
    # 2. replicate within each node.
    w_mlog = w_LE.gather(-1, mlog2log).reshape(L * N, E // N)
    phy2mlog, _, cnt = _replicate(w_mlog, S // N)
    # 3. pack each node's replicas onto its ranks.
    w_phy = (w_mlog / cnt).gather(-1, phy2mlog)
    pack, pos = _balanced_packing(w_phy, R // N)
    pphy2phy = _inverse(pack * per_rank + pos)
    pphy2mlog = phy2mlog.gather(-1, pphy2phy)
    pphy2mlog = (pphy2mlog.reshape(L, N, -1) + torch.arange(0, E, E // N).reshape(1, N, 1))
    return mlog2log.gather(-1, pphy2mlog.flatten(-2))


def deepseek_rebalance(load: torch.Tensor, num_slots: int, num_groups: int, num_nodes: int,
                       num_ranks: int, old_phy2log: torch.Tensor | None = None) -> Placement:
    """DeepSeek's published EPLB, re-implemented from its description, for comparison only.

    Replicas by the max-load-per-replica greedy; replicas packed onto ranks by sorted balanced
    packing (no local search, copies of one expert may share a rank). Hierarchical when
    ``num_groups % num_nodes == 0`` (groups -> nodes by balanced packing, equal groups per
    node; replicate within a node; pack onto the node's ranks), else the same with one group
    and one node. ``old_phy2log`` is accepted for signature parity and ignored (the published
    algorithm does not keep slots). Same validation as :func:`eplb.rebalance`.

    Host only: copies ``load`` to the CPU first (a host sync if it is on a device).
    """
    w = _check_load(load)
    L, E = w.shape
    _check_sizes(E, num_slots, num_groups, num_nodes, num_ranks)
    if num_groups % num_nodes == 0:
        phy2log = _deepseek_hierarchical(w, num_slots, num_groups, num_nodes, num_ranks)
    else:
        phy2log = _deepseek_hierarchical(w, num_slots, 1, 1, num_ranks)
    return placement_from_phy2log(phy2log, E)


# ----------------------------------------------------------------------------- simulations


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    """A known-load case; every field ``[L]`` float64 (``moved`` = fraction of a full reload).

    ``moved``/``deepseek_moved``: first rebalance from :func:`eplb.default_placement` (ours
    given it as ``old_phy2log``). ``bound``: hierarchical lower bound / mean, or ``None``.
    """

    before: torch.Tensor
    after: torch.Tensor
    deepseek: torch.Tensor
    moved: torch.Tensor
    deepseek_moved: torch.Tensor
    bound: torch.Tensor | None


@dataclass(frozen=True, kw_only=True)
class DriftResult:
    """Plan on ``A``, measure on ``A * factors``; ``[D, L]`` float64 per-draw figures.

    ``after``/``deepseek``/``before``: imbalance of each plan on the drifted loads.
    ``replan_after``: ours re-planned on the drifted load with ``old_phy2log`` (imbalance on it);
    ``replan_moved``: its moved fraction; ``deepseek_replan_moved``: DeepSeek's two plans'
    moved fraction. Re-plans cover the first ``replans`` draws only (``[replans, L]``).
    """

    before: torch.Tensor
    after: torch.Tensor
    deepseek: torch.Tensor
    replan_after: torch.Tensor
    replan_moved: torch.Tensor
    deepseek_replan_after: torch.Tensor
    deepseek_replan_moved: torch.Tensor


def simulate_known(load: torch.Tensor, num_slots: int, num_groups: int, num_nodes: int,
                   num_ranks: int, policy: Policy = rebalance,
                   baseline: Policy = deepseek_rebalance) -> CaseResult:
    """Plan on ``load [L, E]`` and measure on the same load. Host only (CPU tensors)."""
    L, E = load.shape
    sizes = (num_slots, num_groups, num_nodes, num_ranks)
    ours = policy(load, *sizes)
    ds = baseline(load, *sizes)
    start = default_placement(E, *sizes, num_layers=L).phy2log
    ours_from_start = policy(load, *sizes, old_phy2log=start)
    bound = None
    if num_groups % num_nodes == 0 and num_nodes > 1 and num_nodes ** num_groups <= 2 ** 20:
        mean = load.to(torch.float64).sum(-1) / num_ranks
        bound = torch.tensor([hierarchical_bound(load[layer], *sizes) for layer in range(L)],
                             dtype=torch.float64) / mean
    return CaseResult(
        before=contiguous_imbalance(load, num_ranks),
        after=imbalance(ours.phy2log, load, num_ranks),
        deepseek=imbalance(ds.phy2log, load, num_ranks),
        moved=slots_moved(start, ours_from_start.phy2log) / num_slots,
        deepseek_moved=slots_moved(start, ds.phy2log) / num_slots,
        bound=bound)


def simulate_drift(load: torch.Tensor, num_slots: int, num_groups: int, num_nodes: int,
                   num_ranks: int, *, sigma: float, draws: int, seed: int, replans: int,
                   policy: Policy = rebalance,
                   baseline: Policy = deepseek_rebalance) -> DriftResult:
    """Plan on ``load [L, E]``, measure on ``draws`` log-normal drifts, re-plan ``replans``.

    Host only (CPU tensors)."""
    L, E = load.shape
    sizes = (num_slots, num_groups, num_nodes, num_ranks)
    ours = policy(load, *sizes)
    ds = baseline(load, *sizes)
    drifted = load.to(torch.float64) * drift_factors(E, sigma, draws, seed, L)    # [D, L, E]
    replan_after, replan_moved, ds_after, ds_moved = [], [], [], []
    for d in range(min(replans, draws)):
        new = policy(drifted[d], *sizes, old_phy2log=ours.phy2log)
        replan_after.append(imbalance(new.phy2log, drifted[d], num_ranks))
        replan_moved.append(slots_moved(ours.phy2log, new.phy2log) / num_slots)
        ds_new = baseline(drifted[d], *sizes)
        ds_after.append(imbalance(ds_new.phy2log, drifted[d], num_ranks))
        ds_moved.append(slots_moved(ds.phy2log, ds_new.phy2log) / num_slots)

    def stack(xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(xs).to(torch.float64) if xs else torch.zeros(0, L, dtype=torch.float64)

    return DriftResult(
        before=contiguous_imbalance(drifted, num_ranks),
        after=imbalance(ours.phy2log, drifted, num_ranks),
        deepseek=imbalance(ds.phy2log, drifted, num_ranks),
        replan_after=stack(replan_after), replan_moved=stack(replan_moved),
        deepseek_replan_after=stack(ds_after), deepseek_replan_moved=stack(ds_moved))


def simulate_sequence(loads: torch.Tensor, num_slots: int, num_groups: int, num_nodes: int,
                      num_ranks: int, policy: Policy = rebalance,
                      baseline: Policy = deepseek_rebalance) -> dict[str, torch.Tensor]:
    """Recorded windows ``loads [T, L, E]``: plan on window ``t``, measure on window ``t + 1``.

    Ours re-plans with the previous plan as ``old_phy2log`` (the first from the default
    placement). Returns ``[T - 1, L]`` tensors: ``before``, ``after``, ``deepseek``, ``moved``,
    ``deepseek_moved`` (fractions of a full reload per rebalance).

    Host only (CPU tensors).
    """
    T, L, E = loads.shape
    sizes = (num_slots, num_groups, num_nodes, num_ranks)
    old = default_placement(E, *sizes, num_layers=L).phy2log
    ds_old = old
    keys = ("before", "after", "deepseek", "moved", "deepseek_moved")
    out: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
    for t in range(T - 1):
        ours = policy(loads[t], *sizes, old_phy2log=old)
        ds = baseline(loads[t], *sizes)
        nxt = loads[t + 1]
        out["before"].append(contiguous_imbalance(nxt, num_ranks))
        out["after"].append(imbalance(ours.phy2log, nxt, num_ranks))
        out["deepseek"].append(imbalance(ds.phy2log, nxt, num_ranks))
        out["moved"].append(slots_moved(old, ours.phy2log) / num_slots)
        out["deepseek_moved"].append(slots_moved(ds_old, ds.phy2log) / num_slots)
        old, ds_old = ours.phy2log, ds.phy2log
    return {k: torch.stack(v).to(torch.float64) if v else torch.zeros(0, L, dtype=torch.float64)
            for k, v in out.items()}
