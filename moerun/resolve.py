"""Pick the backend, communication strategy, scheduler and shared-expert order (DESIGN 6).

``resolve`` asks candidates in priority order; every candidate not chosen appears in the
report with a closed-enum reason. Degrading is allowed, silently is not: the report is stored
on ``layer.report`` and printed by ``moerun run``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from moerun.backends import Backend, backend_candidates, backend_class, backend_eligibility
from moerun.capability import Deployment, Eligibility, Problem, RejectReason, SchedulerKind
from moerun.backends.selection import preferred_order
from moerun.comm import CommStrategy, strategy_candidates, strategy_class
from moerun.env import Env
from moerun.routing.router import TorchRouter, TritonRouter, router_class
from moerun.shared_expert import PARTITIONABLE, SharedExpertOrder, SharedSchedule
from moerun.shared_table import lookup as shared_table_lookup

__all__ = ["Rejection", "ResolutionReport", "resolve"]


@dataclass(frozen=True, kw_only=True)
class Rejection:
    """A candidate that was not chosen: ``kind`` ("backend"/"comm"/"router"/"shared"), ``name``,
    ``reason`` (closed enum), ``detail``."""

    kind: str
    name: str
    reason: RejectReason
    detail: str


@dataclass(frozen=True, kw_only=True)
class ResolutionReport:
    """What a layer runs with and why.

    Fields:
        backend: chosen backend name. backend_cls: its class.
        strategy: chosen communication strategy name. strategy_cls: its class.
        router: chosen router name (``"triton"``: one fused kernel; ``"torch"``: the twin).
        router_cls: its class.
        scheduler: scheduler class name (``ExternalCommScheduler`` or
            ``DualBatchOverlapScheduler``); why it was chosen is in ``notes``.
        shared_expert_order: the shared-expert schedule in words (one order, or the order per
            T regime), or None without a shared expert.
        shared_schedule: the :class:`~moerun.shared_expert.SharedSchedule` the scheduler
            follows (None without a shared expert).
        workspace_bytes_per_chunk: peak temporary bytes of one chunk (backend estimate) of
            ``workspace_chunk_rows`` rows; with ``workspace_chunk_rows=None`` (no
            ``max_num_tokens``: a chunk is a whole forward) the bytes of one row.
        rejected: every candidate not chosen, with reason.
        fallbacks: runtime replacements (e.g. an infeasible strategy replaced permanently).
        env: one-line description of the probed environment.
        notes: how the choice was made (e.g. the bench-table row that ordered the backends).
        kernel_configs: where the backend's kernel configuration comes from per T bucket of
            this rank's local shape (``"tuned (<file>)"`` or ``"heuristic"``; a head line
            naming the key first); ``()`` for a backend without tuned configs.
    """

    backend: str
    backend_cls: type[Backend]
    strategy: str
    strategy_cls: type[CommStrategy]
    router: str
    router_cls: type
    scheduler: str
    shared_expert_order: str | None
    workspace_bytes_per_chunk: int
    workspace_chunk_rows: int | None = None
    shared_schedule: SharedSchedule | None = None
    rejected: tuple[Rejection, ...] = ()
    fallbacks: tuple[str, ...] = ()
    env: str = ""
    notes: tuple[str, ...] = ()
    kernel_configs: tuple[str, ...] = ()

    def with_fallback(self, strategy_cls: type[CommStrategy], note: str) -> "ResolutionReport":
        """A copy recording a permanent strategy replacement. Pure; host only."""
        return dataclasses.replace(self, strategy=strategy_cls.name, strategy_cls=strategy_cls,
                                   fallbacks=self.fallbacks + (note,))

    def _workspace(self) -> str:
        mib = self.workspace_bytes_per_chunk / 2**20
        if self.workspace_chunk_rows is None:
            return (f"{mib:.2f} MiB per row (max_num_tokens=None: a chunk is the whole "
                    "forward; set it to bound this)")
        return f"{mib:.2f} MiB ({self.workspace_chunk_rows} rows)"

    def __str__(self) -> str:
        lines = [
            "moerun resolution report",
            f"  backend:             {self.backend}",
            f"  communication:       {self.strategy}",
            f"  routing:             {self.router}",
            f"  scheduler:           {self.scheduler}",
            f"  shared expert order: {self.shared_expert_order or 'none (no shared expert)'}",
            f"  workspace per chunk: {self._workspace()}",
            f"  environment:         {self.env}",
        ]
        lines += [f"  note:                {n}" for n in self.notes]
        if self.kernel_configs:
            lines.append(f"  kernel configs:      {self.kernel_configs[0]}")
            lines += [f"    {c}" for c in self.kernel_configs[1:]]
        if self.rejected:
            lines.append("  not chosen:")
            lines += [f"    {r.kind} {r.name}: {r.reason.value} ({r.detail})"
                      for r in self.rejected]
        if self.fallbacks:
            lines.append("  fallbacks:")
            lines += [f"    {f}" for f in self.fallbacks]
        return "\n".join(lines)


def _eligibility(kind: str, cls: type, problem: Problem, deployment: Deployment,
                 env: Env) -> Eligibility:
    """A backend's declared capabilities and ``can_implement``; a strategy's ``can_implement``."""
    if kind == "backend":
        return backend_eligibility(cls, problem, deployment, env)
    return cls.can_implement(problem, deployment, env)


def _pick(kind: str, requested: Any, candidates: list[type], by_name, problem: Problem,
          deployment: Deployment, env: Env, rejected: list[Rejection]) -> type:
    if requested != "auto":
        cls = by_name(requested) if isinstance(requested, str) else requested
        elig = _eligibility(kind, cls, problem, deployment, env)
        if not elig.ok:
            raise ValueError(f"{kind}={requested!r} cannot run here: {elig.reason.value}: "
                             f"{elig.detail}")
        for other in candidates:
            if other is not cls:
                rejected.append(Rejection(kind=kind, name=other.name,
                                          reason=RejectReason.NOT_REQUESTED,
                                          detail=f"{kind}={requested!r} was requested"))
        return cls
    chosen = None
    for cls in candidates:
        elig = _eligibility(kind, cls, problem, deployment, env)
        if not elig.ok:
            rejected.append(Rejection(kind=kind, name=cls.name, reason=elig.reason,
                                      detail=elig.detail))
        elif chosen is None:
            chosen = cls
        else:
            rejected.append(Rejection(kind=kind, name=cls.name,
                                      reason=RejectReason.LOWER_PRIORITY,
                                      detail=f"{chosen.name} ranks first"))
    if chosen is None:
        raise ValueError(f"no {kind} can run this layer: "
                         + "; ".join(f"{r.name}: {r.detail}" for r in rejected if r.kind == kind))
    return chosen


def _deepep_rejections(problem: Problem, deployment: Deployment, env: Env
                       ) -> list[Rejection]:
    """DeepEP per mode (DESIGN 5: the report says why it is not used): its first static limit
    that fails here (the library missing, first), else UNIMPLEMENTED, since moerun has no
    runnable DeepEP strategy yet. Pure."""
    from moerun.comm.deepep import DEEPEP_MODES, deepep_limits

    out = []
    for mode in DEEPEP_MODES:
        elig = deepep_limits(problem, deployment, env, mode=mode)
        if elig.ok:
            elig = Eligibility.no(RejectReason.UNIMPLEMENTED, "its limits hold here, but moerun "
                                  "has no runnable DeepEP strategy yet (multi-GPU work)")
        out.append(Rejection(kind="comm", name=f"deepep-{mode}", reason=elig.reason,
                             detail=elig.detail))
    return out


def _pick_router(requested: str, problem: Problem, env: Env,
                 rejected: list[Rejection]) -> type:
    """``"auto"``: the fused kernel where it runs natively (CUDA), else the torch twin; under
    the Triton interpreter on CPU the kernel is used only when asked for by name."""
    if requested != "auto":
        cls = router_class(requested)
        elig = cls.can_implement(problem, env)
        if not elig.ok:
            raise ValueError(f"router={requested!r} cannot run here: {elig.reason.value}: "
                             f"{elig.detail}")
        other = TorchRouter if cls is TritonRouter else TritonRouter
        rejected.append(Rejection(kind="router", name=other.name,
                                  reason=RejectReason.NOT_REQUESTED,
                                  detail=f"router={requested!r} was requested"))
        return cls
    elig = TritonRouter.can_implement(problem, env)
    if elig.ok and problem.device_type == "cuda":
        return TritonRouter
    if elig.ok:  # CPU under the interpreter: correct but slow; the twin routes by default
        rejected.append(Rejection(kind="router", name=TritonRouter.name,
                                  reason=RejectReason.INTERPRETER,
                                  detail="the interpreter is slow; pass router='triton' to use "
                                         "it on CPU"))
    else:
        rejected.append(Rejection(kind="router", name=TritonRouter.name, reason=elig.reason,
                                  detail=elig.detail))
    return TorchRouter


def shared_order_eligibility(order: SharedExpertOrder, problem: Problem,
                             backend_cls: type[Backend], strategy_cls: type[CommStrategy]
                             ) -> Eligibility:
    """Whether ``order`` can run this layer (pure). Only ``FUSED`` has conditions."""
    if order is not SharedExpertOrder.FUSED:
        return Eligibility.yes()
    s, i = problem.shared_intermediate_size, problem.intermediate_size
    if s % i:
        return Eligibility.no(RejectReason.SHAPE, f"shared size {s} is not a multiple of I={i}")
    if not backend_cls.supports_fused_shared:
        return Eligibility.no(RejectReason.UNIMPLEMENTED,
                              f"backend {backend_cls.name} does not fuse the shared expert")
    if not strategy_cls.supports_fused_shared:
        return Eligibility.no(RejectReason.TOPOLOGY,
                              f"{strategy_cls.name} does not keep this rank's rows "
                              "identifiable after dispatch")
    if problem.apply_router_weight_on_input:
        return Eligibility.no(RejectReason.SHAPE, "the routed input is scaled by the routing "
                              "weight (Llama 4); the shared expert reads it unscaled")
    if problem.quant is not None:
        return Eligibility.no(RejectReason.QUANT, "the routed experts are FP8 and the shared "
                              "expert is not (it runs unquantized in the activation dtype); it "
                              "cannot ride in the fp8 expert slots")
    return Eligibility.yes()


def _pick_shared(problem: Problem, deployment: Deployment, env: Env,
                 backend_cls: type[Backend], strategy_cls: type[CommStrategy],
                 requested: Any, partition_sms: int | None,
                 rejected: list[Rejection]) -> SharedSchedule | None:
    if not problem.shared_intermediate_size:
        return None
    elig = {o: shared_order_eligibility(o, problem, backend_cls, strategy_cls)
            for o in SharedExpertOrder}
    if requested != "auto":
        try:
            order = SharedExpertOrder(requested)
        except ValueError:
            raise ValueError(f"shared_expert_order={requested!r} is unknown; valid: 'auto', "
                             + ", ".join(repr(o.value) for o in SharedExpertOrder)) from None
        if not elig[order].ok:
            raise ValueError(f"shared_expert_order={order.value!r} cannot run here: "
                             f"{elig[order].reason.value}: {elig[order].detail}")
        if partition_sms is not None:
            if order not in PARTITIONABLE:
                raise ValueError(f"shared_partition_sms={partition_sms} needs shared_expert_order"
                                 " 'aux_stream' or 'during_combine'")
            if problem.device_type != "cuda" or not env.has_green_context:
                raise ValueError(f"shared_partition_sms={partition_sms}: SM partitions need "
                                 "CUDA and torch.cuda.GreenContext")
        schedule = SharedSchedule.single(order, f"shared_expert_order={order.value!r} "
                                         "requested", partition_sms)
    else:
        if partition_sms is not None:
            raise ValueError("shared_partition_sms needs an explicit shared_expert_order "
                             "('auto' takes partitions from the measured table)")
        row = shared_table_lookup(problem, deployment, env)
        usable = row is not None and all(elig[r.order].ok and (
            r.partition_sms is None or env.has_green_context)
            for r in row.regimes + (row.eager_regimes or ()))
        if usable:
            schedule = SharedSchedule(regimes=row.regimes, why=f"from the {row.detail}",
                                      eager_regimes=row.eager_regimes)
        else:
            default = (SharedExpertOrder.SEQUENTIAL if deployment.world_size == 1
                       else SharedExpertOrder.DURING_COMBINE)
            why = ("no shared-table row for this deployment and shape" if row is None else
                   "the shared-table row names an order that cannot run here")
            schedule = SharedSchedule.single(
                default, f"{why}: {default.value} "
                f"({'one rank: nothing to hide behind' if deployment.world_size == 1 else 'hides the shared MLP behind the combine'})")
    chosen = schedule.orders
    for o in SharedExpertOrder:
        if o in chosen:
            continue
        if not elig[o].ok:
            rejected.append(Rejection(kind="shared", name=o.value, reason=elig[o].reason,
                                      detail=elig[o].detail))
        else:
            reason = (RejectReason.LOWER_PRIORITY if requested == "auto"
                      else RejectReason.NOT_REQUESTED)
            rejected.append(Rejection(kind="shared", name=o.value, reason=reason,
                                      detail=schedule.why))
    return schedule


SCHEDULER_NAMES = ("external", "dbo")


def _pick_scheduler(requested: str, deployment: Deployment) -> tuple[str, str]:
    """``(scheduler class name, why)``."""
    if requested not in ("auto",) + SCHEDULER_NAMES:
        raise ValueError(f"scheduler={requested!r} is unknown; valid: 'auto', "
                         + ", ".join(repr(n) for n in SCHEDULER_NAMES))
    if requested == "dbo":
        from schedulers.dbo_rule import DBOConfig

        return ("DualBatchOverlapScheduler",
                f"scheduler='dbo' requested; split rule: {DBOConfig().describe()}")
    if requested == "external":
        return "ExternalCommScheduler", "scheduler='external' requested"
    why = ("auto: one rank, no communication to hide" if deployment.world_size == 1 else
           "auto: no measured DBO table for this deployment (pass scheduler='dbo' to split "
           "micro-batches)")
    return "ExternalCommScheduler", why


def resolve(problem: Problem, deployment: Deployment, env: Env, *,
            backend: str | type[Backend] = "auto", comm: str | type[CommStrategy] = "auto",
            router: str = "auto", shared_expert_order: str = "auto",
            shared_partition_sms: int | None = None, scheduler: str = "auto",
            max_chunk_rows: int | None = None) -> ResolutionReport:
    """Choose candidates for one layer. Pure: reads only its arguments (and, for the
    ``kernel_configs`` lines, the chosen backend's shipped config files).

    Args:
        problem / deployment / env: see :mod:`moerun.backends.base` and :mod:`moerun.env`.
        backend: ``"auto"``, a name from ``moerun.backends.BACKEND_NAMES`` or a Backend class.
        comm: ``"auto"``, ``"none"``, ``"allgather"``, ``"alltoall"`` or a strategy class.
        router: ``"auto"``, ``"torch"`` or ``"triton"`` (the fused routing kernel).
        shared_expert_order: ``"auto"`` (the measured table, else ``SEQUENTIAL`` on one rank
            and ``DURING_COMBINE`` on several) or a :class:`SharedExpertOrder` value.
        shared_partition_sms: with an explicit ``AUX_STREAM`` / ``DURING_COMBINE`` order, run
            its side work in a green context of this many SMs (CUDA).
        scheduler: ``"auto"``, ``"external"`` or ``"dbo"`` (dual-batch overlap; its split rule
            then decides per forward). ``"auto"`` picks ``"external"``: DBO pays only where
            communication is exposed, and no measured table says so for any deployment yet.
        max_chunk_rows: rows of the largest chunk, for the workspace estimate (None: no
            bound, the report gives the bytes of one row).

    Raises ValueError when a requested candidate cannot run, naming the reason.
    """
    rejected: list[Rejection] = []
    candidates = backend_candidates()
    notes: tuple[str, ...] = ()
    if backend == "auto":
        pref = preferred_order(problem, env)
        if pref is not None:  # the shipped bench table ranks backends for this shape/device
            ranked = [c for name in pref.order for c in candidates if c.name == name]
            candidates = ranked + [c for c in candidates if c not in ranked]
            notes = (f"backend order from {pref.detail}",)
        else:
            notes = ("backend order: default priority (no bench-table row for this shape, "
                     "dtype and device)",)
    backend_cls = _pick("backend", backend, candidates, backend_class, problem,
                        deployment, env, rejected)
    if not deployment.divisible and not backend_cls.supports_non_divisible_ep:
        raise ValueError(f"backend {backend_cls.name} does not support num_slots % ep_size != 0")
    strategy_cls = _pick("comm", comm, strategy_candidates(), strategy_class, problem,
                         deployment, env, rejected)
    if deployment.world_size > 1:
        rejected.extend(_deepep_rejections(problem, deployment, env))
    router_cls = _pick_router(router, problem, env, rejected)
    if backend_cls.scheduler_kind != SchedulerKind.EXTERNAL_COMM:  # pragma: no cover
        raise ValueError(f"backend {backend_cls.name} needs a {backend_cls.scheduler_kind} "
                         "scheduler, which does not exist yet")
    schedule = _pick_shared(problem, deployment, env, backend_cls, strategy_cls,
                            shared_expert_order, shared_partition_sms, rejected)
    if schedule is not None:
        notes = notes + (f"shared expert: {schedule.why}",)
    sched_name, sched_why = _pick_scheduler(scheduler, deployment)
    notes = notes + (f"scheduler: {sched_why}",)
    return ResolutionReport(
        backend=backend_cls.name, backend_cls=backend_cls, strategy=strategy_cls.name,
        strategy_cls=strategy_cls, router=router_cls.name, router_cls=router_cls,
        scheduler=sched_name,
        shared_expert_order=None if schedule is None else schedule.describe(),
        shared_schedule=schedule,
        workspace_bytes_per_chunk=backend_cls().workspace_bytes(problem, max_chunk_rows or 1),
        workspace_chunk_rows=max_chunk_rows,
        rejected=tuple(rejected), env=env.describe(), notes=notes,
        kernel_configs=backend_cls.config_report(problem, deployment, env))
