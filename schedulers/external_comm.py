"""``ExternalCommScheduler``: the host issues dispatch and combine (DESIGN 4.1).

    counts + agreed checks -> [one rank, nothing to order: schedulers.one_rank] -> plan (zero-token fix, chunks) -> comm method -> [aux shared]
    -> per chunk: [start_wait] route [done_wait] statistic eplb.route [quantize] dispatch |
    [quantize] experts [start_set] combine | [shared during combine |] combine.wait
    [done_set] -> strip padding, shared expert, return

``[quantize]`` only for an FP8 layer (DESIGN 11a): before dispatch where the strategy
``supports_post_quant_dispatch()`` (fp8 rows plus scales travel), else after it; none on one
rank with a backend that quantizes inside its kernels (``fuses_activation_quant``).

Stateless: every per-forward value lives in the :class:`~schedulers.context.ForwardContext`
that :meth:`ExternalCommScheduler.begin` creates; the layer is read through
:class:`~schedulers.context.LayerView` and changed only through ``layer.replace_strategy``
(the permanent fallback). ``[...]`` hooks run only for an enabled balancer and are gated
(DESIGN 8); a disabled balancer (``NullLayerBalancer``) costs no call and no range.

One forward (or one DBO micro-batch) is the generator :meth:`steps`: it yields right after
dispatch is issued and right after combine is issued (the ``|`` above), and returns the
output. This scheduler drives it straight through; ``DualBatchOverlapScheduler`` interleaves
two of them on one thread. :meth:`ExternalCommScheduler.forward_steps` is the whole forward as
a generator that reports :data:`ALL_ISSUED` once every collective is issued, where
``ConfigurableMoE.forward_async`` returns.

Chunk overlap (4.1 step 6): on CUDA, with more than one chunk and a strategy that is not
host-synchronising (``NoComm``, ``AllGatherReduceScatter``; not ``AllToAll``), even chunks run
on the layer's aux stream and odd chunks on the main stream, each with its own tensors; the
main stream joins the aux stream before the output is assembled, and tensors crossing streams
are ``record_stream``-ed outside graph capture. Otherwise chunks run in order on the current
stream.

Legend: ``T`` local tokens, ``P`` local rows after DP padding, ``n`` rows of one chunk.
"""

from __future__ import annotations

import contextlib
from typing import Any, Generator, Sequence

import torch

from moerun.comm import AllGatherReduceScatter, CollectiveCursor
from schedulers import one_rank
from schedulers import shared as shared_expert
from schedulers.context import ForwardContext, LayerView, ReadyInput
from schedulers.plan import ForwardPlan, plan_forward
from schedulers.validation import LayerState, RankState, agree_counts, check_local_inputs
from traces import Tracer

__all__ = ["ExternalCommScheduler", "DISPATCH_ISSUED", "COMBINE_ISSUED", "SHARED_ISSUED",
           "ALL_ISSUED", "drive", "with_all_issued"]

#: What :meth:`ExternalCommScheduler.steps` yields (the DBO scheduler switches there).
DISPATCH_ISSUED = "dispatch_issued"
COMBINE_ISSUED = "combine_issued"
SHARED_ISSUED = "shared_issued"  # the DURING_COMBINE shared MLP, issued after the last combine
#: What a whole forward's steps (``forward_steps``) yield once, when every collective of the
#: forward is issued and only waits are left (``ConfigurableMoE.forward_async`` returns there).
ALL_ISSUED = "all_issued"

_NULL = contextlib.nullcontext()


def drive(steps: Generator[str, None, torch.Tensor]) -> torch.Tensor:
    """Run a forward generator to the end and return its output.

    Side effects: those of the steps it runs (launches, collectives, host syncs)."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


def with_all_issued(steps: Generator[str, None, torch.Tensor], ctx: ForwardContext
                    ) -> Generator[str, None, torch.Tensor]:
    """``steps`` (one forward or micro-batch of ``ctx``), passing its yields through, plus
    :data:`ALL_ISSUED` right after its last issue: the last chunk's combine, or the
    ``DURING_COMBINE`` shared MLP after it. Returns the steps' output.

    Side effects: none of its own; those of ``steps`` as it advances them."""
    last = SHARED_ISSUED if shared_expert.issues_during_combine(ctx) else COMBINE_ISSUED
    combines = 0
    while True:
        try:
            what = next(steps)
        except StopIteration as stop:
            return stop.value
        yield what
        combines += what == COMBINE_ISSUED
        if what == last and combines == ctx.plan.num_chunks:
            yield ALL_ISSUED


class ExternalCommScheduler:
    """Runs one layer forward with host-issued communication. Holds no state."""

    def forward(self, layer: LayerView, x: torch.Tensor, router_logits: torch.Tensor, *,
                all_rank_num_tokens: Sequence[int] | None = None, use_dp_padding: bool = False,
                input_ready_event: Any = None) -> torch.Tensor:
        """See ``ConfigurableMoE.forward``. Returns ``[T, H]`` in x.dtype.

        Side effects: collectives on the layer's group (counts/validation gather when needed,
        dispatch and combine per chunk); host syncs for validation and count gathering; may
        replace the layer's strategy permanently (fallback).
        """
        start = self.begin(layer, x, router_logits, all_rank_num_tokens=all_rank_num_tokens,
                           use_dp_padding=use_dp_padding, input_ready_event=input_ready_event)
        if isinstance(start, ForwardContext):
            return drive(self.steps(layer, start))
        return one_rank.forward(layer, x, router_logits, start, input_ready_event)

    def forward_steps(self, layer: LayerView, x: torch.Tensor, router_logits: torch.Tensor, *,
                      all_rank_num_tokens: Sequence[int] | None, use_dp_padding: bool,
                      input_ready_event: Any) -> Generator[str, None, torch.Tensor]:
        """:meth:`forward` as a generator that yields :data:`ALL_ISSUED` once, when every
        collective is issued and only the last combine's wait (and the output's assembly) is
        left; other yields are switch points of no meaning to a caller. Returns ``[T, H]``.
        Side effects: as :meth:`forward`, as the generator is stepped. (:meth:`forward` does
        not drive this generator: the one-rank path's host cost has none in it.)"""
        start = self.begin(layer, x, router_logits, all_rank_num_tokens=all_rank_num_tokens,
                           use_dp_padding=use_dp_padding, input_ready_event=input_ready_event)
        if isinstance(start, ForwardContext):
            return (yield from with_all_issued(self.steps(layer, start), start))
        out = one_rank.forward(layer, x, router_logits, start, input_ready_event)
        yield ALL_ISSUED  # no collective on that path
        return out

    # -- entry -----------------------------------------------------------------------------
    def begin(self, layer: LayerView, x: torch.Tensor, router_logits: torch.Tensor, *,
              all_rank_num_tokens: Sequence[int] | None, use_dp_padding: bool,
              input_ready_event: Any) -> ForwardContext | one_rank.Straight:
        """Steps 1-4: usability, counts and agreed validation; then, where one rank has
        nothing to order, the host-lean path's :class:`~schedulers.one_rank.Straight` (same
        result, see ``one_rank.forward``), else the forward's context (the plan with the
        zero-token fix and chunks, the communication method, logits padding, the streams).
        Collectives: the validation/count gather when needed. Host sync: then."""
        cursor = CollectiveCursor(step=layer.step)
        counts = self.agree_counts(layer, x, router_logits, all_rank_num_tokens, cursor,
                                   use_dp_padding=use_dp_padding)
        straight = one_rank.applies(layer, counts[0])
        if straight is not None:
            return straight
        return self.planned(layer, x, router_logits, counts, cursor,
                            use_dp_padding=use_dp_padding, input_ready_event=input_ready_event)

    def planned(self, layer: LayerView, x: torch.Tensor, router_logits: torch.Tensor,
                counts: tuple[int, ...], cursor: CollectiveCursor, *, use_dp_padding: bool,
                input_ready_event: Any) -> ForwardContext:
        """Steps 2-4 and the context, from agreed ``counts``. No collective, no host sync."""
        plan = plan_forward(counts, rank=layer.mapping.rank, use_dp_padding=use_dp_padding,
                            max_num_tokens=layer.config.max_num_tokens)
        strategy = self.determine_communication_method(layer, plan)
        return self.context(layer, x, router_logits, plan=plan, cursor=cursor,
                            strategy=strategy, input_ready_event=input_ready_event)

    def context(self, layer: LayerView, x: torch.Tensor, router_logits: torch.Tensor, *,
                plan: ForwardPlan, cursor: CollectiveCursor, strategy: Any,
                input_ready_event: Any, ub: int | None = None, hooks_begin: bool = True,
                hooks_end: bool = True, row_base: int = 0,
                shared_rows: int | None = None, tracer: Tracer | None = None
                ) -> ForwardContext:
        """The context of one forward (or one DBO micro-batch ``ub``) over ``x [T, H]``:
        logits padded to the plan's rows, the streams, the shared-expert regime (picked by
        ``shared_rows``, default the plan's largest rank), and, for :meth:`steps`, the
        [AUX_STREAM] shared MLP already issued. ``hooks_begin``/``hooks_end`` restrict the
        gated EPLB hooks (the DBO scheduler gives them to one micro-batch each);
        ``row_base`` shifts the EPLB replica-routing offset; ``tracer`` (default a new one)
        is the one the forward's ranges go to: the DBO scheduler passes micro-batch ``ub``'s,
        already inside its ``dbo/ub{u}`` range, so the ``pad`` and [AUX_STREAM] ``shared``
        ranges issued here nest in it. No collective."""
        if tracer is None:
            tracer = Tracer(layer_idx=layer.layer_idx, rank=layer.mapping.rank,
                            recorder=layer.recorder, ub=ub)
        logits = router_logits
        if plan.padded and plan.local_rows != plan.num_tokens:
            with tracer.phase("pad"):  # 4.1 step 2: only the logits before routing
                logits = router_logits.new_zeros((plan.local_rows, router_logits.shape[1]))
                logits[: plan.num_tokens] = router_logits
        schedule = layer.report.shared_schedule
        rows = max(plan.padded_counts) if shared_rows is None else shared_rows
        capturing = layer.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        regime = None if schedule is None else schedule.pick(rows, capturing=capturing)
        if regime is not None and regime.partition_sms is not None and capturing:
            # NOTE: checked before any stream is forked into the capture
            raise ValueError(
                f"shared_partition_sms={regime.partition_sms}: a green-context stream cannot be "
                "captured into a CUDA graph (capturing it aborts the process on torch 2.11); "
                "capture with shared_partition_sms=None")
        overlap = self.use_chunk_overlap(layer, plan, strategy)
        streams = layer.streams.begin(overlap)
        ctx = ForwardContext(
            plan=plan, tracer=tracer, cursor=cursor, strategy=strategy,
            on_cuda=layer.device.type == "cuda", main=streams.main, aux=streams.aux,
            overlap=overlap,
            logits=logits,
            input=ReadyInput(x, rows=plan.local_rows, event=input_ready_event), ub=ub,
            hooks_begin=hooks_begin and layer.repeat_idx == 0,
            hooks_end=hooks_end and layer.repeat_idx == layer.repeat_count - 1,
            row_offset=row_base + plan.rank_offset, shared=regime)
        shared_expert.start(layer, ctx)  # AUX_STREAM: before routing
        return ctx

    # -- one forward as a generator --------------------------------------------------------
    def steps(self, layer: LayerView, ctx: ForwardContext
              ) -> Generator[str, None, torch.Tensor]:
        """Every chunk (step 5, 6), then step 7. Yields :data:`DISPATCH_ISSUED` and
        :data:`COMBINE_ISSUED` per chunk; returns ``[T, H]``. The current stream is restored
        before each yield."""
        plan, tracer = ctx.plan, ctx.tracer
        outs = []
        for c in range(plan.num_chunks):
            aux = ctx.overlap and c % 2 == 0
            role = "aux" if aux else "main"
            with tracer.chunk(c):
                with self._on(ctx, aux):
                    dispatched = self.issue_dispatch(layer, ctx, c, role)
                yield DISPATCH_ISSUED
                with self._on(ctx, aux):
                    handle = self.run_experts_and_combine(layer, ctx, c, dispatched, role)
                yield COMBINE_ISSUED
                if c == plan.num_chunks - 1 and shared_expert.during_combine(layer, ctx):
                    yield SHARED_ISSUED
                with self._on(ctx, aux):
                    outs.append(self.finish_chunk(layer, ctx, c, handle, role))
        return self.assemble(layer, ctx, outs)

    @staticmethod
    def _on(ctx: ForwardContext, aux: bool) -> Any:
        return torch.cuda.stream(ctx.aux) if aux else _NULL

    def issue_dispatch(self, layer: LayerView, ctx: ForwardContext, c: int, role: str) -> Any:
        """Chunk ``c`` up to the issued dispatch: [start_wait] route [done_wait] statistic
        eplb.route dispatch. Returns the (in-flight) ``DispatchResult``.

        Routing, the EPLB hooks and the quantization launch on the current stream; then the
        strategy's dispatch, issued async: a collective over the layer's group (AllToAll
        host-syncs on its counts; AllGatherReduceScatter and NoComm do not)."""
        plan, tracer, bal = ctx.plan, ctx.tracer, layer.balancer
        hooks, first = bal.enabled, c == 0 and ctx.hooks_begin
        single = plan.num_chunks == 1
        lo, hi = plan.bounds[c]
        if hooks and first:
            with tracer.phase("eplb.start_wait_gpu", stream=role):
                bal.start_wait_gpu(ctx)
        with tracer.phase("route", stream=role):
            routed = layer.router(ctx.logits if single else ctx.logits[lo:hi],
                                  valid_rows=max(0, plan.num_tokens - lo))
        weights, ids = routed.topk_weights, routed.topk_ids
        slot_ids = ids
        if hooks:
            if first:
                with tracer.phase("eplb.done_wait_gpu", stream=role):
                    bal.done_wait_gpu(ctx)
            with tracer.phase("eplb.update_statistic", stream=role):
                bal.update_statistic(ctx, ids)
            with tracer.phase("eplb.route", stream=role):
                slot_ids = bal.route(ctx, ids, ctx.row_offset + lo)
        x = ctx.x()
        if not single:
            x = x[lo:hi]
        if layer.config.apply_router_weight_on_input:
            # Llama4: scale the input by the (top-1) weight, unit weight after the experts
            x = x * weights.to(x.dtype)
            weights = (ids >= 0).to(torch.float32)
        strategy = ctx.strategy
        quant = layer.config.quant
        if quant is not None and strategy.supports_post_quant_dispatch() and \
                not self.backend_quantizes(layer):
            with tracer.phase("quantize", stream=role):  # 4.1 step 5: fp8 rows travel
                x = layer.backend.quantize_rows(x, quant)
        with tracer.phase("dispatch", stream="comm"):
            prepared = strategy.prepare_dispatch(slot_ids, plan.chunks[c], ctx.cursor)
            return strategy.dispatch(x, slot_ids, weights, prepared=prepared, async_op=True)

    def run_experts_and_combine(self, layer: LayerView, ctx: ForwardContext, c: int,
                                dispatched: Any, role: str) -> Any:
        """dispatch.wait, experts, [start_set_cpu], combine (issued). Returns the handle.

        Waits on the dispatch (:meth:`Pending.wait`), launches the experts on the current stream
        (host syncs only where the backend has them), then issues the combine async: a collective
        over the layer's group."""
        tracer, bal = ctx.tracer, layer.balancer
        with tracer.phase("dispatch.wait", stream=role):
            dispatched.wait()
        routing = shared_expert.fuse(layer, ctx, c, dispatched)
        ids, weights = routing.topk_ids, routing.topk_weights
        if layer.config.quant is not None:  # FP8 (DESIGN 11a); never FUSED
            expert_out = self._run_quantized(layer, ctx, dispatched, ids, weights, role)
        else:
            with tracer.phase("experts", stream=role):
                if routing.fused is None:
                    expert_out = layer.backend.run_experts(dispatched.x, layer.w13, layer.w2,
                                                           weights, ids)
                else:  # FUSED: the shared slots ride along in the routed kernels
                    expert_out = layer.backend.run_experts(dispatched.x, layer.w13, layer.w2,
                                                           weights, ids, shared=routing.fused)
        if bal.enabled and ctx.hooks_end and c == ctx.plan.num_chunks - 1:
            with tracer.phase("eplb.start_set_cpu", stream=role):
                bal.start_set_cpu(ctx)
        with tracer.phase("combine", stream="comm"):
            return ctx.strategy.combine(expert_out, dispatched, async_op=True)

    @staticmethod
    def backend_quantizes(layer: LayerView) -> bool:
        """An FP8 layer whose rows never travel (one rank) on a backend that quantizes them
        itself (``fuses_activation_quant``): no ``quantize`` step, the backend gets the
        activation-dtype rows. Rank-identical (world size and backend class are).

        Pure; host only."""
        return layer.mapping.world_size == 1 and type(layer.backend).fuses_activation_quant

    @staticmethod
    def _run_quantized(layer: LayerView, ctx: ForwardContext, dispatched: Any,
                       ids: torch.Tensor, weights: torch.Tensor, role: str) -> torch.Tensor:
        """The FP8 experts of one chunk: the dispatched rows are
        :class:`~moerun.quant.QuantizedRows` under post-quant dispatch; otherwise they are
        activation-dtype rows, quantized first under a ``quantize`` range (4.1 step 5's
        dispatch-then-quantize order), or handed over as they are where
        :meth:`backend_quantizes`. Then the ``experts`` range. Returns ``[M, H]`` in the
        activation dtype. No host sync beyond the backend's."""
        x = dispatched.x
        if not ctx.strategy.supports_post_quant_dispatch() and \
                not ExternalCommScheduler.backend_quantizes(layer):
            with ctx.tracer.phase("quantize", stream=role):
                x = layer.backend.quantize_rows(x, layer.config.quant)
        with ctx.tracer.phase("experts", stream=role):
            return layer.backend.run_experts(x, layer.w13, layer.w2, weights, ids,
                                             quant=layer.expert_quant)

    def finish_chunk(self, layer: LayerView, ctx: ForwardContext, c: int, handle: Any,
                     role: str) -> torch.Tensor:
        """combine.wait, [done_set_cpu]. Returns the chunk's ``[n, H]`` output.

        Waits on the combine (host-blocking on gloo; on NCCL it orders the current stream); a due
        ``done_set_cpu`` rebalances (collectives, host syncs)."""
        tracer, bal = ctx.tracer, layer.balancer
        with tracer.phase("combine.wait", stream=role):
            out = handle.wait()
        if bal.enabled and ctx.hooks_end and c == ctx.plan.num_chunks - 1:
            with tracer.phase("eplb.done_set_cpu", stream=role):
                bal.done_set_cpu(ctx)
        return out

    def assemble(self, layer: LayerView, ctx: ForwardContext,
                 outs: list[torch.Tensor]) -> torch.Tensor:
        """Step 7: join the aux stream, concatenate chunks, strip DP padding, add the shared
        expert (:func:`schedulers.shared.finish`: computed now for ``SEQUENTIAL``, joined for
        the stream orders, already inside for ``FUSED``)."""
        plan = ctx.plan
        if ctx.overlap:
            self._join_aux(layer, ctx, outs)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
        if out.shape[0] != plan.num_tokens:
            out = out[: plan.num_tokens]  # strip DP padding (4.1 step 7)
        return shared_expert.finish(layer, ctx, out)

    # -- steps ---------------------------------------------------------------------------
    @staticmethod
    def use_chunk_overlap(layer: LayerView, plan: ForwardPlan, strategy: Any) -> bool:
        """4.1 step 6 applies: CUDA, > 1 chunk, a strategy without host syncs, enabled on
        the layer. Rank-identical (plan and strategy are)."""
        return (layer.chunk_overlap and layer.device.type == "cuda"
                and plan.num_chunks > 1 and strategy.capturable)

    @staticmethod
    def _join_aux(layer: LayerView, ctx: ForwardContext, outs: list[torch.Tensor]) -> None:
        """Main waits on aux; tensors used across streams are kept alive for both (outside
        capture: ``record_stream`` is not allowed while capturing)."""
        main, aux = ctx.main, ctx.aux
        main.wait_stream(aux)
        if torch.cuda.is_current_stream_capturing():
            return
        for c, t in enumerate(outs):
            if c % 2 == 0:
                t.record_stream(main)
        for t in (ctx.logits, ctx.input.padded):
            if isinstance(t, torch.Tensor) and t.is_cuda:
                t.record_stream(aux)

    @staticmethod
    def agree_counts(layer: LayerView, x: Any, router_logits: Any,
                     all_rank_num_tokens: Sequence[int] | None, cursor: CollectiveCursor, *,
                     use_dp_padding: bool = False) -> tuple[int, ...]:
        """4.1 step 1 + DESIGN 9: refuse an unusable layer, validate (agreed across ranks) and
        return the counts.

        A closed or poisoned layer raises here on its own rank before any collective (peers
        learn it from the store, see ``moerun.comm.communicator``). With more than one rank
        and ``check_inputs``, the layer's state (weights loaded, forward counter, build
        digest) rides in the agreed payload, so every rank raises the same error for it.
        Under CUDA-graph capture the checks that need a device->host sync (the NaN/Inf scan)
        and the agreement gather are skipped; shape, dtype and device checks still run."""
        cfg, mapping = layer.config, layer.mapping
        capturing = layer.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        agreed = cfg.check_inputs and not capturing and mapping.world_size > 1
        layer.check_usable(agreed=agreed)
        check = check_local_inputs(
            x, router_logits, hidden_size=cfg.hidden_size, num_experts=cfg.num_experts,
            dtype=cfg.dtype, device=layer.device, rank=mapping.rank,
            world_size=mapping.world_size, all_rank_num_tokens=all_rank_num_tokens,
            check_values=cfg.check_inputs and not capturing)
        num_tokens = x.shape[0] if isinstance(x, torch.Tensor) and x.dim() == 2 else 0
        state = RankState(state=LayerState.READY if layer.loaded else LayerState.NOT_LOADED,
                          step=layer.step, layer_digest=layer.agreement_digest,
                          layer_idx=layer.layer_idx) if agreed else None
        return agree_counts(check, num_tokens=num_tokens,
                            all_rank_num_tokens=all_rank_num_tokens,
                            comm=layer.communicator, cursor=cursor,
                            world_size=mapping.world_size,
                            check_inputs=cfg.check_inputs and not capturing,
                            use_dp_padding=bool(use_dp_padding), state=state)

    @staticmethod
    def determine_communication_method(layer: LayerView, plan: ForwardPlan) -> Any:
        """4.1 step 4: keep the strategy if feasible for this forward, else fall back to
        ``AllGatherReduceScatter`` permanently (same decision on every rank: the inputs are
        rank-identical).

        Host only; no collective (a fallback replaces the strategy and logs a warning)."""
        strategy = layer.strategy
        if strategy.is_workload_feasible(plan.padded_counts, plan.num_chunks):
            return strategy
        note = (f"{strategy.name} infeasible for all_rank_num_tokens={list(plan.padded_counts)}"
                f", num_chunks={plan.num_chunks} at step {layer.step}; replaced by "
                f"{AllGatherReduceScatter.name} for the life of the layer")
        return layer.replace_strategy(AllGatherReduceScatter, note)
