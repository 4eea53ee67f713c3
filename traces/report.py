"""What :func:`traces.overlap` returns: lanes, busy intervals, overlap figures, phase times.

All times are µs on the trace's own clock (the ``ts`` values of the Chrome trace, so intervals
from one report can be compared with the trace in Perfetto). Interval sets are tuples of
``(start_us, end_us)`` pairs, sorted, disjoint, half-open. Every class is a frozen,
keyword-only dataclass; nothing here reads a file or a device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

__all__ = ["ROLES", "LANE_KINDS", "Span", "Lane", "PhaseKey", "PhaseTime", "PhaseTable",
           "OverlapReport"]

#: Lane roles. ``main``: the layer's compute (GPU: the stream of the routed ``experts``
#: kernels; CPU: the thread running the moerun ranges); ``aux``: other compute of the layer
#: (side stream of the shared expert or of chunk overlap; another thread with moerun ranges);
#: ``comm``: communication (NCCL kernels' stream; gloo's worker threads); ``other``: the rest.
ROLES = ("main", "aux", "comm", "other")

#: Span kinds: ``phase`` / ``chunk`` / ``ub`` / ``mark`` (host moerun ranges), ``kernel``
#: (device work: kernel, memcpy, memset), ``comm`` (a gloo collective's ``gloo:*`` event or
#: an NCCL kernel).
LANE_KINDS = ("phase", "chunk", "ub", "mark", "kernel", "comm")


@dataclass(frozen=True, kw_only=True, slots=True)
class Span:
    """One box of a lane: a moerun range, a device event or a communication event.

    Fields:
        name: the event name as in the trace (``"moerun/L0/experts"``, a kernel name,
            ``"gloo:all_reduce"``).
        kind: one of :data:`LANE_KINDS`.
        start_us, end_us: µs, trace clock.
        phase: the moerun phase this span is (host range) or was attributed to (device event,
            through its launch's correlation id); ``"chunk"`` / ``"ub"`` / ``"dbo/yield"`` for
            structural ranges; None when unattributed.
        layer, ub, chunk: the attributed layer / DBO micro-batch / chunk, None when unknown or
            not applicable.
    """

    name: str
    kind: str
    start_us: float
    end_us: float
    phase: str | None = None
    layer: int | None = None
    ub: int | None = None
    chunk: int | None = None

    @property
    def dur_us(self) -> float:
        """``end_us - start_us``."""
        return self.end_us - self.start_us


@dataclass(frozen=True, kw_only=True, slots=True)
class Lane:
    """One row of the timeline: a CUDA stream (GPU) or a host thread (CPU).

    Fields:
        id: stable key, ``"gpu:{device}:{stream}"``, ``"cpu:{pid}:{tid}"``, or
            ``"cpu:{pid}:{tid}:gloo"`` for gloo events recorded on a thread that also runs
            moerun ranges (point-to-point ``gloo:send``/``gloo:recv`` spans live on the issuing
            thread).
        device: ``"gpu"`` or ``"cpu"``.
        pid, tid: as in the trace (GPU: device index and stream id).
        label: human name (``"stream 7"``, the trace's thread name).
        role: one of :data:`ROLES` (rules in :mod:`traces.overlap`).
        busy: the lane's busy interval set (µs): GPU: union of its kernels, memcpys, memsets;
            CPU compute thread: union of its events minus its ``dispatch.wait`` /
            ``combine.wait`` ranges (blocked in ``Work.wait()``); CPU comm lane: union of its
            events.
        busy_us: total length of ``busy``.
        spans: the lane's boxes (see :class:`Span`), sorted by start. Host compute lanes hold
            only moerun ranges (other ops are in ``busy`` but not listed).
    """

    id: str
    device: str
    pid: Any
    tid: Any
    label: str
    role: str
    busy: tuple[tuple[float, float], ...]
    busy_us: float
    spans: tuple[Span, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseKey:
    """Where a phase ran: layer (None for ``L-``), DBO micro-batch (None: not split),
    chunk (None: outside any chunk range), phase name (``"route"``, ``"eplb.route"``...)."""

    layer: int | None
    ub: int | None
    chunk: int | None
    phase: str

    def sort_key(self) -> tuple:
        """Layers, then micro-batches, then chunks in order (None first), then phase name.

        Pure; host only."""

        def k(v: int | None) -> tuple[int, int]:
            return (0, 0) if v is None else (1, v)

        return (k(self.layer), k(self.ub), k(self.chunk), self.phase)


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseTime:
    """Time spent in one :class:`PhaseKey`.

    Fields:
        count: number of host ranges.
        host_us: sum of the host ranges' durations (µs).
        device_us: sum of the durations of the device events (kernels, memcpys, memsets)
            whose launch ran inside those ranges (µs; a sum, so concurrent kernels add up);
            None in a CPU-only trace.
        device_events: number of those device events.
    """

    count: int
    host_us: float
    device_us: float | None
    device_events: int = 0


class PhaseTable(Mapping):
    """Read-only, picklable ``{PhaseKey: PhaseTime}`` in :meth:`PhaseKey.sort_key` order.

    (A ``types.MappingProxyType`` would be read-only too, but cannot be pickled, and reports
    travel back from multi-rank tasks.)
    """

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[tuple[PhaseKey, PhaseTime]] = ()) -> None:
        self._items = dict(sorted(items, key=lambda kv: kv[0].sort_key()))

    def __getitem__(self, key: PhaseKey) -> PhaseTime:
        return self._items[key]

    def __iter__(self) -> Iterator[PhaseKey]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"PhaseTable({self._items!r})"

    def __reduce__(self) -> tuple:
        return (PhaseTable, (tuple(self._items.items()),))


def _fmt_us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _fmt_idx(v: int | None) -> str:
    return "-" if v is None else str(v)


@dataclass(frozen=True, kw_only=True)
class OverlapReport:
    """Busy lanes and overlap of one trace (see :func:`traces.overlap` for the rules).

    Fields:
        device: ``"gpu"`` when the trace has device events (figures use the stream lanes),
            else ``"cpu"`` (figures use the host-thread lanes).
        lanes: every lane, device lanes first, then host lanes; host lanes are listed in a GPU
            report too (for the timeline), but the figures use only the ``device`` lanes.
        window_us: ``(start, end)`` µs of everything in ``lanes`` ((0, 0) when empty).
        shared_us: busy time of the ``shared`` phase: GPU: union of the device time of its
            kernels; CPU: its host ranges (µs).
        hidden_shared_us: the part of ``shared_us`` during which another lane with role
            main/aux/comm is busy with other work (µs).
        hidden_shared_pct: ``100 * hidden_shared_us / shared_us``; None when there is no shared
            phase (or it has no device work on GPU, or zero length).
        comm_us: union of the busy intervals of the comm lanes (µs).
        exposed_comm_us: the part of ``comm_us`` during which no non-comm lane is busy (µs).
        phases: :class:`PhaseTable`, a read-only ``{PhaseKey: PhaseTime}`` sorted by
            :meth:`PhaseKey.sort_key`.
        notes: how ambiguous cases were decided (roles, DBO micro-batch attribution, ...).
    """

    device: str
    lanes: tuple[Lane, ...]
    window_us: tuple[float, float]
    shared_us: float
    hidden_shared_us: float
    hidden_shared_pct: float | None
    comm_us: float
    exposed_comm_us: float
    phases: Mapping[PhaseKey, PhaseTime] = field(default_factory=PhaseTable)
    notes: tuple[str, ...] = ()

    def lanes_with_role(self, role: str) -> tuple[Lane, ...]:
        """The lanes of :attr:`device` with ``role`` (one of :data:`ROLES`). Pure; host only."""
        if role not in ROLES:
            raise ValueError(f"role={role!r} is invalid: use one of {list(ROLES)}")
        return tuple(ln for ln in self.lanes if ln.role == role and ln.device == self.device)

    def by_phase(self) -> dict[str, PhaseTime]:
        """``phases`` summed over layers, micro-batches and chunks: ``{phase: PhaseTime}``.

        Pure; host only."""
        out: dict[str, PhaseTime] = {}
        for key, t in self.phases.items():
            prev = out.get(key.phase)
            if prev is None:
                out[key.phase] = t
                continue
            dev = None if prev.device_us is None and t.device_us is None else \
                (prev.device_us or 0.0) + (t.device_us or 0.0)
            out[key.phase] = PhaseTime(count=prev.count + t.count,
                                       host_us=prev.host_us + t.host_us, device_us=dev,
                                       device_events=prev.device_events + t.device_events)
        return out

    def __str__(self) -> str:
        span = self.window_us[1] - self.window_us[0]
        lines = [f"moerun overlap: {self.device} trace, {len(self.lanes)} lanes, "
                 f"window {span:.1f} µs"]
        width = max([len(ln.label) for ln in self.lanes] + [4])
        lines.append(f"  {'lane':<{width}}  role   {'busy µs':>12}")
        for ln in self.lanes:
            mark = "" if ln.device == self.device else "  (not in figures)"
            lines.append(f"  {ln.label:<{width}}  {ln.role:<5}  {ln.busy_us:>12.1f}{mark}")
        pct = "-" if self.hidden_shared_pct is None else f"{self.hidden_shared_pct:.1f} %"
        lines.append(f"  shared {self.shared_us:.1f} µs, hidden {pct} "
                     f"({self.hidden_shared_us:.1f} µs)")
        lines.append(f"  comm {self.comm_us:.1f} µs, exposed {self.exposed_comm_us:.1f} µs")
        if self.phases:
            lines.append(f"  {'phase':<22} {'L':>3} {'ub':>3} {'chunk':>5} {'n':>4} "
                         f"{'host µs':>11} {'device µs':>11}")
            for k, t in self.phases.items():
                lines.append(f"  {k.phase:<22} {_fmt_idx(k.layer):>3} {_fmt_idx(k.ub):>3} "
                             f"{_fmt_idx(k.chunk):>5} {t.count:>4} {t.host_us:>11.1f} "
                             f"{_fmt_us(t.device_us):>11}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)
