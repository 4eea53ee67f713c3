"""Rank-side task bodies of the multi-rank FP8 tests (issue 12; module-level for the pool)."""

from __future__ import annotations

import torch

from moerun import ConfigurableMoE, MoEConfig, QuantConfig
from moerun.quant import FP8_DTYPE, QuantizedRows, quantize_rows
from moerun.testing import make_case, reference_output, rel_err, unquantized_reference


def fp8_config(*, E=8, k=2, H=128, I=128, shared=0, max_num_tokens=None, dtype="float32"):
    return MoEConfig(num_experts=E, top_k=k, hidden_size=H, intermediate_size=I,
                     shared_intermediate_size=shared, max_num_tokens=max_num_tokens,
                     dtype=getattr(torch, dtype), quant=QuantConfig())


def _encoded_rows(rank: int, n: int, h: int, k: int, num_slots: int, seed: int):
    """Quantized rows that encode their source (row t of rank r = ``(1 + t) * (r + 1)`` times
    a seeded random row, so codes and scales differ per row and rank); seeded slot ids."""
    g = torch.Generator().manual_seed(seed * 100 + rank)
    base = torch.randn(n, h, generator=g)
    x = base * ((1.0 + torch.arange(n, dtype=torch.float32)) * (rank + 1))[:, None]
    if n and rank == 0:
        x[0] = 0.0  # a zero row: zero codes, the tiny scale (unique: only on rank 0)
    ids = torch.stack([torch.randperm(num_slots, generator=g)[:k] for _ in range(n)]) \
        if n else torch.empty(0, k, dtype=torch.int64)
    ids = ids.to(torch.int32)
    if n:
        ids[-1, 0] = -1
    w = torch.rand(n, k, generator=g)
    return quantize_rows(x, 128), ids, w


def quant_dispatch_exact_task(ctx, *, counts, comm, num_slots=7, k=3, h=256, seed=0):
    """Dispatch QuantizedRows; every received row's e4m3 bytes and fp32 scales must equal
    its sender's bit for bit (via uint8 / int32 views), ids and weights as for float rows.
    Returns a list of problems (empty = pass)."""
    from moerun.comm import ChunkCounts, CollectiveCursor, Communicator, strategy_class
    from moerun.mapping import slot_partition

    part = slot_partition(num_slots, ctx.world_size)
    strategy = strategy_class(comm)(Communicator(ctx.mapping(), layer_idx=0), part)
    assert strategy.supports_post_quant_dispatch()
    chunk = ChunkCounts(counts=tuple(counts), rank=ctx.rank)
    start, end = part.local_range(ctx.rank)
    every = [_encoded_rows(r, counts[r], h, k, num_slots, seed) for r in range(ctx.world_size)]
    q, ids, w = every[ctx.rank]
    cursor = CollectiveCursor(step=0)
    d = strategy.dispatch(q, ids, w, prepared=strategy.prepare_dispatch(ids, chunk, cursor),
                          async_op=True).wait()
    problems = []
    if not isinstance(d.x, QuantizedRows) or d.x.data.dtype != FP8_DTYPE:
        return [f"received {type(d.x).__name__}, expected QuantizedRows of e4m3"]
    # index every sent row by its exact bytes (all rows differ: the encoding above)
    key = {}
    for r, (qr, _, _) in enumerate(every):
        for t in range(qr.shape[0]):
            key[bytes(qr.data[t].view(torch.uint8).tolist())
                + bytes(qr.scale[t].view(torch.uint8).tolist())] = (r, t)
    m = max(counts)
    seen = set()
    for i in range(d.x.shape[0]):
        data_b = bytes(d.x.data[i].view(torch.uint8).tolist())
        scale_b = bytes(d.x.scale[i].contiguous().view(torch.uint8).tolist())
        if comm == "allgather" and i % m >= counts[i // m]:  # padding
            if not bool((d.topk_ids[i] == -1).all()) or any(data_b):
                problems.append(f"padded row {i}: ids {d.topk_ids[i].tolist()}, nonzero codes")
            continue
        src = key.get(data_b + scale_b)
        if src is None:
            problems.append(f"row {i}: bytes and scales match no sender's row")
            continue
        r, t = src
        if comm == "allgather" and (r, t) != (i // m, i % m):
            problems.append(f"row {i} holds ({r},{t}), expected ({i // m},{i % m})")
        sids, sw = every[r][1][t], every[r][2][t]
        expect = [int(s) - start if start <= int(s) < end else -1 for s in sids]
        if d.topk_ids[i].tolist() != expect:
            problems.append(f"row {i} from ({r},{t}): ids {d.topk_ids[i].tolist()} != {expect}")
        if not torch.equal(d.topk_weights[i], sw):
            problems.append(f"row {i} from ({r},{t}): weights differ")
        if (r, t) in seen:
            problems.append(f"({r},{t}) received twice")
        seen.add((r, t))
    if comm == "alltoall":
        for r, (_, sids, _) in enumerate(every):
            for t in range(sids.shape[0]):
                if any(start <= int(s) < end for s in sids[t]) and (r, t) not in seen:
                    problems.append(f"({r},{t}) missing")
    # combine returns fp32 partial sums in the experts' output dtype (quantized rows)
    out = strategy.combine(torch.ones(d.x.shape[0], h, dtype=torch.bfloat16), d)
    if out.dtype != torch.bfloat16 or tuple(out.shape) != (counts[ctx.rank], h):
        problems.append(f"combine gave {out.dtype} {tuple(out.shape)}")
    return problems


def fp8_layer_task(ctx, *, counts, comm="allgather", max_num_tokens=None, shared=0, seed=0,
                   dtype="float32", scheduler="auto", dbo_threshold=None):
    """One FP8 layer forward on this rank's share: errors against DESIGN 11a's reference,
    against the unquantized fp64 layer, and against a single-rank layer on the whole batch."""
    from moerun import Mapping

    cfg = fp8_config(shared=shared, max_num_tokens=max_num_tokens, dtype=dtype)
    case = make_case(cfg, sum(counts), seed)
    lo = sum(counts[: ctx.rank])
    hi = lo + counts[ctx.rank]
    dbo = None
    if dbo_threshold is not None:
        from schedulers import DBOConfig

        dbo = DBOConfig(small_threshold=dbo_threshold, min_rows_per_expert_one_rank=0.0)
    from traces import ScheduleRecorder

    rec = ScheduleRecorder()
    with ConfigurableMoE(cfg, ctx.mapping(), comm=comm, layer_idx=0, scheduler=scheduler,
                         dbo_config=dbo, recorder=rec) as layer, \
            ConfigurableMoE(cfg.replace(max_num_tokens=None), Mapping(), layer_idx=0) as one:
        for m in (layer, one):
            m.load_weights(case.w13, case.w2, case.shared, w13_scale=case.w13_scale,
                           w2_scale=case.w2_scale)
        out = layer(case.x[lo:hi], case.logits[lo:hi], all_rank_num_tokens=list(counts))
        single = one(case.x, case.logits)[lo:hi]
        return {"err": rel_err(out, reference_output(cfg, case)[lo:hi]),
                "err_unquantized": rel_err(out, unquantized_reference(cfg, case)[lo:hi]),
                "vs_single": rel_err(out, single.double()) if out.numel() else 0.0,
                "rows": out.shape[0], "dtype": str(out.dtype),
                "phases": [e.phase for e in rec.events], "ubs": sorted({e.ub for e in rec.events
                                                                 if e.ub is not None})}


def fp8_eplb_task(ctx, *, counts, steps=6, comm="allgather", num_slots=12, interval=2):
    """An FP8 layer under EPLB (replicas, migrations across ranks) against the same layer
    without EPLB, every forward; returns the errors and the migrations."""
    from eplb import EPLBConfig, LoadBalancer

    cfg = fp8_config()
    bal = LoadBalancer(EPLBConfig(num_layers=1, num_experts=8, num_slots=num_slots,
                                  num_ranks=ctx.world_size, window_size=2,
                                  rebalance_interval=interval, layers_per_step=1))
    total = sum(counts)
    case = make_case(cfg, total * steps, 7)
    logits = case.logits.clone()
    logits[:, [0, 1]] += 3.0  # hot experts: the placement changes
    lo = sum(counts[: ctx.rank])
    errs = []
    with ConfigurableMoE(cfg, ctx.mapping(), comm=comm, layer_idx=0,
                         balancer=bal.layer(0)) as on, \
            ConfigurableMoE(cfg, ctx.mapping(), comm=comm, layer_idx=0) as off:
        for m in (on, off):
            m.load_weights(case.w13, case.w2, w13_scale=case.w13_scale, w2_scale=case.w2_scale)
        for step in range(steps):
            sl = slice(step * total + lo, step * total + lo + counts[ctx.rank])
            a = on(case.x[sl], logits[sl], all_rank_num_tokens=list(counts))
            b = off(case.x[sl], logits[sl], all_rank_num_tokens=list(counts))
            errs.append(rel_err(a, b.double()) if b.numel() else 0.0)
            bal.step()
    return {"errs": errs, "migrations": [(s.step, s.slots_changed) for s in bal.migrations]}
