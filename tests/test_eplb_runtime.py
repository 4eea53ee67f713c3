"""EPLB in the runtime (multi-rank, gloo): rebalances happen, placement changes, and outputs
equal the EPLB-off layer and the unsharded reference (DESIGN 8)."""

from __future__ import annotations

import pytest

from tests import eplb_tasks
from tests.mp_pool import TaskFailure

FP32 = 1e-5


def _check(results, *, min_migrations=2):
    for res in results:
        assert max(res["errs_ref"]) < FP32, res["errs_ref"]
        assert max(res["errs_off"]) < FP32, res["errs_off"]
        assert len(res["migrations"]) >= min_migrations, res["migrations"]
        # the global view after the last rebalance is balanced (forced hot experts included)
        assert all(g is not None and g < 1.5 for g in res["metrics"]["global_max_over_mean"])
        # the placement changed at least once, and every rank agrees on it
        assert any(p != res["placements"][0] for p in res["placements"][1:])
    assert all(r["placements"] == results[0]["placements"] for r in results)


@pytest.mark.parametrize("ranks,counts,max_num_tokens,shared,comm", [
    (2, (6, 9), None, 0, "allgather"),
    (2, (6, 9), 4, 0, "alltoall"),          # chunked
    (3, (0, 7, 5), None, 16, "allgather"),  # a zero-token rank, shared expert
    (3, (4, 0, 11), 5, 16, "alltoall"),     # chunked + zero-token rank + shared expert
])
def test_rebalances_keep_outputs_equal(pools, ranks, counts, max_num_tokens, shared, comm):
    results = pools(ranks).run(eplb_tasks.eplb_task, counts=counts, steps=9,
                               max_num_tokens=max_num_tokens, shared=shared, comm=comm)
    _check(results)


def test_rebalances_with_repeats(pools):
    results = pools(2).run(eplb_tasks.eplb_task, counts=(5, 3), steps=6, repeat_count=3)
    _check(results)


def test_step_mismatch_raises_on_every_rank(pools):
    results = pools(2).run(eplb_tasks.eplb_task, counts=(4, 4), steps=6, extra_step_rank=1,
                           allow_errors=True)
    assert all(isinstance(r, TaskFailure) and r.exc_type == "EPLBStepMismatch"
               for r in results), results
    assert len({r.message for r in results}) == 1
    assert "ranks [1] disagree with rank 0" in results[0].message
