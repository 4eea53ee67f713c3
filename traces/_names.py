"""Range names of :mod:`traces.nvtx` and the argument checks behind them (private).

``moerun/L{layer_idx}/{suffix}``; the full scheme is in :mod:`traces.nvtx`'s docstring. Pure
functions; thread-safe.
"""

from __future__ import annotations

from typing import Any

from traces.recorder import STREAMS

__all__ = ["range_name"]


def _check_layer_idx(layer_idx: Any) -> None:
    if layer_idx is not None and (type(layer_idx) is not int or layer_idx < 0):
        raise ValueError(f"layer_idx={layer_idx!r} is invalid: use an int >= 0 or None")


def _layer_prefix(layer_idx: int | None) -> str:
    return "moerun/L-/" if layer_idx is None else f"moerun/L{layer_idx}/"


def range_name(layer_idx: int | None, suffix: str) -> str:
    """The full name of a moerun range: ``"moerun/L{layer_idx}/{suffix}"``.

    Args:
        layer_idx: the layer index (int >= 0), or None, which gives ``"moerun/L-/{suffix}"``.
        suffix: the part after the layer, e.g. ``"dispatch"``, ``"chunk0"``, ``"dbo/ub1"``.

    Returns:
        the name, exactly as emitted to NVTX / torch.profiler and stored in
        :attr:`traces.recorder.ScheduleEvent.name`.

    Side effects: none (pure). Thread-safe.
    """
    _check_layer_idx(layer_idx)
    if not isinstance(suffix, str) or not suffix or suffix.startswith("/"):
        raise ValueError(
            f"suffix={suffix!r} is invalid: use a non-empty str without a leading '/', "
            "e.g. 'dispatch' or 'chunk0'"
        )
    return _layer_prefix(layer_idx) + suffix


def _check_index(what: str, value: Any) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"{what}={value!r} is invalid: use an int >= 0")


def _check_stream(stream: Any) -> None:
    if stream not in STREAMS:
        raise ValueError(f"stream={stream!r} is invalid: use one of {sorted(STREAMS)}")
