"""Backend choice from the shipped benchmark table (DESIGN 6: one backend per layer).

``bench_table.json`` beside this file is written by ``moerun bench --write-selection`` from a
real ``moerun bench`` run: per benchmarked shape ``(E, top_k, H, I)`` and device, the backends
ordered by geometric-mean floor/time in the serving regime (graph replay for small T, eager
above), with the command, date and device of the run. ``resolve`` asks the backends in that
order for a matching layer on a matching device, and in the default priority order otherwise;
the report says which rule chose.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moerun.capability import Problem
from moerun.env import Env

__all__ = ["TABLE_PATH", "BenchPreference", "preferred_order", "selection_table"]

TABLE_PATH = Path(__file__).with_name("bench_table.json")


@dataclass(frozen=True, kw_only=True)
class BenchPreference:
    """``order``: backend names, fastest first; ``detail``: why (for the report)."""

    order: tuple[str, ...]
    detail: str


@functools.lru_cache(maxsize=4)
def _load(path: str) -> dict[str, Any] | None:
    p = Path(path)
    return json.loads(p.read_text()) if p.exists() else None


def preferred_order(problem: Problem, env: Env, *,
                    path: Path = TABLE_PATH) -> BenchPreference | None:
    """The benchmarked order for this layer, or None when the table has no matching row
    (another shape, dtype or device). Pure apart from reading the shipped file once."""
    table = _load(str(path))
    if table is None or problem.device_type != "cuda":
        return None
    if table.get("device_name") not in env.device_name:
        return None
    if table.get("dtype") != str(problem.dtype).removeprefix("torch."):
        return None
    key = (problem.num_experts, problem.top_k, problem.hidden_size, problem.intermediate_size)
    for row in table["rows"]:
        if (row["E"], row["k"], row["H"], row["I"]) == key:
            scores = ", ".join(f"{b} {g:.3f}" for b, g in zip(row["order"], row["geomean"]))
            return BenchPreference(order=tuple(row["order"]), detail=(
                f"bench table ({table['date']}, {table['device_name']}): {row['shape']} "
                f"geomean floor/time {scores}"))
    return None


def selection_table(bench: dict[str, Any]) -> dict[str, Any]:
    """Build the table from a ``moerun bench --out`` JSON (schema ``moerun-bench/1``).

    Pure; host only."""
    per_shape: dict[tuple, dict[str, list[float]]] = {}
    names: dict[tuple, str] = {}
    for cell in bench["cells"]:
        key = (cell["E"], cell["k"], cell["H"], cell["I"])
        names[key] = cell["shape"]
        for backend, res in cell["backends"].items():
            ratio = res.get("serving_floor_ratio")
            if ratio and res.get("ok", False):
                per_shape.setdefault(key, {}).setdefault(backend, []).append(ratio)
    rows = []
    for key, by_backend in sorted(per_shape.items()):
        cells = max(len(v) for v in by_backend.values())
        ranked = sorted(((math.exp(sum(map(math.log, v)) / len(v)), b)
                         for b, v in by_backend.items() if len(v) == cells), reverse=True)
        rows.append({"shape": names[key], "E": key[0], "k": key[1], "H": key[2], "I": key[3],
                     "order": [b for _, b in ranked], "geomean": [round(g, 4) for g, _ in ranked]})
    return {"written_by": "moerun bench --write-selection", "command": bench["command"],
            "date": bench["date"], "device": bench["device"],
            "device_name": bench["device"].split(" (")[0], "dtype": bench["dtype"], "rows": rows}
