"""The direct decode path of TritonExperts (``kernel="direct"``: no alignment, two launches)
on the CPU: its kernels under the Triton interpreter against their torch twins, and whole
calls against the fp64 reference of DESIGN 2.

Like ``test_triton_interp.py``, this file runs itself as the interpreter worker in ONE
subprocess (``TRITON_INTERPRET=1`` before triton is imported) and the tests read its JSON
report. Cases: 1-4 tokens, sizes that are not multiples of any tile, top_k = 1, excluded
pairs (``-1`` and ids ``>= S``), a token with no local pair, fp32 and fp16, the fused shared
expert (which takes the grouped kernels with the same tiles), M = 0; both down forms (per token,
and per pair with arrival counters zeroed by the gate/up launch).
"""

from __future__ import annotations

import pytest
import torch

from tests.interp_worker import emit, rel, rows_of, run_worker, value_errors

# fp64-reference bounds as test_triton_interp.py (DESIGN 2); kernel-vs-twin bounds (same
# math in another summation order; fp16 rounds the weighted intermediate)
TOL_BACKEND = {"float32": 1e-5, "float16": 2e-3}
TOL_TWIN = {"float32": 1e-5, "float16": 2e-3}


# ---------------------------------------------------------------- the worker (subprocess)
def _worker() -> None:  # pragma: no cover -- runs in the subprocess
    from moerun.backends.base import FusedShared
    from moerun.backends.reference import reference_moe
    from moerun.backends.triton.configs import (ConfigTable, DownConfig, ExpertsConfig,
                                                GateUpConfig)
    from moerun.backends.triton.down import down_direct, down_direct_torch
    from moerun.backends.triton.experts import TritonExperts
    from moerun.backends.triton.gate_up import gate_up_direct, gate_up_direct_torch

    g = torch.Generator().manual_seed(4321)

    def rnd(*shape, dtype, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    gu_cfg = GateUpConfig(block_n=16, block_k=32)
    dn_cfg = DownConfig(block_n=16, block_k=32)
    tables = {f"{combine}{'/swap' if swap else ''}": ConfigTable(overrides={b: ExpertsConfig(
        block_m=16, gate_up=gu_cfg, down=dn_cfg, combine=combine, kernel="direct",
        swap_ab=swap) for b in range(1, 64)})
        for combine in ("reduce", "atomic") for swap in (False, True)}
    table = tables["atomic"]
    cases = [  # (name, M, K, S, H, I, ids or None)
        ("M=1", 1, 4, 8, 64, 48, None),
        ("odd-sizes", 3, 2, 5, 40, 24, None),
        ("top_k=1", 2, 1, 3, 32, 40, None),
        # pair (0, 1) is -1, pair (1, 0) is past S; token 2 has no local pair at all
        ("excluded", 3, 2, 4, 48, 32, [[1, -1], [7, 2], [-1, 9]]),
    ]
    for dt_name in ("float32", "float16"):
        dt = getattr(torch, dt_name)
        for name, m, k, s, h, i, fixed in cases:
            x = rnd(m, h, dtype=dt)
            w13 = rnd(s, 2 * i, h, dtype=dt, scale=h ** -0.5)
            w2 = rnd(s, h, i, dtype=dt, scale=i ** -0.5)
            if fixed is None:
                ids = torch.stack([torch.randperm(s, generator=g)[:k] for _ in range(m)])
            else:
                ids = torch.tensor(fixed)
            ids = ids.to(torch.int32).contiguous()
            tw = torch.rand(m, k, generator=g)
            live = ((ids >= 0) & (ids < s)).reshape(-1)
            act_t = gate_up_direct_torch(x, w13, ids, tw)
            for swap in (False, True):  # x W^T, and W x^T (ExpertsConfig.swap_ab)
                sw = "/swap" if swap else ""
                act = torch.full((m * k, i), float("nan"), dtype=dt)
                gate_up_direct(x, w13, ids, tw, gu_cfg, out=act, swap_ab=swap)
                emit(kind="gate_up", name=f"{name}/{dt_name}{sw}", dtype=dt_name,
                     err=rel(act[live], act_t[live]),
                     unwritten=bool(act[~live].isnan().all()))
                y_t = down_direct_torch(torch.where(live[:, None], act, 0), w2, ids)
                y = torch.full((m, h), float("nan"), dtype=dt)
                down_direct(act, w2, ids, dn_cfg, out=y, swap_ab=swap)
                emit(kind="down", name=f"{name}/{dt_name}/per-token{sw}", dtype=dt_name,
                     err=rel(y, y_t))
                # the per-pair form: counters zeroed by the gate/up launch (poisoned first)
                cnt = torch.full((m * -(-h // dn_cfg.block_n),), 7, dtype=torch.int32)
                act2 = torch.full((m * k, i), float("nan"), dtype=dt)
                gate_up_direct(x, w13, ids, tw, gu_cfg, out=act2, zero=cnt, swap_ab=swap)
                zeroed = bool((cnt == 0).all())
                y = torch.full((m, h), float("nan"), dtype=dt)
                down_direct(act2, w2, ids, dn_cfg, out=y, counters=cnt, swap_ab=swap)
                emit(kind="down", name=f"{name}/{dt_name}/per-pair{sw}", dtype=dt_name,
                     err=rel(y, y_t), zeroed=zeroed, arrivals=cnt.tolist(), top_k=k)
            ref = reference_moe(x.double(), w13.double(), w2.double(), tw.double(), ids)
            for combine, tab in tables.items():
                out = TritonExperts(tab).run_experts(x, w13, w2, tw, ids)
                emit(kind="backend", name=f"{name}/{dt_name}/{combine}", dtype=dt_name,
                     err=rel(out, ref), out_dtype=str(out.dtype), shape=list(out.shape),
                     no_local_zero=bool((out[2] == 0).all()) if name == "excluded" else None)
    # the fused shared expert: the grouped kernels with the direct config's tiles
    m, k, s, h, i = 2, 2, 5, 48, 16
    x = rnd(m, h, dtype=torch.float32)
    w13 = rnd(s, 2 * i, h, dtype=torch.float32, scale=h ** -0.5)
    w2 = rnd(s, h, i, dtype=torch.float32, scale=i ** -0.5)
    sh = FusedShared(w13=rnd(2 * i, h, dtype=torch.float32, scale=h ** -0.5),
                     w2=rnd(h, i, dtype=torch.float32, scale=i ** -0.5),
                     first_slot=s, num_slots=1)
    ids = torch.cat([torch.stack([torch.randperm(s, generator=g)[:k] for _ in range(m)]),
                     torch.full((m, 1), s)], dim=1).to(torch.int32)
    tw = torch.cat([torch.rand(m, k, generator=g), torch.ones(m, 1)], dim=1)
    ref = reference_moe(x.double(), w13.double(), w2.double(), tw.double(), ids,
                        FusedShared(w13=sh.w13.double(), w2=sh.w2.double(), first_slot=s,
                                    num_slots=1))
    out = TritonExperts(table).run_experts(x, w13, w2, tw, ids, shared=sh)
    emit(kind="fused", name="shared-falls-back-to-grouped", dtype="float32", err=rel(out, ref))
    out = TritonExperts(table).run_experts(x[:0], w13, w2, tw[:0, :k], ids[:0, :k])
    emit(kind="empty", name="M=0", shape=list(out.shape), out_dtype=str(out.dtype))
    emit(kind="errors", msgs=value_errors(
        lambda: down_direct(torch.zeros(4, i), w2, ids[:, :k].contiguous(),
                            DownConfig(block_n=16, block_k=32, split_k=2)),
        lambda: gate_up_direct(x, w13, ids[:, :k].long(), tw[:, :k].contiguous(), gu_cfg)))


@pytest.fixture(scope="module")
def report():
    return run_worker(__file__, timeout=240)


@pytest.mark.parametrize("kind", ["gate_up", "down"])
def test_direct_kernels_match_twins(report, kind):
    rows = rows_of(report, kind)
    assert len(rows) == (16 if kind == "gate_up" else 32)  # both forms, swap_ab off and on
    assert sum(r["name"].endswith("/swap") for r in rows) == len(rows) // 2
    for r in rows:
        assert r["err"] <= TOL_TWIN[r["dtype"]], r  # NaN fails: a live row left unwritten
        if kind == "gate_up":
            assert r["unwritten"], r  # excluded pairs' rows stay as the caller left them
        if "per-pair" in r["name"]:  # the gate/up launch zeroed the counters, and
            assert r["zeroed"], r  # every (token, N tile) got exactly K arrivals
            assert set(r["arrivals"]) == {r["top_k"]}, r


def test_direct_backend_matches_reference(report):
    rows = rows_of(report, "backend")
    assert len(rows) == 32  # 4 cases x 2 dtypes x 2 combines x swap_ab off and on
    for r in rows:
        assert r["err"] <= TOL_BACKEND[r["dtype"]], r
        assert r["out_dtype"] == f"torch.{r['dtype']}", r
        if r["name"].startswith("excluded"):
            assert r["no_local_zero"] is True, r  # a token with no local pair: exact zeros


def test_direct_config_with_fused_shared_expert(report):
    (r,) = rows_of(report, "fused")
    assert r["err"] <= TOL_BACKEND["float32"], r


def test_direct_empty_input_and_errors(report):
    (r,) = rows_of(report, "empty")
    assert r["shape"] == [0, 48] and r["out_dtype"] == "torch.float32"
    (e,) = rows_of(report, "errors")
    split, ids = e["msgs"]
    assert split and "split_k=2" in split and "split_k=1" in split
    assert ids and "topk_ids" in ids and "int32" in ids


# ---------------------------------------------------------------- in-process: config, plan
def test_direct_config_validation_and_round_trip():
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig

    gu, dn = GateUpConfig(block_n=32, block_k=128), DownConfig(block_n=16, block_k=256)
    cfg = ExpertsConfig(block_m=16, gate_up=gu, down=dn, combine="atomic", kernel="direct")
    assert ExpertsConfig.from_json(cfg.to_json()) == cfg
    assert cfg.key().endswith("|direct") and "swap_ab" not in cfg.to_json()
    swapped = ExpertsConfig(block_m=16, gate_up=gu, down=dn, combine="atomic", kernel="direct",
                            swap_ab=True)
    assert swapped.to_json()["swap_ab"] is True
    assert ExpertsConfig.from_json(swapped.to_json()) == swapped
    assert swapped.key().endswith("|direct swap")
    grouped = ExpertsConfig(block_m=32, gate_up=gu, down=dn, swap_ab=True)  # 16/32-row tiles
    assert ExpertsConfig.from_json(grouped.to_json()) == grouped
    assert grouped.key().endswith("|reduce|swap")
    for bad in (dict(block_m=64), dict(gate_up=GateUpConfig(block_n=64, block_k=128,
                                                            paired=True)),
                dict(kernel="persistent", block_m=128)):
        with pytest.raises(ValueError, match="swap_ab=True.*True only with kernel='direct', "
                                             "or kernel='grouped' at block_m 16 or 32"):
            ExpertsConfig(**(dict(block_m=16, gate_up=gu, down=dn, swap_ab=True) | bad))
    for bad in (dict(block_m=32), dict(down=DownConfig(block_n=16, block_k=256, split_k=2))):
        kw = dict(block_m=16, gate_up=gu, down=dn, combine="atomic", kernel="direct") | bad
        with pytest.raises(ValueError, match="kernel='direct' needs block_m=16"):
            ExpertsConfig(**kw)
    with pytest.raises(ValueError, match="'grouped', 'persistent', 'direct' or 'ws'"):
        ExpertsConfig(block_m=16, gate_up=gu, down=dn, kernel="gemv")


def test_tune_plan_times_direct_configs_at_decode_points(tmp_path):
    from dataclasses import replace

    from moerun.backends.triton.tune_plan import (DIRECT_MAX_TOKENS, FP8, compile_configs,
                                                  plan_points)
    from moerun.bench.shapes import SHAPES

    shape = SHAPES["qwen3-30b-a3b"]
    pts = plan_points([shape], [1, 4, 16], torch.bfloat16, "NVIDIA_H200", tmp_path)
    by_t = {p.tokens: p for p in pts}
    for t in (1, 4):
        assert t <= DIRECT_MAX_TOKENS and len(by_t[t].direct) == 50  # 42 and 8 swap_ab
        assert all(c.kernel == "direct" and c.block_m == 16 for c in by_t[t].direct)
        assert sum(c.combine == "atomic" for c in by_t[t].direct) == 24  # the per-pair form
        swap = [c for c in by_t[t].direct if c.swap_ab]  # both tiles >= 64 weight rows
        assert len(swap) == 8 and all(min(c.gate_up.block_n, c.down.block_n) >= 64
                                      for c in swap)
        assert {replace(c, swap_ab=False) for c in swap} <= set(by_t[t].direct)
        assert set(by_t[t].direct) <= set(compile_configs(by_t[t]))
        assert by_t[t].num_configs == (sum(c.size for c in by_t[t].candidate_sets)
                                       + by_t[t].swap_configs + len(by_t[t].persistent)
                                       + 50 + 1)
    assert by_t[16].direct == ()
    fp8 = {p.tokens: p for p in plan_points([shape], [1, 16], FP8, "NVIDIA_H200", tmp_path)}
    assert len(fp8[1].direct) == 21 and fp8[16].direct == ()  # fp8_direct.py's configs
    assert sum(c.swap_ab for c in fp8[1].direct) == 6  # n64/n128 gate/up x 3 downs >= 64
    assert all(c.kernel == "direct" and c.down.block_k == c.gate_up.block_k == 128
               and 128 % c.down.block_n == 0 and 128 % c.gate_up.block_n == 0
               for c in fp8[1].direct)
    assert sum(c.combine == "atomic" for c in fp8[1].direct) == 10
    assert set(fp8[1].direct) <= set(compile_configs(fp8[1]))


if __name__ == "__main__":  # the interpreter worker
    _worker()
