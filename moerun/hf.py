"""Build a :class:`ConfigurableMoE` from a Hugging Face ``transformers`` 5.x MoE block.

Legend: ``T`` tokens, ``H`` hidden, ``I`` expert intermediate, ``Is`` shared intermediate,
``E`` experts.

``transformers`` is never imported here: a block is recognised by its class (module and name,
then identity with the class in that already-imported module), and its config is read through
``PretrainedConfig.to_dict()`` and :func:`moerun._hf_config.moe_config_kwargs`.

The router projection stays outside moerun (engines fuse it with other GEMMs): for ``x [T, H]``,
``moe(x, F.linear(x.float(), router_weight(block).float()))`` equals the block's output.
Whole models: :func:`moerun.hf_patch.patch_model` (replaces every supported block, keeps the
HF router call); checkpoints: :mod:`moerun.hf_checkpoint`; transformers' experts interface:
:mod:`moerun.hf_experts`.
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
from moerun.quant import FP8_DTYPE, QuantConfig, dequantize_weight_blocks

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
    logits_index: int = 0  # router output position of the [T, E] logits
    router_takes_bias: bool = False  # router(x, block.<bias>) (MiniMax-M2)
    returns_router_logits: bool = False  # block returns (out [T, H], logits [T, E]) (Llama 4)
    checkpoint_names: tuple[str, ...] = ()  # other names of the block in checkpoint keys


_M = "transformers.models."
_SPECS = (
    _BlockSpec(_M + "mixtral.modeling_mixtral", "MixtralSparseMoeBlock", router="gate",
               checkpoint_names=("block_sparse_moe",)),
    _BlockSpec(_M + "qwen2_moe.modeling_qwen2_moe", "Qwen2MoeSparseMoeBlock", router="gate",
               shared="shared_expert", shared_gate="shared_expert_gate"),
    _BlockSpec(_M + "qwen3_moe.modeling_qwen3_moe", "Qwen3MoeSparseMoeBlock", router="gate"),
    # NOTE: DeepseekV2TopkRouter never renormalizes, whatever norm_topk_prob says.
    _BlockSpec(_M + "deepseek_v2.modeling_deepseek_v2", "DeepseekV2Moe", router="gate",
               shared="shared_experts", overrides=(("norm_topk_prob", False),)),
    _BlockSpec(_M + "deepseek_v3.modeling_deepseek_v3", "DeepseekV3MoE", router="gate",
               shared="shared_experts", bias="gate.e_score_correction_bias"),
    _BlockSpec(_M + "llama4.modeling_llama4", "Llama4TextMoe", router="router",
               shared="shared_expert", transposed=True, logits_index=1,
               returns_router_logits=True),
    # NOTE: MiniMaxM2TopKRouter always adds the bias buffer, whatever use_routing_bias says.
    _BlockSpec(_M + "minimax_m2.modeling_minimax_m2", "MiniMaxM2SparseMoeBlock", router="gate",
               bias="e_score_correction_bias", overrides=(("use_routing_bias", True),),
               router_takes_bias=True, checkpoint_names=("block_sparse_moe",)),
)
_BY_CLASS = {(s.module, s.name): s for s in _SPECS}

#: Class names :func:`from_hf` accepts.
SUPPORTED_BLOCKS = tuple(s.name for s in _SPECS)


def _spec_or_none(block: Any) -> _BlockSpec | None:
    """The spec of a supported block class, else None."""
    cls = type(block)
    spec = _BY_CLASS.get((cls.__module__, cls.__name__))
    # Identity with the class of that (already imported) module: a same-named subclass or
    # copy elsewhere is not assumed to compute the same function.
    if spec is None or getattr(sys.modules.get(spec.module), spec.name, None) is not cls:
        return None
    return spec


def _spec(block: Any) -> _BlockSpec:
    spec = _spec_or_none(block)
    if spec is None:
        cls = type(block)
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

    Returns a detached view: no device work, no host sync.
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


def _expert_layout(experts: Any, *, transposed_default: bool, e: int, h: int, i: int
                   ) -> tuple[torch.Tensor, torch.Tensor, bool, bool]:
    """Check a fused experts module: ``(gate_up, down, transposed, concatenated)`` (detached).

    Reads the flags ``transformers.integrations.moe.use_experts_implementation`` sets
    (``is_transposed``: ``[E, H, 2I]``/``[E, I, H]``; ``is_concatenated=False``: gate and up
    interleaved along 2I, gate at even positions) and refuses biases, ungated experts,
    post-expert norms, custom gate functions, quantized or mismatched dtypes, and shapes that
    disagree with ``(E, H, I)``.
    """
    gate_up, down = _fused_tensors(experts)
    if gate_up.dtype not in SUPPORTED_DTYPES or down.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"experts.gate_up_proj.dtype={gate_up.dtype}, down_proj.dtype="
                         f"{down.dtype}: quantized experts are unsupported (except transformers' "
                         "FP8Experts, e4m3 with fp32 block scales); dequantize first")
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
    transposed = bool(getattr(experts, "is_transposed", transposed_default))
    want13, want2 = ((e, h, 2 * i), (e, i, h)) if transposed else ((e, 2 * i, h), (e, h, i))
    if tuple(gate_up.shape) != want13 or tuple(down.shape) != want2:
        stored = "[E, H, 2I] / [E, I, H]" if transposed else "[E, 2I, H] / [E, H, I]"
        raise ValueError(f"experts.gate_up_proj {tuple(gate_up.shape)} / "
                         f"down_proj {tuple(down.shape)} do not match the config "
                         f"(E={e}, H={h}, I={i}) in the {stored} layout")
    concatenated = bool(getattr(experts, "is_concatenated", True))
    return gate_up.detach(), down.detach(), transposed, concatenated


def _is_fp8_experts(experts: Any) -> bool:
    """The experts module holds e4m3 fused tensors (transformers' ``FP8Experts`` layout)."""
    gate_up = getattr(experts, "gate_up_proj", None)
    return isinstance(gate_up, torch.Tensor) and gate_up.dtype == FP8_DTYPE


def _fp8_quant(experts: Any) -> QuantConfig:
    """The :class:`QuantConfig` of a transformers 5 ``FP8Experts`` module, after checking
    what it computes: the ``FP8Experts`` class of ``transformers.integrations.finegrained_fp8``
    (or a subclass), gated, no bias, ``activation_scheme="dynamic"``, a ``block_size``, the
    plain concatenated ``[E, 2I, H]`` / ``[E, H, I]`` layout, silu without a clamp or softcap.
    Anything else is a ValueError naming the attribute. Pure."""
    module = sys.modules.get("transformers.integrations.finegrained_fp8")
    fp8_cls = getattr(module, "FP8Experts", None)
    if fp8_cls is None or not isinstance(experts, fp8_cls):
        raise ValueError(f"experts module {type(experts).__name__} holds float8 weights but is "
                         "not transformers' FP8Experts: only that layout (e4m3 with fp32 "
                         "block scales) is supported")
    for flag, want in (("has_bias", False), ("has_gate", True)):
        if getattr(experts, flag, want) != want:
            raise ValueError(f"experts.{flag}={not want}: FP8Experts must be gated and "
                             "bias-free (silu(gate) * up)")
    if getattr(experts, "activation_scheme", "dynamic") != "dynamic":
        raise ValueError(f"experts.activation_scheme={experts.activation_scheme!r}: only "
                         "'dynamic' (activations quantized per token and group) is supported")
    for name in ("swiglu_limit", "swiglu_alpha", "gate_softcap", "up_softcap", "limit"):
        if getattr(experts, name, None) is not None:
            raise ValueError(f"experts.{name}={getattr(experts, name)!r}: clamped or softcapped "
                             "SwiGLU experts are out of scope (only silu(gate) * up)")
    if getattr(experts, "is_transposed", False):
        raise ValueError("experts.is_transposed=True: FP8 experts are read only in the "
                         "[E, 2I, H] / [E, H, I] layout")
    if not getattr(experts, "is_concatenated", True):
        raise ValueError("experts.is_concatenated=False: interleaved gate/up rows do not keep "
                         "whole FP8 scale blocks; only concatenated gate then up rows")
    _check_silu(experts, ("act_fn",), "experts")
    block = getattr(experts, "block_size", None)
    if not (isinstance(block, (tuple, list)) and len(block) == 2):
        raise ValueError(f"experts.block_size={block!r}: per-tensor FP8 experts are not "
                         "supported (block-scaled, e.g. (128, 128))")
    return QuantConfig(weight_block=tuple(int(b) for b in block), act_group=int(block[1]))


def _fp8_layout(experts: Any, *, e: int, h: int, i: int) -> tuple[torch.Tensor, ...]:
    """``(gate_up [E, 2I, H], down [E, H, I], gate_up_scale [E, 2I/bn, H/bk], down_scale
    [E, H/bn, I/bk])`` of a checked (:func:`_fp8_quant`) ``FP8Experts`` module: e4m3
    weights and fp32 scales (not ue8m0) of these shapes, detached, no copy."""
    quant = _fp8_quant(experts)
    want = {"gate_up_proj": (e, 2 * i, h), "down_proj": (e, h, i),
            "gate_up_proj_scale_inv": (e, *quant.scale_shape(2 * i, h)),
            "down_proj_scale_inv": (e, *quant.scale_shape(h, i))}
    tensors = []
    for name, shape in want.items():
        t = getattr(experts, name, None)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"experts.{name} is {got}; expected {shape} (E={e}, H={h}, I={i}, "
                             f"block {quant.weight_block})")
        is_scale = name.endswith("_scale_inv")
        dtype_ok = t.dtype == torch.float32 if is_scale else t.dtype == FP8_DTYPE
        if not dtype_ok:
            raise ValueError(f"experts.{name}.dtype={t.dtype}: expected "
                             f"{'float32 scale_inv (not ue8m0)' if is_scale else FP8_DTYPE}")
        tensors.append(t.detach())
    return tuple(tensors)


def _one_expert(gate_up: torch.Tensor, down: torch.Tensor, x: int, *, transposed: bool,
                concatenated: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``x`` as ``(gate_up [2I, H] gate rows then up rows, down [H, I])`` (views
    where the layout allows)."""
    g, d = gate_up[x], down[x]
    if transposed:
        g, d = g.t(), d.t()
    if not concatenated:
        g = torch.cat([g[0::2], g[1::2]], dim=0)
    return g, d


def _expert_items(experts: Any, *, transposed_default: bool, e: int, h: int, i: int):
    """``(expert_id, name, lazy tensor)`` items of a fused experts module for
    :meth:`ConfigurableMoE.load_expert_weights`: each expert's ``gate_up_proj [2I, H]`` and
    ``down_proj [H, I]``, computed only when read (so a rank converts only its own experts).
    The layout is checked here, before the first item. An ``FP8Experts`` module gives e4m3
    ``gate_up_proj`` / ``down_proj`` and their ``*_scale_inv`` blocks (no dequantization)."""
    if _is_fp8_experts(experts):
        gate_up, down, gate_up_s, down_s = _fp8_layout(experts, e=e, h=h, i=i)

        def fp8_items():
            for x in range(e):
                yield x, "gate_up_proj", gate_up[x]
                yield x, "gate_up_proj_scale_inv", gate_up_s[x]
                yield x, "down_proj", down[x]
                yield x, "down_proj_scale_inv", down_s[x]

        return fp8_items()
    gate_up, down, transposed, concatenated = _expert_layout(
        experts, transposed_default=transposed_default, e=e, h=h, i=i)
    layout = dict(transposed=transposed, concatenated=concatenated)

    def items():
        for x in range(e):
            yield x, "gate_up_proj", lambda x=x: _one_expert(gate_up, down, x, **layout)[0]
            yield x, "down_proj", lambda x=x: _one_expert(gate_up, down, x, **layout)[1]

    return items()


def _expert_weights(experts: Any, *, transposed_default: bool, e: int, h: int, i: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused expert tensors -> ``w13 [E, 2I, H]`` (gate rows then up rows), ``w2 [E, H, I]``
    (contiguous copies; checks of :func:`_expert_layout`)."""
    gate_up, down, transposed, concatenated = _expert_layout(
        experts, transposed_default=transposed_default, e=e, h=h, i=i)
    pairs = [_one_expert(gate_up, down, x, transposed=transposed, concatenated=concatenated)
             for x in range(e)]
    return (torch.stack([g for g, _ in pairs]).contiguous(),
            torch.stack([d for _, d in pairs]).contiguous())


def _linear_weight(mlp: nn.Module, name: str, where: str) -> torch.Tensor:
    """``mlp.<name>.weight``, detached; an FP8 Linear (transformers' ``FP8Linear``: e4m3
    ``weight`` with fp32 ``weight_scale_inv`` per ``block_size``) is dequantized to fp32 (the
    shared expert runs in the activation dtype, DESIGN 11a)."""
    lin = getattr(mlp, name, None)
    if not isinstance(lin, nn.Linear):
        raise TypeError(f"{where}.{name} is {type(lin).__name__}, expected nn.Linear")
    if lin.bias is not None:
        raise ValueError(f"{where}.{name} has a bias; the shared expert must be bias-free")
    w = lin.weight.detach()
    if w.dtype != FP8_DTYPE:
        return w
    scale = getattr(lin, "weight_scale_inv", None)
    block = getattr(lin, "block_size", None)
    if not isinstance(scale, torch.Tensor) or block is None:
        raise ValueError(f"{where}.{name} has {FP8_DTYPE} weights without weight_scale_inv "
                         "blocks and a block_size; only block-scaled FP8 Linears are read")
    return dequantize_weight_blocks(w, scale.detach(), tuple(block))


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


#: :class:`MoEConfig` fields that :func:`from_hf` and ``patch_model`` take from their keywords.
CONFIG_KEYWORDS = ("max_num_tokens", "check_inputs")


@dataclass(frozen=True, kw_only=True)
class _BlockParts:
    """What :func:`from_hf` reads from one block, checked, before any layer is built."""

    spec: _BlockSpec
    config: MoEConfig
    items: Any  # iterator of (expert_id, name, lazy tensor), consumed by load_expert_weights
    shared: dict | None
    bias: torch.Tensor | None
    device: torch.device


def _block_parts(block: nn.Module, config_kwargs: dict) -> _BlockParts:
    """Check ``block`` and read its config and weights (lazily for the experts); no copy."""
    spec = _spec(block)
    experts = block.experts
    dtype = _fused_tensors(experts)[0].dtype
    hf_config = dict(_block_config(block).to_dict())
    hf_config.update(spec.overrides)
    kwargs = moe_config_kwargs(hf_config, dtype=dtype if dtype in SUPPORTED_DTYPES else None)
    # the experts' tensors decide (a dequantized checkpoint keeps its quantization_config)
    kwargs.pop("quant", None)
    if _is_fp8_experts(experts):
        kwargs["quant"] = _fp8_quant(experts)
    kwargs.update(config_kwargs)
    cfg = MoEConfig(**kwargs)
    items = _expert_items(experts, transposed_default=spec.transposed, e=cfg.num_experts,
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
    return _BlockParts(spec=spec, config=cfg, items=items, shared=shared, bias=bias,
                       device=experts.gate_up_proj.device)


def _split_kwargs(layer_kwargs: dict) -> tuple[dict, dict]:
    """``(MoEConfig fields, ConfigurableMoE keywords)`` of ``**layer_kwargs``."""
    config = {k: layer_kwargs[k] for k in CONFIG_KEYWORDS if k in layer_kwargs}
    return config, {k: v for k, v in layer_kwargs.items() if k not in config}


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

    FP8 experts (issue 12): a block whose ``experts`` is transformers' ``FP8Experts``
    (``gate_up_proj`` / ``down_proj`` e4m3 with ``gate_up_proj_scale_inv`` /
    ``down_proj_scale_inv`` fp32 blocks, e.g. a DeepSeek-V3 or Qwen3 FP8 checkpoint) gives a
    layer with ``config.quant = QuantConfig(weight_block=experts.block_size)``, weights and
    scales copied as they are (no dequantization), and the activation dtype read from the
    block's config (``dtype`` / ``torch_dtype``, float32 if unset). An FP8 shared expert
    (``FP8Linear``) is dequantized once into that dtype. Other quantized experts are refused.

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
            ``balancer``, ``repeat_count``, ``recorder``, ``chunk_overlap``), except the
            :class:`MoEConfig` fields ``max_num_tokens`` and ``check_inputs``, which go into
            the layer's config.

    Returns:
        The layer, weights loaded expert by expert (:meth:`ConfigurableMoE.load_expert_weights`:
        each rank converts and copies only its own experts), dtype = the block's expert-weight
        dtype (FP8 experts: the config's dtype, see above).

    Raises:
        TypeError: unsupported block class (lists the supported ones) or expert layout (e.g.
            a ModuleList of per-expert Linear layers).
        ValueError: a config field moerun cannot map (see :mod:`moerun._hf_config`), expert
            biases, a non-SiLU or clamped activation, quantized (other than ``FP8Experts``)
            or mismatched weights, an FP8 block whose H or I is not a multiple of its block.

    Side effects: copies this rank's expert weights (host/device memory of one more copy of
    its share of the block). from_hf itself issues no collective; see :class:`ConfigurableMoE`
    for what its constructor does with ``mapping``.
    """
    config_kwargs, layer_kwargs = _split_kwargs(layer_kwargs)
    parts = _block_parts(block, config_kwargs)
    layer = ConfigurableMoE(parts.config, mapping, backend=backend, comm=comm,
                            layer_idx=layer_idx,
                            device=parts.device if device is None else device, **layer_kwargs)
    layer.load_expert_weights(parts.items, shared=parts.shared,
                              e_score_correction_bias=parts.bias)
    return layer
