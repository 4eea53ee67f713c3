"""The one-rank straight path of ``ExternalCommScheduler`` (DESIGN 4.1 on one rank).

    [checked by the caller] route -> [input-ready wait] -> [router weight on input]
    -> [quantize, unless the backend fuses it] -> experts (+ FUSED shared slots)
    -> [SEQUENTIAL shared add] -> return

DESIGN 4.1 run on one rank with ``NoComm``, no enabled balancer and nobody watching the
ranges, with the steps that are identities there left out: one rank agrees with itself (no
collective), never pads (the zero-token fix needs a peer), runs one chunk (``T <=
max_num_tokens``), dispatch and combine move nothing, no EPLB hook fires (disabled
balancer), and no range is entered (:func:`traces.ranges_silent`: no recorder, no NVTX tool,
no profiler). What remains is the device work in 4.1's order. A decode step is host-bound
(DESIGN 3), so this path exists to issue that work with as little Python as possible; the
result is the general path's, bit for bit (tests compare the two).

On CUDA the whole path -- routing launch, expert launches, shared-expert GEMMs -- is one
launch program (``moerun._triton.program``) from the third forward of a shape on (recorded
at the second): the layer's ``programs`` cache, keyed by the :class:`Straight`, the layout
of ``x`` and the logits and the addresses of the parameters the path reads, replays the
recorded allocations, launches and GEMMs with the Python of the router, backend and shared
expert taken out. A
forward with an ``input_ready_event`` (its wait sits between routing and the first read of
``x``) and a path the recording refuses (a persistent-kernel bucket's descriptor scratch,
for one) take the plain issue below.

:func:`applies` decides, from the layer and this forward's token count only (rank-local,
which is fine: there is one rank), and hands :func:`forward` its :class:`Straight`;
anything else takes the general generator path. Stateless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from moerun._triton.program import layout_key
from moerun.comm import NoComm
from moerun.shared_expert import SharedExpertOrder, SharedRegime
from schedulers.shared import fused_slots
from traces import ranges_silent

__all__ = ["Straight", "applies", "forward", "issue"]

_SEQ, _FUSED = SharedExpertOrder.SEQUENTIAL, SharedExpertOrder.FUSED


@dataclass(frozen=True, slots=True, kw_only=True)
class Straight:
    """A forward that takes this path, and its shared-expert regime (None: no shared
    expert; else ``SEQUENTIAL`` or ``FUSED`` without an SM partition)."""

    regime: SharedRegime | None


_NO_SHARED = Straight(regime=None)


def applies(layer: Any, num_tokens: int) -> Straight | None:
    """Whether a forward of ``num_tokens`` rows (already validated) takes this path (one
    rank, ``NoComm``, no enabled balancer, ranges silent, one chunk, and a shared expert, if
    any, run ``SEQUENTIAL`` or ``FUSED`` without an SM partition, eager or under capture):
    its :class:`Straight`, or None for the general path. Reads the layer's build-time
    choices, ``num_tokens``, whether a graph is being captured and whether ranges are
    watched; no host sync."""
    if layer.mapping.world_size != 1 or type(layer.strategy) is not NoComm \
            or layer.balancer.enabled or not ranges_silent(layer.recorder):
        return None
    cap = layer.config.max_num_tokens
    if cap is not None and num_tokens > cap:
        return None  # chunked
    schedule = layer.report.shared_schedule
    if schedule is None:
        return _NO_SHARED
    capturing = layer.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    regime = schedule.pick(num_tokens, capturing=capturing)
    if regime.partition_sms is not None or regime.order not in (_SEQ, _FUSED):
        return None  # NOTE: the other orders use a side stream; the general path orders it
    return Straight(regime=regime)


def forward(layer: Any, x: torch.Tensor, router_logits: torch.Tensor, straight: Straight,
            input_ready_event: Any) -> torch.Tensor:
    """``x [T, H]``, ``router_logits [T, E]`` -> ``[T, H]`` in x.dtype, for a forward that
    :func:`applies` returned ``straight`` for (inputs already checked). Kernels on the
    current stream; no collective; no host sync beyond the backend's; graph-safe. On CUDA
    through the layer's launch program of this shape (module docstring)."""
    if input_ready_event is None and x.is_cuda and x.shape[0]:
        params = _parameters(layer)
        # NOTE: the parameters enter the key by address: they keep their layout while their
        # storage stays put (weights load and migrate in place); a replaced tensor is a new key
        key = (straight, layout_key((x, router_logits)), tuple(t.data_ptr() for t in params))
        return layer.programs.call(key, (x, router_logits) + params,
                                   lambda: issue(layer, x, router_logits, straight, None))
    return issue(layer, x, router_logits, straight, input_ready_event)


def _parameters(layer: Any) -> tuple[torch.Tensor, ...]:
    """Every layer tensor :func:`issue` reads: the expert weights (and fp8 scales), the
    selection bias, the shared expert's weights. Host only."""
    out = [layer.w13, layer.w2]
    for t in (layer.w13_scale, layer.w2_scale, layer.router.correction_bias):
        if t is not None:
            out.append(t)
    se = layer.shared_expert
    if se is not None:
        out += [se.w13, se.w2] if se.gate is None else [se.w13, se.w2, se.gate]
    return tuple(out)


def issue(layer: Any, x: torch.Tensor, router_logits: torch.Tensor, straight: Straight,
          input_ready_event: Any) -> torch.Tensor:
    """:func:`forward` without the launch program: route, experts, shared expert, issued
    through the router's and the backend's own calls. Same contract.

    Current stream; no collective; no host sync beyond the backend's (e.g. the reference
    backend's ``nonzero``)."""
    cfg = layer.config
    regime = straight.regime
    routed = layer.router(router_logits, valid_rows=x.shape[0])
    weights, ids = routed.topk_weights, routed.topk_ids
    if input_ready_event is not None:
        input_ready_event.wait()  # 4.2: just before x is first read
    xin = x
    if cfg.apply_router_weight_on_input:  # Llama4: scale the input, unit weight after
        xin = x * weights.to(x.dtype)
        weights = (ids >= 0).to(torch.float32)
    if ids.dtype != torch.int32:  # what NoComm's dispatch hands the experts
        ids = ids.to(torch.int32)
    backend = layer.backend
    if cfg.quant is not None:  # FP8 (DESIGN 11a); never FUSED
        if not type(backend).fuses_activation_quant:  # else: quantized inside its kernels
            xin = backend.quantize_rows(xin, cfg.quant)
        out = backend.run_experts(xin, layer.w13, layer.w2, weights, ids,
                                  quant=layer.expert_quant)
    elif regime is not None and regime.order is _FUSED:
        fused = fused_slots(layer, xin, ids, weights, 0, xin.shape[0])
        return backend.run_experts(xin, layer.w13, layer.w2, fused.topk_weights,
                                   fused.topk_ids, shared=fused.fused)
    else:
        out = backend.run_experts(xin, layer.w13, layer.w2, weights, ids)
    if regime is not None:  # SEQUENTIAL: on the caller's rows
        return backend.shared_mlp_add(layer.shared_expert, x, out)
    return out
