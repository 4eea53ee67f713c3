"""Rank-side task bodies for the EPLB multi-rank tests."""

from __future__ import annotations

import torch

from eplb import EPLBConfig, LoadBalancer
from moerun import ConfigurableMoE, MoEConfig
from moerun.testing import make_case, reference_output, rel_err


def _hot_logits(case_logits: torch.Tensor, hot: tuple[int, ...]) -> torch.Tensor:
    """Skew routing towards ``hot`` experts (forced hot experts)."""
    logits = case_logits.clone()
    logits[:, list(hot)] += 3.0
    return logits


def eplb_task(ctx, *, counts, steps=9, max_num_tokens=None, shared=0, comm="allgather",
              num_slots=12, interval=3, window=4, layers=2, hot=(0, 1), extra_step_rank=None,
              repeat_count=1, scheduler="auto", dbo_threshold=None):
    """Run ``layers`` EPLB layers for ``steps`` model steps with forced hot experts; compare
    every output with the EPLB-off layer and the fp64 reference."""
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=16, intermediate_size=8,
                    shared_intermediate_size=shared, max_num_tokens=max_num_tokens)
    bal = LoadBalancer(EPLBConfig(num_layers=layers, num_experts=8, num_slots=num_slots,
                                  num_ranks=ctx.world_size, window_size=window,
                                  rebalance_interval=interval, layers_per_step=1))
    mapping = ctx.mapping()
    cases = [make_case(cfg, sum(counts) * steps * repeat_count, 100 + layer)
             for layer in range(layers)]
    dbo = None
    if dbo_threshold is not None:
        from schedulers import DBOConfig

        dbo = DBOConfig(small_threshold=dbo_threshold)
    on = [ConfigurableMoE(cfg, mapping, comm=comm, layer_idx=layer, balancer=bal.layer(layer),
                          repeat_count=repeat_count, scheduler=scheduler, dbo_config=dbo)
          for layer in range(layers)]
    off = [ConfigurableMoE(cfg, mapping, comm=comm, layer_idx=layer,
                           repeat_count=repeat_count) for layer in range(layers)]
    for layer in range(layers):
        c = cases[layer]
        on[layer].load_weights(c.w13, c.w2, c.shared)
        off[layer].load_weights(c.w13, c.w2, c.shared)
    errs_ref, errs_off, placements = [], [], [bal.placement().phy2log.tolist()]
    total = sum(counts)
    lo_rank = sum(counts[: ctx.rank])
    for step in range(steps):
        for rep in range(repeat_count):
            base = (step * repeat_count + rep) * total
            for layer in range(layers):
                c = cases[layer]
                logits = _hot_logits(c.logits, hot)
                sl = slice(base + lo_rank, base + lo_rank + counts[ctx.rank])
                out_on = on[layer](c.x[sl], logits[sl], all_rank_num_tokens=list(counts))
                out_off = off[layer](c.x[sl], logits[sl], all_rank_num_tokens=list(counts))
                glob = type(c)(x=c.x[base:base + total], logits=logits[base:base + total],
                               w13=c.w13, w2=c.w2, shared=c.shared, bias=c.bias)
                ref = reference_output(cfg, glob)[lo_rank:lo_rank + counts[ctx.rank]]
                errs_ref.append(rel_err(out_on, ref))
                errs_off.append(rel_err(out_on, out_off.double()) if out_off.numel() else 0.0)
        bal.step()
        if extra_step_rank == ctx.rank and step == 0:
            bal.step()  # an engine bug: one extra step on one rank
        placements.append(bal.placement().phy2log.tolist())
    m = bal.metrics()
    for layer in on + off:
        layer.close()
    return {"errs_ref": errs_ref, "errs_off": errs_off, "placements": placements,
            "migrations": [(s.layer, s.step, s.slots_changed) for s in bal.migrations],
            "metrics": m}
