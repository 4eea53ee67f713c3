"""Rank-side task bodies for the trace-analysis tests (module-level so the pool can pickle them).

Each task returns plain Python values (floats, strings, lists), never tensors.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.profiler import record_function

import traces


def _spin(ms: float) -> int:
    """Busy the calling thread for ``ms`` milliseconds of wall time (the known CPU work)."""
    end = time.perf_counter() + ms / 1000.0
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


def _span(rep: traces.OverlapReport, name: str) -> tuple[float, float]:
    spans = [s for ln in rep.lanes for s in ln.spans if s.name == name]
    assert len(spans) == 1, (name, spans)
    return spans[0].start_us, spans[0].end_us


def shared_during_allreduce_task(ctx, *, numel: int, shared_ms: float, out_dir: str) -> dict:
    """Issue an async all-reduce of ``numel`` fp32 values, spin ``shared_ms`` inside a
    ``moerun/L0/shared`` range while it is in flight, then wait; all under traces.capture.

    Returns the report's figures, lanes and the spans the test compares, plus the
    all-reduced value (every element must be ``sum(r + 1)``).
    """
    t = torch.full((numel,), float(ctx.rank + 1))
    warm = torch.ones(16)
    dist.all_reduce(warm, group=ctx.group)  # first collective outside the trace
    dist.barrier(group=ctx.group)

    def body() -> float:
        with record_function("moerun/L0/combine"):
            work = dist.all_reduce(t, group=ctx.group, async_op=True)
        with record_function("moerun/L0/shared"):
            _spin(shared_ms)
        with record_function("moerun/L0/combine.wait"):
            work.wait()
        return float(t[0]) + float(t[-1])

    res = traces.capture(body, out_dir, name=f"rank{ctx.rank}")
    rep = traces.overlap(res.path)
    main = rep.lanes_with_role("main")
    comm = rep.lanes_with_role("comm")
    return {
        "path": str(res.path),
        "value": res.value,
        "device": rep.device,
        "roles": sorted(ln.role for ln in rep.lanes),
        "main_tid": [ln.tid for ln in main],
        "comm_tids": [ln.tid for ln in comm],
        "comm_span_names": sorted(s.name for ln in comm for s in ln.spans),
        "main_busy_us": sum(ln.busy_us for ln in main),
        "comm_us": rep.comm_us,
        "exposed_comm_us": rep.exposed_comm_us,
        "shared_us": rep.shared_us,
        "hidden_shared_us": rep.hidden_shared_us,
        "hidden_shared_pct": rep.hidden_shared_pct,
        "combine": _span(rep, "moerun/L0/combine"),
        "shared": _span(rep, "moerun/L0/shared"),
        "wait": _span(rep, "moerun/L0/combine.wait"),
        "gloo": [(s.start_us, s.end_us) for ln in comm for s in ln.spans],
        "summary": str(rep),
    }
