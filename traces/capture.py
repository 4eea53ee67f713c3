"""``traces.capture``: run a callable under ``torch.profiler`` and write its Chrome trace.

The written JSON opens in Perfetto (ui.perfetto.dev) or ``chrome://tracing`` and is the input
of :func:`traces.overlap` and :func:`traces.timeline`. While the profiler is active every
moerun range is mirrored as ``torch.profiler.record_function`` (:mod:`traces.nvtx`), so the
trace holds the ``moerun/L{l}/...`` ranges on the host thread that ran them.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

__all__ = ["capture", "CaptureResult", "default_activities"]


@dataclass(frozen=True, kw_only=True)
class CaptureResult:
    """What :func:`capture` produced.

    Fields:
        path: the Chrome / Perfetto JSON trace written (``out_dir/{name}.json``).
        value: what ``fn()`` returned (kept alive by this object).
        activities: the profiler activities recorded, e.g. ``("CPU",)`` or ``("CPU", "CUDA")``.
    """

    path: pathlib.Path
    value: Any
    activities: tuple[str, ...]


def default_activities() -> list[Any]:
    """What :func:`capture` records when given no ``activities``: CPU, plus CUDA when a GPU
    is available. Host only."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def _check_activities(activities: Iterable[Any] | None) -> list[Any]:
    if activities is None:
        return default_activities()
    kind = torch.profiler.ProfilerActivity
    if isinstance(activities, (str, bytes)) or not hasattr(activities, "__iter__"):
        raise TypeError(f"activities={activities!r} is invalid: pass None or a list of "
                        "torch.profiler.ProfilerActivity, e.g. [ProfilerActivity.CPU]")
    acts = list(activities)
    bad = [a for a in acts if not isinstance(a, kind)]
    if bad or not acts:
        raise ValueError(f"activities={activities!r} is invalid: pass None or a non-empty list "
                         "of torch.profiler.ProfilerActivity, e.g. [ProfilerActivity.CPU]")
    return acts


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name \
            or os.sep in name or (os.altsep is not None and os.altsep in name):
        raise ValueError(f"name={name!r} is invalid: use a non-empty file stem without path "
                         "separators, e.g. 'trace' or 'rank0'")
    return name[: -len(".json")] if name.endswith(".json") else name


def capture(fn: Callable[[], Any], out_dir: str | os.PathLike, *, name: str = "trace",
            activities: Iterable[Any] | None = None) -> CaptureResult:
    """Run ``fn()`` under ``torch.profiler.profile`` and write ``out_dir/{name}.json``.

    Args:
        fn: a callable without arguments (e.g. ``lambda: layer(x, logits)``), run once.
        out_dir: folder for the trace; created (with parents) if missing.
        name: the file stem (``"trace"`` -> ``trace.json``; a trailing ``.json`` is accepted).
        activities: ``torch.profiler.ProfilerActivity`` values; None records the CPU and, when
            ``torch.cuda.is_available()``, CUDA (kernels, memcpys, with launch correlation ids).

    Returns:
        :class:`CaptureResult` with the written path and ``fn``'s return value.

    Raises:
        TypeError / ValueError: ``fn`` not callable, bad ``out_dir``, ``name`` or
            ``activities``. Whatever ``fn`` raises propagates; no trace is written then.

    Side effects: writes one file (overwriting it). Host sync: none of its own; with the
    CUDA activity the profiler itself synchronizes the device when it stops
    (``torch.autograd.profiler.profile.__exit__`` calls ``torch.cuda.synchronize()``) so
    kernels still in flight are recorded, and collecting CUPTI records costs device time while
    profiling. Not usable while another profiler is active in the process (torch raises).
    Collectives inside ``fn`` run as usual: call ``capture`` on every rank.
    """
    if not callable(fn):
        raise TypeError(f"fn={fn!r} is not callable: pass a function without arguments, "
                        "e.g. lambda: layer(x, logits)")
    if not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"out_dir={out_dir!r} is invalid: pass a folder path (str or "
                        "os.PathLike)")
    stem = _check_name(name)
    acts = _check_activities(activities)
    folder = pathlib.Path(out_dir)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"out_dir={str(folder)!r} exists and is not a folder; pass a folder")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.json"
    with torch.profiler.profile(activities=acts) as prof:
        value = fn()
    prof.export_chrome_trace(str(path))
    return CaptureResult(path=path, value=value, activities=tuple(a.name for a in acts))
