"""Hugging Face ``config.json`` -> :class:`moerun.config.MoEConfig` keyword arguments.

Used by :meth:`MoEConfig.from_hf_config` and :func:`moerun.hf.from_hf`. Pure: reads a plain
mapping (``json.load`` of a ``config.json``, or ``PretrainedConfig.to_dict()``) and never
imports ``transformers``; :func:`read_hf_config` turns the accepted sources (a mapping, a
``config.json`` path, a model directory, a ``PretrainedConfig``) into that mapping.

Field names were checked against the transformers 5.x configuration classes
(``models/*/configuration_*.py``) and the released checkpoints' ``config.json`` files.

=============  ===============================  ==========================  ==================
model_type     experts ``E`` / intermediate     routing                     shared expert
=============  ===============================  ==========================  ==================
mixtral        num_local_experts /              topk_softmax                none
               intermediate_size
qwen2_moe      num_experts / moe_intermediate   softmax_topk,               shared_expert_
               _size                            renormalize=norm_topk_prob  intermediate_size,
                                                                            sigmoid gate
qwen3_moe      num_experts / moe_intermediate   softmax_topk,               none
               _size                            renormalize=norm_topk_prob
deepseek_v2    n_routed_experts /               topk_method: greedy ->      n_shared_experts *
               moe_intermediate_size            softmax_topk; group_        moe_intermediate
                                                limited_greedy              _size
deepseek_v3    n_routed_experts /               noaux_tc (n_group,          n_shared_experts *
               moe_intermediate_size            topk_group, bias)           moe_intermediate
                                                                            _size
llama4_text    num_local_experts /              llama4 (top-1 sigmoid,      intermediate_size
(llama4:       intermediate_size (the dense     applied on the input)       (ungated)
text_config)   layers' size is intermediate_
               size_mlp, not read)
minimax_m2     num_local_experts /              sigmoid_bias_topk           none
               intermediate_size                (use_routing_bias), renorm.
=============  ===============================  ==========================  ==================

``num_experts_per_tok`` is ``K`` and ``hidden_size`` is ``H`` everywhere. The four sizes
(``E``, ``K``, ``H``, ``I``) are required (Llama 4's ``K`` defaults to 1); every other field
the table reads falls back to the default of its transformers 5.x configuration class when
absent or ``null`` (so the result matches what ``transformers`` builds from the same file).
Aliases of one field (e.g. Qwen3's ``num_experts`` / ``num_local_experts``) must agree when
both are present.

Refused with a ``ValueError`` naming the field and value: an unknown ``model_type``; an
activation other than ``silu`` (``hidden_act``), or a clamped SwiGLU (``swiglu_limit``); a
``topk_method`` or ``scoring_func`` the family does not implement; DeepSeek-V2
``norm_topk_prob=true`` (ambiguous, see :func:`_deepseek_v2`); DeepSeek ``mlp_bias=true``;
Llama 4 with ``num_experts_per_tok != 1``; MiniMax-M2 ``shared_intermediate_size > 0``; a
``dtype``/``torch_dtype`` other than float32, float16 or bfloat16.

Not read (they do not change one layer's function): which layers are MoE
(``first_k_dense_replace``, ``moe_layer_freq``, ``decoder_sparse_step``, ``mlp_only_layers``,
``moe_layers``, ``interleave_moe_layer_step``), training-only fields (``router_jitter_noise``,
``router_aux_loss_coef``, ``aux_loss_alpha``).

``quantization_config`` (issue 12): ``quant_method: "fp8"`` with ``weight_block_size:
[bn, bk]`` and ``activation_scheme: "dynamic"`` (the DeepSeek-V3 / Qwen3-FP8 layout,
transformers' ``FineGrainedFP8Config``) maps to ``quant=QuantConfig(weight_block=(bn, bk),
act_group=bk)``; with ``dequantize: true`` transformers loads float weights, so it maps to
``quant=None``. Refused with a ``ValueError`` naming the field: any other ``quant_method``
(awq, gptq, bitsandbytes, mxfp4, compressed-tensors, ...), a missing or malformed
``weight_block_size`` (per-tensor FP8), ``activation_scheme: "static"``, ``scale_fmt`` other
than ``"float"`` (ue8m0 scales), ``expert_dtype`` other than ``"fp8"`` (DeepSeek-V4's fp4
experts), ``fmt`` other than ``"e4m3"``. ``modules_to_not_convert`` is not read (it names
attention and head modules in released checkpoints, never the routed experts).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping

import torch

from moerun.quant import QuantConfig
from moerun.routing_config import SUPPORTED_DTYPES, RoutingConfig, RoutingMethod

__all__ = ["moe_config_kwargs", "read_hf_config", "SUPPORTED_MODEL_TYPES"]

_REQUIRED = object()

_DTYPE_NAMES = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

_SILU_NAMES = ("silu", "swish")


def _field_error(model_type: str, name: str, value: Any, fix: str) -> ValueError:
    return ValueError(f"{model_type} config field {name}={value!r} cannot be mapped: {fix}")


def _get(hf: Mapping[str, Any], model_type: str, names: tuple[str, ...],
         default: Any = _REQUIRED) -> Any:
    """The value of the first present, non-null field among ``names`` (aliases of one field).

    Aliases present together must agree. A missing field takes ``default``; a missing field
    without one is a ``ValueError``.
    """
    found = [(n, hf[n]) for n in names if hf.get(n) is not None]
    if len({repr(v) for _, v in found}) > 1:
        listed = ", ".join(f"{n}={v!r}" for n, v in found)
        raise ValueError(f"{model_type} config has conflicting values for one field: {listed}")
    if found:
        return found[0][1]
    if default is _REQUIRED:
        raise ValueError(f"{model_type} config is missing the required field "
                         f"{' / '.join(names)}")
    return default


def _positive_int(hf: Mapping[str, Any], model_type: str, names: tuple[str, ...],
                  default: Any = _REQUIRED) -> int:
    v = _get(hf, model_type, names, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _field_error(model_type, names[0], v, "must be a positive int")
    return v


def _count(hf: Mapping[str, Any], model_type: str, name: str, default: int) -> int:
    v = _get(hf, model_type, (name,), default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise _field_error(model_type, name, v, "must be an int >= 0")
    return v


def _flag(hf: Mapping[str, Any], model_type: str, name: str, default: bool) -> bool:
    v = _get(hf, model_type, (name,), default)
    if not isinstance(v, bool):
        raise _field_error(model_type, name, v, "must be true or false")
    return v


def _scale(hf: Mapping[str, Any], model_type: str, default: float) -> float:
    v = _get(hf, model_type, ("routed_scaling_factor",), default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise _field_error(model_type, "routed_scaling_factor", v, "must be a number > 0")
    return float(v)


def _expect(hf: Mapping[str, Any], model_type: str, name: str, allowed: tuple[str, ...],
            default: str, why: str) -> str:
    v = _get(hf, model_type, (name,), default)
    if v not in allowed:
        raise _field_error(model_type, name, v, f"{model_type} supports {name} in "
                                                f"{list(allowed)} ({why})")
    return v


def _sizes(hf: Mapping[str, Any], model_type: str, experts: tuple[str, ...],
           intermediate: str, top_k_default: Any = _REQUIRED) -> dict:
    return dict(
        num_experts=_positive_int(hf, model_type, experts),
        top_k=_positive_int(hf, model_type, ("num_experts_per_tok",), top_k_default),
        hidden_size=_positive_int(hf, model_type, ("hidden_size",)),
        intermediate_size=_positive_int(hf, model_type, (intermediate,)),
    )


# ------------------------------------------------------------------------- one per family


def _mixtral(hf: Mapping[str, Any], mt: str) -> dict:
    """``MixtralTopKRouter``: softmax -> top-k -> renormalize == top-k logits -> softmax."""
    _expect(hf, mt, "scoring_func", ("softmax",), "softmax", "MixtralTopKRouter is softmax")
    return dict(_sizes(hf, mt, ("num_local_experts", "num_experts"), "intermediate_size"),
                routing=RoutingConfig(method=RoutingMethod.TOPK_SOFTMAX, renormalize=True))


def _qwen_moe(hf: Mapping[str, Any], mt: str, *, shared: bool) -> dict:
    """``Qwen{2,3}MoeTopKRouter``: softmax over E, top-k, renormalize iff norm_topk_prob.

    Qwen2-MoE adds ``Qwen2MoeMLP(shared_expert_intermediate_size)`` scaled by
    ``sigmoid(shared_expert_gate(x))``; 0 means no shared expert (its output is 0 in HF too).
    """
    _expect(hf, mt, "scoring_func", ("softmax",), "softmax", "the Qwen MoE router is softmax")
    kw = _sizes(hf, mt, ("num_experts", "num_local_experts"), "moe_intermediate_size")
    kw["routing"] = RoutingConfig(method=RoutingMethod.SOFTMAX_TOPK,
                                  renormalize=_flag(hf, mt, "norm_topk_prob", False))
    if shared:
        size = _count(hf, mt, "shared_expert_intermediate_size", 5632)
        kw.update(shared_intermediate_size=size, shared_expert_gate=size > 0)
    return kw


def _deepseek_common(hf: Mapping[str, Any], mt: str, *, n_shared_default: int) -> dict:
    if _get(hf, mt, ("mlp_bias",), False):
        raise _field_error(mt, "mlp_bias", hf["mlp_bias"],
                           "moerun's shared expert has no bias terms")
    kw = _sizes(hf, mt, ("n_routed_experts", "num_experts", "num_local_experts"),
                "moe_intermediate_size")
    n_shared = _count(hf, mt, "n_shared_experts", n_shared_default)
    kw["shared_intermediate_size"] = n_shared * kw["intermediate_size"]
    return kw


def _deepseek_v2(hf: Mapping[str, Any], mt: str) -> dict:
    """``DeepseekV2TopkRouter``: softmax; ``greedy`` or ``group_limited_greedy``; then always
    ``* routed_scaling_factor``; no renormalization.

    NOTE: ``norm_topk_prob=true`` is refused. transformers 5.x ignores it (never renormalizes,
    always scales), the original DeepSeek code renormalizes and then does not scale, and vLLM
    renormalizes and scales: three different functions. Released V2 checkpoints use ``false``,
    where all agree. :func:`moerun.hf.from_hf` maps an HF block with ``true`` the way that block
    computes (no renormalization).
    """
    _expect(hf, mt, "scoring_func", ("softmax",), "softmax",
            "DeepseekV2TopkRouter is softmax")
    if _flag(hf, mt, "norm_topk_prob", False):
        raise _field_error(mt, "norm_topk_prob", True,
                           "ambiguous for deepseek_v2 (transformers ignores it, the original "
                           "DeepSeek code renormalizes and skips routed_scaling_factor); set it "
                           "to false or pass routing=RoutingConfig(...) explicitly")
    method = _expect(hf, mt, "topk_method", ("greedy", "group_limited_greedy"), "greedy",
                     "DeepseekV2TopkRouter implements these two")
    kw = _deepseek_common(hf, mt, n_shared_default=2)
    scale = _scale(hf, mt, 1.0)
    if method == "greedy":
        kw["routing"] = RoutingConfig(method=RoutingMethod.SOFTMAX_TOPK, renormalize=False,
                                      routed_scaling_factor=scale)
    else:
        kw["routing"] = RoutingConfig(
            method=RoutingMethod.GROUP_LIMITED_GREEDY, renormalize=False,
            num_expert_group=_positive_int(hf, mt, ("n_group",)),
            topk_group=_positive_int(hf, mt, ("topk_group",)), routed_scaling_factor=scale)
    return kw


def _deepseek_v3(hf: Mapping[str, Any], mt: str) -> dict:
    """``DeepseekV3TopkRouter``: noaux_tc (sigmoid, correction bias, group-limited)."""
    _expect(hf, mt, "scoring_func", ("sigmoid",), "sigmoid",
            "DeepseekV3TopkRouter is sigmoid")
    _expect(hf, mt, "topk_method", ("noaux_tc",), "noaux_tc",
            "DeepseekV3TopkRouter implements only noaux_tc")
    kw = _deepseek_common(hf, mt, n_shared_default=1)
    kw["routing"] = RoutingConfig(
        method=RoutingMethod.NOAUX_TC,
        renormalize=_flag(hf, mt, "norm_topk_prob", True),
        num_expert_group=_positive_int(hf, mt, ("n_group",), 8),
        topk_group=_positive_int(hf, mt, ("topk_group",), 4),
        routed_scaling_factor=_scale(hf, mt, 2.5))
    return kw


def _llama4_text(hf: Mapping[str, Any], mt: str) -> dict:
    """``Llama4TextMoe``: top-1 logit, ``sigmoid`` weight applied to the expert input, plus an
    ungated shared ``Llama4TextMLP(intermediate_size)``."""
    k = _positive_int(hf, mt, ("num_experts_per_tok",), 1)
    if k != 1:
        raise _field_error(mt, "num_experts_per_tok", k,
                           "moerun's llama4 routing is top-1 (weight applied on the input); "
                           "released Llama 4 checkpoints use 1")
    kw = _sizes(hf, mt, ("num_local_experts", "num_experts"), "intermediate_size",
                top_k_default=1)
    kw.update(routing=RoutingConfig(method=RoutingMethod.LLAMA4),
              apply_router_weight_on_input=True,
              shared_intermediate_size=kw["intermediate_size"])
    return kw


def _minimax_m2(hf: Mapping[str, Any], mt: str) -> dict:
    """``MiniMaxM2TopKRouter``: sigmoid + bias selects, unbiased sigmoids renormalized."""
    _expect(hf, mt, "scoring_func", ("sigmoid",), "sigmoid", "MiniMaxM2TopKRouter is sigmoid")
    shared = _count(hf, mt, "shared_intermediate_size", 0)
    if shared:
        raise _field_error(mt, "shared_intermediate_size", shared,
                           "MiniMaxM2SparseMoeBlock has no shared expert")
    biased = _flag(hf, mt, "use_routing_bias", True)
    kw = _sizes(hf, mt, ("num_local_experts", "num_experts"), "intermediate_size")
    kw["routing"] = RoutingConfig(
        method=RoutingMethod.SIGMOID_BIAS_TOPK if biased else RoutingMethod.SIGMOID_TOPK,
        renormalize=True)
    return kw


_BUILDERS: dict[str, Callable[[Mapping[str, Any], str], dict]] = {
    "mixtral": _mixtral,
    "qwen2_moe": lambda hf, mt: _qwen_moe(hf, mt, shared=True),
    "qwen3_moe": lambda hf, mt: _qwen_moe(hf, mt, shared=False),
    "deepseek_v2": _deepseek_v2,
    "deepseek_v3": _deepseek_v3,
    "llama4_text": _llama4_text,
    "minimax_m2": _minimax_m2,
}

#: ``model_type`` values accepted (``llama4`` reads its ``text_config``).
SUPPORTED_MODEL_TYPES = tuple(sorted(_BUILDERS)) + ("llama4",)


# ------------------------------------------------------------------------- common fields


def _check_activation(hf: Mapping[str, Any], mt: str) -> None:
    act = _get(hf, mt, ("hidden_act",), "silu")
    if act not in _SILU_NAMES:
        raise _field_error(mt, "hidden_act", act,
                           "moerun implements only silu(gate) * up experts")
    for name in ("swiglu_limit", "swiglu_limits"):
        if hf.get(name) is not None:
            raise _field_error(mt, name, hf[name],
                               "clamped SwiGLU experts are out of scope (only silu(gate) * up)")


def _parse_dtype(value: Any, field_name: str) -> torch.dtype:
    if isinstance(value, torch.dtype):
        dtype = value
    elif isinstance(value, str):
        dtype = _DTYPE_NAMES.get(value.removeprefix("torch."))
    else:
        dtype = None
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{field_name}={value!r} is not supported: use float32, float16 or "
                         "bfloat16")
    return dtype


def _hf_dtype(hf: Mapping[str, Any], fallback: Mapping[str, Any] | None) -> torch.dtype:
    # transformers 5 writes ``dtype``, 4.x ``torch_dtype``; Llama 4 may set it only at the top
    for source in (hf, fallback or {}):
        for name in ("dtype", "torch_dtype"):
            if source.get(name) is not None:
                return _parse_dtype(source[name], f"config field {name}")
    return torch.float32


_QUANT = "quantization_config"


def _quant_field(name: str, value: Any, fix: str) -> ValueError:
    return ValueError(f"config field {_QUANT}.{name}={value!r} cannot be mapped: {fix}")


def _hf_quant(hf: Mapping[str, Any], outer: Mapping[str, Any] | None) -> QuantConfig | None:
    """``quantization_config`` (of ``hf``, else of the outer Llama 4 config) as a
    :class:`QuantConfig`, or None (absent, or dequantized at load). See the module docstring
    for what is refused."""
    qc = hf.get(_QUANT)
    if qc is None and outer is not None:
        qc = outer.get(_QUANT)
    if qc is None:
        return None
    if not isinstance(qc, Mapping):
        to_dict = getattr(qc, "to_dict", None)  # a transformers QuantizationConfigMixin
        if not callable(to_dict):
            raise ValueError(f"config field {_QUANT}={qc!r} cannot be mapped: expected a dict")
        qc = to_dict()
    method = qc.get("quant_method")
    if method != "fp8":
        raise _quant_field("quant_method", method,
                           "moerun runs only FP8 block-scaled experts (quant_method 'fp8' "
                           "with weight_block_size [128, 128]); load a float checkpoint or "
                           "one quantized that way")
    if qc.get("dequantize") is True:
        return None  # transformers dequantizes these weights at load: float experts
    for name, want, why in (
            ("activation_scheme", "dynamic", "activations are quantized per token and group "
                                             "at run time; static input scales are not used"),
            ("scale_fmt", "float", "moerun's weight scales are fp32 (not ue8m0)"),
            ("expert_dtype", "fp8", "only e4m3 experts are supported (not fp4)"),
            ("fmt", "e4m3", "only float8_e4m3fn weights are supported")):
        v = qc.get(name, want)
        if v is not None and str(v).lower() != want:
            raise _quant_field(name, v, f"must be {want!r}: {why}")
    block = qc.get("weight_block_size")
    if not (isinstance(block, (list, tuple)) and len(block) == 2):
        raise _quant_field("weight_block_size", block,
                           "moerun needs block-scaled FP8, e.g. [128, 128] (per-tensor FP8 "
                           "is not supported)")
    try:
        return QuantConfig(weight_block=tuple(block), act_group=block[1])
    except ValueError as exc:
        raise _quant_field("weight_block_size", block, str(exc)) from None


def moe_config_kwargs(hf: Mapping[str, Any], *, dtype: torch.dtype | None = None) -> dict:
    """Map a Hugging Face MoE ``config.json`` to :class:`MoEConfig` keyword arguments.

    Args:
        hf: the parsed ``config.json`` (or ``PretrainedConfig.to_dict()``). ``model_type``
            selects the family (see the module table); a top-level ``llama4`` dict is read
            through its ``text_config``.
        dtype: the layer dtype; ``None`` takes ``dtype`` (transformers 5) or ``torch_dtype``
            from ``hf`` (float32 when neither is set).

    Returns:
        ``dict`` with ``num_experts``, ``top_k``, ``hidden_size``, ``intermediate_size``,
        ``routing`` (a :class:`RoutingConfig`), ``dtype`` and, where the family has them,
        ``shared_intermediate_size``, ``shared_expert_gate``, ``apply_router_weight_on_input``;
        ``quant`` (a :class:`moerun.QuantConfig`) for an FP8 block-scaled
        ``quantization_config``.

    Raises:
        TypeError: ``hf`` is not a mapping.
        ValueError: a field that cannot be mapped (named with its value), a missing size, or
            conflicting aliases. See the module docstring for the list.
    """
    if not isinstance(hf, Mapping):
        raise TypeError(f"hf must be a mapping (a parsed config.json), got {type(hf).__name__}")
    mt = hf.get("model_type")
    outer: Mapping[str, Any] | None = None
    if mt == "llama4":
        text = hf.get("text_config")
        if not isinstance(text, Mapping):
            raise ValueError(f"llama4 config field text_config={text!r} cannot be mapped: the "
                             "MoE layers are described by the text_config dict")
        outer, hf = hf, text
        mt = hf.get("model_type", "llama4_text")
        if mt != "llama4_text":
            raise ValueError(f"llama4 config field text_config.model_type={mt!r} cannot be "
                             "mapped: expected 'llama4_text'")
    builder = _BUILDERS.get(mt)
    if builder is None:
        raise ValueError(f"config field model_type={mt!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    _check_activation(hf, mt)
    kwargs = builder(hf, mt)
    kwargs["dtype"] = _parse_dtype(dtype, "dtype") if dtype is not None \
        else _hf_dtype(hf, outer)
    quant = _hf_quant(hf, outer)
    if quant is not None:
        kwargs["quant"] = quant
    return kwargs


def read_hf_config(source: Any) -> Mapping[str, Any]:
    """The ``config.json`` mapping of ``source``.

    Args:
        source: a mapping (returned as is); a path (``str`` or ``os.PathLike``) to a
            ``config.json`` file or to a model directory that holds one (what
            ``save_pretrained`` writes); or an object with a callable ``to_dict()`` (a
            ``transformers.PretrainedConfig``, read with ``to_dict()``).

    Raises:
        FileNotFoundError: the path, or ``config.json`` in the directory, does not exist.
        ValueError: the file is not valid JSON or does not hold a JSON object.
        TypeError: any other type of ``source``.

    Side effects: reads the file; no ``transformers`` import.
    """
    if isinstance(source, Mapping):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"from_hf_config: {path!r} does not exist; pass a "
                                    "config.json file or a model directory holding one")
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"from_hf_config: {path!r} is not valid JSON: {exc}") from None
        if not isinstance(data, Mapping):
            raise ValueError(f"from_hf_config: {path!r} holds a JSON {type(data).__name__}; "
                             "expected an object (a config.json)")
        return data
    to_dict = getattr(source, "to_dict", None)
    if callable(to_dict):
        data = to_dict()
        if not isinstance(data, Mapping):
            raise TypeError(f"from_hf_config: {type(source).__name__}.to_dict() returned "
                            f"{type(data).__name__}, expected a dict")
        return data
    raise TypeError(f"from_hf_config: hf must be a dict, a path to a config.json or a model "
                    f"directory, or a PretrainedConfig; got {type(source).__name__}")
