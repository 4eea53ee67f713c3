"""``traces.timeline``: a PNG timeline of a trace, one row per stream / thread.

Rows (top to bottom): host threads, then CUDA streams, each labelled ``role · name`` (host rows
of a GPU trace read ``host role · name``: the figures come from the streams). In a row:

- light grey: the lane is busy with work outside moerun ranges;
- coloured boxes: moerun phases (host ranges; device kernels coloured by the phase that
  launched them); hatched: blocked in a wait phase;
- cyan: communication not tied to a phase (a gloo collective on a worker thread, an
  unattributed NCCL kernel); dark grey: a kernel launched outside moerun ranges;
- thin bars along a host row's top edge: DBO micro-batch ranges (``ub0``, ``ub1``); the strip
  under each phase box has the colour of the micro-batch it was attributed to.

Phase names are written inside boxes wide enough to hold them; concurrent boxes of one lane
are stacked in sub-rows. The title carries the overlap figures of :func:`traces.overlap`.

matplotlib (``pip install 'moerun[trace]'``) is imported on the first call, through its object
API and the Agg canvas: no pyplot state, no global backend switch, no display needed.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

from traces import _intervals as iv
from traces.overlap import overlap
from traces.report import Lane, OverlapReport, Span

__all__ = ["timeline", "PHASE_COLORS"]

#: Box colour per phase (``eplb.*`` hooks share one); other phases get a fallback colour.
PHASE_COLORS = {
    "route": "#4C72B0",
    "pad": "#8C8C8C",
    "dispatch": "#DD8452",
    "dispatch.wait": "#F5C9A6",
    "quantize": "#937860",
    "experts": "#55A868",
    "combine": "#C44E52",
    "combine.wait": "#EBAFB0",
    "shared": "#8172B3",
    "eplb": "#DA8BC3",
}
_COMM = "#64B5CD"
_BUSY = "#DDDDDD"
_UNATTRIBUTED = "#9E9E9E"
_UB_COLORS = ("#111111", "#008B8B", "#B8860B", "#6B3FA0")  # off the phase palette
_FALLBACK = ("#CCB974", "#8DA0CB", "#A6D854", "#FFD92F", "#E5C494", "#B3B3B3")
_WAITS = ("dispatch.wait", "combine.wait")
_FONT = 7  # points, box labels
_CHAR_PX = 4.6  # approximate width of one label character at _FONT on a 110 dpi canvas


def _matplotlib() -> tuple[Any, Any, Any]:
    # NOTE: imported on first call only; DESIGN 1 lists matplotlib as the optional `trace`
    # extra, never imported by `import traces`.
    try:
        import matplotlib.backends.backend_agg as agg
        import matplotlib.figure as figure
        import matplotlib.patches as patches
    except ImportError as exc:
        raise ImportError("traces.timeline needs matplotlib: pip install 'moerun[trace]' "
                          "(or pip install matplotlib)") from exc
    return figure, agg, patches


def _phase_color(phase: str | None, extra: dict[str, str]) -> str:
    if phase is None:
        return _UNATTRIBUTED
    if phase.startswith("eplb."):
        return PHASE_COLORS["eplb"]
    if phase in PHASE_COLORS:
        return PHASE_COLORS[phase]
    if phase not in extra:
        extra[phase] = _FALLBACK[len(extra) % len(_FALLBACK)]
    return extra[phase]


def _legend_key(phase: str) -> str:
    return "eplb.*" if phase.startswith("eplb.") else phase


def _span_style(span: Span, extra: dict[str, str]) -> tuple[str, str | None, str]:
    """(colour, label text or None, legend key) of a box."""
    if span.kind == "comm" and span.phase is None:
        return _COMM, span.name, "comm"
    if span.phase is None:
        return _UNATTRIBUTED, None, "kernel outside moerun ranges"
    return _phase_color(span.phase, extra), span.phase, _legend_key(span.phase)


def _rows(report: OverlapReport) -> list[Lane]:
    host = [ln for ln in report.lanes if ln.device == "cpu"]
    dev = [ln for ln in report.lanes if ln.device == "gpu"]
    return host + dev


def _window(report: OverlapReport) -> tuple[float, float]:
    """x range: the moerun ranges and communication if any, else everything; 2 % margins."""
    focus = [(s.start_us, s.end_us) for ln in report.lanes for s in ln.spans]
    lo, hi = (min(p[0] for p in focus), max(p[1] for p in focus)) if focus \
        else report.window_us
    pad = max((hi - lo) * 0.02, 0.5)
    return lo - pad, hi + pad


def _pack(spans: list[Span]) -> tuple[list[int], int]:
    """Sub-row of each span (greedy: the first sub-row free at its start) and the row count,
    so concurrent spans of one lane (two p2p transfers in flight, a nested range) do not
    overprint each other."""
    ends: list[float] = []
    rows = []
    for sp in spans:
        for r, end in enumerate(ends):
            if sp.start_us >= end:
                ends[r] = sp.end_us
                rows.append(r)
                break
        else:
            ends.append(sp.end_us)
            rows.append(len(ends) - 1)
    return rows, max(len(ends), 1)


def _draw_lane(ax: Any, y: float, lane: Lane, lo: float, us_per_px: float, scale: float,
               extra: dict[str, str], used: dict[str, str]) -> None:
    boxes = [s for s in lane.spans if s.kind not in ("chunk", "mark", "ub")]
    covered = iv.union((s.start_us, s.end_us) for s in boxes)
    busy = [((s - lo) / scale, (e - s) / scale) for s, e in iv.subtract(lane.busy, covered)]
    if busy:
        ax.broken_barh(busy, (y - 0.26, 0.52), facecolors=_BUSY, edgecolors=_BUSY,
                       linewidth=0.3, zorder=1)
        used.setdefault("busy (other work)", _BUSY)
    for s in lane.spans:
        if s.kind == "ub":
            color = _UB_COLORS[(s.ub or 0) % len(_UB_COLORS)]
            yy = y + 0.36 - 0.08 * ((s.ub or 0) % 2)
            ax.broken_barh([((s.start_us - lo) / scale, s.dur_us / scale)], (yy, 0.06),
                           facecolors=color, edgecolors="none", zorder=3)
            used.setdefault(f"micro-batch ub{s.ub}", color)
    sub, nsub = _pack(boxes)
    h = 0.52 / nsub
    for s, r in zip(boxes, sub):
        x, w = (s.start_us - lo) / scale, s.dur_us / scale
        y0 = y + 0.26 - (r + 1) * h
        color, text, key = _span_style(s, extra)
        hatch = "////" if s.phase in _WAITS else None
        ax.broken_barh([(x, w)], (y0 + 0.01, h - 0.02), facecolors=color, hatch=hatch,
                       edgecolors=color if hatch is None else "#7F7F7F", linewidth=0.4,
                       zorder=2)
        used.setdefault(key, color)
        if s.ub is not None:  # which micro-batch ran it: a strip in the ub's colour below
            ax.broken_barh([(x, w)], (y - 0.36, 0.07), zorder=3, edgecolors="none",
                           facecolors=_UB_COLORS[s.ub % len(_UB_COLORS)])
        if text and s.dur_us / us_per_px > _CHAR_PX * len(text) + 6:
            dark = hatch is None and color not in (_COMM, _BUSY)
            ax.text(x + w / 2, y0 + h / 2, text, ha="center", va="center", fontsize=_FONT,
                    zorder=4, color="white" if dark else "black", clip_on=True)


def _title(report: OverlapReport) -> str:
    pct = "n/a" if report.hidden_shared_pct is None else f"{report.hidden_shared_pct:.0f} %"
    return (f"moerun timeline ({report.device}) — shared hidden {pct} of "
            f"{report.shared_us:.0f} µs; comm {report.comm_us:.0f} µs, exposed "
            f"{report.exposed_comm_us:.0f} µs")


def timeline(trace: Any, png: str | os.PathLike, *, title: str | None = None) -> pathlib.Path:
    """Draw ``trace`` as a PNG timeline (see the module docstring for the legend).

    Args:
        trace: what :func:`traces.overlap` accepts (path, dict, event list), or an
            :class:`traces.OverlapReport` already computed.
        png: the file to write; must end in ``.png``; parent folders are created.
        title: figure title; default: the device and the overlap figures.

    Returns:
        the path written.

    Raises:
        ImportError: matplotlib is missing (install the ``trace`` extra).
        ValueError / TypeError / FileNotFoundError: bad ``png`` or ``trace`` (as
            :func:`traces.overlap`).

    Side effects: imports matplotlib on first use (object API, Agg canvas; no pyplot, no
    display, the process's matplotlib backend is left alone); writes one file.
    """
    if not isinstance(png, (str, os.PathLike)):
        raise TypeError(f"png={png!r} is invalid: pass a file path ending in .png")
    out = pathlib.Path(png)
    if out.suffix.lower() != ".png":
        raise ValueError(f"png={str(out)!r} is invalid: the file name must end in .png")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title={title!r} is invalid: pass a str or None")
    report = trace if isinstance(trace, OverlapReport) else overlap(trace)
    figure, agg, patches = _matplotlib()
    rows = _rows(report)
    lo, hi = _window(report)
    span = hi - lo
    unit, scale = ("ms", 1000.0) if span >= 2000.0 else ("µs", 1.0)
    dpi, width_in, left_in, right_in = 110, 15.0, 2.9, 0.3
    top_in, row_in, axis_in, legend_row_in = 0.45, 0.62, 0.5, 0.22
    ax_w = width_in - left_in - right_in
    fig = figure.Figure(figsize=(width_in, 4.0), dpi=dpi)
    agg.FigureCanvasAgg(fig)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))  # placed below, once the legend size is known
    us_per_px = span / (ax_w * dpi)
    extra: dict[str, str] = {}
    used: dict[str, str] = {}
    for i, lane in enumerate(rows):
        _draw_lane(ax, float(len(rows) - 1 - i), lane, lo, us_per_px, scale, extra, used)
    ax.set_xlim(0.0, span / scale)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_yticks([len(rows) - 1 - i for i in range(len(rows))])
    host = "host " if report.device == "gpu" else ""  # host rows of a GPU report: context
    ax.set_yticklabels([f"{host if ln.device == 'cpu' else ''}{ln.role} · {ln.label}"
                        for ln in rows], fontsize=8)
    ax.set_xlabel(f"time ({unit}) since {lo:.0f} µs (trace clock)", fontsize=8, labelpad=2)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", color="#EEEEEE", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(title if title is not None else _title(report), fontsize=10, loc="left")
    if not rows:
        ax.text(0.5, 0.5, "no events in this trace", transform=ax.transAxes, ha="center",
                va="center", fontsize=10, color="#555555")
    ncol = 7
    legend_rows = -(-len(used) // ncol)
    rows_in = row_in * max(len(rows), 1)
    bottom_in = axis_in + legend_row_in * legend_rows + 0.08
    height_in = top_in + rows_in + bottom_in
    fig.set_size_inches(width_in, height_in)
    ax.set_position((left_in / width_in, bottom_in / height_in, ax_w / width_in,
                     rows_in / height_in))
    if used:
        handles = [patches.Patch(facecolor=c, edgecolor="#7F7F7F" if k in _WAITS else c,
                                 hatch="////" if k in _WAITS else None, label=k)
                   for k, c in used.items()]
        fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), ncol),
                   fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.0),
                   handleheight=0.9, columnspacing=1.4)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    return out
