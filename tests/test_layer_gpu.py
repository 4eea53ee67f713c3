"""The whole layer on a CUDA device (issue 8): fused routing kernel, cached-handle launches,
CUDA-graph capture with the default checks, no host sync, ``fused_experts`` capture.

Every output is compared with an independent reference: the fp64 ``ReferenceExperts`` path of
``moerun.testing`` (routing by the torch twin), or the torch twin itself for the kernel.
"""

from __future__ import annotations

import pytest
import torch

from moerun import ConfigurableMoE, MoEConfig, RoutingConfig, fused_experts
from moerun.testing import TOL, make_case, reference_output, rel_err
from tests.routing_check import make_routing_case, routing_problems

pytestmark = pytest.mark.gpu

# graph replay vs eager of the same inputs: the same kernels, but fp32 atomics in the down
# GEMM sum in another order -> a few bf16 ulps, never more
TOL_REPLAY = 2e-3

_DSV3_LIKE = RoutingConfig(method="noaux_tc", renormalize=True, num_expert_group=4,
                           topk_group=2, routed_scaling_factor=2.5)


def _layer(cfg, case, **kw):
    layer = ConfigurableMoE(cfg, device="cuda", layer_idx=0, **kw)
    layer.load_weights(case.w13.cuda(), case.w2.cuda(),
                       None if case.shared is None else
                       {k: v.cuda() for k, v in case.shared.items()},
                       e_score_correction_bias=None if case.bias is None else case.bias.cuda())
    return layer


# ------------------------------------------------------------------ routing kernel on CUDA
@pytest.mark.parametrize("method,e,k,groups,topk_group,renorm,scale", [
    ("softmax_topk", 128, 8, 1, 1, True, 1.0), ("topk_softmax", 8, 2, 1, 1, True, 1.0),
    ("noaux_tc", 256, 8, 8, 4, True, 2.5), ("group_limited_greedy", 64, 6, 8, 3, False, 16.0),
    ("sigmoid_bias_topk", 96, 8, 1, 1, True, 1.0), ("llama4", 16, 1, 1, 1, False, 1.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 7, 300])
def test_routing_kernel_matches_twin(method, e, k, groups, topk_group, renorm, scale, dtype, t):
    from moerun.routing.kernel import fused_route, kernel_spec

    for ties in (False, True):
        cfg, logits, bias = make_routing_case(method, e, groups, topk_group, renorm, scale, t,
                                              dtype=dtype, ties=ties, strided=t == 7,
                                              seed=t, device="cuda")
        valid = t - 2 if t > 2 else t
        got = fused_route(logits, k, kernel_spec(cfg), correction_bias=bias, valid_rows=valid)
        assert routing_problems(got, logits, bias, cfg, k, valid) == []


# ------------------------------------------------------------------ whole layer
@pytest.mark.parametrize("routing,shared", [(RoutingConfig(method="softmax_topk"), 0),
                                            (_DSV3_LIKE, 96)])
def test_triton_router_layer_matches_reference(routing, shared):
    cfg = MoEConfig(num_experts=16, top_k=4, hidden_size=256, intermediate_size=128,
                    routing=routing, shared_intermediate_size=shared, dtype=torch.bfloat16)
    case = make_case(cfg, 77, 1)
    ref = reference_output(cfg, case)
    for router in ("triton", "torch"):
        layer = _layer(cfg, case, backend="triton", router=router)
        assert layer.report.router == router
        out = layer(case.x.cuda(), case.logits.cuda())
        torch.cuda.synchronize()
        assert rel_err(out.cpu(), ref) < TOL[torch.bfloat16], router


def _capture(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, allocate) off the capture
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.parametrize("max_num_tokens,shared,overlap", [
    (None, 0, True), (None, 96, True), (24, 96, True), (24, 0, False)])
def test_forward_captures_with_checks_on_and_replay_equals_eager(
        max_num_tokens, shared, overlap):
    cfg = MoEConfig(num_experts=16, top_k=4, hidden_size=256, intermediate_size=128,
                    routing=_DSV3_LIKE, shared_intermediate_size=shared,
                    max_num_tokens=max_num_tokens, dtype=torch.bfloat16, check_inputs=True)
    t = 64
    case = make_case(cfg, 3 * t, 5)
    layer = _layer(cfg, case, chunk_overlap=overlap)
    x = case.x[:t].cuda().clone()
    logits = case.logits[:t].cuda().clone()
    graph, out = _capture(lambda: layer(x, logits))
    for step in (1, 2):
        x.copy_(case.x[t * step:t * (step + 1)].cuda())
        logits.copy_(case.logits[t * step:t * (step + 1)].cuda())
        graph.replay()
        eager = layer(x, logits)
        torch.cuda.synchronize()
        glob = type(case)(x=case.x[t * step:t * (step + 1)],
                          logits=case.logits[t * step:t * (step + 1)], w13=case.w13,
                          w2=case.w2, shared=case.shared, bias=case.bias)
        ref = reference_output(cfg, glob)
        assert rel_err(out.cpu(), ref) < TOL[torch.bfloat16]
        assert rel_err(out.cpu(), eager.double().cpu()) < TOL_REPLAY


def test_forward_makes_no_host_sync():
    cfg = MoEConfig(num_experts=16, top_k=4, hidden_size=256, intermediate_size=128,
                    routing=_DSV3_LIKE, shared_intermediate_size=96, max_num_tokens=40,
                    dtype=torch.bfloat16, check_inputs=False)
    case = make_case(cfg, 100, 6)
    layer = _layer(cfg, case)
    x, logits = case.x.cuda(), case.logits.cuda()
    layer(x, logits)  # warm up: compile and load every kernel first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = layer(x, logits)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert rel_err(out.cpu(), reference_output(cfg, case)) < TOL[torch.bfloat16]


def _fused_inputs(seed: int, t: int, e: int, k: int, h: int, i: int):
    """bf16 CUDA ``(x, w13, w2, topk_weights, topk_ids)`` of distinct random ids per row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(torch.bfloat16).cuda()
    w13 = (torch.randn(e, 2 * i, h, generator=g) * h ** -0.5).to(torch.bfloat16).cuda()
    w2 = (torch.randn(e, h, i, generator=g) * i ** -0.5).to(torch.bfloat16).cuda()
    w = torch.rand(t, k, generator=g).cuda()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int().cuda()
    return x, w13, w2, w, ids


def test_fused_experts_captures_with_default_checks():
    x, w13, w2, w, ids = _fused_inputs(3, t=48, e=8, k=2, h=128, i=64)
    ref = fused_experts(x.double().cpu(), w13.double().cpu(), w2.double().cpu(), w.cpu(),
                        ids.cpu(), backend="reference")
    graph, out = _capture(lambda: fused_experts(x, w13, w2, w, ids, backend="triton"))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out.cpu(), ref) < TOL[torch.bfloat16]


def test_fused_experts_default_checks_make_no_host_sync():
    # on CUDA the default (None) keeps the host-only checks and drops the id range scan, the
    # one sync; True scans (and so syncs)
    e = 8
    x, w13, w2, w, ids = _fused_inputs(4, t=40, e=e, k=2, h=128, i=64)
    fused_experts(x, w13, w2, w, ids, backend="triton")  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = fused_experts(x, w13, w2, w, ids, backend="triton")
        with pytest.raises(ValueError, match=r"w2 must be \[E=8, H=128, I=64\]"):
            fused_experts(x, w13, w2[:, :, :-1].contiguous(), w, ids, backend="triton")
        with pytest.raises(RuntimeError, match="synchroniz"):
            fused_experts(x, w13, w2, w, ids, backend="triton", check_inputs=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    bad = ids.clone()
    bad[3, 1] = e
    with pytest.raises(ValueError, match=rf"topk_ids must be in \[-1, {e}\)"):
        fused_experts(x, w13, w2, w, bad, backend="triton", check_inputs=True)
    ref = fused_experts(x.double().cpu(), w13.double().cpu(), w2.double().cpu(), w.cpu(),
                        ids.cpu(), backend="reference")
    assert rel_err(out.cpu(), ref) < TOL[torch.bfloat16]


def test_cached_launches_equal_jit_launches():
    # the FastLauncher path (second call onwards) computes what the JIT path (first call) did
    from moerun.backends.triton import TritonExperts

    t, h = 33, 256
    x, w13, w2, w, ids = _fused_inputs(9, t=t, e=16, k=4, h=h, i=128)
    backend = TritonExperts()
    first = backend.run_experts(x, w13, w2, w, ids)
    again = [backend.run_experts(x, w13, w2, w, ids) for _ in range(3)]
    # a misaligned view of x must not reuse a binary compiled for aligned pointers
    x_off = torch.empty(t * h + 1, dtype=torch.bfloat16, device="cuda")[1:].view(t, h)
    x_off.copy_(x)
    off = backend.run_experts(x_off, w13, w2, w, ids)
    torch.cuda.synchronize()
    ref = fused_experts(x.double().cpu(), w13.double().cpu(), w2.double().cpu(), w.cpu(),
                        ids.cpu(), backend="reference")
    for out in [first, off] + again:
        assert rel_err(out.cpu(), ref) < TOL[torch.bfloat16]


# ------------------------------------------------------------------ check_inputs on one rank
def test_check_inputs_defaults_off_on_cuda():
    """DESIGN 9: the default (None) resolves off for a CUDA layer -- its NaN/Inf scan would
    sync the host every forward -- so non-finite logits are not scanned for; True scans."""
    cfg = MoEConfig(num_experts=16, top_k=4, hidden_size=256, intermediate_size=128,
                    routing=_DSV3_LIKE, dtype=torch.bfloat16)
    assert cfg.check_inputs is None
    case = make_case(cfg, 8, 12)
    layer = _layer(cfg, case)
    assert layer.config.check_inputs is False
    bad = case.logits.cuda().clone()
    bad[2, 3] = float("nan")
    layer(case.x.cuda(), bad)  # not scanned: no error
    torch.cuda.synchronize()
    checked = _layer(cfg.replace(check_inputs=True), case)
    with pytest.raises(ValueError, match=r"router_logits contains non-finite values"):
        checked(case.x.cuda(), bad)


@pytest.mark.parametrize("t,shared,max_num_tokens", [
    (1, 0, None), (1, 96, None), (300, 96, None),   # the one-rank straight path
    (300, 96, 128),                                  # chunked: the general path
])
def test_nonfinite_logits_raise_and_leave_the_layer_usable(t, shared, max_num_tokens):
    cfg = MoEConfig(num_experts=16, top_k=4, hidden_size=256, intermediate_size=128,
                    routing=_DSV3_LIKE, shared_intermediate_size=shared,
                    max_num_tokens=max_num_tokens, dtype=torch.bfloat16, check_inputs=True)
    case = make_case(cfg, t, 11)
    layer = _layer(cfg, case)
    x, logits = case.x.cuda(), case.logits.cuda()
    ref = reference_output(cfg, case)
    for bad_value in (float("nan"), float("inf"), float("nan")):  # 3 calls: the program
        bad = logits.clone()                                      # records at the second
        bad[t // 2, 3] = bad_value
        step = layer.step
        with pytest.raises(ValueError, match=r"router_logits contains non-finite values"):
            layer(x, bad)
        assert layer.step == step  # a refused forward does not count
        out = layer(x, logits)
        torch.cuda.synchronize()
        assert layer.step == step + 1
        assert rel_err(out.cpu(), ref) < TOL[torch.bfloat16]
