"""Routing method, routing parameters, activation and dtypes: the leaf vocabulary of
:mod:`moerun.config` (kept separate so the Hugging Face mapping can import it without a cycle).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

__all__ = ["RoutingMethod", "RoutingConfig", "Activation", "SUPPORTED_DTYPES"]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class RoutingMethod(str, enum.Enum):
    """How router logits become ``(topk_weights, topk_ids)``; see :mod:`moerun.routing`."""

    SOFTMAX_TOPK = "softmax_topk"  # softmax over E, top-k; renormalize optional (Qwen2/3-MoE)
    TOPK_SOFTMAX = "topk_softmax"  # top-k logits, softmax over the k (Mixtral)
    GROUP_LIMITED_GREEDY = "group_limited_greedy"  # DeepSeek-V2
    NOAUX_TC = "noaux_tc"  # DeepSeek-V3: sigmoid, correction bias for selection only
    LLAMA4 = "llama4"  # top-1 logit, sigmoid weight, applied on the input
    SIGMOID_TOPK = "sigmoid_topk"  # sigmoid, top-k, renormalize optional
    SIGMOID_BIAS_TOPK = "sigmoid_bias_topk"  # MiniMax-M2: sigmoid + bias selects, weights unbiased


class Activation(str, enum.Enum):
    """Expert activation. Only ``silu(gate) * up`` is in scope (DESIGN 13)."""

    SILU_GLU = "silu_glu"


@dataclass(frozen=True, kw_only=True)
class RoutingConfig:
    """Parameters of the routing method.

    Fields:
        method: the :class:`RoutingMethod`.
        renormalize: divide the selected weights by their sum (``norm_topk_prob`` in HF
            DeepSeek/Qwen configs). Ignored by ``TOPK_SOFTMAX`` (always normalized) and ``LLAMA4``.
        num_expert_group: expert groups for ``GROUP_LIMITED_GREEDY``/``NOAUX_TC`` (1 = no grouping).
        topk_group: groups kept per token by the grouped methods.
        routed_scaling_factor: multiplies the final weights (fp32).
        uses_correction_bias: the layer owns an ``[E]`` fp32 selection bias
            (``NOAUX_TC``, ``SIGMOID_BIAS_TOPK``).
    """

    method: RoutingMethod = RoutingMethod.SOFTMAX_TOPK
    renormalize: bool = True
    num_expert_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", RoutingMethod(self.method))
        if self.num_expert_group < 1:
            raise ValueError(
                f"RoutingConfig.num_expert_group={self.num_expert_group} must be >= 1"
            )
        if not 1 <= self.topk_group <= self.num_expert_group:
            raise ValueError(
                f"RoutingConfig.topk_group={self.topk_group} must be in "
                f"[1, num_expert_group={self.num_expert_group}]"
            )
        if not (self.routed_scaling_factor > 0):
            raise ValueError(
                f"RoutingConfig.routed_scaling_factor={self.routed_scaling_factor} must be > 0"
            )

    @property
    def uses_correction_bias(self) -> bool:
        return self.method in (RoutingMethod.NOAUX_TC, RoutingMethod.SIGMOID_BIAS_TOPK)
