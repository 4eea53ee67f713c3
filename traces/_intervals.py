"""Interval arithmetic on half-open time intervals ``[start, end)`` in µs (private helper).

An interval set is a tuple of ``(start, end)`` float pairs, sorted, disjoint and non-empty
(``start < end``); :func:`union` builds one from any iterable of pairs. All functions are
pure and linear in the total number of intervals (after the sort in :func:`union`).
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["IntervalSet", "union", "length", "intersect", "subtract", "clip"]

IntervalSet = tuple[tuple[float, float], ...]


def union(pairs: Iterable[tuple[float, float]]) -> IntervalSet:
    """Sorted disjoint union of ``pairs``; empty and inverted pairs are dropped.

    Touching intervals (``a.end == b.start``) are merged.
    """
    items = sorted((float(s), float(e)) for s, e in pairs if e > s)
    out: list[tuple[float, float]] = []
    for s, e in items:
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return tuple(out)


def length(a: IntervalSet) -> float:
    """Total covered time of an interval set (µs)."""
    return sum(e - s for s, e in a)


def intersect(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """``a ∩ b`` of two interval sets (two-pointer sweep)."""
    out: list[tuple[float, float]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0])
        e = min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def subtract(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """``a \\ b`` of two interval sets."""
    out: list[tuple[float, float]] = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return tuple(out)


def clip(a: IntervalSet, start: float, end: float) -> IntervalSet:
    """``a ∩ [start, end)``."""
    return intersect(a, ((start, end),)) if end > start else ()
