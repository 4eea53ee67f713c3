"""The one-rank straight path (``schedulers/one_rank.py``) on CPU.

It is taken exactly when DESIGN 4.1 has nothing to order on one rank (``NoComm``, no enabled
balancer, one chunk, a ``SEQUENTIAL``/``FUSED`` or no shared expert, nobody watching the
ranges); a recorder, a profiler, chunking or a side-stream shared order send the forward
down the general path. Both paths give the fp64 reference's answer and the same bits.
"""

from __future__ import annotations

import pytest
import torch

from moerun import ConfigurableMoE, MoEConfig, QuantConfig, RoutingConfig, RoutingMethod
from schedulers import one_rank
from tests.moe_cases import TOL, make_case, reference_output, rel_err
from traces import ScheduleRecorder

H, I = 32, 16


@pytest.fixture
def taken(monkeypatch):
    """Counts calls of the one-rank path."""
    calls = []
    real = one_rank.forward

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(one_rank, "forward", spy)
    return calls


def _build(cfg, case, **kw):
    layer = ConfigurableMoE(cfg, **kw)
    scales = {} if cfg.quant is None else dict(w13_scale=case.w13_scale,
                                               w2_scale=case.w2_scale)
    layer.load_weights(case.w13, case.w2, case.shared, e_score_correction_bias=case.bias,
                       **scales)
    return layer


VARIANTS = {
    "plain": (dict(num_experts=8, top_k=2), {}),
    "sequential-shared": (dict(num_experts=8, top_k=2, shared_intermediate_size=2 * I), {}),
    "gated-shared": (dict(num_experts=8, top_k=2, shared_intermediate_size=I,
                          shared_expert_gate=True), {}),
    "fused-shared": (dict(num_experts=8, top_k=2, shared_intermediate_size=2 * I),
                     dict(shared_expert_order="fused", backend="reference")),
    "llama4": (dict(num_experts=8, top_k=1, apply_router_weight_on_input=True,
                    routing=RoutingConfig(method=RoutingMethod.LLAMA4)), {}),
    "noaux-tc": (dict(num_experts=16, top_k=4, routing=RoutingConfig(
        method=RoutingMethod.NOAUX_TC, num_expert_group=4, topk_group=2,
        routed_scaling_factor=2.5)),
        {}),
}


@pytest.mark.parametrize("tokens", [0, 1, 7])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_one_rank_path_equals_general_path_and_reference(name, tokens, taken):
    extra, kw = VARIANTS[name]
    cfg = MoEConfig(hidden_size=H, intermediate_size=I, dtype=torch.float32, **extra)
    case = make_case(cfg, tokens, seed=11)
    ref = reference_output(cfg, case)
    with _build(cfg, case, **kw) as fast, _build(cfg, case, recorder=ScheduleRecorder(),
                                                 **kw) as general:
        out = fast(case.x, case.logits)
        assert len(taken) == 1, "the plain one-rank layer took the general path"
        out_general = general(case.x, case.logits)
        assert len(taken) == 1, "a layer with a recorder took the one-rank path"
    assert out.shape == (tokens, H) and out.dtype == torch.float32
    assert torch.equal(out, out_general)
    assert rel_err(out, ref) <= TOL[torch.float32]


def test_fp8_layer_takes_it_and_matches_the_reference(taken):
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=256, intermediate_size=128,
                    dtype=torch.float32, quant=QuantConfig(), shared_intermediate_size=128)
    case = make_case(cfg, 5, seed=3)
    with _build(cfg, case) as fast, _build(cfg, case, recorder=ScheduleRecorder()) as general:
        out = fast(case.x, case.logits)
        out_general = general(case.x, case.logits)
    assert len(taken) == 1
    assert torch.equal(out, out_general)
    assert rel_err(out, reference_output(cfg, case)) <= 3e-2


def test_chunked_forward_takes_the_general_path(taken):
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=H, intermediate_size=I,
                    dtype=torch.float32, max_num_tokens=4)
    case = make_case(cfg, 9, seed=5)
    with _build(cfg, case) as layer:
        out = layer(case.x[:4], case.logits[:4])  # one chunk: straight
        assert len(taken) == 1
        out9 = layer(case.x, case.logits)  # three chunks
        assert len(taken) == 1
    assert rel_err(out9, reference_output(cfg, case)) <= TOL[torch.float32]
    assert torch.equal(out, out9[:4]) or rel_err(out, out9[:4]) <= 1e-6


def test_profiler_and_side_stream_order_take_the_general_path(taken):
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=H, intermediate_size=I,
                    dtype=torch.float32, shared_intermediate_size=I)
    case = make_case(cfg, 3, seed=7)
    with _build(cfg, case) as layer:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = layer(case.x, case.logits)
        assert not taken
        names = {e.name for e in prof.events()}
        assert "moerun/L-/route" in names and "moerun/L-/shared" in names, sorted(names)[:20]
    with _build(cfg, case, shared_expert_order="aux_stream") as aux:
        out_aux = aux(case.x, case.logits)
        assert not taken
    assert torch.equal(out, out_aux)
    assert rel_err(out, reference_output(cfg, case)) <= TOL[torch.float32]


def test_bad_input_raises_the_same_error_on_the_one_rank_path(taken):
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=H, intermediate_size=I,
                    dtype=torch.float32)
    case = make_case(cfg, 3, seed=9)
    with _build(cfg, case) as fast, _build(cfg, case, recorder=ScheduleRecorder()) as general:
        for layer in (fast, general):
            with pytest.raises(ValueError, match="hidden"):
                layer(case.x[:, :-1], case.logits)
            with pytest.raises(ValueError, match="all_rank_num_tokens"):
                layer(case.x, case.logits, all_rank_num_tokens=[2])
    assert not taken  # validation runs before the choice of path
