"""The shared-expert orders (DESIGN 4.3, issue 9) on the CPU: every order gives the
``SEQUENTIAL`` result, single-rank and over gloo (2 and 3 ranks, zero-token ranks and DP
padding included), the recorder shows where each order puts the shared MLP, and ``resolve``
picks the schedule from the measured table or the documented default.

References are independent: the fp64 ``ReferenceExperts`` path of ``moerun.testing``
(routing by the torch twin, the shared MLP by its own fp64 formula). The stream orders run in
issue order on a CPU, so they must equal ``SEQUENTIAL`` exactly; ``FUSED`` computes the
shared MLP inside the routed backend (another summation order): fp32 bound.
"""

from __future__ import annotations

import json

import pytest
import torch

from moerun import ConfigurableMoE, MoEConfig, SharedExpertOrder
from moerun.capability import Deployment, Problem
from moerun.config import Activation
from moerun.env import get_env
from moerun.resolve import resolve
from moerun.shared_expert import SharedRegime, SharedSchedule
from moerun.shared_table import regimes_from_cells, row_key
from tests import mr_tasks
from tests.moe_cases import make_case, reference_output, rel_err
from traces import ScheduleRecorder

FP32 = 1e-5
ORDERS = [o.value for o in SharedExpertOrder]


def _cfg(**kw) -> MoEConfig:
    base = dict(num_experts=8, top_k=2, hidden_size=32, intermediate_size=16,
                shared_intermediate_size=16)
    base.update(kw)
    return MoEConfig(**base)


def _run(cfg, case, order, *, recorder=None, backend="reference", tokens=None):
    with ConfigurableMoE(cfg, device="cpu", layer_idx=0, backend=backend,
                         shared_expert_order=order, recorder=recorder) as layer:
        layer.load_weights(case.w13, case.w2, case.shared)
        x, logits = case.x, case.logits
        if tokens is not None:
            x, logits = x[:tokens], logits[:tokens]
        return layer(x, logits), layer.report


@pytest.mark.parametrize("shared,gate", [(16, False), (32, False), (32, True)])
@pytest.mark.parametrize("max_num_tokens", [None, 5])
def test_every_order_gives_the_sequential_result(shared, gate, max_num_tokens):
    # shared = I (one fused slot) and 2*I (two slots); a Qwen2-MoE-style sigmoid gate
    cfg = _cfg(shared_intermediate_size=shared, shared_expert_gate=gate,
               max_num_tokens=max_num_tokens)
    case = make_case(cfg, 13, seed=shared + gate)
    ref = reference_output(cfg, case)
    seq, _ = _run(cfg, case, "sequential")
    assert rel_err(seq, ref) < FP32
    for order in ORDERS:
        out, report = _run(cfg, case, order)
        assert report.shared_schedule.pick(13).order.value == order
        if order == "fused":
            assert rel_err(out, ref) < FP32 and rel_err(out, seq.double()) < FP32
        else:  # the same ops in the same order on a CPU: bit for bit
            assert torch.equal(out, seq), order


def test_zero_tokens_every_order():
    cfg = _cfg()
    case = make_case(cfg, 4, seed=2)
    for order in ORDERS:
        out, _ = _run(cfg, case, order, tokens=0)
        assert out.shape == (0, 32)


def test_the_recorder_shows_where_each_order_puts_the_shared_mlp():
    cfg = _cfg(max_num_tokens=4)  # 2 chunks for 7 tokens
    case = make_case(cfg, 7, seed=3)
    phases = {}
    for order in ORDERS:
        rec = ScheduleRecorder()
        _run(cfg, case, order, recorder=rec, tokens=7)
        phases[order] = rec.phases()
    chunk = ["route", "dispatch", "dispatch.wait", "experts", "combine", "combine.wait"]
    assert phases["sequential"] == ["chunk"] + chunk + ["chunk"] + chunk + ["shared"]
    assert phases["aux_stream"] == ["shared", "chunk"] + chunk + ["chunk"] + chunk
    last = chunk[:-1] + ["shared", "combine.wait"]  # issued while the combine is in flight
    assert phases["during_combine"] == ["chunk"] + chunk + ["chunk"] + last
    assert phases["fused"] == ["chunk"] + chunk + ["chunk"] + chunk  # inside "experts"


# ------------------------------------------------------------------ multi-rank (gloo)
@pytest.mark.parametrize("ranks,counts,max_num_tokens", [
    (2, (5, 9), None), (2, (0, 7), None), (3, (4, 0, 11), 6), (3, (3, 3, 3), None)])
@pytest.mark.parametrize("comm", ["allgather", "alltoall"])
@pytest.mark.parametrize("order", ORDERS)
def test_every_order_matches_the_unsharded_reference_over_gloo(pools, ranks, counts,
                                                               max_num_tokens, comm, order):
    if order == "fused" and comm == "alltoall":
        pytest.skip("FUSED needs a strategy that keeps own rows identifiable (asserted below)")
    results = pools(ranks).run(mr_tasks.moe_task, counts=counts, comm=comm,
                               max_num_tokens=max_num_tokens, E=6, k=2, H=16, I=8, shared=16,
                               shared_order=order, backend="reference", seed=len(counts))
    assert [r["rows"] for r in results] == list(counts)
    assert all(r["err"] < FP32 for r in results), [r["err"] for r in results]


def test_fused_is_refused_for_all_to_all_with_the_reason(pools):
    results = pools(2).run(mr_tasks.moe_task, counts=(2, 3), comm="alltoall", shared=16, I=8,
                           shared_order="fused", backend="reference", allow_errors=True)
    for r in results:
        assert "shared_expert_order='fused' cannot run here: topology: AllToAll does not keep "\
               "this rank's rows identifiable" in r.message


# ------------------------------------------------------------------ resolve
def _problem(**kw) -> Problem:
    base = dict(num_experts=8, num_slots=8, top_k=2, hidden_size=32, intermediate_size=16,
                dtype=torch.bfloat16, activation=Activation.SILU_GLU, device_type="cuda",
                shared_intermediate_size=16)
    base.update(kw)
    return Problem(**base)


def _dep(world_size: int = 1) -> Deployment:
    return Deployment(rank=0, world_size=world_size, comm_backend="none" if world_size == 1
                      else "nccl", num_local_slots=8 // world_size, divisible=True)


def test_default_schedule_without_a_table_row():
    cpu = _problem(device_type="cpu", dtype=torch.float32)
    one = resolve(cpu, _dep(1), get_env(), backend="reference")
    assert one.shared_schedule == SharedSchedule.single(SharedExpertOrder.SEQUENTIAL,
                                                        one.shared_schedule.why)
    assert "no shared-table row" in one.shared_schedule.why
    assert any("shared expert:" in n for n in one.notes)
    rejected = {r.name: r.reason.value for r in one.rejected if r.kind == "shared"}
    assert rejected == {"aux_stream": "lower_priority", "during_combine": "lower_priority",
                        "fused": "lower_priority"}
    assert str(one).count("shared expert order: sequential") == 0  # described per regime
    assert "shared expert order: any T: sequential" in str(one)


def test_regimes_from_measured_cells():
    cells = [{"tokens": 1024, "order": "sequential"}, {"tokens": 16, "order": "fused"},
             {"tokens": 128, "order": "fused"},
             {"tokens": 4096, "order": "aux_stream", "partition_sms": 32}]
    regimes = regimes_from_cells(cells)
    assert regimes == (SharedRegime(max_tokens=128, order=SharedExpertOrder.FUSED),
                       SharedRegime(max_tokens=1024, order=SharedExpertOrder.SEQUENTIAL),
                       SharedRegime(max_tokens=None, order=SharedExpertOrder.AUX_STREAM,
                                    partition_sms=32))
    sched = SharedSchedule(regimes=regimes, why="test")
    assert [sched.pick(t).order.value for t in (1, 128, 129, 1024, 5000)] == \
        ["fused", "fused", "sequential", "sequential", "aux_stream"]
    with pytest.raises(ValueError, match="must end with an open regime"):
        SharedSchedule(regimes=regimes[:1], why="x")


def test_eager_picks_apply_outside_graph_capture():
    """A cell picks by graph time (``order``) and by eager time (``eager_order``); a forward
    being captured runs the first, an eager forward the second; a cell without an eager
    pick uses its ``order`` for both."""
    cells = [{"tokens": 1, "order": "aux_stream", "eager_order": "sequential"},
             {"tokens": 16, "order": "sequential", "eager_order": "sequential"},
             {"tokens": 4096, "order": "during_combine"}]
    graph, eager = regimes_from_cells(cells), regimes_from_cells(cells, eager=True)
    sched = SharedSchedule(regimes=graph, why="test", eager_regimes=eager)
    assert [sched.pick(t, capturing=True).order.value for t in (1, 2, 5000)] == \
        ["aux_stream", "sequential", "during_combine"]
    assert [sched.pick(t, capturing=False).order.value for t in (1, 2, 5000)] == \
        ["sequential", "sequential", "during_combine"]
    assert sched.orders == (SharedExpertOrder.AUX_STREAM, SharedExpertOrder.SEQUENTIAL,
                            SharedExpertOrder.DURING_COMBINE)
    assert "(eager: T <= 16: sequential; any T: during_combine)" in sched.describe()
    plain = SharedSchedule(regimes=graph, why="test")
    assert plain.pick(1, capturing=False).order is SharedExpertOrder.AUX_STREAM


def test_resolve_reads_a_table_row(tmp_path, monkeypatch):
    import moerun.shared_table as table

    env = get_env()
    key = row_key(device=env.device_name, world_size=1, num_experts=8, top_k=2, hidden=32,
                  intermediate=16, shared=16, dtype="bfloat16")
    path = tmp_path / "shared_table.json"
    path.write_text(json.dumps({"meta": {"command": "moerun bench --shared", "date": "d",
                                         "device": "dev"},
                                "rows": {key: {"cells": [{"tokens": 16, "order": "fused",
                                                          "eager_order": "sequential"},
                                                         {"tokens": 4096,
                                                          "order": "during_combine"}]}}}))
    monkeypatch.setattr(table, "SHARED_TABLE_PATH", path)
    monkeypatch.setattr(table.lookup, "__defaults__", (path,))
    row = table.lookup(_problem(), _dep(1), env)
    assert row is not None and row.regimes[0].order is SharedExpertOrder.FUSED
    assert [r.order.value for r in row.eager_regimes] == ["sequential", "during_combine"]
    assert "moerun bench --shared" in row.detail
    assert table.lookup(_problem(device_type="cpu"), _dep(1), env) is None  # GPU rows only
