"""No hang, no silent wrong answer (issue 14): a fault matrix and rank-inconsistent input/state.

Fault matrix (CPU, gloo, 3 ranks, the session worker pool with hard timeouts): a peer that
exits and a peer that goes silent, right before it issues the first collective of each phase
(validation, count gather, dispatch, combine, and with EPLB the step check, the window
all-reduce and the migration), for both strategies, EPLB on and off. Every surviving rank must
raise ``CommTimeoutError`` naming the phase and the missing rank within budget + 2 s, its
poisoned layer must refuse ``forward`` and close at once, and the next layer on a new group
must give the reference result. Budgets are short (1 s) so the matrix stays fast.

Rank inconsistency: for each input and state that decides whether a rank enters the
collectives, every rank raises the same error naming the offending rank, and none times out.
"""

from __future__ import annotations

import re

import pytest
import torch

from tests import fault_tasks, mr_tasks
from tests.moe_cases import TOL
from tests.mp_pool import TaskFailure

FP32 = TOL[torch.float32]
BUDGET_S = 1.0
#: The acceptance bar: a lost peer becomes CommTimeoutError within budget + 2 s.
SLACK_S = 2.0

_PHASES = ["validate", "counts", "dispatch", "combine"]
_EPLB_PHASES = _PHASES + ["eplb.step_check", "eplb.window", "eplb.migrate"]
MATRIX = [dict(phase=phase, mode=mode, comm=comm, eplb=eplb)
          for eplb, phases in ((False, _PHASES), (True, _EPLB_PHASES))
          for phase in phases for comm in ("allgather", "alltoall")
          for mode in ("silent", "exit")]
for _i, _case in enumerate(MATRIX):
    _case["faulty_rank"] = (2, 0, 1)[_i % 3]  # every rank takes a turn at failing


def _id(case):
    return (f"{case['phase']}-{case['mode']}-{case['comm']}-"
            f"{'eplb' if case['eplb'] else 'noeplb'}-r{case['faulty_rank']}")


def test_matrix_covers_the_issue_axes():
    assert len(MATRIX) == 2 * 2 * (4 + 7)
    assert {c["faulty_rank"] for c in MATRIX} == {0, 1, 2}
    for phase in _EPLB_PHASES:
        for mode in ("silent", "exit"):
            assert any(c["phase"] == phase and c["mode"] == mode for c in MATRIX)


@pytest.mark.parametrize("comm", ["allgather", "alltoall"])
def test_eplb_setup_migrates_and_stays_exact(pools, comm):
    """The EPLB case of the matrix really migrates at its due step (so ``eplb.migrate`` is a
    phase with data on the wire), and the migrated layer still matches the reference."""
    results = pools(3).run(fault_tasks.eplb_moves_task, comm=comm)
    for res in results:
        assert all(e < FP32 for e in res["errs"]), res
        assert res["moved"] and res["moved"][0][0] == fault_tasks.FAULT_STEP
        assert res["moved"][0][1] > 0


@pytest.mark.parametrize("case", MATRIX, ids=[_id(c) for c in MATRIX])
def test_fault_matrix(pools, case):
    pool = pools(3)
    faulty = case["faulty_rank"]
    results = pool.run(fault_tasks.fault_task, budget_s=BUDGET_S, allow_errors=True,
                       respawn_after=case["mode"] == "exit", timeout=60, **case)
    if case["mode"] == "exit":
        assert isinstance(results[faulty], TaskFailure), results[faulty]
        assert results[faulty].exc_type == "ProcessExit"
    else:
        assert results[faulty]["silent"] is True, results[faulty]
        assert results[faulty]["injected"][0][:2] == (case["phase"], fault_tasks.FAULT_STEP)
    for rank, res in enumerate(results):
        if rank == faulty:
            continue
        assert isinstance(res, dict), res
        assert res["error"] == "CommTimeoutError", res
        assert res["phase"] == case["phase"], res
        assert res["missing"] == [faulty], res
        assert (res["layer"], res["step"], res["rank"]) == (fault_tasks.LAYER,
                                                            fault_tasks.FAULT_STEP, rank)
        assert res["elapsed"] < BUDGET_S + SLACK_S, res
        if case["mode"] == "silent":
            assert res["elapsed"] >= BUDGET_S * 0.95, res  # it waited the budget, not less
            # the silent rank wakes only at budget + 1.5 s (then its group closes): an error
            # before that is the survivor's own deadline, not gloo noticing a closed peer
            assert res["elapsed"] < BUDGET_S + 1.0, res
            assert f"not complete within the budget of {BUDGET_S:g}s" in res["message"], res
        assert res["refused"] is not None and re.search(
            rf"layer {fault_tasks.LAYER} is poisoned on rank\(s\) \[{rank}\] \(this rank\)",
            res["refused"]), res
        assert res["refuse_s"] < 0.1 and res["close_s"] < 0.5, res
    # the next layer on a new group works (a respawned pool after an exit)
    nxt = pool.run(mr_tasks.moe_task, counts=(3, 0, 4), comm=case["comm"], timeout=60)
    assert all(r["err"] < FP32 for r in nxt), nxt


# ------------------------------------------------------------------ the pool frees each group

def test_a_group_left_in_a_reference_cycle_is_freed_before_the_next_task(pools):
    # A gloo group is freed with its last reference, and its destructor blocks until its
    # pending collective ends. A poisoned layer's group, left in a reference cycle, used to be
    # freed by some later garbage collection inside another task, which then waited on the
    # peers' groups (alive, connections open) until gloo's timeout: the
    # eplb.migrate-exit-alltoall-eplb-r0 case timed out that way. The pool collects a task's
    # cycles when it ends and frees its group when the next task arrives, on every rank.
    pool = pools(3)
    pool.run(fault_tasks.group_in_a_cycle_task)
    assert pool.run(fault_tasks.group_freed_task) == [[True]] * 3


def test_a_group_kept_after_its_task_is_reported(pools):
    pool = pools(3)
    results = pool.run(fault_tasks.group_kept_task, allow_errors=True)
    pool.run(fault_tasks.drop_kept_groups_task)
    for res in results:
        assert isinstance(res, TaskFailure) and res.exc_type == "GroupLeak", res
        assert re.search(r"group_kept_task left its process group referenced after it "
                         r"returned .*: drop the reference", res.message), res


# ------------------------------------------------------------------ rank inconsistency

BAD = 1
#: kind -> (error class on every rank, a pattern every rank's message matches, whether every
#: rank raises the identical message: agreed through the validation payload).
INCONSISTENT = {
    "counts_list": ("ValueError", r"all_rank_num_tokens passed on rank\(s\) \[1\] differs from "
                                  r"the row counts of x on the ranks, \[4, 4, 4\]", True),
    "use_dp_padding": ("ValueError", r"use_dp_padding differs across ranks \(True on rank\(s\) "
                                     r"\[1\], False on rank\(s\) \[0, 2\]\)", True),
    "not_loaded": ("LayerClosedError", r"layer 3: weights are not loaded on rank\(s\) \[1\]: "
                                       r"call load_weights", True),
    "built_differently": ("ValueError", r"layer 3 was built differently on rank\(s\) \[1\] "
                                        r"than on the others", True),
    "step": ("LayerStepMismatch", r"layer 3's forward counter differs across ranks \(by rank: "
                                  r"\[1, 2, 1\]; rank\(s\) \[1\] differ\)", True),
    # the closed/poisoned rank refuses locally (no collective after close, none on a dead
    # group); its peers read its marker in the store while they wait for it
    "closed": ("LayerClosedError", r"layer 3 is closed on rank\(s\) \[1\]", False),
    "poisoned": ("LayerClosedError", r"layer 3 is poisoned on rank\(s\) \[1\]", False),
}
INCONSISTENCY_BUDGET_S = 5.0
#: Far below the budget: an agreed error, not a timeout.
AGREED_WITHIN_S = 1.0


@pytest.mark.parametrize("kind", list(INCONSISTENT))
def test_rank_inconsistency_raises_the_same_error_everywhere(pools, kind):
    exc_type, pattern, identical = INCONSISTENT[kind]
    results = pools(3).run(fault_tasks.inconsistency_task, kind=kind, bad_rank=BAD,
                           budget_s=INCONSISTENCY_BUDGET_S, timeout=60)
    for rank, res in enumerate(results):
        assert res["error"] == exc_type, (rank, res)
        assert re.search(pattern, res["message"]), (rank, res)
        assert res["elapsed"] < AGREED_WITHIN_S, (rank, res)  # none timed out
        assert res["close_s"] < 0.5, (rank, res)
        if exc_type == "LayerClosedError":
            assert res["ranks"] == [BAD], (rank, res)
        if exc_type == "LayerStepMismatch":
            assert res["ranks"] == [BAD], (rank, res)
        if "retry_err" in res:  # the layers stayed usable: a consistent forward is exact
            assert res["retry_err"] < FP32, (rank, res)
    if identical:
        assert len({r["message"] for r in results}) == 1, results
    if kind in ("closed", "poisoned"):  # the peers are poisoned: they left a pending gather
        for rank in (0, 2):
            assert "this rank's layer is now poisoned too" in results[rank]["message"]


@pytest.mark.parametrize("kind", ["counts_list", "use_dp_padding", "not_loaded", "step",
                                  "closed"])
def test_rank_inconsistency_agreed_under_dbo(pools, kind):
    # the dual-batch-overlap scheduler enters through the same agreed validation
    exc_type, pattern, _ = INCONSISTENT[kind]
    results = pools(3).run(fault_tasks.inconsistency_task, kind=kind, bad_rank=BAD,
                           budget_s=INCONSISTENCY_BUDGET_S, scheduler="dbo", timeout=60)
    for rank, res in enumerate(results):
        assert res["error"] == exc_type and re.search(pattern, res["message"]), (rank, res)
        assert res["elapsed"] < AGREED_WITHIN_S, (rank, res)
        if "retry_err" in res:
            assert res["retry_err"] < FP32, (rank, res)


def test_rank_inconsistency_counts_none_on_one_rank_is_fine(pools):
    # None on one rank and the right list on the others: the gather gives every rank the
    # same counts, so nothing disagrees.
    results = pools(3).run(fault_tasks.inconsistency_task, kind="counts_none", bad_rank=BAD,
                           budget_s=INCONSISTENCY_BUDGET_S, timeout=60)
    for res in results:
        assert res["error"] is None and res["err"] < FP32 and res["retry_err"] < FP32, res


def test_closed_peer_without_a_store_is_a_timeout_naming_no_rank(pools):
    # Where the bar cannot be met: without a store a closed rank has no channel left (it
    # must not issue a collective after close()), so its peers can only time out.
    budget = 1.0
    results = pools(3).run(fault_tasks.inconsistency_task, kind="closed", bad_rank=BAD,
                           budget_s=budget, store=False, timeout=60)
    assert results[BAD]["error"] == "LayerClosedError"
    assert results[BAD]["elapsed"] < 0.1
    for rank in (0, 2):
        res = results[rank]
        assert res["error"] == "CommTimeoutError" and res["phase"] == "validate", res
        assert res["missing"] is None, res
        assert budget * 0.95 <= res["elapsed"] < budget + SLACK_S, res
