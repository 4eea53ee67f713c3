"""Schedule recorder: the issue order of every moerun range, as data (DESIGN 10).

The recorder is fed by the same helper that emits NVTX ranges (:mod:`traces.nvtx`), so an
event's ``name`` is exactly the range name a user sees in Nsight or in a torch.profiler trace.
Events are appended when a range is *entered* (issue order, not completion order), which is
what the scheduler tests compare: e.g. DESIGN 7's DBO order
``ub0.dispatch < ub1.dispatch < ub0.dispatch.wait < ...`` is a statement about list indices.

Nothing here touches a device: recording never syncs, never launches, and works the same on
CPU and GPU (``stream`` is the *logical* role ``main``/``aux``/``comm``, not a CUDA stream).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["ScheduleEvent", "ScheduleRecorder", "STREAMS", "EVENT_KINDS", "KNOWN_PHASES"]

# Logical stream roles. ``main``: the layer's compute stream; ``aux``: the shared-expert /
# side stream; ``comm``: communication (on CPU: gloo worker threads).
STREAMS = frozenset({"main", "aux", "comm"})

# ``range``: has a duration (entered and exited); ``mark``: zero-length instant.
EVENT_KINDS = frozenset({"range", "mark"})

# The phase vocabulary of DESIGN 10. Documentation, not enforcement: the tracer accepts any
# phase string so a scheduler can add one without touching this package, but trace analysis
# and tests match on these names.
KNOWN_PHASES = frozenset(
    {
        # structural ranges
        "ub",  # moerun/L{l}/dbo/ub{u}
        "chunk",  # moerun/L{l}/chunk{c}
        "dbo/yield",  # zero-length mark
        # forward phases
        "route",
        "pad",
        "dispatch",
        "dispatch.wait",
        "quantize",
        "experts",
        "combine",
        "combine.wait",
        "shared",
        # EPLB hooks (DESIGN 8)
        "eplb.start_wait_gpu",
        "eplb.done_wait_gpu",
        "eplb.update_statistic",
        "eplb.route",
        "eplb.start_set_cpu",
        "eplb.done_set_cpu",
    }
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleEvent:
    """One range entry or mark, as issued by the host.

    Fields:
        name: full range name, e.g. ``"moerun/L3/chunk0"`` or ``"moerun/L3/dispatch"``
            (see :func:`traces.nvtx.range_name`); equal to the NVTX / profiler range name.
        phase: ``"route"``, ``"dispatch"``, ... ``"eplb.start_wait_gpu"`` for phase ranges;
            ``"chunk"`` / ``"ub"`` for the structural ranges; ``"dbo/yield"`` for the mark.
        layer_idx: the layer, or None when the layer has no index (name uses ``L-``).
        chunk: chunk index the event belongs to (the enclosing ``chunk`` range, or the chunk
            itself for a ``chunk`` event), None outside any chunk.
        ub: DBO micro-batch index, None when the forward is not split.
        stream: logical role, one of :data:`STREAMS`.
        rank: the emitting rank (as told to the tracer; not read from a process group).
        kind: ``"range"`` or ``"mark"``.
    """

    name: str
    phase: str
    layer_idx: int | None
    chunk: int | None
    ub: int | None
    stream: str
    rank: int
    kind: str

    def __post_init__(self) -> None:
        if self.stream not in STREAMS:
            raise ValueError(
                f"ScheduleEvent.stream={self.stream!r} is invalid: use one of {sorted(STREAMS)}"
            )
        if self.kind not in EVENT_KINDS:
            raise ValueError(
                f"ScheduleEvent.kind={self.kind!r} is invalid: use one of {sorted(EVENT_KINDS)}"
            )


class ScheduleRecorder:
    """Collects :class:`ScheduleEvent` in issue order.

    Attach one to :class:`traces.nvtx.Tracer` (``Tracer(..., recorder=rec)``); every range
    entry and mark the tracer emits is appended. One recorder may be shared by several
    tracers (layers, micro-batches) and threads.

    Attributes:
        events: the recorded events, in the order they were issued (appended at range entry).
            Read it when no forward is running, or copy it under your own synchronization.

    Thread-safety: :meth:`record`, :meth:`clear` and the filters take an internal lock.
    Side effects: host memory only; no device work, no host sync. Cost: building the frozen
    event dominates, ~2 µs per range on a 2-core CI-class CPU, so attach a recorder in tests
    and analysis runs, not in production serving.
    """

    __slots__ = ("events", "_lock")

    def __init__(self) -> None:
        self.events: list[ScheduleEvent] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.events)

    def __repr__(self) -> str:
        return f"ScheduleRecorder({len(self.events)} events)"

    def record(self, event: ScheduleEvent) -> None:
        """Append ``event`` (thread-safe).

        Args:
            event: the event to append; must be a :class:`ScheduleEvent`.

        Side effects: appends to :attr:`events`; no host sync. Thread-safe.
        """
        with self._lock:
            self.events.append(event)

    def clear(self) -> None:
        """Drop every recorded event (thread-safe; no host sync)."""
        with self._lock:
            self.events.clear()

    def select(
        self,
        *,
        rank: int | None = None,
        ub: int | None = None,
        chunk: int | None = None,
        layer_idx: int | None = None,
        kind: str | None = None,
    ) -> list[ScheduleEvent]:
        """Events matching every given filter, in issue order.

        Args:
            rank / ub / chunk / layer_idx: keep events whose field equals the value; None
                means "do not filter on this field" (so events with ``ub=None`` cannot be
                singled out this way; filter :attr:`events` yourself for that).
            kind: ``"range"`` or ``"mark"``; None keeps both.

        Returns:
            a new list (a snapshot; later recording does not change it).

        Side effects: none; takes the lock for the snapshot. Thread-safe.
        """
        if kind is not None and kind not in EVENT_KINDS:
            raise ValueError(f"kind={kind!r} is invalid: use one of {sorted(EVENT_KINDS)} or None")
        with self._lock:
            snapshot = list(self.events)
        return [
            e
            for e in snapshot
            if (rank is None or e.rank == rank)
            and (ub is None or e.ub == ub)
            and (chunk is None or e.chunk == chunk)
            and (layer_idx is None or e.layer_idx == layer_idx)
            and (kind is None or e.kind == kind)
        ]

    def phases(
        self,
        *,
        rank: int | None = None,
        ub: int | None = None,
        chunk: int | None = None,
        layer_idx: int | None = None,
        kind: str | None = None,
    ) -> list[str]:
        """The ``phase`` of each event matching the filters, in issue order.

        Structural events are included (``"ub"``, ``"chunk"``, the ``"dbo/yield"`` mark);
        pass ``kind="range"`` to drop marks. Filters as in :meth:`select`.

        Side effects: none. Thread-safe.
        """
        return [
            e.phase
            for e in self.select(rank=rank, ub=ub, chunk=chunk, layer_idx=layer_idx, kind=kind)
        ]

    def names(
        self,
        *,
        rank: int | None = None,
        ub: int | None = None,
        chunk: int | None = None,
        layer_idx: int | None = None,
        kind: str | None = None,
    ) -> list[str]:
        """The full range ``name`` of each matching event, in issue order (see :meth:`select`).

        Side effects: none. Thread-safe.
        """
        return [
            e.name
            for e in self.select(rank=rank, ub=ub, chunk=chunk, layer_idx=layer_idx, kind=kind)
        ]
