"""Build a :class:`ConfigurableMoE` from a Hugging Face ``transformers`` 5.x MoE block.

Legend: ``T`` tokens, ``H`` hidden, ``I`` expert intermediate, ``Is`` shared intermediate,
``E`` experts.

``transformers`` is never imported here: a block is recognised by its class (module and name,
then identity with the class in that already-imported module), and its config is read through
``PretrainedConfig.to_dict()`` and :func:`moerun._hf_config.moe_config_kwargs`.

The router projection stays outside moerun (engines fuse it with other GEMMs): for ``x [T, H]``,
``moe(x, F.linear(x.float(), router_weight(block).float()))`` equals the block's output.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from moerun._hf_config import moe_config_kwargs
from moerun.backends import Backend
from moerun.config import SUPPORTED_DTYPES, MoEConfig
from moerun.layer import ConfigurableMoE
from moerun.mapping import Mapping

__all__ = ["from_hf", "router_weight", "SUPPORTED_BLOCKS"]


@dataclass(frozen=True)
class _BlockSpec:
    """Where one block class keeps its pieces (attribute names on the block)."""

    module: str  # the block class's module
    name: str  # the block class's name
    router: str  # submodule whose ``.weight [E, H]`` is the router projection
    shared: str | None = None  # shared-expert MLP (gate_proj / up_proj / down_proj Linears)
    shared_gate: str | None = None  # Linear(H, 1): shared output * sigmoid(gate(x))
    bias: str | None = None  # dotted path of the [E] selection (correction) bias buffer
    transposed: bool = False  # experts stored [E, H, 2I] / [E, I, H] (when not flagged)
    overrides: tuple[tuple[str, Any], ...] = ()  # config fields the block's forward ignores


_M = "transformers.models."
_SPECS = (
    _BlockSpec(_M + "mixtral.modeling_mixtral", "MixtralSparseMoeBlock", router="gate"),
    _BlockSpec(_M + "qwen2_moe.modeling_qwen2_moe", "Qwen2MoeSparseMoeBlock", router="gate",
               shared="shared_expert", shared_gate="shared_expert_gate"),
    _BlockSpec(_M + "qwen3_moe.modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock", router="gate"),
    # NOTE: DeepseekV2TopkRouter never renormalizes, whatever norm_topk_prob says.
    _BlockSpec(_M + "deepseek_v2.modeling_deepseek_v2", "DeepseekV2Moe", router="gate",
               shared="shared_experts", overrides=(("norm_topk_prob", False),)),
    _BlockSpec(_M + "deepseek_v3.modeling_deepseek_v3", "DeepseekV3MoE", router="gate",
               shared="shared_experts", bias="gate.e_score_correction_bias"),
    _BlockSpec(_M + "llama4.modeling_llama4", "Llama4TextMoe", router="router",
               shared="shared_expert", transposed=True),
    # NOTE: MiniMaxM2TopKRouter always adds the bias buffer, whatever use_routing_bias says.
    _BlockSpec(_M + "minimax_m2.modeling_minimax_m2", "MiniMaxM2SparseMoeBlock", router="gate",
               bias="e_score_correction_bias", overrides=(("use_routing_bias", True),)),
)
_BY_CLASS = {(s.module, s.name): s for s in _SPECS}

#: Class names :func:`from_hf` accepts.
SUPPORTED_BLOCKS = tuple(s.name for s in _SPECS)


def _spec(block: Any) -> _BlockSpec:
    cls = type(block)
    spec = _BY_CLASS.get((cls.__module__, cls.__name__))
    # Identity with the class of that (already imported) module: a same-named subclass or
    # copy elsewhere is not assumed to compute the same function.
    if spec is None or getattr(sys.modules.get(spec.module), spec.name, None) is not cls:
        raise TypeError(f"from_hf does not support {cls.__module__}.{cls.__qualname__}; "
                        f"supported transformers 5.x blocks: {', '.join(SUPPORTED_BLOCKS)}")
    return spec


def _attr(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def router_weight(block: nn.Module) -> torch.Tensor:
    """The router projection of a supported HF MoE block: ``[E, H]`` (detached, shares storage).

    ``block.gate.weight`` for Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3 and MiniMax-M2;
    ``block.router.weight`` for Llama 4. Raises ``TypeError`` for other blocks.
    """
    return _attr(block, _spec(block).router).weight.detach()


def _block_config(block: nn.Module) -> Any:
    """The block's ``PretrainedConfig``: ``block.config`` (DeepSeek), else the first submodule
    that keeps one (the experts in transformers 5.x, Llama 4's shared MLP)."""
    for m in block.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and callable(getattr(cfg, "to_dict", None)):
            return cfg
    raise ValueError(f"{type(block).__name__} and its submodules carry no config "
                     "(a PretrainedConfig under .config); cannot read the routing parameters")


def _check_silu(module: nn.Module, attr_names: tuple[str, ...], where: str) -> None:
    for name in attr_names:
        act = getattr(module, name, None)
        if act is not None:
            # transformers' SiLUActivation ("silu") and nn.SiLU ("swish")
            hf_silu = getattr(sys.modules.get("transformers.activations"), "SiLUActivation", None)
            silu_types = (nn.SiLU,) if hf_silu is None else (nn.SiLU, hf_silu)
            if not isinstance(act, silu_types):
                raise ValueError(f"{where}.{name} is {type(act).__name__}; moerun implements "
                                 "only silu(gate) * up")
            return


def _fused_tensors(experts: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(experts.gate_up_proj, experts.down_proj)``, or TypeError for any other layout."""
    gate_up = getattr(experts, "gate_up_proj", None)
    down = getattr(experts, "down_proj", None)
    if not (isinstance(gate_up, torch.Tensor) and gate_up.dim() == 3
            and isinstance(down, torch.Tensor) and down.dim() == 3):
        raise TypeError(f"experts module {type(experts).__name__} has no fused 3-D tensors "
                        "gate_up_proj / down_proj (e.g. a ModuleList of per-expert Linear "
                        "layers); from_hf supports only the transformers 5.x fused layout")
    return gate_up, down


def _expert_weights(experts: Any, *, transposed_default: bool, e: int, h: int, i: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused expert tensors -> ``w13 [E, 2I, H]`` (gate rows then up rows), ``w2 [E, H, I]``.

    Reads the flags ``transformers.integrations.moe.use_experts_implementation`` sets
    (``is_transposed``: ``[E, H, 2I]``/``[E, I, H]``; ``is_concatenated=False``: gate and up
    interleaved along 2I, gate at even positions) and refuses biases, ungated experts,
    post-expert norms and custom gate functions.
    """
    gate_up, down = _fused_tensors(experts)
    if gate_up.dtype not in SUPPORTED_DTYPES or down.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"experts.gate_up_proj.dtype={gate_up.dtype}, down_proj.dtype="
                         f"{down.dtype}: quantized experts are unsupported; dequantize first")
    if gate_up.dtype != down.dtype:
        raise ValueError(f"experts.gate_up_proj.dtype={gate_up.dtype} != "
                         f"down_proj.dtype={down.dtype}")
    for flag, bad, why in (("has_bias", True, "expert biases"),
                           ("has_gate", False, "ungated experts"),
                           ("has_post_expert_norm", True, "post-expert norms")):
        if getattr(experts, flag, not bad) == bad:
            raise ValueError(f"experts.{flag}={bad}: {why} are unsupported (silu(gate) * up "
                             "without bias only)")
    for name in ("gate_up_proj_bias", "down_proj_bias"):
        if getattr(experts, name, None) is not None:
            raise ValueError(f"experts.{name} is set: expert biases are unsupported")
    apply_gate = getattr(type(experts), "_apply_gate", None)
    if apply_gate is not None:
        default = getattr(sys.modules.get("transformers.integrations.moe"),
                          "_default_apply_gate", None)
        if apply_gate is not default:
            raise ValueError(f"{type(experts).__name__}._apply_gate is custom (e.g. clamped "
                             "SwiGLU); only silu(gate) * up is supported")
    _check_silu(experts, ("act_fn",), "experts")
    transposed = getattr(experts, "is_transposed", transposed_default)
    gate_up, down = gate_up.detach(), down.detach()
    if transposed:
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    if tuple(gate_up.shape) != (e, 2 * i, h) or tuple(down.shape) != (e, h, i):
        stored = "[E, H, 2I] / [E, I, H]" if transposed else "[E, 2I, H] / [E, H, I]"
        raise ValueError(f"experts.gate_up_proj {tuple(experts.gate_up_proj.shape)} / "
                         f"down_proj {tuple(experts.down_proj.shape)} do not match the config "
                         f"(E={e}, H={h}, I={i}) in the {stored} layout")
    if not getattr(experts, "is_concatenated", True):
        gate_up = torch.cat([gate_up[:, 0::2], gate_up[:, 1::2]], dim=1)
    return gate_up.contiguous(), down.contiguous()


def _linear_weight(mlp: nn.Module, name: str, where: str) -> torch.Tensor:
    lin = getattr(mlp, name, None)
    if not isinstance(lin, nn.Linear):
        raise TypeError(f"{where}.{name} is {type(lin).__name__}, expected nn.Linear")
    if lin.bias is not None:
        raise ValueError(f"{where}.{name} has a bias; the shared expert must be bias-free")
    return lin.weight.detach()


def _shared_weights(block: nn.Module, spec: _BlockSpec, cfg: MoEConfig) -> dict | None:
    """``{"w13": [2Is, H], "w2": [H, Is], "gate": [1, H]}`` or None."""
    if not cfg.has_shared_expert:
        return None
    mlp = getattr(block, spec.shared)
    where = f"block.{spec.shared}"
    _check_silu(mlp, ("act_fn", "activation_fn"), where)
    w13 = torch.cat([_linear_weight(mlp, "gate_proj", where),
                     _linear_weight(mlp, "up_proj", where)], dim=0)
    shared = {"w13": w13, "w2": _linear_weight(mlp, "down_proj", where)}
    if cfg.shared_expert_gate:
        shared["gate"] = _linear_weight(block, spec.shared_gate, "block")
    return shared


@torch.no_grad()
def from_hf(block: nn.Module, *, mapping: Mapping | None = None,
            backend: str | Backend = "auto", comm: Any = "auto", layer_idx: int | None = None,
            device: torch.device | str | None = None, **layer_kwargs: Any) -> ConfigurableMoE:
    """A :class:`ConfigurableMoE` computing the same function as a transformers 5.x MoE block.

    Supported blocks, and the attribute that holds the router weight ``[E, H]`` (returned by
    :func:`router_weight`; it is **not** part of the returned layer):

    ======================  =======================  ============================================
    block                   router weight            also copied
    ======================  =======================  ============================================
    MixtralSparseMoeBlock   ``block.gate.weight``    experts
    Qwen2MoeSparseMoeBlock  ``block.gate.weight``    experts, ``shared_expert``,
                                                     ``shared_expert_gate.weight`` (sigmoid gate)
    Qwen3MoeSparseMoeBlock  ``block.gate.weight``    experts
    DeepseekV2Moe           ``block.gate.weight``    experts, ``shared_experts``
    DeepseekV3MoE           ``block.gate.weight``    experts, ``shared_experts``,
                                                     ``gate.e_score_correction_bias``
    Llama4TextMoe           ``block.router.weight``  experts (stored ``[E, H, 2I]``/``[E, I, H]``,
                                                     transposed here), ``shared_expert``
    MiniMaxM2SparseMoeBlock ``block.gate.weight``    experts, ``e_score_correction_bias``
    ======================  =======================  ============================================

    For ``x [T, H]``: ``layer(x, F.linear(x.float(), router_weight(block).float()))`` equals
    ``block(x.view(1, T, H)).view(T, H)`` (Llama 4 returns a tuple: its ``[0]``). The HF
    routers compute the logits in x.dtype (Mixtral, Qwen, Llama 4), in the router weight's
    dtype (MiniMax-M2) or in fp32 (DeepSeek); in bf16/fp16 the layer matches up to that
    rounding. Routing parameters come from the block's config
    (:func:`moerun._hf_config.moe_config_kwargs`), except where the block's forward ignores a
    field (DeepSeek-V2: ``norm_topk_prob``, never applied by ``DeepseekV2TopkRouter``;
    MiniMax-M2: ``use_routing_bias``, the bias buffer is always added).
    Inference semantics: training-only jitter noise is not reproduced.

    Args:
        block: the HF MoE block (any device; its weights are copied, not shared).
        mapping: :class:`moerun.Mapping` for expert parallelism; default one rank. With
            ``ep_size > 1`` every rank passes the full block and keeps its own slots.
        backend: ``"auto"``, ``"reference"``, ``"triton"``, ``"grouped_mm"`` or a Backend.
        comm: ``"auto"``, ``"none"``, ``"allgather"``, ``"alltoall"`` or a strategy class.
        layer_idx: the layer's index (NVTX names, EPLB, timeouts).
        device: where the layer's weights live; default the block's expert-weight device.
        **layer_kwargs: passed to :class:`ConfigurableMoE` (``shared_expert_order``,
            ``balancer``, ``repeat_count``, ``recorder``).

    Returns:
        The layer, weights loaded (``load_weights``), dtype = the block's expert-weight dtype.

    Raises:
        TypeError: unsupported block class (lists the supported ones) or expert layout (e.g.
            a ModuleList of per-expert Linear layers).
        ValueError: a config field moerun cannot map (see :mod:`moerun._hf_config`), expert
            biases, a non-SiLU or clamped activation, quantized or mismatched weights.

    Side effects: copies every expert weight (host/device memory of one more copy of the
    block). from_hf itself issues no collective; see :class:`ConfigurableMoE` for what its
    constructor does with ``mapping``.
    """
    spec = _spec(block)
    experts = block.experts
    dtype = _fused_tensors(experts)[0].dtype
    hf_config = dict(_block_config(block).to_dict())
    hf_config.update(spec.overrides)
    kwargs = moe_config_kwargs(hf_config, dtype=dtype if dtype in SUPPORTED_DTYPES else None)
    cfg = MoEConfig(**kwargs)
    w13, w2 = _expert_weights(experts, transposed_default=spec.transposed, e=cfg.num_experts,
                              h=cfg.hidden_size, i=cfg.intermediate_size)
    router = router_weight(block)
    if tuple(router.shape) != (cfg.num_experts, cfg.hidden_size):
        raise ValueError(f"router weight block.{spec.router}.weight has shape "
                         f"{tuple(router.shape)}; the config says [E={cfg.num_experts}, "
                         f"H={cfg.hidden_size}]")
    shared = _shared_weights(block, spec, cfg)
    bias = None
    if cfg.routing.uses_correction_bias:
        bias = _attr(block, spec.bias).detach().float()
    if device is None:
        device = w13.device
    layer = ConfigurableMoE(cfg, mapping, backend=backend, comm=comm, layer_idx=layer_idx,
                            device=device, **layer_kwargs)
    layer.load_weights(w13, w2, shared, e_score_correction_bias=bias)
    return layer
