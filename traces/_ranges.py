"""moerun ranges in a trace: names parsed, each phase given its micro-batch and chunk (private).

Names (DESIGN 10, :mod:`traces.nvtx`): ``moerun/L{l}/dbo/ub{u}`` ⊃ ``moerun/L{l}/chunk{c}`` ⊃
``moerun/L{l}/{phase}``; ``moerun/L{l}/dbo/yield`` is a zero-length mark; ``L-`` = no layer.

Decision — which micro-batch a phase belongs to. A phase range's name does not carry its
micro-batch, and ``record_function``'s ``args`` string is not exported to the Chrome trace
(checked with torch 2.13: it shows as ``"Concrete Inputs": [""]`` even with
``record_shapes=True``), so the micro-batch comes from time. Under DBO both micro-batches run on
one host thread and each ``dbo/ub{u}`` range spans its whole micro-batch, so ub0's and ub1's
ranges *overlap* (ub1 opens after ub0's first yield, ub0 closes first): time containment alone
cannot tell ub0's ``dispatch.wait`` from ub1's. The rule, per (host thread, layer):

1. a time covered by exactly one ``ub`` range belongs to it; by none: ``ub=None``;
2. where ub ranges overlap, the thread's timeline is cut into *segments* at every
   ``dbo/yield`` mark and every ``ub`` range end (the points where the driver switches
   micro-batch: a generator yields, or finishes). One segment runs one micro-batch: the one
   whose ``ub`` range *starts* in it, else the one whose range *ends* at its right edge, else
   the only candidate, else — the DBO driver steps live micro-batches round-robin (DESIGN 7)
   — the candidate that ran least recently;
3. with no yield marks (or two ub starts in one segment) the segment owner is unknown: the
   most recently started covering ub is taken and the case is counted as *ambiguous*
   (reported in ``OverlapReport.notes``).

A phase's chunk is the innermost ``chunk`` range of the same layer and thread that contains it
and was opened by the same micro-batch (the ub at the chunk range's start); chunk ranges of two
micro-batches overlap in time for the same reason.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Any, Iterable

from traces._chrome import Event

__all__ = ["MoerunRange", "RangeName", "parse_name", "attribute_thread", "PhaseFinder",
           "WAIT_PHASES"]

_NAME = re.compile(r"^moerun/L(\d+|-)/(.+)$")
_UB = re.compile(r"^dbo/ub(\d+)$")
_CHUNK = re.compile(r"^chunk(\d+)$")
_YIELD = "dbo/yield"
# Phases in which the host blocks in ``Work.wait()`` (CPU/gloo) rather than computing.
WAIT_PHASES = frozenset({"dispatch.wait", "combine.wait"})
# Timestamps are µs with ns resolution; a child may end a rounding step after its parent.
_EPS = 1e-3


@dataclass(frozen=True, kw_only=True, slots=True)
class MoerunRange:
    """A moerun range on a host thread with its attribution.

    ``kind``: ``"phase"``, ``"chunk"``, ``"ub"`` or ``"mark"``; ``phase``: the phase name for
    phases (``"route"``, ``"eplb.route"``...), ``"chunk"``/``"ub"``/``"dbo/yield"`` otherwise;
    ``layer``: int or None (``L-``); ``ub``/``chunk``: attributed indices or None (for a
    ``ub``/``chunk`` range: its own index). ``ts``/``end`` in µs.
    """

    name: str
    kind: str
    phase: str
    layer: int | None
    ub: int | None
    chunk: int | None
    pid: Any
    tid: Any
    ts: float
    end: float


@dataclass(frozen=True, kw_only=True, slots=True)
class RangeName:
    """A parsed moerun range name: ``kind`` (``"phase"``, ``"chunk"``, ``"ub"`` or ``"mark"``),
    ``layer`` (None for ``L-``), ``phase`` (the phase, or ``"chunk"`` / ``"ub"`` /
    ``"dbo/yield"``) and ``index`` (the chunk or micro-batch number, else None)."""

    kind: str
    layer: int | None
    phase: str
    index: int | None


def parse_name(name: str) -> RangeName | None:
    """The parts of a moerun range name, or None for other names. Pure."""
    m = _NAME.match(name)
    if m is None:
        return None
    layer = None if m.group(1) == "-" else int(m.group(1))
    suffix = m.group(2)
    if suffix == _YIELD:
        return RangeName(kind="mark", layer=layer, phase=_YIELD, index=None)
    u = _UB.match(suffix)
    if u is not None:
        return RangeName(kind="ub", layer=layer, phase="ub", index=int(u.group(1)))
    c = _CHUNK.match(suffix)
    if c is not None:
        return RangeName(kind="chunk", layer=layer, phase="chunk", index=int(c.group(1)))
    return RangeName(kind="phase", layer=layer, phase=suffix, index=None)


class _UbResolver:
    """Which micro-batch runs at a time on one (thread, layer); see the module docstring."""

    def __init__(self, ubs: list[tuple[int, float, float]], marks: list[float]) -> None:
        self.ubs = sorted(ubs, key=lambda u: u[1])
        self.ambiguous = 0
        self.by_segment = 0
        # sorted by start: ranges i < j overlap when j starts before i ends
        self._overlap = any(b[1] < a[2] - _EPS
                            for i, a in enumerate(self.ubs) for b in self.ubs[i + 1:])
        self._have_marks = bool(marks)
        if self._overlap:
            self._cuts = sorted(set(marks) | {u[2] for u in self.ubs})
            self._owners = self._segment_owners()

    def _segment_owners(self) -> list[int | None]:
        """Owner (index into self.ubs, or None) of each segment; -1 where unknown."""
        bounds = [float("-inf"), *self._cuts, float("inf")]
        owners: list[int | None] = []
        last_run: dict[int, int] = {}
        for k in range(len(bounds) - 1):
            lo, hi = bounds[k], bounds[k + 1]
            cands = [i for i, (_, s, e) in enumerate(self.ubs) if s < hi and e > lo]
            starts = [i for i in cands if lo <= self.ubs[i][1] < hi]
            ends = [i for i in cands if lo < self.ubs[i][2] <= hi]
            if not cands:
                owner: int | None = None
            elif len(starts) == 1:
                owner = starts[0]
            elif len(starts) > 1:
                owner = -1  # two micro-batches opened without a yield between: unknown
            elif len(ends) == 1:
                owner = ends[0]
            elif len(cands) == 1:
                owner = cands[0]
            else:
                owner = min(cands, key=lambda i: (last_run.get(i, -1), i))
            if owner is not None and owner >= 0:
                last_run[owner] = k
            owners.append(owner)
        return owners

    def at(self, t: float, *, count: bool = True) -> int | None:
        """The micro-batch index running at time ``t`` (µs), or None. ``count``: add the
        decision to the ``by_segment`` / ``ambiguous`` counters."""
        cands = [i for i, (_, s, e) in enumerate(self.ubs) if s - _EPS <= t < e]
        if not cands:
            return None
        if len(cands) == 1:
            return self.ubs[cands[0]][0]
        if self._have_marks:
            owner = self._owners[bisect.bisect_right(self._cuts, t)]
            if owner is not None and owner in cands:
                self.by_segment += count
                return self.ubs[owner][0]
        self.ambiguous += count
        return self.ubs[max(cands, key=lambda i: self.ubs[i][1])][0]


@dataclass(frozen=True, kw_only=True, slots=True)
class ThreadRanges:
    """The moerun ranges of one host thread, attributed; counters for the report's notes."""

    ranges: tuple[MoerunRange, ...]
    by_segment: int  # phases whose micro-batch came from yield-mark segments
    ambiguous: int  # ... that could not be decided (no marks): most recent ub taken


def attribute_thread(events: Iterable[Event]) -> ThreadRanges:
    """Parse and attribute the moerun ranges among one host thread's ``events``."""
    parsed: dict[int | None, list[tuple[str, str, int | None, Event]]] = {}
    for e in events:
        p = parse_name(e.name)
        if p is not None:
            parsed.setdefault(p.layer, []).append((p.kind, p.phase, p.index, e))
    out: list[MoerunRange] = []
    by_segment = ambiguous = 0
    for layer, items in parsed.items():
        ubs = [(idx, e.ts, e.end) for kind, _, idx, e in items if kind == "ub"]
        marks = [e.ts for kind, _, _, e in items if kind == "mark"]
        res = _UbResolver(ubs, marks)
        chunk_ub = {id(e): res.at(e.ts, count=False) for kind, _, _, e in items
                    if kind == "chunk"}
        chunks = sorted((e.ts, e.end, idx, chunk_ub[id(e)]) for kind, _, idx, e in items
                        if kind == "chunk")  # (ts, end, index, ub)
        for kind, phase, idx, e in items:
            if kind == "ub":
                ub, chunk = idx, None
            elif kind == "chunk":
                ub, chunk = chunk_ub[id(e)], idx
            else:
                # a mark sits on a segment cut: look just before it (it ends its segment)
                ub = res.at(e.ts - 2 * _EPS, count=False) if kind == "mark" else res.at(e.ts)
                chunk = None
                for cs, ce, ci, cu in chunks:  # sorted by start: the last match is innermost
                    if cs - _EPS <= e.ts and e.end <= ce + _EPS and cu == ub:
                        chunk = ci
            out.append(MoerunRange(name=e.name, kind=kind, phase=phase, layer=layer, ub=ub,
                                   chunk=chunk, pid=e.pid, tid=e.tid, ts=e.ts, end=e.end))
        by_segment += res.by_segment
        ambiguous += res.ambiguous
    out.sort(key=lambda r: (r.ts, -r.end))
    return ThreadRanges(ranges=tuple(out), by_segment=by_segment, ambiguous=ambiguous)


class PhaseFinder:
    """Innermost moerun *phase* range of one host thread containing a time (GPU launches)."""

    def __init__(self, ranges: Iterable[MoerunRange]) -> None:
        self._ranges = sorted((r for r in ranges if r.kind == "phase"), key=lambda r: r.ts)
        self._starts = [r.ts for r in self._ranges]
        self._max_end: list[float] = []
        m = float("-inf")
        for r in self._ranges:
            m = max(m, r.end)
            self._max_end.append(m)

    def find(self, t: float) -> MoerunRange | None:
        """The phase range with the latest start among those containing ``t``, or None."""
        i = bisect.bisect_right(self._starts, t) - 1
        while i >= 0 and self._max_end[i] >= t:
            if self._ranges[i].end >= t:
                return self._ranges[i]
            i -= 1
        return None
