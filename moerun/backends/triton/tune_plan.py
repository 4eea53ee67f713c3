"""What ``moerun tune`` will time and what it writes: the pruned candidate space per point,
the plan (points, incumbents, target files) and the merge of winners into a config file.

Pure host code (no triton, no GPU): ``moerun tune --plan`` prints a plan on any machine, and
the tests check the space and the file round trip on a CPU. Legend: ``S`` local slots (the
bench shape's ``num_experts``), ``K`` top-k, ``H`` hidden, ``I`` intermediate, ``T`` rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from moerun.backends.triton.configs import (SMEM_LIMIT, DownConfig, ExpertsConfig,
                                            GateUpConfig, bucket_of, config_file_name,
                                            default_config, dtype_name)
from moerun.bench.shapes import BenchShape

__all__ = ["MAX_CONFIGS", "NUM_SMS", "DownChoice", "CandidateSet", "TunePoint", "TunedEntry",
           "candidates", "plan_points", "point_mode", "read_config_data", "merge_entries",
           "compile_configs"]

#: Configs timed per point at most (the incumbent included).
MAX_CONFIGS = 24
#: Streaming multiprocessors the pruning assumes (H100/H200 SXM).
NUM_SMS = 132


@dataclass(frozen=True, kw_only=True)
class DownChoice:
    """A down-GEMM tile with the combine it runs under (``"atomic"`` / ``"reduce"``)."""

    down: DownConfig
    combine: str


@dataclass(frozen=True, kw_only=True)
class CandidateSet:
    """The candidates of one ``block_m``: gate/up tiles (timed alone first) and down tiles
    (timed as whole calls with the best gate/up tile)."""

    block_m: int
    gate_ups: tuple[GateUpConfig, ...]
    downs: tuple[DownChoice, ...]

    @property
    def size(self) -> int:
        return len(self.gate_ups) + len(self.downs)


@dataclass(frozen=True, kw_only=True)
class TunePoint:
    """One ``(shape, T)`` to tune.

    Fields: ``shape``; ``tokens`` T; ``bucket`` (the entry it writes); ``mode`` ``"graph"``
    or ``"eager"`` (the bench's serving regime for the cell); ``incumbent`` (the file's entry
    for the bucket, else the heuristic) and ``incumbent_source`` (``"tuned (<file>)"`` /
    ``"heuristic"``); ``candidate_sets``; ``file_name`` (the config file it merges into,
    keyed by the local shape).
    """

    shape: BenchShape
    tokens: int
    bucket: int
    mode: str
    incumbent: ExpertsConfig
    incumbent_source: str
    candidate_sets: tuple[CandidateSet, ...]
    file_name: str

    @property
    def num_configs(self) -> int:
        """Configs timed for this point: every candidate plus the incumbent."""
        return sum(c.size for c in self.candidate_sets) + 1


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
        d = {"config": self.config.to_json(), "us": round(self.us, 2), "timing": self.timing,
             "T": self.tokens, "date": date}
        if self.floor_us is not None:
            d["floor_us"] = round(self.floor_us, 2)
            d["floor_over_time"] = round(self.floor_us / self.us, 4)
        return d


def candidates(num_slots: int, top_k: int, hidden: int, inter: int, tokens: int,
               elt: int = 2) -> list[CandidateSet]:
    """Pruned search space for one point, at most ``MAX_CONFIGS - 1`` configs in all.

    Decode-like points (<= 32 rows per hit expert) get narrow, deep-pipelined tiles and
    split-K/atomic down candidates; prefill points get 64/128-row wgmma-sized tiles and both
    combines. Tiles over the shared-memory limit for ``elt``-byte elements are dropped.
    """
    G, D = GateUpConfig, DownConfig
    big_i, big_h = inter, hidden
    pairs = tokens * top_k
    hit = min(num_slots, pairs)
    tpe = pairs / hit
    if tpe <= 12:
        bms = [16]
    elif tpe <= 24:
        bms = [16, 32]
    elif tpe <= 48:
        bms = [32, 64]
    elif tpe <= 160:
        bms = [64, 128]
    else:
        bms = [128, 64]
    out: list[tuple[int, list, list]] = []
    for bm in bms:
        blocks = max(1, round(hit * max(1.0, tpe / bm)))
        if bm <= 32:  # memory-bound: weights streamed once; tiles differ little (call 1)
            # (the 3-stage n128k128 / n64k256 tiles exceed the 200 KiB the lookup allows:
            # listed with the stage count that actually runs)
            gus = [G(block_n=64, block_k=128, num_stages=4), G(block_n=64, block_k=128, num_stages=5),
                   G(block_n=64, block_k=256, num_stages=2),
                   G(block_n=128, block_k=128, num_warps=8, num_stages=2),
                   G(block_n=32, block_k=256, num_stages=3), G(block_n=32, block_k=128, num_stages=4)]
            if blocks * big_i // 64 < 2 * NUM_SMS:  # too few programs: narrower tiles first
                gus = [G(block_n=16, block_k=256, num_stages=4), G(block_n=32, block_k=256, num_stages=3),
                       G(block_n=32, block_k=128, num_stages=5), G(block_n=16, block_k=128, num_stages=6),
                       G(block_n=64, block_k=128, num_stages=4)]
            dns = [(D(block_n=64, block_k=256, num_stages=3), "atomic"),
                   (D(block_n=128, block_k=128), "atomic"), (D(block_n=64, block_k=128), "atomic"),
                   (D(block_n=32, block_k=256), "atomic"),
                   (D(block_n=64, block_k=256, num_stages=3), "reduce")]
            for split in (2, 4):
                bk = 256 if big_i % (256 * split) == 0 else 128
                if blocks * (big_h // 64) * split <= 4 * NUM_SMS and big_i % (bk * split) == 0:
                    dns.append((D(block_n=64, block_k=bk, split_k=split, num_stages=3), "atomic"))
            dns = dns[:7]
        elif bm == 64:
            gus = [G(block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=3),
                   G(block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=3),
                   G(block_n=128, block_k=64, group_m=4, num_warps=8, num_stages=3),
                   G(block_n=64, block_k=64, group_m=4, num_warps=4, num_stages=4),
                   G(block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4)]
            dns = [(D(block_n=64, block_k=256, num_stages=3), "atomic"),
                   (D(block_n=128, block_k=64, group_m=4), "reduce"),
                   (D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3), "reduce"),
                   (D(block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=3), "atomic"),
                   (D(block_n=128, block_k=64, group_m=4), "atomic")]
        else:  # 128-row wgmma tiles (T = 8192: n128k64 w8 s3 was best by 10-30 % in call 1)
            gus = [G(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3),
                   G(block_n=128, block_k=64, group_m=4, num_warps=8, num_stages=3),
                   G(block_n=128, block_k=32, group_m=8, num_warps=8, num_stages=5),
                   G(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=4),
                   G(block_n=128, block_k=64, group_m=16, num_warps=8, num_stages=3)]
            dns = [(D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3), "reduce"),
                   (D(block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=3), "reduce"),
                   (D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=4), "reduce"),
                   (D(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3), "reduce"),
                   (D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3), "atomic")]
        gus = [g for g in gus if g.smem_bytes(bm, elt) <= SMEM_LIMIT]
        dns = [(d, c) for d, c in dns if d.smem_bytes(bm, elt) <= SMEM_LIMIT]
        out.append((bm, gus, dns))
    # keep the total within MAX_CONFIGS (one slot is the incumbent's)
    while sum(len(g) + len(d) for _, g, d in out) > MAX_CONFIGS - 1:
        i = max(range(len(out)), key=lambda j: len(out[j][1]) + len(out[j][2]))
        bm, g, d = out[i]
        out[i] = (bm, g[:-1], d) if len(g) >= len(d) else (bm, g, d[:-1])
    return [CandidateSet(block_m=bm, gate_ups=tuple(g),
                         downs=tuple(DownChoice(down=d, combine=c) for d, c in dns))
            for bm, g, dns in out if g and dns]


def point_mode(shape: BenchShape, tokens: int, graph_max_tokens: int) -> str:
    """The serving regime ``moerun bench`` times the cell in: ``"graph"`` for
    ``T <= graph_max_tokens`` unless the shape is eager-only, else ``"eager"``."""
    return "eager" if shape.eager_only or tokens > graph_max_tokens else "graph"


def read_config_data(path: Path) -> dict:
    """A config file's JSON (``{"meta": {}, "entries": {}}`` when it does not exist)."""
    path = Path(path)
    if path.exists():
        return json.loads(path.read_text())
    return {"meta": {}, "entries": {}}


def plan_points(shapes: list[BenchShape], tokens: list[int] | None, dtype: torch.dtype,
                device_name: str, config_dir: Path, graph_max_tokens: int = 1024
                ) -> list[TunePoint]:
    """Every point to tune, in order: each shape's own T list unless ``tokens`` is given.
    Incumbents come from ``config_dir``'s file of the local shape (read only)."""
    elt = torch.empty((), dtype=dtype).element_size()
    points = []
    for shape in shapes:
        name = config_file_name(shape.num_experts, shape.intermediate, shape.hidden, dtype,
                                device_name)
        entries = read_config_data(Path(config_dir) / name)["entries"]
        for t in (list(shape.tokens) if tokens is None else tokens):
            b = bucket_of(t)
            if str(b) in entries:
                inc = ExpertsConfig.from_json(entries[str(b)]["config"])
                source = f"tuned ({name})"
            else:
                inc = default_config(shape.num_experts, shape.intermediate, shape.hidden, b,
                                     shape.top_k)
                source = "heuristic"
            sets = candidates(shape.num_experts, shape.top_k, shape.hidden,
                              shape.intermediate, t, elt)
            points.append(TunePoint(shape=shape, tokens=t, bucket=b,
                                    mode=point_mode(shape, t, graph_max_tokens), incumbent=inc,
                                    incumbent_source=source, candidate_sets=tuple(sets),
                                    file_name=name))
    return points


def compile_configs(point: TunePoint) -> list[ExpertsConfig]:
    """Every whole config a point may launch: the incumbent, each gate/up tile with the set's
    first down tile, each down tile with the first gate/up tile (the timed winner combines a
    timed gate/up and down tile; both were compiled through these)."""
    out = [point.incumbent]
    for cs in point.candidate_sets:
        first = cs.downs[0]
        out += [ExpertsConfig(block_m=cs.block_m, gate_up=g, down=first.down,
                              combine=first.combine) for g in cs.gate_ups]
        out += [ExpertsConfig(block_m=cs.block_m, gate_up=cs.gate_ups[0], down=d.down,
                              combine=d.combine) for d in cs.downs]
    return out


def merge_entries(data: dict, *, shape: BenchShape, dtype: torch.dtype | str,
                  device_name: str, command: str, date: str, versions: dict[str, str],
                  winners: dict[int, TunedEntry]) -> dict:
    """``data`` (a config file's JSON) with ``winners`` ({bucket: entry}) merged in: other
    buckets' entries kept, entries sorted by bucket, ``meta`` rewritten (command, date,
    device, ``versions``, the local shape, dtype) with a history of the last 20 runs.
    Returns a new dict; ``data`` is not changed."""
    entries = dict(data.get("entries", {}))
    hist = list(data.get("meta", {}).get("history", []))
    hist.append({"command": command, "date": date, "device": device_name,
                 "T": sorted(e.tokens for e in winners.values()), **versions})
    meta = {"written_by": "moerun tune (moerun/backends/triton/tune.py)", "command": command,
            "date": date, "device": device_name, **versions,
            "shape": {"name": shape.name, "S": shape.num_experts, "top_k": shape.top_k,
                      "H": shape.hidden, "I": shape.intermediate},
            "dtype": dtype_name(dtype), "history": hist[-20:]}
    for b, entry in winners.items():
        entries[str(b)] = entry.to_json(date)
    return {"meta": meta, "entries": dict(sorted(entries.items(), key=lambda kv: int(kv[0])))}
