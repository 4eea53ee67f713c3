"""Router logits -> ``(topk_weights, topk_ids)``, one function per :class:`RoutingMethod`.

Legend: ``T`` tokens, ``E`` experts, ``K`` top-k, ``G`` expert groups (``num_expert_group``),
``E_g = E // G`` experts per group.

Arguments and contract shared by every public function here:

- ``router_logits``: ``[T, E]`` fp32/fp16/bf16, upcast to fp32 first; all math is fp32.
  ``T == 0`` is allowed and gives ``[0, K]`` outputs.
- ``top_k``: ``K`` in ``[1, E]`` (grouped methods: at most ``topk_group * E_g``).
- ``renormalize``: divide the selected weights by their sum (HF ``norm_topk_prob``).
- ``correction_bias``: ``[E]`` fp32 (other float dtypes are upcast), on the logits' device;
  it shifts the *selection* only, never the weights.
- The result is a :class:`Routed` of new, contiguous tensors on the logits' device:
  ``topk_weights [T, K] fp32`` and ``topk_ids [T, K] int32`` (distinct ids per row). The K
  columns are in descending order of the *selection* score; among exactly tied scores the
  choice and order are those of ``torch.topk`` (unspecified). Inputs are never modified.
- Side effects: none. No device->host sync and no data-dependent shapes, so every function is
  CUDA-graph-capturable and ``torch.compile(fullgraph=True)``-friendly; argument checks read
  only shapes, dtypes and devices.
- ``routed_scaling_factor`` multiplies the final weights (after renormalization), in fp32.

Semantics follow the Hugging Face ``transformers`` 5.x routers named on each function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moerun.config import SUPPORTED_DTYPES, RoutingConfig, RoutingMethod

__all__ = [
    "Routed", "route", "softmax_topk", "topk_softmax", "group_limited_greedy", "noaux_tc",
    "llama4_top1", "sigmoid_topk", "sigmoid_bias_topk",
]

# NOTE: DeepSeek's code (and HF's DeepseekV3TopkRouter) adds this to the renormalization
# denominator. We use it for the DeepSeek and sigmoid methods, so a row whose selected sigmoids
# all underflow to 0 gives zero weights instead of NaN. Qwen/Mixtral renormalize without it
# (a softmax row cannot sum to 0: its top-1 weight is >= 1/E).
_RENORM_EPS = 1e-20


@dataclass(frozen=True, kw_only=True, slots=True)
class Routed:
    """Routing decision for ``T`` tokens.

    Fields:
        topk_weights: ``[T, K]`` fp32, contiguous; weight of each selected expert.
        topk_ids: ``[T, K]`` int32, contiguous; selected expert ids in ``[0, E)``, distinct
            per row.
    """

    topk_weights: torch.Tensor
    topk_ids: torch.Tensor


# ---------------------------------------------------------------- argument checks (host only)


def _check(router_logits: torch.Tensor, top_k: int, scale: float) -> tuple[int, int]:
    """Check the arguments every method takes; return ``(T, E)``."""
    if not isinstance(router_logits, torch.Tensor):
        raise TypeError(f"router_logits must be a torch.Tensor, got {type(router_logits).__name__}")
    if router_logits.dim() != 2:
        raise ValueError(
            f"router_logits must be 2-D [T, E], got shape {tuple(router_logits.shape)}; "
            "flatten the leading dimensions first"
        )
    if router_logits.dtype not in SUPPORTED_DTYPES:
        raise ValueError(
            f"router_logits.dtype={router_logits.dtype} is not supported; "
            "use torch.float32, torch.float16 or torch.bfloat16"
        )
    num_tokens, num_experts = router_logits.shape
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"top_k must be an int, got {type(top_k).__name__}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be in [1, E={num_experts}] (router_logits.shape[1])")
    if not scale > 0:
        raise ValueError(f"routed_scaling_factor={scale} must be > 0")
    return num_tokens, num_experts


def _check_bias(
    correction_bias: torch.Tensor | None, router_logits: torch.Tensor, method: str
) -> torch.Tensor:
    """Return the bias as ``[E]`` fp32 (a no-op when it already is)."""
    bias, num_experts = correction_bias, router_logits.shape[1]
    if bias is None:
        raise ValueError(f"correction_bias is required by {method}: pass the layer's [E] fp32 bias")
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"correction_bias must be a torch.Tensor, got {type(bias).__name__}")
    if tuple(bias.shape) != (num_experts,):
        raise ValueError(
            f"correction_bias must have shape [E]=({num_experts},), got {tuple(bias.shape)}"
        )
    if not bias.is_floating_point():
        raise ValueError(f"correction_bias.dtype={bias.dtype} must be floating point (fp32)")
    if bias.device != router_logits.device:
        raise ValueError(
            f"correction_bias is on {correction_bias.device} but router_logits on "
            f"{router_logits.device}; move it to the logits' device"
        )
    return correction_bias.float()


def _check_groups(
    num_experts: int, top_k: int, num_expert_group: int, topk_group: int, min_per_group: int
) -> None:
    if not 1 <= num_expert_group <= num_experts or num_experts % num_expert_group:
        raise ValueError(
            f"num_expert_group={num_expert_group} must be >= 1 and divide E={num_experts}"
        )
    if not 1 <= topk_group <= num_expert_group:
        raise ValueError(
            f"topk_group={topk_group} must be in [1, num_expert_group={num_expert_group}]"
        )
    per_group = num_experts // num_expert_group
    if num_expert_group > 1 and per_group < min_per_group:
        raise ValueError(
            f"num_expert_group={num_expert_group} leaves {per_group} expert(s) per group; "
            f"this method scores a group by its top-{min_per_group} experts"
        )
    if top_k > topk_group * per_group:
        raise ValueError(
            f"top_k={top_k} exceeds the topk_group*E_g={topk_group * per_group} experts "
            "left after group selection"
        )


# ---------------------------------------------------------------- shared math


def _keep_groups(group_scores_TG: torch.Tensor, topk_group: int, num_experts: int) -> torch.Tensor:
    """``[T, E]`` bool, True for experts in the ``topk_group`` best groups of each token."""
    num_tokens, num_groups = group_scores_TG.shape
    group_idx_TG = group_scores_TG.topk(topk_group, dim=-1, sorted=False).indices
    keep_TG = torch.zeros_like(group_scores_TG, dtype=torch.bool).scatter_(1, group_idx_TG, True)
    return (
        keep_TG.unsqueeze(-1)
        .expand(num_tokens, num_groups, num_experts // num_groups)
        .reshape(num_tokens, num_experts)
    )


def _finish(
    weights_TK: torch.Tensor,
    ids_TK: torch.Tensor,
    *,
    renormalize: bool,
    eps: float,
    routed_scaling_factor: float,
) -> Routed:
    if renormalize:
        weights_TK = weights_TK / (weights_TK.sum(dim=-1, keepdim=True) + eps)
    weights_TK = weights_TK * routed_scaling_factor
    return Routed(topk_weights=weights_TK.contiguous(),
                  topk_ids=ids_TK.to(torch.int32).contiguous())


# ---------------------------------------------------------------- one function per method


def softmax_topk(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    renormalize: bool,
    routed_scaling_factor: float = 1.0,
) -> Routed:
    """Softmax over ``E``, top-k; weights divided by their sum iff ``renormalize``.

    Qwen2-MoE / Qwen3-MoE (``norm_topk_prob``) and DeepSeek-V2 ``topk_method="greedy"``
    (``renormalize=False``, with ``routed_scaling_factor``). ``router_logits``: ``[T, E]``;
    ``top_k``: ``K`` in ``[1, E]``. See the module docstring for the result.

    Side effects: none (the module contract above): no host sync, capturable.
    """
    _check(router_logits, top_k, routed_scaling_factor)
    weights_TK, ids_TK = router_logits.float().softmax(dim=-1).topk(top_k, dim=-1)
    return _finish(weights_TK, ids_TK, renormalize=renormalize, eps=0.0,
                   routed_scaling_factor=routed_scaling_factor)


def topk_softmax(
    router_logits: torch.Tensor, top_k: int, *, routed_scaling_factor: float = 1.0
) -> Routed:
    """Top-k logits, then softmax over the ``K`` selected (Mixtral); always normalized.

    Equals softmax -> top-k -> renormalize (HF's formulation) up to rounding.

    Side effects: none (the module contract above): no host sync, capturable.
    """
    _check(router_logits, top_k, routed_scaling_factor)
    values_TK, ids_TK = router_logits.float().topk(top_k, dim=-1)
    return _finish(values_TK.softmax(dim=-1), ids_TK, renormalize=False, eps=0.0,
                   routed_scaling_factor=routed_scaling_factor)


def group_limited_greedy(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool,
    routed_scaling_factor: float,
) -> Routed:
    """DeepSeek-V2 ``topk_method="group_limited_greedy"``.

    Softmax over ``E``; a group's score is its max; keep the ``topk_group`` best of the
    ``G = num_expert_group`` groups; top-k softmax scores among the kept experts; renormalize
    (``sum + 1e-20``) iff ``renormalize``; then always ``* routed_scaling_factor``.

    NOTE: HF 5.x's DeepseekV2TopkRouter never renormalizes (it drops ``norm_topk_prob``) and
    always scales; the original DeepSeek code renormalized iff ``norm_topk_prob`` and scaled
    only when not renormalizing. Released V2 checkpoints use ``norm_topk_prob=False``, where
    all three agree. HF masks dropped experts to 0, we mask to -inf so that the ids always
    respect the group limit; the weights are identical (kept scores are >= 0).

    Side effects: none (the module contract above): no host sync, capturable.
    """
    num_tokens, num_experts = _check(router_logits, top_k, routed_scaling_factor)
    _check_groups(num_experts, top_k, num_expert_group, topk_group, min_per_group=1)
    per_group = num_experts // num_expert_group
    scores_TE = router_logits.float().softmax(dim=-1)
    choice_TE = scores_TE
    if topk_group < num_expert_group:
        # NOTE: explicit sizes, not -1: view(-1, ...) is ambiguous when T == 0.
        group_scores_TG = scores_TE.view(num_tokens, num_expert_group, per_group).amax(dim=-1)
        keep_TE = _keep_groups(group_scores_TG, topk_group, num_experts)
        choice_TE = scores_TE.masked_fill(~keep_TE, float("-inf"))
    weights_TK, ids_TK = choice_TE.topk(top_k, dim=-1)
    return _finish(weights_TK, ids_TK, renormalize=renormalize, eps=_RENORM_EPS,
                   routed_scaling_factor=routed_scaling_factor)


def noaux_tc(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    correction_bias: torch.Tensor,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool,
    routed_scaling_factor: float,
) -> Routed:
    """DeepSeek-V3 (``DeepseekV3TopkRouter``): bias-corrected, group-limited sigmoid routing.

    ``scores = sigmoid(logits)``; ``choice = scores + correction_bias`` (``[E]``, fp32);
    a group's score is the sum of its top-2 ``choice`` values; keep the ``topk_group`` best
    groups; select top-k ``choice`` among the kept experts; weights are the *unbiased*
    ``scores`` of the selected experts, divided by ``sum + 1e-20`` iff ``renormalize``, then
    always ``* routed_scaling_factor``. With ``G > 1`` each group needs >= 2 experts.

    Side effects: none (the module contract above): no host sync, capturable.
    """
    num_tokens, num_experts = _check(router_logits, top_k, routed_scaling_factor)
    bias_E = _check_bias(correction_bias, router_logits, "noaux_tc")
    _check_groups(num_experts, top_k, num_expert_group, topk_group, min_per_group=2)
    per_group = num_experts // num_expert_group
    scores_TE = router_logits.float().sigmoid()
    choice_TE = scores_TE + bias_E
    if topk_group < num_expert_group:
        choice_TGe = choice_TE.view(num_tokens, num_expert_group, per_group)
        group_scores_TG = choice_TGe.topk(2, dim=-1).values.sum(dim=-1)
        keep_TE = _keep_groups(group_scores_TG, topk_group, num_experts)
        choice_TE = choice_TE.masked_fill(~keep_TE, float("-inf"))
    ids_TK = choice_TE.topk(top_k, dim=-1).indices
    return _finish(scores_TE.gather(1, ids_TK), ids_TK, renormalize=renormalize,
                   eps=_RENORM_EPS, routed_scaling_factor=routed_scaling_factor)


def llama4_top1(router_logits: torch.Tensor, *, routed_scaling_factor: float = 1.0) -> Routed:
    """Llama 4 (``Llama4Router``): the top-1 logit's expert, weight ``sigmoid(logit)``.

    The caller applies the weight to the expert *input* (``apply_router_weight_on_input``);
    routing only returns it. Results are ``[T, 1]``.

    Side effects: none (the module contract above): no host sync, capturable.
    """
    _check(router_logits, 1, routed_scaling_factor)
    values_T1, ids_T1 = router_logits.float().topk(1, dim=-1)
    return _finish(values_T1.sigmoid(), ids_T1, renormalize=False, eps=0.0,
                   routed_scaling_factor=routed_scaling_factor)


def sigmoid_topk(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    renormalize: bool,
    routed_scaling_factor: float = 1.0,
) -> Routed:
    """Sigmoid, top-k; weights divided by ``sum + 1e-20`` iff ``renormalize``.

    Side effects: none (the module contract above): no host sync, capturable.
    """
    _check(router_logits, top_k, routed_scaling_factor)
    weights_TK, ids_TK = router_logits.float().sigmoid().topk(top_k, dim=-1)
    return _finish(weights_TK, ids_TK, renormalize=renormalize, eps=_RENORM_EPS,
                   routed_scaling_factor=routed_scaling_factor)


def sigmoid_bias_topk(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    correction_bias: torch.Tensor,
    renormalize: bool,
    routed_scaling_factor: float = 1.0,
) -> Routed:
    """MiniMax-M2 (``MiniMaxM2TopKRouter``): select top-k of ``sigmoid + correction_bias``.

    Weights are the *unbiased* sigmoids of the selected experts, divided by ``sum + 1e-20``
    iff ``renormalize`` (HF always renormalizes, without the epsilon).

    Side effects: none (the module contract above): no host sync, capturable.
    """
    _check(router_logits, top_k, routed_scaling_factor)
    bias_E = _check_bias(correction_bias, router_logits, "sigmoid_bias_topk")
    scores_TE = router_logits.float().sigmoid()
    ids_TK = (scores_TE + bias_E).topk(top_k, dim=-1).indices
    return _finish(scores_TE.gather(1, ids_TK), ids_TK, renormalize=renormalize,
                   eps=_RENORM_EPS, routed_scaling_factor=routed_scaling_factor)


# ---------------------------------------------------------------- dispatcher


def route(
    router_logits: torch.Tensor,
    *,
    top_k: int,
    config: RoutingConfig,
    correction_bias: torch.Tensor | None = None,
) -> Routed:
    """Route ``T`` tokens with ``config.method``.

    Args:
        router_logits: ``[T, E]`` fp32/fp16/bf16 router output (upcast to fp32 here).
        top_k: ``K`` experts per token, in ``[1, E]`` (must be 1 for ``LLAMA4``).
        config: the :class:`RoutingConfig`; ``renormalize`` is ignored by ``TOPK_SOFTMAX``
            (always normalized) and ``LLAMA4``.
        correction_bias: ``[E]`` fp32 selection bias; required by ``NOAUX_TC`` and
            ``SIGMOID_BIAS_TOPK`` and rejected by every other method.

    Returns:
        :class:`Routed` (``[T, K]`` fp32 weights, ``[T, K]`` int32 ids). No side effects,
        no host sync, capture-safe.
    """
    if not isinstance(config, RoutingConfig):
        raise TypeError(f"config must be a RoutingConfig, got {type(config).__name__}")
    method = config.method
    if correction_bias is not None and not config.uses_correction_bias:
        raise ValueError(
            f"correction_bias was given but method={method.value!r} does not use one; pass "
            "None, or use noaux_tc / sigmoid_bias_topk"
        )
    x, k = router_logits, top_k
    scale = dict(routed_scaling_factor=config.routed_scaling_factor)
    norm = dict(renormalize=config.renormalize, **scale)
    groups = dict(num_expert_group=config.num_expert_group, topk_group=config.topk_group)
    if method is RoutingMethod.SOFTMAX_TOPK:
        return softmax_topk(x, k, **norm)
    if method is RoutingMethod.TOPK_SOFTMAX:
        return topk_softmax(x, k, **scale)
    if method is RoutingMethod.GROUP_LIMITED_GREEDY:
        return group_limited_greedy(x, k, **groups, **norm)
    if method is RoutingMethod.NOAUX_TC:
        return noaux_tc(x, k, correction_bias=correction_bias, **groups, **norm)
    if method is RoutingMethod.LLAMA4:
        if isinstance(k, bool) or k != 1:
            raise ValueError(f"top_k={k} is invalid for llama4 routing, which is top-1")
        return llama4_top1(x, **scale)
    if method is RoutingMethod.SIGMOID_TOPK:
        return sigmoid_topk(x, k, **norm)
    if method is RoutingMethod.SIGMOID_BIAS_TOPK:
        return sigmoid_bias_topk(x, k, correction_bias=correction_bias, **norm)
    raise AssertionError(f"unhandled routing method {method!r}")
