"""TritonExperts on the CPU: kernels under the Triton interpreter, selection in-process.

The interpreter must be chosen before triton is imported, so every kernel check runs in ONE
subprocess started with ``TRITON_INTERPRET=1`` (this file, run as a script, is that worker:
it prints one JSON line per case); the tests below read its report. Grids stay small
(<= 64 programs). Cases, smallest first:

    align   M=3 K=2 S=4 BM=16, ids [[0,2],[2,-1],[-1,-1]] -> slot 0: {0}, slot 2: {1,2},
            slots 1 and 3 empty, 2 blocks used, pair 5 is padding sentinel 6's neighbour
    then sweeps over sizes that are not multiples of any block, experts with zero tokens,
    -1 ids, top_k = 1, E = 1, both combines and split-K, fp32 and fp16.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.interp_worker import emit, rel, rows_of, run_worker

from moerun.backends.base import Deployment, Problem, RejectReason
from moerun.config import Activation
from moerun.env import Env

ROOT = Path(__file__).resolve().parents[1]
# DESIGN 2 bounds against the fp64 reference; kernel-vs-twin bounds (same math, other
# summation order / rounding of the fp16 intermediate)
TOL_BACKEND = {"float32": 1e-5, "float16": 2e-3}
TOL_TWIN = {"float32": 1e-5, "float16": 2e-3}


# ---------------------------------------------------------------- the worker (subprocess)
def _worker() -> None:  # pragma: no cover -- runs in the subprocess
    import time

    from moerun.backends.reference import reference_moe
    from moerun.backends.triton.align import moe_align, moe_align_torch
    from moerun.backends.triton.combine import moe_sum, moe_sum_torch
    from moerun.backends.triton.configs import (ConfigTable, DownConfig, ExpertsConfig,
                                                GateUpConfig)
    from moerun.backends.triton.down import down, down_torch
    from moerun.backends.triton.experts import TritonExperts
    from moerun.backends.triton.gate_up import gate_up, gate_up_torch

    def segments(al):
        """{slot: sorted pair ids} over used blocks, plus per-block slot list."""
        post = int(al.num_post[0])
        seg = {}
        for b in range(post // al.block_m):
            e = int(al.expert_ids[b])
            rows = al.sorted_ids[b * al.block_m:(b + 1) * al.block_m].tolist()
            seg.setdefault(e, []).extend(r for r in rows if r < al.num_pairs)
        return post, {e: sorted(v) for e, v in seg.items()}, al.expert_ids[:post // al.block_m].tolist()

    def check_align(name, ids, S, bm):
        b = moe_align_torch(ids, S, bm)
        pb, sb, eb = segments(b)
        for kernel in ("single", "grid"):  # the grid kernel runs with one program here
            t = time.time()
            zero = torch.full((ids.shape[0], 3), float("nan"))
            a = moe_align(ids, S, bm, zero=zero, programs=1, grid_kernel=kernel == "grid")
            pa, sa, ea = segments(a)
            pads_ok = bool((a.sorted_ids[:pa] <= a.num_pairs).all())
            tail_ok = bool((a.expert_ids[pa // bm:] == -1).all())
            emit(kind="align", name=f"{name}/{kernel}",
                 ok=(pa == pb and sa == sb and ea == eb and pads_ok and tail_ok
                     and a.max_blocks == b.max_blocks and bool((zero == 0).all())),
                 detail=f"post {pa}/{pb} blocks {ea}/{eb}", secs=time.time() - t)

    g = torch.Generator().manual_seed(1234)

    def rnd(*shape, dtype, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    # 1. alignment: the hand-worked case, then sweeps
    check_align("hand", torch.tensor([[0, 2], [2, -1], [-1, -1]], dtype=torch.int32), 4, 16)
    for (m, k, s, bm, drop) in [(7, 2, 5, 16, 0.2), (33, 4, 6, 16, 0.0), (50, 3, 9, 32, 0.3),
                                (1, 1, 1, 16, 0.0), (19, 1, 3, 64, 0.5), (12, 8, 40, 16, 0.1)]:
        ids = torch.randint(0, s, (m, k), generator=g, dtype=torch.int32)
        ids[torch.rand(m, k, generator=g) < drop] = -1
        check_align(f"m{m}k{k}s{s}bm{bm}d{drop}", ids, s, bm)
    ids = torch.full((5, 2), -1, dtype=torch.int32)
    check_align("all-minus-one", ids, 3, 16)
    ids = torch.tensor([[0, 7], [9, 1]], dtype=torch.int32)  # >= S is not local either
    check_align("ids-past-S", ids, 4, 16)

    # 2. kernels vs twins, 3. backend vs reference
    gu_cfg = GateUpConfig(block_n=16, block_k=32)
    cases = [  # (name, M, K, S, H, I, drop, only_slots)
        ("odd-sizes", 7, 2, 5, 40, 24, 0.2, None),
        ("zero-token-experts", 9, 2, 6, 48, 32, 0.0, (0, 2)),
        ("top_k=1", 11, 1, 3, 32, 40, 0.1, None),
        ("E=1", 6, 1, 1, 24, 16, 0.0, None),
        ("M=1", 1, 4, 8, 64, 48, 0.0, None),
    ]
    for dt_name in ("float32", "float16"):
        dt = getattr(torch, dt_name)
        for name, m, k, s, h, i, drop, only in cases:
            t = time.time()
            x = rnd(m, h, dtype=dt)
            w13 = rnd(s, 2 * i, h, dtype=dt, scale=h ** -0.5)
            w2 = rnd(s, h, i, dtype=dt, scale=i ** -0.5)
            if only is None:
                ids = torch.stack([torch.randperm(s, generator=g)[:k] for _ in range(m)])
            else:
                ids = torch.tensor(only)[torch.randint(0, len(only), (m, k), generator=g)]
            ids = ids.to(torch.int32)
            ids[torch.rand(m, k, generator=g) < drop] = -1
            tw = torch.rand(m, k, generator=g)
            al = moe_align(ids, s, 16)
            act = torch.full((al.max_blocks * 16, i), float("nan"), dtype=dt)
            gate_up(x, w13, al, k, gu_cfg, out=act)
            act_t = gate_up_torch(x, w13, al, k)
            used = int(al.num_post[0])
            emit(kind="gate_up", name=f"{name}/{dt_name}",
                 err=rel(act[:used], act_t[:used]), dtype=dt_name)
            act_s = torch.full_like(act, float("nan"))  # ExpertsConfig.swap_ab: W x^T
            gate_up(x, w13, al, k, gu_cfg, out=act_s, swap_ab=True)
            emit(kind="gate_up", name=f"{name}/{dt_name}/swap",
                 err=rel(act_s[:used], act_t[:used]), dtype=dt_name)
            dn_cfg = DownConfig(block_n=16, block_k=16)
            y = torch.full((m * k, h), float("nan"), dtype=dt)
            down(act, w2, al, tw, k, dn_cfg, out=y)
            y_t = down_torch(act, w2, al, tw, k, atomic=False)
            live = ((ids >= 0) & (ids < s)).reshape(-1)
            emit(kind="down", name=f"{name}/{dt_name}/rows", err=rel(y[live], y_t[live]),
                 dtype=dt_name)
            acc = torch.zeros(m, h)
            down(act, w2, al, tw, k, DownConfig(block_n=16, block_k=16, split_k=2),
                 atomic_out=acc)
            emit(kind="down", name=f"{name}/{dt_name}/atomic-splitk",
                 err=rel(acc, down_torch(act, w2, al, tw, k, atomic=True)), dtype=dt_name)
            y_s = torch.full((m * k, h), float("nan"), dtype=dt)
            down(act, w2, al, tw, k, dn_cfg, out=y_s, swap_ab=True)
            emit(kind="down", name=f"{name}/{dt_name}/rows/swap", err=rel(y_s[live], y_t[live]),
                 dtype=dt_name)
            acc = torch.zeros(m, h)
            down(act, w2, al, tw, k, DownConfig(block_n=16, block_k=16, split_k=2),
                 atomic_out=acc, swap_ab=True)
            emit(kind="down", name=f"{name}/{dt_name}/atomic-splitk/swap",
                 err=rel(acc, down_torch(act, w2, al, tw, k, atomic=True)), dtype=dt_name)
            out_sum = torch.full((m, h), float("nan"), dtype=dt)
            moe_sum(y, ids, s, out=out_sum)
            emit(kind="moe_sum", name=f"{name}/{dt_name}",
                 err=rel(out_sum, moe_sum_torch(torch.where(live[:, None], y, 0), ids, s)),
                 dtype=dt_name)
            # the same rows at other positions of a longer y (NaN elsewhere), found by a map
            perm = torch.randperm(m * k + 5, generator=g)[:m * k].int()
            y_far = torch.full((m * k + 5, h), float("nan"), dtype=dt)
            y_far[perm[live].long()] = y[live]
            emit(kind="moe_sum", name=f"{name}/{dt_name}/rows",
                 err=rel(moe_sum(y_far, ids, s, rows=perm),
                         moe_sum_torch(torch.where(live[:, None], y, 0), ids, s)),
                 dtype=dt_name)
            ref = reference_moe(x.double(), w13.double(), w2.double(), tw.double(), ids)
            for combine, split, swap in (("reduce", 1, False), ("atomic", 1, False),
                                         ("atomic", 2, False), ("reduce", 1, True)):
                cfg = ExpertsConfig(block_m=16, gate_up=gu_cfg,
                                    down=DownConfig(block_n=16, block_k=16, split_k=split),
                                    combine=combine, swap_ab=swap)
                be = TritonExperts(ConfigTable(overrides={b: cfg for b in range(1, 64)}))
                out = be.run_experts(x, w13, w2, tw, ids)
                emit(kind="backend",
                     name=f"{name}/{dt_name}/{combine}x{split}{'/swap' if swap else ''}",
                     err=rel(out, ref), dtype=dt_name, out_dtype=str(out.dtype),
                     shape=list(out.shape))
            emit(kind="timing", name=f"{name}/{dt_name}", secs=time.time() - t)
    # 4. the fused shared expert (FUSED order): n = Is / I extra slots read from the shared
    #    expert's own [2Is, H] / [H, Is] tensors; rows 0..m-2 visit them, row m-1 does not
    from moerun.backends.base import FusedShared

    for n in (1, 2):
        m, k, s, h, i = 9, 2, 5, 48, 16
        x = rnd(m, h, dtype=torch.float32)
        w13 = rnd(s, 2 * i, h, dtype=torch.float32, scale=h ** -0.5)
        w2 = rnd(s, h, i, dtype=torch.float32, scale=i ** -0.5)
        sh = FusedShared(w13=rnd(2 * n * i, h, dtype=torch.float32, scale=h ** -0.5),
                         w2=rnd(h, n * i, dtype=torch.float32, scale=(n * i) ** -0.5),
                         first_slot=s, num_slots=n)
        routed = torch.stack([torch.randperm(s, generator=g)[:k] for _ in range(m)]).int()
        cols = torch.arange(s, s + n, dtype=torch.int32).expand(m, n).clone()
        cols[-1] = -1
        ids = torch.cat([routed, cols], dim=1)
        tw = torch.cat([torch.rand(m, k, generator=g), torch.ones(m, n)], dim=1)
        ref = reference_moe(x.double(), w13.double(), w2.double(), tw.double(), ids,
                            FusedShared(w13=sh.w13.double(), w2=sh.w2.double(),
                                        first_slot=s, num_slots=n))
        al = moe_align(ids, s + n, 16)
        act = torch.full((al.max_blocks * 16, i), float("nan"))
        gate_up(x, w13, al, k + n, gu_cfg, out=act, shared=sh)
        used = int(al.num_post[0])
        emit(kind="fused", name=f"n{n}/gate_up-vs-twin", dtype="float32",
             err=rel(act[:used], gate_up_torch(x, w13, al, k + n, shared=sh)[:used]))
        for combine in ("reduce", "atomic"):
            cfg = ExpertsConfig(block_m=16, gate_up=gu_cfg, down=DownConfig(block_n=16,
                                block_k=16), combine=combine)
            be = TritonExperts(ConfigTable(overrides={b: cfg for b in range(1, 64)}))
            out = be.run_experts(x, w13, w2, tw, ids, shared=sh)
            emit(kind="fused", name=f"n{n}/{combine}/backend-vs-reference", dtype="float32",
                 err=rel(out, ref))
    # default (heuristic) config path and a bigger block_m
    x = rnd(20, 64, dtype=torch.float32)
    w13 = rnd(4, 64, 64, dtype=torch.float32, scale=0.125)
    w2 = rnd(4, 64, 32, dtype=torch.float32, scale=0.18)
    ids = torch.randint(0, 4, (20, 2), generator=g).to(torch.int32)
    tw = torch.rand(20, 2, generator=g)
    ref = reference_moe(x.double(), w13.double(), w2.double(), tw.double(), ids)
    out = TritonExperts().run_experts(x, w13, w2, tw, ids.long())  # int64 ids accepted
    emit(kind="backend", name="default-config/int64-ids", err=rel(out, ref), dtype="float32",
         out_dtype=str(out.dtype), shape=list(out.shape))
    out = TritonExperts().run_experts(x[:0], w13, w2, tw[:0], ids[:0])
    emit(kind="empty", name="M=0", shape=list(out.shape), out_dtype=str(out.dtype))


@pytest.fixture(scope="module")
def report():
    return run_worker(__file__, timeout=240)


_rows = rows_of


def test_align_matches_twin(report):
    bad = [r for r in _rows(report, "align") if not r["ok"]]
    assert not bad, bad


def test_fused_shared_expert_slots(report):
    rows = _rows(report, "fused")
    assert len(rows) == 6
    for r in rows:
        assert r["err"] <= TOL_BACKEND[r["dtype"]], r


@pytest.mark.parametrize("kind", ["gate_up", "down", "moe_sum"])
def test_kernels_match_twins(report, kind):
    rows = _rows(report, kind)
    for r in rows:
        assert r["err"] <= TOL_TWIN[r["dtype"]], r  # NaN fails: unwritten rows
    if kind != "moe_sum":  # ExpertsConfig.swap_ab's form of each kernel, every case
        assert sum(r["name"].endswith("/swap") for r in rows) == (10 if kind == "gate_up"
                                                                   else 20)


def test_backend_matches_reference(report):
    rows = _rows(report, "backend")
    assert len(rows) >= 40 and sum(r["name"].endswith("/swap") for r in rows) == 10
    for r in rows:
        assert r["err"] <= TOL_BACKEND[r["dtype"]], r
        assert r["out_dtype"] == f"torch.{r['dtype']}", r


def test_empty_input(report):
    (r,) = _rows(report, "empty")
    assert r["shape"] == [0, 64] and r["out_dtype"] == "torch.float32"


def test_each_case_is_quick(report):
    for r in _rows(report, "timing"):
        assert r["secs"] < 10, r


# ---------------------------------------------------------------- in-process: selection
def _env(**kw) -> Env:
    base = dict(torch_version="2.x", cuda_available=False, device_capability=None,
                device_name="cpu", num_gpus=0, triton_version="3.6.0", nvtx_version=None,
                deep_ep_version=None, transformers_version=None, triton_interpret=False,
                has_grouped_mm=True)
    base.update(kw)
    return Env(**base)


def _problem(dtype=torch.float32, device="cpu") -> Problem:
    return Problem(num_experts=8, num_slots=8, top_k=2, hidden_size=64, intermediate_size=32,
                   dtype=dtype, activation=Activation.SILU_GLU, device_type=device)


DEP = Deployment(rank=0, world_size=1, comm_backend="none", num_local_slots=8, divisible=True)
H100 = dict(cuda_available=True, device_capability=(9, 0), device_name="NVIDIA H200",
            num_gpus=1)


@pytest.mark.parametrize("problem, env, reason, match", [
    (_problem(), _env(triton_version=None), RejectReason.PACKAGE_MISSING, "pip install"),
    (_problem(), _env(), RejectReason.INTERPRETER, "TRITON_INTERPRET=1"),
    (_problem(torch.bfloat16), _env(triton_interpret=True), RejectReason.INTERPRETER,
     "bfloat16"),
    (_problem(torch.float64), _env(triton_interpret=True), RejectReason.DTYPE, "float64"),
    (_problem(device="cuda"), _env(), RejectReason.DEVICE, "sm80"),
    (_problem(device="cuda"), _env(cuda_available=True, device_capability=(7, 5),
                                   device_name="T4", num_gpus=1), RejectReason.DEVICE, "sm80"),
    (_problem(device="cuda"), _env(triton_interpret=True, **H100), RejectReason.INTERPRETER,
     "unset"),
    (_problem(device="mps"), _env(), RejectReason.DEVICE, "mps"),
])
def test_can_implement_rejects(problem, env, reason, match):
    from moerun.backends.triton import TritonExperts

    got = TritonExperts.can_implement(problem, DEP, env)
    assert not got.ok and got.reason == reason
    assert match in got.detail


@pytest.mark.parametrize("problem, env", [
    (_problem(torch.float32), _env(triton_interpret=True)),
    (_problem(torch.float16), _env(triton_interpret=True)),
    (_problem(torch.bfloat16, "cuda"), _env(**H100)),
    (_problem(torch.float32, "cuda"), _env(**H100)),
])
def test_can_implement_accepts(problem, env):
    from moerun.backends.triton import TritonExperts

    assert TritonExperts.can_implement(problem, DEP, env).ok
    assert TritonExperts.name == "triton"


def test_package_imports_without_triton():
    code = ("import sys; sys.modules['triton'] = None\n"
            "import moerun, moerun.backends.triton as t\n"
            "from moerun.backends.triton.configs import ConfigTable, default_config\n"
            "assert t.TritonExperts.name == 'triton'\n"
            "print(default_config(8, 64, 64, 16, 2).key())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


# ---------------------------------------------------------------- in-process: configs
def test_buckets_and_default_configs():
    from moerun.backends.triton.configs import bucket_of, default_config, fit_to_dtype

    assert [bucket_of(t) for t in (1, 2, 3, 16, 17, 1024, 8192, 10 ** 6)] == \
        [1, 2, 4, 16, 32, 1024, 8192, 16384]
    small = default_config(256, 2048, 7168, 1, 8)
    assert small.block_m == 16 and small.combine == "atomic"
    big = default_config(8, 14336, 4096, 8192, 2)
    assert big.block_m == 128 and big.combine == "reduce"
    f32 = fit_to_dtype(big, torch.float32)
    assert f32.gate_up.smem_bytes(f32.block_m, 4) <= 200 * 1024
    assert f32.down.smem_bytes(f32.block_m, 4) <= 200 * 1024


def test_config_validation_messages():
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig

    gu, dn = GateUpConfig(block_n=64, block_k=64), DownConfig(block_n=64, block_k=64)
    with pytest.raises(ValueError, match="block_m=48"):
        ExpertsConfig(block_m=48, gate_up=gu, down=dn)
    with pytest.raises(ValueError, match="combine='sum'"):
        ExpertsConfig(block_m=16, gate_up=gu, down=dn, combine="sum")
    with pytest.raises(ValueError, match="split_k > 1 needs combine='atomic'"):
        ExpertsConfig(block_m=16, gate_up=gu, down=DownConfig(block_n=64, block_k=64, split_k=2))


def test_tuned_config_files():
    """Every shipped JSON parses, names its command/date/device, is named by its own key
    (local slots, N, K, dtype, device) and covers the bench T list of the shape it was tuned
    on; the four model shapes are shipped in bf16 and fp8, and the lookup returns each entry
    as tuned. Files are written by ``moerun tune`` (fp8: ``--dtype fp8``); the fp8 files
    shipped before it were written by the fp8 sweep script ``benchmarks/fp8_sweep.py``
    (removed; last in commit 4f699d5), whose command their meta keeps."""
    from moerun.backends.triton.configs import (CONFIG_DIR, ConfigTable, bucket_of,
                                                config_file_name, fit_to_dtype,
                                                load_config_file)
    from moerun.bench.shapes import SHAPES

    files = sorted(CONFIG_DIR.glob("*.json"))
    assert files, "no tuned configs shipped"
    by_name = {}
    for f in files:
        loaded = load_config_file(f)
        meta, entries = loaded.meta, loaded.entries
        fp8 = meta["dtype"] == "float8_e4m3fn"
        command = meta.get("command", "")
        assert "tune" in command or (fp8 and "benchmarks/fp8_sweep.py" in command), f
        assert meta.get("date") and meta.get("device"), f
        assert entries, f
        shape = meta["shape"]
        slots = shape.get("S", shape.get("E"))  # files before issue 11 wrote E (= S, one rank)
        assert f.name == config_file_name(slots, shape["I"], shape["H"], meta["dtype"],
                                          meta["device"]), f
        by_name[(shape["name"], meta["dtype"])] = (f, meta, entries)
    for name in ("mixtral8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3"):
        assert (name, "bfloat16") in by_name and (name, "float8_e4m3fn") in by_name, name
    for (name, dname), (f, meta, entries) in by_name.items():
        dtype = getattr(torch, dname)
        s = SHAPES.get(name)
        if s is None:  # an E:K:H:I shape: no registered T list to cover
            continue
        table = ConfigTable(device_name=meta["device"])
        for t in s.tokens:
            assert bucket_of(t) in entries, (name, t)
            got = table.lookup(s.num_experts, s.intermediate, s.hidden, t, s.top_k, dtype)
            # the run-time config is the entry fitted to the shared-memory limit (fp8: as is)
            assert got.config == fit_to_dtype(entries[bucket_of(t)], dtype)
            assert got.source == f"tuned ({f.name})" and got.entry_bucket == bucket_of(t)


def test_tune_candidates_are_pruned():
    from moerun.backends.triton.tune_plan import MAX_CONFIGS, candidates
    from moerun.bench.shapes import SHAPES

    for s in SHAPES.values():
        for t in s.tokens:
            c = candidates(s.num_experts, s.top_k, s.hidden, s.intermediate, t)
            n = sum(cs.size for cs in c) + 1  # + the incumbent
            assert 2 <= n <= MAX_CONFIGS, (s.name, t, n)
            assert all(cs.gate_ups and cs.downs for cs in c), (s.name, t)


def test_tune_rejects_unknown_shape(capsys):
    from moerun.backends.triton.tune import main

    assert main(["--shapes", "llama", "--plan", "--device-name", "X"]) == 2
    assert "unknown shape 'llama'" in capsys.readouterr().err


if __name__ == "__main__":
    _worker()
