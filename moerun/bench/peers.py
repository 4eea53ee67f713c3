"""Peer timings from an earlier run on another machine, scaled to this run's ceilings.

Which file: ``--peers PATH``, else the newest ``h200-*.json`` (by the date in its name) in
``<project root>/../shared/peers/``, the project root being the folder holding
``pyproject.toml`` above this package (a checkout or an editable install); when that folder
has none, ``<project root>/shared/peers/`` (a copy of the checkout that carries the shared
folder inside it, as on the GPU machine). ``fp8-h200-*.json``
files in the same folder hold FP8 figures and are never picked for the bf16 matrix (the
glob is anchored at the name's start). No file found: :func:`find_peer_file` returns None and
:func:`describe_search` says where it looked; the bench then runs without the peer column.

A peer file holds ``ceilings`` (``copy_bw`` and
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

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from moerun.bench.ceilings import Ceilings

__all__ = ["PeerTable", "PeerTime", "PEER_GLOB", "project_root", "default_peer_dirs",
           "find_peer_file", "describe_search", "load_peers"]

#: bf16 peer files; anchored at the start of the name, so ``fp8-h200-*`` never matches.
PEER_GLOB = "h200-*.json"


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
        """``table ceiling / this run's ceiling`` for a ``"memory"`` or ``"compute"`` cell.

        Pure; host only."""
        if bound == "memory":
            return self.bandwidth / ceilings.bandwidth
        return self.flops / ceilings.flops

    def best(self, *, shape: str, tokens: int, dims: tuple[int, int, int, int], mode: str,
             bound: str, ceilings: Ceilings) -> PeerTime | None:
        """Fastest peer of ``mode`` (``"graph"`` or ``"eager"``) for the cell, scaled; None
        when the table has no row with this shape name, ``T`` and ``(E, k, H, I)``.

        Pure; host only."""
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
        """One line naming the peer file, its date, device, ceilings and peers. Pure; host only."""
        return (f"{self.path} ({self.date}, {self.device}; read {self.read_bw / 1e12:.3f} TB/s, "
                f"copy r+w {self.copy_bw / 1e12:.3f} TB/s, matmul {self.flops / 1e12:.1f} "
                f"TFLOP/s; peers {', '.join(self.peers)})")


def project_root(start: Path | str | None = None) -> Path | None:
    """The nearest folder at or above ``start`` (default: this file's folder) that holds a
    ``pyproject.toml``; None when there is none (e.g. an installed, non-editable copy).

    Host only; reads the file system."""
    here = Path(start if start is not None else __file__).resolve()
    for folder in ([here] if here.is_dir() else []) + list(here.parents):
        if (folder / "pyproject.toml").is_file():
            return folder
    return None


def default_peer_dirs(root: Path | None = None) -> tuple[Path, ...]:
    """The folders searched by default, in order: ``<root>/../shared/peers`` and
    ``<root>/shared/peers`` (``root`` default :func:`project_root`; none without a root).

    Host only; reads the file system (via :func:`project_root`)."""
    root = project_root() if root is None else root
    if root is None:
        return ()
    return (root.parent / "shared" / "peers", root / "shared" / "peers")


def find_peer_file(folder: Path | str | None = None) -> str | None:
    """The newest :data:`PEER_GLOB` file of ``folder``, or of the first of
    :func:`default_peer_dirs` that has one: the greatest name (names carry ISO dates:
    ``h200-2026-12-01.json``); None when there is none. Host only; lists folders."""
    folders = default_peer_dirs() if folder is None else (Path(folder),)
    for f in folders:
        if f.is_dir():
            hits = sorted(p for p in f.glob(PEER_GLOB) if p.is_file())
            if hits:
                return str(hits[-1])
    return None


def describe_search(folder: Path | str | None = None) -> str:
    """Where :func:`find_peer_file` looked, for the "none found" message.

    Host only; reads the file system (via :func:`default_peer_dirs`)."""
    folders = default_peer_dirs() if folder is None else (Path(folder),)
    if not folders:
        return (f"no project root (a folder with pyproject.toml) above {Path(__file__).parent}, "
                "so no shared/peers to search")
    return f"no {PEER_GLOB} in {' or '.join(str(f) for f in folders)}"


def load_peers(path: str) -> PeerTable:
    """Read a peer file. ValueError names the path and the missing field.

    Host only; reads ``path``."""
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
