"""The measured shared-expert order table ``resolve`` reads (DESIGN 4.3).

``moerun bench --shared --write-table`` times every shared-expert order (and SM partition
size) per layer shape and T on a GPU and writes ``moerun/shared_table.json`` (shipped with
the package; the command, date and device are in its ``meta``). A row is keyed by the
deployment and shape: device name, world size, local experts ``E``, ``top_k``, ``H``, ``I``,
shared ``Is``, dtype; it lists per measured T the fastest order. :func:`lookup` turns a row
into :class:`~moerun.shared_expert.SharedRegime` boundaries: a forward with ``T`` rows runs
the order measured at the smallest measured ``T' >= T`` (the largest one beyond). Each cell
holds two picks: ``order`` by the time that serves the cell (graph replay up to the bench's
``--graph-max-tokens``, eager above), used while capturing a CUDA graph, and
``eager_order`` by eager time, used by forwards issued from Python.

Pure: reads the JSON file once (cached) and its arguments.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moerun.capability import Deployment, Problem
from moerun.env import Env
from moerun.shared_expert import SharedExpertOrder, SharedRegime

__all__ = ["SHARED_TABLE_PATH", "TableRow", "lookup", "row_key", "regimes_from_cells"]

SHARED_TABLE_PATH = Path(__file__).with_name("shared_table.json")


@dataclass(frozen=True, kw_only=True)
class TableRow:
    """One matching row: its ``regimes`` (by graph-replay time), ``eager_regimes`` (by eager
    time) and a one-line ``detail`` (row key, command, date, device) for the resolution
    report."""

    regimes: tuple[SharedRegime, ...]
    detail: str
    eager_regimes: tuple[SharedRegime, ...] | None = None


def row_key(*, device: str, world_size: int, num_experts: int, top_k: int, hidden: int,
            intermediate: int, shared: int, dtype: str) -> str:
    """The string a row is stored under (also written by the benchmark). Pure; host only."""
    return (f"{device}|ws{world_size}|E{num_experts}|k{top_k}|H{hidden}|I{intermediate}"
            f"|S{shared}|{dtype}")


def regimes_from_cells(cells: list[dict[str, Any]], *, eager: bool = False
                       ) -> tuple[SharedRegime, ...]:
    """``[{"tokens": T, "order": name, "partition_sms": n | None}, ...]`` -> regimes, adjacent
    equal choices merged, the largest T's choice open-ended. ``eager``: from the cells'
    ``eager_order`` / ``eager_partition_sms`` (the pick by eager time; a cell without them
    falls back to its ``order``). Pure."""
    if not cells:
        raise ValueError("a shared-table row needs at least one measured cell")
    cells = sorted(cells, key=lambda c: int(c["tokens"]))
    regimes: list[SharedRegime] = []
    for i, cell in enumerate(cells):
        last = i == len(cells) - 1
        if eager and "eager_order" in cell:
            order, sms = cell["eager_order"], cell.get("eager_partition_sms")
        else:
            order, sms = cell["order"], cell.get("partition_sms")
        regime = SharedRegime(max_tokens=None if last else int(cell["tokens"]),
                              order=SharedExpertOrder(order), partition_sms=sms)
        if regimes and (regimes[-1].order, regimes[-1].partition_sms) == \
                (regime.order, regime.partition_sms):
            regimes[-1] = SharedRegime(max_tokens=regime.max_tokens, order=regime.order,
                                       partition_sms=regime.partition_sms)
        else:
            regimes.append(regime)
    return tuple(regimes)


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict[str, Any] | None:
    p = Path(path)
    if not p.exists():
        return None
    return json.loads(p.read_text())


def lookup(problem: Problem, deployment: Deployment, env: Env,
           path: Path | str = SHARED_TABLE_PATH) -> TableRow | None:
    """The measured regimes for this layer and deployment, or None without a row.

    Host only; reads the table file at ``path`` (cached per path)."""
    table = _load(str(path))
    if table is None or problem.device_type != "cuda":
        return None
    key = row_key(device=env.device_name, world_size=deployment.world_size,
                  num_experts=deployment.num_local_slots, top_k=problem.top_k,
                  hidden=problem.hidden_size, intermediate=problem.intermediate_size,
                  shared=problem.shared_intermediate_size,
                  dtype=str(problem.dtype).replace("torch.", ""))
    row = table.get("rows", {}).get(key)
    if row is None:
        return None
    meta = table.get("meta", {})
    detail = (f"shared table {SHARED_TABLE_PATH.name} row {key} ({meta.get('command', '?')}, "
              f"{meta.get('date', '?')}, {meta.get('device', '?')})")
    eager = regimes_from_cells(row["cells"], eager=True)
    regimes = regimes_from_cells(row["cells"])
    return TableRow(regimes=regimes, detail=detail,
                    eager_regimes=None if eager == regimes else eager)
