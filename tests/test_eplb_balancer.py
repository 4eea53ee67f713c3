"""LoadBalancer pieces on one process: config validation, device statistics, replica
routing, due steps, windows, metrics, load files, static placement, migration plans."""

from __future__ import annotations

import gc
import json
import weakref

import pytest
import torch

from eplb import EPLBConfig, LoadBalancer, placement_from_phy2log
from eplb.migration import plan_migration
from moerun import ConfigurableMoE, MoEConfig
from moerun.testing import make_case, reference_output, rel_err


def _bal(**kw):
    base = dict(num_layers=2, num_experts=4, num_slots=6, num_ranks=2, window_size=3,
                rebalance_interval=2)
    base.update(kw)
    return LoadBalancer(EPLBConfig(**base))


@pytest.mark.parametrize("kw,match", [
    (dict(num_slots=5), r"num_slots=5 must be divisible by num_ranks=2"),
    (dict(num_slots=3), r"num_slots=3 must be >= num_experts=4"),
    (dict(num_groups=3), r"num_groups=3 must divide num_experts=4"),
    (dict(num_nodes=3), r"num_nodes=3 must divide num_ranks=2"),
    (dict(window_size=0), r"window_size=0 must be a positive int"),
    (dict(num_layers=5, layers_per_step=1, rebalance_interval=2),
     r"some layer would never rebalance"),
])
def test_config_validation(kw, match):
    base = dict(num_layers=2, num_experts=4, num_slots=6, num_ranks=2)
    base.update(kw)
    with pytest.raises(ValueError, match=match):
        EPLBConfig(**base)


def test_due_steps_at_most_layers_per_step():
    cfg = EPLBConfig(num_layers=4, num_experts=4, num_slots=4, num_ranks=1,
                     rebalance_interval=3, layers_per_step=2)
    for step in range(30):
        due = [layer for layer in range(4) if cfg.is_due(layer, step)]
        assert len(due) <= 2
    # every layer rebalances once per interval once started
    assert [s for s in range(12) if cfg.is_due(0, s)] == [2, 5, 8, 11]
    assert [s for s in range(12) if cfg.is_due(3, s)] == [3, 6, 9]


def test_statistics_exclude_padding_and_window_slides():
    bal = _bal()
    h = bal.layer(0)
    h.done_wait_gpu(None)
    h.update_statistic(None, torch.tensor([[0, 1], [1, -1], [-1, -1]], dtype=torch.int32))
    h.update_statistic(None, torch.tensor([[3, 1]], dtype=torch.int32))
    assert bal.current[0].tolist() == [1, 3, 0, 1]
    assert bal.current[1].tolist() == [0, 0, 0, 0]
    for _ in range(3):
        bal.step()
    assert bal.window_load()[0].tolist() == [1, 3, 0, 1]
    bal.step()  # the window (3 steps) forgets the first step
    assert bal.window_load()[0].tolist() == [0, 0, 0, 0]


def test_replica_routing_formula():
    bal = _bal()
    # layer 0: slots 0..5 hold experts 0,1,2,3,0,0 -> expert 0 has 3 replicas (slots 0,4,5)
    new = placement_from_phy2log(torch.tensor([[0, 1, 2, 3, 0, 0], [0, 1, 2, 3, 1, 2]]), 4,
                                 bal.max_replicas)
    bal.phy2log.copy_(new.phy2log)
    bal.log2phy.copy_(new.log2phy)
    bal.logcnt.copy_(new.logcnt)
    h = bal.layer(0)
    ids = torch.tensor([[0, 1], [0, -1], [0, 2], [3, 0]], dtype=torch.int32)
    slots = h.route(None, ids, row_offset=7)
    # row r uses replica (7 + r) % count: expert 0 -> [0,4,5][(7+r)%3]
    assert slots.tolist() == [[4, 1], [5, -1], [0, 2], [3, 4]]
    assert slots.dtype == torch.int32


def test_metrics_and_dump_stats(tmp_path):
    bal = _bal()
    h = bal.layer(1)
    h.update_statistic(None, torch.tensor([[0, 0], [0, 1]], dtype=torch.int32))
    bal.step()
    m = bal.metrics()
    # layer 1 default slots: experts 0,1,2 | 3,0,1 ; counts e0=3, e1=1; replicas e0=2, e1=2
    # rank0 load = 1.5 + 0.5 + 0 = 2, rank1 = 0 + 1.5 + 0.5 = 2 -> 1.0
    assert m["max_over_mean"][1] == pytest.approx(1.0)
    assert m["max_over_mean"][0] == 1.0  # empty window
    assert m["global_max_over_mean"] == [None, None]  # no rebalance yet
    bal.dump_stats(tmp_path / "w.json")
    data = json.loads((tmp_path / "w.json").read_text())
    assert len(data) == 3 and data[-1][1] == [3, 1, 0, 0]  # [W, L, E], newest last
    bal.dump_stats(tmp_path / "w.pt")
    assert torch.load(tmp_path / "w.pt").shape == (3, 2, 4)
    with pytest.raises(ValueError, match="use a .pt or .json suffix"):
        bal.dump_stats(tmp_path / "w.txt")


def test_static_placement_routes_and_never_migrates(tmp_path):
    path = tmp_path / "placement.json"
    phy2log = [[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 3, 3]]
    path.write_text(json.dumps({"phy2log": phy2log}))
    bal = _bal(static_placement=str(path), num_ranks=1)
    assert bal.placement().phy2log.tolist() == phy2log
    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=8, intermediate_size=8)
    case = make_case(cfg, 30, 1)
    with ConfigurableMoE(cfg, balancer=bal.layer(1), layer_idx=1) as layer:
        layer.load_weights(case.w13, case.w2)
        # slots hold experts 3,2,1,0,3,3: the loaded weights follow the placement
        assert torch.equal(layer.w13[0], case.w13[3]) and torch.equal(layer.w13[3], case.w13[0])
        for step in range(3):
            sl = slice(10 * step, 10 * step + 10)
            out = layer(case.x[sl], case.logits[sl])
            glob = type(case)(x=case.x[sl], logits=case.logits[sl], w13=case.w13, w2=case.w2,
                              shared=None, bias=None)
            assert rel_err(out, reference_output(cfg, glob)) < 1e-5
            bal.step()
    assert bal.migrations == [] and bal.placement().phy2log.tolist() == phy2log


def test_single_rank_rebalance_changes_placement_output_unchanged():
    bal = LoadBalancer(EPLBConfig(num_layers=1, num_experts=4, num_slots=6, num_ranks=1,
                                  window_size=2, rebalance_interval=2))
    cfg = MoEConfig(num_experts=4, top_k=1, hidden_size=8, intermediate_size=8,
                    max_num_tokens=5)
    case = make_case(cfg, 60, 2)
    logits = case.logits.clone()
    logits[:, 2] += 5.0  # expert 2 is hot
    before = bal.placement().phy2log.tolist()
    with ConfigurableMoE(cfg, balancer=bal.layer(0), layer_idx=0) as layer:
        layer.load_weights(case.w13, case.w2)
        for step in range(6):
            sl = slice(10 * step, 10 * step + 10)
            out = layer(case.x[sl], logits[sl])
            glob = type(case)(x=case.x[sl], logits=logits[sl], w13=case.w13, w2=case.w2,
                              shared=None, bias=None)
            assert rel_err(out, reference_output(cfg, glob)) < 1e-5
            bal.step()
    after = bal.placement()
    assert after.phy2log.tolist() != before
    assert int(after.logcnt[0, 2]) >= 2  # the hot expert got replicas
    assert len(bal.migrations) == 3 and bal.migrations[0].step == 1
    assert bal.metrics()["global_max_over_mean"][0] < 1.05


def test_plan_migration_prefers_local_copies():
    # 2 ranks x 3 slots; old: [0,1,2 | 3,0,1], new: [0,0,2 | 3,2,1]
    plan = plan_migration([0, 1, 2, 3, 0, 1], [0, 0, 2, 3, 2, 1], slots_per_rank=3)
    # slot 1 <- expert 0: local slot 0; slot 4 <- expert 2: only slot 2 (rank 0) holds it
    assert plan.moves == ((1, 0), (4, 2))
    assert plan_migration([0, 1], [0, 1], 1).moves == ()


def test_bind_checks_topology():
    bal = _bal(num_ranks=2)
    cfg = MoEConfig(num_experts=4, top_k=1, hidden_size=8, intermediate_size=8)
    with pytest.raises(ValueError, match="num_ranks=2 but the layer's group has 1 ranks"):
        ConfigurableMoE(cfg, balancer=bal.layer(0))


def test_a_bound_layer_is_freed_by_reference_counting():
    # The handle holds its layer weakly: a strong reference back (layer.balancer -> handle ->
    # layer) kept the layer, and through its Mapping the caller's process group, alive until
    # some later cyclic garbage collection; a poisoned gloo group then stalled that collection
    # for up to the group's timeout (the fault-matrix hang, docs/DECISIONS.md).
    bal = LoadBalancer(EPLBConfig(num_layers=1, num_experts=4, num_slots=6, num_ranks=1,
                                  window_size=2, rebalance_interval=2))
    cfg = MoEConfig(num_experts=4, top_k=1, hidden_size=8, intermediate_size=8)
    case = make_case(cfg, 10, 2)
    handle = bal.layer(0)
    enabled = gc.isenabled()
    gc.disable()  # only reference counting may free it
    try:
        layer = ConfigurableMoE(cfg, balancer=handle, layer_idx=0)
        layer.load_weights(case.w13, case.w2)
        for step in range(2):  # the second forward rebalances
            layer(case.x[5 * step:5 * step + 5], case.logits[5 * step:5 * step + 5])
            bal.step()
        assert len(bal.migrations) == 1
        layer.close()
        freed = weakref.ref(layer)
        del layer
        assert freed() is None
    finally:
        if enabled:
            gc.enable()
    # the handle outlives its layer: it may be bound again, and a freed layer is not
    # "another ConfigurableMoE"
    with ConfigurableMoE(cfg, balancer=handle, layer_idx=0) as again:
        again.load_weights(case.w13, case.w2)
        again(case.x[:5], case.logits[:5])
