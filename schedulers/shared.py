"""Where the shared expert runs within one forward (DESIGN 4.3), for the schedulers.

The forward's :class:`~moerun.shared_expert.SharedRegime` (``ctx.shared``, picked from the
layer's ``SharedSchedule`` by the forward's largest rank ``T``) decides:

* ``SEQUENTIAL``: :func:`finish` runs the MLP on the ``T`` real rows and adds it.
* ``AUX_STREAM``: :func:`start` (at entry, before routing) makes the side stream wait on an
  event of the current stream and issues the MLP there; :func:`finish` joins it.
* ``DURING_COMBINE``: :func:`during_combine`, called right after the last chunk's combine is
  issued, issues the MLP (on the current stream, or on an SM partition's stream) while the
  combine is in flight; :func:`finish` joins and adds.
* ``FUSED``: :func:`fuse` appends the shared slots to the dispatched ids of this rank's own
  real rows (weight 1, or the shared-gate value), so the routed kernels compute it.

On CPU the stream orders run in issue order (no streams) and still give the same result.
The sum is always ``shared + routed`` rounded once in x.dtype (as the Hugging Face blocks do),
so the stream orders equal ``SEQUENTIAL`` bit for bit. Per-forward values live in the
context (``ctx.shared_out``, ``ctx.shared_stream``), nothing on the layer.

Legend: ``T`` tokens, ``H`` hidden, ``M`` dispatched rows of a chunk, ``K`` top-k, ``n``
shared slots (``Is / I``), ``S`` local slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from moerun.backends.base import FusedShared
from moerun.shared_expert import SharedExpertOrder

__all__ = ["ExpertRouting", "start", "during_combine", "issues_during_combine", "fuse",
           "fused_slots", "finish"]

_SEQ, _AUX = SharedExpertOrder.SEQUENTIAL, SharedExpertOrder.AUX_STREAM
_DURING, _FUSED = SharedExpertOrder.DURING_COMBINE, SharedExpertOrder.FUSED


def _issue(layer: Any, ctx: Any, role: str) -> None:
    """Issue the shared MLP on the side stream (CUDA, when the regime asks for one) or on the
    current stream; the result goes to ``ctx.shared_out``."""
    x = ctx.input.raw
    regime = ctx.shared
    side_needed = ctx.on_cuda and (regime.order is _AUX or regime.partition_sms is not None)
    if not side_needed:
        if regime.order is _AUX:
            ctx.input.wait_event()  # CPU, in order: x is read here first
        with ctx.tracer.phase("shared", stream=role):
            ctx.shared_out = layer.shared_expert(x)
        return
    side = layer.streams.shared(regime.partition_sms)
    main = torch.cuda.current_stream()
    side.wait_stream(main)  # the event before routing (AUX) / after the experts (DURING)
    with torch.cuda.stream(side):
        ctx.input.wait_event()  # 4.2: x may be written on another stream
        with ctx.tracer.phase("shared", stream="aux"):
            ctx.shared_out = layer.shared_expert(x)
    ctx.shared_stream = side
    if not torch.cuda.is_current_stream_capturing():
        x.record_stream(side)


def start(layer: Any, ctx: Any) -> None:
    """At forward entry: ``AUX_STREAM`` issues the MLP beside the routed work. No host sync."""
    if ctx.shared is not None and ctx.shared.order is _AUX:
        _issue(layer, ctx, "aux")


def issues_during_combine(ctx: Any) -> bool:
    """Whether this forward's shared MLP is issued after its last combine (``DURING_COMBINE``:
    its steps then yield once more). Pure."""
    return ctx.shared is not None and ctx.shared.order is _DURING


def during_combine(layer: Any, ctx: Any) -> bool:
    """Right after the last chunk's combine is issued: ``DURING_COMBINE`` issues the MLP.
    Returns whether it did (the DBO scheduler yields after it). No host sync."""
    if ctx.shared is None or ctx.shared.order is not _DURING:
        return False
    _issue(layer, ctx, "main")
    return True


@dataclass(frozen=True, kw_only=True)
class ExpertRouting:
    """What the experts of one chunk run: ``topk_ids [M, K']`` int32, ``topk_weights
    [M, K']`` fp32 and, under ``FUSED``, the :class:`FusedShared` slots ``K' = K + n`` add
    (None otherwise, ``K' = K``). Named, since the router's own result orders the two
    tensors the other way (weights first)."""

    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    fused: FusedShared | None = None


def fuse(layer: Any, ctx: Any, c: int, dispatched: Any) -> ExpertRouting:
    """Chunk ``c``'s :class:`ExpertRouting`: under ``FUSED`` the shared slots ``S..S+n-1``
    on this rank's own real rows (weight 1 or ``sigmoid(x g^T)``), ``-1`` / 0 elsewhere;
    the dispatched ids and weights otherwise. Device ops only, no host sync."""
    if ctx.shared is None or ctx.shared.order is not _FUSED:
        return ExpertRouting(topk_ids=dispatched.topk_ids,
                             topk_weights=dispatched.topk_weights)
    lo, hi = ctx.strategy.own_rows(dispatched)
    c_lo, c_hi = ctx.plan.bounds[c]
    hi = lo + max(0, min(c_hi, ctx.plan.num_tokens) - c_lo)  # padded rows visit nothing
    return fused_slots(layer, dispatched.x, dispatched.topk_ids, dispatched.topk_weights,
                       lo, hi)


def fused_slots(layer: Any, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                lo: int, hi: int) -> ExpertRouting:
    """``FUSED``'s routing of ``M`` rows ``x [M, H]``: ``ids [M, K]`` int32 and ``weights
    [M, K]`` fp32 with the shared slots ``S..S+n-1`` appended on rows ``lo:hi`` (weight 1 or
    ``sigmoid(x g^T)``), ``-1`` / 0 on the others, and the :class:`FusedShared` the kernels
    read. Device ops only, no host sync."""
    se = layer.shared_expert
    rows, dev = x.shape[0], x.device
    num_local = layer.w13.shape[0]
    n = se.intermediate_size // layer.config.intermediate_size
    slots = torch.arange(num_local, num_local + n, dtype=torch.int32, device=dev)
    if se.gate is None:
        gate = torch.ones((rows, 1), dtype=torch.float32, device=dev)
    else:
        gate = torch.sigmoid(F.linear(x, se.gate)).float()
    if lo == 0 and hi == rows:
        s_ids, s_w = slots.expand(rows, n), gate.expand(rows, n)
    else:
        s_ids = torch.full((rows, n), -1, dtype=torch.int32, device=dev)
        s_w = torch.zeros((rows, n), dtype=torch.float32, device=dev)
        s_ids[lo:hi] = slots
        s_w[lo:hi] = gate[lo:hi]
    fused = FusedShared(w13=se.w13, w2=se.w2, first_slot=num_local, num_slots=n)
    return ExpertRouting(topk_ids=torch.cat([ids, s_ids], dim=1),
                         topk_weights=torch.cat([weights, s_w], dim=1), fused=fused)


def finish(layer: Any, ctx: Any, out: torch.Tensor) -> torch.Tensor:
    """Step 7's shared part: ``[T, H]`` routed output -> with the shared expert added (on
    the current stream, after joining a side stream). ``FUSED``: unchanged. No host sync."""
    regime = ctx.shared
    if regime is None or regime.order is _FUSED:
        return out
    if regime.order is _SEQ:
        with ctx.tracer.phase("shared"):
            return layer.backend.shared_mlp_add(layer.shared_expert, ctx.input.raw, out)
    side = ctx.shared_stream
    if side is not None:  # join before the final add
        main = torch.cuda.current_stream()
        main.wait_stream(side)
        if not torch.cuda.is_current_stream_capturing():
            ctx.shared_out.record_stream(main)
    return ctx.shared_out.add_(out)
