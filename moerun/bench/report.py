"""Output of ``moerun bench``: one stable line per cell, the full table at the end (cells x
µs, floor/time, best peer scaled, config source; geomeans per backend and cell group), JSON
(and back), a markdown section, and a plain-text progress bar on stderr."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

from moerun.bench.analysis import BackendSummary, BackendView
from moerun.bench.ceilings import Ceilings, Floor
from moerun.bench.matrix import BackendResult, CellResult
from moerun.bench.peers import PeerTable, PeerTime

__all__ = ["RunInfo", "Progress", "cell_line", "summary_line", "render_table", "to_json",
           "from_json", "SavedRun", "render_markdown", "write_results_section", "SCHEMA"]

SCHEMA = "moerun-bench/1"
SECTION_BEGIN = "<!-- moerun bench (expert compute): begin -->"
SECTION_END = "<!-- moerun bench (expert compute): end -->"


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """What a run was: ``command`` line, ``date`` (ISO, UTC), ``device`` (name and software),
    ``dtype`` name, ``timer`` ("cuda events" / "host clock"), and the settings that shape the
    numbers (``repeats``, ``warmup``, ``graph``, ``graph_max_tokens``, ``calls_per_graph``,
    ``check_tokens``, ``seed``)."""

    command: str
    date: str
    device: str
    dtype: str
    timer: str
    repeats: int
    warmup: int
    graph: bool
    graph_max_tokens: int
    calls_per_graph: int
    check_tokens: int
    seed: int


class Progress:
    """``progress(label)`` advances one step and redraws ``[####....] i/N label`` on
    ``stream`` (carriage return on a terminal, one line per step otherwise)."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True,
                 width: int = 24):
        self.total, self.done, self.width, self.enabled = max(total, 1), 0, width, enabled
        self.stream = stream if stream is not None else sys.stderr
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    @property
    def interactive(self) -> bool:
        """Drawing on a terminal (a cell line must start on a fresh line)."""
        return self.enabled and self._tty

    def __call__(self, label: str) -> None:
        if not self.enabled:
            return
        self.done += 1
        filled = min(self.width, self.width * self.done // self.total)
        text = f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {label}"
        if self._tty:
            self.stream.write("\r" + text.ljust(100)[:100])
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the progress bar's line. Host only; writes a newline to ``stream`` on a terminal."""
        if self.enabled and self._tty:
            self.stream.write("\n")
            self.stream.flush()


# ---------------------------------------------------------------------------- text lines


def _us(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v >= 1 else f"{v:.3f}"


def _num(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _md(text: str) -> str:
    """Free text made safe for a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def cell_line(cell: CellResult, views: list[BackendView]) -> str:
    """``cell shape=.. T=.. hit=.. bound=.. floor_us=.. | NAME eager_us=.. eager_eff=..
    graph_us=.. graph_eff=.. vs_peer=.. vs_peer_eager=.. err=.. ok|FAIL config=".." | ...``;
    ``-`` marks a value not measured (``config="-"``: the backend has no tuned configs);
    skipped backends appear as ``| NAME skipped``. Pure; host only."""
    parts = [f"cell shape={cell.shape} T={cell.tokens} hit={cell.experts_hit_mean:.1f} "
             f"bound={cell.floor.bound} floor_us={_us(cell.floor.us)}"]
    for v in views:
        r = v.result
        parts.append(
            f"{r.name} eager_us={_us(r.eager_us)} eager_eff={_num(v.eager_eff, '.3f')} "
            f"graph_us={_us(r.graph_us)} graph_eff={_num(v.graph_eff, '.3f')} "
            f"vs_peer={_num(v.vs_peer, '.2f')} vs_peer_eager={_num(v.vs_peer_eager, '.2f')} "
            f"err={_num(r.err, '.1e')} {'ok' if r.ok else 'FAIL'} config=\"{r.config or '-'}\"")
    for name in cell.skipped:
        parts.append(f"{name} skipped")
    return " | ".join(parts)


def summary_line(s: BackendSummary) -> str:
    """``summary backend=.. group=.. cells=.. geomean_eff=.. worst=".." worst_eff=..
    geomean_vs_peer=.. peer_cells=.. failures=.. heuristic_cells=..`` Pure; host only."""
    return (f"summary backend={s.name} group={s.group} cells={s.cells} "
            f"geomean_eff={_num(s.geomean_eff, '.3f')} "
            f"worst=\"{s.worst}\" worst_eff={_num(s.worst_eff, '.3f')} "
            f"geomean_vs_peer={_num(s.geomean_vs_peer, '.2f')} peer_cells={s.peer_cells} "
            f"failures={s.failures} heuristic_cells={s.heuristic_cells}")


def _plain(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w)
                      for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]


def render_table(cells: list[CellResult], views: list[list[BackendView]],
                 summaries: list[BackendSummary], peers: PeerTable | None) -> str:
    """The full table printed at the end of a run: one row per (cell, backend) with the
    serving mode and time, floor, floor/time, the best peer of that mode scaled to this run's
    ceilings and peer/ours (columns left out without a peer file), the kernel config source
    and the error; then the geomeans per (group, backend). Pure; host only."""
    head = ["shape", "T", "group", "backend", "mode", "µs", "floor µs", "floor/t"]
    if peers is not None:
        head += ["best peer µs (scaled)", "peer/ours"]
    head += ["config", "rel err"]
    rows = [head]
    for cell, vs in zip(cells, views):
        for v in vs:
            r = v.result
            row = [cell.shape, str(cell.tokens), cell.group, r.name, v.serving_mode or "-",
                   _us(v.serving_us), _us(cell.floor.us), _num(v.serving_eff, ".3f")]
            if peers is not None:
                row += ["-" if v.peer is None else f"{_us(v.peer.scaled_us)} ({v.peer.name})",
                        _num(v.vs_peer, ".2f")]
            row += [r.config or "-", _num(r.err, ".1e") + ("" if r.ok else " FAIL")]
            rows.append(row)
        for name, why in cell.skipped.items():
            rows.append([cell.shape, str(cell.tokens), cell.group, name, "skipped"]
                        + [""] * (len(head) - 6) + [why[:60]])
    right = {1, 5, 6, 7} | ({8, 9} if peers is not None else set())
    lines = ["== cells (serving regime: graph replay where timed for T <= graph-max-tokens, "
             "else eager; " + ("best peer of the same mode, scaled by this run's ceilings)"
                               if peers is not None else "no peer file, no peer column)")]
    lines += _plain(rows, right)
    srows = [["group", "backend", "cells", "geomean floor/t", "worst cell", "worst floor/t",
              "geomean peer/ours", "peer cells", "heuristic cells", "failures"]]
    for sm in summaries:
        srows.append([sm.group, sm.name, str(sm.cells), _num(sm.geomean_eff, ".3f"), sm.worst,
                      _num(sm.worst_eff, ".3f"), _num(sm.geomean_vs_peer, ".2f"),
                      str(sm.peer_cells), str(sm.heuristic_cells), str(sm.failures)])
    lines += ["", "== geomeans per cell group (model: the 20 whole-layer cells; ep-local: the "
              "8 EP-local cells)"]
    lines += _plain(srows, {2, 3, 5, 6, 7, 8, 9})
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- JSON


def _peer_json(p: PeerTime | None) -> dict | None:
    if p is None:
        return None
    return {"name": p.name, "raw_us": p.raw_us, "scaled_us": p.scaled_us, "scale": p.scale}


def to_json(info: RunInfo, ceilings: Ceilings, peers: PeerTable | None,
            cells: list[CellResult], views: list[list[BackendView]],
            summaries: list[BackendSummary]) -> dict:
    """Everything measured plus everything derived; :func:`from_json` reads the measured part
    back. Times in µs, bandwidths in B/s, rates in FLOP/s. Pure; host only."""
    out_cells = []
    for cell, vs in zip(cells, views):
        backends = {}
        for v in vs:
            r = v.result
            backends[r.name] = {
                "eager_us": r.eager_us, "graph_us": r.graph_us, "err": r.err,
                "err_bound": r.err_bound, "ok": r.ok, "note": r.note,
                "eager_floor_ratio": v.eager_eff, "graph_floor_ratio": v.graph_eff,
                "serving_mode": v.serving_mode, "serving_us": v.serving_us,
                "serving_floor_ratio": v.serving_eff, "peer": _peer_json(v.peer),
                "vs_peer": v.vs_peer, "peer_eager": _peer_json(v.peer_eager),
                "vs_peer_eager": v.vs_peer_eager, "config": r.config}
        out_cells.append({
            "shape": cell.shape, "group": cell.group, "eager_only": cell.eager_only,
            "E": cell.num_experts, "k": cell.top_k, "H": cell.hidden,
            "I": cell.intermediate, "T": cell.tokens, "experts_hit": list(cell.experts_hit),
            "experts_hit_mean": cell.experts_hit_mean, "flops": cell.floor.flops,
            "bytes": cell.floor.bytes, "floor_us": cell.floor.us,
            "floor_compute_us": cell.floor.compute_us, "floor_memory_us": cell.floor.memory_us,
            "bound": cell.floor.bound, "backends": backends, "skipped": dict(cell.skipped)})
    return {
        "schema": SCHEMA,
        "command": info.command, "date": info.date, "device": info.device,
        "dtype": info.dtype, "timer": info.timer,
        "settings": {"repeats": info.repeats, "warmup": info.warmup, "graph": info.graph,
                     "graph_max_tokens": info.graph_max_tokens,
                     "calls_per_graph": info.calls_per_graph,
                     "check_tokens": info.check_tokens, "seed": info.seed},
        "ceilings": {"read_bw": ceilings.read_bw, "copy_bw": ceilings.copy_bw,
                     "bandwidth": ceilings.bandwidth, "flops": ceilings.flops,
                     "read_bytes": ceilings.read_bytes, "matmul_size": ceilings.matmul_size,
                     "matmul_dtype": ceilings.matmul_dtype},
        "peers": None if peers is None else {
            "path": peers.path, "date": peers.date, "device": peers.device,
            "read_bw": peers.read_bw, "copy_bw": peers.copy_bw, "bandwidth": peers.bandwidth,
            "flops": peers.flops, "peers": list(peers.peers)},
        "cells": out_cells,
        "summary": [{"backend": s.name, "group": s.group, "cells": s.cells,
                     "geomean_floor_ratio": s.geomean_eff, "worst_cell": s.worst,
                     "worst_floor_ratio": s.worst_eff, "geomean_vs_peer": s.geomean_vs_peer,
                     "peer_cells": s.peer_cells, "failures": s.failures,
                     "heuristic_cells": s.heuristic_cells} for s in summaries],
    }


@dataclass(frozen=True, kw_only=True)
class SavedRun:
    """The measured part of a saved run (:func:`from_json`): its settings, ceilings and
    cells, from which every derived figure is recomputed."""

    info: RunInfo
    ceilings: Ceilings
    cells: list[CellResult]


def from_json(data: dict) -> SavedRun:
    """The measured part of a :func:`to_json` document. ValueError on another schema.

    Pure; host only."""
    if data.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} document (schema={data.get('schema')!r})")
    st = data["settings"]
    info = RunInfo(command=data["command"], date=data["date"], device=data["device"],
                   dtype=data["dtype"], timer=data["timer"], **st)
    c = data["ceilings"]
    ceilings = Ceilings(read_bw=c["read_bw"], copy_bw=c["copy_bw"], flops=c["flops"],
                        read_bytes=c["read_bytes"], matmul_size=c["matmul_size"],
                        matmul_dtype=c["matmul_dtype"])
    cells = []
    for d in data["cells"]:
        results = tuple(BackendResult(name=name, eager_us=b["eager_us"], graph_us=b["graph_us"],
                                      err=b["err"], err_bound=b["err_bound"], note=b["note"],
                                      config=b.get("config", ""))
                        for name, b in d["backends"].items())
        floor = Floor(flops=d["flops"], bytes=d["bytes"], compute_us=d["floor_compute_us"],
                      memory_us=d["floor_memory_us"])
        cells.append(CellResult(shape=d["shape"], num_experts=d["E"], top_k=d["k"],
                                hidden=d["H"], intermediate=d["I"], tokens=d["T"],
                                experts_hit=tuple(d["experts_hit"]), floor=floor,
                                results=results, skipped=dict(d.get("skipped", {})),
                                group=d.get("group", "model"),
                                eager_only=bool(d.get("eager_only", False))))
    return SavedRun(info=info, ceilings=ceilings, cells=cells)


# ---------------------------------------------------------------------------- markdown


def render_markdown(info: RunInfo, ceilings: Ceilings, peers: PeerTable | None,
                    cells: list[CellResult], views: list[list[BackendView]],
                    summaries: list[BackendSummary]) -> str:
    """``benchmarks/RESULTS.md``: how the numbers were made, the summary, one row per
    (cell, backend). Written by ``moerun bench --write-results``; not hand-edited.

    Pure; host only."""
    graph_text = (f"and as CUDA-graph replay ({info.calls_per_graph} calls per graph on "
                  f"different pre-drawn routings, T <= {info.graph_max_tokens})"
                  if info.graph else "(graph replay off)")
    lines = [
        "## Expert-compute benchmark",
        "",
        "Written by `moerun bench --write-results`; regenerate it, don't edit it.",
        "",
        f"- Command: `{info.command}`",
        f"- Date: {info.date}",
        f"- Device: {info.device}",
        f"- dtype: {info.dtype}; timer: {info.timer}; median of {info.repeats} samples after "
        f"{info.warmup} warm-up calls, eager {graph_text}",
        f"- Ceilings (this run): {ceilings.describe()}",
        "- Floor: `max(2·T·k·3·H·I / FLOP/s, (hit·3·H·I + 2·T·H)·bytes_per_element / BW)`, "
        "BW = max(read, copy counted as read + write bytes), hit = distinct experts routed "
        "(mean over the cell's routings); floor/time: 1.0 = at the floor",
        f"- Correctness: relative error of {info.check_tokens} random rows vs an fp32 torch "
        "reference (bound per DESIGN 2)",
    ]
    if peers is not None:
        lines.append(f"- Peers: {peers.describe()}; peer times scaled by table ceiling / this "
                     "run's ceiling (bandwidth for memory-bound cells, FLOP/s for compute-bound); "
                     "peer/ours > 1 means faster than the best peer")
    else:
        lines.append("- Peers: none")
    lines += [
        f"- Serving regime: graph replay for T <= {info.graph_max_tokens}, eager above "
        "(eager where graph replay was not timed; EP-local cells are timed eager only)",
        "- Config: where the kernel configuration came from (`tuned (<file>)` or `heuristic`; "
        "`-`: the backend has none)",
        "",
        "### Summary (serving regime; geomeans per cell group)",
        "",
        "| group | backend | cells | geomean floor/time | worst cell | worst floor/time | "
        "geomean peer/ours | heuristic cells | check failures |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for s in summaries:
        lines.append(f"| {s.group} | {s.name} | {s.cells} | {_num(s.geomean_eff, '.3f')} | "
                     f"{s.worst} | {_num(s.worst_eff, '.3f')} | "
                     f"{_num(s.geomean_vs_peer, '.2f')} ({s.peer_cells} cells) | "
                     f"{s.heuristic_cells} | {s.failures} |")
    lines += [
        "",
        "### Cells",
        "",
        "| shape | T | hit | bound | floor µs | backend | eager µs | floor/t | graph µs | "
        "floor/t | best peer µs (serving, scaled) | peer/ours | best eager peer µs (scaled) | "
        "peer/ours eager | config | rel err |",
        "| --- | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | --- | "
        "---: | --- | ---: |",
    ]
    for cell, vs in zip(cells, views):
        head = (f"| {cell.shape} | {cell.tokens} | {cell.experts_hit_mean:.1f} | "
                f"{cell.floor.bound} | {_us(cell.floor.us)} ")
        for v in vs:
            r = v.result
            peer = "-" if v.peer is None else f"{_us(v.peer.scaled_us)} ({v.peer.name})"
            peer_e = ("-" if v.peer_eager is None
                      else f"{_us(v.peer_eager.scaled_us)} ({v.peer_eager.name})")
            err = _num(r.err, ".1e") + ("" if r.ok else " FAIL")
            lines.append(f"{head}| {r.name} | {_us(r.eager_us)} | {_num(v.eager_eff, '.3f')} | "
                         f"{_us(r.graph_us)} | {_num(v.graph_eff, '.3f')} | {peer} | "
                         f"{_num(v.vs_peer, '.2f')} | {peer_e} | "
                         f"{_num(v.vs_peer_eager, '.2f')} | {_md(r.config or '-')} | {err} |")
        for name, why in cell.skipped.items():
            lines.append(f"{head}| {name} | skipped: {_md(why)} | | | | | | | | | |")
    notes = [(cell, v.result) for cell, vs in zip(cells, views) for v in vs if v.result.note]
    if notes:
        lines += ["", "### Notes", ""]
        lines += [f"- {cell.shape} T={cell.tokens} {r.name}: {_md(r.note)}" for cell, r in notes]
    return "\n".join(lines) + "\n"


def write_results_section(path: str, section: str) -> None:
    """Write ``section`` into the markdown file ``path`` between the expert-compute markers,
    replacing an earlier section and keeping everything else (other benchmarks' sections);
    a new file gets a title line first. Host only; reads and rewrites the file ``path``."""
    block = f"{SECTION_BEGIN}\n{section.rstrip()}\n{SECTION_END}\n"
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = "# moerun benchmark results\n"
    begin, end = text.find(SECTION_BEGIN), text.find(SECTION_END)
    if begin >= 0 and end > begin:
        text = text[:begin] + block + text[end + len(SECTION_END):].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    with open(path, "w") as f:
        f.write(text)
