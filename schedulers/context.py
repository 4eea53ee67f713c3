"""Per-forward state (DESIGN 4) and what a scheduler or balancer may read of the layer.

:class:`ForwardContext` is created by a scheduler at the entry of every forward (one per
micro-batch under DBO) and passed to every step and to the balancer hooks. It holds the
:class:`~schedulers.plan.ForwardPlan`, the :class:`~traces.Tracer`, the collective cursor,
the streams this forward used, the ready-``x`` handle and the events the balancer records
after the experts. Nothing per-forward is parked on the layer, the communicator, the
strategy or the stream objects, so two forwards (two micro-batches) can be in flight.

:class:`LayerView` is the read-only surface of the wrapper that schedulers rely on; the
wrapper (``moerun.layer.ConfigurableMoE``) satisfies it structurally, and schedulers never
import it.

Legend: ``T`` local tokens, ``P`` local rows after DP padding, ``H`` hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from moerun.comm import CollectiveCursor
from schedulers.plan import ForwardPlan
from traces import Tracer

if TYPE_CHECKING:  # pragma: no cover - type names only
    from moerun.backends import Backend
    from moerun.comm import CommStrategy, Communicator
    from moerun.config import MoEConfig
    from moerun.mapping import Mapping, SlotPartition
    from moerun.quant import ExpertQuant
    from moerun.routing import Router
    from moerun.shared_expert import SharedExpert, SharedRegime
    from moerun.streams import LayerStreams

__all__ = ["ForwardContext", "LayerView", "ReadyInput"]


class LayerView(Protocol):
    """What a scheduler or balancer reads of the layer (``ConfigurableMoE`` provides it).

    Fields: ``config``, ``mapping``, ``device``, ``layer_idx``; ``router`` (routing, torch
    or fused kernel), ``backend``, ``strategy``, ``communicator``, ``balancer`` (the hook
    seam; ``balancer.enabled`` False = no hooks), ``shared_expert`` (or None); ``streams``
    (the layer's aux stream owner); weights ``w13 [S_local, 2I, H]``, ``w2 [S_local, H, I]``
    (e4m3 for a quantized layer, with ``w13_scale`` / ``w2_scale`` fp32 block scales, else
    None) and ``expert_quant`` (the backend's ``quant=`` argument, None when unquantized);
    counters ``step`` (forwards so far), ``repeat_idx``/``repeat_count``; ``recorder``
    (optional schedule recorder); ``chunk_overlap`` (allowed to use the aux stream);
    ``programs`` (a ``moerun._triton.program.ProgramCache``: the one-rank path's launch
    programs by call layout, a host-side cache, not per-forward state); ``partition`` (the
    ``moerun.mapping.SlotPartition`` of the slots over the ranks, rank-identical).

    Agreement (issue 14): ``loaded`` (weights filled), ``agreement_digest`` (the build
    digest every rank compares in the agreed validation payload).

    Methods: ``check_usable(agreed=...)`` raises if closed or poisoned, and if not loaded
    unless the agreed validation will report it on every rank;
    ``replace_strategy(cls, note)`` is the one mutator (permanent fallback).
    """

    config: "MoEConfig"
    mapping: "Mapping"
    device: torch.device
    layer_idx: int | None
    router: "Router"
    backend: "Backend"
    strategy: "CommStrategy"
    communicator: "Communicator"
    balancer: Any
    shared_expert: "SharedExpert | None"
    streams: "LayerStreams"
    w13: torch.Tensor
    w2: torch.Tensor
    w13_scale: torch.Tensor | None
    w2_scale: torch.Tensor | None
    expert_quant: "ExpertQuant | None"
    step: int
    repeat_idx: int
    repeat_count: int
    recorder: Any
    chunk_overlap: bool
    programs: Any
    partition: "SlotPartition"
    loaded: bool
    agreement_digest: int

    def check_usable(self, *, agreed: bool = False) -> None:
        """Raise :class:`moerun.LayerClosedError` for a closed or poisoned layer, or (unless
        ``agreed``) one without weights (:meth:`ConfigurableMoE.check_usable`).

        Local; no collective, no device work."""
        ...

    def replace_strategy(self, strategy_cls: type, note: str) -> Any:
        """Replace the strategy with ``strategy_cls`` for the life of the layer, recording ``note``;
        returns the new strategy (:meth:`ConfigurableMoE.replace_strategy`).

        Host only; no collective."""
        ...


class ReadyInput:
    """``x`` as the experts read it: waited on the caller's ``input_ready_event`` (DESIGN
    4.2), padded to the forward's local rows after routing (4.1 step 2), and ordered for the
    other stream under chunk overlap.

    Per-forward (lives in the :class:`ForwardContext`). ``get()`` is called just before the
    first kernel that reads ``x``: the event wait and the padding happen then, not at entry.
    No host sync; graph-safe.
    """

    __slots__ = ("_raw", "_event", "_rows", "_x", "_stream", "_ready")

    def __init__(self, x: torch.Tensor, *, rows: int, event: Any = None) -> None:
        self._raw = x
        self._event = event
        self._rows = rows
        self._x: torch.Tensor | None = None
        self._stream: Any = None  # the stream that produced self._x (chunk overlap)
        self._ready: Any = None  # an event on that stream after self._x is written

    @property
    def raw(self) -> torch.Tensor:
        """``x [T, H]`` as the caller passed it (the shared expert reads these rows)."""
        return self._raw

    def get(self, tracer: Tracer, *, overlap: bool) -> torch.Tensor:
        """``[P, H]``: ``x`` padded to ``P`` rows (zeros), after the input-ready wait.

        With ``overlap`` (chunks on two CUDA streams) a stream other than the one that
        produced it first waits on that stream's event.
        """
        if self._x is None:
            if self._event is not None:
                self._event.wait()  # 4.2: just before x is first read
            raw = self._raw
            if raw.shape[0] == self._rows:
                self._x = raw
            else:
                with tracer.phase("pad"):
                    self._x = raw.new_zeros((self._rows, raw.shape[1]))
                    self._x[: raw.shape[0]] = raw
            if overlap:
                self._stream = torch.cuda.current_stream()
                self._ready = torch.cuda.Event()
                self._ready.record()
        elif overlap and self._stream != torch.cuda.current_stream():
            torch.cuda.current_stream().wait_event(self._ready)
        return self._x

    def wait_event(self) -> None:
        """Order the *current* stream after the caller's input-ready event (a side stream that
        reads ``x`` before the first ``get``: the ``AUX_STREAM`` shared expert)."""
        if self._event is not None:
            self._event.wait()

    @property
    def padded(self) -> torch.Tensor | None:
        """The padded ``[P, H]`` tensor once built (None before the first ``get``)."""
        return self._x


@dataclass(eq=False, kw_only=True)
class ForwardContext:
    """All per-forward (per-micro-batch) state of one layer forward.

    Fields:
        plan: the rank-identical :class:`ForwardPlan` (counts, padding, chunks).
        tracer: this forward's (micro-batch's) :class:`Tracer`.
        cursor: the collective cursor every collective of this forward issues on.
        strategy: the communication strategy this forward runs (after the fallback check).
        on_cuda: the layer runs on CUDA (streams exist).
        main / aux: under chunk overlap, the main stream and the layer's aux stream; otherwise
            None / None (the forward runs on the current stream). :attr:`streams` lists them.
        overlap: chunks alternate between the aux and the main stream (4.1 step 6).
        logits: ``[P, E]`` router logits (padded rows appended when ``plan.padded``).
        input: the ready-``x`` handle (:class:`ReadyInput`).
        ub: DBO micro-batch index (None when the forward is not split).
        hooks_begin / hooks_end: this forward runs the gated EPLB hooks
            (``start_wait_gpu``/``done_wait_gpu`` at its first chunk, ``start_set_cpu``/
            ``done_set_cpu`` at its last): the first / last repeat of the layer in the step.
        row_offset: global index of this forward's first row (EPLB replica routing).
        shared: this forward's shared-expert regime (order, SM partition), None without a
            shared expert. shared_out / shared_stream: the shared MLP's output and the side
            stream it was issued on (``AUX_STREAM``, ``DURING_COMBINE``), set by
            :mod:`schedulers.shared`.
        experts_done: events the balancer recorded after the last ``run_experts``.
    """

    plan: ForwardPlan
    tracer: Tracer
    cursor: CollectiveCursor
    strategy: "CommStrategy"
    on_cuda: bool
    main: Any
    aux: Any
    overlap: bool
    logits: torch.Tensor
    input: ReadyInput
    ub: int | None = None
    hooks_begin: bool = True
    hooks_end: bool = True
    row_offset: int = 0
    shared: "SharedRegime | None" = None
    shared_out: torch.Tensor | None = None
    shared_stream: Any = None
    experts_done: list[Any] = field(default_factory=list)

    @property
    def streams(self) -> tuple[Any, ...]:
        """CUDA streams this forward issues work on, main first (``()`` on CPU). Without
        overlap that is the current stream (the forward never switches streams then)."""
        if not self.on_cuda:
            return ()
        main = self.main if self.main is not None else torch.cuda.current_stream()
        return (main,) if self.aux is None else (main, self.aux)

    def x(self) -> torch.Tensor:
        """``[P, H]`` ready ``x`` for the current stream (see :meth:`ReadyInput.get`)."""
        return self.input.get(self.tracer, overlap=self.overlap)
