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


def tail_counters(tiles, programs, k_tiles, min_steps, max_parts=4):
    """Each program-indexed arrival counter after a launch with the tail split, from the
    rule of ``tail_split.py`` written out on the host: the ``rem`` tail tiles' counters read
    their part count when the split pays, everything else 0."""
    rem = tiles % programs
    parts = min(max_parts, programs // rem) if rem else 1
    pays = rem > 0 and parts > 1 and k_tiles // parts + min_steps < k_tiles
    return [parts] * rem + [0] * (programs - rem) if pays else [0] * programs


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

    # the tail split (tail_split.py): program counts that leave one tail tile, a tail of
    # half a round and of a third (several tiles, 2 and 3 parts), and more programs than
    # tiles (all tail); afterwards the counters must read what ``tail_counters`` says
    from moerun.backends.triton.tail_split import tail_scratch

    for dt_name in ("float32", "float16"):
        dt = getattr(torch, dt_name)
        for name, m, k, s, h, i, gu_kw, dn_kw, min_steps in (
                ("tail/K-even", 21, 2, 3, 64, 48, {"block_n": 16, "block_k": 16},
                 {"block_n": 16, "block_k": 16}, 1),
                ("tail/K-tail,N-tail", 13, 3, 4, 40, 40, {"block_n": 16, "block_k": 16,
                                                          "group_m": 2},
                 {"block_n": 32, "block_k": 16}, 1),
                ("tail/min-steps", 9, 2, 3, 96, 64, {"block_n": 16, "block_k": 16},
                 {"block_n": 16, "block_k": 16}, 3)):
            x = rnd(m, h, dtype=dt)
            w13 = rnd(s, 2 * i, h, dtype=dt, scale=h ** -0.5)
            w2 = rnd(s, h, i, dtype=dt, scale=i ** -0.5)
            ids = torch.stack([torch.randperm(s, generator=g)[:k] for _ in range(m)]).int()
            tw = torch.rand(m, k, generator=g)
            al = moe_align(ids, s, 16)
            used = int(al.num_post[0]) // 16
            for kind, n_cols, k_len, kw in (("gate_up", i, h, gu_kw), ("down", h, i, dn_kw)):
                tiles = used * -(-n_cols // kw["block_n"])
                k_tiles = -(-k_len // kw["block_k"])
                for progs in sorted({tiles - 1, 2 * tiles // 3, 3 * tiles // 4, tiles + 3}):
                    cfg = ExpertsConfig(block_m=16, gate_up=GateUpConfig(**gu_kw),
                                        down=DownConfig(**dn_kw), kernel="persistent",
                                        programs=progs, tail_split=True)
                    scratch = tail_scratch(cfg, progs, x.device)
                    scratch.zero.zero_()
                    if kind == "gate_up":
                        act = torch.full((al.max_blocks * 16, i), float("nan"), dtype=dt)
                        gate_up_persistent(x, w13, al, k, GateUpConfig(**gu_kw), programs=progs,
                                           out=act, tail_split=True, tail=scratch,
                                           tail_min_steps=min_steps)
                        err = rel(act[:used * 16], gate_up_torch(x, w13, al, k)[:used * 16])
                        cnt = scratch.zero.view(torch.int32)[:progs]
                    else:
                        act = gate_up_torch(x, w13, al, k)
                        y = torch.full((m * k, h), float("nan"), dtype=dt)
                        down_persistent(act, w2, al, tw, k, DownConfig(**dn_kw), programs=progs,
                                        out=y, tail_split=True, tail=scratch,
                                        tail_min_steps=min_steps)
                        err = rel(y, down_torch(act, w2, al, tw, k, atomic=False))
                        cnt = scratch.zero.view(torch.int32)[scratch.programs:][:progs]
                    emit(kind="tail", name=f"{name}/{kind}/{progs}-of-{tiles}/{dt_name}",
                         dtype=dt_name, err=err, counters=cnt.tolist(),
                         expected=tail_counters(tiles, progs, k_tiles, min_steps))
            # the whole call: counters zeroed by the alignment launch
            cfg = ExpertsConfig(block_m=16, gate_up=GateUpConfig(**gu_kw),
                                down=DownConfig(**dn_kw), kernel="persistent", programs=3,
                                tail_split=True)
            ref = reference_moe(x.double(), w13.double(), w2.double(), tw.double(), ids)
            out = backend(cfg).run_experts(x, w13, w2, tw, ids)
            emit(kind="tail-backend", name=f"{name}/{dt_name}", dtype=dt_name,
                 err=rel(out, ref))

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


def test_tail_split_matches_twins_and_splits(report):
    """The tail split's kernels against the twins, with the split known to have run: each
    tail tile's counter reads its part count (2, 3 and 4 parts among the cases)."""
    rows = rows_of(report, "tail")
    assert len(rows) >= 40
    for r in rows:
        assert r["err"] <= TOL[r["dtype"]], r  # NaN fails: an unwritten row
        assert r["counters"] == r["expected"], r
    assert {max(r["counters"]) for r in rows} >= {0, 2, 3, 4}
    backend_rows = rows_of(report, "tail-backend")
    assert len(backend_rows) == 6
    for r in backend_rows:
        assert r["err"] <= TOL[r["dtype"]], r


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


def _gpu_backend(tail_split=False):
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
                                        num_stages=3), kernel="persistent",
                        tail_split=tail_split)
    return TritonExperts(ConfigTable(overrides={b: cfg for b in range(1, 1 << 15)}))


@pytest.mark.gpu
@pytest.mark.parametrize("tail_split", [False, True])
@pytest.mark.parametrize("intermediate", [1024, 1000])  # 1000: N tail of gate/up's [1, 2, BN,
def test_gpu_bf16_persistent_matches_reference(intermediate, tail_split):  # BK], K tail of down
    from moerun.bench.inputs import reference_rows
    from moerun.testing import rel_err

    _, w, c = _gpu_case(intermediate=intermediate)
    out = _gpu_backend(tail_split).run_experts(c.x, w.w13, w.w2, c.topk_weights, c.topk_ids)
    ref = reference_rows(c.x, w.w13, w.w2, c.topk_weights, c.topk_ids, acc=torch.float64)
    assert rel_err(out, ref) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("tail_split", [False, True])
def test_gpu_persistent_graph_replay_equals_eager(tail_split):
    _, w, c = _gpu_case(T=2048, seed=5)
    be = _gpu_backend(tail_split)
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



@pytest.mark.gpu
@pytest.mark.parametrize("programs", ["sms", "tiles-1", "third"])
def test_gpu_tail_split_kernels(programs):
    """Both persistent kernels with the tail split on the device (the SM count, one tile more
    than the programs, a tail of a third of a round): against the twins, and the counters
    read what ``tail_counters`` says."""
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig
    from moerun.backends.triton.down import down_torch
    from moerun.backends.triton.gate_up import gate_up_torch
    from moerun.backends.triton.persistent import (
        down_persistent,
        gate_up_persistent,
        persistent_programs,
    )
    from moerun.backends.triton.tail_split import TAIL_MAX_PARTS, TAIL_MIN_STEPS, tail_scratch
    from moerun.testing import rel_err

    shape, w, c = _gpu_case(T=1024, seed=7)
    k = shape.top_k
    gu = GateUpConfig(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)
    dn = DownConfig(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3)
    al = moe_align(c.topk_ids, shape.num_experts, 128)
    used = int(al.num_post[0]) // 128
    act_t = gate_up_torch(c.x, w.w13, al, k)
    for kind, tiles, k_len in (("gate_up", used * -(-shape.intermediate // 128), shape.hidden),
                               ("down", used * -(-shape.hidden // 256), shape.intermediate)):
        progs = {"sms": persistent_programs(tiles, c.x.device), "tiles-1": tiles - 1,
                 "third": (3 * tiles) // 4}[programs]
        cfg = ExpertsConfig(block_m=128, gate_up=gu, down=dn, kernel="persistent",
                            programs=progs, tail_split=True)
        scratch = tail_scratch(cfg, progs, c.x.device)
        scratch.zero.zero_()
        if kind == "gate_up":
            act = gate_up_persistent(c.x, w.w13, al, k, gu, programs=progs, tail_split=True,
                                     tail=scratch)
            err = rel_err(act[:used * 128], act_t[:used * 128])
            cnt = scratch.zero.view(torch.int32)[:progs]
        else:
            y = down_persistent(act_t, w.w2, al, c.topk_weights, k, dn, programs=progs,
                                tail_split=True, tail=scratch)
            live = (c.topk_ids >= 0).reshape(-1)
            ref = down_torch(act_t, w.w2, al, c.topk_weights, k, atomic=False)
            err = rel_err(y[live], ref[live])
            cnt = scratch.zero.view(torch.int32)[scratch.programs:][:progs]
        expected = tail_counters(tiles, progs, -(-k_len // 64), TAIL_MIN_STEPS, TAIL_MAX_PARTS)
        assert err <= 1e-2, (kind, err)
        assert cnt.tolist() == expected, (kind, progs, tiles)
        if kind == "gate_up" and programs != "sms":  # 32 K steps: 3-4 parts pay
            assert max(expected) >= 3, (progs, tiles)

if __name__ == "__main__":
    _worker()
