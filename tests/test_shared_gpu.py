"""The shared-expert orders on a CUDA device (issue 9): every order equals ``SEQUENTIAL``
and the fp64 reference; a sleep on the side stream makes a missing join show as a wrong
result; SM partitions (green contexts); CUDA-graph capture and replay of every order.
"""

from __future__ import annotations

import pytest
import torch

from moerun import ConfigurableMoE, MoEConfig, RoutingConfig
from moerun.shared_expert import SharedExpert
from moerun.testing import TOL, make_case, reference_output, rel_err

pytestmark = pytest.mark.gpu

ROUTING = RoutingConfig(method="noaux_tc", renormalize=True, num_expert_group=4, topk_group=2,
                        routed_scaling_factor=2.5)
VARIANTS = [("sequential", None), ("aux_stream", None), ("aux_stream", 16),
            ("during_combine", None), ("during_combine", 16), ("fused", None)]
# FUSED sums the shared slots in fp32 inside the routed kernels, the others add in bf16
TOL_VS_SEQUENTIAL = 1e-2


def _layer(cfg, case, order, sms=None, **kw):
    layer = ConfigurableMoE(cfg, device="cuda", layer_idx=0, shared_expert_order=order,
                            shared_partition_sms=sms, **kw)
    layer.load_weights(case.w13.cuda(), case.w2.cuda(),
                       {k: v.cuda() for k, v in case.shared.items()},
                       e_score_correction_bias=case.bias.cuda())
    return layer


def _cfg(shared=128, **kw):
    return MoEConfig(num_experts=16, top_k=4, hidden_size=256, intermediate_size=128,
                     routing=ROUTING, shared_intermediate_size=shared, dtype=torch.bfloat16,
                     **kw)


@pytest.mark.parametrize("shared", [128, 256])
@pytest.mark.parametrize("t", [1, 77])
def test_every_order_equals_sequential_and_the_reference(shared, t):
    cfg = _cfg(shared)
    case = make_case(cfg, t, 11)
    ref = reference_output(cfg, case)
    outs = {}
    for order, sms in VARIANTS:
        layer = _layer(cfg, case, order, sms)
        outs[(order, sms)] = layer(case.x.cuda(), case.logits.cuda())
        torch.cuda.synchronize()
        assert rel_err(outs[(order, sms)].cpu(), ref) < TOL[torch.bfloat16], (order, sms)
    seq = outs[("sequential", None)].double().cpu()
    for key, out in outs.items():
        assert rel_err(out.cpu(), seq) < TOL_VS_SEQUENTIAL, key


@pytest.mark.parametrize("order,sms", [("aux_stream", None), ("aux_stream", 16),
                                       ("during_combine", 16)])
def test_a_slow_side_stream_is_joined_before_the_add(monkeypatch, order, sms):
    # the shared MLP first sleeps ~50 ms on whatever stream it runs on: without the join the
    # final add reads its output before it is written, and the result is wrong
    original = SharedExpert._mlp

    def slow(self, x):
        torch.cuda._sleep(100_000_000)
        return original(self, x)

    monkeypatch.setattr(SharedExpert, "_mlp", slow)
    cfg = _cfg()
    case = make_case(cfg, 64, 12)
    layer = _layer(cfg, case, order, sms)
    out = layer(case.x.cuda(), case.logits.cuda())
    torch.cuda.synchronize()
    assert rel_err(out.cpu(), reference_output(cfg, case)) < TOL[torch.bfloat16]


def _capture(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.parametrize("order,sms", VARIANTS)
def test_every_order_captures_and_replays(order, sms):
    cfg = _cfg(max_num_tokens=32)  # two chunks, chunk overlap on the aux stream as well
    t = 48
    case = make_case(cfg, 2 * t, 13)
    layer = _layer(cfg, case, order, sms)
    x = case.x[:t].cuda().clone()
    logits = case.logits[:t].cuda().clone()
    if sms is not None:
        # green contexts are not capturable: refused with the reason before any stream is
        # forked. NOTE: the refusal is exercised with capture *reported* (no real capture):
        # a real capture attempt of this layer aborted the process on torch 2.11 (H200,
        # 2026-12-01) even with the refusal in place; SM partitions are eager-only.
        import unittest.mock

        with unittest.mock.patch.object(torch.cuda, "is_current_stream_capturing",
                                        return_value=True):
            with pytest.raises(ValueError, match=r"green-context stream cannot be captured"):
                layer(x, logits)
        return
    graph, out = _capture(lambda: layer(x, logits))
    x.copy_(case.x[t:].cuda())
    logits.copy_(case.logits[t:].cuda())
    graph.replay()
    torch.cuda.synchronize()
    glob = type(case)(x=case.x[t:], logits=case.logits[t:], w13=case.w13, w2=case.w2,
                      shared=case.shared, bias=case.bias)
    assert rel_err(out.cpu(), reference_output(cfg, glob)) < TOL[torch.bfloat16]
