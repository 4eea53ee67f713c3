"""Host overhead of moerun trace ranges (DESIGN 10: <= 1 µs per range without a profiler).

Used by ``moerun bench --overhead``; a benchmark, not a test — nothing here asserts a time.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from traces import nvtx as _nvtx
from traces.recorder import ScheduleRecorder

__all__ = ["measure_range_overhead"]

_REPEATS = 3  # best of 3 passes, like timeit: the minimum is the least disturbed run


def _time_ranges(tracer: _nvtx.Tracer, n: int) -> float:
    """ns per ``with tracer.phase("dispatch"): pass`` (construction + enter + exit)."""
    phase = tracer.phase
    t0 = time.perf_counter_ns()
    for _ in range(n):
        with phase("dispatch"):
            pass
    return (time.perf_counter_ns() - t0) / n


def _time_loop(n: int) -> float:
    """ns per iteration of the empty loop, for reference."""
    t0 = time.perf_counter_ns()
    for _ in range(n):
        pass
    return (time.perf_counter_ns() - t0) / n


def _best(fn: Any, *args: Any, repeats: int) -> float:
    return min(fn(*args) for _ in range(repeats))


def measure_range_overhead(n: int = 200_000) -> dict[str, Any]:
    """Measure the host cost of one phase range (build + enter + exit) on this machine.

    Each configuration runs ``n`` ranges ``with tracer.phase("dispatch"): pass`` inside
    ``chunk(0)`` of a layer-3 Tracer, three times with the garbage collector paused, and keeps
    the best pass.

    Args:
        n: ranges per pass (>= 1).

    Returns:
        dict with
            ``noop_ns``: ns per range with the no-op NVTX backend, no recorder (the figure
                DESIGN 10 bounds by 1 µs; the process's real backend is bypassed);
            ``recorder_ns``: ns per range with the no-op backend and a recorder attached;
            ``backend``: the process's NVTX backend name (:func:`traces.nvtx.nvtx_backend`);
            ``backend_ns``: ns per range with that backend, no recorder (equals the no-op
                case's cost when the backend is ``"none"``);
            ``loop_ns``: ns per empty loop iteration (included in the figures above);
            ``profiler_active``: a torch profiler was active while measuring (then every
                figure includes record_function and is not the no-profiler cost);
            ``n``: ranges per pass.

    Side effects: CPU time (~0.5 s at the default n); pauses and restores the garbage
    collector; allocates ``n`` recorder events transiently; emits ``n`` NVTX ranges named
    ``moerun/L3/dispatch`` through the real backend. No device work, no host sync. Call it
    from an otherwise idle process: not meant to run concurrently with a forward.
    """
    if type(n) is not int or n < 1:
        raise ValueError(f"n={n!r} is invalid: use an int >= 1")

    def tracer(recorder: ScheduleRecorder | None, backend: Any) -> _nvtx.Tracer:
        t = _nvtx.Tracer(layer_idx=3, rank=0, recorder=recorder)
        t._backend = backend  # same package: bypass the process backend for the no-op figure
        return t

    real_backend = _nvtx._get_backend()
    recorder = ScheduleRecorder()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        loop_ns = _best(_time_loop, n, repeats=_REPEATS)
        timings = {}
        for key, t in (
            ("noop_ns", tracer(None, _nvtx._NULL_BACKEND)),
            ("recorder_ns", tracer(recorder, _nvtx._NULL_BACKEND)),
            ("backend_ns", tracer(None, real_backend)),
        ):
            with t.chunk(0):
                best = float("inf")
                for _ in range(_REPEATS):
                    best = min(best, _time_ranges(t, n))
                    recorder.clear()
            timings[key] = best
        profiler_active = bool(_nvtx._profiler_enabled())
    finally:
        recorder.clear()
        if gc_was_enabled:
            gc.enable()
    return {
        "noop_ns": round(timings["noop_ns"], 1),
        "recorder_ns": round(timings["recorder_ns"], 1),
        "backend": real_backend.name,
        "backend_ns": round(timings["backend_ns"], 1),
        "loop_ns": round(loop_ns, 1),
        "profiler_active": profiler_active,
        "n": n,
    }
