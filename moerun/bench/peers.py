"""Peer timings from an earlier run on another machine, scaled to this run's ceilings.

A peer file (``/work/shared/peers/h200-*.json``) holds ``ceilings`` (``copy_bw`` and
``read_bw`` in B/s, ``bf16_peak`` in FLOP/s) and ``rows`` with ``shape``, ``T``, ``E``, ``k``,
``H``, ``I`` and, per peer ``P``, ``P_us`` (eager) and ``P_graph_us`` (graph replay).

Scaling: a peer time measured under the table's ceilings becomes, on this machine,
``peer_us * table_ceiling / this_ceiling`` where the ceiling is the bandwidth for a
memory-bound cell and the matmul rate for a compute-bound one (bound = the larger term of
this run's floor). Bandwidth is ``max(read_bw, copy_bw)`` on both sides, copy counted as bytes
read plus written (the file's own ``floor_us`` divides ``copy_bw`` by 2; using one definition
on both sides makes a machine equal to the table's scale by exactly 1).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field

from moerun.bench.ceilings import Ceilings

__all__ = ["PeerTable", "PeerTime", "DEFAULT_PEER_GLOBS", "find_peer_file", "load_peers"]

DEFAULT_PEER_GLOBS = ("/work/shared/peers/h200-*.json", "shared/peers/h200-*.json")


@dataclass(frozen=True, kw_only=True)
class PeerTime:
    """The best peer for one cell and mode: ``name``, ``raw_us`` as measured there,
    ``scaled_us`` on this machine, ``scale`` the factor used."""

    name: str
    raw_us: float
    scaled_us: float
    scale: float


@dataclass(frozen=True, kw_only=True)
class PeerTable:
    """A loaded peer file: ``path``, ``date``, ``device``, ceilings, and its rows keyed by
    ``(shape, T)``; ``peers`` are the peer names found in the rows."""

    path: str
    date: str
    device: str
    read_bw: float
    copy_bw: float
    flops: float
    rows: dict = field(repr=False)
    peers: tuple[str, ...] = ()

    @property
    def bandwidth(self) -> float:
        return max(self.read_bw, self.copy_bw)

    def scale_for(self, bound: str, ceilings: Ceilings) -> float:
        """``table ceiling / this run's ceiling`` for a ``"memory"`` or ``"compute"`` cell."""
        if bound == "memory":
            return self.bandwidth / ceilings.bandwidth
        return self.flops / ceilings.flops

    def best(self, *, shape: str, tokens: int, dims: tuple[int, int, int, int], mode: str,
             bound: str, ceilings: Ceilings) -> PeerTime | None:
        """Fastest peer of ``mode`` (``"graph"`` or ``"eager"``) for the cell, scaled; None
        when the table has no row with this shape name, ``T`` and ``(E, k, H, I)``."""
        row = self.rows.get((shape, tokens))
        if row is None or (row.get("E"), row.get("k"), row.get("H"), row.get("I")) != dims:
            return None
        suffix = "_graph_us" if mode == "graph" else "_us"
        times = {p: row[p + suffix] for p in self.peers
                 if isinstance(row.get(p + suffix), (int, float))}
        if not times:
            return None
        name = min(times, key=times.get)
        scale = self.scale_for(bound, ceilings)
        return PeerTime(name=name, raw_us=float(times[name]), scaled_us=times[name] * scale,
                        scale=scale)

    def describe(self) -> str:
        return (f"{self.path} ({self.date}, {self.device}; read {self.read_bw / 1e12:.3f} TB/s, "
                f"copy r+w {self.copy_bw / 1e12:.3f} TB/s, matmul {self.flops / 1e12:.1f} "
                f"TFLOP/s; peers {', '.join(self.peers)})")


def find_peer_file(globs: tuple[str, ...] = DEFAULT_PEER_GLOBS) -> str | None:
    """The newest (by name) file matching the first glob that matches anything, or None."""
    for pattern in globs:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def load_peers(path: str) -> PeerTable:
    """Read a peer file. ValueError names the path and the missing field."""
    with open(path) as f:
        data = json.load(f)
    try:
        ceil = data["ceilings"]
        read_bw, copy_bw, flops = (float(ceil["read_bw"]), float(ceil["copy_bw"]),
                                   float(ceil["bf16_peak"]))
        rows = {(r["shape"], int(r["T"])): r for r in data["rows"]}
    except (KeyError, TypeError) as exc:
        raise ValueError(f"peer file {path}: missing field {exc}") from None
    names: list[str] = []
    for row in rows.values():
        for key in row:
            if key.endswith("_us") and key != "floor_us":
                name = key[: -len("_graph_us")] if key.endswith("_graph_us") else key[:-3]
                if name not in names:
                    names.append(name)
    return PeerTable(path=os.path.abspath(path), date=str(data.get("date", "?")),
                     device=str(data.get("device", "?")), read_bw=read_bw, copy_bw=copy_bw,
                     flops=flops, rows=rows, peers=tuple(names))
