"""Seeded global inputs and the unsharded fp64 reference (used by tests and ``moerun run``).

Every rank (and the single-process reference) draws the same global tensors from ``seed``,
then takes its own rows; the reference runs :func:`moerun.backends.reference_moe` in fp64 on
the whole batch. For an FP8 config (``cfg.quant``) the routed weights are drawn in fp32 and
quantized per block (:func:`moerun.quant.quantize_weight_blocks`); the reference is then
DESIGN 11a's (:func:`moerun.quant.reference_fp8_moe`), and :func:`unquantized_reference`
gives the fp64 layer with the dequantized weights and unquantized activations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moerun.config import MoEConfig
from moerun.backends import reference_moe
from moerun.quant import dequantize_weight_blocks, quantize_weight_blocks, reference_fp8_moe
from moerun.routing import route

# DESIGN 2 bounds on ||out - ref|| / ||ref||, ref in fp64.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
TOL_MULTIRANK_BF16 = 2e-2
# DESIGN 11a / issue 12: an FP8 layer against reference_fp8_moe, and against the fp64 layer
# with the dequantized weights and unquantized activations (e4m3 keeps 3 mantissa bits: each
# quantized activation is off by up to 2^-4 relative, two of them per expert).
TOL_FP8 = 3e-2
TOL_FP8_UNQUANTIZED = 6e-2


@dataclass(frozen=True, kw_only=True)
class GlobalCase:
    """A seeded global batch and weights (:func:`make_case`); frozen: a variant is
    ``dataclasses.replace(case, logits=...)``, so a case shared by tests never changes."""

    x: torch.Tensor  # [T_total, H] cfg.dtype
    logits: torch.Tensor  # [T_total, E] fp32
    w13: torch.Tensor  # [E, 2I, H]
    w2: torch.Tensor  # [E, H, I]
    shared: dict | None
    bias: torch.Tensor | None
    w13_scale: torch.Tensor | None = None  # [E, 2I/bn, H/bk] fp32 (FP8 configs: w13 is e4m3)
    w2_scale: torch.Tensor | None = None  # [E, H/bn, I/bk] fp32 (FP8 configs: w2 is e4m3)


def make_case(cfg: MoEConfig, total_tokens: int, seed: int) -> GlobalCase:
    """A seeded global batch for ``cfg``: ``x [T, H]``, router logits ``[T, E]``, ``w13`` / ``w2``
    (FP8 configs: quantized, with their scales), the shared expert's weights and the correction bias
    where the config has them.

    Host only: CPU tensors drawn from a generator seeded with ``seed`` (the global RNG is
    untouched)."""
    g = torch.Generator().manual_seed(seed)
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(cfg.dtype)

    x = rnd(total_tokens, h)
    logits = torch.randn(total_tokens, e, generator=g)
    w13 = rnd(e, 2 * i, h, scale=h ** -0.5)
    w2 = rnd(e, h, i, scale=i ** -0.5)
    shared = None
    if cfg.has_shared_expert:
        si = cfg.shared_intermediate_size
        shared = {"w13": rnd(2 * si, h, scale=h ** -0.5), "w2": rnd(h, si, scale=si ** -0.5)}
        if cfg.shared_expert_gate:
            shared["gate"] = rnd(1, h, scale=h ** -0.5)
    bias = torch.randn(e, generator=g) * 0.1 if cfg.routing.uses_correction_bias else None
    if cfg.quant is None:
        return GlobalCase(x=x, logits=logits, w13=w13, w2=w2, shared=shared, bias=bias)
    # FP8: the same draws (in cfg.dtype), quantized per weight block
    q13, s13 = quantize_weight_blocks(w13, cfg.quant.weight_block)
    q2, s2 = quantize_weight_blocks(w2, cfg.quant.weight_block)
    return GlobalCase(x=x, logits=logits, w13=q13, w2=q2, shared=shared, bias=bias,
                      w13_scale=s13, w2_scale=s2)


def shared_reference(x: torch.Tensor, shared: dict) -> torch.Tensor:
    """fp64 shared MLP (independent formula).

    Runs on ``x``'s device (current stream); no host sync."""
    xd = x.double()
    si = shared["w2"].shape[1]
    gu = xd @ shared["w13"].double().t()
    y = (F.silu(gu[:, :si]) * gu[:, si:]) @ shared["w2"].double().t()
    if "gate" in shared:
        y = y * torch.sigmoid(xd @ shared["gate"].double().t())
    return y


def reference_output(cfg: MoEConfig, case: GlobalCase) -> torch.Tensor:
    """Unsharded fp64 reference for the whole global batch: ``[T_total, H]`` fp64. For an
    FP8 config: :func:`moerun.quant.reference_fp8_moe` (fp32 accumulation, returned in
    ``cfg.dtype``) plus the fp64 shared expert.

    Host sync (the reference's ``nonzero`` per slot): not capturable."""
    routed = route(case.logits, top_k=cfg.top_k, config=cfg.routing, correction_bias=case.bias)
    if cfg.quant is not None:
        # out_dtype = the activation dtype, as the layer returns it
        out = reference_fp8_moe(case.x, case.w13, case.w13_scale, case.w2, case.w2_scale,
                                routed.topk_weights, routed.topk_ids, cfg.quant,
                                out_dtype=cfg.dtype).double()
        if case.shared is not None:
            out = out + shared_reference(case.x, case.shared)
        return out
    x = case.x.double()
    weights = routed.topk_weights
    if cfg.apply_router_weight_on_input:
        x = x * weights.double()
        weights = torch.ones_like(weights)
    out = reference_moe(x, case.w13.double(), case.w2.double(), weights, routed.topk_ids)
    if case.shared is not None:
        out = out + shared_reference(case.x, case.shared)
    return out


def unquantized_reference(cfg: MoEConfig, case: GlobalCase) -> torch.Tensor:
    """The fp64 layer of an FP8 ``case`` with its dequantized weights and unquantized
    activations (the second FP8 bar): ``[T_total, H]`` fp64.

    Host sync (the reference's ``nonzero`` per slot): not capturable."""
    assert cfg.quant is not None, "unquantized_reference is for FP8 configs"
    routed = route(case.logits, top_k=cfg.top_k, config=cfg.routing, correction_bias=case.bias)
    w13 = dequantize_weight_blocks(case.w13, case.w13_scale, cfg.quant.weight_block).double()
    w2 = dequantize_weight_blocks(case.w2, case.w2_scale, cfg.quant.weight_block).double()
    out = reference_moe(case.x.double(), w13, w2, routed.topk_weights, routed.topk_ids)
    if case.shared is not None:
        out = out + shared_reference(case.x, case.shared)
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref||_2 / ||ref||_2`` in fp64; 0.0 for matching empty shapes.

    Host sync (``float()`` of the result): not capturable."""
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"rel_err: out has shape {tuple(out.shape)} but ref has "
                         f"{tuple(ref.shape)}; compare tensors of one shape")
    if ref.numel() == 0:
        return 0.0
    return float((out.double() - ref.double()).norm() / ref.double().norm())
