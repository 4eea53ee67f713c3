"""TritonExperts on a CUDA GPU (``gpu`` marker; the conftest skips these without CUDA).

bf16/fp16/fp32 at the benchmark shapes against the fp64 reference (fp32: TF32 off), every
combine and split-K, sizes that are not multiples of any tile, the alignment kernel against
its twin at decode and prefill sizes, and CUDA-graph capture + replay with new routings
copied into the captured buffers. Outputs are allocated on a NaN-poisoned allocator.
Shapes, inputs and the upcast reference are ``moerun.bench``'s (the one benchmark stack), the
EP-local shapes included.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.gpu

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
_WEIGHTS: dict = {}
CUDA = torch.device("cuda")


def _weights(name, dtype):
    from moerun.bench.inputs import make_weights
    from moerun.bench.shapes import SHAPES

    key = (name, dtype)
    if key not in _WEIGHTS:
        _WEIGHTS.clear()
        torch.cuda.empty_cache()
        w = make_weights(SHAPES[name], dtype, CUDA, seed=7)
        _WEIGHTS[key] = (w.w13, w.w2)
    return _WEIGHTS[key]


def _case(shape, T, dtype=torch.bfloat16, seed=0, drop=0.0):
    from moerun.bench.inputs import make_case

    return make_case(shape, T, dtype, CUDA, seed=seed, drop=drop)


def _reference(c, w13, w2):
    """fp64 reference of every row (``moerun.bench.inputs.reference_rows``)."""
    from moerun.bench.inputs import reference_rows

    return reference_rows(c.x, w13, w2, c.topk_weights, c.topk_ids, acc=torch.float64)


def _rel_err(out, ref) -> float:
    from moerun.testing import rel_err

    return rel_err(out, ref)  # NaN (an unwritten, poisoned element) fails every bound


def _poison_allocator(nbytes: int) -> None:
    """Fill ``nbytes`` of fresh caching-allocator memory with NaN and free it, so buffers the
    next call allocates start as NaN (unwritten elements then show up in the error)."""
    t = torch.empty(max(1, nbytes // 4), dtype=torch.float32, device=CUDA)
    t.fill_(float("nan"))
    del t


def _check(name, dtype, T, backend=None, drop=0.0, seed=0):
    from moerun.backends.triton import TritonExperts
    from moerun.bench.shapes import SHAPES

    shape = SHAPES[name]
    w13, w2 = _weights(name, dtype)
    c = _case(shape, T, dtype, seed=seed, drop=drop)
    _poison_allocator(1 << 28)
    out = (backend or TritonExperts()).run_experts(c.x, w13, w2, c.topk_weights, c.topk_ids)
    assert out.dtype == dtype and out.shape == (T, shape.hidden)
    err = _rel_err(out, _reference(c, w13, w2))
    assert err <= TOL[dtype], (name, dtype, T, err)
    return err


@pytest.mark.parametrize("name", ["mixtral8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b",
                                  "deepseek-v3"])
@pytest.mark.parametrize("T", [1, 37, 300])
def test_bf16_benchmark_shapes(name, T):
    _check(name, torch.bfloat16, T, drop=0.1 if T == 37 else 0.0)


@pytest.mark.parametrize("name", ["mixtral8x7b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("T, block_m, combine", [(16, 16, "atomic"), (128, 32, "reduce")])
def test_swap_ab_grouped_tiles(name, T, block_m, combine):
    """``ExpertsConfig.swap_ab`` on the grouped kernels at 16/32-row tiles (``W x^T``: wgmma
    with the weight rows on M) against the fp64 reference, some pairs excluded."""
    from moerun.backends.triton import TritonExperts
    from moerun.backends.triton.configs import (ConfigTable, DownConfig, ExpertsConfig,
                                                GateUpConfig)

    cfg = ExpertsConfig(block_m=block_m, gate_up=GateUpConfig(block_n=64, block_k=128),
                        down=DownConfig(block_n=128, block_k=64, num_stages=3),
                        combine=combine, swap_ab=True)
    be = TritonExperts(ConfigTable(overrides={b: cfg for b in (16, 128)}))
    _check(name, torch.bfloat16, T, backend=be, drop=0.1, seed=T)


@pytest.mark.parametrize("name", ["deepseek-v3-ep8-local", "qwen3-235b-ep8-local"])
@pytest.mark.parametrize("T", [256, 2048])
def test_bf16_ep_local_shapes(name, T):
    """The EP-local cells (local slots = 32 / 16), whatever config source they resolve to."""
    _check(name, torch.bfloat16, T)


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral8x7b"])
@pytest.mark.parametrize("T", [1, 100])
def test_fp16_benchmark_shapes(name, T):
    _check(name, torch.float16, T)


@pytest.mark.parametrize("name, T", [("qwen3-30b-a3b", 1), ("qwen3-30b-a3b", 64),
                                     ("mixtral8x7b", 16)])
def test_fp32_ieee(name, T):
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        _check(name, torch.float32, T)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("combine, split, bm", [("reduce", 1, 16), ("atomic", 1, 64),
                                                ("atomic", 4, 16), ("reduce", 1, 128)])
def test_every_combine_odd_sizes(dtype, combine, split, bm):
    """H, I not multiples of any tile; zero-token experts; -1 ids."""
    from moerun.backends.reference import reference_moe
    from moerun.backends.triton import TritonExperts
    from moerun.backends.triton.configs import (ConfigTable, DownConfig, ExpertsConfig,
                                                GateUpConfig)

    g = torch.Generator(device="cuda").manual_seed(3)
    m, k, s, h, i = 203, 3, 10, 200, 136
    x = torch.randn(m, h, device="cuda", generator=g).to(dtype)
    w13 = (torch.randn(s, 2 * i, h, device="cuda", generator=g) * h ** -0.5).to(dtype)
    w2 = (torch.randn(s, h, i, device="cuda", generator=g) * i ** -0.5).to(dtype)
    ids = torch.randint(0, s - 3, (m, k), device="cuda", generator=g).to(torch.int32)
    ids[torch.rand(m, k, device="cuda", generator=g) < 0.2] = -1
    tw = torch.rand(m, k, device="cuda", generator=g)
    cfg = ExpertsConfig(block_m=bm, gate_up=GateUpConfig(block_n=64, block_k=64, num_stages=3),
                        down=DownConfig(block_n=64, block_k=32, split_k=split, num_stages=3),
                        combine=combine)
    be = TritonExperts(ConfigTable(overrides={b: cfg for b in (128, 256)}))
    _poison_allocator(1 << 26)
    out = be.run_experts(x, w13, w2, tw, ids)
    ref = reference_moe(x.double(), w13.double(), w2.double(), tw.double(), ids)
    assert _rel_err(out, ref) <= TOL[dtype]


@pytest.mark.parametrize("m, k, s, bm, programs, grid_kernel", [
    (1, 8, 256, 16, None, None), (16, 8, 128, 16, None, None), (8192, 8, 256, 128, None, None),
    (8192, 2, 8, 64, None, None), (3000, 1, 1, 32, None, None), (40000, 8, 384, 64, None, None),
    (8192, 8, 256, 128, 1, False), (100, 8, 64, 16, 3, True), (1024, 8, 128, 16, 1, True)])
def test_align_matches_twin_on_gpu(m, k, s, bm, programs, grid_kernel):
    from moerun.backends.triton.align import moe_align, moe_align_torch

    g = torch.Generator(device="cuda").manual_seed(m)
    ids = torch.randint(0, s, (m, k), device="cuda", generator=g).to(torch.int32)
    ids[torch.rand(m, k, device="cuda", generator=g) < 0.1] = -1
    acc = torch.full((m, 64), float("nan"), device="cuda")
    a = moe_align(ids, s, bm, zero=acc, programs=programs, grid_kernel=grid_kernel)
    b = moe_align_torch(ids, s, bm)
    assert bool((acc == 0).all())
    post = int(a.num_post[0])
    assert post == int(b.num_post[0])
    assert torch.equal(a.expert_ids, b.expert_ids)
    # same pair set per block (order inside a slot's segment is free)
    sa = a.sorted_ids[:post].view(-1, bm).sort(1).values
    sb = b.sorted_ids[:post].view(-1, bm).sort(1).values
    ea = a.expert_ids[:post // bm]
    for e in torch.unique(ea).tolist():
        rows = ea == e
        assert torch.equal(sa[rows].flatten().sort().values, sb[rows].flatten().sort().values)


def _capture_and_replay(be, w13, w2, cases, x, tw, ids, tol):
    """Capture ``be.run_experts`` on the buffers ``x, tw, ids`` (warmed up already), then
    for each case copy its inputs in, replay into a NaN-filled output and compare with the
    fp64 reference."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = be.run_experts(x, w13, w2, tw, ids)
    for c in cases:
        x.copy_(c.x)
        tw.copy_(c.topk_weights)
        ids.copy_(c.topk_ids)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        err = _rel_err(out, _reference(c, w13, w2))
        assert err <= tol, (tuple(x.shape), err)


def test_cuda_graph_capture_and_replay():
    from moerun.backends.triton import TritonExperts
    from moerun.bench.shapes import SHAPES

    shape = SHAPES["qwen3-30b-a3b"]
    w13, w2 = _weights(shape.name, torch.bfloat16)
    be = TritonExperts()
    for T in (1, 16, 128):
        cases = [_case(shape, T, seed=50 + r) for r in range(3)]
        x, tw, ids = (cases[0].x.clone(), cases[0].topk_weights.clone(),
                      cases[0].topk_ids.clone())
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            be.run_experts(x, w13, w2, tw, ids)  # warm-up (compile) outside capture
        torch.cuda.current_stream().wait_stream(s)
        _capture_and_replay(be, w13, w2, cases, x, tw, ids, TOL[torch.bfloat16])


@pytest.mark.parametrize("name", ["mixtral8x7b", "qwen3-30b-a3b", "deepseek-v3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("combine", ["reduce", "atomic"])
@pytest.mark.parametrize("swap", [False, True])
def test_direct_decode_path(name, dtype, combine, swap):
    """``kernel="direct"`` (no alignment, 2 launches; the per-token and the per-pair down;
    ``swap_ab`` off and on) at T = 1..4 of the bench shapes, some pairs excluded, against the
    fp64 reference; then captured in a CUDA graph and replayed with new routings copied into
    the captured buffers (the per-pair form's counters are zeroed inside every replay)."""
    from moerun.backends.triton import TritonExperts
    from moerun.backends.triton.configs import (ConfigTable, DownConfig, ExpertsConfig,
                                                GateUpConfig)
    from moerun.bench.shapes import SHAPES

    cfg = ExpertsConfig(block_m=16, gate_up=GateUpConfig(block_n=64, block_k=128),
                        down=DownConfig(block_n=64 if swap else 32, block_k=128),
                        combine=combine, kernel="direct", swap_ab=swap)
    be = TritonExperts(ConfigTable(overrides={b: cfg for b in (1, 2, 4)}))
    for T in (1, 3, 4):
        _check(name, dtype, T, backend=be, drop=0.25 if T > 1 else 0.0, seed=T)
    shape = SHAPES[name]
    w13, w2 = _weights(name, dtype)
    cases = [_case(shape, 2, dtype, seed=70 + r, drop=0.2) for r in range(3)]
    x, tw, ids = (cases[0].x.clone(), cases[0].topk_weights.clone(),
                  cases[0].topk_ids.clone())
    be.run_experts(x, w13, w2, tw, ids)
    torch.cuda.synchronize()
    _capture_and_replay(be, w13, w2, cases, x, tw, ids, TOL[dtype])


@pytest.mark.parametrize("name, T, kernel", [
    ("qwen3-30b-a3b", 2, "direct"), ("qwen3-30b-a3b", 16, "grouped"),
    ("mixtral8x7b", 300, "grouped"), ("qwen3-235b-ep8-local", 2048, "persistent")])
def test_pdl_launches_equal_serialized_launches(monkeypatch, name, T, kernel):
    """Programmatic dependent launch (``moerun._triton.pdl``, on for sm90+) changes when a
    kernel's blocks start, never what it computes: the call's kernels are compiled with
    ``launch_pdl``, and the output equals the serialized launches' bit for bit, eager and in
    a replayed CUDA graph (new routings copied in)."""
    from moerun._triton import launch as launch_mod
    from moerun._triton.pdl import pdl_enabled
    from moerun.backends.triton import TritonExperts, gate_up
    from moerun.backends.triton.configs import (ConfigTable, DownConfig, ExpertsConfig,
                                                GateUpConfig, bucket_of)
    from moerun.bench.shapes import SHAPES

    assert pdl_enabled(torch.cuda.current_device()), "PDL is on for an sm90+ GPU"
    if kernel == "direct":
        cfg = ExpertsConfig(block_m=16, gate_up=GateUpConfig(block_n=64, block_k=128),
                            down=DownConfig(block_n=64, block_k=128), combine="atomic",
                            kernel="direct")
    elif kernel == "persistent":
        cfg = ExpertsConfig(block_m=128, gate_up=GateUpConfig(block_n=128, block_k=64,
                                                              group_m=8, num_warps=8),
                            down=DownConfig(block_n=256, block_k=64, group_m=8, num_warps=8),
                            combine="reduce", kernel="persistent")
    else:  # the shipped table's entry, with the sum made order-independent: the grouped
        # "atomic" combine adds fp32 rows in arrival order, so two runs of it may differ in
        # the last bit whatever PDL does (this test failed so once, 2026-12-02 06:12 UTC)
        shipped = TritonExperts().config_for(SHAPES[name].num_experts,
                                             SHAPES[name].intermediate, SHAPES[name].hidden,
                                             T, SHAPES[name].top_k, torch.bfloat16)
        cfg = shipped if shipped.combine == "reduce" or shipped.down.split_k > 1 else \
            dataclasses.replace(shipped, combine="reduce")
        assert cfg.combine == "reduce", cfg
    table = ConfigTable(overrides={bucket_of(T): cfg})
    shape = SHAPES[name]
    w13, w2 = _weights(name, torch.bfloat16)
    c = _case(shape, T, seed=11, drop=0.1)
    out_pdl = TritonExperts(table).run_experts(c.x, w13, w2, c.topk_weights, c.topk_ids)
    torch.cuda.synchronize()
    launchers = [v for v in vars(gate_up).values() if isinstance(v, launch_mod.FastLauncher)]
    assert any(entry[3] for f in launchers for entry in f._cache.values()), \
        "gate/up was launched with programmatic stream serialization"
    with monkeypatch.context() as m:
        m.setattr(launch_mod, "pdl_enabled", lambda device: False)
        out_ser = TritonExperts(table).run_experts(c.x, w13, w2, c.topk_weights, c.topk_ids)
    torch.cuda.synchronize()
    assert torch.equal(out_pdl, out_ser)
    assert _rel_err(out_pdl, _reference(c, w13, w2)) <= TOL[torch.bfloat16]
    cases = [_case(shape, T, seed=90 + r, drop=0.1) for r in range(2)]
    x, tw, ids = (cases[0].x.clone(), cases[0].topk_weights.clone(),
                  cases[0].topk_ids.clone())
    be = TritonExperts(table)
    be.run_experts(x, w13, w2, tw, ids)
    torch.cuda.synchronize()
    _capture_and_replay(be, w13, w2, cases, x, tw, ids, TOL[torch.bfloat16])


def test_capture_at_prefill_size():
    """The whole call is capturable for every bucket's config at a prefill size too."""
    from moerun.backends.triton import TritonExperts
    from moerun.bench.shapes import SHAPES

    shape = SHAPES["mixtral8x7b"]
    w13, w2 = _weights(shape.name, torch.bfloat16)
    c = _case(shape, 1024, seed=9)
    be = TritonExperts()
    be.run_experts(c.x, w13, w2, c.topk_weights, c.topk_ids)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = be.run_experts(c.x, w13, w2, c.topk_weights, c.topk_ids)
    graph.replay()
    assert _rel_err(out, _reference(c, w13, w2)) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("slots, world", [(256, 1), (32, 8)])
def test_report_names_the_config_source_of_the_local_shape(slots, world):
    """DeepSeek-V3 on one rank (256 local slots) and one rank of EP8 (32): the report's
    kernel-config lines name this device's file of exactly that slot count, or the heuristic."""
    from moerun.backends.triton.configs import CONFIG_DIR, config_file_name
    from moerun.capability import Deployment, Problem
    from moerun.config import Activation
    from moerun.env import get_env
    from moerun.resolve import resolve

    env = get_env()
    problem = Problem(num_experts=256, num_slots=256, top_k=8, hidden_size=7168,
                      intermediate_size=2048, dtype=torch.bfloat16,
                      activation=Activation.SILU_GLU, device_type="cuda")
    deployment = Deployment(rank=0, world_size=world, comm_backend="nccl" if world > 1
                            else "none", num_local_slots=slots, divisible=True)
    report = resolve(problem, deployment, env, backend="triton",
                     comm="allgather" if world > 1 else "auto")
    name = config_file_name(slots, 2048, 7168, "bfloat16", env.device_name)
    want = f"tuned ({name})" if (CONFIG_DIR / name).exists() else "heuristic"
    assert report.kernel_configs[0].startswith(f"S_local={slots} ")
    assert report.kernel_configs[1:] and all(want in ln for ln in report.kernel_configs[1:])
