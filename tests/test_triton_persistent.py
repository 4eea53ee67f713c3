"""The persistent TMA kernels (``persistent.py``, ``ExpertsConfig.kernel="persistent"``): under
the Triton interpreter against the torch twins and the fp64 reference, the config field in
process, and (``gpu`` marker) bf16 on a mid shape plus CUDA-graph capture.

The worker (this file run as a script with ``TRITON_INTERPRET=1``) prints one JSON line per
case. Cases, smallest first:

    hand    M=3 K=2 S=4 ids [[0,2],[2,-1],[-1,-1]], BM=16: blocks [slot 0 | slot 2 | -1 ...],
            programs=1 so one program walks every used tile, then the unused block is skipped
    then uneven rows per slot and slots with zero rows, M not a multiple of BM, top_k 1..4,
    -1 ids, H not a multiple of BLOCK_K and I not a multiple of BLOCK_N, more tiles than
    programs (1, 2, 3 programs), A gathered by pointer and through TMA, fp32 and fp16; and
    ``run_experts`` with a persistent config against the grouped config of the same tiles.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.interp_worker import emit, rel, rows_of, run_worker

# same math as the grouped kernels: kernel-vs-twin and backend-vs-fp64 bounds of
# test_triton_interp (fp16: rounding of the fp16 intermediate)
TOL = {"float32": 1e-5, "float16": 2e-3}


# ---------------------------------------------------------------- the worker (subprocess)
def _worker() -> None:  # pragma: no cover -- runs in the subprocess
    import time

    from moerun.backends.base import FusedShared
    from moerun.backends.reference import reference_moe
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.configs import (
        ConfigTable,
        DownConfig,
        ExpertsConfig,
        GateUpConfig,
    )
    from moerun.backends.triton.down import down_torch
    from moerun.backends.triton.experts import TritonExperts
    from moerun.backends.triton.gate_up import gate_up_torch
    from moerun.backends.triton.persistent import down_persistent, gate_up_persistent

    g = torch.Generator().manual_seed(4321)

    def rnd(*shape, dtype, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    def backend(cfg):
        return TritonExperts(ConfigTable(overrides={b: cfg for b in range(1, 64)}))

    cases = [  # (name, M, K, S, H, I, drop, only_slots, programs, gate_up cfg, down cfg)
        ("hand", 3, 2, 4, 32, 16, 0.0, None, 1, {"block_n": 16, "block_k": 16},
         {"block_n": 16, "block_k": 16}),
        ("uneven/zero-row-slots", 19, 2, 6, 48, 32, 0.0, (0, 0, 0, 2, 5), 3,
         {"block_n": 16, "block_k": 32, "group_m": 2},
         {"block_n": 16, "block_k": 16, "group_m": 2}),
        ("top_k=1/K-tail", 11, 1, 3, 40, 24, 0.1, None, 2,
         {"block_n": 16, "block_k": 32}, {"block_n": 32, "block_k": 16}),
        ("top_k=3/N-tail", 9, 3, 5, 32, 40, 0.2, None, 2,
         {"block_n": 32, "block_k": 16, "group_m": 4}, {"block_n": 16, "block_k": 32}),
        ("top_k=4/one-program", 17, 4, 8, 64, 48, 0.0, None, 1,
         {"block_n": 16, "block_k": 32, "flatten": True},
         {"block_n": 32, "block_k": 32, "flatten": True}),
    ]
    for dt_name in ("float32", "float16"):
        dt = getattr(torch, dt_name)
        for name, m, k, s, h, i, drop, only, progs, gu_kw, dn_kw in cases:
            t0 = time.time()
            x = rnd(m, h, dtype=dt)
            w13 = rnd(s, 2 * i, h, dtype=dt, scale=h ** -0.5)
            w2 = rnd(s, h, i, dtype=dt, scale=i ** -0.5)
            if name == "hand":
                ids = torch.tensor([[0, 2], [2, -1], [-1, -1]])
            elif only is None:
                ids = torch.stack([torch.randperm(s, generator=g)[:k] for _ in range(m)])
            else:
                ids = torch.tensor(only)[torch.randint(0, len(only), (m, k), generator=g)]
            ids = ids.to(torch.int32)
            ids[torch.rand(m, k, generator=g) < drop] = -1
            tw = torch.rand(m, k, generator=g)
            al = moe_align(ids, s, 16)
            used = int(al.num_post[0])
            act_t = gate_up_torch(x, w13, al, k)
            for a_tma in (False, True):
                act = torch.full((al.max_blocks * 16, i), float("nan"), dtype=dt)
                gate_up_persistent(x, w13, al, k, GateUpConfig(**gu_kw, a_tma=a_tma),
                                   programs=progs, out=act)
                emit(kind="gate_up", name=f"{name}/{dt_name}/a_tma={a_tma}", dtype=dt_name,
                     err=rel(act[:used], act_t[:used]))
            y = torch.full((m * k, h), float("nan"), dtype=dt)
            down_persistent(act, w2, al, tw, k, DownConfig(**dn_kw), programs=progs, out=y)
            live = ((ids >= 0) & (ids < s)).reshape(-1)
            emit(kind="down", name=f"{name}/{dt_name}", dtype=dt_name,
                 err=rel(y[live], down_torch(act, w2, al, tw, k, atomic=False)[live]))
            ref = reference_moe(x.double(), w13.double(), w2.double(), tw.double(), ids)
            grouped = ExpertsConfig(block_m=16, gate_up=GateUpConfig(**gu_kw),
                                    down=DownConfig(**dn_kw))
            persistent = ExpertsConfig(block_m=16, gate_up=GateUpConfig(**gu_kw),
                                       down=DownConfig(**dn_kw), kernel="persistent",
                                       programs=progs)
            out_g = backend(grouped).run_experts(x, w13, w2, tw, ids)
            out_p = backend(persistent).run_experts(x, w13, w2, tw, ids)
            emit(kind="backend", name=f"{name}/{dt_name}", dtype=dt_name,
                 err=rel(out_p, ref), vs_grouped=rel(out_p, out_g),
                 out_dtype=str(out_p.dtype), shape=list(out_p.shape))
            emit(kind="timing", name=f"{name}/{dt_name}", secs=time.time() - t0)

    # the programs default (4 under the interpreter) and a bigger block_m
    m, k, s, h, i = 40, 2, 4, 64, 32
    x = rnd(m, h, dtype=torch.float32)
    w13 = rnd(s, 2 * i, h, dtype=torch.float32, scale=h ** -0.5)
    w2 = rnd(s, h, i, dtype=torch.float32, scale=i ** -0.5)
    ids = torch.randint(0, s, (m, k), generator=g).to(torch.int32)
    tw = torch.rand(m, k, generator=g)
    ref = reference_moe(x.double(), w13.double(), w2.double(), tw.double(), ids)
    cfg = ExpertsConfig(block_m=32, gate_up=GateUpConfig(block_n=32, block_k=32),
                        down=DownConfig(block_n=32, block_k=32), kernel="persistent")
    emit(kind="backend", name="bm32/default-programs", dtype="float32",
         err=rel(backend(cfg).run_experts(x, w13, w2, tw, ids), ref), vs_grouped=0.0,
         out_dtype="torch.float32", shape=[m, h])
    # fallbacks: the fused shared expert, and strides TMA cannot take (fp16, I = 12: 24 B)
    sh = FusedShared(w13=rnd(2 * i, h, dtype=torch.float32, scale=h ** -0.5),
                     w2=rnd(h, i, dtype=torch.float32, scale=i ** -0.5), first_slot=s,
                     num_slots=1)
    ids_sh = torch.cat([ids, torch.full((m, 1), s, dtype=torch.int32)], dim=1)
    tw_sh = torch.cat([tw, torch.ones(m, 1)], dim=1)
    ref_sh = reference_moe(x.double(), w13.double(), w2.double(), tw_sh.double(), ids_sh,
                           FusedShared(w13=sh.w13.double(), w2=sh.w2.double(), first_slot=s,
                                       num_slots=1))
    emit(kind="fallback", name="fused-shared", dtype="float32",
         err=rel(backend(cfg).run_experts(x, w13, w2, tw_sh, ids_sh, shared=sh), ref_sh))
    i = 12
    x = rnd(m, h, dtype=torch.float16)
    w13 = rnd(s, 2 * i, h, dtype=torch.float16, scale=h ** -0.5)
    w2 = rnd(s, h, i, dtype=torch.float16, scale=i ** -0.5)
    ref = reference_moe(x.double(), w13.double(), w2.double(), tw.double(), ids)
    cfg = ExpertsConfig(block_m=16, gate_up=GateUpConfig(block_n=16, block_k=32),
                        down=DownConfig(block_n=32, block_k=16), kernel="persistent")
    emit(kind="fallback", name="unaligned-I", dtype="float16",
         err=rel(backend(cfg).run_experts(x, w13, w2, tw, ids), ref))


@pytest.fixture(scope="module")
def report():
    return run_worker(__file__, timeout=240)


@pytest.mark.parametrize("kind", ["gate_up", "down"])
def test_kernels_match_twins(report, kind):
    rows = rows_of(report, kind)
    assert len(rows) >= 10
    for r in rows:
        assert r["err"] <= TOL[r["dtype"]], r  # NaN fails: an unwritten row


def test_backend_matches_reference_and_grouped(report):
    rows = rows_of(report, "backend")
    assert len(rows) == 11
    for r in rows:
        assert r["err"] <= TOL[r["dtype"]], r
        assert r["vs_grouped"] <= TOL[r["dtype"]], r
        assert r["out_dtype"] == f"torch.{r['dtype']}", r


def test_fallbacks_run_the_grouped_kernels(report):
    rows = rows_of(report, "fallback")
    assert {r["name"] for r in rows} == {"fused-shared", "unaligned-I"}
    for r in rows:
        assert r["err"] <= TOL[r["dtype"]], r


def test_each_case_is_quick(report):
    for r in rows_of(report, "timing"):
        assert r["secs"] < 10, r


# ---------------------------------------------------------------- in-process: the config
def test_config_field_round_trip_and_old_files():
    from moerun.backends.triton.configs import (
        DownConfig,
        ExpertsConfig,
        GateUpConfig,
        default_config,
    )

    old = {"block_m": 128, "gate_up": {"block_n": 128, "block_k": 64, "group_m": 8,
                                       "num_warps": 8, "num_stages": 3},
           "down": {"block_n": 256, "block_k": 64, "group_m": 8, "split_k": 1, "num_warps": 8,
                    "num_stages": 3}, "combine": "reduce"}
    cfg = ExpertsConfig.from_json(old)
    assert cfg.kernel == "grouped" and cfg.programs == 0
    assert cfg.to_json() == old  # a grouped config writes what the old files hold
    assert "persistent" not in cfg.key()
    p = ExpertsConfig(block_m=128, gate_up=GateUpConfig(block_n=128, block_k=64, flatten=True,
                                                        a_tma=True),
                      down=DownConfig(block_n=256, block_k=64),
                      kernel="persistent", programs=66)
    d = p.to_json()
    assert d["kernel"] == "persistent" and d["programs"] == 66 and d["gate_up"]["a_tma"]
    assert d["gate_up"]["flatten"] and "flatten" not in d["down"]
    assert "warp_specialize" not in d["gate_up"] and "warp_specialize" not in d["down"]
    assert ExpertsConfig.from_json(d) == p
    assert p.key().endswith("|persistent p66 guFA dn-")
    # the heuristic keeps today's kernels (the GPU probe decides)
    assert default_config(8, 14336, 4096, 8192, 2).kernel == "grouped"
    # an fp8 paired gate/up tile: written only when set, read back, marked in the key
    f = ExpertsConfig(block_m=128, gate_up=GateUpConfig(block_n=128, block_k=128, paired=True),
                      down=DownConfig(block_n=128, block_k=128))
    d = f.to_json()
    assert d["gate_up"]["paired"] is True and "paired" not in old["gate_up"]
    assert ExpertsConfig.from_json(d) == f
    assert f.key().startswith("m128|gu n128k128g1w4s4P|dn ")
    # the paired tile's pipeline holds one B tile of block_n rows (not two)
    assert f.gate_up.smem_bytes(128, 1) == 4 * (128 * 128 + 128 * 128)
    assert GateUpConfig(block_n=128, block_k=128).smem_bytes(128, 1) == 4 * (128 * 128
                                                                              + 256 * 128)


def test_config_validation_messages():
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig

    gu, dn = GateUpConfig(block_n=64, block_k=64), DownConfig(block_n=64, block_k=64)
    with pytest.raises(ValueError, match="kernel='tma'"):
        ExpertsConfig(block_m=64, gate_up=gu, down=dn, kernel="tma")
    with pytest.raises(ValueError, match="kernel='persistent' needs combine='reduce'"):
        ExpertsConfig(block_m=64, gate_up=gu, down=dn, combine="atomic", kernel="persistent")
    with pytest.raises(ValueError, match="programs=8"):
        ExpertsConfig(block_m=64, gate_up=gu, down=dn, programs=8)
    # warp specialization gave wrong results on the H200 (Triton 3.6): refused, also from a file
    ws = {"block_n": 64, "block_k": 64, "warp_specialize": True}
    for raw in ({"block_m": 64, "gate_up": ws, "down": {"block_n": 64, "block_k": 64},
                 "kernel": "persistent"},
                {"block_m": 64, "gate_up": {"block_n": 64, "block_k": 64}, "down": ws}):
        with pytest.raises(ValueError, match="warp_specialize=True is refused"):
            ExpertsConfig.from_json(raw)
    with pytest.raises(ValueError, match="paired .*kernel='persistent'"):
        ExpertsConfig(block_m=64, gate_up=GateUpConfig(block_n=64, block_k=64, paired=True),
                      down=dn, kernel="persistent")


def test_shipped_files_load_and_persistent_entries_are_measured():
    """Every shipped entry loads; an entry without a ``kernel`` field is the grouped kernel;
    a persistent one is a measured bf16 prefill entry (reduce combine): pasted from the probe
    (its ``source`` names it) or written by ``moerun tune`` (the file's writer, the entry
    timed: ``us`` and ``timing``)."""
    from moerun.backends.triton.configs import CONFIG_DIR, load_config_file

    persistent = []
    for f in sorted(CONFIG_DIR.glob("*.json")):
        entries = load_config_file(f).entries
        data = json.loads(f.read_text())
        raw = data["entries"]
        by_tuner = "moerun tune" in data["meta"].get("written_by", "")
        for bucket, cfg in entries.items():
            entry = raw[str(bucket)]
            if "kernel" not in entry["config"]:
                assert cfg.kernel == "grouped", (f.name, bucket)
            if cfg.kernel == "persistent":
                persistent.append((f.name, bucket))
                assert "bfloat16" in f.name and cfg.combine == "reduce", (f.name, bucket)
                probe = "persistent_probe" in entry.get("source", "")
                tuned = by_tuner and entry.get("us", 0) > 0 and entry.get("timing") in (
                    "graph", "eager")
                assert probe or tuned, (f.name, bucket)
    assert ("S8_N14336_K4096_bfloat16_NVIDIA_H200.json", 8192) in persistent


# ---------------------------------------------------------------- GPU (bf16)
def _gpu_case(T=1024, seed=3, intermediate=1024):
    from moerun.bench.inputs import make_case, make_weights
    from moerun.bench.shapes import BenchShape

    shape = BenchShape(name="mid", num_experts=16, top_k=4, hidden=2048,
                       intermediate=intermediate)
    w = make_weights(shape, torch.bfloat16, "cuda", seed=seed)
    return shape, w, make_case(shape, T, torch.bfloat16, "cuda", seed=seed, drop=0.05)


def _gpu_backend():
    from moerun.backends.triton import TritonExperts
    from moerun.backends.triton.configs import (
        ConfigTable,
        DownConfig,
        ExpertsConfig,
        GateUpConfig,
    )

    cfg = ExpertsConfig(block_m=128, gate_up=GateUpConfig(block_n=128, block_k=64, group_m=8,
                                                          num_warps=8, num_stages=3),
                        down=DownConfig(block_n=128, block_k=64, group_m=8, num_warps=8,
                                        num_stages=3), kernel="persistent")
    return TritonExperts(ConfigTable(overrides={b: cfg for b in range(1, 1 << 15)}))


@pytest.mark.gpu
@pytest.mark.parametrize("intermediate", [1024, 1000])  # 1000: N tail of gate/up's [1, 2, BN,
def test_gpu_bf16_persistent_matches_reference(intermediate):  # BK] box, K tail of down
    from moerun.bench.inputs import reference_rows
    from moerun.testing import rel_err

    _, w, c = _gpu_case(intermediate=intermediate)
    out = _gpu_backend().run_experts(c.x, w.w13, w.w2, c.topk_weights, c.topk_ids)
    ref = reference_rows(c.x, w.w13, w.w2, c.topk_weights, c.topk_ids, acc=torch.float64)
    assert rel_err(out, ref) <= 1e-2


@pytest.mark.gpu
def test_gpu_persistent_graph_replay_equals_eager():
    _, w, c = _gpu_case(T=2048, seed=5)
    be = _gpu_backend()
    eager = be.run_experts(c.x, w.w13, w.w2, c.topk_weights, c.topk_ids)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = be.run_experts(c.x, w.w13, w.w2, c.topk_weights, c.topk_ids)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    # the alignment's row order inside a slot varies (atomics), so per-pair sums may round
    # differently: equal up to bf16 rounding of a reordered sum, not bit-exact
    from moerun.testing import rel_err

    assert rel_err(out, eager) <= 1e-2


if __name__ == "__main__":
    _worker()
