"""Rank-side bodies of the fault-matrix and rank-inconsistency tests (issue 14).

A fault is injected on one rank right before it issues the ``nth`` collective of a phase, by
wrapping that rank's ``Communicator._issue`` (every collective moerun issues goes through it,
including the gloo reduce-scatter and point-to-point batches, which run as all-to-alls):
``"exit"`` ends the process (``os._exit``), ``"silent"`` sleeps past the survivors' budget and
then leaves the forward.
"""

from __future__ import annotations

import gc
import os
import time
import weakref

import torch

from eplb import EPLBConfig, LoadBalancer
from moerun import CommTimeoutError, ConfigurableMoE, LayerClosedError, MoEConfig
from moerun.testing import make_case, reference_output, rel_err

E, S, K, H, I = 6, 9, 2, 16, 16
ROWS = 5  # tokens per rank per forward
LAYER = 4
#: The forward (layer step) the fault is injected in; the ones before run with a warm-up budget.
FAULT_STEP = 1


class _Silenced(Exception):
    """Raised on the silent rank when it wakes, to leave the forward."""


def _inject(comm, *, phase: str, nth: int, mode: str, silent_s: float, log: list) -> None:
    """Wrap ``comm._issue`` so that the ``nth`` collective of ``phase`` in forward
    ``FAULT_STEP`` triggers ``mode`` before it is issued."""
    issue = comm._issue
    seen = [0]

    def wrapped(phase_, cursor, launch, then):
        if phase_ == phase and cursor.step == FAULT_STEP:
            seen[0] += 1
            if seen[0] == nth:
                log.append((phase_, cursor.step, cursor.seq))
                if mode == "exit":
                    os._exit(0)
                time.sleep(silent_s)
                raise _Silenced(f"silent through {phase} #{nth}")
        return issue(phase_, cursor, launch, then)

    comm._issue = wrapped


def _hot(logits: torch.Tensor) -> torch.Tensor:
    """Routing skewed towards experts 4 and 5, so the first rebalance moves experts."""
    out = logits.clone()
    out[:, [4, 5]] += 3.0
    return out


def fault_task(ctx, *, phase: str, mode: str, comm: str, eplb: bool, faulty_rank: int,
               budget_s: float, nth: int = 1, silent_s: float | None = None):
    """Two forwards of one layer (``FAULT_STEP`` = 1 is the faulty one); with ``eplb`` the
    layer is due at step 1, so the second forward ends with the step check, the window
    all-reduce and the migration. Returns, on survivors, what the faulty forward raised,
    how long it took, whether the poisoned layer refuses ``forward`` and how long ``close()``
    took. ``silent_s``: how long the silent rank stays silent (default budget + 1.5 s)."""
    counts_phase = phase == "counts"  # the count gather runs only without checks or counts
    cfg = MoEConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I,
                    check_inputs=not counts_phase)
    case = make_case(cfg, ROWS * ctx.world_size * (FAULT_STEP + 2), 21)
    balancer = None
    if eplb:
        bal = LoadBalancer(EPLBConfig(num_layers=1, num_experts=E, num_slots=S,
                                      num_ranks=ctx.world_size, window_size=2,
                                      rebalance_interval=FAULT_STEP + 1))
        balancer = bal.layer(0)
    mapping = ctx.mapping(timeout_s=budget_s, warmup_timeout_s=30.0,
                          warmup_forwards=FAULT_STEP, store=ctx.store)
    layer = ConfigurableMoE(cfg, mapping, comm=comm, layer_idx=LAYER, balancer=balancer)
    layer.load_weights(case.w13, case.w2)
    logits = _hot(case.logits)
    counts = [ROWS] * ctx.world_size

    def forward(step: int):
        lo = (step * ctx.world_size + ctx.rank) * ROWS
        return layer(case.x[lo:lo + ROWS], logits[lo:lo + ROWS],
                     all_rank_num_tokens=None if counts_phase else counts)

    log: list = []
    if ctx.rank == faulty_rank:
        _inject(layer.communicator, phase=phase, nth=nth, mode=mode,
                silent_s=budget_s + 1.5 if silent_s is None else silent_s, log=log)
    for step in range(FAULT_STEP):
        forward(step)
        if eplb:
            bal.step()
    if ctx.rank == faulty_rank:
        try:
            forward(FAULT_STEP)
        except _Silenced:
            return {"silent": True, "injected": log}
        finally:
            # NOTE: the wrapper closes over the communicator (a reference cycle): drop it so
            # this rank's group dies with the task and closes its connections; the survivors'
            # pending collective only ends (and their group's destructor returns) then.
            del layer.communicator._issue
        return {"silent": False, "injected": log}  # the phase never came: the test fails
    t0 = time.monotonic()
    try:
        forward(FAULT_STEP)
        return {"error": None, "elapsed": time.monotonic() - t0}
    except (CommTimeoutError, LayerClosedError) as exc:
        elapsed = time.monotonic() - t0
        info = {"error": type(exc).__name__, "elapsed": elapsed, "message": str(exc),
                "phase": getattr(exc, "phase", None), "layer": getattr(exc, "layer", None),
                "step": getattr(exc, "step", None), "rank": getattr(exc, "rank", None),
                "missing": getattr(exc, "missing_ranks", None)}
    t1 = time.monotonic()
    try:
        forward(FAULT_STEP)
        info["refused"] = None
    except LayerClosedError as exc:
        info["refused"] = str(exc)
    info["refuse_s"] = time.monotonic() - t1
    t2 = time.monotonic()
    layer.close()
    layer.close()
    info["close_s"] = time.monotonic() - t2
    return info


def eplb_moves_task(ctx, *, comm: str):
    """The fault matrix's EPLB setup without a fault: the due step migrates experts and the
    output still matches the unsharded reference (so ``eplb.migrate`` is a real phase)."""
    cfg = MoEConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I)
    case = make_case(cfg, ROWS * ctx.world_size * (FAULT_STEP + 2), 21)
    bal = LoadBalancer(EPLBConfig(num_layers=1, num_experts=E, num_slots=S,
                                  num_ranks=ctx.world_size, window_size=2,
                                  rebalance_interval=FAULT_STEP + 1))
    logits = _hot(case.logits)
    glob = type(case)(x=case.x, logits=logits, w13=case.w13, w2=case.w2, shared=None,
                      bias=None)
    ref = reference_output(cfg, glob)
    errs = []
    with ConfigurableMoE(cfg, ctx.mapping(store=ctx.store), comm=comm, layer_idx=LAYER,
                         balancer=bal.layer(0)) as layer:
        layer.load_weights(case.w13, case.w2)
        for step in range(FAULT_STEP + 2):
            lo = (step * ctx.world_size + ctx.rank) * ROWS
            out = layer(case.x[lo:lo + ROWS], logits[lo:lo + ROWS],
                        all_rank_num_tokens=[ROWS] * ctx.world_size)
            errs.append(rel_err(out, ref[lo:lo + ROWS]))
            bal.step()
    return {"errs": errs, "moved": [(m.step, m.slots_changed) for m in bal.migrations]}


# -- the pool frees each task's group before the next task --------------------------------
#: Weak references to the groups :func:`group_in_a_cycle_task` left behind (this process).
_LEFT_GROUPS: list = []
#: Groups :func:`group_kept_task` keeps alive on purpose (this process).
_KEPT_GROUPS: list = []


def group_in_a_cycle_task(ctx):
    """Leave this task's group in a reference cycle, as a layer bound to its EPLB handle
    once did, with the cyclic garbage collector off: only the pool can free it now."""
    gc.disable()
    holder = {"group": ctx.group}
    holder["self"] = holder
    _LEFT_GROUPS.append(weakref.ref(ctx.group))


def group_freed_task(ctx):
    """Whether the groups :func:`group_in_a_cycle_task` left are gone (read before the
    collector is turned back on, so no collection in this task can free them)."""
    freed = [ref() is None for ref in _LEFT_GROUPS]
    _LEFT_GROUPS.clear()
    gc.enable()
    return freed


def group_kept_task(ctx):
    """Keep this task's group alive after the task (the pool reports a ``GroupLeak``)."""
    _KEPT_GROUPS.append(ctx.group)


def drop_kept_groups_task(ctx):
    _KEPT_GROUPS.clear()


# -- rank-inconsistent input and state ----------------------------------------------------
#: Kinds whose state diverges after a forward every rank ran (that forward runs first).
_AFTER_A_FORWARD = ("closed", "poisoned", "step")


def inconsistency_task(ctx, *, kind: str, bad_rank: int, budget_s: float, store: bool = True,
                       scheduler: str = "auto"):
    """One forward in which ``bad_rank``'s input or layer state differs from the others'
    (``kind``); every rank reports what it raised, the ranks the error names and how long it
    took. Where the error leaves the layers usable, every rank then runs a consistent forward
    (``retry_err``: its error against the unsharded reference), which used to abort the
    process (gloo: "Received data size doesn't match expected size") after a disagreement.

    Kinds: ``counts_list`` (a list that differs from the others' in another rank's entry),
    ``counts_none`` (None where the others pass the right list: not an error),
    ``use_dp_padding``, ``not_loaded``, ``built_differently`` (another comm strategy),
    ``closed``, ``poisoned``, ``step`` (one forward more on the counter). ``scheduler``:
    ``"dbo"`` runs the dual-batch-overlap scheduler (the same agreed validation, then a split
    at 4 rows per rank)."""
    from moerun.comm import CollectiveCursor

    bad = ctx.rank == bad_rank
    world = ctx.world_size
    cfg = MoEConfig(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I)
    case = make_case(cfg, 4 * world, 33)
    counts = [4] * world
    comm = "alltoall" if bad and kind == "built_differently" else "allgather"
    mapping = ctx.mapping(timeout_s=budget_s, warmup_timeout_s=budget_s,
                          store=ctx.store if store else None)
    dbo = None
    if scheduler == "dbo":
        from schedulers import DBOConfig

        dbo = DBOConfig(small_threshold=4)
    layer = ConfigurableMoE(cfg, mapping, comm=comm, layer_idx=3, scheduler=scheduler,
                            dbo_config=dbo)
    if not (bad and kind == "not_loaded"):
        layer.load_weights(case.w13, case.w2)
    lo = 4 * ctx.rank
    x, logits = case.x[lo:lo + 4], case.logits[lo:lo + 4]
    ref = reference_output(cfg, case)[lo:lo + 4]
    if kind in _AFTER_A_FORWARD:
        layer(x, logits, all_rank_num_tokens=counts)
        if bad and kind == "closed":
            layer.close()
        elif bad and kind == "poisoned":
            # as if this rank's previous forward had timed out after its peers passed it
            layer.communicator.poison(CollectiveCursor(step=0), 0)
        elif bad and kind == "step":
            layer._counters.advance(layer.repeat_count)  # as if it had run one forward more
    kwargs = {"all_rank_num_tokens": counts}
    if bad and kind == "counts_list":
        other = (bad_rank + 1) % world  # its own entry stays right: only peers can tell
        kwargs["all_rank_num_tokens"] = [c + (r == other) for r, c in enumerate(counts)]
    elif bad and kind == "counts_none":
        kwargs["all_rank_num_tokens"] = None
    elif bad and kind == "use_dp_padding":
        kwargs["use_dp_padding"] = True
    t0 = time.monotonic()
    try:
        out = layer(x, logits, **kwargs)
        result = {"error": None, "err": rel_err(out, ref)}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        result = {"error": type(exc).__name__, "message": str(exc),
                  "ranks": getattr(exc, "ranks", None),
                  "phase": getattr(exc, "phase", None),
                  "missing": getattr(exc, "missing_ranks", None)}
    result["elapsed"] = time.monotonic() - t0
    if kind in ("counts_list", "counts_none", "use_dp_padding", "not_loaded"):
        if bad and kind == "not_loaded":
            layer.load_weights(case.w13, case.w2)
        result["retry_err"] = rel_err(layer(x, logits, all_rank_num_tokens=counts), ref)
    t1 = time.monotonic()
    layer.close()
    result["close_s"] = time.monotonic() - t1
    return result
