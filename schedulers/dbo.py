"""``DualBatchOverlapScheduler``: two micro-batches interleaved on one host thread (DESIGN 7).

    counts + agreed checks -> split rule -> [unsplit: the external forward] | per micro-batch
    plan and cursor -> step ub0 and ub1 alternately at their yields (each first makes its
    context, inside its dbo/ub range) -> concat

One micro-batch's forward is :meth:`ExternalCommScheduler.steps`, a generator that yields
right after dispatch is issued, right after combine is issued, and after the
``DURING_COMBINE`` shared MLP. This scheduler steps micro-batch 0 to its first yield, then
micro-batch 1 to its first, and so on round-robin until both return, so the issue order (and
the recorder's) is ``ub0.dispatch < ub1.dispatch < ub0.dispatch.wait < ub0.experts <
ub0.combine < ub1.dispatch.wait < ub1.experts < ub0.combine.wait < ub1.combine.wait``. No
thread per micro-batch, no module-level hooks: one context per micro-batch carries
everything (its plan, its own collective cursor ``ub=u``, its own tracer under
``moerun/L{l}/dbo/ub{u}``, a ``moerun/L{l}/dbo/yield`` mark per yield).

Communication runs asynchronously: every collective is issued with ``async_op=True`` (gloo
runs it on its threads; NCCL on its own stream, ordered after the issuing stream), and each
micro-batch reads a received buffer only after its own ``wait()``.

EPLB (DESIGN 7): ``start_wait_gpu``/``done_wait_gpu`` before micro-batch 0's routing,
``update_statistic``/``route`` on every micro-batch chunk, ``start_set_cpu`` after micro-batch
1's last ``run_experts`` is issued, ``done_set_cpu`` after both combines are waited (micro-
batch 0's combine is waited before micro-batch 1's). The shared expert runs inside each
micro-batch on its own rows (``DURING_COMBINE``: during that micro-batch's combine).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Generator, Sequence

import torch

from moerun.comm import CollectiveCursor
from schedulers.context import ForwardContext, LayerView
from schedulers.dbo_rule import DBOConfig, SplitDecision, decide_split, micro_batch_counts
from schedulers.external_comm import ALL_ISSUED, ExternalCommScheduler, drive, with_all_issued
from schedulers.plan import plan_forward
from traces import Tracer

__all__ = ["DualBatchOverlapScheduler"]

log = logging.getLogger("moerun")


class DualBatchOverlapScheduler:
    """Runs one layer forward as two interleaved micro-batches when the split rule says so,
    else as the external-comm forward. Holds no per-forward state (its config, and whether
    it has logged the capture warning).

    Args:
        config: the :class:`~schedulers.dbo_rule.DBOConfig` of the split rule.
    """

    def __init__(self, config: DBOConfig | None = None) -> None:
        self.config = config or DBOConfig()
        self._external = ExternalCommScheduler()
        self._warned_capture = False  # the capture warning is logged once per layer

    def decide(self, layer: LayerView, counts: tuple[int, ...]) -> SplitDecision:
        """The split decision for rank-identical ``counts`` (pure but for the capture
        query; the guard's experts per rank come from the slot partition, not this rank's
        own count, so every rank decides alike).

        Side effects: under CUDA-graph capture, where the rule would otherwise split, a
        warning on the ``moerun`` logger (once per scheduler): the captured forward runs
        unsplit (DESIGN 13). No host sync; no collective."""
        capturing = layer.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        part = layer.partition
        rule = functools.partial(decide_split, counts, config=self.config,
                                 top_k=layer.config.top_k,
                                 slots_per_rank=part.num_slots / part.ep_size)
        decision = rule(capturing=capturing)
        if capturing and not self._warned_capture and rule(capturing=False).split:
            self._warned_capture = True
            log.warning("layer %s: scheduler='dbo' runs this captured forward unsplit (%s "
                        "rows per rank would split eagerly: DBO is not captured into CUDA "
                        "graphs, DESIGN 13); run these sizes eagerly to overlap them, or "
                        "pass scheduler='external'", layer.layer_idx, list(counts))
        return decision

    def forward(self, layer: LayerView, x: torch.Tensor, router_logits: torch.Tensor, *,
                all_rank_num_tokens: Sequence[int] | None = None, use_dp_padding: bool = False,
                input_ready_event: Any = None) -> torch.Tensor:
        """See ``ConfigurableMoE.forward``. Returns ``[T, H]`` in x.dtype.

        Side effects: collectives on the layer's group (the validation/count gather, then
        per micro-batch and chunk dispatch and combine; micro-batches with zero rows still
        take part); host syncs for validation and count gathering.
        """
        return drive(self.forward_steps(layer, x, router_logits,
                                        all_rank_num_tokens=all_rank_num_tokens,
                                        use_dp_padding=use_dp_padding,
                                        input_ready_event=input_ready_event))

    def forward_steps(self, layer: LayerView, x: torch.Tensor, router_logits: torch.Tensor, *,
                      all_rank_num_tokens: Sequence[int] | None, use_dp_padding: bool,
                      input_ready_event: Any) -> Generator[str, None, torch.Tensor]:
        """:meth:`forward` as a generator that yields :data:`ALL_ISSUED` once, when both
        micro-batches (or the unsplit forward) have issued every collective; see
        ``ExternalCommScheduler.forward_steps``. Returns ``[T, H]``."""
        ext = self._external
        cursor = CollectiveCursor(step=layer.step)
        counts = ext.agree_counts(layer, x, router_logits, all_rank_num_tokens, cursor,
                                  use_dp_padding=use_dp_padding)
        rank, chunk_rows = layer.mapping.rank, layer.config.max_num_tokens
        decision = self.decide(layer, counts)
        if not decision.split:
            plan = plan_forward(counts, rank=rank, use_dp_padding=use_dp_padding,
                                max_num_tokens=chunk_rows)
            strategy = ext.determine_communication_method(layer, plan)
            ctx = ext.context(layer, x, router_logits, plan=plan, cursor=cursor,
                              strategy=strategy, input_ready_event=input_ready_event)
            return (yield from with_all_issued(ext.steps(layer, ctx), ctx))
        halves = micro_batch_counts(counts)
        plans = [plan_forward(c, rank=rank, use_dp_padding=use_dp_padding,
                              max_num_tokens=chunk_rows) for c in halves]
        strategy = ext.determine_communication_method(layer, plans[0])
        if ext.determine_communication_method(layer, plans[1]) is not strategy:
            strategy = layer.strategy  # replaced (permanently) while checking micro-batch 1
        first = halves[0][rank]
        parts = ((x[:first], router_logits[:first]), (x[first:], router_logits[first:]))
        makers = [
            functools.partial(
                ext.context, layer, xs, ls, plan=plans[u], strategy=strategy,
                cursor=CollectiveCursor(step=layer.step, ub=u),
                input_ready_event=input_ready_event, ub=u, hooks_begin=u == 0,
                hooks_end=u == 1, row_base=0 if u == 0 else sum(halves[0]),
                shared_rows=max(counts))
            for u, (xs, ls) in enumerate(parts)]
        outs = yield from self._interleave(layer, makers)
        return torch.cat(outs, dim=0)

    def _micro_batch(self, layer: LayerView, u: int,
                     make_context: Callable[..., ForwardContext]
                     ) -> Generator[str, None, torch.Tensor]:
        """Micro-batch ``u`` under its ``dbo/ub{u}`` range, a ``dbo/yield`` mark per yield
        (none for :data:`ALL_ISSUED`, which only reports). Its context is made inside the
        range (when the micro-batch is first stepped), so the logits' ``pad`` and the
        [AUX_STREAM] ``shared`` ranges it issues nest there."""
        tracer = Tracer(layer_idx=layer.layer_idx, rank=layer.mapping.rank,
                        recorder=layer.recorder, ub=u)
        with tracer.ub(u):
            ctx = make_context(tracer=tracer)
            steps = with_all_issued(self._external.steps(layer, ctx), ctx)
            while True:
                try:
                    what = next(steps)
                except StopIteration as stop:
                    return stop.value
                if what != ALL_ISSUED:
                    tracer.mark()
                yield what

    def _interleave(self, layer: LayerView, makers: list[Callable[..., ForwardContext]]
                    ) -> Generator[str, None, list[torch.Tensor]]:
        """Step the micro-batches round-robin from their yields; returns their outputs in
        order. Yields :data:`ALL_ISSUED` once, when every micro-batch has issued all its
        collectives (a micro-batch's own ``ALL_ISSUED`` ends its turn with no work done, so
        the issue order is unchanged)."""
        gens = [self._micro_batch(layer, u, make) for u, make in enumerate(makers)]
        outs: list[Any] = [None] * len(gens)
        live, issued, told = list(range(len(gens))), set(), False
        while live:
            for u in list(live):
                try:
                    if next(gens[u]) == ALL_ISSUED:
                        issued.add(u)
                except StopIteration as stop:
                    outs[u] = stop.value
                    live.remove(u)
                    issued.add(u)
                if not told and len(issued) == len(gens):
                    told = True
                    yield ALL_ISSUED
        return outs
