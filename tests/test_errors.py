"""Every user-facing error message: config, mapping, layer forward and lifecycle, load_weights,
``fused_experts``. Each case is a ``pytest.raises(match=...)`` on the message text."""

from __future__ import annotations

import pytest
import torch

from moerun import (
    ConfigurableMoE,
    LayerClosedError,
    Mapping,
    MoEConfig,
    RoutingConfig,
    RoutingMethod,
    fused_experts,
)
from moerun.backends import ReferenceExperts
from moerun.errors import MoERunError
from moerun.mapping import slot_partition
from tests.moe_cases import make_case

M = RoutingMethod
E, K, H, I = 4, 2, 8, 6


def _cfg(**kw) -> MoEConfig:
    base = dict(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I)
    base.update(kw)
    return MoEConfig(**base)


@pytest.fixture
def layer_and_case():
    cfg = _cfg()
    case = make_case(cfg, 5, seed=0)
    layer = ConfigurableMoE(cfg, device="cpu")
    layer.load_weights(case.w13, case.w2)
    yield layer, case
    layer.close()


# ------------------------------------------------------------------ MoEConfig


@pytest.mark.parametrize("kwargs,match", [
    (dict(top_k=5), r"MoEConfig\.top_k=5 is invalid: top_k must be <= num_experts=4"),
    (dict(top_k=0), r"MoEConfig\.top_k=0 is invalid: must be a positive int"),
    (dict(num_experts=0), r"MoEConfig\.num_experts=0 is invalid"),
    (dict(hidden_size=True), r"MoEConfig\.hidden_size=True is invalid"),
    (dict(intermediate_size=2.0), r"MoEConfig\.intermediate_size=2\.0 is invalid"),
    (dict(dtype=torch.float64), r"MoEConfig\.dtype=torch\.float64 is invalid: use torch\.float32"),
    (dict(dtype=torch.int8), r"MoEConfig\.dtype=torch\.int8"),
    (dict(activation="gelu"), r"MoEConfig\.activation='gelu'.*out of scope"),
    (dict(activation="swiglu_clamped"), r"out of scope"),
    (dict(apply_router_weight_on_input=True),
     r"MoEConfig\.apply_router_weight_on_input=True is invalid: only defined for top_k == 1 "
     r"\(got top_k=2\)"),
    (dict(num_experts=6, routing=RoutingConfig(num_expert_group=4)),
     r"MoEConfig\.routing\.num_expert_group=4 is invalid: must divide num_experts=6"),
    (dict(num_experts=8, top_k=5, routing=RoutingConfig(method=M.NOAUX_TC, num_expert_group=4,
                                                        topk_group=2)),
     r"MoEConfig\.top_k=5 .*topk_group\*experts_per_group=4"),
    (dict(num_experts=4, routing=RoutingConfig(method=M.NOAUX_TC, num_expert_group=4,
                                               topk_group=2)),
     r"num_expert_group=4 .*each group needs >= 2 experts"),
    (dict(routing=RoutingConfig(method=M.LLAMA4)), r"MoEConfig\.top_k=2 .*llama4 routing is top-1"),
    (dict(shared_expert_gate=True),
     r"MoEConfig\.shared_expert_gate=True is invalid: .*shared_intermediate_size > 0"),
    (dict(shared_intermediate_size=-1), r"MoEConfig\.shared_intermediate_size=-1"),
    (dict(max_num_tokens=0), r"MoEConfig\.max_num_tokens=0 is invalid: must be an int >= 1 or None"),
    (dict(max_num_tokens=-3), r"MoEConfig\.max_num_tokens=-3"),
])
def test_moe_config_field_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _cfg(**kwargs)


def test_moe_config_is_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        MoEConfig(4, 2, 8, 6)  # type: ignore[misc]
    cfg = _cfg()
    with pytest.raises(AttributeError):
        cfg.top_k = 1  # type: ignore[misc]
    with pytest.raises(TypeError, match=r"MoEConfig\.routing must be a RoutingConfig, got dict"):
        _cfg(routing={"method": "noaux_tc"})


def test_moe_config_replace_revalidates():
    with pytest.raises(ValueError, match=r"MoEConfig\.top_k=9"):
        _cfg().replace(top_k=9)


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_expert_group=0), r"RoutingConfig\.num_expert_group=0 must be >= 1"),
    (dict(num_expert_group=2, topk_group=3),
     r"RoutingConfig\.topk_group=3 must be in \[1, num_expert_group=2\]"),
    (dict(routed_scaling_factor=0.0), r"RoutingConfig\.routed_scaling_factor=0\.0 must be > 0"),
    (dict(routed_scaling_factor=float("nan")), r"routed_scaling_factor=nan must be > 0"),
])
def test_routing_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RoutingConfig(**kwargs)


def test_routing_config_unknown_method():
    with pytest.raises(ValueError, match="not_a_method"):
        RoutingConfig(method="not_a_method")


# ------------------------------------------------------------------ Mapping and slot partition


@pytest.mark.parametrize("kwargs,match", [
    (dict(world_size=2, group=object(), dp_size=1),
     r"Mapping\(dp_size=1, ep_size=None, world_size=2\) is unsupported: .*dp_size == ep_size "
     r"== world_size"),
    (dict(world_size=2, group=object(), ep_size=1),
     r"Mapping\(dp_size=None, ep_size=1, world_size=2\) is unsupported"),
    (dict(dp_size=2), r"Mapping\(dp_size=2, ep_size=None, world_size=1\).*tensor-parallel"),
    (dict(world_size=0), r"Mapping\.world_size=0 must be >= 1"),
    (dict(rank=2, world_size=2, group=object()), r"Mapping\.rank=2 must be in \[0, world_size=2\)"),
    (dict(world_size=2), r"Mapping\.group is None with world_size=2"),
    (dict(timeout_s=0), r"Mapping\.timeout_s=0 must be a finite number of seconds > 0 \(the "
                        r"budget of one collective\); pass e\.g\. 30\.0"),
    # issue 14 item 5: inf used to pass and fail the first forward with a misleading
    # CommTimeoutError (an internal OverflowError); NaN and negatives were not checked
    (dict(timeout_s=float("inf")), r"Mapping\.timeout_s=inf must be a finite number"),
    (dict(timeout_s=float("nan")), r"Mapping\.timeout_s=nan must be a finite number"),
    (dict(timeout_s=-1.0), r"Mapping\.timeout_s=-1\.0 must be a finite number"),
    (dict(timeout_s=True), r"Mapping\.timeout_s=True must be a finite number"),
    (dict(timeout_s="30"), r"Mapping\.timeout_s='30' must be a finite number"),
    (dict(warmup_timeout_s=float("inf")), r"Mapping\.warmup_timeout_s=inf must be a finite "),
    (dict(warmup_timeout_s=float("-inf")), r"Mapping\.warmup_timeout_s=-inf must be a finite"),
    (dict(warmup_timeout_s=float("nan")), r"Mapping\.warmup_timeout_s=nan must be a finite"),
    (dict(warmup_timeout_s=0.0), r"Mapping\.warmup_timeout_s=0\.0 must be a finite number"),
    (dict(warmup_forwards=-1), r"Mapping\.warmup_forwards=-1 must be an int >= 0"),
    (dict(warmup_forwards=1.5), r"Mapping\.warmup_forwards=1\.5 must be an int >= 0"),
])
def test_mapping_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Mapping(**kwargs)


class _Group:
    """What Mapping reads of a process group: ``size()`` and ``rank()``."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def test_mapping_must_match_its_group():
    # a mismatch used to pass and fail the first forward with a CommTimeoutError
    with pytest.raises(ValueError, match=r"Mapping\(rank=1, world_size=2\) does not match its "
                                         r"group \(rank 0 of 1\).*Mapping\.from_group"):
        Mapping(rank=1, world_size=2, group=_Group(1, 0))
    with pytest.raises(ValueError, match=r"\(rank 1 of 2\)"):
        Mapping(rank=0, world_size=2, group=_Group(2, 1))
    assert Mapping(rank=1, world_size=2, group=_Group(2, 1)).world_size == 2


def test_slot_partition_fewer_experts_than_ranks():
    with pytest.raises(ValueError, match=r"num_experts \(slots\)=3 < ep_size=4: every rank needs "
                                         r"at least one expert slot"):
        slot_partition(3, 4)
    assert slot_partition(4, 4).starts == (0, 1, 2, 3, 4)
    assert slot_partition(7, 3).starts == (0, 3, 5, 7)  # ceil sizes first


# ------------------------------------------------------------------ layer construction


def test_layer_constructor_errors():
    with pytest.raises(TypeError, match="config must be a MoEConfig, got dict"):
        ConfigurableMoE({"num_experts": 4}, device="cpu")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="mapping must be a moerun.Mapping, got int"):
        ConfigurableMoE(_cfg(), 0, device="cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="repeat_count=0 must be an int >= 1"):
        ConfigurableMoE(_cfg(), device="cpu", repeat_count=0)
    with pytest.raises(ValueError, match=r"comm='carrier_pigeon' is unknown; valid: 'auto', "
                                         r"'none', 'allgather', 'alltoall'"):
        ConfigurableMoE(_cfg(), device="cpu", comm="carrier_pigeon")
    with pytest.raises(ValueError, match=r"shared_expert_order='carrier' is unknown; valid: "
                                         r"'auto', 'sequential', 'aux_stream', "
                                         r"'during_combine', 'fused'"):
        ConfigurableMoE(_cfg(shared_intermediate_size=4), device="cpu",
                        shared_expert_order="carrier")
    with pytest.raises(ValueError, match=r"shared_expert_order='fused' cannot run here: shape: "
                                         r"shared size 5 is not a multiple of I="):
        ConfigurableMoE(_cfg(shared_intermediate_size=5), device="cpu", backend="reference",
                        shared_expert_order="fused")
    with pytest.raises(ValueError, match=r"shared_expert_order='fused' cannot run here: "
                                         r"unimplemented: backend grouped_mm does not fuse"):
        ConfigurableMoE(_cfg(intermediate_size=8, shared_intermediate_size=8), device="cpu",
                        backend="grouped_mm", shared_expert_order="fused")
    with pytest.raises(ValueError, match=r"shared_partition_sms=16: SM partitions need CUDA"):
        ConfigurableMoE(_cfg(shared_intermediate_size=4), device="cpu",
                        shared_expert_order="aux_stream", shared_partition_sms=16)
    with pytest.raises(ValueError, match=r"shared_partition_sms=16 needs shared_expert_order "
                                         r"'aux_stream' or 'during_combine'"):
        ConfigurableMoE(_cfg(shared_intermediate_size=4), device="cpu",
                        shared_expert_order="sequential", shared_partition_sms=16)


def test_layer_backend_that_cannot_run_here():
    # CPU without TRITON_INTERPRET=1 (this test process never sets it)
    with pytest.raises(ValueError, match=r"backend='triton' cannot run here: interpreter"):
        ConfigurableMoE(_cfg(), device="cpu", backend="triton")


def test_layer_unknown_backend_name():
    with pytest.raises(ValueError, match=r"backend='cutlass' is unknown; valid: 'auto', "
                                         r"'reference', 'triton', 'grouped_mm'"):
        ConfigurableMoE(_cfg(), device="cpu", backend="cutlass")


# ------------------------------------------------------------------ forward input checks


def test_forward_wrong_x_dtype(layer_and_case):
    layer, case = layer_and_case
    with pytest.raises(ValueError, match=r"x\.dtype=torch\.float16 but MoEConfig\.dtype="
                                         r"torch\.float32"):
        layer(case.x.half(), case.logits)


@pytest.mark.parametrize("shape", [(5, H + 1), (5,), (1, 5, H)])
def test_forward_x_shape_mismatch(layer_and_case, shape):
    layer, _ = layer_and_case
    x = torch.randn(*shape)
    logits = torch.randn(5, E)
    with pytest.raises(ValueError, match=rf"x has shape {tuple(shape)!s}; expected \[T, "
                                         rf"hidden_size={H}\]".replace("(", r"\(")
                       .replace(")", r"\)")):
        layer(x, logits)


@pytest.mark.parametrize("shape", [(4, E), (6, E), (5, E + 1), (5, E - 1), (5,), (5, E, 1)])
def test_forward_logits_shape_mismatch(layer_and_case, shape):
    layer, case = layer_and_case
    with pytest.raises(ValueError, match=rf"router_logits has shape .*; expected \[T=5, "
                                         rf"num_experts={E}\]"):
        layer(case.x, torch.randn(*shape))


def test_forward_logits_dtype(layer_and_case):
    layer, case = layer_and_case
    with pytest.raises(ValueError, match=r"router_logits\.dtype=torch\.float64; expected "
                                         r"torch\.float32 or x\.dtype"):
        layer(case.x, case.logits.double())


def test_forward_non_tensor_inputs(layer_and_case):
    layer, case = layer_and_case
    with pytest.raises(ValueError, match="x must be a torch.Tensor, got list"):
        layer(case.x.tolist(), case.logits)
    with pytest.raises(ValueError, match="router_logits must be a torch.Tensor, got list"):
        layer(case.x, case.logits.tolist())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_forward_non_finite_logits(layer_and_case, bad):
    layer, case = layer_and_case
    logits = case.logits.clone()
    logits[2, 1] = bad
    with pytest.raises(ValueError, match=r"router_logits contains non-finite values \(NaN/Inf\)"):
        layer(case.x, logits)


def test_forward_non_finite_logits_unchecked_when_check_inputs_off():
    cfg = _cfg(check_inputs=False)
    case = make_case(cfg, 5, seed=1)
    with ConfigurableMoE(cfg, device="cpu") as layer:
        layer.load_weights(case.w13, case.w2)
        logits = case.logits.clone()
        logits[0, 0] = float("nan")
        out = layer(case.x, logits)  # no scan (a host sync) with checks off
    assert out.shape == case.x.shape


def test_forward_wrong_device_meta(layer_and_case):
    layer, case = layer_and_case
    with pytest.raises(ValueError, match=r"x is on meta but the layer's weights are on cpu; "
                                         r"move x or the layer"):
        layer(case.x.to("meta"), case.logits.to("meta"))
    with pytest.raises(ValueError, match=r"router_logits is on meta, x on cpu"):
        layer(case.x, case.logits.to("meta"))


@pytest.mark.parametrize("counts,match", [
    ([5, 5], r"all_rank_num_tokens has 2 entries; expected dp_size=1"),
    ([], r"all_rank_num_tokens has 0 entries; expected dp_size=1"),
    ([4], r"all_rank_num_tokens\[0\]=4 but x has 5 rows"),
    ([-1], r"all_rank_num_tokens=\[-1\] has a negative entry"),
])
def test_forward_all_rank_num_tokens(layer_and_case, counts, match):
    layer, case = layer_and_case
    with pytest.raises(ValueError, match=match):
        layer(case.x, case.logits, all_rank_num_tokens=counts)


def test_forward_correct_all_rank_num_tokens_accepted(layer_and_case):
    layer, case = layer_and_case
    out = layer(case.x, case.logits, all_rank_num_tokens=[5], use_dp_padding=True)
    assert out.shape == (5, H)


def test_failed_validation_does_not_advance_repeat_or_poison(layer_and_case):
    layer, case = layer_and_case
    with pytest.raises(ValueError):
        layer(case.x.half(), case.logits)
    assert layer.step == 0 and layer.repeat_idx == 0
    layer(case.x, case.logits)  # still usable
    assert layer.step == 1


# ------------------------------------------------------------------ lifecycle


def test_forward_before_load_weights():
    cfg = _cfg()
    case = make_case(cfg, 3, seed=2)
    with ConfigurableMoE(cfg, device="cpu") as layer:
        with pytest.raises(LayerClosedError, match=r"layer None: weights are not loaded on "
                                                   r"rank\(s\) \[0\]: call load_weights\(w13, "
                                                   r"w2\) \(or load_expert_weights\)"):
            layer(case.x, case.logits)


def test_forward_after_close(layer_and_case):
    layer, case = layer_and_case
    layer.close()
    assert layer.closed
    with pytest.raises(LayerClosedError, match=r"layer None is closed on rank\(s\) \[0\] \(this "
                                               r"rank\): this ConfigurableMoE was closed; build "
                                               r"a new layer") as info:
        layer(case.x, case.logits)
    assert info.value.ranks == [0]
    assert issubclass(LayerClosedError, MoERunError)


def test_close_is_idempotent(layer_and_case):
    layer, _ = layer_and_case
    calls = []
    real_destroy = layer.strategy.destroy
    layer.strategy.destroy = lambda: (calls.append(1), real_destroy())
    layer.close()
    layer.close()
    layer.close()
    assert layer.closed and len(calls) == 1


def test_context_manager_closes():
    cfg = _cfg()
    case = make_case(cfg, 3, seed=3)
    with ConfigurableMoE(cfg, device="cpu") as layer:
        layer.load_weights(case.w13, case.w2)
        layer(case.x, case.logits)
        assert not layer.closed
    assert layer.closed
    with pytest.raises(LayerClosedError, match="closed"):
        layer(case.x, case.logits)


def test_context_manager_closes_on_exception():
    layer = ConfigurableMoE(_cfg(), device="cpu")
    with pytest.raises(RuntimeError, match="boom"):
        with layer:
            raise RuntimeError("boom")
    assert layer.closed


def test_poisoned_layer_refuses_forward(layer_and_case):
    layer, case = layer_and_case
    layer.communicator.poisoned = True
    with pytest.raises(LayerClosedError, match=r"layer None is poisoned on rank\(s\) \[0\] "
                                               r"\(this rank\) by an earlier CommTimeoutError"):
        layer(case.x, case.logits)
    layer.close()  # no collective, never hangs


# ------------------------------------------------------------------ load_weights


def test_load_weights_wrong_shapes():
    cfg = _cfg()
    case = make_case(cfg, 1, seed=4)
    with ConfigurableMoE(cfg, device="cpu") as layer:
        with pytest.raises(ValueError, match=rf"w13 has shape \({E}, {2 * I}, {H + 1}\); expected "
                                             rf"\[E={E}, 2\*I={2 * I}, H={H}\]"):
            layer.load_weights(torch.zeros(E, 2 * I, H + 1), case.w2)
        with pytest.raises(ValueError, match=r"w13 has shape \(3, 12, 8\)"):
            layer.load_weights(case.w13[:3], case.w2)
        with pytest.raises(ValueError, match=rf"w2 has shape \({E}, {I}, {H}\); expected "
                                             rf"\[E={E}, H={H}, I={I}\]"):
            layer.load_weights(case.w13, case.w2.transpose(1, 2))
        with pytest.raises(ValueError, match="shared given but config.shared_intermediate_size "
                                             "== 0"):
            layer.load_weights(case.w13, case.w2, {"w13": torch.zeros(2, H), "w2": torch.zeros(H, 1)})
        with pytest.raises(ValueError, match="e_score_correction_bias given but routing method "
                                             "softmax_topk does not use one"):
            layer.load_weights(case.w13, case.w2, e_score_correction_bias=torch.zeros(E))
        with pytest.raises(LayerClosedError, match="weights are not loaded"):
            layer(torch.zeros(1, H), torch.zeros(1, E))


def test_load_weights_shared_expert_errors():
    cfg = _cfg(shared_intermediate_size=4, shared_expert_gate=True)
    case = make_case(cfg, 1, seed=5)
    with ConfigurableMoE(cfg, device="cpu") as layer:
        with pytest.raises(ValueError, match=r"shared is required: config\."
                                             r"shared_intermediate_size=4 > 0"):
            layer.load_weights(case.w13, case.w2)
        bad = dict(case.shared, w13=torch.zeros(4, H))
        with pytest.raises(ValueError, match=r"shared\['w13'\] has shape \(4, 8\), expected "
                                             r"\(8, 8\)"):
            layer.load_weights(case.w13, case.w2, bad)
        bad = dict(case.shared, w2=torch.zeros(4, H))
        with pytest.raises(ValueError, match=r"shared\['w2'\] has shape \(4, 8\), expected "
                                             r"\(8, 4\)"):
            layer.load_weights(case.w13, case.w2, bad)
        bad = {k: v for k, v in case.shared.items() if k != "gate"}
        with pytest.raises(ValueError, match=r"shared\['gate'\] is missing"):
            layer.load_weights(case.w13, case.w2, bad)
    ungated = cfg.replace(shared_expert_gate=False)
    with ConfigurableMoE(ungated, device="cpu") as layer:
        with pytest.raises(ValueError, match=r"shared\['gate'\] given but "
                                             r"config\.shared_expert_gate=False"):
            layer.load_weights(case.w13, case.w2, case.shared)


def test_load_weights_correction_bias_errors():
    cfg = _cfg(num_experts=8, routing=RoutingConfig(method=M.NOAUX_TC, num_expert_group=4,
                                                    topk_group=2))
    case = make_case(cfg, 1, seed=6)
    with ConfigurableMoE(cfg, device="cpu") as layer:
        with pytest.raises(ValueError, match=r"e_score_correction_bias \[E=8\] is required by "
                                             r"routing method noaux_tc"):
            layer.load_weights(case.w13, case.w2)
        with pytest.raises(ValueError, match=r"e_score_correction_bias has shape \(7,\); "
                                             r"expected \[8\]"):
            layer.load_weights(case.w13, case.w2, e_score_correction_bias=torch.zeros(7))


# ------------------------------------------------------------------ fused_experts


T_F = 5


@pytest.fixture
def fused_inputs():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(T_F, H, generator=g)
    w13 = torch.randn(E, 2 * I, H, generator=g)
    w2 = torch.randn(E, H, I, generator=g)
    w = torch.rand(T_F, K, generator=g)
    ids = torch.randint(0, E, (T_F, K), generator=g, dtype=torch.int32)
    return dict(x=x, w13=w13, w2=w2, topk_weights=w, topk_ids=ids)


def _with(inputs, **changes):
    out = dict(inputs)
    out.update(changes)
    return out


@pytest.mark.parametrize("bad_id,rng", [(E, rf"\[0, {E}\]"), (-2, r"\[-2, ")])
def test_fused_experts_ids_out_of_range(fused_inputs, bad_id, rng):
    ids = fused_inputs["topk_ids"].clone()
    ids[1, 0] = bad_id
    with pytest.raises(ValueError, match=rf"topk_ids must be in \[-1, {E}\) \(-1 = skip\), got "
                                         rf"range {rng}"):
        fused_experts(**_with(fused_inputs, topk_ids=ids), backend="reference")


def test_fused_experts_check_inputs_values(fused_inputs):
    # None (default) on CPU scans the ids; False skips every check; a non-bool is refused
    ids = fused_inputs["topk_ids"].clone()
    ids[0, 0] = E
    bad = _with(fused_inputs, topk_ids=ids)
    with pytest.raises(ValueError, match=r"topk_ids must be in \[-1, "):
        fused_experts(**bad, backend="reference", check_inputs=None)
    with pytest.raises(TypeError, match=r"check_inputs must be True, False or None \(by "
                                        r"device\), got 'yes'"):
        fused_experts(**fused_inputs, backend="reference", check_inputs="yes")
    wrong_h = _with(fused_inputs, x=fused_inputs["x"][:, :-1].contiguous())
    with pytest.raises(ValueError, match=rf"w13 must be \[E, 2\*I, H={H - 1}\]"):
        fused_experts(**wrong_h, backend="reference")
    with pytest.raises(Exception) as info:  # unchecked: whatever the backend raises
        fused_experts(**wrong_h, backend="reference", check_inputs=False)
    assert "w13 must be" not in str(info.value)


def test_fused_experts_minus_one_is_skipped(fused_inputs):
    ids = fused_inputs["topk_ids"].clone()
    ids[:, 1] = -1
    out = fused_experts(**_with(fused_inputs, topk_ids=ids), backend="reference")
    ref = fused_experts(**_with(fused_inputs, topk_ids=ids[:, :1].contiguous(),
                                topk_weights=fused_inputs["topk_weights"][:, :1].contiguous()),
                        backend="reference")
    torch.testing.assert_close(out, ref)


def test_fused_experts_unknown_backend(fused_inputs):
    with pytest.raises(ValueError, match=r"backend='cutlass' is unknown; valid: 'auto', "
                                         r"'reference', 'triton', 'grouped_mm' or a Backend "
                                         r"instance"):
        fused_experts(**fused_inputs, backend="cutlass")


def test_fused_experts_backend_that_cannot_run_here(fused_inputs):
    with pytest.raises(ValueError, match=r"backend='triton' cannot run here: interpreter"):
        fused_experts(**fused_inputs, backend="triton")


def test_fused_experts_backend_type(fused_inputs):
    with pytest.raises(TypeError, match="backend must be a name, a Backend instance or class, got int"):
        fused_experts(**fused_inputs, backend=3)  # type: ignore[arg-type]
    # a Backend class (not an instance) is accepted, like ConfigurableMoE(backend=...)
    out = fused_experts(**fused_inputs, backend=ReferenceExperts)
    assert torch.equal(out, fused_experts(**fused_inputs, backend="reference"))
    # DESIGN 3's signature: the backend is the sixth positional argument
    f = fused_inputs
    positional = fused_experts(f["x"], f["w13"], f["w2"], f["topk_weights"], f["topk_ids"],
                               "reference")
    assert torch.equal(positional, out)


@pytest.mark.parametrize("change,exc,match", [
    (dict(x=torch.randn(T_F * H)), ValueError, r"x must be \[T, H\], got shape \(40,\)"),
    (dict(x=torch.ones(T_F, H, dtype=torch.int32)), ValueError,
     r"x\.dtype=torch\.int32 is unsupported"),
    (dict(w13=torch.randn(E, 2 * I, H + 1)), ValueError,
     rf"w13 must be \[E, 2\*I, H={H}\], got shape \({E}, {2 * I}, {H + 1}\)"),
    (dict(w13=torch.randn(E, 2 * I + 1, H)), ValueError, r"w13 must be \[E, 2\*I, H=8\]"),
    (dict(w13=torch.randn(2 * I, H)), ValueError, r"w13 must be \[E, 2\*I, H=8\]"),
    (dict(w2=torch.randn(E, I, H)), ValueError,
     rf"w2 must be \[E={E}, H={H}, I={I}\], got shape \({E}, {I}, {H}\)"),
    (dict(w13=torch.randn(E, 2 * I, H, dtype=torch.float16)), ValueError,
     r"w13\.dtype=torch\.float16 and w2\.dtype=torch\.float32 must equal x\.dtype=torch\.float32"),
    (dict(topk_ids=torch.zeros(T_F + 1, K, dtype=torch.int32)), ValueError,
     rf"topk_ids must be \[T={T_F}, K\], got shape \({T_F + 1}, {K}\)"),
    (dict(topk_weights=torch.rand(T_F, K + 1)), ValueError,
     rf"topk_weights shape \({T_F}, {K + 1}\) must equal topk_ids shape \({T_F}, {K}\)"),
    (dict(topk_ids=torch.zeros(T_F, K, dtype=torch.float32)), ValueError,
     r"topk_ids\.dtype=torch\.float32 must be int32 or int64"),
    (dict(topk_weights=torch.ones(T_F, K, dtype=torch.int64)), ValueError,
     r"topk_weights\.dtype=torch\.int64 must be floating point"),
    (dict(topk_ids=torch.zeros(T_F, E + 1, dtype=torch.int32),
          topk_weights=torch.rand(T_F, E + 1)), ValueError,
     rf"top_k={E + 1} exceeds num_experts={E}"),
    (dict(topk_ids=torch.zeros(T_F, K, dtype=torch.int32, device="meta")), ValueError,
     r"all tensors must be on one device, got \['cpu', 'meta'\]"),
    (dict(x=[[0.0] * H] * T_F), TypeError, r"x must be a torch\.Tensor, got list"),
    (dict(topk_ids=None), TypeError, r"topk_ids must be a torch\.Tensor, got NoneType"),
])
def test_fused_experts_shape_dtype_errors(fused_inputs, change, exc, match):
    with pytest.raises(exc, match=match):
        fused_experts(**_with(fused_inputs, **change), backend="reference")


# ------------------------------------------------------------------ validated at build time
# These name a bad argument when the object is built (STYLE: configs validated in
# __post_init__, errors name the field), not at the first forward or never.


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_num_tokens=2.5), r"MoEConfig\.max_num_tokens=2\.5 is invalid"),
    (dict(max_num_tokens=True), r"MoEConfig\.max_num_tokens=True is invalid"),
    (dict(shared_intermediate_size=2.5), r"MoEConfig\.shared_intermediate_size=2\.5 is invalid"),
    (dict(shared_intermediate_size=True), r"MoEConfig\.shared_intermediate_size=True is invalid"),
])
def test_moe_config_int_fields_reject_non_ints(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _cfg(**kwargs)


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(repeat_count=1.5), ValueError, r"repeat_count=1\.5"),
    (dict(repeat_count=True), ValueError, r"repeat_count=True"),
    (dict(layer_idx=-1), ValueError, r"layer_idx=-1 is invalid"),
    (dict(layer_idx="3"), ValueError, r"layer_idx='3' is invalid"),
    (dict(recorder=[]), TypeError, r"recorder=\[\] is invalid"),
])
def test_layer_constructor_validates_eagerly(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ConfigurableMoE(_cfg(), device="cpu", **kwargs)


def test_failed_load_weights_leaves_previous_weights():
    # A load_weights call that raises must not leave a loaded layer half-updated (routed
    # experts from the new call, shared expert from the old one) and still usable.
    cfg = _cfg(shared_intermediate_size=4)
    old, new = make_case(cfg, 5, seed=8), make_case(cfg, 5, seed=9)
    with ConfigurableMoE(cfg, device="cpu") as layer:
        layer.load_weights(old.w13, old.w2, old.shared)
        before = layer(old.x, old.logits)
        bad_shared = dict(new.shared, w2=torch.zeros(1, 1))
        with pytest.raises(ValueError, match=r"shared\['w2'\] has shape"):
            layer.load_weights(new.w13, new.w2, bad_shared)
        torch.testing.assert_close(layer(old.x, old.logits), before, rtol=0, atol=0)


# ------------------------------------------------------------------ misuse refused (issue 14)


def test_balancer_handle_bound_to_a_second_layer_is_refused():
    # issue 14 item 4: one handle given to two layers used to be accepted, and after the first
    # migration both layers' outputs were silently wrong (relative error up to 1.7)
    from eplb import EPLBConfig, LoadBalancer

    bal = LoadBalancer(EPLBConfig(num_layers=2, num_experts=E, num_slots=E, num_ranks=1,
                                  rebalance_interval=2))
    handle = bal.layer(0)
    with ConfigurableMoE(_cfg(), device="cpu", balancer=handle, layer_idx=0):
        with pytest.raises(ValueError, match=r"balancer\.layer\(0\) is already bound to another "
                                             r"ConfigurableMoE; give each layer its own handle"):
            ConfigurableMoE(_cfg(), device="cpu", balancer=handle, layer_idx=1)
        with ConfigurableMoE(_cfg(), device="cpu", balancer=bal.layer(1), layer_idx=1):
            pass  # its own handle is fine


@pytest.mark.parametrize("counts,match", [
    ([5.0], r"all_rank_num_tokens=\[5\.0\] must be a sequence of ints"),
    ([torch.tensor(5.0)], r"all_rank_num_tokens=\[tensor\(5\.\)\] must be a sequence of ints"),
    ("5", r"all_rank_num_tokens='5' must be a sequence of ints"),
])
def test_forward_all_rank_num_tokens_must_be_ints(layer_and_case, counts, match):
    layer, case = layer_and_case
    with pytest.raises(ValueError, match=match):
        layer(case.x, case.logits, all_rank_num_tokens=counts)
    out = layer(case.x, case.logits, all_rank_num_tokens=[torch.tensor(5)])  # an int tensor
    assert out.shape == case.x.shape


def _views(w13, w2):
    """Non-contiguous views holding the same values: a transposed copy seen back through a
    transpose (last dim not contiguous), and a slice of a wider tensor (row stride H + 3)."""
    w13_t = w13.transpose(1, 2).contiguous().transpose(1, 2)
    w2_t = w2.transpose(1, 2).contiguous().transpose(1, 2)
    wide = torch.zeros(*w13.shape[:2], w13.shape[2] + 3)
    wide[..., : w13.shape[2]] = w13
    return {"w13 transposed": (w13_t, w2), "w2 transposed": (w13, w2_t),
            "w13 sliced": (wide[..., : w13.shape[2]], w2)}


@pytest.mark.parametrize("view", ["w13 transposed", "w2 transposed", "w13 sliced"])
@pytest.mark.parametrize("backend", ["auto", "reference", "grouped_mm"])
def test_fused_experts_non_contiguous_weights_named(fused_inputs, view, backend):
    # issue 14 item 6: the default CPU backend raised a bare AssertionError (computed under -O)
    w13, w2 = _views(fused_inputs["w13"], fused_inputs["w2"])[view]
    name = view.split()[0]
    assert not (w13.is_contiguous() and w2.is_contiguous())
    with pytest.raises(ValueError, match=rf"{name} must be contiguous, got strides \(.*\) for "
                                         rf"shape .* \(a transposed or sliced view\): pass "
                                         rf"{name}\.contiguous\(\)"):
        fused_experts(**_with(fused_inputs, w13=w13, w2=w2), backend=backend)


@pytest.mark.parametrize("view", ["w13 transposed", "w2 transposed", "w13 sliced"])
def test_grouped_mm_unchecked_non_contiguous_weights_named(view):
    # check_inputs=False skips fused_experts' own checks; the backend still names the tensor.
    # I = H = 8 fp32: 32-byte rows, a shape grouped_mm takes when contiguous.
    g = torch.Generator().manual_seed(8)
    inputs = dict(x=torch.randn(T_F, 8, generator=g), w13=torch.randn(E, 16, 8, generator=g),
                  w2=torch.randn(E, 8, 8, generator=g), topk_weights=torch.rand(T_F, K),
                  topk_ids=torch.randint(0, E, (T_F, K), generator=g, dtype=torch.int32))
    fused_experts(**inputs, backend="grouped_mm", check_inputs=False)  # contiguous: runs
    w13, w2 = _views(inputs["w13"], inputs["w2"])[view]
    fused_inputs = inputs
    name = view.split()[0]
    with pytest.raises(ValueError, match=rf"{name} has strides \(.*\) for shape .*: "
                                         r"GroupedMMExperts needs a contiguous last dimension "
                                         r"and every other stride a multiple of 16 bytes"):
        fused_experts(**_with(fused_inputs, w13=w13, w2=w2), backend="grouped_mm",
                      check_inputs=False)


def test_grouped_mm_non_contiguous_weights_refused_under_python_O(fused_inputs, tmp_path):
    # Under ``python -O`` the old assert vanished and the call computed; the ValueError stays.
    import subprocess
    import sys

    script = tmp_path / "o.py"
    script.write_text(
        "import torch\n"
        "from moerun import fused_experts\n"
        "assert False  # stripped by -O\n"
        "x = torch.randn(5, 8); w13 = torch.randn(4, 8, 16).transpose(1, 2)\n"
        "w2 = torch.randn(4, 8, 8); w = torch.rand(5, 2)\n"
        "ids = torch.randint(0, 4, (5, 2), dtype=torch.int32)\n"
        "try:\n"
        "    fused_experts(x, w13, w2, w, ids, backend='grouped_mm', check_inputs=False)\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n")
    out = subprocess.run([sys.executable, "-O", str(script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ValueError: w13 has strides (128, 1, 16) for shape (4, 16, 8)" in out.stdout


@pytest.mark.parametrize("view", ["w13 transposed", "w2 transposed", "w13 sliced"])
def test_load_weights_takes_any_layout_once(view):
    # A layer copies weights into its own contiguous slots at load, so views are accepted and
    # give exactly the contiguous result.
    cfg = _cfg()
    case = make_case(cfg, 6, seed=12)
    w13, w2 = _views(case.w13, case.w2)[view]
    with ConfigurableMoE(cfg, device="cpu") as ref_layer, \
            ConfigurableMoE(cfg, device="cpu") as layer:
        ref_layer.load_weights(case.w13, case.w2)
        layer.load_weights(w13, w2)
        assert layer.w13.is_contiguous() and layer.w2.is_contiguous()
        torch.testing.assert_close(layer(case.x, case.logits),
                                   ref_layer(case.x, case.logits), rtol=0, atol=0)
        items = [(e, "gate_up_proj", w13[e]) for e in range(E)] + \
            [(e, "down_proj", w2[e]) for e in range(E)]
        layer.load_expert_weights(items)
        torch.testing.assert_close(layer(case.x, case.logits),
                                   ref_layer(case.x, case.logits), rtol=0, atol=0)


def test_allgather_dispatch_rows_must_match_the_plan():
    from moerun.comm import AllGatherReduceScatter, ChunkCounts, CollectiveCursor, Communicator
    from moerun.comm.base import PreparedDispatch

    strategy = AllGatherReduceScatter(Communicator(Mapping(), layer_idx=0), slot_partition(4, 1))
    prepared = PreparedDispatch(chunk=ChunkCounts(counts=(3,), rank=0),
                                cursor=CollectiveCursor(step=0))
    with pytest.raises(ValueError, match=r"AllGatherReduceScatter\.dispatch: x has 2 rows but "
                                         r"the chunk plan gives this rank 3 \(counts \(3,\)\)"):
        strategy.dispatch(torch.zeros(2, H), torch.zeros(2, K, dtype=torch.int32),
                          torch.zeros(2, K), prepared=prepared)


def test_rel_err_refuses_mismatched_shapes_and_exports_step_mismatch():
    import moerun
    from moerun.errors import LayerStepMismatch
    from moerun.testing import rel_err

    with pytest.raises(ValueError, match=r"rel_err: out has shape \(2, 3\) but ref has \(3, 2\)"):
        rel_err(torch.ones(2, 3), torch.ones(3, 2))
    assert rel_err(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 2.0])) == pytest.approx(0.2 ** 0.5)
    assert moerun.LayerStepMismatch is LayerStepMismatch


def test_check_inputs_default_resolves_on_for_a_cpu_layer():
    """DESIGN 9: ``check_inputs=None`` (the default) is on for a CPU layer (off on CUDA:
    tests/test_layer_gpu.py), and anything but True/False/None is refused by name."""
    from moerun import ConfigurableMoE, MoEConfig

    cfg = MoEConfig(num_experts=4, top_k=2, hidden_size=8, intermediate_size=8)
    assert cfg.check_inputs is None
    assert ConfigurableMoE(cfg, device="cpu").config.check_inputs is True
    assert ConfigurableMoE(cfg.replace(check_inputs=False),
                           device="cpu").config.check_inputs is False
    with pytest.raises(ValueError, match=r"MoEConfig.check_inputs='yes' is invalid: must be "
                                         r"True, False or None"):
        MoEConfig(num_experts=4, top_k=2, hidden_size=8, intermediate_size=8,
                  check_inputs="yes")
