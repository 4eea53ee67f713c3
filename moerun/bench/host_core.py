"""Which CPU core the benchmark's host figures run on (``moerun bench --layer --host-core``).

A forward's host time is Python and driver calls, so it runs as fast as the core under it.
On a shared machine the cores a process may use do not run alike, and not for long: on the
H200 lease a fixed pure-Python loop took 700-1400 µs depending on the core, and which cores
were fast changed between two surveys a second apart (DECISIONS, "Host figures and the
lease"). :func:`survey` times the loop on each allowed core; :func:`placed` runs a block
(one round of host figures) on one core -- the one a fresh survey found fastest, or a given
one -- and gives the thread its cores back afterwards.

Host only; changes the calling thread's CPU affinity (Linux ``sched_setaffinity``) and,
inside :func:`placed`, torch's intra-op thread count (one core: more would only contend).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Iterator

import torch

__all__ = ["CoreSurvey", "Placement", "loop_samples", "loop_us", "survey", "placed",
           "parse_host_core"]


def loop_samples(n: int) -> list[float]:
    """``n`` timings, in µs, of a fixed pure-Python loop (10k iterations of an attribute read
    and a call) on the core the calling thread runs on: the lease's calibration loop."""
    class A:
        b = 1

    def f(v: int) -> int:
        return v + 1

    out = []
    for _ in range(n):
        a, t = A(), 0
        t0 = time.perf_counter()
        for _ in range(10_000):
            t = f(t) + a.b
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def loop_us(repeats: int = 5) -> float:
    """The fastest of ``repeats`` :func:`loop_samples`, in µs.

    Host only: busy-times a Python loop on the calling thread's core."""
    return min(loop_samples(repeats))


@dataclass(frozen=True, kw_only=True)
class CoreSurvey:
    """The loop's µs per allowed core (``speeds``), and the core it ran fastest on."""

    speeds: dict[int, float]

    @property
    def fastest(self) -> int:
        return min(self.speeds, key=self.speeds.__getitem__)

    def describe(self) -> str:
        """One line: the loop's range of times over the surveyed cores and the fastest core.

        Pure; host only."""
        lo, hi = min(self.speeds.values()), max(self.speeds.values())
        return (f"python loop {lo:.0f}-{hi:.0f} us over {len(self.speeds)} cores, fastest "
                f"core {self.fastest}")


def survey(repeats: int = 5) -> CoreSurvey:
    """Time :func:`loop_us` on each core the calling thread may use, restoring its affinity
    afterwards. Linux only (``os.sched_setaffinity``).

    Host only; changes the calling thread's CPU affinity while it runs."""
    allowed = sorted(os.sched_getaffinity(0))
    speeds = {}
    try:
        for core in allowed:
            os.sched_setaffinity(0, {core})
            speeds[core] = loop_us(repeats)
    finally:
        os.sched_setaffinity(0, allowed)
    return CoreSurvey(speeds=speeds)


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where a :func:`placed` block ran: ``core`` (None: wherever the OS put it) and the
    loop's µs there just before (NaN when not surveyed)."""

    core: int | None
    loop_us: float


@contextlib.contextmanager
def placed(where: str | int, repeats: int = 3) -> Iterator[Placement]:
    """Run the block on one core: ``"fastest"`` (a fresh :func:`survey`'s fastest), a core
    number, or ``"none"`` (no change). Restores the thread's affinity and torch's thread
    count on exit. Raises ``ValueError`` naming ``--host-core`` for a core not allowed.

    Host only; while the block runs, pins the calling thread to the core and sets
    ``torch.set_num_threads(1)`` (process-wide)."""
    if where == "none":
        yield Placement(core=None, loop_us=float("nan"))
        return
    allowed = sorted(os.sched_getaffinity(0))
    if where == "fastest":
        found = survey(repeats)
        core, speed = found.fastest, found.speeds[found.fastest]
    else:
        core, speed = _allowed_core(int(where)), float("nan")
    threads = torch.get_num_threads()
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)  # NOTE: one core: more intra-op threads would only contend
    try:
        if speed != speed:  # a given core: time the loop there
            speed = loop_us(repeats)
        yield Placement(core=core, loop_us=speed)
    finally:
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, allowed)


def _allowed_core(core: int) -> int:
    """``core`` if this thread may run there, else ``ValueError`` naming ``--host-core``."""
    allowed = sorted(os.sched_getaffinity(0))
    if core not in allowed:
        raise ValueError(f"--host-core {core}: not one of this process's cores {allowed}")
    return core


def parse_host_core(value: str) -> str | int:
    """``--host-core``: ``none`` (leave the affinity), ``fastest`` (the survey's fastest
    core) or a core number this process may use. Raises ``ValueError`` naming the flag.

    Host only; reads this process's CPU affinity."""
    if value in ("none", "fastest"):
        return value
    try:
        core = int(value)
    except ValueError:
        raise ValueError(f"--host-core {value}: expected none, fastest or a core number") \
            from None
    if core < 0:
        raise ValueError(f"--host-core {value}: a core number is >= 0")
    return _allowed_core(core)
