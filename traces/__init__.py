"""moerun observability: NVTX range naming, the schedule recorder, overhead measurement.

Bottom of the dependency graph (DESIGN 12): imports only the standard library and torch;
the optional ``nvtx`` package is imported on first range, never at import time.

- :class:`Tracer` / :func:`range_name` (:mod:`traces.nvtx`): ``moerun/L{l}/...`` ranges to
  NVTX and, while a profiler is active, to ``torch.profiler.record_function``.
- :class:`ScheduleRecorder` / :class:`ScheduleEvent` (:mod:`traces.recorder`): the issue
  order of those ranges as data, for tests and analysis.
- :func:`measure_range_overhead` (:mod:`traces.overhead`): host cost per range.
"""

from traces.nvtx import NVTX_DOMAIN, Tracer, nvtx_backend, range_name
from traces.overhead import measure_range_overhead
from traces.recorder import (
    EVENT_KINDS,
    KNOWN_PHASES,
    STREAMS,
    ScheduleEvent,
    ScheduleRecorder,
)

__all__ = [
    "Tracer",
    "range_name",
    "nvtx_backend",
    "NVTX_DOMAIN",
    "ScheduleEvent",
    "ScheduleRecorder",
    "STREAMS",
    "EVENT_KINDS",
    "KNOWN_PHASES",
    "measure_range_overhead",
]
