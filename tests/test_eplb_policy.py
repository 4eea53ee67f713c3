"""``eplb.rebalance``: the pure placement policy (DESIGN 8), and the simulator's baseline.

Hand-worked layouts first, then invariants over a sweep, validation, and the quality bars
(256 experts, 8 ranks, 288 slots; loads from seeded generators that never see the policy):

- known load, Zipf 0.8 / 1.2 / 1.6 and a 30% hot expert: max/mean rank load <= 1.02;
- hierarchical (2 nodes x 4 ranks, 8 groups kept whole): within 1% of the exhaustive bound;
- drift (plan on A, measure on A x lognormal(0, 0.3), 50 draws): mean <= 1.08 and below
  DeepSeek's EPLB on the same draws;
- migration after a drift: <= 25% of a full reload's bytes.
"""

from __future__ import annotations

import itertools
import time

import pytest
import torch

import eplb
from eplb import rebalance
from eplb.sim import (contiguous_imbalance, deepseek_rebalance, drift_factors,
                      hierarchical_bound, hot_load, imbalance, rank_loads, slots_moved,
                      zipf_load)
from eplb.sim_cli import main

E, R, S = 256, 8, 288
P = S // R
TOKENS = 100_000
ZIPF = (0.8, 1.2, 1.6)
# Bars from the issue.
KNOWN_BAR = 1.02
HIER_GAP = 0.01
DRIFT_BAR = 1.08
MIGRATION_BAR = 0.25


def _bar_loads() -> dict[str, torch.Tensor]:
    loads = {f"zipf{s}": zipf_load(E, s, TOKENS, seed=0) for s in ZIPF}
    loads["hot"] = hot_load(E, TOKENS, seed=0)
    return loads


def _check_maps(p: eplb.Placement, num_experts: int, num_slots: int) -> None:
    """phy2log <-> log2phy <-> logcnt agree; every expert has a replica."""
    L = p.phy2log.shape[0]
    assert p.phy2log.shape == (L, num_slots) and p.phy2log.dtype == torch.int64
    assert p.logcnt.shape == (L, num_experts) and p.logcnt.dtype == torch.int64
    assert p.log2phy.dtype == torch.int64 and p.log2phy.shape[:2] == (L, num_experts)
    assert p.log2phy.shape[2] == int(p.logcnt.max())
    for layer in range(L):
        row = p.phy2log[layer].tolist()
        cnt = torch.bincount(p.phy2log[layer], minlength=num_experts)
        assert torch.equal(cnt, p.logcnt[layer])
        assert int(cnt.min()) >= 1
        for e in range(num_experts):
            slots = [s for s, x in enumerate(row) if x == e]
            got = p.log2phy[layer, e].tolist()
            assert got[:len(slots)] == slots and all(v == -1 for v in got[len(slots):])


def _copies_per_rank(row: list[int], num_ranks: int, slots_per_rank: int) -> dict:
    out: dict[tuple[int, int], int] = {}
    for s, e in enumerate(row):
        key = (e, s // slots_per_rank)
        out[key] = out.get(key, 0) + 1
    return out


# ----------------------------------------------------------------------------- hand-worked


def test_hand_worked_redundant_slot_goes_where_drift_cancels():
    # E=4, S=6, 2 ranks of 3 slots; load 6,2,2,2 (mean rank load 6).
    # DeepSeek's greedy gives the 2 spare slots to expert 0 (3 copies of 2); that balances the
    # known load too, but 2 copies sit on one rank. The policy instead gives expert 0 two copies
    # (3 each, one per rank: its drift moves both ranks alike) and expert 1 two copies (1 each):
    #
    #   rank 0: slot 0 = e0 (3) | slot 1 = e1 (1) | slot 2 = e2 (2)   -> 6
    #   rank 1: slot 3 = e0 (3) | slot 4 = e1 (1) | slot 5 = e3 (2)   -> 6
    #
    # LPT order e0, e0, e2, e3, e1, e1 (ties: lower rank); slots sorted by expert id per rank.
    p = rebalance(torch.tensor([[6, 2, 2, 2]]), 6, 1, 1, 2)
    assert p.phy2log.tolist() == [[0, 1, 2, 0, 1, 3]]
    assert p.logcnt.tolist() == [[2, 2, 1, 1]]
    assert p.log2phy.tolist() == [[[0, 3], [1, 4], [2, -1], [5, -1]]]
    assert rank_loads(p.phy2log, torch.tensor([[6., 2, 2, 2]]), 2).tolist() == [[6.0, 6.0]]


def test_hand_worked_no_redundancy():
    # S == E: LPT puts 4 on rank 0, 3 on rank 1, 2 on rank 1 (3 < 4), 1 on rank 0 -> 5 | 5.
    p = rebalance(torch.tensor([[4.0, 3.0, 2.0, 1.0]]), 4, 1, 1, 2)
    assert p.phy2log.tolist() == [[0, 3, 1, 2]]
    assert p.logcnt.tolist() == [[1, 1, 1, 1]]


def test_hand_worked_deepseek_baseline():
    # DeepSeek on the first case: 3 copies of e0 (2 each), then sorted balanced packing of six
    # equal items alternates packs -> rank 0 = [e0, e2, e0], rank 1 = [e1, e3, e0]: balanced,
    # but two copies of e0 share rank 0.
    p = deepseek_rebalance(torch.tensor([[6, 2, 2, 2]]), 6, 1, 1, 2)
    assert p.phy2log.tolist() == [[0, 2, 0, 1, 3, 0]]
    assert p.logcnt.tolist() == [[3, 1, 1, 1]]


def test_hierarchical_hand_worked_groups_whole():
    # 4 groups of 2 experts, 2 nodes x 1 rank, 5 slots per node. Group loads 10, 9, 2, 1:
    # the best split is {g0, g3} = 11 | {g1, g2} = 11. Node 0 = experts 0,1,6,7 + a second copy
    # of its heaviest (e0); node 1 = experts 2,3,4,5 + a second copy of e2.
    load = torch.tensor([[6.0, 4.0, 5.0, 4.0, 1.0, 1.0, 0.5, 0.5]])
    p = rebalance(load, 10, 4, 2, 2)
    assert sorted(p.phy2log[0, :5].tolist()) == [0, 0, 1, 6, 7]
    assert sorted(p.phy2log[0, 5:].tolist()) == [2, 2, 3, 4, 5]


def test_empty_window_keeps_old_or_default():
    zero = torch.zeros(2, 8, dtype=torch.int64)
    default = rebalance(zero, 12, 1, 1, 4)
    assert default.phy2log.tolist() == [[s % 8 for s in range(12)]] * 2
    assert torch.equal(default.phy2log, eplb.default_placement(8, 12, 1, 1, 4, 2).phy2log)
    old = rebalance(torch.arange(16).reshape(2, 8), 12, 1, 1, 4).phy2log
    load = torch.stack([torch.zeros(8), torch.arange(8.0)])      # layer 0 empty, layer 1 not
    p = rebalance(load, 12, 1, 1, 4, old_phy2log=old)
    assert torch.equal(p.phy2log[0], old[0])
    _check_maps(p, 8, 12)


def test_default_placement_identity_and_groups():
    assert eplb.default_placement(8, 8, 1, 1, 4).phy2log.tolist() == [list(range(8))]
    # hierarchical: node 0 cycles through experts 0..3, node 1 through 4..7
    got = eplb.default_placement(8, 12, 4, 2, 2).phy2log.tolist()
    assert got == [[0, 1, 2, 3, 0, 1, 4, 5, 6, 7, 4, 5]]


# ----------------------------------------------------------------------------- invariants


_SWEEP = [  # (E, S, G, N, R)
    (16, 16, 1, 1, 4), (16, 20, 1, 1, 4), (16, 24, 4, 2, 4), (24, 32, 3, 2, 4),
    (12, 16, 1, 2, 4), (8, 24, 2, 2, 2), (6, 8, 1, 1, 1), (32, 40, 8, 4, 8),
    (64, 72, 8, 2, 8), (20, 24, 4, 3, 6),
]


@pytest.mark.parametrize("E_,S_,G,N,R_", _SWEEP)
@pytest.mark.parametrize("kind", ["zipf", "hot", "sparse"])
def test_invariants_sweep(E_, S_, G, N, R_, kind):
    gen = torch.Generator().manual_seed(E_ * 1000 + S_)
    if kind == "zipf":
        load = zipf_load(E_, 1.2, 5000, seed=E_ + S_, num_layers=2)
    elif kind == "hot":
        load = hot_load(E_, 5000, seed=S_, num_layers=2)
    else:                                                   # many zeros, ints
        load = torch.randint(0, 4, (2, E_), generator=gen) * torch.randint(0, 2, (2, E_),
                                                                            generator=gen)
    before = load.clone()
    p = rebalance(load, S_, G, N, R_)
    assert torch.equal(load, before)                         # pure: input untouched
    _check_maps(p, E_, S_)
    q = rebalance(load, S_, G, N, R_)
    assert torch.equal(p.phy2log, q.phy2log) and torch.equal(p.log2phy, q.log2phy)
    per_rank, per_node = S_ // R_, R_ // N
    for layer in range(2):
        row = p.phy2log[layer].tolist()
        if G % N == 0:                                      # hierarchical: groups whole
            size = E_ // G
            for g in range(G):
                nodes = {s // per_rank // per_node for s, e in enumerate(row) if e // size == g}
                assert len(nodes) == 1, (g, nodes)
        if load[layer].sum() == 0:
            continue
        cnt = p.logcnt[layer].tolist()
        hier = G % N == 0
        domain_ranks = per_node if hier else R_
        for (e, r), c in _copies_per_rank(row, R_, per_rank).items():
            lo = (r // per_node) * per_node * per_rank if hier else 0
            domain = set(row[lo:lo + domain_ranks * per_rank])
            if per_rank <= len(domain):                     # enough distinct experts per rank
                assert c <= -(-cnt[e] // domain_ranks), (e, r, c, cnt[e])


def test_global_policy_spreads_replicas_over_nodes():
    # 1 group over 2 nodes does not divide -> global; replicas of an expert split over nodes.
    for s in ZIPF:
        p = rebalance(zipf_load(E, s, TOKENS, seed=1), S, 1, 2, R)
        row, cnt = p.phy2log[0].tolist(), p.logcnt[0].tolist()
        for e in range(E):
            nodes = [sl // P // (R // 2) for sl, x in enumerate(row) if x == e]
            assert max(nodes.count(0), nodes.count(1)) <= -(-cnt[e] // 2), (s, e, nodes)


def test_multi_layer_equals_per_layer():
    load = torch.cat([zipf_load(64, 1.2, 20000, seed=3), torch.zeros(1, 64, dtype=torch.int64),
                      hot_load(64, 20000, seed=4)])
    p = rebalance(load, 72, 8, 2, 8)
    for layer in range(3):
        q = rebalance(load[layer:layer + 1], 72, 8, 2, 8)
        assert torch.equal(p.phy2log[layer], q.phy2log[0])


def test_old_placement_keeps_slots_and_replanning_the_same_load_moves_nothing():
    A = zipf_load(E, 1.2, TOKENS, seed=5)
    p = rebalance(A, S, 1, 1, R)
    same = rebalance(A, S, 1, 1, R, old_phy2log=p.phy2log)
    assert torch.equal(same.phy2log, p.phy2log)
    drifted = A * drift_factors(E, 0.3, 1, seed=6)[0]
    old_clone = p.phy2log.clone()
    q = rebalance(drifted, S, 1, 1, R, old_phy2log=p.phy2log)
    assert torch.equal(p.phy2log, old_clone)                 # pure: old untouched
    _check_maps(q, E, S)
    old_row, new_row = p.phy2log[0].tolist(), q.phy2log[0].tolist()
    for r in range(R):
        o, n = old_row[r * P:(r + 1) * P], new_row[r * P:(r + 1) * P]
        kept = sum(a == b for a, b in zip(o, n))
        overlap = sum(min(o.count(e), n.count(e)) for e in set(n))
        assert kept == overlap                               # every staying expert kept its slot


def test_old_placement_hierarchical_keeps_groups_and_slots():
    A = zipf_load(64, 1.0, 20000, seed=7)
    p = rebalance(A, 80, 8, 2, 4)
    q = rebalance(A * drift_factors(64, 0.3, 1, seed=8)[0], 80, 8, 2, 4, old_phy2log=p.phy2log)
    _check_maps(q, 64, 80)
    per = 20
    for r in range(4):
        o = p.phy2log[0, r * per:(r + 1) * per].tolist()
        n = q.phy2log[0, r * per:(r + 1) * per].tolist()
        assert sum(a == b for a, b in zip(o, n)) == sum(min(o.count(e), n.count(e)) for e in set(n))
    for g in range(8):
        nodes = {s // 40 for s, e in enumerate(q.phy2log[0].tolist()) if e // 8 == g}
        assert len(nodes) == 1


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("args,match", [
    ((290, 1, 1, 8), r"num_slots=290 must be divisible by num_ranks=8"),
    ((288, 3, 1, 8), r"num_groups=3 must divide num_experts=256"),
    ((288, 1, 3, 8), r"num_nodes=3 must divide num_ranks=8"),
    ((248, 1, 1, 8), r"num_slots=248 must be >= num_experts=256"),
    ((288, 0, 1, 8), r"num_groups must be a positive int, got 0"),
    ((288, 1, 1, True), r"num_ranks must be a positive int, got True"),
])
def test_size_validation(args, match):
    with pytest.raises(ValueError, match=match):
        rebalance(torch.ones(1, E), *args)


def test_load_validation():
    with pytest.raises(ValueError, match=r"load must be non-negative, got min -1"):
        rebalance(torch.tensor([[1.0, -1.0]]), 2, 1, 1, 1)
    with pytest.raises(ValueError, match=r"load has NaN or infinite"):
        rebalance(torch.tensor([[1.0, float("nan")]]), 2, 1, 1, 1)
    with pytest.raises(ValueError, match=r"load must have shape \[L, E\].*\(4,\)"):
        rebalance(torch.ones(4), 4, 1, 1, 1)
    with pytest.raises(ValueError, match=r"L, E >= 1, got \(0, 4\)"):
        rebalance(torch.ones(0, 4), 4, 1, 1, 1)
    with pytest.raises(TypeError, match=r"load must be a torch.Tensor"):
        rebalance([[1, 2]], 2, 1, 1, 1)


def test_old_phy2log_validation():
    load = torch.ones(1, 4)
    with pytest.raises(ValueError, match=r"old_phy2log must have shape \[L, S\] = \[1, 6\]"):
        rebalance(load, 6, 1, 1, 2, old_phy2log=torch.zeros(1, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"old_phy2log entries must be expert ids in \[0, 4\)"):
        rebalance(load, 6, 1, 1, 2, old_phy2log=torch.tensor([[0, 1, 2, 3, 4, 0]]))
    with pytest.raises(ValueError, match=r"old_phy2log layer 0 has no slot for expert 3"):
        rebalance(load, 6, 1, 1, 2, old_phy2log=torch.tensor([[0, 1, 2, 0, 1, 2]]))
    with pytest.raises(TypeError, match=r"old_phy2log must have an integer dtype"):
        rebalance(load, 6, 1, 1, 2, old_phy2log=torch.zeros(1, 6))


# ----------------------------------------------------------------------------- bars


def test_bar_known_load():
    for name, load in _bar_loads().items():
        before = float(contiguous_imbalance(load, R))
        after = float(imbalance(rebalance(load, S, 1, 1, R).phy2log, load, R))
        assert before > 1.3, name                           # the load really is skewed
        assert after <= KNOWN_BAR, (name, before, after)


def _exhaustive_bound(load_E: torch.Tensor, groups: int, nodes: int, ranks: int) -> float:
    """max(total / ranks, best split of whole groups (equal counts here) / ranks per node)."""
    g_load = load_E.double().reshape(groups, -1).sum(1).tolist()
    best = min(max(sum(g_load[g] for g in range(groups) if a[g] == n) for n in range(nodes))
               for a in itertools.product(range(nodes), repeat=groups)
               if all(a.count(n) == groups // nodes for n in range(nodes)))
    return max(best / (ranks // nodes), sum(g_load) / ranks)


def test_bar_hierarchical_within_one_percent_of_exhaustive_bound():
    for name, load in _bar_loads().items():
        p = rebalance(load, S, 8, 2, R)
        rl = rank_loads(p.phy2log, load, R)[0]
        bound = _exhaustive_bound(load[0], 8, 2, R)
        assert hierarchical_bound(load[0], S, 8, 2, R) == pytest.approx(bound, rel=1e-12)
        assert float(rl.max()) <= bound * (1 + HIER_GAP), (name, float(rl.max()) / bound)
        size = E // 8
        for g in range(8):                                  # groups whole on one node
            nodes = {s // P // 4 for s, e in enumerate(p.phy2log[0].tolist()) if e // size == g}
            assert len(nodes) == 1


@pytest.mark.parametrize("s", ZIPF)
def test_bar_drift_and_migration(s):
    A = zipf_load(E, s, TOKENS, seed=0)
    ours = rebalance(A, S, 1, 1, R)
    ds = deepseek_rebalance(A, S, 1, 1, R)
    drifted = A * drift_factors(E, 0.3, 50, seed=1)             # [50, 1, E]
    ours_mean = float(imbalance(ours.phy2log, drifted, R).mean())
    ds_mean = float(imbalance(ds.phy2log, drifted, R).mean())
    assert ours_mean <= DRIFT_BAR and ours_mean < ds_mean, (s, ours_mean, ds_mean)
    for d in range(2):                                          # re-plan after the drift
        new = rebalance(drifted[d], S, 1, 1, R, old_phy2log=ours.phy2log)
        moved = int(slots_moved(ours.phy2log, new.phy2log)[0]) / S
        assert moved <= MIGRATION_BAR, (s, d, moved)
        assert float(imbalance(new.phy2log, drifted[d], R)) <= KNOWN_BAR


def test_policy_runs_one_layer_of_256_experts_fast():
    load = zipf_load(E, 1.2, TOKENS, seed=9)
    rebalance(load, S, 1, 1, R)                                 # warm up torch
    t0 = time.perf_counter()
    rebalance(load, S, 1, 1, R)
    rebalance(load, S, 8, 2, R)
    assert (time.perf_counter() - t0) / 2 < 1.0


# ----------------------------------------------------------------------------- simulator


def test_sim_metrics_hand_worked():
    # slots [e0, e1 | e0, e2] on 2 ranks; load 4, 1, 3: e0 split 2 / 2 -> ranks 3 and 5.
    phy = torch.tensor([[0, 1, 0, 2]])
    assert rank_loads(phy, torch.tensor([[4.0, 1.0, 3.0]]), 2).tolist() == [[3.0, 5.0]]
    assert float(imbalance(phy, torch.tensor([[4.0, 1.0, 3.0]]), 2)) == pytest.approx(1.25)
    assert float(imbalance(phy, torch.zeros(1, 3), 2)) == 1.0
    assert slots_moved(phy, torch.tensor([[0, 2, 0, 1]])).tolist() == [2]
    assert float(contiguous_imbalance(torch.tensor([[3.0, 1.0, 1.0, 1.0]]), 2)) == \
        pytest.approx(4 / 3)


def test_sim_loads_deterministic_and_shaped():
    a = zipf_load(32, 1.2, 1000, seed=3, num_layers=2)
    assert a.shape == (2, 32) and a.dtype == torch.int64 and int(a.sum()) == 2000
    assert torch.equal(a, zipf_load(32, 1.2, 1000, seed=3, num_layers=2))
    h = hot_load(10, 10000, seed=0)
    assert 0.27 < float(h[0, 0]) / 10000 < 0.33


def test_sim_main_prints_every_case(capsys, tmp_path):
    small = ["--experts", "16", "--ranks", "4", "--slots", "20", "--draws", "3"]
    assert main(small + ["--load", "uniform", "zipf", "hot", "drift",
                         "--zipf-s", "0.8", "1.6"]) == 0
    out = capsys.readouterr().out
    assert out.count("case=") == 6 and "deepseek=" in out and "moved=" in out
    seq = zipf_load(16, 1.2, 2000, seed=1, num_layers=2)
    torch.save(torch.stack([seq, seq.flip(-1)]), tmp_path / "w.pt")
    (tmp_path / "w.json").write_text(str(seq.tolist()))
    assert main(small + ["--load", "file", "--load-file", str(tmp_path / "w.pt")]) == 0
    assert main(small + ["--load", "file", "--load-file", str(tmp_path / "w.json")]) == 0
    out = capsys.readouterr().out
    assert "windows=2" in out and "case=file(w.json)" in out
    assert main(small + ["--nodes", "2", "--groups", "4", "--load", "zipf"]) == 0
    assert "bound=" in capsys.readouterr().out
    assert main(["--experts", "16", "--ranks", "3", "--slots", "20"]) == 2
