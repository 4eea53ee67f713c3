"""The config files ``moerun tune`` writes: a winner (:class:`TunedEntry`), reading a file's
JSON and merging winners into it with the run's provenance. Pure host code; re-exported by
``tune_plan``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from moerun.backends.triton.configs import ExpertsConfig, dtype_name
from moerun.bench.shapes import BenchShape

__all__ = ["TunedEntry", "read_config_data", "merge_entries"]


@dataclass(frozen=True, kw_only=True)
class TunedEntry:
    """A winner: ``config`` (as it runs: fitted to shared memory), median ``us`` per call in
    ``timing`` mode at ``tokens`` T, the cell's ``floor_us`` (``moerun.bench`` floor with this
    run's ceilings; None when unknown)."""

    config: ExpertsConfig
    us: float
    timing: str
    tokens: int
    floor_us: float | None = None

    def to_json(self, date: str) -> dict:
        """The entry's JSON object for a config file (config, µs, timing mode, T, ``date``, floor).

        Pure; host only."""
        d = {"config": self.config.to_json(), "us": round(self.us, 2), "timing": self.timing,
             "T": self.tokens, "date": date}
        if self.floor_us is not None:
            d["floor_us"] = round(self.floor_us, 2)
            d["floor_over_time"] = round(self.floor_us / self.us, 4)
        return d


def read_config_data(path: Path) -> dict:
    """A config file's JSON (``{"meta": {}, "entries": {}}`` when it does not exist).

    Host only; reads ``path``."""
    path = Path(path)
    if path.exists():
        return json.loads(path.read_text())
    return {"meta": {}, "entries": {}}


def merge_entries(data: dict, *, shape: BenchShape, dtype: torch.dtype | str,
                  device_name: str, command: str, date: str, versions: dict[str, str],
                  winners: dict[int, TunedEntry],
                  activation_dtype: torch.dtype | str | None = None) -> dict:
    """``data`` (a config file's JSON) with ``winners`` ({bucket: entry}) merged in: other
    buckets' entries kept, entries sorted by bucket, ``meta`` rewritten (command, date,
    device, ``versions``, the local shape, dtype, and for fp8 files the ``activations``
    dtype the kernels were timed with) with a history of the last 20 runs. A file written
    before histories were kept (no ``history``, e.g. the fp8 sweep's) starts its history with
    its old writer, so the provenance of the entries kept stays in the file. Returns a new
    dict; ``data`` is not changed. Pure; host only."""
    entries = dict(data.get("entries", {}))
    old = data.get("meta", {})
    hist = list(old.get("history", []))
    if not hist and old.get("command"):
        hist.append({"command": old["command"], "date": old.get("date"),
                     "device": old.get("device"),
                     "T": sorted(e["T"] for e in entries.values() if "T" in e),
                     **{k: old[k] for k in ("written_by", "torch", "triton") if k in old}})
    hist.append({"command": command, "date": date, "device": device_name,
                 "T": sorted(e.tokens for e in winners.values()), **versions})
    meta = {"written_by": "moerun tune (moerun/backends/triton/tune.py)", "command": command,
            "date": date, "device": device_name, **versions,
            "shape": {"name": shape.name, "S": shape.num_experts, "top_k": shape.top_k,
                      "H": shape.hidden, "I": shape.intermediate},
            "dtype": dtype_name(dtype)}
    if activation_dtype is not None:
        meta["activations"] = dtype_name(activation_dtype)
    meta["history"] = hist[-20:]
    for b, entry in winners.items():
        entries[str(b)] = entry.to_json(date)
    return {"meta": meta, "entries": dict(sorted(entries.items(), key=lambda kv: int(kv[0])))}
