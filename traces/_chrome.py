"""Reading a Chrome / Perfetto JSON trace into plain event records (private helper).

Accepted input (what ``torch.profiler.profile.export_chrome_trace`` writes, or its
``json.load`` result): a path (``str`` / ``os.PathLike``; ``.json`` or ``.json.gz``), a dict
with a ``"traceEvents"`` list, or the bare event list of the Chrome "JSON array format".

Only complete events (``"ph": "X"``, with ``ts`` and ``dur`` in µs) and ``thread_name`` /
``process_name`` metadata (``"ph": "M"``) are read. Kineto writes nothing else that the
analysis needs: flow arrows (``ac2g``) duplicate the ``correlation`` args, and instant events
are profiler bookkeeping. The profiler's own span (``cat == "Trace"``) and device-side
annotation copies (``cat == "gpu_user_annotation"``, record_function ranges re-drawn on a
stream) are dropped: they are annotations, not work.
"""

from __future__ import annotations

import gzip
import json
import os
import pathlib
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["Event", "Trace", "load", "DEVICE_CATS", "LAUNCH_CATS"]

# Device work, one lane per (device, stream). Lower-cased; old Kineto used "Kernel"/"Memcpy".
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
# Host API calls that launch device work and carry ``args["correlation"]``.
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver"})
_DROPPED_CATS = frozenset({"trace", "gpu_user_annotation", "ac2g"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """One complete event. ``ts``/``dur`` in µs as written in the trace; ``pid``/``tid`` as
    written (ints for Kineto host threads and devices/streams, sometimes strings)."""

    name: str
    cat: str  # lower-cased category
    pid: Any
    tid: Any
    ts: float
    dur: float
    args: Mapping[str, Any]

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass(frozen=True, kw_only=True, slots=True)
class Trace:
    """Complete events in file order plus thread names ``{(pid, tid): name}``."""

    events: tuple[Event, ...]
    thread_names: Mapping[tuple[Any, Any], str]


def _describe(trace: Any) -> str:
    text = repr(trace)
    return text if len(text) <= 80 else text[:77] + "..."


def _read_path(path: pathlib.Path, what: str) -> Any:
    if not path.exists():
        raise FileNotFoundError(
            f"{what}={str(path)!r}: no such file; pass the path that "
            "traces.capture / prof.export_chrome_trace wrote, or the loaded dict"
        )
    if not path.is_file():
        raise ValueError(f"{what}={str(path)!r} is not a file; pass a Chrome trace .json path")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, EOFError) as exc:
        raise ValueError(
            f"{what}={str(path)!r} is not a Chrome trace: it is not valid JSON ({exc}); "
            "pass a file written by prof.export_chrome_trace"
        ) from exc


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def load(trace: Any, *, what: str = "trace") -> Trace:
    """Parse ``trace`` (path, dict or event list; see the module docstring).

    Args:
        trace: the trace or where it is.
        what: the argument name used in error messages.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: not JSON, or JSON that is not a Chrome trace (no ``traceEvents`` list of
            event objects).
        TypeError: ``trace`` is neither a path, a dict nor a list.

    Side effects: reads the file; nothing else.
    """
    if isinstance(trace, (str, os.PathLike)):
        data = _read_path(pathlib.Path(trace), what)
        origin = repr(str(trace))
    elif isinstance(trace, (dict, list)):
        data = trace
        origin = "(the dict passed)" if isinstance(trace, dict) else "(the list passed)"
    else:
        raise TypeError(
            f"{what}={_describe(trace)} is a {type(trace).__name__}; pass a Chrome trace JSON "
            "path (str / os.PathLike) or its loaded dict"
        )
    if isinstance(data, dict):
        if "traceEvents" not in data:
            keys = sorted(data)[:6]
            raise ValueError(
                f"{what}={origin} is not a Chrome trace: no 'traceEvents' key (keys: {keys}); "
                "pass the JSON that prof.export_chrome_trace writes"
            )
        raw = data["traceEvents"]
    elif isinstance(data, list):
        raw = data
    else:
        raise ValueError(
            f"{what}={origin} is not a Chrome trace: the JSON is a {type(data).__name__}, "
            "expected an object with a 'traceEvents' list"
        )
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise ValueError(
            f"{what}={origin} is not a Chrome trace: 'traceEvents' must be a list of event "
            "objects"
        )
    events: list[Event] = []
    names: dict[tuple[Any, Any], str] = {}
    for e in raw:
        ph = e.get("ph")
        if ph == "M":
            if e.get("name") == "thread_name":
                args = e.get("args") or {}
                if isinstance(args, dict) and isinstance(args.get("name"), str):
                    names[(e.get("pid"), e.get("tid"))] = args["name"]
            continue
        if ph != "X":
            continue
        ts, dur = _number(e.get("ts")), _number(e.get("dur"))
        name = e.get("name")
        if ts is None or dur is None or dur < 0 or not isinstance(name, str):
            continue
        cat = str(e.get("cat", "")).lower()
        if cat in _DROPPED_CATS:
            continue
        args = e.get("args")
        events.append(Event(name=name, cat=cat, pid=e.get("pid"), tid=e.get("tid"), ts=ts,
                            dur=dur, args=args if isinstance(args, dict) else {}))
    return Trace(events=tuple(events), thread_names=names)
