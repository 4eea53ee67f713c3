"""Packing replicas into ranks, local search, and planning one balancing domain (DESIGN 8).

Private helpers of :mod:`eplb.policy`. A *domain* is the set of ranks one packing sees: all
ranks (global policy) or one node's ranks (hierarchical policy). Inside it experts are local
ids ``0..n-1`` and ranks local ids ``0..R-1``, each with ``P`` slots; ``S = R * P`` items (one
per slot), item = one replica of expert ``e`` carrying ``w_e / r_e`` (tokens are split evenly
over replicas).

Steps for one domain (:func:`plan_domain`):

1. Candidate replica counts: DeepSeek's greedy, and drift-variance optima under two caps on the
   load of one replica (:mod:`eplb._counts`).
2. For each candidate, LPT: replicas largest first onto the least-loaded rank with a free slot,
   at most ``ceil(r_e / R)`` copies of an expert per rank while that is possible, exact load
   ties going to the node holding fewer copies of the expert.
3. Local search, nominal: swap a replica of the most loaded rank with one of another rank,
   best swap first, while it lowers the maximum.
4. Local search, robust: the same swaps on ``g_j = load_j + c * sqrt(V_j)`` (``V_j`` the rank's
   drift variance, see :mod:`eplb._counts`, ``c = DRIFT_Z * DRIFT_CV``) while no rank's load
   passes the step-3 maximum (or the mean, if higher). Among equally balanced packings this
   prefers ranks built from many medium replicas over ones dominated by one big replica.
5. Keep the candidate with the lowest ``max g`` among those whose nominal maximum is within
   ``NOMINAL_SLACK`` of the best candidate's.

With an old placement, the fresh plan's counts also start from the old packing (replicas the
counts still allow stay on their rank, the others fill the freed slots by LPT) and the searches
stop as soon as they are within ``MIGRATION_TOL / 2`` of the fresh plan's scores; that
incremental plan is used when it ends within ``MIGRATION_TOL`` and moves fewer slots, else the
fresh plan (either way :mod:`eplb.policy` then matches slots to the old ones).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from eplb._counts import greedy_counts, variance_counts

__all__ = ["DomainPlan", "plan_domain", "DRIFT_CV", "DRIFT_Z", "NOMINAL_SLACK", "MIGRATION_TOL"]

# Prior on window-to-window drift: coefficient of variation of one expert's load between two
# rebalances (a log-normal with sigma 0.3 has cv ~0.31).
DRIFT_CV = 0.3
# Weight of one standard deviation of drift in the robust score (about the expected maximum of
# a few ranks' normal deviations, net of the shared mean).
DRIFT_Z = 1.0
# Nominal max/mean a drift-robust candidate may give up against the best-balanced one.
NOMINAL_SLACK = 0.001
# How close to the fresh plan's scores an incremental (few-moves) plan must come.
MIGRATION_TOL = 0.01
# Caps on one replica's load, as fractions of the mean rank load, for the variance candidates.
_CAP_FRACTIONS = (0.5, 0.25)


@dataclass(frozen=True)
class DomainPlan:
    """One domain's packing: ``rank_experts[j]`` lists the ``P`` local experts on rank ``j``.

    ``nominal``: max/mean rank load; ``robust``: ``max_j g_j / mean``; ``moved``: slots whose
    expert differs from the old packing after the best within-rank matching (0 without one).
    """

    rank_experts: list[list[int]]
    counts: list[int]
    nominal: float
    robust: float
    moved: int


class _Search:
    """Replica-to-rank state for the local searches; tensors on CPU, float64 loads."""

    def __init__(self, w: torch.Tensor, counts: list[int], rank_experts: list[list[int]],
                 node_of_rank: list[int]):
        self.R = len(rank_experts)
        self.w = w
        self.cnt = torch.tensor(counts, dtype=torch.float64)
        self.cap = torch.tensor([-(-c // self.R) for c in counts], dtype=torch.int64)
        self.node = torch.tensor(node_of_rank, dtype=torch.int64)
        num_nodes = max(node_of_rank) + 1
        self.ncap = torch.tensor([-(-c // num_nodes) for c in counts], dtype=torch.int64)
        self.exp = torch.tensor([e for lst in rank_experts for e in lst], dtype=torch.int64)
        self.rank = torch.tensor([j for j, lst in enumerate(rank_experts) for _ in lst],
                                 dtype=torch.int64)
        self.size = w[self.exp] / self.cnt[self.exp]
        self.copies = torch.zeros(len(counts), self.R, dtype=torch.int64)
        self.copies.index_put_((self.exp, self.rank), torch.ones_like(self.exp), accumulate=True)
        self.ncopies = torch.zeros(len(counts), num_nodes, dtype=torch.int64)
        self.ncopies.index_put_((self.exp, self.node[self.rank]), torch.ones_like(self.exp),
                                accumulate=True)
        self.mean = float(w.sum()) / self.R
        self.eps = 1e-12 * max(self.mean, 1e-300)
        self._w2 = w * w
        self._inv_r = 1.0 / self.cnt
        self._loads()

    def _loads(self) -> None:
        self.load = torch.zeros(self.R, dtype=torch.float64).index_add_(0, self.rank, self.size)

    def variance(self) -> torch.Tensor:
        """``V_j`` per rank ``[R]``."""
        share = self.copies.to(torch.float64) * self._inv_r[:, None] - 1.0 / self.R
        return (self._w2[:, None] * share * share).sum(0)

    def scores(self, c: float) -> tuple[float, float]:
        """(max load, max g) divided by the mean (1.0, 1.0 for an all-zero domain)."""
        if self.mean <= 0.0:
            return 1.0, 1.0
        g = self.load + c * self.variance().clamp(min=0.0).sqrt()
        return float(self.load.max()) / self.mean, float(g.max()) / self.mean

    # NOTE: the searches use only ops that stay single-threaded on small CPU tensors
    # (elementwise, index_select, argmin/amin): advanced indexing, min(dim) and sqrt on a few
    # thousand elements open an OpenMP region, which costs milliseconds per op when the cores
    # are busy (measured on 2-core CI machines under load).

    def _pairs(self, m: int):
        """Candidate swaps of rank ``m``'s items (rows) with every other item (columns)."""
        on_m = self.rank == m
        ia = on_m.nonzero()[:, 0]
        ib = (~on_m).nonzero()[:, 0]
        ea, eb = self.exp.index_select(0, ia), self.exp.index_select(0, ib)
        rb = self.rank.index_select(0, ib)
        nb = self.node.index_select(0, rb)
        nm = int(self.node[m])
        d = self.size.index_select(0, ia)[:, None] - self.size.index_select(0, ib)[None, :]
        n_ao = self.copies.index_select(0, ea).index_select(1, rb)           # [na, nb]
        ok = (ea[:, None] != eb[None, :]) & (n_ao < self.cap.index_select(0, ea)[:, None])
        ok &= (self.copies[:, m].index_select(0, eb) < self.cap.index_select(0, eb))[None, :]
        node_ok = (self.ncopies.index_select(0, ea).index_select(1, nb)
                   < self.ncap.index_select(0, ea)[:, None])
        node_ok &= (self.ncopies[:, nm].index_select(0, eb)
                    < self.ncap.index_select(0, eb))[None, :]
        ok &= (nb == nm)[None, :] | node_ok
        return ia, ib, ea, eb, rb, d, ok, n_ao

    def _swap(self, i: int, j: int) -> None:
        ri, rj = int(self.rank[i]), int(self.rank[j])
        ei, ej = int(self.exp[i]), int(self.exp[j])
        self.rank[i], self.rank[j] = rj, ri
        self.copies[ei, ri] -= 1
        self.copies[ei, rj] += 1
        self.copies[ej, rj] -= 1
        self.copies[ej, ri] += 1
        ni, nj = int(self.node[ri]), int(self.node[rj])
        self.ncopies[ei, ni] -= 1
        self.ncopies[ei, nj] += 1
        self.ncopies[ej, nj] -= 1
        self.ncopies[ej, ni] += 1
        self._loads()

    def nominal_pass(self, stop_at: float, max_iter: int) -> None:
        """Best swap off the most loaded rank while it lowers that rank's load below the max."""
        for _ in range(max_iter):
            m = int(self.load.argmax())                      # first maximum: stable
            lm = float(self.load[m])
            if lm <= stop_at:
                return
            ia, ib, _, _, rb, d, ok, _ = self._pairs(m)
            newmax = torch.maximum(lm - d, self.load.index_select(0, rb)[None, :] + d)
            ok &= (d > self.eps) & (newmax < lm - self.eps)
            score = torch.where(ok, newmax, math.inf).flatten()
            k = int(score.argmin())
            if not math.isfinite(float(score[k])):
                return
            self._swap(int(ia[k // ib.numel()]), int(ib[k % ib.numel()]))

    def _f(self, e: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        """``w_e**2 * (n / r_e - 1/R)**2`` elementwise (``e`` broadcast against ``n``)."""
        share = n.to(torch.float64) * self._inv_r.index_select(0, e.flatten()).view(e.shape) \
            - 1.0 / self.R
        return self._w2.index_select(0, e.flatten()).view(e.shape) * share * share

    def robust_pass(self, c: float, limit: float, stop_at: float, max_iter: int) -> None:
        """Best swap off the rank with the largest ``g`` while it lowers it; loads <= ``limit``.

        Candidates are ranked with ``sqrt`` linearised at each rank's current variance (an
        upper bound, exact for an unchanged rank); the chosen swap is re-checked exactly.
        """
        floor = 1e-9 * max(self.mean, 1e-300)
        for _ in range(max_iter):
            V = self.variance().clamp(min=0.0)
            sd = [math.sqrt(v) for v in V.tolist()]
            loads = self.load.tolist()
            g = [lo + c * s for lo, s in zip(loads, sd)]
            m = max(range(self.R), key=lambda j: (g[j], -j))
            if g[m] <= stop_at:
                return
            ia, ib, ea, eb, rb, d, ok, n_ao = self._pairs(m)
            col_m = self.copies[:, m]
            n_am, n_bm = col_m.index_select(0, ea), col_m.index_select(0, eb)
            n_bo = self.copies.view(-1).index_select(0, eb * self.R + rb)
            dv_m = ((self._f(ea, n_am - 1) - self._f(ea, n_am))[:, None]
                    + (self._f(eb, n_bm + 1) - self._f(eb, n_bm))[None, :])
            ea2 = ea[:, None]
            dv_o = (self._f(ea2, n_ao + 1) - self._f(ea2, n_ao)
                    + (self._f(eb, n_bo - 1) - self._f(eb, n_bo))[None, :])
            sd_t = torch.tensor(sd, dtype=torch.float64).clamp(min=floor)
            new_lm = loads[m] - d
            new_lo = self.load.index_select(0, rb)[None, :] + d
            new_gm = new_lm + c * (sd_t[m] + dv_m / (2.0 * sd_t[m]))
            sd_o = sd_t.index_select(0, rb)[None, :]
            new_go = new_lo + c * (sd_o + dv_o / (2.0 * sd_o))
            newg = torch.maximum(new_gm, new_go)
            ok &= (newg < g[m] - self.eps) & (new_lm <= limit) & (new_lo <= limit)
            score = torch.where(ok, newg, math.inf).flatten()
            k = int(score.argmin())
            if not math.isfinite(float(score[k])):
                return
            i, j = k // ib.numel(), k % ib.numel()
            o = int(rb[j])
            v_m = max(float(V[m]) + float(dv_m[i, j]), 0.0)
            v_o = max(float(V[o]) + float(dv_o[i, j]), 0.0)
            exact = max(float(new_lm[i, j]) + c * math.sqrt(v_m),
                        float(new_lo[i, j]) + c * math.sqrt(v_o))
            if exact >= g[m] - self.eps:                     # linearisation was too optimistic
                return
            self._swap(int(ia[i]), int(ib[j]))

    def rank_experts(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.R)]
        for e, j in zip(self.exp.tolist(), self.rank.tolist()):
            out[j].append(e)
        return [sorted(lst) for lst in out]


def _lpt(w: list[float], counts: list[int], slots_per_rank: int, node_of_rank: list[int],
         fixed: list[list[int]]) -> list[list[int]]:
    """Place the replicas ``fixed`` does not already hold, largest first (see module doc)."""
    R = len(fixed)
    n = len(w)
    num_nodes = max(node_of_rank) + 1
    copies = [[0] * R for _ in range(n)]
    node_copies = [[0] * num_nodes for _ in range(n)]
    load = [0.0] * R
    free = [slots_per_rank] * R
    out = [list(lst) for lst in fixed]
    for j, lst in enumerate(fixed):
        for e in lst:
            copies[e][j] += 1
            node_copies[e][node_of_rank[j]] += 1
            load[j] += w[e] / counts[e]
            free[j] -= 1
    items = [e for e in range(n) for _ in range(counts[e] - sum(copies[e]))]
    items.sort(key=lambda e: (-w[e] / counts[e], e))
    for e in items:
        cap = -(-counts[e] // R)
        ncap = -(-counts[e] // num_nodes)
        open_ranks = [j for j in range(R) if free[j] > 0]
        pref = [j for j in open_ranks if copies[e][j] < cap]
        spread = [j for j in pref if node_copies[e][node_of_rank[j]] < ncap]
        if spread or pref:
            j = min(spread or pref, key=lambda j: (load[j], node_copies[e][node_of_rank[j]], j))
        else:                                                # unavoidable extra copy
            j = min(open_ranks, key=lambda j: (copies[e][j], load[j], j))
        out[j].append(e)
        copies[e][j] += 1
        node_copies[e][node_of_rank[j]] += 1
        load[j] += w[e] / counts[e]
        free[j] -= 1
    assert all(f == 0 for f in free)
    return out


def _moved(old: list[list[int]] | None, new: list[list[int]]) -> int:
    """Slots that must be rewritten: per rank, slots beyond the multiset overlap."""
    if old is None:
        return 0
    moved = 0
    for o, nw in zip(old, new):
        left: dict[int, int] = {}
        for e in o:
            left[e] = left.get(e, 0) + 1
        kept = 0
        for e in nw:
            if left.get(e, 0) > 0:
                left[e] -= 1
                kept += 1
        moved += len(nw) - kept
    return moved


def _keep_old(w: list[float], counts: list[int], old: list[list[int]]) -> list[list[int]]:
    """Old replicas that survive the new counts; extra copies leave the fullest ranks first."""
    R = len(old)
    n = len(w)
    kept = [[e for e in lst if 0 <= e < n] for lst in old]
    copies = [[0] * R for _ in range(n)]
    for j, lst in enumerate(kept):
        for e in lst:
            copies[e][j] += 1
    load = [sum(w[e] / counts[e] for e in lst) for lst in kept]
    for e in range(n):
        excess = sum(copies[e]) - counts[e]
        for _ in range(max(excess, 0)):
            j = max(range(R), key=lambda j: (copies[e][j], load[j], j))
            kept[j].remove(e)
            copies[e][j] -= 1
            load[j] -= w[e] / counts[e]
    return kept


def _search(w_t: torch.Tensor, counts: list[int], start: list[list[int]],
            node_of_rank: list[int], c: float, stop_nominal: float,
            stop_robust: float) -> _Search:
    st = _Search(w_t, counts, start, node_of_rank)
    if st.R == 1:                                            # nothing to swap with
        return st
    slots = int(st.exp.numel())
    st.nominal_pass(stop_nominal * st.mean, max_iter=4 * slots)
    nominal, _ = st.scores(c)
    limit = max(nominal, 1.0) * st.mean + st.eps
    st.robust_pass(c, limit, stop_robust * st.mean, max_iter=4 * slots)
    return st


def plan_domain(w: list[float], num_ranks: int, slots_per_rank: int, node_of_rank: list[int],
                old: list[list[int]] | None) -> DomainPlan:
    """Pack one domain (see module doc).

    ``w``: the domain's expert loads; ``node_of_rank``: node of each domain rank (spreading);
    ``old[j]``: rank ``j``'s previous local experts (``-1``: an expert outside the domain).
    """
    S = num_ranks * slots_per_rank
    c = DRIFT_Z * DRIFT_CV
    w_t = torch.tensor(w, dtype=torch.float64)
    mean = sum(w) / num_ranks
    greedy = greedy_counts(w, S)
    candidates = [greedy]
    biggest = max(w[e] / greedy[e] for e in range(len(w)))
    for frac in _CAP_FRACTIONS:
        counts = variance_counts(w, S, num_ranks, max(frac * mean, biggest))
        if counts is not None and counts not in candidates:
            candidates.append(counts)
    empty: list[list[int]] = [[] for _ in range(num_ranks)]
    plans = []
    for counts in candidates:
        st = _search(w_t, counts, _lpt(w, counts, slots_per_rank, node_of_rank, empty),
                     node_of_rank, c, stop_nominal=0.0, stop_robust=0.0)
        nominal, robust = st.scores(c)
        plans.append(DomainPlan(st.rank_experts(), counts, nominal, robust, 0))
    best_nominal = min(p.nominal for p in plans)
    fresh = min((p for p in plans if p.nominal <= best_nominal + NOMINAL_SLACK),
                key=lambda p: p.robust)
    if old is None:
        return fresh
    fresh = DomainPlan(fresh.rank_experts, fresh.counts, fresh.nominal, fresh.robust,
                       _moved(old, fresh.rank_experts))
    # Counts always follow the current window (they are cheap to change: one slot each);
    # ``old`` only decides where the replicas go.
    start = _lpt(w, fresh.counts, slots_per_rank, node_of_rank, _keep_old(w, fresh.counts, old))
    st = _search(w_t, fresh.counts, start, node_of_rank, c,
                 stop_nominal=fresh.nominal + MIGRATION_TOL / 2,
                 stop_robust=fresh.robust * (1.0 + MIGRATION_TOL / 2))
    nominal, robust = st.scores(c)
    packed = st.rank_experts()
    incremental = DomainPlan(packed, fresh.counts, nominal, robust, _moved(old, packed))
    good = (nominal <= fresh.nominal + MIGRATION_TOL
            and robust <= fresh.robust * (1.0 + MIGRATION_TOL))
    best = incremental if good and incremental.moved < fresh.moved else fresh
    return best
