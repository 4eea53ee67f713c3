"""Rank-side task bodies of the dual-batch-overlap tests (module-level for the pool)."""

from __future__ import annotations


from moerun import ConfigurableMoE, MoEConfig
from schedulers import DBOConfig
from tests.moe_cases import make_case, reference_output, rel_err
from traces import ScheduleRecorder

# small thresholds so a test-sized batch splits (the rule itself is tested on its own)
SPLIT_SMALL = DBOConfig(small_threshold=2, min_rows_per_expert_one_rank=0.0)


class HookLog:
    """A balancer that logs each hook with the micro-batch of the forward context."""

    enabled = True

    def __init__(self, num_experts: int) -> None:
        self.num_slots = num_experts
        self.log: list[str] = []

    def local_experts(self, start, end):
        return list(range(start, end))

    def _hit(self, name, ctx):
        self.log.append(f"{name}:ub{ctx.ub}")

    def start_wait_gpu(self, ctx):
        self._hit("start_wait_gpu", ctx)

    def done_wait_gpu(self, ctx):
        self._hit("done_wait_gpu", ctx)

    def update_statistic(self, ctx, topk_ids):
        self._hit("update_statistic", ctx)

    def route(self, ctx, topk_ids, row_offset):
        self._hit("route", ctx)
        return topk_ids

    def start_set_cpu(self, ctx):
        self._hit("start_set_cpu", ctx)

    def done_set_cpu(self, ctx):
        self._hit("done_set_cpu", ctx)


def dbo_vs_unsplit_task(ctx, *, counts, comm, max_num_tokens=None, shared=0, E=8, k=2,
                        H=16, I=8, seed=0, shared_order="auto", threshold=2, forwards=2,
                        guard=0.0):
    """The same inputs through a DBO layer and an external-comm layer: both against the
    unsharded fp64 reference and against each other; whether DBO split, from its recorder."""
    cfg = MoEConfig(num_experts=E, top_k=k, hidden_size=H, intermediate_size=I,
                    shared_intermediate_size=shared, max_num_tokens=max_num_tokens)
    case = make_case(cfg, sum(counts) * forwards, seed)
    lo = sum(counts[: ctx.rank])
    rec = ScheduleRecorder()
    dbo = DBOConfig(small_threshold=threshold, min_rows_per_expert_one_rank=0.0,
                    min_rows_per_expert_multi_rank=guard)
    kw = dict(comm=comm, layer_idx=0, backend="reference", shared_expert_order=shared_order)
    with ConfigurableMoE(cfg, ctx.mapping(), scheduler="dbo", dbo_config=dbo, recorder=rec,
                         **kw) as split, \
            ConfigurableMoE(cfg, ctx.mapping(), scheduler="external", **kw) as whole:
        split.load_weights(case.w13, case.w2, case.shared)
        whole.load_weights(case.w13, case.w2, case.shared)
        errs, diffs = [], []
        total = sum(counts)
        for f in range(forwards):
            sl = slice(f * total + lo, f * total + lo + counts[ctx.rank])
            a = split(case.x[sl], case.logits[sl], all_rank_num_tokens=list(counts))
            b = whole(case.x[sl], case.logits[sl], all_rank_num_tokens=list(counts))
            glob = type(case)(x=case.x[f * total:(f + 1) * total],
                              logits=case.logits[f * total:(f + 1) * total], w13=case.w13,
                              w2=case.w2, shared=case.shared, bias=case.bias)
            errs.append(rel_err(a, reference_output(cfg, glob)[lo:lo + counts[ctx.rank]]))
            diffs.append(rel_err(a, b.double()) if b.numel() else 0.0)
        ubs = sorted({e.ub for e in rec.events if e.ub is not None})
        return {"errs": errs, "diffs": diffs, "rows": a.shape[0], "ubs": ubs,
                "scheduler": split.report.scheduler}


def dbo_order_task(ctx, *, counts, comm, shared=0, shared_order="auto", max_num_tokens=None,
                   use_dp_padding=False):
    """One split forward; the recorder's events and the balancer hooks, with micro-batches."""
    cfg = MoEConfig(num_experts=6, top_k=2, hidden_size=8, intermediate_size=8,
                    shared_intermediate_size=shared, max_num_tokens=max_num_tokens)
    case = make_case(cfg, sum(counts), 3)
    lo = sum(counts[: ctx.rank])
    rec = ScheduleRecorder()
    bal = HookLog(6)
    with ConfigurableMoE(cfg, ctx.mapping(), comm=comm, layer_idx=2, balancer=bal,
                         recorder=rec, scheduler="dbo", dbo_config=SPLIT_SMALL,
                         shared_expert_order=shared_order, backend="reference") as layer:
        layer.load_weights(case.w13, case.w2, case.shared)
        out = layer(case.x[lo:lo + counts[ctx.rank]], case.logits[lo:lo + counts[ctx.rank]],
                    all_rank_num_tokens=list(counts), use_dp_padding=use_dp_padding)
        ref = reference_output(cfg, case)[lo:lo + counts[ctx.rank]]
    return {"events": [(e.phase, e.ub, e.chunk, e.kind) for e in rec.events],
            "hooks": bal.log, "err": rel_err(out, ref)}
