"""Launch programs on the GPU (issue 8): the replayed expert and routing calls compute what
the plain calls compute.

``TritonExperts.run_experts`` and ``TritonRouter`` record a launch program on the first call
of a shape and replay it afterwards. Each test feeds the replay *fresh* inputs of the
recorded shape and compares it with the plain path on the same inputs (bit for bit where the
kernels are deterministic) and with the fp64 reference of ``moerun.testing``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moerun import fused_experts
from moerun.testing import TOL, rel_err

pytestmark = pytest.mark.gpu

TOL_ATOMIC = 2e-3  # fp32 atomics in the down GEMM add in another order: a few bf16 ulps


def _weights(g, e, h, i, dtype):
    w13 = (torch.randn(e, 2 * i, h, generator=g) * h ** -0.5).to(dtype).cuda()
    w2 = (torch.randn(e, h, i, generator=g) * i ** -0.5).to(dtype).cuda()
    return w13, w2


def _inputs(g, t, e, k, h, i, dtype, ids_dtype=torch.int32):
    x = torch.randn(t, h, generator=g).to(dtype).cuda()
    w = torch.rand(t, k, generator=g).cuda()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(ids_dtype)
    return x, w, ids.cuda()


@pytest.mark.parametrize("t,e,k,h,i,dtype,ids_dtype", [
    (1, 128, 8, 256, 128, torch.bfloat16, torch.int32),     # decode: single align program
    (33, 16, 4, 256, 128, torch.bfloat16, torch.int32),
    (1024, 64, 8, 256, 128, torch.bfloat16, torch.int32),   # > 1024 pairs: grid align + memset
    (40, 8, 2, 128, 64, torch.float32, torch.int32),         # fp32: atomic combine, 3 launches
    (20, 16, 4, 128, 64, torch.float16, torch.int64),        # int64 ids: a cast in the program
])
def test_replayed_experts_equal_the_plain_call(t, e, k, h, i, dtype, ids_dtype):
    from moerun.backends.triton import TritonExperts

    g = torch.Generator().manual_seed(t + e)
    w13, w2 = _weights(g, e, h, i, dtype)
    backend = TritonExperts()
    first_inputs = _rot(_inputs(g, t, e, k, h, i, dtype, ids_dtype), w13, w2)
    first = backend.run_experts(*first_inputs)
    assert backend._programs.get(next(iter(backend._programs._entries))) is False  # seen once
    backend.run_experts(*first_inputs)  # the second call records
    (program,) = backend._programs._entries.values()
    assert program is not None, "the call was refused a program"
    assert program.num_launches in (3, 4)
    cfg = backend.config_for(e, i, h, t, k, dtype)
    exact = cfg.combine != "atomic"
    for _ in range(3):  # fresh inputs of the recorded shape
        x, w, ids = _inputs(g, t, e, k, h, i, dtype, ids_dtype)
        replay = backend.run_experts(x, w13, w2, w, ids)
        plain = backend._run_plain(x, w13, w2, w, ids, None, None)
        torch.cuda.synchronize()
        assert replay.dtype == dtype and replay.shape == (t, h)
        if exact:
            assert torch.equal(replay, plain)
        else:
            assert rel_err(replay.float().cpu(), plain.double().cpu()) < TOL_ATOMIC
        ref = fused_experts(x.double().cpu(), w13.double().cpu(), w2.double().cpu(), w.cpu(),
                            ids.cpu(), backend="reference")
        assert rel_err(replay.cpu(), ref) < TOL[dtype]
    assert len(backend._programs) == 1 and first.shape == (t, h)


def _rot(inputs, w13, w2):
    x, w, ids = inputs
    return x, w13, w2, w, ids


def test_a_misaligned_input_gets_its_own_program_and_hooks_get_the_plain_path():
    from triton import knobs

    from moerun.backends.triton import TritonExperts

    g = torch.Generator().manual_seed(5)
    t, e, k, h, i = 17, 16, 4, 256, 128
    w13, w2 = _weights(g, e, h, i, torch.bfloat16)
    x, w, ids = _inputs(g, t, e, k, h, i, torch.bfloat16)
    backend = TritonExperts()
    for _ in range(2):  # the second call records
        backend.run_experts(x, w13, w2, w, ids)
    x_off = torch.empty(t * h + 1, dtype=torch.bfloat16, device="cuda")[1:].view(t, h)
    x_off.copy_(x)
    for _ in range(2):
        off = backend.run_experts(x_off, w13, w2, w, ids)
    assert len(backend._programs) == 2  # pointer alignment is in the key
    seen = []
    knobs.runtime.launch_enter_hook.add(lambda meta: seen.append(1))  # e.g. a profiler
    try:
        hooked = backend.run_experts(x, w13, w2, w, ids)
    finally:
        knobs.runtime.launch_enter_hook.calls.clear()
    torch.cuda.synchronize()
    assert seen, "with a launch hook installed the plain path (which calls it) must run"
    ref = fused_experts(x.double().cpu(), w13.double().cpu(), w2.double().cpu(), w.cpu(),
                        ids.cpu(), backend="reference")
    for out in (off, hooked):
        assert rel_err(out.cpu(), ref) < TOL[torch.bfloat16]


def test_replayed_experts_capture_in_a_graph():
    from moerun.backends.triton import TritonExperts

    g = torch.Generator().manual_seed(8)
    t, e, k, h, i = 24, 16, 4, 256, 128
    w13, w2 = _weights(g, e, h, i, torch.bfloat16)
    x, w, ids = _inputs(g, t, e, k, h, i, torch.bfloat16)
    backend = TritonExperts()
    for _ in range(2):  # the second call records
        backend.run_experts(x, w13, w2, w, ids)
    eager = backend.run_experts(x, w13, w2, w, ids).clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.run_experts(x, w13, w2, w, ids)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out.float().cpu(), eager.double().cpu()) < TOL_ATOMIC


_FP8_CASES = {  # name: (tokens, ExpertsConfig kwargs, launches in the program)
    "direct-reduce": (1, dict(block_m=16, kernel="direct", combine="reduce",
                              gate_up=dict(block_n=64), down=dict(block_n=64)), 2),
    "direct-atomic": (3, dict(block_m=16, kernel="direct", combine="atomic",
                              gate_up=dict(block_n=128), down=dict(block_n=64)), 2),
    "m16-atomic-splitk": (9, dict(block_m=16, combine="atomic", gate_up=dict(block_n=64),
                                  down=dict(block_n=64, split_k=2)), 3),
    "m64-reduce-fp8-act": (40, dict(block_m=64, combine="reduce",
                                    gate_up=dict(block_n=128, num_warps=8),
                                    down=dict(block_n=128)), 4),
    "m64-paired": (40, dict(block_m=64, combine="reduce",
                            gate_up=dict(block_n=128, paired=True), down=dict(block_n=128)), 5),
    "ws": (60, dict(block_m=128, kernel="ws", combine="reduce",
                    gate_up=dict(block_n=128, group_m=8, num_stages=4),
                    down=dict(block_n=256, group_m=8, num_stages=3)), None),
}


@pytest.mark.parametrize("name", list(_FP8_CASES))
def test_replayed_fp8_experts_equal_the_plain_call(name):
    """The fp8 call (quantized rows, as the layer hands them) replays a launch program from
    its third call; on fresh rows and routings of the recorded shape it equals the plain
    call (bit for bit without atomics) and DESIGN 11a's reference. A ``ws`` config builds
    TMA descriptors per launch, so it never records (plain path, no cache entry)."""
    from moerun import QuantConfig
    from moerun.backends.triton import TritonExperts
    from moerun.backends.triton.configs import (
        ConfigTable,
        DownConfig,
        ExpertsConfig,
        GateUpConfig,
        bucket_of,
    )
    from moerun.env import get_env
    from moerun.quant import (
        ExpertQuant,
        quantize_rows,
        quantize_weight_blocks,
        reference_fp8_moe,
    )

    if name == "ws" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the ws kernels are sm90 only")
    t, kw, launches = _FP8_CASES[name]
    kw = dict(kw)
    cfg = ExpertsConfig(gate_up=GateUpConfig(block_k=128, **kw.pop("gate_up")),
                        down=DownConfig(block_k=128, **kw.pop("down")), **kw)
    e, k, h, i = 16, 4, 512, 256
    g = torch.Generator().manual_seed(len(name))
    w13, s13 = quantize_weight_blocks(torch.randn(e, 2 * i, h, generator=g) * h ** -0.5)
    w2, s2 = quantize_weight_blocks(torch.randn(e, h, i, generator=g) * i ** -0.5)
    w13, s13, w2, s2 = (v.cuda() for v in (w13, s13, w2, s2))
    quant = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2,
                        out_dtype=torch.bfloat16)
    backend = TritonExperts(configs=ConfigTable(device_name=get_env().device_name,
                                                overrides={bucket_of(t): cfg}))

    def inputs():
        x, w, ids = _inputs(g, t, e, k, h, i, torch.bfloat16)
        return quantize_rows(x), w, ids

    for _ in range(2):  # the second call records
        q, w, ids = inputs()
        backend.run_experts(q, w13, w2, w, ids, quant=quant)
    if launches is None:
        assert len(backend._programs) == 0
    else:
        (program,) = backend._programs._entries.values()
        assert program is not None, "the fp8 call was refused a program"
        assert program.num_launches == launches
    for _ in range(3):  # fresh inputs of the recorded shape
        q, w, ids = inputs()
        replay = backend.run_experts(q, w13, w2, w, ids, quant=quant)
        plain = backend._run_plain(q, w13, w2, w, ids, None, quant)
        torch.cuda.synchronize()
        assert replay.dtype == torch.bfloat16 and replay.shape == (t, h)
        if cfg.combine == "atomic":
            assert rel_err(replay.float().cpu(), plain.double().cpu()) < TOL_ATOMIC
        else:
            assert torch.equal(replay, plain)
        ref = reference_fp8_moe(q, w13, s13, w2, s2, w, ids, QuantConfig(),
                                out_dtype=torch.bfloat16)
        assert rel_err(replay.float().cpu(), ref.double().cpu()) < 1e-2
    assert len(backend._programs) == (0 if launches is None else 1)
    # a graph captured on the recorded shape replays the program's work on the new inputs
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = backend.run_experts(q, w13, w2, w, ids, quant=quant)
    fresh = inputs()
    for dst, src in ((q.data, fresh[0].data), (q.scale, fresh[0].scale), (w, fresh[1]),
                     (ids, fresh[2])):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    ref = reference_fp8_moe(fresh[0], w13, s13, w2, s2, fresh[1], fresh[2], QuantConfig(),
                            out_dtype=torch.bfloat16)
    assert rel_err(captured.float().cpu(), ref.double().cpu()) < 1e-2


@pytest.mark.parametrize("method,e,k,bias", [("softmax_topk", 128, 8, False),
                                             ("noaux_tc", 256, 8, True)])
@pytest.mark.parametrize("t,valid", [(1, 1), (300, 290)])
def test_replayed_routing_equals_the_kernel(method, e, k, bias, t, valid):
    from moerun import MoEConfig, RoutingConfig
    from moerun.routing.kernel import fused_route, kernel_spec
    from moerun.routing.router import TritonRouter

    routing = RoutingConfig(method=method, renormalize=True,
                            **({"num_expert_group": 8, "topk_group": 4,
                                "routed_scaling_factor": 2.5} if method == "noaux_tc" else {}))
    cfg = MoEConfig(num_experts=e, top_k=k, hidden_size=64, intermediate_size=32,
                    routing=routing, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(t)
    b = torch.randn(e, generator=g).cuda() if bias else None
    router = TritonRouter(cfg, b)
    for _ in range(2):  # the second call records
        router(torch.randn(t, e, generator=g).cuda(), valid_rows=valid)
    (program,) = router._programs._entries.values()
    assert program is not None and program.num_launches == 1
    for _ in range(3):
        logits = torch.randn(t, e, generator=g).cuda()
        got = router(logits, valid_rows=valid)
        want = fused_route(logits, k, kernel_spec(routing), correction_bias=b,
                           valid_rows=valid)
        torch.cuda.synchronize()
        assert torch.equal(got.topk_ids, want.topk_ids)
        assert torch.equal(got.topk_weights, want.topk_weights)
        assert (got.topk_ids[valid:] == -1).all()


# ----------------------------------------------------------- the whole one-rank forward
_LAYERS = {  # name: (MoEConfig kwargs, shared expert)
    "softmax": dict(num_experts=32, top_k=4),
    "noaux-shared": dict(num_experts=64, top_k=8, shared_intermediate_size=256,
                         routing=dict(method="noaux_tc", num_expert_group=8, topk_group=4,
                                      routed_scaling_factor=2.5)),
    "gated-shared": dict(num_experts=16, top_k=2, shared_intermediate_size=128,
                         shared_expert_gate=True),
}


@pytest.mark.parametrize("tokens", [1, 40, 600])  # dense shared / cuBLAS shared / grid align
@pytest.mark.parametrize("name", list(_LAYERS))
def test_the_one_rank_forward_replays_as_one_program(name, tokens):
    """From the second forward of a shape the layer replays one program (router, experts and
    shared expert together); on fresh inputs it equals the plain issue and the fp64 model."""
    from moerun import ConfigurableMoE, MoEConfig, RoutingConfig
    from moerun.testing import make_case, reference_output
    from schedulers import one_rank

    kw = dict(_LAYERS[name])
    if "routing" in kw:
        kw["routing"] = RoutingConfig(renormalize=True, **kw["routing"])
    cfg = MoEConfig(hidden_size=256, intermediate_size=128, dtype=torch.bfloat16, **kw)
    case = make_case(cfg, tokens, seed=tokens + 5)
    with torch.no_grad(), ConfigurableMoE(cfg, device="cuda") as layer:
        layer.load_weights(case.w13.cuda(), case.w2.cuda(),
                           None if case.shared is None else
                           {k: v.cuda() for k, v in case.shared.items()},
                           e_score_correction_bias=None if case.bias is None
                           else case.bias.cuda())
        for _ in range(2):  # the second forward records
            layer(case.x.cuda(), case.logits.cuda())
        (program,) = layer.programs._entries.values()
        assert program is not None, "the one-rank forward was refused a program"
        assert program.num_launches >= 3  # routing, align, gate/up, down (+ combine)
        straight = one_rank.applies(layer, tokens)
        for seed in (1, 2):
            fresh = make_case(cfg, tokens, seed=100 * seed + tokens)
            x, logits = fresh.x.cuda(), fresh.logits.cuda()
            out = layer(x, logits)
            plain = one_rank.issue(layer, x, logits, straight, None)
            torch.cuda.synchronize()
            assert out.shape == (tokens, 256) and out.dtype == torch.bfloat16
            assert rel_err(out.float().cpu(), plain.double().cpu()) < TOL_ATOMIC
            ref = reference_output(cfg, dataclasses.replace(
                fresh, w13=case.w13, w2=case.w2, shared=case.shared, bias=case.bias))
            assert rel_err(out.cpu(), ref) < TOL[torch.bfloat16]
        assert len(layer.programs) == 1
        # a graph captured on the recorded shape replays the program's work
        x, logits = fresh.x.cuda(), fresh.logits.cuda()
        eager = layer(x, logits).clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = layer(x, logits)
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(captured.float().cpu(), eager.double().cpu()) < TOL_ATOMIC
