"""``traces.overlap``: busy lanes, hidden shared-expert time and exposed communication.

Input: a Chrome / Perfetto JSON trace written by ``torch.profiler`` (``traces.capture`` or
``prof.export_chrome_trace``), as a path or its loaded dict. Output: :class:`OverlapReport`.

Lanes and busy time
-------------------
GPU: one lane per (device, CUDA stream); busy = union of its ``kernel`` / ``gpu_memcpy`` /
``gpu_memset`` events. CPU: one lane per host thread; busy = union of its complete events,
minus the ``dispatch.wait`` / ``combine.wait`` ranges on that thread (the host is blocked in
``Work.wait()`` there, not computing). When the trace has device events the figures are
computed on the GPU lanes (``report.device == "gpu"``), else on the CPU lanes.

Roles (see :data:`traces.report.ROLES`), decided from evidence in the trace, never from
thread or stream names:

- GPU ``comm``: a stream whose NCCL / DeepEP kernels (name contains ``nccl`` or ``deep_ep``,
  case-insensitive) make up at least half of its device time (ProcessGroupNCCL runs
  collectives on its own internal streams).
- GPU ``main``: among the other streams, the one with the most device time of kernels
  attributed to ``experts`` ranges (a kernel is attributed to the innermost moerun phase range
  that contains its launch — the ``cuda_runtime`` / ``cuda_driver`` event with the same
  ``args.correlation`` — on the launching thread); with no ``experts`` kernels, the one with
  the most device time attributed to any moerun phase.
- GPU ``aux``: any other stream with device work attributed to a moerun phase: the
  shared-expert side stream (``AUX_STREAM``), the even chunks under chunk overlap.
- CPU ``main``: the thread with the most time inside moerun ranges; ``aux``: another thread
  with moerun ranges. CPU ``comm``: a gloo worker thread, recognised by its events — a thread
  without moerun ranges whose *top-level* events (not starting inside another event of the
  thread) are ``gloo:*`` events for at least half of its busy time. ``gloo:*`` events on any
  other thread (point-to-point ``gloo:send``/``gloo:recv`` spans sit on the issuing thread,
  inside the ``c10d::send`` op) form an extra comm lane ``cpu:{pid}:{tid}:gloo`` and are left
  out of that thread's own busy time.
- everything else, and every lane of a trace without moerun ranges except comm: ``other``.

Figures
-------
- ``comm_us``: length of the union of the comm lanes' busy intervals;
  ``exposed_comm_us``: the part of it during which no non-comm lane is busy.
- ``shared_us``: union of the ``shared`` phase on each lane (GPU: the device intervals of the
  kernels attributed to ``shared`` ranges; CPU: the ``shared`` host ranges);
  ``hidden_shared_us``: the part of it during which *another* lane with role main/aux/comm is
  busy with other work (its busy set minus its own shared work); ``hidden_shared_pct`` =
  100 * hidden / shared, None without a shared phase.
- ``phases``: per (layer, micro-batch, chunk, phase): count and summed duration of the host
  ranges and (GPU) of the device events attributed to them. Micro-batch and chunk come from
  the rule in :mod:`traces._ranges` (DBO ranges of two micro-batches overlap on one thread).

What a gloo collective leaves in a CPU trace (measured with torch 2.13.0+cpu, 2 ranks)
------------------------------------------------------------------------------------
``torch.profiler.profile(activities=[CPU])`` records on every thread of the process, and a
collective issued with ``async_op=True`` leaves:

- on the *issuing* thread, a ``cpu_op`` ``c10d::allreduce_`` (``c10d::_allgather_base_``,
  ``c10d::_reduce_scatter_base_``, ``c10d::alltoall_base_``, ``c10d::broadcast_``,
  ``c10d::barrier``, ``c10d::send``/``c10d::recv_``) lasting only the enqueue (tens of µs for an
  8M-element all-reduce); ``Work.wait()`` itself leaves no event, so the wait is visible only as
  the caller's own range (moerun's ``dispatch.wait`` / ``combine.wait``);
- on one of gloo's two worker threads (``ProcessGroupGloo`` default ``threads=2``; Kineto
  names them ``thread N (pt_gloo_runloop)``, *but not reliably*: one run labelled a worker
  ``thread N (python)``, another wrote no ``thread_name`` for it at all, hence no name-based
  rule), a ``user_annotation`` event ``gloo:all_reduce`` / ``gloo:all_gather`` /
  ``gloo:all_to_all`` / ``gloo:broadcast`` / ``gloo:barrier`` spanning the collective's
  execution from the moment a worker picks it up until it completes (waits for the peer
  included), with the worker's own ``aten::copy_`` etc. nested inside. It starts 0.1-4 ms
  after the issue (later when the 2 cores are busy) and ends 0.1-0.2 ms before ``wait()``
  returns. Two collectives in flight run on the two workers concurrently; a third queues (its
  event starts when a worker frees up). ``reduce_scatter_tensor`` shows as
  ``gloo:all_reduce`` on the worker (gloo has no reduce-scatter: all-reduce then copy);
- point-to-point ``gloo:send`` / ``gloo:recv`` spans on the *issuing* thread, from issue to
  completion (not nested with that thread's other events);
- no ``record_param_comms`` event (that one comes with NCCL), and no event at all for work a
  worker does before the profiler starts.

So on CPU, communication busy time is the ``gloo:*`` events' spans on the worker threads: a
measure of *in-flight* time (peer waits included), not of CPU cycles spent.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from traces import _intervals as iv
from traces._chrome import DEVICE_CATS, LAUNCH_CATS, Event, Trace, load
from traces._ranges import WAIT_PHASES, PhaseFinder, ThreadRanges, attribute_thread
from traces.report import Lane, OverlapReport, PhaseKey, PhaseTable, PhaseTime, Span

__all__ = ["overlap", "COMM_KERNEL_MARKERS", "GLOO_EVENT_PREFIX"]

#: Substrings (lower case) that mark a device kernel as communication.
COMM_KERNEL_MARKERS = ("nccl", "deep_ep")
#: Name prefix of the events gloo's RecordFunction leaves (``gloo:all_reduce``...).
GLOO_EVENT_PREFIX = "gloo:"

_ROLE_ORDER = {"main": 0, "aux": 1, "comm": 2, "other": 3}
_WORK_ROLES = frozenset({"main", "aux", "comm"})


def overlap(trace: Any) -> OverlapReport:
    """Analyse a torch.profiler Chrome trace: lanes, roles, overlap figures, phase times.

    Args:
        trace: a Chrome / Perfetto JSON trace: a path (``str`` / ``os.PathLike``, ``.json`` or
            ``.json.gz``), its loaded dict (``{"traceEvents": [...]}``), or the bare event list.

    Returns:
        :class:`traces.OverlapReport` (rules in the module docstring). An empty trace, or one
        without moerun ranges, gives a report with no ``main`` lane, empty ``phases`` and
        ``hidden_shared_pct=None``; comm figures are still computed.

    Raises:
        FileNotFoundError: ``trace`` is a path that does not exist.
        ValueError: the file or dict is not a Chrome trace.
        TypeError: ``trace`` is of another type.

    Side effects: reads the file; pure otherwise (no torch, no device).
    """
    return analyse(load(trace, what="trace"))


def analyse(tr: Trace) -> OverlapReport:
    """:func:`overlap` on an already parsed trace."""
    host: dict[tuple[Any, Any], list[Event]] = defaultdict(list)
    device: list[Event] = []
    for e in tr.events:
        if e.cat in DEVICE_CATS:
            device.append(e)
        else:
            host[(e.pid, e.tid)].append(e)
    attributed = {key: attribute_thread(evs) for key, evs in host.items()}
    notes: list[str] = []
    _dbo_notes(attributed, notes)
    lanes = _device_lanes(device, host, attributed, notes) + _host_lanes(
        host, attributed, tr.thread_names, notes)
    domain = "gpu" if any(ln.device == "gpu" for ln in lanes) else "cpu"
    figures = _figures([ln for ln in lanes if ln.device == domain], domain, attributed, notes)
    starts = [p[0] for ln in lanes for p in ln.busy] + [s.start_us for ln in lanes
                                                        for s in ln.spans]
    ends = [p[1] for ln in lanes for p in ln.busy] + [s.end_us for ln in lanes for s in ln.spans]
    window = (min(starts), max(ends)) if starts else (0.0, 0.0)
    return OverlapReport(device=domain, lanes=tuple(lanes), window_us=window,
                         phases=_phases(attributed, lanes, domain), notes=tuple(notes),
                         **figures)


# ---------------------------------------------------------------------------------------------
# lanes


def _dbo_notes(attributed: dict[Any, ThreadRanges], notes: list[str]) -> None:
    by_segment = sum(t.by_segment for t in attributed.values())
    ambiguous = sum(t.ambiguous for t in attributed.values())
    if by_segment:
        notes.append(f"{by_segment} phase ranges lie inside overlapping DBO micro-batch ranges; "
                     "their micro-batch was taken from the dbo/yield-mark segments")
    if ambiguous:
        notes.append(f"{ambiguous} phase ranges lie inside overlapping DBO micro-batch ranges "
                     "with no dbo/yield marks to separate them; each was given the most "
                     "recently started micro-batch, which may be wrong")


def _moerun_time(t: ThreadRanges) -> float:
    return iv.length(iv.union((r.ts, r.end) for r in t.ranges if r.kind != "mark"))


def _range_spans(t: ThreadRanges) -> tuple[Span, ...]:
    return tuple(Span(name=r.name, kind=r.kind, start_us=r.ts, end_us=r.end, phase=r.phase,
                      layer=r.layer, ub=r.ub, chunk=r.chunk) for r in t.ranges)


def _tid_order(key: tuple[Any, Any]) -> tuple:
    return tuple((0, v, "") if isinstance(v, int) else (1, 0, str(v)) for v in key)


def _top_level_gloo_share(evs: list[Event]) -> float:
    """Fraction of a thread's busy time covered by *top-level* ``gloo:*`` events (ones that do
    not start inside another event of the thread). 1.0 for a gloo worker (its collectives are
    its outermost events, their copies nested inside); ~0 for a thread that issues p2p ops
    (``gloo:send`` starts inside the ``c10d::send`` op that issued it)."""
    busy = iv.length(iv.union((e.ts, e.end) for e in evs))
    if busy <= 0:
        return 0.0
    top: list[tuple[float, float]] = []
    reach = float("-inf")
    for e in sorted(evs, key=lambda e: (e.ts, -e.dur)):
        if e.ts >= reach and e.name.startswith(GLOO_EVENT_PREFIX):
            top.append((e.ts, e.end))
        reach = max(reach, e.end)
    return iv.length(iv.union(top)) / busy


def _host_lanes(host: dict[tuple[Any, Any], list[Event]], attributed: dict[Any, ThreadRanges],
                names: dict[tuple[Any, Any], str], notes: list[str]) -> list[Lane]:
    moerun = {key: _moerun_time(t) for key, t in attributed.items() if t.ranges}
    main_key = max(moerun, key=lambda k: (moerun[k], _tid_order(k)), default=None)
    lanes: list[Lane] = []
    for key in sorted(host, key=_tid_order):
        pid, tid = key
        evs = host[key]
        label = names.get(key) or f"thread {tid}"
        gloo = [e for e in evs if e.name.startswith(GLOO_EVENT_PREFIX)]
        gloo_spans = tuple(Span(name=e.name, kind="comm", start_us=e.ts, end_us=e.end)
                           for e in gloo)
        if key not in moerun and gloo and 2 * _top_level_gloo_share(evs) >= 1:
            # a gloo worker thread: everything it does is a collective
            lanes.append(_lane(f"cpu:{pid}:{tid}", "cpu", pid, tid, label, "comm",
                               iv.union((e.ts, e.end) for e in evs), gloo_spans))
            continue
        busy = iv.union((e.ts, e.end) for e in evs if not e.name.startswith(GLOO_EVENT_PREFIX))
        if key in moerun:
            t = attributed[key]
            waits = iv.union((r.ts, r.end) for r in t.ranges
                             if r.kind == "phase" and r.phase in WAIT_PHASES)
            lanes.append(_lane(f"cpu:{pid}:{tid}", "cpu", pid, tid, label,
                               "main" if key == main_key else "aux", iv.subtract(busy, waits),
                               _range_spans(t)))
        else:
            lanes.append(_lane(f"cpu:{pid}:{tid}", "cpu", pid, tid, label, "other", busy, ()))
        if gloo:
            # p2p spans on the issuing thread: in flight from issue to completion
            lanes.append(_lane(f"cpu:{pid}:{tid}:gloo", "cpu", pid, tid, f"{label} · gloo",
                               "comm", iv.union((e.ts, e.end) for e in gloo), gloo_spans))
    if len(moerun) > 1:
        notes.append(f"moerun ranges on {len(moerun)} host threads: the busiest is main, "
                     "the others aux")
    lanes.sort(key=lambda ln: (_ROLE_ORDER[ln.role], _tid_order((ln.pid, ln.tid)), ln.id))
    return lanes


def _lane(id_: str, device: str, pid: Any, tid: Any, label: str, role: str,
          busy: iv.IntervalSet, spans: tuple[Span, ...]) -> Lane:
    return Lane(id=id_, device=device, pid=pid, tid=tid, label=label, role=role, busy=busy,
                busy_us=iv.length(busy), spans=tuple(sorted(spans, key=lambda s: s.start_us)))


def _device_lanes(device: list[Event], host: dict[tuple[Any, Any], list[Event]],
                  attributed: dict[Any, ThreadRanges], notes: list[str]) -> list[Lane]:
    if not device:
        return []
    launches: dict[Any, tuple[tuple[Any, Any], float]] = {}
    for key, evs in host.items():
        for e in evs:
            corr = e.args.get("correlation")
            if e.cat in LAUNCH_CATS and corr is not None:
                launches[corr] = (key, e.ts)
    finders = {key: PhaseFinder(t.ranges) for key, t in attributed.items() if t.ranges}
    per_lane: dict[tuple[Any, Any], list[Span]] = defaultdict(list)
    linked = 0
    for d in device:
        lane_key = (d.args.get("device", d.pid), d.args.get("stream", d.tid))
        r = None
        launch = launches.get(d.args.get("correlation"))
        if launch is not None:
            linked += 1
            finder = finders.get(launch[0])
            r = finder.find(launch[1]) if finder is not None else None
        is_comm = any(m in d.name.lower() for m in COMM_KERNEL_MARKERS)
        per_lane[lane_key].append(Span(
            name=d.name, kind="comm" if is_comm else "kernel", start_us=d.ts, end_us=d.end,
            phase=None if r is None else r.phase, layer=None if r is None else r.layer,
            ub=None if r is None else r.ub, chunk=None if r is None else r.chunk))
    if finders and linked == 0:
        notes.append("no device event has a launch with the same correlation id on a host "
                     "thread: nothing could be attributed to moerun phases")
    stats = {}
    for key, spans in per_lane.items():
        total = sum(s.dur_us for s in spans)
        comm = sum(s.dur_us for s in spans if s.kind == "comm")
        experts = sum(s.dur_us for s in spans if s.phase == "experts")
        ours = sum(s.dur_us for s in spans if s.phase is not None)
        stats[key] = (comm > 0 and 2 * comm >= total, experts, ours)
    compute = [k for k, st in stats.items() if not st[0]]
    main = max((k for k in compute if stats[k][1] > 0), key=lambda k: stats[k][1], default=None)
    if main is None:
        main = max((k for k in compute if stats[k][2] > 0), key=lambda k: stats[k][2],
                   default=None)
    lanes = []
    for key, spans in per_lane.items():
        is_comm, _, ours = stats[key]
        role = "comm" if is_comm else "main" if key == main else "aux" if ours > 0 else "other"
        dev, stream = key
        lanes.append(_lane(f"gpu:{dev}:{stream}", "gpu", dev, stream,
                           f"GPU {dev} stream {stream}", role,
                           iv.union((s.start_us, s.end_us) for s in spans), tuple(spans)))
    lanes.sort(key=lambda ln: (_ROLE_ORDER[ln.role], _tid_order((ln.pid, ln.tid))))
    return lanes


# ---------------------------------------------------------------------------------------------
# figures


def _shared_set(lane: Lane) -> iv.IntervalSet:
    kinds = ("kernel", "comm") if lane.device == "gpu" else ("phase",)
    return iv.union((s.start_us, s.end_us) for s in lane.spans
                    if s.phase == "shared" and s.kind in kinds)


def _figures(lanes: list[Lane], domain: str, attributed: dict[Any, ThreadRanges],
             notes: list[str]) -> dict[str, Any]:
    comm = iv.union(p for ln in lanes if ln.role == "comm" for p in ln.busy)
    compute = iv.union(p for ln in lanes if ln.role != "comm" for p in ln.busy)
    shared = {ln.id: _shared_set(ln) for ln in lanes}
    shared_us = sum(iv.length(s) for s in shared.values())
    hidden = 0.0
    for ln in lanes:
        mine = shared[ln.id]
        if not mine:
            continue
        others = iv.union(p for o in lanes if o.id != ln.id and o.role in _WORK_ROLES
                          for p in iv.subtract(o.busy, shared[o.id]))
        hidden += iv.length(iv.intersect(mine, others))
    if domain == "gpu" and shared_us == 0 and any(
            r.phase == "shared" for t in attributed.values() for r in t.ranges):
        notes.append("shared ranges are on the host but no device work is attributed to them: "
                     "hidden_shared_pct is None")
    return dict(shared_us=shared_us, hidden_shared_us=hidden,
                hidden_shared_pct=100.0 * hidden / shared_us if shared_us > 0 else None,
                comm_us=iv.length(comm), exposed_comm_us=iv.length(iv.subtract(comm, compute)))


def _phases(attributed: dict[Any, ThreadRanges], lanes: list[Lane],
            domain: str) -> PhaseTable:
    acc: dict[PhaseKey, list] = {}  # key -> [count, host_us, device_us, device_events]
    for t in attributed.values():
        for r in t.ranges:
            if r.kind == "phase":
                a = acc.setdefault(PhaseKey(layer=r.layer, ub=r.ub, chunk=r.chunk,
                                            phase=r.phase), [0, 0.0, 0.0, 0])
                a[0] += 1
                a[1] += r.end - r.ts
    for ln in lanes:
        if ln.device != "gpu":
            continue
        for s in ln.spans:
            if s.phase is not None:
                a = acc.setdefault(PhaseKey(layer=s.layer, ub=s.ub, chunk=s.chunk,
                                            phase=s.phase), [0, 0.0, 0.0, 0])
                a[2] += s.dur_us
                a[3] += 1
    gpu = domain == "gpu"
    return PhaseTable((k, PhaseTime(count=a[0], host_us=a[1], device_us=a[2] if gpu else None,
                                    device_events=a[3])) for k, a in acc.items())
