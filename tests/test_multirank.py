"""Multi-rank tests over gloo through the session worker pool (DESIGN 11, issue: multi-rank).

Every sharded result is compared with an unsharded fp64 reference built from the same seeded
global inputs; communication tests use rows that encode their source and are checked exactly.
"""

from __future__ import annotations

import random
import re

import pytest

from tests import mr_tasks
from tests.moe_cases import TOL

import torch

FP32 = TOL[torch.float32]


def _matrix(n: int = 44, seed: int = 2026):
    """A randomized, seeded matrix of layer configurations (>= 40)."""
    rng = random.Random(seed)
    shapes = ["zeros", "ones", "equal", "skewed", "one_busy"]
    cases = []
    for i in range(n):
        ranks = rng.choice([2, 3, 4])
        shape = shapes[i % len(shapes)]
        if shape == "zeros":
            counts = [rng.choice([0, 0, rng.randint(1, 12)]) for _ in range(ranks)]
        elif shape == "ones":
            counts = [rng.choice([0, 1]) for _ in range(ranks)]
        elif shape == "equal":
            counts = [rng.randint(1, 9)] * ranks
        elif shape == "skewed":
            counts = [rng.randint(0, 3) for _ in range(ranks - 1)] + [rng.randint(20, 40)]
            rng.shuffle(counts)
        else:
            counts = [0] * ranks
            counts[rng.randrange(ranks)] = rng.randint(1, 15)
        max_num_tokens = rng.choice([None, ranks, ranks + 1, 8, 3 * ranks, 64])
        cases.append(dict(
            ranks=ranks, counts=tuple(counts), comm=("allgather", "alltoall")[i % 2],
            max_num_tokens=max_num_tokens, shared=rng.choice([0, 16]),
            E=rng.choice([ranks, 7, 8, 10]), k=rng.choice([1, 2, 3]), seed=i,
            pass_counts=rng.random() < 0.8, use_dp_padding=rng.random() < 0.2))
    return cases


MATRIX = _matrix()


def _id(case):
    return (f"r{case['ranks']}-{case['comm']}-t{'_'.join(map(str, case['counts']))}"
            f"-m{case['max_num_tokens']}-E{case['E']}k{case['k']}-s{case['shared']}")


@pytest.mark.parametrize("case", MATRIX, ids=[_id(c) for c in MATRIX])
def test_matrix_matches_unsharded_reference(pools, case):
    case = dict(case)
    ranks = case.pop("ranks")
    if case["k"] > case["E"]:
        case["k"] = case["E"]
    results = pools(ranks).run(mr_tasks.moe_task, **case)
    for rank, res in enumerate(results):
        assert res["rows"] == case["counts"][rank]
        assert res["err"] < FP32, (rank, res)


def test_matrix_covers_the_issue_axes():
    assert len(MATRIX) >= 40
    assert {c["ranks"] for c in MATRIX} == {2, 3, 4}
    assert {c["comm"] for c in MATRIX} == {"allgather", "alltoall"}
    assert any(0 in c["counts"] for c in MATRIX) and any(1 in c["counts"] for c in MATRIX)
    assert any(c["max_num_tokens"] is None for c in MATRIX)
    assert any(c["max_num_tokens"] == c["ranks"] for c in MATRIX)  # forces many chunks
    assert {c["shared"] for c in MATRIX} == {0, 16}


@pytest.mark.parametrize("comm", ["allgather", "alltoall"])
@pytest.mark.parametrize("counts", [(3, 5, 0), (1, 1, 1), (0, 0, 6), (0, 0, 0), (9, 2, 4)])
def test_dispatch_and_combine_exact_by_source(pools, comm, counts):
    problems = pools(3).run(mr_tasks.comm_exact_task, counts=counts, comm=comm)
    assert problems == [[], [], []]


@pytest.mark.parametrize("comm", ["allgather", "alltoall"])
def test_two_dispatches_in_flight(pools, comm):
    assert pools(2).run(mr_tasks.interleaved_chunks_task, comm=comm, counts_a=(3, 5),
                        counts_b=(4, 0)) == [True, True]


@pytest.mark.parametrize("comm", ["allgather", "alltoall"])
def test_every_rank_but_one_empty_and_all_empty(pools, comm):
    for counts in [(0, 0, 0, 11), (0, 0, 0, 0)]:
        results = pools(4).run(mr_tasks.moe_task, counts=counts, comm=comm, max_num_tokens=4,
                               shared=16)
        assert [r["rows"] for r in results] == list(counts)
        assert all(r["err"] < FP32 for r in results)


def _expected_chunk(c, first, last):
    phases = (["eplb.start_wait_gpu"] if first else []) + ["route"] + \
        (["eplb.done_wait_gpu"] if first else []) + \
        ["eplb.update_statistic", "eplb.route", "dispatch", "dispatch.wait", "experts"] + \
        (["eplb.start_set_cpu"] if last else []) + ["combine", "combine.wait"] + \
        (["eplb.done_set_cpu"] if last else [])
    return [("chunk", c)] + [(p, c) for p in phases]


@pytest.mark.parametrize("comm", ["allgather", "alltoall"])
@pytest.mark.parametrize("counts,max_num_tokens,chunks", [((0, 0), None, 1), ((5, 0), 4, 3),
                                                          ((2, 7), 6, 3), ((4, 4), None, 1)])
def test_recorder_order_and_hook_points(pools, comm, counts, max_num_tokens, chunks):
    results = pools(2).run(mr_tasks.recorder_task, counts=counts, comm=comm,
                           max_num_tokens=max_num_tokens)
    for rank, res in enumerate(results):
        events = res["events"]
        assert all(name.startswith("moerun/L5/") for name, *_ in events)
        assert all(r == rank for *_, r in events)
        streams = {phase: stream for _, phase, _, stream, _ in events}
        assert streams["dispatch"] == "comm" and streams["experts"] == "main"
        seq = [(phase, chunk) for _, phase, chunk, _, _ in events
               if phase not in ("pad", "shared")]
        expected = []
        for c in range(chunks):
            expected += _expected_chunk(c, c == 0, c == chunks - 1)
        assert seq == expected
        assert sum(h.startswith("route:") for h in res["hooks"]) == chunks


def test_hook_gating_with_repeats(pools):
    results = pools(2).run(mr_tasks.recorder_task, counts=(3, 6), comm="allgather",
                           max_num_tokens=4, repeat_count=3, forwards=3)
    for res in results:
        hooks = [h.split(":")[0] for h in res["hooks"]]
        chunks = 3  # 2 * 6 rows / 4
        per_chunk = ["update_statistic", "route"]
        first = ["start_wait_gpu", "done_wait_gpu"]
        expected = []
        for rep in range(3):
            for c in range(chunks):
                if rep == 0 and c == 0:
                    expected += [first[0], first[1]]
                expected += per_chunk
                if rep == 2 and c == chunks - 1:
                    expected += ["start_set_cpu", "done_set_cpu"]
        assert hooks == expected


def test_fallback_replaces_infeasible_strategy_on_every_rank(pools):
    results = pools(3).run(mr_tasks.fallback_task, counts=(2, 9, 0))
    for res in results:
        assert all(e < FP32 for e in res["errs"]), res
        assert res["strategies"] == ["SmallOnlyAllToAll", "AllGatherReduceScatter",
                                     "AllGatherReduceScatter"]
        assert len(res["fallbacks"]) == 1
        assert "SmallOnlyAllToAll infeasible" in res["fallbacks"][0]


@pytest.mark.parametrize("kind,message", [
    ("nan", r"invalid input on rank 1: router_logits contains non-finite values"),
    ("rows", r"invalid input on rank 1: all_rank_num_tokens\[rank\] must equal x.shape\[0\]"),
])
def test_bad_input_on_one_rank_raises_same_error_everywhere(pools, kind, message):
    results = pools(3).run(mr_tasks.bad_input_task, bad_rank=1, kind=kind, allow_errors=True)
    assert all(isinstance(r, mr_tasks_failure()) for r in results), results
    assert len({r.message for r in results}) == 1
    assert all(r.exc_type == "ValueError" for r in results)
    assert re.search(message, results[0].message)


def mr_tasks_failure():
    from tests.mp_pool import TaskFailure

    return TaskFailure


@pytest.mark.parametrize("mode", ["silent", "exit"])
def test_lost_peer_gives_comm_timeout_within_budget(pools, mode):
    budget = 2.0
    results = pools(3).run(mr_tasks.fault_task, faulty_rank=2, mode=mode, budget_s=budget,
                           store=True, allow_errors=True, respawn_after=True, timeout=60)
    for rank in (0, 1):
        res = results[rank]
        assert isinstance(res, dict), res
        assert res["error"] == "CommTimeoutError"
        assert res["layer"] == 7 and res["rank"] == rank and res["step"] == 1
        assert res["phase"] == "validate"  # the first collective of the forward
        assert res["elapsed"] < budget + 3.0
        assert res["refused"] is True  # a poisoned layer refuses forward
        assert res["close_s"] < 0.5  # close issues no collective when poisoned
        if mode == "silent":
            assert res["missing"] == [2]
        else:
            assert res["missing"] in ([2], None)


def test_lifecycle_200_cycles_no_thread_or_fd_growth(pools):
    results = pools(2).run(mr_tasks.lifecycle_task, cycles=200, timeout=120)
    for snap in results:
        threads10, fds10 = snap[10]
        threads200, fds200 = snap[200]
        assert threads200 <= threads10 + 2 and fds200 <= fds10 + 2, snap
