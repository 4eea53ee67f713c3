"""Derived numbers of a benchmark run: floor/time, serving mode, peer ratios, summaries.

Serving regime: CUDA-graph replay for ``T <= graph_max_tokens`` (when it was timed), eager
otherwise (EP-local cells are timed eager only, so they are served eager). ``vs_peer`` = best scaled peer time / our time in the same mode (> 1: faster than
every peer); ``vs_peer_eager`` the same with eager times on both sides. Summaries are per
backend and cell group (``model``: the 20 whole-layer cells; ``ep-local``: the 8 EP-local
cells), the geomeans the issue bars use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from moerun.bench.ceilings import Ceilings
from moerun.bench.matrix import BackendResult, CellResult
from moerun.bench.peers import PeerTable, PeerTime
from moerun.bench.shapes import GROUPS

__all__ = ["BackendView", "BackendSummary", "analyze_cell", "summarize", "geomean"]


@dataclass(frozen=True, kw_only=True)
class BackendView:
    """One backend in one cell with its derived numbers (``*_eff`` = floor / time)."""

    result: BackendResult
    eager_eff: float | None
    graph_eff: float | None
    serving_mode: str | None  # "graph" / "eager" / None (not timed)
    serving_us: float | None
    serving_eff: float | None
    peer: PeerTime | None  # best peer in the serving mode, scaled
    vs_peer: float | None
    peer_eager: PeerTime | None
    vs_peer_eager: float | None

    @property
    def name(self) -> str:
        return self.result.name


@dataclass(frozen=True, kw_only=True)
class BackendSummary:
    """Over the cells of one ``group`` a backend was timed in: ``geomean_eff`` of serving
    floor/time, the ``worst`` cell label and its ``worst_eff``, ``geomean_vs_peer`` over
    cells with a peer, ``failures`` (cells where the check failed or the run raised),
    ``heuristic_cells`` (cells whose kernel configuration was the heuristic)."""

    name: str
    group: str
    cells: int
    geomean_eff: float | None
    worst: str
    worst_eff: float | None
    geomean_vs_peer: float | None
    peer_cells: int
    failures: int
    heuristic_cells: int = 0


def geomean(values: list[float]) -> float | None:
    """Geometric mean of positive values; None for an empty list. Pure; host only."""
    vals = [v for v in values if v is not None and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def _eff(floor_us: float, us: float | None) -> float | None:
    return None if not us else floor_us / us


def analyze_cell(cell: CellResult, ceilings: Ceilings, peers: PeerTable | None,
                 graph_max_tokens: int) -> list[BackendView]:
    """Derive floor/time and peer ratios for every backend of ``cell``. Pure; host only."""
    floor_us, bound = cell.floor.us, cell.floor.bound
    dims = (cell.num_experts, cell.top_k, cell.hidden, cell.intermediate)
    views = []
    for res in cell.results:
        if cell.tokens <= graph_max_tokens and res.graph_us is not None:
            mode, us = "graph", res.graph_us
        elif res.eager_us is not None:
            mode, us = "eager", res.eager_us
        else:
            mode, us = None, None
        peer = peer_eager = None
        if peers is not None and mode is not None:
            peer = peers.best(shape=cell.shape, tokens=cell.tokens, dims=dims, mode=mode,
                              bound=bound, ceilings=ceilings)
            peer_eager = peers.best(shape=cell.shape, tokens=cell.tokens, dims=dims,
                                    mode="eager", bound=bound, ceilings=ceilings)
        views.append(BackendView(
            result=res, eager_eff=_eff(floor_us, res.eager_us),
            graph_eff=_eff(floor_us, res.graph_us), serving_mode=mode, serving_us=us,
            serving_eff=_eff(floor_us, us), peer=peer,
            vs_peer=None if peer is None or not us else peer.scaled_us / us,
            peer_eager=peer_eager,
            vs_peer_eager=(None if peer_eager is None or not res.eager_us
                           else peer_eager.scaled_us / res.eager_us)))
    return views


def summarize(cells: list[CellResult], views: list[list[BackendView]]) -> list[BackendSummary]:
    """One :class:`BackendSummary` per (group, backend): groups in :data:`GROUPS` order,
    backends in first-seen order. Pure; host only."""
    names = list(dict.fromkeys(v.name for vs in views for v in vs))
    groups = sorted({c.group for c in cells}, key=lambda g: (GROUPS.index(g)
                                                            if g in GROUPS else len(GROUPS), g))
    out = []
    for group in groups:
        for name in names:
            effs, peer_ratios, failures, heuristic = [], [], 0, 0
            worst, worst_eff = "-", None
            seen = False
            for cell, vs in zip(cells, views):
                if cell.group != group:
                    continue
                for v in vs:
                    if v.name != name:
                        continue
                    seen = True
                    failures += not v.result.ok
                    heuristic += v.result.config.startswith("heuristic")
                    if v.serving_eff is None:
                        continue
                    effs.append(v.serving_eff)
                    if worst_eff is None or v.serving_eff < worst_eff:
                        worst_eff = v.serving_eff
                        worst = f"{cell.shape} T={cell.tokens} ({v.serving_mode})"
                    if v.vs_peer is not None:
                        peer_ratios.append(v.vs_peer)
            if not seen:
                continue
            out.append(BackendSummary(name=name, group=group, cells=len(effs),
                                      geomean_eff=geomean(effs), worst=worst,
                                      worst_eff=worst_eff,
                                      geomean_vs_peer=geomean(peer_ratios),
                                      peer_cells=len(peer_ratios), failures=failures,
                                      heuristic_cells=heuristic))
    return out
