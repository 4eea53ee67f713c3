"""Frozen, keyword-only configuration of one MoE layer.

Legend used across moerun: ``T`` tokens, ``H`` hidden size, ``I`` expert intermediate size,
``E`` logical experts, ``S`` physical slots, ``K`` top-k.

``MoEConfig`` is the single description of the math a layer computes; the deployment
(ranks, process group) lives in :class:`moerun.mapping.Mapping`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping as TMapping

import torch

from moerun.quant import QuantConfig
from moerun.routing_config import SUPPORTED_DTYPES, Activation, RoutingConfig, RoutingMethod

__all__ = [
    "RoutingMethod",
    "RoutingConfig",
    "Activation",
    "MoEConfig",
    "SUPPORTED_DTYPES",
]

def _err(name: str, value: Any, fix: str) -> ValueError:
    return ValueError(f"MoEConfig.{name}={value!r} is invalid: {fix}")


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """The function one MoE layer computes.

    Fields:
        num_experts: ``E`` logical experts.
        top_k: ``K`` experts per token (``1 <= K <= E``).
        hidden_size: ``H``.
        intermediate_size: ``I`` per expert.
        routing: :class:`RoutingConfig`.
        apply_router_weight_on_input: scale ``x`` by the routing weight before the experts and
            use unit weights after (Llama4); requires ``top_k == 1``.
        dtype: activation/weight dtype (fp32, fp16, bf16).
        activation: only :attr:`Activation.SILU_GLU`.
        shared_intermediate_size: total intermediate size of the shared expert(s); 0 = none.
        shared_expert_gate: the shared expert output is scaled by ``sigmoid(x @ g)`` (Qwen2-MoE).
        max_num_tokens: rows per chunk (DESIGN 2); ``None`` = one chunk.
        check_inputs: validate inputs (agreed across ranks, DESIGN 9). ``None`` (default):
            on for a CPU layer, off for a CUDA one, where its NaN/Inf scan and the agreed
            gather would be a host sync per forward (DESIGN 9: on for CPU and tests); the
            layer resolves it at build (``layer.config.check_inputs`` is then a bool).
        quant: :class:`moerun.QuantConfig` for FP8 block-scaled routed experts (DESIGN 11a),
            ``None`` = unquantized. ``dtype`` stays the activation dtype (the layer's input
            and output); the routed weights are e4m3 with fp32 per-block scales, H and I
            must be multiples of both ``weight_block`` sizes, and the shared expert stays
            unquantized in ``dtype`` (an fp8 checkpoint's is dequantized at load).
    """

    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    apply_router_weight_on_input: bool = False
    dtype: torch.dtype = torch.float32
    activation: Activation = Activation.SILU_GLU
    shared_intermediate_size: int = 0
    shared_expert_gate: bool = False
    max_num_tokens: int | None = None
    check_inputs: bool | None = None
    quant: QuantConfig | None = None

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "hidden_size", "intermediate_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise _err(name, v, "must be a positive int")
        if self.top_k > self.num_experts:
            raise _err(
                "top_k", self.top_k, f"top_k must be <= num_experts={self.num_experts}"
            )
        if not isinstance(self.routing, RoutingConfig):
            raise TypeError(
                f"MoEConfig.routing must be a RoutingConfig, got {type(self.routing).__name__}"
            )
        if self.dtype not in SUPPORTED_DTYPES:
            raise _err("dtype", self.dtype, "use torch.float32, torch.float16 or torch.bfloat16")
        try:
            object.__setattr__(self, "activation", Activation(self.activation))
        except ValueError:
            raise _err(
                "activation",
                self.activation,
                "only 'silu_glu' (silu(gate) * up) is supported; clamped/biased SwiGLU "
                "variants and other activations are out of scope",
            ) from None
        v = self.shared_intermediate_size
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise _err("shared_intermediate_size", v, "must be an int >= 0")
        if self.shared_expert_gate and self.shared_intermediate_size == 0:
            raise _err(
                "shared_expert_gate", True, "a shared-expert gate needs shared_intermediate_size > 0"
            )
        v = self.max_num_tokens
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise _err("max_num_tokens", v, "must be an int >= 1 or None")
        if self.check_inputs is not None and not isinstance(self.check_inputs, bool):
            raise _err("check_inputs", self.check_inputs,
                       "must be True, False or None (on for a CPU layer, off for CUDA)")
        if self.apply_router_weight_on_input and self.top_k != 1:
            raise _err(
                "apply_router_weight_on_input",
                True,
                f"only defined for top_k == 1 (got top_k={self.top_k})",
            )
        r = self.routing
        if r.num_expert_group > 1 and self.num_experts % r.num_expert_group:
            raise _err(
                "routing.num_expert_group",
                r.num_expert_group,
                f"must divide num_experts={self.num_experts}",
            )
        if r.method in (RoutingMethod.GROUP_LIMITED_GREEDY, RoutingMethod.NOAUX_TC):
            per_group = self.num_experts // r.num_expert_group
            if self.top_k > r.topk_group * per_group:
                raise _err(
                    "top_k",
                    self.top_k,
                    f"grouped routing keeps topk_group*experts_per_group="
                    f"{r.topk_group * per_group} candidates; top_k cannot exceed that",
                )
            if r.method == RoutingMethod.NOAUX_TC and r.num_expert_group > 1 and per_group < 2:
                raise _err(
                    "routing.num_expert_group",
                    r.num_expert_group,
                    "noaux_tc scores a group by its top-2 experts: each group needs >= 2 experts",
                )
        if r.method == RoutingMethod.LLAMA4 and self.top_k != 1:
            raise _err("top_k", self.top_k, "llama4 routing is top-1")
        if self.quant is not None:
            self._check_quant()

    def _check_quant(self) -> None:
        q = self.quant
        if not isinstance(q, QuantConfig):
            raise TypeError(f"MoEConfig.quant must be a moerun.QuantConfig or None, got "
                            f"{type(q).__name__}")
        bn, bk = q.weight_block
        for name in ("hidden_size", "intermediate_size"):
            v = getattr(self, name)
            if v % bn or v % bk:
                mult = f"{bn}" if bn == bk else f"{bn} and {bk}"
                raise _err(name, v, f"with quant (weight_block={q.weight_block}) it must be a "
                                    f"multiple of {mult}: each weight scale block must "
                                    "cover whole gate, up and down rows and columns; use an "
                                    "unquantized layer (quant=None) for this shape")
        if self.apply_router_weight_on_input:
            raise _err("apply_router_weight_on_input", True,
                       "not supported with quant: the routed input would be scaled by its "
                       "routing weight after it was quantized once before dispatch, and "
                       "Llama 4's FP8 checkpoints are not block-scaled; use quant=None")

    @property
    def has_shared_expert(self) -> bool:
        return self.shared_intermediate_size > 0

    def replace(self, **changes: Any) -> "MoEConfig":
        """Return a copy with ``changes`` applied (validated again). Pure; host only."""
        kwargs = {f.name: getattr(self, f.name) for f in fields(self)}
        kwargs.update(changes)
        return MoEConfig(**kwargs)

    @classmethod
    def from_hf_config(
        cls, hf: TMapping[str, Any] | str | Any, *, dtype: torch.dtype | None = None,
        **overrides: Any,
    ) -> "MoEConfig":
        """Build from a Hugging Face model config (see :mod:`moerun._hf_config`).

        Args:
            hf: a ``config.json`` dict, a path to a ``config.json``, a model directory holding
                one (``save_pretrained`` output), or a ``transformers.PretrainedConfig``.
            dtype: the layer dtype; None reads ``dtype`` / ``torch_dtype`` (float32 if unset).
            **overrides: other :class:`MoEConfig` fields (e.g. ``max_num_tokens``).

        Raises ``FileNotFoundError`` (missing path), ``TypeError`` (other types of ``hf``),
        ``ValueError`` (a field moerun cannot map, named with its value). Reads the file if
        given a path; never imports ``transformers``.

        Host only; reads ``config.json`` when given a path or directory.
        """
        from moerun._hf_config import moe_config_kwargs, read_hf_config

        kwargs = moe_config_kwargs(read_hf_config(hf), dtype=dtype)
        kwargs.update(overrides)
        return cls(**kwargs)
