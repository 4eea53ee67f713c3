"""Rank-side task bodies for the multi-rank tests (module-level so the pool can pickle them)."""

from __future__ import annotations

import torch

from moerun import ConfigurableMoE, MoEConfig
from tests.moe_cases import make_case, reference_output, rel_err


def moe_task(ctx, *, counts, comm="allgather", max_num_tokens=None, E=8, k=2, H=16, I=24,
             shared=0, seed=0, pass_counts=True, use_dp_padding=False, dtype="float32"):
    """Run one layer forward on this rank's share; return its error vs the unsharded ref."""
    cfg = MoEConfig(num_experts=E, top_k=k, hidden_size=H, intermediate_size=I,
                    shared_intermediate_size=shared, max_num_tokens=max_num_tokens,
                    dtype=getattr(torch, dtype))
    case = make_case(cfg, sum(counts), seed)
    lo = sum(counts[: ctx.rank])
    hi = lo + counts[ctx.rank]
    with ConfigurableMoE(cfg, ctx.mapping(), comm=comm, layer_idx=0) as layer:
        layer.load_weights(case.w13, case.w2, case.shared)
        out = layer(case.x[lo:hi], case.logits[lo:hi],
                    all_rank_num_tokens=list(counts) if pass_counts else None,
                    use_dp_padding=use_dp_padding)
        ref = reference_output(cfg, case)[lo:hi]
        return {"err": rel_err(out, ref), "rows": out.shape[0], "strategy": layer.report.strategy}
