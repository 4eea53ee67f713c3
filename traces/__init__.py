"""moerun observability: NVTX range naming, the schedule recorder, overhead measurement,
trace capture, overlap analysis and timeline plots.

Bottom of the dependency graph (DESIGN 12): imports only the standard library and torch;
the optional ``nvtx`` package is imported on first range and matplotlib on the first
:func:`timeline` call, never at import time.

- :class:`Tracer` / :func:`range_name` (:mod:`traces.nvtx`): ``moerun/L{l}/...`` ranges to
  NVTX and, while a profiler is active, to ``torch.profiler.record_function``.
- :class:`ScheduleRecorder` / :class:`ScheduleEvent` (:mod:`traces.recorder`): the issue
  order of those ranges as data, for tests and analysis.
- :func:`measure_range_overhead` (:mod:`traces.overhead`): host cost per range.
- :func:`capture` / :class:`CaptureResult` (:mod:`traces.capture`): run a callable under
  torch.profiler and write its Chrome / Perfetto JSON trace.
- :func:`overlap` (:mod:`traces.overlap`) -> :class:`OverlapReport` (:mod:`traces.report`):
  busy lanes per CUDA stream / host thread with roles, hidden shared-expert time, exposed
  communication, per-phase time per layer, micro-batch and chunk.
- :func:`timeline` (:mod:`traces.timeline`): a PNG of the lanes (matplotlib, imported lazily).
"""

from traces.capture import CaptureResult, capture
from traces.nvtx import NVTX_DOMAIN, Tracer, nvtx_backend, range_name, ranges_silent
from traces.overhead import measure_range_overhead
from traces.overlap import overlap
from traces.recorder import (
    EVENT_KINDS,
    KNOWN_PHASES,
    STREAMS,
    ScheduleEvent,
    ScheduleRecorder,
)
from traces.report import ROLES, Lane, OverlapReport, PhaseKey, PhaseTable, PhaseTime, Span
from traces.timeline import timeline

__all__ = [
    "Tracer",
    "range_name",
    "nvtx_backend",
    "ranges_silent",
    "NVTX_DOMAIN",
    "ScheduleEvent",
    "ScheduleRecorder",
    "STREAMS",
    "EVENT_KINDS",
    "KNOWN_PHASES",
    "measure_range_overhead",
    "capture",
    "CaptureResult",
    "overlap",
    "OverlapReport",
    "Lane",
    "Span",
    "PhaseKey",
    "PhaseTime",
    "PhaseTable",
    "ROLES",
    "timeline",
]
