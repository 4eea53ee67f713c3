"""Rank-side task bodies of the ``forward_async`` tests (module-level for the pool)."""

from __future__ import annotations

import torch

from moerun import ConfigurableMoE, MoEConfig
from schedulers import DBOConfig
from tests.moe_cases import make_case, reference_output, rel_err
from traces import ScheduleRecorder

SPLIT_SMALL = DBOConfig(small_threshold=2, min_rows_per_expert_one_rank=0.0)


def async_task(ctx, *, counts, comm, scheduler, max_num_tokens=None, shared=0,
               shared_order="auto", forwards=2, seed=0):
    """The same inputs through ``forward_async`` + ``wait`` on one layer and ``forward`` on
    another: outputs, the unsharded reference, what the recorder holds when
    ``forward_async`` returns, the step counter, and the misuse refusals while pending."""
    cfg = MoEConfig(num_experts=6, top_k=2, hidden_size=8, intermediate_size=8,
                    shared_intermediate_size=shared, max_num_tokens=max_num_tokens)
    total = sum(counts)
    case = make_case(cfg, total * forwards, seed)
    lo = sum(counts[: ctx.rank])
    rec = ScheduleRecorder()
    kw = dict(comm=comm, layer_idx=0, backend="reference", shared_expert_order=shared_order,
              scheduler=scheduler, dbo_config=SPLIT_SMALL)
    res = {"diff": [], "err": [], "at_return": [], "after": [], "steps": [], "refused": [],
           "same_object": []}
    with ConfigurableMoE(cfg, ctx.mapping(), recorder=rec, **kw) as lazy, \
            ConfigurableMoE(cfg, ctx.mapping(), **kw) as eager:
        lazy.load_weights(case.w13, case.w2, case.shared)
        eager.load_weights(case.w13, case.w2, case.shared)
        for f in range(forwards):
            sl = slice(f * total + lo, f * total + lo + counts[ctx.rank])
            rec.events.clear()
            step = lazy.step
            handle = lazy.forward_async(case.x[sl], case.logits[sl],
                                        all_rank_num_tokens=list(counts))
            phases = [e.phase for e in rec.events if e.kind == "range"]
            res["at_return"].append((phases.count("combine"), phases.count("combine.wait")))
            refused = []
            for call in (lambda sl=sl: lazy(case.x[sl], case.logits[sl]),
                         lambda sl=sl: lazy.forward_async(case.x[sl], case.logits[sl])):
                try:
                    call()
                    refused.append(None)
                except RuntimeError as exc:
                    refused.append(str(exc))
            res["refused"].append(refused)
            own = torch.randn(64, 64) @ torch.randn(64, 64)  # the caller's own work
            res["steps"].append((step, lazy.step, handle.done))
            out = handle.wait()
            res["same_object"].append(handle.wait() is out and handle.done)
            res["steps"][-1] += (lazy.step,)
            phases = [e.phase for e in rec.events if e.kind == "range"]
            res["after"].append((phases.count("combine"), phases.count("combine.wait")))
            ref = eager(case.x[sl], case.logits[sl], all_rank_num_tokens=list(counts))
            glob = type(case)(x=case.x[f * total:(f + 1) * total],
                              logits=case.logits[f * total:(f + 1) * total], w13=case.w13,
                              w2=case.w2, shared=case.shared, bias=case.bias)
            res["diff"].append(bool(torch.equal(out, ref)) and own.shape == (64, 64))
            res["err"].append(rel_err(out, reference_output(cfg, glob)[lo:lo + counts[ctx.rank]]))
        res["split"] = sorted({e.ub for e in rec.events if e.ub is not None}) == [0, 1]
    return res
