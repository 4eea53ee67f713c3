"""``ExternalCommScheduler``: the host issues dispatch and combine (DESIGN 4.1).

Stateless: ``forward`` reads the layer (config, mapping, routing, backend, strategy,
balancer, shared expert, recorder, streams) and changes it only through the named mutator
``layer.replace_strategy`` (permanent fallback).

Chunk overlap (4.1 step 6): on CUDA, with more than one chunk and a strategy that is not
host-synchronising (``NoComm``, ``AllGatherReduceScatter``; not ``AllToAll``), even chunks run
on the layer's aux stream and odd chunks on the main stream, each with its own tensors
(workspaces); the main stream joins the aux stream before the output is assembled, and
tensors crossing streams are ``record_stream``-ed outside graph capture. Otherwise chunks run
in order on the current stream.

Per chunk, in issue order (``[...]`` gated, DESIGN 8):
    [eplb.start_wait_gpu] -> route -> [eplb.done_wait_gpu] -> eplb.update_statistic ->
    eplb.route -> dispatch (prepare + issue) -> dispatch.wait -> experts ->
    [eplb.start_set_cpu] -> combine -> combine.wait -> [eplb.done_set_cpu]
then strip padding and add the shared expert (``SEQUENTIAL``).

Legend: ``T`` local tokens, ``P`` local rows after DP padding, ``n`` rows of one chunk.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch

from moerun.comm import AllGatherReduceScatter
from schedulers.plan import ForwardPlan, plan_forward
from schedulers.validation import agree_counts, check_local_inputs
from traces import Tracer

__all__ = ["ExternalCommScheduler"]


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    out = t.new_zeros((rows, *t.shape[1:]))
    out[: t.shape[0]] = t
    return out


def _wait_input_ready(event: Any) -> None:
    """Order the current stream after ``event`` (a CUDA/torch Event or any ``.wait()``)."""
    if event is not None:
        event.wait()


class ExternalCommScheduler:
    """Runs one layer forward with host-issued communication. Holds no state."""

    def forward(self, layer: Any, x: torch.Tensor, router_logits: torch.Tensor, *,
                all_rank_num_tokens: Sequence[int] | None = None, use_dp_padding: bool = False,
                input_ready_event: Any = None) -> torch.Tensor:
        """See ``ConfigurableMoE.forward``. Returns ``[T, H]`` in x.dtype.

        Side effects: collectives on the layer's group (counts/validation gather when needed,
        dispatch and combine per chunk); host syncs for validation and count gathering; may
        replace the layer's strategy permanently (fallback).
        """
        cfg, mapping = layer.config, layer.mapping
        layer.check_usable()
        layer.communicator.begin_forward(layer.step)
        tracer = Tracer(layer_idx=layer.layer_idx, rank=mapping.rank, recorder=layer.recorder)
        counts = self.agree_counts(layer, x, router_logits, all_rank_num_tokens)
        plan = plan_forward(counts, rank=mapping.rank, use_dp_padding=use_dp_padding,
                            max_num_tokens=cfg.max_num_tokens)
        strategy = self.determine_communication_method(layer, plan)
        if plan.padded:
            with tracer.phase("pad"):
                router_logits = _pad_rows(router_logits, plan.local_rows)
        overlap = self.use_chunk_overlap(layer, plan, strategy)
        layer.streams.begin_forward(overlap)
        x_state: dict[str, Any] = {}  # x, padded after routing (4.1 step 2), and its event

        def ready_x() -> torch.Tensor:
            if "x" not in x_state:
                _wait_input_ready(input_ready_event)  # 4.2: just before x is first read
                if plan.padded:
                    with tracer.phase("pad"):
                        x_state["x"] = _pad_rows(x, plan.local_rows)
                else:
                    x_state["x"] = x
                if overlap:  # the other stream waits for this stream's x before reading it
                    x_state["stream"] = torch.cuda.current_stream()
                    x_state["event"] = torch.cuda.Event()
                    x_state["event"].record()
            elif overlap and x_state["stream"] != torch.cuda.current_stream():
                torch.cuda.current_stream().wait_event(x_state["event"])
            return x_state["x"]

        outs = []
        for c in range(plan.num_chunks):
            on_aux = overlap and c % 2 == 0
            ctx = torch.cuda.stream(layer.streams.aux) if on_aux else contextlib.nullcontext()
            with ctx:
                outs.append(self._run_chunk(layer, strategy, plan, c, router_logits, ready_x,
                                            tracer, role="aux" if on_aux else "main"))
        if overlap:
            self._join_aux(layer, outs, [router_logits, x_state.get("x")])
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
        out = out[: plan.num_tokens]  # strip DP padding (4.1 step 7)
        if layer.shared_expert is not None:
            with tracer.phase("shared"):
                out = out + layer.shared_expert(ready_x()[: plan.num_tokens])
        return out

    # -- steps ---------------------------------------------------------------------------
    @staticmethod
    def use_chunk_overlap(layer: Any, plan: ForwardPlan, strategy: Any) -> bool:
        """4.1 step 6 applies: CUDA, > 1 chunk, a strategy without host syncs, enabled on
        the layer. Rank-identical (plan and strategy are)."""
        return (layer.chunk_overlap and layer.device.type == "cuda"
                and plan.num_chunks > 1 and strategy.capturable)

    @staticmethod
    def _join_aux(layer: Any, outs: list[torch.Tensor], shared: list[Any]) -> None:
        """Main waits on aux; tensors used across streams are kept alive for both (outside
        capture: ``record_stream`` is not allowed while capturing)."""
        main, aux = layer.streams.main, layer.streams.aux
        main.wait_stream(aux)
        if torch.cuda.is_current_stream_capturing():
            return
        for c, t in enumerate(outs):
            if c % 2 == 0:
                t.record_stream(main)
        for t in shared:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                t.record_stream(aux)

    @staticmethod
    def agree_counts(layer: Any, x: Any, router_logits: Any,
                     all_rank_num_tokens: Sequence[int] | None) -> tuple[int, ...]:
        """4.1 step 1 + DESIGN 9: validate (agreed across ranks) and return the counts."""
        cfg, mapping = layer.config, layer.mapping
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        check = check_local_inputs(
            x, router_logits, hidden_size=cfg.hidden_size, num_experts=cfg.num_experts,
            dtype=cfg.dtype, device=layer.device, rank=mapping.rank,
            world_size=mapping.world_size, all_rank_num_tokens=all_rank_num_tokens,
            check_values=cfg.check_inputs and not capturing)
        num_tokens = x.shape[0] if isinstance(x, torch.Tensor) and x.dim() == 2 else 0
        return agree_counts(check, num_tokens=num_tokens,
                            all_rank_num_tokens=all_rank_num_tokens,
                            comm=layer.communicator, world_size=mapping.world_size,
                            check_inputs=cfg.check_inputs and not capturing)

    @staticmethod
    def determine_communication_method(layer: Any, plan: ForwardPlan):
        """4.1 step 4: keep the strategy if feasible for this forward, else fall back to
        ``AllGatherReduceScatter`` permanently (same decision on every rank: the inputs are
        rank-identical)."""
        strategy = layer.strategy
        if strategy.is_workload_feasible(plan.padded_counts, plan.num_chunks):
            return strategy
        note = (f"{strategy.name} infeasible for all_rank_num_tokens={list(plan.padded_counts)}"
                f", num_chunks={plan.num_chunks} at step {layer.step}; replaced by "
                f"{AllGatherReduceScatter.name} for the life of the layer")
        return layer.replace_strategy(AllGatherReduceScatter, note)

    @staticmethod
    def _route_chunk(layer: Any, logits: torch.Tensor, lo: int, num_tokens: int):
        """Routing for rows ``[lo, lo + n)``; padded rows (index >= num_tokens) get id -1 and
        weight 0. Graph-safe."""
        routed = layer.route(logits)
        weights, ids = routed.topk_weights, routed.topk_ids
        if lo + logits.shape[0] > num_tokens:
            row = torch.arange(lo, lo + logits.shape[0], device=logits.device)[:, None]
            pad = row >= num_tokens
            ids = torch.where(pad, torch.full_like(ids, -1), ids)
            weights = torch.where(pad, torch.zeros_like(weights), weights)
        return weights, ids

    def _run_chunk(self, layer: Any, strategy: Any, plan: ForwardPlan, c: int,
                   router_logits: torch.Tensor, ready_x, tracer: Tracer,
                   role: str = "main") -> torch.Tensor:
        cfg = layer.config
        bal = layer.balancer
        first = c == 0 and layer.repeat_idx == 0
        last = c == plan.num_chunks - 1 and layer.repeat_idx == layer.repeat_count - 1
        lo, hi = plan.chunk_bounds(c)
        with tracer.chunk(c):
            if first:
                with tracer.phase("eplb.start_wait_gpu", stream=role):
                    bal.start_wait_gpu()
            with tracer.phase("route", stream=role):
                weights, ids = self._route_chunk(layer, router_logits[lo:hi], lo,
                                                 plan.num_tokens)
            if first:
                with tracer.phase("eplb.done_wait_gpu", stream=role):
                    bal.done_wait_gpu()
            with tracer.phase("eplb.update_statistic", stream=role):
                bal.update_statistic(ids)
            with tracer.phase("eplb.route", stream=role):
                slot_ids = bal.route(ids, plan.rank_offset + lo)
            x_chunk = ready_x()[lo:hi]
            if cfg.apply_router_weight_on_input:
                # Llama4: scale the input by the (top-1) weight, unit weight after the experts
                x_chunk = x_chunk * weights.to(x_chunk.dtype)
                weights = (ids >= 0).to(torch.float32)
            with tracer.phase("dispatch", stream="comm"):
                prepared = strategy.prepare_dispatch(slot_ids, plan.chunks[c])
                dispatched = strategy.dispatch(x_chunk, slot_ids, weights, prepared=prepared,
                                               async_op=True)
            with tracer.phase("dispatch.wait", stream=role):
                dispatched.wait()
            with tracer.phase("experts", stream=role):
                expert_out = layer.backend.run_experts(dispatched.x, layer.w13, layer.w2,
                                                       dispatched.topk_weights,
                                                       dispatched.topk_ids)
            if last:
                with tracer.phase("eplb.start_set_cpu", stream=role):
                    bal.start_set_cpu()
            with tracer.phase("combine", stream="comm"):
                handle = strategy.combine(expert_out, dispatched, async_op=True)
            with tracer.phase("combine.wait", stream=role):
                out = handle.wait()
            if last:
                with tracer.phase("eplb.done_set_cpu", stream=role):
                    bal.done_set_cpu()
        return out
