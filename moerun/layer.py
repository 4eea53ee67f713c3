"""``ConfigurableMoE``: the thin wrapper a serving engine embeds, one per MoE layer (DESIGN 3).

It owns state (config, mapping, weights, routing parameters, backend, communication
strategy, shared expert, balancer handle, communicator, recorder, counters, report) and
hands the whole forward to a stateless scheduler.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch
from torch import nn

from eplb import NullLayerBalancer
from moerun._loading import load_expert_items, load_global
from moerun._triton.program import ProgramCache
from moerun.backends import Backend
from moerun.capability import Deployment, Problem
from moerun.comm import CommStrategy, Communicator
from moerun.config import MoEConfig
from moerun.custom_op import register_layer
from moerun.env import get_env
from moerun.errors import LayerClosedError
from moerun.forward_handle import ForwardHandle, issue
from moerun.mapping import Mapping, slot_partition
from moerun.quant import FP8_DTYPE, ExpertQuant
from moerun.resolve import ResolutionReport, resolve
from moerun.routing import Router
from moerun.shared_expert import SharedExpert
from moerun.streams import LayerStreams
from schedulers import DBOConfig, DualBatchOverlapScheduler, ExternalCommScheduler
from schedulers.external_comm import ALL_ISSUED
from schedulers.validation import layer_digest, not_loaded_message
from traces import Tracer

__all__ = ["ConfigurableMoE"]

log = logging.getLogger("moerun")


class _Counters:
    """The layer's forward counters, kept off ``nn.Module.__setattr__`` (a hot path), and the
    issued ``forward_async`` not waited yet (None when there is none)."""

    __slots__ = ("step", "repeat_idx", "pending")

    def __init__(self) -> None:
        self.step = 0
        self.repeat_idx = 0
        self.pending: ForwardHandle | None = None

    def advance(self, repeat_count: int) -> None:
        self.step += 1
        self.repeat_idx = (self.repeat_idx + 1) % repeat_count


class ConfigurableMoE(nn.Module):
    """One MoE layer: routing, expert compute, communication, shared expert, balancer hooks.

    Args:
        config: :class:`MoEConfig` (the math).
        mapping: :class:`Mapping` (ranks and group); default: one rank.
        backend: ``"auto"``, ``"reference"``, ``"triton"``, ``"grouped_mm"`` or a Backend.
        comm: ``"auto"``, ``"none"``, ``"allgather"``, ``"alltoall"`` or a CommStrategy class.
        router: ``"auto"`` (the fused routing kernel on CUDA, the torch twin elsewhere),
            ``"torch"`` or ``"triton"``.
        shared_expert_order: ``"auto"`` (the measured table per T regime, else ``sequential``
            on one rank, ``during_combine`` on several), ``"sequential"``, ``"aux_stream"``,
            ``"during_combine"`` or ``"fused"`` (see :class:`moerun.SharedExpertOrder`).
        shared_partition_sms: with ``aux_stream`` / ``during_combine`` on CUDA, run the shared
            MLP in a ``torch.cuda.GreenContext`` of this many SMs (None: a plain side stream).
            Eager only (capture is refused). NOTE: on torch 2.11 a process that used a green
            context aborts at exit (docs/DECISIONS.md); for measurements, not servers.
        scheduler: ``"auto"`` (today: ``"external"``; the report says why), ``"external"`` or
            ``"dbo"`` (dual-batch overlap: two micro-batches interleaved on this thread when
            the split rule says so). dbo_config: its :class:`schedulers.DBOConfig`.
        balancer: a per-layer balancer handle (``eplb.LayerBalancerHooks``); default: none.
        layer_idx: for NVTX names (``L{layer_idx}``), timeouts and EPLB.
        repeat_count: forwards of this layer per model step (EPLB hook gating).
        device: where weights live (default: CUDA if available, else CPU).
        recorder: optional ``traces.ScheduleRecorder`` fed with every phase.
        chunk_overlap: on CUDA with > 1 chunk and a non-host-synchronising strategy, run even
            chunks on the layer's aux stream (DESIGN 4.1 step 6). Off = chunks in order.

    Weights are allocated for this rank's slots and must be filled with :meth:`load_weights`
    before the first forward.

    Compile and graphs (DESIGN 3): under ``torch.compile`` the forward is the single opaque
    op ``torch.ops.moerun.moe_forward`` (Dynamo never traces the scheduler). Under CUDA-graph
    capture the checks that need a device->host sync (the NaN/Inf scan of ``check_inputs``,
    the agreed-validation gather) are skipped, so a single-rank forward and a multi-rank
    ``AllGatherReduceScatter`` forward with given ``all_rank_num_tokens`` are capturable.
    """

    def __init__(self, config: MoEConfig, mapping: Mapping | None = None, *,
                 backend: str | Backend = "auto", comm: str | type[CommStrategy] = "auto",
                 router: str = "auto", shared_expert_order: str = "auto",
                 shared_partition_sms: int | None = None, scheduler: str = "auto",
                 dbo_config: DBOConfig | None = None, balancer: Any = None,
                 layer_idx: int | None = None, repeat_count: int = 1,
                 device: torch.device | str | None = None, recorder: Any = None,
                 chunk_overlap: bool = True) -> None:
        super().__init__()
        if not isinstance(config, MoEConfig):
            raise TypeError(f"config must be a MoEConfig, got {type(config).__name__}")
        mapping = Mapping() if mapping is None else mapping
        if not isinstance(mapping, Mapping):
            raise TypeError(f"mapping must be a moerun.Mapping, got {type(mapping).__name__}")
        if isinstance(repeat_count, bool) or not isinstance(repeat_count, int) \
                or repeat_count < 1:
            raise ValueError(f"repeat_count={repeat_count!r} must be an int >= 1")
        Tracer(layer_idx=layer_idx, rank=mapping.rank, recorder=recorder)  # validates both
        if (config.max_num_tokens is not None and mapping.world_size > 1
                and config.max_num_tokens < mapping.dp_size):
            raise ValueError(f"MoEConfig.max_num_tokens={config.max_num_tokens} must be >= "
                             f"dp_size={mapping.dp_size} (one row per rank per chunk at least)")
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) \
                if torch.cuda.is_available() else torch.device("cpu")
        self.device = torch.device(device)
        if config.check_inputs is None:  # DESIGN 9: on for CPU; off on CUDA (a sync per forward)
            config = config.replace(check_inputs=self.device.type != "cuda")
        self.config = config
        self.mapping = mapping
        self.layer_idx = layer_idx
        self.repeat_count = repeat_count
        self._counters = _Counters()
        # host-side cache of the one-rank path's launch programs (schedulers/one_rank.py):
        # keyed by call layout, never per-forward state
        self.programs = ProgramCache()
        self.recorder = recorder
        self.chunk_overlap = bool(chunk_overlap)
        self.streams = LayerStreams(self.device)
        self.balancer = NullLayerBalancer(config.num_experts) if balancer is None else balancer
        num_slots = self.balancer.num_slots
        self.partition = slot_partition(num_slots, mapping.ep_size)
        self.slot_start, self.slot_end = self.partition.local_range(mapping.rank)
        problem = Problem(
            num_experts=config.num_experts, num_slots=num_slots, top_k=config.top_k,
            hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
            dtype=config.dtype, activation=config.activation, device_type=self.device.type,
            shared_intermediate_size=config.shared_intermediate_size,
            apply_router_weight_on_input=config.apply_router_weight_on_input,
            quant=config.quant)
        deployment = Deployment(rank=mapping.rank, world_size=mapping.world_size,
                                comm_backend=mapping.backend_name,
                                num_local_slots=self.slot_end - self.slot_start,
                                divisible=self.partition.divisible)
        backend_choice = type(backend) if isinstance(backend, Backend) else backend
        chunk_rows = config.max_num_tokens  # None: unbounded (the report gives a row's bytes)
        self.report: ResolutionReport = resolve(
            problem, deployment, get_env(), backend=backend_choice, comm=comm, router=router,
            shared_expert_order=shared_expert_order, shared_partition_sms=shared_partition_sms,
            scheduler=scheduler, max_chunk_rows=chunk_rows)
        if not self.partition.divisible and not self.report.strategy_cls.supports_non_divisible_ep:
            raise ValueError(f"comm strategy {self.report.strategy} does not support "
                             f"num_slots={num_slots} % ep_size={mapping.ep_size} != 0")
        self.backend: Backend = backend if isinstance(backend, Backend) \
            else self.report.backend_cls()
        self.communicator = Communicator(mapping, layer_idx=layer_idx)
        self.strategy: CommStrategy = self.report.strategy_cls(self.communicator, self.partition)
        self.scheduler = (DualBatchOverlapScheduler(dbo_config)
                          if self.report.scheduler == "DualBatchOverlapScheduler"
                          else ExternalCommScheduler())
        s_local = self.slot_end - self.slot_start
        h, i = config.hidden_size, config.intermediate_size
        q = config.quant
        kw = dict(dtype=config.dtype if q is None else FP8_DTYPE, device=self.device)
        self.w13 = nn.Parameter(torch.empty(s_local, 2 * i, h, **kw), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(s_local, h, i, **kw), requires_grad=False)
        if q is None:
            self.register_parameter("w13_scale", None)
            self.register_parameter("w2_scale", None)
        else:  # fp32 scale_inv per weight block (DESIGN 11a), migrated with the weights
            kw = dict(dtype=torch.float32, device=self.device)
            self.w13_scale = nn.Parameter(torch.empty(s_local, *q.scale_shape(2 * i, h), **kw),
                                          requires_grad=False)
            self.w2_scale = nn.Parameter(torch.empty(s_local, *q.scale_shape(h, i), **kw),
                                         requires_grad=False)
        self.e_score_correction_bias = (
            nn.Parameter(torch.zeros(config.num_experts, dtype=torch.float32,
                                     device=self.device), requires_grad=False)
            if config.routing.uses_correction_bias else None)
        self.router: Router = self.report.router_cls(config, self.e_score_correction_bias)
        self.shared_expert = (SharedExpert(h, config.shared_intermediate_size,
                                           gated=config.shared_expert_gate, dtype=config.dtype,
                                           device=self.device)
                              if config.has_shared_expert else None)
        self._loaded = False
        self._closed = False
        # Compared across ranks by the agreed validation (issue 14): everything fixed at build
        # that decides which collectives a forward issues.
        self.agreement_digest = layer_digest(
            config, self.report.strategy, self.report.scheduler,
            getattr(self.scheduler, "config", None), type(self.balancer).__name__,
            bool(self.balancer.enabled), num_slots, repeat_count, mapping.world_size,
            self.communicator.generation)
        bind = getattr(self.balancer, "bind", None)
        if bind is not None:  # a real balancer migrates this layer's weights in place
            bind(self)
        self.layer_key = register_layer(self)  # for torch.ops.moerun.moe_forward

    # -- forward -------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, router_logits: torch.Tensor, *,
                all_rank_num_tokens: Sequence[int] | None = None, use_dp_padding: bool = False,
                input_ready_event: Any = None) -> torch.Tensor:
        """``x [T, H]``, ``router_logits [T, E]`` (fp32 or x.dtype) -> ``[T, H]`` (x.dtype).

        Steps (run by ``self.scheduler``, DESIGN 4.1):
          1. counts: ``all_rank_num_tokens`` (all-gathered once if None and dp > 1), agreed
             input validation (``check_inputs``), every entry = max with ``use_dp_padding``;
          2. zero-token fix: if a rank has 0 tokens, DP padding for all ranks (logits padded
             before routing, padded rows get id -1; x padded after routing);
          3. chunking by ``max_num_tokens``, rank-identical chunk count;
          4. communication method: fall back to AllGatherReduceScatter if infeasible;
          5. per chunk: [eplb.start_wait_gpu] route [eplb.done_wait_gpu]
             eplb.update_statistic eplb.route dispatch experts [eplb.start_set_cpu] combine
             [eplb.done_set_cpu]; ``input_ready_event`` waited just before x is first read;
          6. chunk overlap (CUDA, > 1 chunk, collective strategy): even chunks on the aux
             stream, odd on main, event join;
          7. strip padding, add the shared expert, return.

        Side effects: collectives over ``mapping.group`` (dp > 1), host syncs for
        validation/count gathering and AllToAll splits; advances ``repeat_idx`` and ``step``.
        Under ``torch.compile`` it is the opaque op ``torch.ops.moerun.moe_forward``.
        """
        if torch.compiler.is_compiling():
            return self._compiled_forward(x, router_logits, all_rank_num_tokens,
                                          use_dp_padding, input_ready_event)
        if self._counters.pending is not None:
            self._refuse_pending("forward")
        out = self.scheduler.forward(self, x, router_logits,
                                     all_rank_num_tokens=all_rank_num_tokens,
                                     use_dp_padding=use_dp_padding,
                                     input_ready_event=input_ready_event)
        self._counters.advance(self.repeat_count)
        return out

    def forward_async(self, x: torch.Tensor, router_logits: torch.Tensor, *,
                      all_rank_num_tokens: Sequence[int] | None = None,
                      use_dp_padding: bool = False,
                      input_ready_event: Any = None) -> ForwardHandle:
        """:meth:`forward` up to the point where every collective is issued; returns a
        :class:`~moerun.forward_handle.ForwardHandle` whose ``wait()`` finishes it and
        returns the ``[T, H]`` output (DESIGN 7). Arguments as :meth:`forward`.

        The caller's own work between this call and ``wait()`` overlaps the last combine
        (micro-batch 1's under the DBO scheduler), which one ``forward`` leaves exposed. The
        output equals :meth:`forward`'s for the same inputs.

        Side effects: as :meth:`forward` up to the last combine's issue (validation and count
        gathers, every dispatch and combine issued, earlier chunks' waits); the rest, and the
        counters' advance, in ``wait()``. Until then this layer refuses another forward.
        Refused under ``torch.compile`` (the compiled op is one synchronous call)."""
        if torch.compiler.is_compiling():
            raise RuntimeError("forward_async is not supported under torch.compile (the "
                               "compiled graph calls one synchronous op); call forward")
        if self._counters.pending is not None:
            self._refuse_pending("forward_async")
        steps = self.scheduler.forward_steps(self, x, router_logits,
                                             all_rank_num_tokens=all_rank_num_tokens,
                                             use_dp_padding=use_dp_padding,
                                             input_ready_event=input_ready_event)
        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        issue(steps, ALL_ISSUED)
        handle = ForwardHandle(steps, self._finish_async, self.check_usable, stream)
        self._counters.pending = handle
        return handle

    def _finish_async(self, handle: ForwardHandle, ok: bool) -> None:
        """A handle's forward ended: no longer pending; the counters advance if it ran."""
        if self._counters.pending is handle:
            self._counters.pending = None
        if ok:
            self._counters.advance(self.repeat_count)

    def _refuse_pending(self, what: str) -> None:
        raise RuntimeError(f"layer {self.layer_idx}: {what} while a forward_async handle of "
                           "this layer is not waited; call its wait() first (a layer's "
                           "forwards are collective and run in order on every rank)")

    def _compiled_forward(self, x: torch.Tensor, router_logits: torch.Tensor,
                          all_rank_num_tokens: Sequence[int] | None, use_dp_padding: bool,
                          input_ready_event: Any) -> torch.Tensor:
        """What Dynamo traces: one call of the opaque custom op (DESIGN 3)."""
        if input_ready_event is not None:
            raise ValueError("input_ready_event is not supported under torch.compile (the "
                             "compiled graph orders x itself); pass None")
        counts = None if all_rank_num_tokens is None else list(all_rank_num_tokens)
        return torch.ops.moerun.moe_forward(x, router_logits, self.layer_key, counts,
                                            bool(use_dp_padding))

    # -- pieces the scheduler reads ----------------------------------------------------------
    @property
    def step(self) -> int:
        """Forwards this layer has run (rank-identical: forwards are collective)."""
        return self._counters.step

    @property
    def repeat_idx(self) -> int:
        """Which of the ``repeat_count`` forwards of this model step runs next."""
        return self._counters.repeat_idx

    @property
    def loaded(self) -> bool:
        """Weights are filled (:meth:`load_weights` or :meth:`load_expert_weights` completed)."""
        return self._loaded

    def check_usable(self, *, agreed: bool = False) -> None:
        """Refuse a forward this layer cannot run; local, no collective.

        Closed or poisoned: :class:`LayerClosedError` here, always (a closed layer never
        issues a collective; its marker in the Mapping's store, if any, lets peers waiting in
        this forward raise the same error at once). Weights not loaded: here unless
        ``agreed``, i.e. unless the agreed validation payload carries it to every rank."""
        if self._closed:
            rank = self.mapping.rank
            raise LayerClosedError(f"layer {self.layer_idx} is closed on rank(s) [{rank}] "
                                   "(this rank): this ConfigurableMoE was closed; build a new "
                                   "layer", ranks=[rank])
        if self.communicator.poisoned:
            rank = self.mapping.rank
            raise LayerClosedError(f"layer {self.layer_idx} is poisoned on rank(s) [{rank}] "
                                   "(this rank) by an earlier CommTimeoutError: close it and "
                                   "build a new layer on a new process group", ranks=[rank])
        if not self._loaded and not agreed:
            rank = self.mapping.rank
            raise LayerClosedError(not_loaded_message(self.layer_idx, [rank]), ranks=[rank])

    def replace_strategy(self, strategy_cls: type[CommStrategy], note: str) -> CommStrategy:
        """The one mutator schedulers may call: replace an infeasible strategy permanently.

        Destroys the old strategy, logs once, records ``note`` in ``self.report``.

        Host only; no collective; logs a warning.
        """
        self.strategy.destroy()
        self.strategy = strategy_cls(self.communicator, self.partition)
        self.report = self.report.with_fallback(strategy_cls, note)
        log.warning("moerun layer %s: %s", self.layer_idx, note)
        return self.strategy

    @property
    def expert_quant(self) -> ExpertQuant | None:
        """What the backend's FP8 path takes (``run_experts(..., quant=)``): the config, this
        rank's weight scales and the output dtype; None for an unquantized layer. Built on
        each access from the current tensors (so ``.to()`` is followed); host only."""
        q = self.config.quant
        if q is None:
            return None
        return ExpertQuant(config=q, w13_scale=self.w13_scale, w2_scale=self.w2_scale,
                           out_dtype=self.config.dtype)

    # -- weights -------------------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, w13: torch.Tensor, w2: torch.Tensor, shared: dict | None = None, *,
                     w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                     e_score_correction_bias: torch.Tensor | None = None) -> None:
        """Copy this rank's slots from the **global logical** weights.

        Args:
            w13: ``[E, 2*I, H]`` gate rows then up rows. w2: ``[E, H, I]``. Any float dtype
                (cast by the copy); with ``config.quant``: ``float8_e4m3fn`` (a float weight
                is refused; quantize with :func:`moerun.quant.quantize_weight_blocks`).
            shared: ``{"w13": [2*Is, H], "w2": [H, Is], "gate": [1, H] (if gated)}``; with
                ``config.quant`` the shared ``w13`` / ``w2`` may be e4m3 with
                ``"w13_scale" [2*Is/bn, H/bk]`` / ``"w2_scale" [H/bn, Is/bk]``: dequantized
                once here (the shared expert runs in ``config.dtype``).
            w13_scale: ``[E, 2*I/bn, H/bk]`` fp32 ``scale_inv`` of ``w13``; w2_scale:
                ``[E, H/bn, I/bk]``. Required iff ``config.quant``.
            e_score_correction_bias: ``[E]`` selection bias (noaux_tc / sigmoid_bias_topk).

        Raises ValueError naming the argument (shape, dtype, a scale missing or unexpected)
        before anything is copied. Copies in place (tensor identities never change). No
        collective.
        """
        load_global(self, w13, w2, shared, w13_scale=w13_scale, w2_scale=w2_scale,
                    e_score_correction_bias=e_score_correction_bias)

    @torch.no_grad()
    def load_expert_weights(self, items: Any, *, shared: dict | None = None,
                            e_score_correction_bias: torch.Tensor | None = None) -> int:
        """Copy this rank's experts from per-expert tensors (DESIGN 11b), so that no rank ever
        needs a whole ``[E, 2I, H]`` layer (the ``weight_loader`` pattern of vLLM / SGLang).

        Args:
            items: an iterable (consumed once, e.g. a generator over safetensors files) of
                ``(expert_id, name, tensor)``: ``expert_id`` a logical expert in ``[0, E)``;
                ``name`` one of ``"gate_proj"`` ``[I, H]``, ``"up_proj"`` ``[I, H]``,
                ``"down_proj"`` ``[H, I]`` or the fused ``"gate_up_proj"`` ``[2*I, H]`` (gate
                rows, then up rows); with ``config.quant`` these are e4m3 and each needs its
                fp32 scale item ``"<name>_scale_inv"`` (``gate_proj_scale_inv`` /
                ``up_proj_scale_inv`` ``[I/bn, H/bk]``, ``gate_up_proj_scale_inv``
                ``[2*I/bn, H/bk]``, ``down_proj_scale_inv`` ``[H/bn, I/bk]``, the
                checkpoint's ``weight_scale_inv`` blocks); ``tensor`` any float dtype and
                device (copied with ``copy_``), or lazy: a zero-argument callable returning it, or an object read
                with ``[:]`` (a safetensors ``get_slice`` handle). Items of experts this rank
                does not hold are skipped without being read (their names are still checked).
            shared: ``{"w13", "w2", "gate"}`` as in :meth:`load_weights`; required iff the
                config has a shared expert.
            e_score_correction_bias: ``[E]``, required iff the routing method uses one.

        A logical expert that sits in several local slots (EPLB replicas, per
        ``balancer.local_experts``) fills every one of them. Returns the number of items
        copied. Raises ``ValueError`` for an id outside ``[0, E)``, an unknown name, a wrong
        shape, a part given twice, or, after the last item, a local expert with a missing part
        (naming the expert, its slots and the missing names); after such an error the layer
        counts as not loaded (some slots may already hold new weights). Copies in place
        (tensor identities never change). No collective; no host sync beyond the copies.
        """
        return load_expert_items(self, items, shared=shared,
                                 e_score_correction_bias=e_score_correction_bias)

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Release the strategy. Idempotent; issues no collective (so never hangs, poisoned or
        not): the caller owns the process group and destroys it. With a store in the Mapping
        it posts this rank's ``closed`` marker (two store round trips, errors ignored), so a
        peer still waiting in a forward of this layer raises ``LayerClosedError`` naming this
        rank instead of timing out (issue 14)."""
        if self._closed:
            return
        self._closed = True
        self.strategy.destroy()
        self.streams.release()
        self.communicator.announce_closed(self.step)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "ConfigurableMoE":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def extra_repr(self) -> str:
        """The layer's shape, local slot range, backend and communication strategy.

        Pure; host only."""
        c = self.config
        return (f"E={c.num_experts}, k={c.top_k}, H={c.hidden_size}, I={c.intermediate_size}, "
                f"slots=[{self.slot_start}, {self.slot_end}), backend={self.report.backend}, "
                f"comm={self.report.strategy}")
