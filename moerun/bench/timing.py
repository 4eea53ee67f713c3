"""Timers for ``moerun bench``: device events on CUDA, a host clock on CPU; CUDA-graph replay.

Every timer warms up first and returns one time per sample, in seconds; callers take the
median. ``fn(i)`` is called with the sample index so callers can rotate inputs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

__all__ = ["time_samples", "time_graph_replay", "host_issue_samples", "HostCall",
           "interleaved_host_samples", "GraphCaptureError"]


class GraphCaptureError(RuntimeError):
    """Capturing the calls into a CUDA graph failed (e.g. a host sync inside them)."""


def time_samples(fn: Callable[[int], Any], device: torch.device, samples: int, *,
                 warmup: int) -> list[float]:
    """Time ``samples`` calls ``fn(0) .. fn(samples - 1)`` one by one, after ``warmup`` calls.

    CUDA: a start/end event pair around each call on the current stream, no sync between
    calls (so launch gaps the host causes are inside the time, and queued device work is
    not); one ``synchronize`` at the end. CPU: ``perf_counter`` around each call.
    """
    for i in range(warmup):
        fn(i)
    if device.type == "cuda":
        torch.cuda.synchronize()  # NOTE: host sync, outside the timed region
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
        for i in range(samples):
            starts[i].record()
            fn(i)
            ends[i].record()
        torch.cuda.synchronize()  # NOTE: host sync to read the events
        return [s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends)]
    out = []
    for i in range(samples):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def host_issue_samples(fn: Callable[[int], Any], device: torch.device, samples: int, *,
                       warmup: int) -> list[float]:
    """Host time of each of ``samples`` calls ``fn(i)`` issued with an idle device queue: on
    CUDA a ``synchronize`` before each call (outside the timed region), then ``perf_counter``
    around it; after ``warmup`` untimed calls. Seconds per call.

    Host sync: ``torch.cuda.synchronize()`` before each call and at the end (CUDA); not
    capturable."""
    cuda = device.type == "cuda"
    for i in range(warmup):
        fn(i)
    out = []
    for i in range(samples):
        if cuda:
            torch.cuda.synchronize()  # NOTE: host sync, outside the timed call
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize()
    return out


@dataclass(frozen=True, kw_only=True)
class HostCall:
    """One call of :func:`interleaved_host_samples`: ``fn(i)`` is timed; ``setup()``, if
    given, runs untimed before the sync that precedes it (e.g. a config swap)."""

    fn: Callable[[int], Any]
    setup: Callable[[], Any] | None = None


def interleaved_host_samples(calls: Sequence[HostCall], device: torch.device, samples: int, *,
                             warmup: int) -> list[list[float]]:
    """:func:`host_issue_samples` for several calls at once, interleaved: sample ``i`` of
    every call, in the given order, before sample ``i + 1`` of any, so a change in the
    host's speed during the round reaches every call alike (figures that are subtracted
    from each other should come from one such round). ``warmup`` untimed rounds first.
    Each timed call follows the previous call of the rotation and a ``synchronize`` (CUDA).
    Returns one list of seconds per call, in ``calls`` order.

    Host sync: ``torch.cuda.synchronize()`` before each call and at the end (CUDA); not
    capturable."""
    cuda = device.type == "cuda"
    out: list[list[float]] = [[] for _ in calls]
    for i in range(warmup + samples):
        for c, call in enumerate(calls):
            if call.setup is not None:
                call.setup()
            if cuda:
                torch.cuda.synchronize()  # NOTE: host sync, outside the timed region
            t0 = time.perf_counter()
            call.fn(i)
            if i >= warmup:
                out[c].append(time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize()
    return out


def time_graph_replay(fn: Callable[[int], Any], calls: int, samples: int, *,
                      warmup: int) -> list[float]:
    """Capture ``fn(0) .. fn(calls - 1)`` into one CUDA graph; time ``samples`` replays with
    events (after ``warmup`` replays); return seconds **per call** (replay time / ``calls``).

    ``fn`` is first run once per call index on a side stream (lazy initialisation stays out of
    the capture). Raises :class:`GraphCaptureError` when capture fails. The graph and its
    memory pool are released before returning.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(calls):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()  # NOTE: host sync before capture
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            outs = [fn(i) for i in range(calls)]
    except Exception as exc:  # noqa: BLE001 - any failure inside capture means "not capturable"
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            pass
        raise GraphCaptureError(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}") \
            from exc
    try:
        times = time_samples(lambda _: graph.replay(), torch.device("cuda"), samples,
                             warmup=warmup)
    finally:
        del outs
        graph.reset()
    return [t / calls for t in times]
