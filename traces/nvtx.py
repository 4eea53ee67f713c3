"""NVTX range naming and emission for every phase of a moerun forward (DESIGN 10).

Names (``l`` = layer index, ``L-`` when the layer has none)::

    moerun/L{l}/dbo/ub{u}        micro-batch u of a DBO forward           Tracer.ub(u)
      moerun/L{l}/chunk{c}       chunk c                                  Tracer.chunk(c)
        moerun/L{l}/{phase}      route, pad, dispatch, dispatch.wait,     Tracer.phase(p)
                                 quantize, experts, combine, combine.wait,
                                 shared, eplb.{hook}
    moerun/L{l}/dbo/yield        zero-length mark at a DBO yield          Tracer.mark()

Backends, resolved once on first use and cached for the process, and only when an NVTX tool
is attached (see below):

1. the ``nvtx`` PyPI package (``pip install nvtx``), ranges in NVTX domain ``"moerun"``
   (Nsight shows them on the thread's "NVTX (moerun)" row and ``nsys --nvtx-domain-include
   moerun`` filters them);
2. else ``torch.cuda.nvtx`` when ``torch.cuda.is_available()`` (default NVTX domain);
3. else nothing (CPU without the package).

Decision -- no NVTX calls when no tool listens. Without a tool NVTX discards every range, but
each range still costs its Python binding (about 2 µs per range on the H200 machine, 15 µs
per forward). A tool is attached when NVTX's injection variable is set
(``NVTX_INJECTION64_PATH`` / ``NVTX_INJECTION32_PATH``, which Nsight Systems and Nsight
Compute set for the profiled process) or Nsight Systems' session variable
(``NSYS_PROFILING_SESSION_ID``) is; ``MOERUN_NVTX=1`` forces ranges on (another tool),
``MOERUN_NVTX=0`` off. The choice is made once, at the first range.

Decision — start/end ranges, never push/pop. ``push``/``pop`` is a per-thread stack, and the
DBO scheduler steps two micro-batch generators alternately on one host thread, so ub0's and
ub1's ranges interleave (``ub0/dispatch`` opens, ``ub1/dispatch`` opens, ``ub0/dispatch``
closes...). Process-scoped ``start_range``/``end_range`` (``torch.cuda.nvtx.range_start``/
``range_end``) return a handle and need no LIFO order, so each micro-batch keeps its own
:class:`Tracer` with its own nesting stack and the names stay right. Nsight still draws the
ranges nested by time. The cost: ``nsys --capture-range=nvtx`` keys on push/pop ranges, so
use ``cudaProfilerApi`` or a time window to limit capture instead.

torch.profiler: while a profiler is active (checked per range with
``torch._C._autograd._profiler_enabled()``, ~15 ns: the C++ flag covers every way a profiler
is started, unlike the Python-side ``torch.autograd.profiler._is_profiler_enabled`` which only
``torch.profiler.profile``/``torch.autograd.profiler.profile`` set), each range is mirrored as
``torch.profiler.record_function(name)`` so it appears in ``prof.events()`` and Chrome/Perfetto
traces; a mark becomes a zero-length record_function. NOTE: under
``torch.autograd.profiler.emit_nvtx`` the profiler itself turns record_function into NVTX
ranges, so each range then shows twice in Nsight.

The optional :class:`traces.recorder.ScheduleRecorder` is fed from the same entry point, so
recorded names equal emitted names.

Cost: with no profiler, no recorder and no NVTX backend a range costs well under 1 µs
(enter + exit, object construction included; see :func:`traces.overhead.measure_range_overhead`).
No function here launches device work or syncs the host; everything runs on the calling thread.
"""

from __future__ import annotations

import logging
import threading
from types import ModuleType
from typing import Any

import torch

from traces._backends import (
    NVTX_DOMAIN,
    NVTX_PACKAGE_API,
    NullBackend,
    NvtxPackageBackend,
    TorchCudaNvtxBackend,
    nvtx_tool_attached,
)
from traces._names import _check_index, _check_layer_idx, _check_stream, _layer_prefix, range_name
from traces.recorder import STREAMS, ScheduleEvent, ScheduleRecorder

__all__ = ["Tracer", "range_name", "nvtx_backend", "nvtx_tool_attached", "ranges_silent",
           "NVTX_DOMAIN"]

logger = logging.getLogger(__name__)

# NOTE: looked up per range. The C++ flag is the authoritative "a profiler is collecting"
# state (set for torch.profiler, the legacy autograd profiler and on-demand Kineto alike).
_profiler_enabled = getattr(torch._C._autograd, "_profiler_enabled", None)
if _profiler_enabled is None:  # pragma: no cover - older/newer torch without the binding

    def _profiler_enabled() -> bool:
        return torch.autograd.profiler._is_profiler_enabled


# Module attribute (not a from-import) so tests can wrap it to count calls.
_record_function = torch.autograd.profiler.record_function


_NULL_BACKEND = NullBackend()
_NVTX_PACKAGE_API = NVTX_PACKAGE_API

_backend: Any = None  # resolved lazily by _get_backend(); reset only by the test hook
_backend_lock = threading.Lock()


def _select_backend() -> Any:
    if not nvtx_tool_attached():
        logger.debug("moerun traces: no NVTX tool attached (set MOERUN_NVTX=1 to force ranges)")
        return _NULL_BACKEND
    try:
        import nvtx as nvtx_package  # optional dependency, imported on first use only
    except ImportError:
        nvtx_package = None
    except Exception as exc:  # a broken install must not take the forward down
        logger.warning(
            "moerun traces: importing the nvtx package failed (%r); falling back to "
            "torch.cuda.nvtx or no NVTX. Reinstall with `pip install -U nvtx`.",
            exc,
        )
        nvtx_package = None
    if nvtx_package is not None:
        if all(callable(getattr(nvtx_package, a, None)) for a in _NVTX_PACKAGE_API):
            logger.debug("moerun traces: NVTX ranges via the nvtx package")
            return NvtxPackageBackend(nvtx_package)
        logger.warning(
            "moerun traces: the installed nvtx package lacks %s; falling back. "
            "Upgrade with `pip install -U nvtx`.",
            "/".join(_NVTX_PACKAGE_API),
        )
    if torch.cuda.is_available():
        logger.debug("moerun traces: NVTX ranges via torch.cuda.nvtx (nvtx package not installed)")
        return TorchCudaNvtxBackend()
    logger.debug("moerun traces: no NVTX backend (no nvtx package, no CUDA)")
    return _NULL_BACKEND


def _get_backend() -> Any:
    """The cached backend, resolving it on first call (thread-safe)."""
    global _backend
    backend = _backend
    if backend is None:
        with _backend_lock:
            if _backend is None:
                _backend = _select_backend()
            backend = _backend
    return backend


def _set_backend_for_tests(module: ModuleType | Any | None) -> None:
    """Test hook: route NVTX emission to ``module``, or reset the cached choice.

    Args:
        module: an object with ``start_range(message=, domain=) -> handle``,
            ``end_range(handle)`` and ``mark(message=, domain=)`` (a fake ``nvtx`` module)
            — emission goes to it as if it were the ``nvtx`` package; or None to forget the
            cached backend so the next use resolves it again (e.g. after monkeypatching
            ``sys.modules["nvtx"]`` or ``torch.cuda.is_available``).

    Side effects: changes the process-wide backend for Tracers built *after* the call (a
    Tracer captures the backend when it is constructed). Not for use while other threads
    emit ranges.
    """
    global _backend
    with _backend_lock:
        if module is None:
            _backend = None
            return
        missing = [a for a in _NVTX_PACKAGE_API if not callable(getattr(module, a, None))]
        if missing:
            raise TypeError(
                f"_set_backend_for_tests(module={module!r}): module lacks {missing}; "
                "give it start_range(message=, domain=), end_range(handle), mark(message=, domain=)"
            )
        _backend = NvtxPackageBackend(module)


def nvtx_backend() -> str:
    """Which NVTX backend this process uses: ``"nvtx"``, ``"torch.cuda.nvtx"`` or ``"none"``.

    Resolves (and caches) the backend if no range was emitted yet; that may import the
    optional ``nvtx`` package and call ``torch.cuda.is_available()``. No host sync.
    Thread-safe.
    """
    return _get_backend().name


def ranges_silent(recorder: Any = None) -> bool:
    """True when a range entered now would be seen by nobody: no ``recorder``, no NVTX
    backend (no tool attached) and no active torch profiler. A caller may then skip its
    ranges altogether (the one-rank forward path does). ~0.1 µs; no host sync; thread-safe.
    """
    return recorder is None and not _get_backend().enabled and not _profiler_enabled()


# ----------------------------------------------------------------------------------------------
# Ranges: small __slots__ classes, not @contextmanager generators (an empty one alone costs
# ~0.85 µs per with-block on the 2-core CI-class CPU; this whole range costs ~0.56 µs).


class _Range:
    """One range; built by :class:`Tracer`, entered once."""

    # _open: None on the fast path (no NVTX backend, no profiler), else
    # (backend or None, nvtx handle, record_function or None) to close on exit.
    __slots__ = ("_tracer", "_name", "_phase", "_stream", "_open")

    def __init__(self, tracer: Tracer, name: str, phase: str, stream: str) -> None:
        self._tracer = tracer
        self._name = name
        self._phase = phase
        self._stream = stream
        self._open: tuple[Any, Any, Any] | None = None

    @property
    def name(self) -> str:
        """The full range name."""
        return self._name

    def __repr__(self) -> str:
        return f"<moerun range {self._name!r}>"

    def __enter__(self) -> _Range:
        # NOTE: the single emission point for ranges (recorder, NVTX, profiler); kept inline
        # (no helper call) because it is the hot path.
        tracer = self._tracer
        tracer._stack.append(self)
        recorder = tracer._recorder
        if recorder is not None:
            recorder.record(
                ScheduleEvent(
                    name=self._name,
                    phase=self._phase,
                    layer_idx=tracer._layer_idx,
                    chunk=tracer._chunk,
                    ub=tracer._ub,
                    stream=self._stream,
                    rank=tracer._rank,
                    kind="range",
                )
            )
        backend = tracer._backend
        if backend.enabled:
            handle = backend.start(self._name)
        else:
            backend = handle = None
        if _profiler_enabled():
            rf = _record_function(self._name)
            rf.__enter__()
        else:
            rf = None
            if backend is None:
                return self
        self._open = (backend, handle, rf)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        opened = self._open
        if opened is not None:
            self._open = None
            backend, handle, rf = opened
            if rf is not None:
                rf.__exit__(None, None, None)
            if backend is not None:
                backend.end(handle)
        top = self._tracer._stack.pop()
        assert top is self, (
            f"moerun trace ranges closed out of order on one Tracer: closing {self._name!r} "
            f"while {top._name!r} is innermost (use one Tracer per micro-batch)"
        )


class _ChunkRange(_Range):
    """``moerun/L{l}/chunk{c}``; sets the tracer's current chunk while open."""

    __slots__ = ("_index", "_saved")

    def __init__(self, tracer: Tracer, index: int) -> None:
        _Range.__init__(self, tracer, f"{tracer._prefix}chunk{index}", "chunk", "main")
        self._index = index
        self._saved: int | None = None

    def __enter__(self) -> _ChunkRange:
        tracer = self._tracer
        self._saved = tracer._chunk
        tracer._chunk = self._index
        return _Range.__enter__(self)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _Range.__exit__(self, exc_type, exc, tb)
        self._tracer._chunk = self._saved


class _UbRange(_Range):
    """``moerun/L{l}/dbo/ub{u}``; sets the tracer's current micro-batch while open."""

    __slots__ = ("_index", "_saved")

    def __init__(self, tracer: Tracer, index: int) -> None:
        _Range.__init__(self, tracer, f"{tracer._prefix}dbo/ub{index}", "ub", "main")
        self._index = index
        self._saved: int | None = None

    def __enter__(self) -> _UbRange:
        tracer = self._tracer
        self._saved = tracer._ub
        tracer._ub = self._index
        return _Range.__enter__(self)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _Range.__exit__(self, exc_type, exc, tb)
        self._tracer._ub = self._saved


class Tracer:
    """Names and emits the ranges of one layer forward (or of one DBO micro-batch of it).

    Cheap to build (a few hundred ns): build one per forward; under DBO build one per
    micro-batch (``ub=0`` / ``ub=1``), because each Tracer keeps its own nesting stack and the
    two micro-batches' ranges interleave on one host thread.

    Args:
        layer_idx: layer index (int >= 0) or None (names use ``L-``).
        rank: this rank's index, copied into recorded events (not read from a process group).
        recorder: optional :class:`ScheduleRecorder` fed one event per range entry and mark.
        ub: initial micro-batch index carried by events (None: not split). ``ub(u)`` ranges
            override it while open; :meth:`set_ub` changes it.

    Thread-safety: a Tracer is not thread-safe; use it from one thread at a time (the
    recorder and the NVTX backend it feeds are). Side effects of its ranges: NVTX calls on
    the calling thread, torch.profiler record_function while a profiler is active, recorder
    appends; never device work, never a host sync, safe under CUDA-graph capture (NVTX
    and record_function are host-only and are not captured into the graph).
    """

    __slots__ = ("_layer_idx", "_rank", "_recorder", "_ub", "_chunk", "_stack", "_prefix", "_backend")

    def __init__(
        self,
        *,
        layer_idx: int | None,
        rank: int = 0,
        recorder: ScheduleRecorder | None = None,
        ub: int | None = None,
    ) -> None:
        _check_layer_idx(layer_idx)
        if type(rank) is not int or rank < 0:
            raise ValueError(f"Tracer rank={rank!r} is invalid: use an int >= 0")
        if recorder is not None and not isinstance(recorder, ScheduleRecorder):
            raise TypeError(
                f"Tracer recorder={recorder!r} is invalid: pass a traces.ScheduleRecorder or None"
            )
        if ub is not None:
            _check_index("Tracer ub", ub)
        self._layer_idx = layer_idx
        self._rank = rank
        self._recorder = recorder
        self._ub = ub
        self._chunk: int | None = None
        self._stack: list[_Range] = []
        self._prefix = _layer_prefix(layer_idx)
        self._backend = _get_backend()

    def __repr__(self) -> str:
        return (
            f"Tracer(layer_idx={self._layer_idx}, rank={self._rank}, ub={self._ub}, "
            f"chunk={self._chunk}, open={list(self.open_ranges)})"
        )

    # -- state -------------------------------------------------------------------------------

    @property
    def layer_idx(self) -> int | None:
        """The layer index given at construction."""
        return self._layer_idx

    @property
    def rank(self) -> int:
        """The rank given at construction."""
        return self._rank

    @property
    def recorder(self) -> ScheduleRecorder | None:
        """The attached recorder, or None."""
        return self._recorder

    @property
    def current_ub(self) -> int | None:
        """Micro-batch index that new events carry."""
        return self._ub

    @property
    def current_chunk(self) -> int | None:
        """Chunk index that new events carry (the innermost open ``chunk`` range, or set)."""
        return self._chunk

    @property
    def open_ranges(self) -> tuple[str, ...]:
        """Names of this tracer's open ranges, outermost first."""
        return tuple(r._name for r in self._stack)

    def set_ub(self, u: int | None) -> None:
        """Set the micro-batch index carried by later events (no range is emitted).

        Args:
            u: micro-batch index (int >= 0) or None.

        Side effects: tracer state only; no host sync. Not thread-safe (see class).
        """
        if u is not None:
            _check_index("ub", u)
        self._ub = u

    def set_chunk(self, c: int | None) -> None:
        """Set the chunk index carried by later events without opening a ``chunk`` range.

        Args:
            c: chunk index (int >= 0) or None.

        Side effects: tracer state only; no host sync. Not thread-safe (see class).
        """
        if c is not None:
            _check_index("chunk", c)
        self._chunk = c

    # -- ranges ------------------------------------------------------------------------------

    def chunk(self, c: int) -> _ChunkRange:
        """Context manager for the range ``moerun/L{l}/chunk{c}`` (phase ``"chunk"``).

        Nests inside an open ``ub`` range if any (the name does not include the ub). While
        open, events carry ``chunk=c``; on exit the previous chunk index is restored.

        Args:
            c: chunk index, int >= 0.

        Side effects: NVTX start/end, record_function while a profiler is active, one
        recorder event at entry; no host sync. Not thread-safe (see class).
        """
        _check_index("chunk", c)
        return _ChunkRange(self, c)

    def ub(self, u: int) -> _UbRange:
        """Context manager for the range ``moerun/L{l}/dbo/ub{u}`` (phase ``"ub"``).

        While open, events carry ``ub=u``; on exit the previous index is restored.

        Args:
            u: micro-batch index, int >= 0.

        Side effects: as :meth:`chunk`.
        """
        _check_index("ub", u)
        return _UbRange(self, u)

    def phase(self, phase: str, *, stream: str = "main") -> _Range:
        """Context manager for the range ``moerun/L{l}/{phase}``.

        Args:
            phase: ``"route"``, ``"pad"``, ``"dispatch"``, ``"dispatch.wait"``, ``"quantize"``,
                ``"experts"``, ``"combine"``, ``"combine.wait"``, ``"shared"`` or
                ``"eplb.{hook}"`` (see :data:`traces.recorder.KNOWN_PHASES`; not enforced).
            stream: logical role recorded with the event: ``"main"``, ``"aux"`` or ``"comm"``.
                NVTX ranges are host-thread ranges regardless of the role.

        Side effects: as :meth:`chunk`.
        """
        if stream not in STREAMS:
            _check_stream(stream)
        return _Range(self, self._prefix + phase, phase, stream)

    def mark(self, phase: str = "dbo/yield", *, stream: str = "main") -> None:
        """Emit a zero-length marker ``moerun/L{l}/{phase}`` (default ``moerun/L{l}/dbo/yield``).

        NVTX ``mark``; under an active profiler a zero-length record_function; a recorder
        event with ``kind="mark"``.

        Args:
            phase: the marker's phase, default ``"dbo/yield"``.
            stream: logical role, as in :meth:`phase`.

        Side effects: as :meth:`chunk`; no range stays open.
        """
        if stream not in STREAMS:
            _check_stream(stream)
        name = self._prefix + phase
        recorder = self._recorder
        if recorder is not None:
            recorder.record(
                ScheduleEvent(
                    name=name,
                    phase=phase,
                    layer_idx=self._layer_idx,
                    chunk=self._chunk,
                    ub=self._ub,
                    stream=stream,
                    rank=self._rank,
                    kind="mark",
                )
            )
        backend = self._backend
        if backend.enabled:
            backend.mark(name)
        if _profiler_enabled():
            rf = _record_function(name)
            rf.__enter__()
            rf.__exit__(None, None, None)
