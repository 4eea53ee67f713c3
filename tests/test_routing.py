"""Tests of moerun.routing.

Order: hand-worked cases -> sweeps against an independent fp64 reference (per-token Python
loops, ranking by ``sorted``, never ``torch.topk``) -> ties -> low-precision inputs -> the Hugging
Face routers themselves -> every error message.

Ties make ids ambiguous, so the sweeps never compare ids with the reference. They check, per
token: the multiset of selection scores of our ids equals the reference's; our weights equal the
reference weight formula applied to *our* ids (pairing); the sorted weights agree; grouped
methods use at most ``topk_group`` groups.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import pytest
import torch

from moerun.config import RoutingConfig, RoutingMethod
from moerun.routing import (
    Routed,
    group_limited_greedy,
    llama4_top1,
    noaux_tc,
    route,
    sigmoid_bias_topk,
    sigmoid_topk,
    softmax_topk,
    topk_softmax,
)

M = RoutingMethod
GROUPED = (M.GROUP_LIMITED_GREEDY, M.NOAUX_TC)
# fp32 softmax/sigmoid/renormalization of O(1) values against fp64: a few ulps of fp32.
ATOL = 1e-6
RTOL = 1e-5
# HF routers do the same fp32 math in another order (e.g. softmax->topk->renorm vs
# topk->softmax): a few fp32 ulps apart.
HF_ATOL = 1e-6
RENORM_EPS = 1e-20  # DeepSeek's renormalization epsilon (see routing._RENORM_EPS)


def _cfg(method: M, *, renormalize=True, groups=1, topk_group=1, scale=1.0) -> RoutingConfig:
    return RoutingConfig(
        method=method,
        renormalize=renormalize,
        num_expert_group=groups,
        topk_group=topk_group,
        routed_scaling_factor=scale,
    )


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _assert_routed(out: Routed, num_tokens: int, top_k: int) -> None:
    assert isinstance(out, Routed)
    assert out.topk_weights.shape == (num_tokens, top_k)
    assert out.topk_ids.shape == (num_tokens, top_k)
    assert out.topk_weights.dtype == torch.float32
    assert out.topk_ids.dtype == torch.int32
    assert out.topk_weights.is_contiguous() and out.topk_ids.is_contiguous()


def _rows(out: Routed) -> tuple[list[list[float]], list[list[int]]]:
    return out.topk_weights.double().tolist(), out.topk_ids.tolist()


# ------------------------------------------------------------------ hand-worked cases


def test_softmax_topk_by_hand():
    # softmax(log p) = p = [.1, .3, .2, .4]; top-2 = experts 3 (.4) and 1 (.3).
    logits = torch.tensor([[0.1, 0.3, 0.2, 0.4]]).log()
    out = softmax_topk(logits, 2, renormalize=False)
    _assert_routed(out, 1, 2)
    assert out.topk_ids.tolist() == [[3, 1]]
    torch.testing.assert_close(out.topk_weights, torch.tensor([[0.4, 0.3]]))
    out = softmax_topk(logits, 2, renormalize=True, routed_scaling_factor=2.0)
    torch.testing.assert_close(out.topk_weights, torch.tensor([[8 / 7, 6 / 7]]))
    # Mixtral: top-2 logits then softmax over the two = the renormalized weights above.
    out = topk_softmax(logits, 2)
    assert out.topk_ids.tolist() == [[3, 1]]
    torch.testing.assert_close(out.topk_weights, torch.tensor([[4 / 7, 3 / 7]]))


def test_group_limited_greedy_by_hand():
    # 8 experts in 4 groups of 2; p = softmax(log p):
    #   group     0          1          2          3
    #   p     [.05 .02]  [.20 .05]  [.18 .18]  [.25 .07]   group max: .05 .20 .18 .25
    # topk_group=2 keeps groups 3 and 1, so top-3 = experts 6 (.25), 2 (.20), 7 (.07); without
    # groups it would take expert 4 or 5 (.18) third.
    p = torch.tensor([[0.05, 0.02, 0.20, 0.05, 0.18, 0.18, 0.25, 0.07]])
    out = group_limited_greedy(
        p.log(), 3, num_expert_group=4, topk_group=2, renormalize=False, routed_scaling_factor=2.0
    )
    assert out.topk_ids.tolist() == [[6, 2, 7]]
    torch.testing.assert_close(out.topk_weights, torch.tensor([[0.50, 0.40, 0.14]]))
    out = group_limited_greedy(
        p.log(), 3, num_expert_group=4, topk_group=2, renormalize=True, routed_scaling_factor=1.0
    )
    torch.testing.assert_close(out.topk_weights, torch.tensor([[25 / 52, 20 / 52, 7 / 52]]))


def test_noaux_tc_by_hand():
    # 8 experts in 4 groups of 2; s = sigmoid(logits), choice c = s + bias:
    #   group      0            1            2            3
    #   s      [.50 .40]    [.30 .10]    [.80 .20]    [.45 .05]
    #   bias   [.00 .35]    [.70 .00]    [.00 .40]    [.00 .00]
    #   c      [.50 .75]    [1.0 .10]    [.80 .60]    [.45 .05]
    #   top-2 sum  1.25        1.10         1.40          .50
    # topk_group=2 keeps groups 2 and 0; top-2 c there: expert 4 (.80), 1 (.75). Expert 2 has
    # the best c overall but its group loses. Weights are the unbiased s: .8 and .4.
    s = [0.50, 0.40, 0.30, 0.10, 0.80, 0.20, 0.45, 0.05]
    logits = torch.tensor([[_logit(v) for v in s]])
    bias = torch.tensor([0.0, 0.35, 0.70, 0.0, 0.0, 0.40, 0.0, 0.0])
    kw = dict(correction_bias=bias, num_expert_group=4, topk_group=2)
    out = noaux_tc(logits, 2, renormalize=False, routed_scaling_factor=2.5, **kw)
    assert out.topk_ids.tolist() == [[4, 1]]
    torch.testing.assert_close(out.topk_weights, torch.tensor([[2.0, 1.0]]))
    out = noaux_tc(logits, 2, renormalize=True, routed_scaling_factor=2.5, **kw)
    torch.testing.assert_close(out.topk_weights, torch.tensor([[5 / 3, 5 / 6]]))


def test_sigmoid_methods_and_llama4_by_hand():
    # s = [.9, .6, .3]; bias [-.5, 0, .5] makes c = [.4, .6, .8]: the bias flips the order,
    # the weights stay the unbiased sigmoids.
    logits = torch.tensor([[_logit(0.9), _logit(0.6), _logit(0.3)]])
    out = sigmoid_topk(logits, 2, renormalize=False)
    assert out.topk_ids.tolist() == [[0, 1]]
    torch.testing.assert_close(out.topk_weights, torch.tensor([[0.9, 0.6]]))
    out = sigmoid_topk(logits, 2, renormalize=True)
    torch.testing.assert_close(out.topk_weights, torch.tensor([[0.6, 0.4]]))
    bias = torch.tensor([-0.5, 0.0, 0.5])
    out = sigmoid_bias_topk(logits, 2, correction_bias=bias, renormalize=False)
    assert out.topk_ids.tolist() == [[2, 1]]
    torch.testing.assert_close(out.topk_weights, torch.tensor([[0.3, 0.6]]))
    out = sigmoid_bias_topk(logits, 2, correction_bias=bias, renormalize=True)
    torch.testing.assert_close(out.topk_weights, torch.tensor([[1 / 3, 2 / 3]]))
    out = llama4_top1(torch.tensor([[1.0, 3.0, -2.0], [0.5, -1.0, 0.0]]))
    _assert_routed(out, 2, 1)
    assert out.topk_ids.tolist() == [[1], [0]]
    expected = torch.tensor([[3.0], [0.5]]).sigmoid()
    torch.testing.assert_close(out.topk_weights, expected)


def test_one_expert():
    logits = torch.randn(3, 1)
    for method in M:
        bias = torch.zeros(1) if method in (M.NOAUX_TC, M.SIGMOID_BIAS_TOPK) else None
        out = route(logits, top_k=1, config=_cfg(method), correction_bias=bias)
        _assert_routed(out, 3, 1)
        assert out.topk_ids.tolist() == [[0]] * 3


# ------------------------------------------------------------------ fp64 reference


@dataclass
class _Ref:
    key: list[float]  # [E] score the selection ranks by
    gate: list[float]  # [E] score the weight is taken from
    sel: list[int]  # [K] selected experts
    renorm: bool
    eps: float


def _sig(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def _ref_token(method, x, k, cfg, bias) -> _Ref:
    """One token, fp64, plain Python: rank with ``sorted`` (stable), group by index arithmetic."""
    num_experts = len(x)
    experts = list(range(num_experts))
    if method in (M.SOFTMAX_TOPK, M.GROUP_LIMITED_GREEDY):
        m = max(x)
        z = sum(math.exp(v - m) for v in x)
        key = gate = [math.exp(v - m) / z for v in x]
    elif method == M.TOPK_SOFTMAX:
        m = max(x)
        key, gate = list(x), [math.exp(v - m) for v in x]  # softmax over K = renormalized exp
    elif method == M.LLAMA4:
        key, gate = list(x), [_sig(v) for v in x]
    else:
        gate = [_sig(v) for v in x]
        b = bias if bias is not None else [0.0] * num_experts
        key = [g + bb for g, bb in zip(gate, b)] if method != M.SIGMOID_TOPK else list(gate)
    candidates = experts
    if method in GROUPED and cfg.num_expert_group > 1:
        per = num_experts // cfg.num_expert_group
        members = [experts[g * per : (g + 1) * per] for g in range(cfg.num_expert_group)]
        if method == M.GROUP_LIMITED_GREEDY:
            group_score = [max(key[e] for e in mem) for mem in members]
        else:
            group_score = [sum(sorted((key[e] for e in mem), reverse=True)[:2]) for mem in members]
        kept = sorted(range(cfg.num_expert_group), key=lambda g: -group_score[g])[: cfg.topk_group]
        candidates = [e for g in sorted(kept) for e in members[g]]
    sel = sorted(candidates, key=lambda e: -key[e])[:k]
    if method == M.TOPK_SOFTMAX:
        renorm, eps = True, 0.0
    elif method == M.LLAMA4:
        renorm, eps = False, 0.0
    else:
        renorm = cfg.renormalize
        eps = 0.0 if method == M.SOFTMAX_TOPK else RENORM_EPS
    return _Ref(key, gate, sel, renorm, eps)


def _ref_weights(ref: _Ref, ids: list[int], scale: float) -> list[float]:
    w = [ref.gate[e] for e in ids]
    if ref.renorm:
        total = sum(w) + ref.eps
        w = [v / total for v in w]
    return [v * scale for v in w]


def _close(a: list[float], b: list[float]) -> bool:
    return all(abs(u - v) <= ATOL + RTOL * abs(v) for u, v in zip(a, b, strict=True))


def _check_against_reference(out, logits, method, top_k, cfg, bias=None) -> None:
    num_tokens, num_experts = logits.shape
    _assert_routed(out, num_tokens, top_k)
    weights, ids = _rows(out)
    x64 = logits.double().tolist()
    b64 = None if bias is None else bias.double().tolist()
    for t in range(num_tokens):
        ref = _ref_token(method, x64[t], top_k, cfg, b64)
        row = ids[t]
        assert len(set(row)) == top_k and all(0 <= e < num_experts for e in row), row
        ours_keys = sorted(ref.key[e] for e in row)
        ref_keys = sorted(ref.key[e] for e in ref.sel)
        assert _close(ours_keys, ref_keys), (t, row, ref.sel)
        scale = cfg.routed_scaling_factor
        assert _close(weights[t], _ref_weights(ref, row, scale)), (t, weights[t])
        assert _close(sorted(weights[t]), sorted(_ref_weights(ref, ref.sel, scale))), t
        if method in GROUPED and cfg.num_expert_group > 1:
            per = num_experts // cfg.num_expert_group
            assert len({e // per for e in row}) <= cfg.topk_group, row


# (T, E, K) for the ungrouped methods: zero tokens, one expert, top_k == E, a wide one.
FLAT_SHAPES = [(0, 8, 2), (1, 1, 1), (7, 8, 8), (5, 16, 1), (33, 64, 6)]
# (T, E, K, G, topk_group) for the grouped methods.
GROUP_SHAPES = [
    (0, 16, 4, 4, 2),
    (1, 8, 8, 4, 4),  # top_k == E: every group kept
    (9, 16, 4, 4, 2),
    (33, 64, 8, 8, 4),
    (5, 6, 3, 1, 1),  # one group
    (4, 12, 2, 6, 1),  # two experts per group, top_k == the kept experts
]
GROUP_SHAPES_V2_ONLY = [(6, 8, 2, 8, 3)]  # one expert per group (noaux_tc needs two)


def _random_case(method, num_tokens, num_experts, gen):
    logits = torch.randn(num_tokens, num_experts, generator=gen) * 2.0
    bias = None
    if method in (M.NOAUX_TC, M.SIGMOID_BIAS_TOPK):
        bias = torch.randn(num_experts, generator=gen) * 0.5
    return logits, bias


@pytest.mark.parametrize("scale", [1.0, 2.5])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("shape", FLAT_SHAPES, ids=str)
@pytest.mark.parametrize(
    "method", [M.SOFTMAX_TOPK, M.TOPK_SOFTMAX, M.SIGMOID_TOPK, M.SIGMOID_BIAS_TOPK, M.LLAMA4]
)
def test_flat_methods_match_reference(method, shape, renormalize, scale):
    num_tokens, num_experts, top_k = shape
    if method == M.LLAMA4:
        top_k = 1
    gen = torch.Generator().manual_seed(zlib.crc32(f"{method.value}{shape}".encode()))
    logits, bias = _random_case(method, num_tokens, num_experts, gen)
    cfg = _cfg(method, renormalize=renormalize, scale=scale)
    before = logits.clone()
    out = route(logits, top_k=top_k, config=cfg, correction_bias=bias)
    assert torch.equal(logits, before)  # inputs untouched
    _check_against_reference(out, logits, method, top_k, cfg, bias)


@pytest.mark.parametrize("scale", [1.0, 2.5])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize(
    "method,shape",
    [(M.GROUP_LIMITED_GREEDY, s) for s in GROUP_SHAPES + GROUP_SHAPES_V2_ONLY]
    + [(M.NOAUX_TC, s) for s in GROUP_SHAPES],
    ids=str,
)
def test_grouped_methods_match_reference(method, shape, renormalize, scale):
    num_tokens, num_experts, top_k, groups, topk_group = shape
    gen = torch.Generator().manual_seed(zlib.crc32(f"{method.value}{shape}".encode()))
    logits, bias = _random_case(method, num_tokens, num_experts, gen)
    cfg = _cfg(method, renormalize=renormalize, groups=groups, topk_group=topk_group, scale=scale)
    out = route(logits, top_k=top_k, config=cfg, correction_bias=bias)
    _check_against_reference(out, logits, method, top_k, cfg, bias)


def test_scaling_and_renormalize_flags():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(11, 16, generator=gen)
    bias = torch.randn(16, generator=gen) * 0.1
    for method in (M.SOFTMAX_TOPK, M.SIGMOID_TOPK, M.SIGMOID_BIAS_TOPK, *GROUPED):
        b = bias if method in (M.NOAUX_TC, M.SIGMOID_BIAS_TOPK) else None
        grp = dict(groups=4, topk_group=2) if method in GROUPED else {}
        plain, norm, scaled = (
            route(logits, top_k=3, config=_cfg(method, **kw, **grp), correction_bias=b)
            for kw in (
                dict(renormalize=False),
                dict(renormalize=True),
                dict(renormalize=True, scale=2.5),
            )
        )
        assert torch.equal(plain.topk_ids, norm.topk_ids)
        assert torch.equal(norm.topk_ids, scaled.topk_ids)
        torch.testing.assert_close(norm.topk_weights.sum(-1), torch.ones(11))
        expected = plain.topk_weights / plain.topk_weights.sum(-1, keepdim=True)
        torch.testing.assert_close(norm.topk_weights, expected)
        torch.testing.assert_close(scaled.topk_weights, norm.topk_weights * 2.5)
    # TOPK_SOFTMAX is always normalized, LLAMA4 never: both ignore `renormalize`.
    for method, k in ((M.TOPK_SOFTMAX, 3), (M.LLAMA4, 1)):
        a = route(logits, top_k=k, config=_cfg(method, renormalize=False))
        b_ = route(logits, top_k=k, config=_cfg(method, renormalize=True, scale=3.0))
        torch.testing.assert_close(b_.topk_weights, a.topk_weights * 3.0)


# ------------------------------------------------------------------ ties


@pytest.mark.parametrize(
    "method", [M.SOFTMAX_TOPK, M.TOPK_SOFTMAX, M.SIGMOID_TOPK, M.SIGMOID_BIAS_TOPK, M.LLAMA4]
)
def test_ties_flat(method):
    # Integer logits in [-2, 2] over 12 experts: every row has many exact ties, also at the
    # top-k boundary. Zero bias keeps the biased choice exactly tied as well.
    gen = torch.Generator().manual_seed(1)
    logits = torch.randint(-2, 3, (40, 12), generator=gen).float()
    logits[0] = 1.0  # a row that is one big tie
    top_k = 1 if method == M.LLAMA4 else 5
    bias = torch.zeros(12) if method == M.SIGMOID_BIAS_TOPK else None
    cfg = _cfg(method, renormalize=True, scale=1.5)
    out = route(logits, top_k=top_k, config=cfg, correction_bias=bias)
    _check_against_reference(out, logits, method, top_k, cfg, bias)
    if method != M.LLAMA4:
        torch.testing.assert_close(out.topk_weights[0], torch.full((top_k,), 1.5 / top_k))


@pytest.mark.parametrize("method", GROUPED)
def test_ties_grouped(method):
    # Every group holds the same integer logits (and bias), so all group scores tie and the
    # experts tie within groups: whichever groups torch.topk keeps, the selected scores and
    # weights are determined.
    gen = torch.Generator().manual_seed(2)
    base = torch.randint(-2, 3, (30, 4), generator=gen).float()
    logits = base.repeat(1, 4)  # [30, 16], 4 groups of 4
    bias = torch.tensor([0.0, 0.25, 0.0, -0.25]).repeat(4) if method == M.NOAUX_TC else None
    cfg = _cfg(method, renormalize=True, groups=4, topk_group=2, scale=2.0)
    out = route(logits, top_k=5, config=cfg, correction_bias=bias)
    _check_against_reference(out, logits, method, 5, cfg, bias)


# ------------------------------------------------------------------ low-precision inputs


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method", list(M))
def test_half_precision_logits_are_upcast(method, dtype):
    gen = torch.Generator().manual_seed(3)
    logits, bias = _random_case(method, 17, 16, gen)
    logits = logits.to(dtype)
    top_k = 1 if method == M.LLAMA4 else 4
    grp = dict(groups=4, topk_group=2) if method in GROUPED else {}
    cfg = _cfg(method, scale=2.0, **grp)
    out = route(logits, top_k=top_k, config=cfg, correction_bias=bias)
    upcast = route(logits.float(), top_k=top_k, config=cfg, correction_bias=bias)
    assert torch.equal(out.topk_weights, upcast.topk_weights)
    assert torch.equal(out.topk_ids, upcast.topk_ids)
    _check_against_reference(out, logits, method, top_k, cfg, bias)


def test_capture_safe_under_fullgraph_compile():
    # fullgraph=True fails on any graph break: .item(), nonzero, boolean-mask indexing and
    # other data-dependent shapes or host syncs would all break the graph.
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(5)
    for method in M:
        logits, bias = _random_case(method, 9, 16, gen)
        top_k = 1 if method == M.LLAMA4 else 4
        grp = dict(groups=4, topk_group=2) if method in GROUPED else {}
        cfg = _cfg(method, scale=2.0, **grp)

        def fn(x, b, top_k=top_k, cfg=cfg):
            return route(x, top_k=top_k, config=cfg, correction_bias=b)

        compiled = torch.compile(fn, fullgraph=True, backend="eager")
        got, want = compiled(logits, bias), fn(logits, bias)
        assert torch.equal(got.topk_ids, want.topk_ids), method
        assert torch.equal(got.topk_weights, want.topk_weights), method
    torch._dynamo.reset()


# ------------------------------------------------------------------ Hugging Face routers


def _randomize(module: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            tensor.copy_(torch.randn(tensor.shape, generator=gen, dtype=tensor.dtype))


def _assert_same_routing(ours: Routed, hf_weights, hf_ids) -> None:
    """Random fp32 inputs have no ties: same id sets, weights compared id by id."""
    hf_ids_sorted, order = hf_ids.long().sort(dim=-1)
    ours_ids_sorted, our_order = ours.topk_ids.long().sort(dim=-1)
    assert torch.equal(ours_ids_sorted, hf_ids_sorted)
    torch.testing.assert_close(
        ours.topk_weights.gather(1, our_order),
        hf_weights.float().gather(1, order),
        atol=HF_ATOL,
        rtol=RTOL,
    )


HIDDEN = 16
ATTN = dict(num_attention_heads=4, num_key_value_heads=4)


def _hf_case(name: str, variant):
    """Build ``(hf_router, top_k, routing_config)`` for one HF model family."""
    tf = pytest.importorskip("transformers")
    if name == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter

        c = tf.MixtralConfig(hidden_size=HIDDEN, num_local_experts=8, num_experts_per_tok=2, **ATTN)
        return MixtralTopKRouter(c), 2, _cfg(M.TOPK_SOFTMAX)
    if name in ("qwen2_moe", "qwen3_moe"):
        if name == "qwen2_moe":
            from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter as R

            config_cls = tf.Qwen2MoeConfig
        else:
            from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter as R

            config_cls = tf.Qwen3MoeConfig
        c = config_cls(
            hidden_size=HIDDEN, num_experts=8, num_experts_per_tok=3, norm_topk_prob=variant, **ATTN
        )
        return R(c), 3, _cfg(M.SOFTMAX_TOPK, renormalize=variant)
    if name == "deepseek_v2":
        from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

        c = tf.DeepseekV2Config(
            hidden_size=HIDDEN, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
            topk_group=2, topk_method=variant, routed_scaling_factor=2.5, **ATTN,
        )
        if variant == "greedy":
            return DeepseekV2TopkRouter(c), 4, _cfg(M.SOFTMAX_TOPK, renormalize=False, scale=2.5)
        cfg = _cfg(M.GROUP_LIMITED_GREEDY, renormalize=False, groups=4, topk_group=2, scale=2.5)
        return DeepseekV2TopkRouter(c), 4, cfg
    if name == "deepseek_v3":
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

        c = tf.DeepseekV3Config(
            hidden_size=HIDDEN, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
            topk_group=2, norm_topk_prob=variant, routed_scaling_factor=2.5, **ATTN,
        )
        cfg = _cfg(M.NOAUX_TC, renormalize=variant, groups=4, topk_group=2, scale=2.5)
        return DeepseekV3TopkRouter(c), 4, cfg
    if name == "llama4":
        from transformers.models.llama4.modeling_llama4 import Llama4Router

        c = tf.Llama4TextConfig(
            hidden_size=HIDDEN, num_local_experts=8, num_experts_per_tok=1, **ATTN
        )
        return Llama4Router(c), 1, _cfg(M.LLAMA4)
    if name == "minimax_m2":
        from transformers.models.minimax_m2.modeling_minimax_m2 import MiniMaxM2TopKRouter

        c = tf.MiniMaxM2Config(
            hidden_size=HIDDEN, num_local_experts=8, num_experts_per_tok=3, **ATTN
        )
        return MiniMaxM2TopKRouter(c), 3, _cfg(M.SIGMOID_BIAS_TOPK, renormalize=True)
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name,variant",
    [
        ("mixtral", None),
        ("qwen2_moe", True),
        ("qwen2_moe", False),
        ("qwen3_moe", True),
        ("deepseek_v2", "greedy"),
        ("deepseek_v2", "group_limited_greedy"),
        ("deepseek_v3", True),
        ("deepseek_v3", False),
        ("llama4", None),
        ("minimax_m2", None),
    ],
)
def test_matches_hf_router(name, variant):
    gen = torch.Generator().manual_seed(4)
    router, top_k, cfg = _hf_case(name, variant)
    _randomize(router, gen)
    x = torch.randn(2, 13, HIDDEN, generator=gen)
    bias = None
    with torch.no_grad():
        if name == "llama4":
            # Dense [T, E] scores: sigmoid of the top-1 logit, sigmoid(-inf) = 0 elsewhere.
            hf_scores, logits = router(x.reshape(-1, HIDDEN))
            ours = route(logits, top_k=1, config=cfg)
            dense = torch.zeros_like(logits).scatter(1, ours.topk_ids.long(), ours.topk_weights)
            torch.testing.assert_close(dense, hf_scores, atol=HF_ATOL, rtol=RTOL)
            return
        if name == "minimax_m2":
            bias = torch.randn(8, generator=gen)
            logits, hf_weights, hf_ids = router(x, bias)
        else:
            logits, hf_weights, hf_ids = router(x)
        if name == "deepseek_v3":
            bias = router.e_score_correction_bias
        ours = route(logits, top_k=top_k, config=cfg, correction_bias=bias)
    _assert_same_routing(ours, hf_weights, hf_ids)


# ------------------------------------------------------------------ errors


def test_errors_on_router_logits():
    cfg = _cfg(M.SOFTMAX_TOPK)
    with pytest.raises(TypeError, match="router_logits must be a torch.Tensor"):
        route([[0.0, 1.0]], top_k=1, config=cfg)
    with pytest.raises(ValueError, match=r"router_logits must be 2-D \[T, E\], got shape \(8,\)"):
        route(torch.zeros(8), top_k=1, config=cfg)
    with pytest.raises(ValueError, match="router_logits must be 2-D"):
        route(torch.zeros(2, 3, 8), top_k=1, config=cfg)
    with pytest.raises(ValueError, match=r"router_logits.dtype=torch.float64 is not supported"):
        route(torch.zeros(2, 8, dtype=torch.float64), top_k=1, config=cfg)
    with pytest.raises(ValueError, match=r"router_logits.dtype=torch.int64"):
        route(torch.zeros(2, 8, dtype=torch.int64), top_k=1, config=cfg)


@pytest.mark.parametrize("method", list(M))
def test_errors_on_top_k(method):
    logits = torch.zeros(2, 8)
    bias = torch.zeros(8) if method in (M.NOAUX_TC, M.SIGMOID_BIAS_TOPK) else None
    cfg = _cfg(method)
    if method == M.LLAMA4:
        with pytest.raises(ValueError, match="top_k=2 is invalid for llama4"):
            route(logits, top_k=2, config=cfg)
        return
    for bad in (0, 9):
        with pytest.raises(ValueError, match=rf"top_k={bad} must be in \[1, E=8\]"):
            route(logits, top_k=bad, config=cfg, correction_bias=bias)
    for bad in (True, 2.0):
        with pytest.raises(TypeError, match="top_k must be an int"):
            route(logits, top_k=bad, config=cfg, correction_bias=bias)


@pytest.mark.parametrize("method", [M.NOAUX_TC, M.SIGMOID_BIAS_TOPK])
def test_errors_on_correction_bias(method):
    logits = torch.zeros(2, 8)
    cfg = _cfg(method)
    with pytest.raises(ValueError, match=f"correction_bias is required by {method.value}"):
        route(logits, top_k=2, config=cfg)
    with pytest.raises(ValueError, match=r"correction_bias must have shape \[E\]=\(8,\), got \(4,"):
        route(logits, top_k=2, config=cfg, correction_bias=torch.zeros(4))
    with pytest.raises(ValueError, match="correction_bias must have shape"):
        route(logits, top_k=2, config=cfg, correction_bias=torch.zeros(1, 8))
    with pytest.raises(ValueError, match=r"correction_bias.dtype=torch.int32 must be floating"):
        route(logits, top_k=2, config=cfg, correction_bias=torch.zeros(8, dtype=torch.int32))
    with pytest.raises(TypeError, match="correction_bias must be a torch.Tensor"):
        route(logits, top_k=2, config=cfg, correction_bias=[0.0] * 8)
    with pytest.raises(ValueError, match="correction_bias is on meta but router_logits on cpu"):
        route(logits, top_k=2, config=cfg, correction_bias=torch.zeros(8, device="meta"))


def test_error_on_unused_correction_bias():
    cfg = _cfg(M.SOFTMAX_TOPK)
    with pytest.raises(ValueError, match="correction_bias was given but method='softmax_topk'"):
        route(torch.zeros(2, 8), top_k=2, config=cfg, correction_bias=torch.zeros(8))


@pytest.mark.parametrize("method", GROUPED)
def test_errors_on_groups(method):
    logits = torch.zeros(2, 8)
    bias = torch.zeros(8) if method == M.NOAUX_TC else None
    fn = group_limited_greedy if method == M.GROUP_LIMITED_GREEDY else noaux_tc
    kw = dict(renormalize=True, routed_scaling_factor=1.0)
    if method == M.NOAUX_TC:
        kw["correction_bias"] = bias
    with pytest.raises(ValueError, match="num_expert_group=3 must be >= 1 and divide E=8"):
        route(logits, top_k=2, config=_cfg(method, groups=3, topk_group=1), correction_bias=bias)
    with pytest.raises(ValueError, match="num_expert_group=0 must be >= 1"):
        fn(logits, 2, num_expert_group=0, topk_group=1, **kw)
    with pytest.raises(ValueError, match=r"topk_group=3 must be in \[1, num_expert_group=2\]"):
        fn(logits, 2, num_expert_group=2, topk_group=3, **kw)
    with pytest.raises(ValueError, match=r"top_k=5 exceeds the topk_group\*E_g=4 experts"):
        route(logits, top_k=5, config=_cfg(method, groups=2, topk_group=1), correction_bias=bias)
    if method == M.NOAUX_TC:
        with pytest.raises(ValueError, match="num_expert_group=8 leaves 1 expert"):
            noaux_tc(logits, 2, num_expert_group=8, topk_group=4, **kw)
    else:  # one expert per group is fine for the max-scored groups of DeepSeek-V2
        route(logits, top_k=2, config=_cfg(method, groups=8, topk_group=4))


def test_errors_on_scale_and_config():
    logits = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="routed_scaling_factor=0.0 must be > 0"):
        softmax_topk(logits, 2, renormalize=True, routed_scaling_factor=0.0)
    with pytest.raises(ValueError, match="routed_scaling_factor=-1.0 must be > 0"):
        llama4_top1(logits, routed_scaling_factor=-1.0)
    with pytest.raises(TypeError, match="config must be a RoutingConfig, got dict"):
        route(logits, top_k=2, config={"method": "softmax_topk"})
