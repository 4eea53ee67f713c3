"""The dual-batch-overlap scheduler (DESIGN 7, issue 10) on the CPU over gloo.

Order: the pure split rule (hand cases) -> micro-batch rows -> multi-rank through the worker
pool (2-4 ranks, hard timeouts): DBO output equals the unsplit scheduler's and the unsharded
fp64 reference on a randomized token matrix (zeros included, both strategies, shared expert,
chunking), EPLB on and off; the recorder shows exactly the DESIGN 7 issue order with
micro-batch ids and a yield mark per yield; EPLB hooks at the DESIGN 7 points; the split
rule's hand cases across ranks, without hangs.
"""

from __future__ import annotations

import random

import pytest

from schedulers import DBOConfig, decide_split
from schedulers.dbo_rule import micro_batch_counts
from tests import dbo_tasks, eplb_tasks

FP32 = 1e-5
# DBO and the unsplit layer run the same per-row math in other batch sizes: BLAS may round
# differently, never by more than a few fp32 ulps of the output norm
SAME = 1e-6


def _decide(counts, slots=4, **kw):
    return decide_split(tuple(counts), config=DBOConfig(**kw), top_k=2, slots_per_rank=slots,
                        capturing=False)


# ------------------------------------------------------------------ the rule
def test_split_rule_hand_cases():
    assert not _decide([1, 100, 0]).split  # a rank with one row: unsplit everywhere
    assert "exactly one row" in _decide([1, 100, 0]).rule
    assert _decide([0, 100, 2]).split  # zero and >= 2 rows: split
    assert not _decide([31, 5]).split and "threshold 32" in _decide([31, 5]).rule
    assert _decide([32, 5]).split
    assert not _decide([300, 5]).split and "threshold 512" in _decide([300, 5]).rule
    assert _decide([512, 0]).split
    # the weight re-read guard: on one rank only splits that cost little (>= 1024 rows per
    # local expert per micro-batch: ceil(T/2) * K / S)
    assert not _decide([600], slots=16).split  # 300 * 2 / 16 = 37.5 rows
    assert "re-read guard: 37.5 rows per local expert per micro-batch < 1024" in \
        _decide([600], slots=16).rule
    assert not _decide([4000], slots=4).split  # 2000 * 2 / 4 = 1000 rows
    assert _decide([4096], slots=4).split  # 1024 rows
    assert _decide([64, 0], slots=16).split  # several ranks: the DESIGN threshold alone
    assert not _decide([64, 64], min_rows_per_expert_multi_rank=40.0).split
    assert not decide_split((600, 600), config=DBOConfig(), top_k=2, slots_per_rank=4,
                            capturing=True).split


def test_capture_runs_unsplit_and_says_so_once(monkeypatch, caplog):
    """Under CUDA-graph capture the rule never splits; where it would split eagerly, the
    scheduler warns once (a captured DBO forward is not silently unsplit)."""
    import logging
    from types import SimpleNamespace

    import torch

    from schedulers import DualBatchOverlapScheduler

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    layer = SimpleNamespace(device=torch.device("cuda"), layer_idx=3,
                            config=SimpleNamespace(top_k=2),
                            partition=SimpleNamespace(num_slots=8, ep_size=2))
    sched = DualBatchOverlapScheduler()
    with caplog.at_level(logging.WARNING, logger="moerun"):
        small = sched.decide(layer, (8, 8))  # below the threshold: no warning
        assert not small.split and caplog.records == []
        first = sched.decide(layer, (600, 600))
        second = sched.decide(layer, (600, 600))
    assert not first.split and "capture" in first.rule and not second.split
    assert len(caplog.records) == 1
    assert "layer 3" in caplog.text and "[600, 600]" in caplog.text


def test_micro_batch_counts_take_the_ceiling_first():
    assert micro_batch_counts((0, 100, 2, 7)) == ((0, 50, 1, 4), (0, 50, 1, 3))


def test_config_is_validated():
    with pytest.raises(ValueError, match=r"DBOConfig.small_threshold=1 must be an int >= 2"):
        DBOConfig(small_threshold=1)
    with pytest.raises(ValueError, match=r"min_rows_per_expert_one_rank=-1 must be a number"):
        DBOConfig(min_rows_per_expert_one_rank=-1)


# ------------------------------------------------------------------ multi-rank equality
def _matrix(n: int = 14, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        ranks = rng.choice([2, 3, 4])
        counts = [rng.choice([0, rng.randint(2, 14), rng.randint(2, 30)]) for _ in range(ranks)]
        if rng.random() < 0.25:
            counts = [0] * ranks
        cases.append(dict(ranks=ranks, counts=tuple(counts),
                          comm=("allgather", "alltoall")[i % 2],
                          max_num_tokens=rng.choice([None, 2 * ranks, 16]),
                          shared=rng.choice([0, 8]), seed=i))
    return cases


MATRIX = _matrix()


@pytest.mark.parametrize("case", MATRIX, ids=lambda c: (
    f"r{c['ranks']}-{c['comm']}-t{'_'.join(map(str, c['counts']))}-m{c['max_num_tokens']}"
    f"-s{c['shared']}"))
def test_dbo_equals_unsplit_and_reference(pools, case):
    results = pools(case["ranks"]).run(dbo_tasks.dbo_vs_unsplit_task, counts=case["counts"],
                                       comm=case["comm"], max_num_tokens=case["max_num_tokens"],
                                       shared=case["shared"], seed=case["seed"])
    for res, rows in zip(results, case["counts"]):
        assert res["rows"] == rows
        assert all(e < FP32 for e in res["errs"]), res
        assert all(d < SAME for d in res["diffs"]), res
        assert res["scheduler"] == "DualBatchOverlapScheduler"
    splits = decide_split(case["counts"], config=DBOConfig(small_threshold=2,
                          min_rows_per_expert_one_rank=0.0), top_k=2, slots_per_rank=1,
                          capturing=False).split
    assert all(res["ubs"] == ([0, 1] if splits else []) for res in results)


@pytest.mark.parametrize("order", ["sequential", "aux_stream", "during_combine", "fused"])
def test_every_shared_expert_order_under_dbo(pools, order):
    results = pools(2).run(dbo_tasks.dbo_vs_unsplit_task, counts=(9, 4), comm="allgather",
                           shared=8, shared_order=order, max_num_tokens=8)
    for res in results:
        assert res["ubs"] == [0, 1]
        assert all(e < FP32 for e in res["errs"]) and all(d < SAME for d in res["diffs"])


@pytest.mark.parametrize("comm,counts", [("allgather", (6, 3, 4)), ("alltoall", (5, 2, 8))])
def test_eplb_under_dbo_keeps_outputs_equal(pools, comm, counts):
    results = pools(3).run(eplb_tasks.eplb_task, counts=counts, comm=comm, steps=7,
                           scheduler="dbo", dbo_threshold=2)
    for res in results:
        assert all(e < FP32 for e in res["errs_ref"]) and all(e < FP32 for e in res["errs_off"])
        assert res["migrations"], "the balancer must have migrated under DBO"


# ------------------------------------------------------------------ the issue order
DESIGN_ORDER = [("dispatch", 0), ("dispatch", 1), ("dispatch.wait", 0), ("experts", 0),
                ("combine", 0), ("dispatch.wait", 1), ("experts", 1), ("combine.wait", 0),
                ("combine.wait", 1)]


@pytest.mark.parametrize("comm", ["allgather", "alltoall"])
def test_recorder_shows_exactly_the_design_7_issue_order(pools, comm):
    for res in pools(2).run(dbo_tasks.dbo_order_task, counts=(6, 4), comm=comm):
        assert res["err"] < FP32
        ranges = [(p, u) for p, u, _, kind in res["events"] if kind == "range"]
        comm_phases = [(p, u) for p, u in ranges if (p, u) in DESIGN_ORDER
                       or p in ("combine",)]
        assert comm_phases == [("dispatch", 0), ("dispatch", 1), ("dispatch.wait", 0),
                               ("experts", 0), ("combine", 0), ("dispatch.wait", 1),
                               ("experts", 1), ("combine", 1), ("combine.wait", 0),
                               ("combine.wait", 1)]
        positions = [ranges.index(e) for e in DESIGN_ORDER]
        assert positions == sorted(positions)
        # each micro-batch is one ub range; a yield mark after each dispatch and combine
        assert [(p, u) for p, u in ranges if p == "ub"] == [("ub", 0), ("ub", 1)]
        marks = [u for p, u, _, kind in res["events"] if kind == "mark"]
        assert marks == [0, 1, 0, 1]
        # EPLB (DESIGN 7): the wait hooks before ub0 routes, start_set after ub1's experts,
        # done_set after both combines; statistics and routing per micro-batch
        assert res["hooks"] == ["start_wait_gpu:ub0", "done_wait_gpu:ub0",
                                "update_statistic:ub0", "route:ub0", "update_statistic:ub1",
                                "route:ub1", "start_set_cpu:ub1", "done_set_cpu:ub1"]


def test_during_combine_yields_once_more_per_micro_batch(pools):
    for res in pools(2).run(dbo_tasks.dbo_order_task, counts=(6, 4), comm="allgather",
                            shared=8, shared_order="during_combine"):
        marks = [u for p, u, _, kind in res["events"] if kind == "mark"]
        assert marks == [0, 1, 0, 1, 0, 1]
        ranges = [(p, u) for p, u, _, kind in res["events"] if kind == "range"]
        assert ranges.index(("shared", 0)) < ranges.index(("combine.wait", 0))
        assert ranges.index(("combine", 1)) < ranges.index(("shared", 0))


def test_context_ranges_nest_in_their_micro_batch(pools):
    """DESIGN 10's nesting under DBO: each micro-batch's logits ``pad`` and [AUX_STREAM]
    ``shared`` ranges come after its own ``ub`` range opens (they used to be issued while the
    contexts were built, before either ub range; ub1's shared even before ub0's)."""
    for rank, res in enumerate(pools(2).run(dbo_tasks.dbo_order_task, counts=(6, 3),
                                            comm="allgather", shared=8,
                                            shared_order="aux_stream", use_dp_padding=True)):
        assert res["err"] < FP32
        ranges = [(p, u) for p, u, _, kind in res["events"] if kind == "range"]
        for u in (0, 1):
            assert ranges.index(("ub", u)) < ranges.index(("shared", u)), ranges
        assert ranges.index(("shared", 1)) > ranges.index(("dispatch", 0))  # ub1 starts later
        pads = [ranges.index(("pad", u)) for u in (0, 1) if ("pad", u) in ranges]
        if rank == 1:  # 3 rows padded to the largest rank's 6: both halves pad
            assert len(pads) == 2
        for u, at in zip((0, 1), pads):
            assert ranges.index(("ub", u)) < at


# ------------------------------------------------------------------ the rule across ranks
@pytest.mark.parametrize("counts,split", [((1, 100, 0), False), ((0, 100, 2), True)])
def test_split_rule_across_ranks_without_hangs(pools, counts, split):
    results = pools(3).run(dbo_tasks.dbo_vs_unsplit_task, counts=counts, comm="allgather",
                           threshold=32, forwards=1)
    for res, rows in zip(results, counts):
        assert res["rows"] == rows and all(e < FP32 for e in res["errs"])
        assert res["ubs"] == ([0, 1] if split else [])  # rank 0 runs two empty micro-batches


@pytest.mark.parametrize("guard,split", [(14.0, True), (14.5, False)])
def test_weight_guard_is_rank_identical_where_slots_do_not_divide(pools, guard, split):
    """9 experts over 2 ranks hold 5 and 4 slots. The guard reads num_slots / ep_size = 4.5
    on both (32 rows x top-2 / 4.5 = 14.2 rows per expert), not each rank's own count (12.8
    and 16: rank 1 alone would split, and the ranks' collectives would not match)."""
    results = pools(2).run(dbo_tasks.dbo_vs_unsplit_task, counts=(64, 64), comm="alltoall",
                           E=9, threshold=32, guard=guard, forwards=1)
    for res in results:
        assert res["rows"] == 64 and all(e < FP32 for e in res["errs"]), res
        assert res["ubs"] == ([0, 1] if split else [])

