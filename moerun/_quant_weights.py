"""Checks and conversions of FP8 block-scaled weights at load time (issue 12), for
the loaders of :mod:`moerun._loading` (``ConfigurableMoE.load_weights`` /
``load_expert_weights``).

Legend: ``E`` logical experts, ``H`` hidden, ``I`` intermediate, ``Is`` shared intermediate,
``(bn, bk)`` the weight block of :class:`moerun.quant.QuantConfig`.

Rules (DESIGN 11a, the checkpoint layout): with ``MoEConfig.quant`` the routed weights are
``float8_e4m3fn`` with fp32 ``scale_inv`` blocks and both are required; without it an fp8
weight or a scale is an error (the caller either sets ``quant`` or dequantizes). A float
weight for a quantized layer is refused, not quantized silently: the caller quantizes
explicitly with :func:`moerun.quant.quantize_weight_blocks`. The shared expert runs in the
activation dtype; an fp8 one (with its scales) is dequantized once here.

Pure checks (no copies) except :func:`dequantize_shared`, which returns new tensors.
"""

from __future__ import annotations

import torch

from moerun.config import MoEConfig
from moerun.quant import FP8_DTYPE, dequantize_weight_blocks

__all__ = ["check_weight_dtype", "check_global_scales", "expert_scale_shapes",
           "SCALE_PARTS", "dequantize_shared"]

#: ``load_expert_weights`` names of the weight scales and the parts each fills.
SCALE_PARTS = {"gate_proj_scale_inv": ("gate_scale",), "up_proj_scale_inv": ("up_scale",),
               "down_proj_scale_inv": ("down_scale",),
               "gate_up_proj_scale_inv": ("gate_scale", "up_scale")}

_QUANTIZE_HINT = ("quantize it first with moerun.quant.quantize_weight_blocks(w, "
                  "config.quant.weight_block), which returns (w_fp8, scale_inv)")


def check_weight_dtype(cfg: MoEConfig, name: str, t: torch.Tensor) -> None:
    """ValueError unless ``t`` (a routed weight called ``name``) has the dtype ``cfg`` needs:
    e4m3 with ``cfg.quant``, anything but fp8 without (cast by the copy, as before)."""
    if cfg.quant is not None:
        if t.dtype != FP8_DTYPE:
            raise ValueError(f"{name} is {t.dtype} but config.quant={cfg.quant} needs "
                             f"{FP8_DTYPE} weights: {_QUANTIZE_HINT}")
    elif t.dtype == FP8_DTYPE:
        raise ValueError(f"{name} is {t.dtype} but config.quant is None: build the layer with "
                         "MoEConfig(quant=moerun.QuantConfig()) for fp8 weights (and pass their "
                         "scales), or load float weights")


def _check_scale(name: str, t: torch.Tensor | None, want: tuple[int, ...]) -> None:
    if t is None:
        raise ValueError(f"{name} is required: config.quant is set, so every fp8 weight needs "
                         f"its fp32 scale_inv blocks {list(want)}")
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dtype == FP8_DTYPE:
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} is {got}; expected a float tensor (fp32 scale_inv blocks)")
    if tuple(t.shape) != want:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {list(want)} (one "
                         "scale_inv per weight block)")


def check_global_scales(cfg: MoEConfig, w13_scale: torch.Tensor | None,
                        w2_scale: torch.Tensor | None) -> None:
    """``load_weights``' scales: ``w13_scale [E, 2I/bn, H/bk]`` and ``w2_scale [E, H/bn,
    I/bk]`` iff ``cfg.quant``. ValueError naming the argument."""
    if cfg.quant is None:
        for name, t in (("w13_scale", w13_scale), ("w2_scale", w2_scale)):
            if t is not None:
                raise ValueError(f"{name} given but config.quant is None: scales belong to "
                                 "fp8 weights; build the layer with MoEConfig(quant="
                                 "moerun.QuantConfig())")
        return
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    _check_scale("w13_scale", w13_scale, (e, *cfg.quant.scale_shape(2 * i, h)))
    _check_scale("w2_scale", w2_scale, (e, *cfg.quant.scale_shape(h, i)))


def expert_scale_shapes(cfg: MoEConfig) -> dict[str, tuple[int, int]]:
    """Shapes of one expert's scale items for ``load_expert_weights`` (``{}`` unquantized)."""
    q = cfg.quant
    if q is None:
        return {}
    h, i = cfg.hidden_size, cfg.intermediate_size
    return {"gate_proj_scale_inv": q.scale_shape(i, h), "up_proj_scale_inv": q.scale_shape(i, h),
            "down_proj_scale_inv": q.scale_shape(h, i),
            "gate_up_proj_scale_inv": q.scale_shape(2 * i, h)}


def dequantize_shared(cfg: MoEConfig, shared: dict | None) -> dict | None:
    """``shared`` with an fp8 ``w13`` / ``w2`` replaced by its dequantized values (fp32, cast
    by the copy into the layer) using ``shared["w13_scale"]`` ``[ceil(2Is/bn), ceil(H/bk)]``
    and ``shared["w2_scale"]`` ``[ceil(H/bn), ceil(Is/bk)]``; float entries pass through.
    The scale keys are consumed. ValueError for a missing scale or an fp8 shared expert
    without ``cfg.quant`` (its block size is unknown). Returns a new dict, or ``shared``
    itself when nothing is fp8."""
    if shared is None or not any(isinstance(shared.get(n), torch.Tensor)
                                 and shared[n].dtype == FP8_DTYPE for n in ("w13", "w2")):
        if shared is not None:
            for n in ("w13_scale", "w2_scale"):
                if n in shared:
                    raise ValueError(f"shared['{n}'] given but shared['{n[:-6]}'] is not "
                                     f"{FP8_DTYPE}: scales belong to fp8 weights")
        return shared
    if cfg.quant is None:
        raise ValueError("shared holds fp8 weights but config.quant is None: their weight "
                         "block size is unknown; build the layer with MoEConfig(quant="
                         "moerun.QuantConfig()) or pass dequantized shared weights")
    out = {k: v for k, v in shared.items() if k not in ("w13_scale", "w2_scale")}
    for n in ("w13", "w2"):
        w = shared[n]
        if w.dtype != FP8_DTYPE:
            continue
        scale = shared.get(f"{n}_scale")
        if scale is None:
            raise ValueError(f"shared['{n}_scale'] is required: shared['{n}'] is {FP8_DTYPE} "
                             "(the shared expert is dequantized once at load)")
        out[n] = dequantize_weight_blocks(w, scale, cfg.quant.weight_block)
    return out
