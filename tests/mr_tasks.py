"""Rank-side task bodies for the multi-rank tests (module-level so the pool can pickle them)."""

from __future__ import annotations

import torch

from moerun import ConfigurableMoE, MoEConfig
from tests.moe_cases import make_case, reference_output, rel_err


def moe_task(ctx, *, counts, comm="allgather", max_num_tokens=None, E=8, k=2, H=16, I=24,
             shared=0, seed=0, pass_counts=True, use_dp_padding=False, dtype="float32",
             shared_order="auto", shared_gate=False, backend="auto"):
    """Run one layer forward on this rank's share; return its error vs the unsharded ref."""
    cfg = MoEConfig(num_experts=E, top_k=k, hidden_size=H, intermediate_size=I,
                    shared_intermediate_size=shared, shared_expert_gate=shared_gate,
                    max_num_tokens=max_num_tokens, dtype=getattr(torch, dtype))
    case = make_case(cfg, sum(counts), seed)
    lo = sum(counts[: ctx.rank])
    hi = lo + counts[ctx.rank]
    with ConfigurableMoE(cfg, ctx.mapping(), comm=comm, layer_idx=0, backend=backend,
                         shared_expert_order=shared_order) as layer:
        layer.load_weights(case.w13, case.w2, case.shared)
        out = layer(case.x[lo:hi], case.logits[lo:hi],
                    all_rank_num_tokens=list(counts) if pass_counts else None,
                    use_dp_padding=use_dp_padding)
        ref = reference_output(cfg, case)[lo:hi]
        return {"err": rel_err(out, ref), "rows": out.shape[0], "strategy": layer.report.strategy}


# -- communication-level tasks --------------------------------------------------------------
def _encoded_chunk(rank: int, n: int, h: int, k: int, num_slots: int, seed: int):
    """Rows that encode their source: ``x[t, :] = 1000 * rank + t``; seeded global slot ids."""
    g = torch.Generator().manual_seed(seed * 100 + rank)
    x = (1000.0 * rank + torch.arange(n, dtype=torch.float32))[:, None].expand(n, h).clone()
    ids = torch.stack([torch.randperm(num_slots, generator=g)[:k] for _ in range(n)]) \
        if n else torch.empty(0, k, dtype=torch.int64)
    ids = ids.to(torch.int32)
    if n:
        ids[0, -1] = -1  # a skipped (token, j): padded/unrouted entries travel as -1
    w = torch.rand(n, k, generator=g)
    return x, ids, w


def comm_exact_task(ctx, *, counts, comm, num_slots=7, k=3, h=4, seed=0):
    """Dispatch encoded rows, check every received row against its sender exactly, then
    combine an exact per-row function and check the sum at the source."""
    from moerun.comm import ChunkCounts, CollectiveCursor, Communicator, strategy_class
    from moerun.mapping import slot_partition

    mapping = ctx.mapping()
    part = slot_partition(num_slots, ctx.world_size)
    strategy = strategy_class(comm)(Communicator(mapping, layer_idx=0), part)
    cursor = CollectiveCursor(step=0)
    chunk = ChunkCounts(counts=tuple(counts), rank=ctx.rank)
    start, end = part.local_range(ctx.rank)
    every = [_encoded_chunk(r, counts[r], h, k, num_slots, seed) for r in range(ctx.world_size)]
    x, ids, w = every[ctx.rank]
    d = strategy.dispatch(x, ids, w, prepared=strategy.prepare_dispatch(ids, chunk, cursor))
    problems = []
    seen = set()
    for i in range(d.x.shape[0]):
        row = d.x[i]
        if comm == "allgather" and i % max(counts) >= counts[i // max(counts)]:
            if not bool((d.topk_ids[i] == -1).all()):
                problems.append(f"padded row {i} has ids {d.topk_ids[i].tolist()}")
            continue
        val = float(row[0])
        src, t = int(val // 1000), int(val % 1000)
        if not bool((row == val).all()):
            problems.append(f"row {i} not constant")
        sx, sids, sw = every[src]
        expect = [int(s) - start if start <= int(s) < end else -1 for s in sids[t]]
        if d.topk_ids[i].tolist() != expect:
            problems.append(f"row {i} from ({src},{t}): ids {d.topk_ids[i].tolist()} != {expect}")
        if not torch.equal(d.topk_weights[i], sw[t]):
            problems.append(f"row {i} from ({src},{t}): weights differ")
        if comm == "alltoall":
            if all(e == -1 for e in expect):
                problems.append(f"row {i} from ({src},{t}) sent to a rank holding none of it")
            if (src, t) in seen:
                problems.append(f"({src},{t}) received twice")
            seen.add((src, t))
    if comm == "alltoall":  # every (token, this rank) pair with a local slot arrived
        for src, (sx, sids, sw) in enumerate(every):
            for t in range(sids.shape[0]):
                if any(start <= int(s) < end for s in sids[t]) and (src, t) not in seen:
                    problems.append(f"({src},{t}) missing")
    # combine: each receiver returns x_row * (number of local valid j); the source must get
    # x * (number of valid j overall), exactly.
    local_valid = (d.topk_ids >= 0).sum(dim=1, keepdim=True).to(torch.float32)
    out = strategy.combine(d.x * local_valid, d)
    expect_out = x * (ids >= 0).sum(dim=1, keepdim=True).to(torch.float32)
    if not torch.equal(out, expect_out):
        problems.append(f"combine mismatch: max diff {float((out - expect_out).abs().max())}")
    return problems


def interleaved_chunks_task(ctx, *, comm, counts_a, counts_b, num_slots=6, k=2, h=4):
    """Two chunks' dispatches in flight before either combine; both results exact."""
    from moerun.comm import ChunkCounts, CollectiveCursor, Communicator, strategy_class
    from moerun.mapping import slot_partition

    part = slot_partition(num_slots, ctx.world_size)
    strategy = strategy_class(comm)(Communicator(ctx.mapping(), layer_idx=0), part)
    # two micro-batches of one step, each with its own cursor (DBO): they never share one
    cur_a, cur_b = CollectiveCursor(step=0, ub=0), CollectiveCursor(step=0, ub=1)
    xa, ia, wa = _encoded_chunk(ctx.rank, counts_a[ctx.rank], h, k, num_slots, 1)
    xb, ib, wb = _encoded_chunk(ctx.rank, counts_b[ctx.rank], h, k, num_slots, 2)
    ca = ChunkCounts(counts=tuple(counts_a), rank=ctx.rank)
    cb = ChunkCounts(counts=tuple(counts_b), rank=ctx.rank)
    da = strategy.dispatch(xa, ia, wa, prepared=strategy.prepare_dispatch(ia, ca, cur_a),
                           async_op=True)
    db = strategy.dispatch(xb + 0.5, ib, wb, prepared=strategy.prepare_dispatch(ib, cb, cur_b),
                           async_op=True)
    db.wait()
    da.wait()
    ha = strategy.combine(da.x * (da.topk_ids >= 0).sum(1, keepdim=True), da, async_op=True)
    hb = strategy.combine(db.x * (db.topk_ids >= 0).sum(1, keepdim=True), db, async_op=True)
    ob, oa = hb.wait(), ha.wait()
    ea = xa * (ia >= 0).sum(1, keepdim=True)
    eb = (xb + 0.5) * (ib >= 0).sum(1, keepdim=True)
    return bool(torch.equal(oa, ea)) and bool(torch.equal(ob, eb))


# -- scheduler-level tasks --------------------------------------------------------------------
class RecordingBalancer:
    """Implements eplb.hooks.LayerBalancerHooks; logs each hook and the chunk rows it saw."""

    enabled = True

    def __init__(self, num_experts: int) -> None:
        self.num_slots = num_experts
        self.log: list[str] = []

    def local_experts(self, start, end):
        return list(range(start, end))

    def start_wait_gpu(self, ctx):
        self.log.append("start_wait_gpu")

    def done_wait_gpu(self, ctx):
        self.log.append("done_wait_gpu")

    def update_statistic(self, ctx, topk_ids):
        self.log.append(f"update_statistic:{topk_ids.shape[0]}")

    def route(self, ctx, topk_ids, row_offset):
        self.log.append(f"route:{row_offset}")
        return topk_ids

    def start_set_cpu(self, ctx):
        self.log.append("start_set_cpu")

    def done_set_cpu(self, ctx):
        self.log.append("done_set_cpu")


def recorder_task(ctx, *, counts, comm, max_num_tokens, repeat_count=1, forwards=1):
    from traces import ScheduleRecorder

    cfg = MoEConfig(num_experts=6, top_k=2, hidden_size=8, intermediate_size=8,
                    max_num_tokens=max_num_tokens)
    case = make_case(cfg, sum(counts), 3)
    lo = sum(counts[: ctx.rank])
    rec = ScheduleRecorder()
    bal = RecordingBalancer(6)
    with ConfigurableMoE(cfg, ctx.mapping(), comm=comm, layer_idx=5, balancer=bal,
                         recorder=rec, repeat_count=repeat_count) as layer:
        layer.load_weights(case.w13, case.w2)
        for _ in range(forwards):
            layer(case.x[lo:lo + counts[ctx.rank]], case.logits[lo:lo + counts[ctx.rank]],
                  all_rank_num_tokens=list(counts))
    return {"events": [(e.name, e.phase, e.chunk, e.stream, e.rank) for e in rec.events],
            "hooks": bal.log}



def fallback_task(ctx, *, counts):
    from moerun.comm import AllToAll

    class SmallOnlyAllToAll(AllToAll):
        name = "SmallOnlyAllToAll"

        def is_workload_feasible(self, all_rank_num_tokens, num_chunks):
            return max(all_rank_num_tokens) <= 4

    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=16, intermediate_size=8)
    case = make_case(cfg, 2 * sum(counts), 11)
    errs, strategies = [], []
    with ConfigurableMoE(cfg, ctx.mapping(), comm=SmallOnlyAllToAll, layer_idx=1) as layer:
        layer.load_weights(case.w13, case.w2)
        ref = reference_output(cfg, case)
        small = [min(c, 4) for c in counts]
        for step_counts in (small, list(counts), small):
            lo = sum(step_counts[: ctx.rank])
            out = layer(case.x[lo:lo + step_counts[ctx.rank]],
                        case.logits[lo:lo + step_counts[ctx.rank]],
                        all_rank_num_tokens=step_counts)
            errs.append(rel_err(out, ref[lo:lo + step_counts[ctx.rank]]))
            strategies.append(type(layer.strategy).__name__)
        return {"errs": errs, "strategies": strategies, "fallbacks": list(layer.report.fallbacks)}


def bad_input_task(ctx, *, bad_rank, kind):
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=8, intermediate_size=8)
    counts = [3] * ctx.world_size
    case = make_case(cfg, sum(counts), 5)
    lo = 3 * ctx.rank
    x, logits = case.x[lo:lo + 3], case.logits[lo:lo + 3].clone()
    all_counts = list(counts)
    if ctx.rank == bad_rank:
        if kind == "nan":
            logits[1, 2] = float("nan")
        elif kind == "rows":
            x = x[:2]
            logits = logits[:2]
    with ConfigurableMoE(cfg, ctx.mapping(), layer_idx=0) as layer:
        layer.load_weights(case.w13, case.w2)
        layer(x, logits, all_rank_num_tokens=all_counts)
    return "no error"


def fault_task(ctx, *, faulty_rank, mode, budget_s, store):
    """``mode``: "silent" (the faulty rank sleeps past the budget) or "exit" (it exits)."""
    import os
    import time

    from moerun import CommTimeoutError, LayerClosedError

    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=8, intermediate_size=8)
    case = make_case(cfg, 4 * ctx.world_size, 2)
    mapping = ctx.mapping(timeout_s=budget_s, warmup_timeout_s=budget_s,
                          store=ctx.store if store else None)
    layer = ConfigurableMoE(cfg, mapping, layer_idx=7)
    layer.load_weights(case.w13, case.w2)
    x, logits = case.x[4 * ctx.rank:4 * ctx.rank + 4], case.logits[4 * ctx.rank:4 * ctx.rank + 4]
    counts = [4] * ctx.world_size
    layer(x, logits, all_rank_num_tokens=counts)  # one good forward first
    if ctx.rank == faulty_rank:
        if mode == "exit":
            os._exit(0)
        time.sleep(budget_s * 2 + 1)
        return {"slept": True}
    t0 = time.monotonic()
    try:
        layer(x, logits, all_rank_num_tokens=counts)
        return {"error": None}
    except CommTimeoutError as exc:
        elapsed = time.monotonic() - t0
        try:
            layer(x, logits, all_rank_num_tokens=counts)
            refused = False
        except LayerClosedError:
            refused = True
        t1 = time.monotonic()
        layer.close()
        layer.close()
        return {"error": "CommTimeoutError", "phase": exc.phase, "layer": exc.layer,
                "step": exc.step, "rank": exc.rank, "missing": exc.missing_ranks,
                "elapsed": elapsed, "refused": refused, "close_s": time.monotonic() - t1}


def lifecycle_task(ctx, *, cycles):
    import os
    import threading

    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=8, intermediate_size=8)
    case = make_case(cfg, 3 * ctx.world_size, 9)
    x, logits = case.x[3 * ctx.rank:3 * ctx.rank + 3], case.logits[3 * ctx.rank:3 * ctx.rank + 3]
    snapshots = {}
    for cycle in range(1, cycles + 1):
        with ConfigurableMoE(cfg, ctx.mapping(), layer_idx=0) as layer:
            layer.load_weights(case.w13, case.w2)
            layer(x, logits, all_rank_num_tokens=[3] * ctx.world_size)
        if cycle in (10, cycles):
            snapshots[cycle] = (threading.active_count(), len(os.listdir("/proc/self/fd")))
    return snapshots
