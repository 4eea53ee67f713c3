"""Inputs of one benchmark cell and the reference it is checked against: random expert
weights, uniform random routing, and an upcast reference for a few rows.

Shared by ``moerun bench``, ``moerun tune`` and the Triton GPU tests, so every number and
every check is made on the same kind of data. Legend: ``T`` tokens, ``E`` experts (slots),
``K`` top-k, ``H`` hidden, ``I`` intermediate. Data is random, never zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moerun._precision import exact_fp32
from moerun.bench.shapes import BenchShape

__all__ = ["Weights", "Fp8Weights", "Case", "make_weights", "make_fp8_weights", "draw_routing",
           "make_case", "reference_rows"]


@dataclass(frozen=True, eq=False)
class Weights:
    """Expert weights of one shape: ``w13 [E, 2I, H]`` (gate rows, then up rows) and
    ``w2 [E, H, I]``, random normal scaled by ``H^-0.5`` / ``I^-0.5``."""

    w13: torch.Tensor
    w2: torch.Tensor


@dataclass(frozen=True, eq=False)
class Fp8Weights:
    """FP8 block-scaled expert weights of one shape (DESIGN 11a): ``w13 [E, 2I, H]`` and
    ``w2 [E, H, I]`` e4m3, ``w13_scale [E, 2I/128, H/128]`` and ``w2_scale [E, H/128,
    I/128]`` fp32 ``scale_inv``."""

    w13: torch.Tensor
    w2: torch.Tensor
    w13_scale: torch.Tensor
    w2_scale: torch.Tensor


@dataclass(frozen=True, eq=False)
class Case:
    """One call's inputs: ``x [T, H]``, ``topk_weights [T, K]`` fp32 (softmax of random
    logits), ``topk_ids [T, K]`` int32 (distinct per row; ``-1`` where dropped)."""

    x: torch.Tensor
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor


def make_weights(shape: BenchShape, dtype: torch.dtype, device: torch.device | str, *,
                 seed: int = 0, generator: torch.Generator | None = None) -> Weights:
    """Random ``w13`` / ``w2`` for ``shape`` on ``device`` (``shape.weight_bytes`` bytes:
    deepseek-v3 bf16 is 22.5 GB). ``generator`` (on ``device``) wins over ``seed``.

    Allocates and fills on ``device`` (current stream); no host sync."""
    g = generator or torch.Generator(device=device).manual_seed(seed)
    h, i, e = shape.hidden, shape.intermediate, shape.num_experts
    with torch.no_grad():
        w13 = torch.randn(e, 2 * i, h, generator=g, device=device, dtype=dtype).mul_(h ** -0.5)
        w2 = torch.randn(e, h, i, generator=g, device=device, dtype=dtype).mul_(i ** -0.5)
    return Weights(w13=w13, w2=w2)


def make_fp8_weights(shape: BenchShape, dtype: torch.dtype, device: torch.device | str, *,
                     seed: int = 0, chunk: int = 8) -> Fp8Weights:
    """:func:`make_weights` in ``dtype`` quantized with
    :func:`moerun.quant.quantize_weight_blocks` (128 x 128 blocks), ``chunk`` experts at a
    time (the fp32 temporaries stay at ``chunk`` experts; the ``dtype`` weights are freed
    before returning, so the peak is their bytes plus the fp8 copy: 34 GB for deepseek-v3 in
    bf16). Allocates and quantizes on ``device`` (current stream); no host sync."""
    from moerun.quant import FP8_DTYPE, QuantConfig, quantize_weight_blocks

    src = make_weights(shape, dtype, device, seed=seed)
    qc = QuantConfig()
    e, h, i = shape.num_experts, shape.hidden, shape.intermediate
    out = Fp8Weights(
        w13=torch.empty(e, 2 * i, h, dtype=FP8_DTYPE, device=device),
        w2=torch.empty(e, h, i, dtype=FP8_DTYPE, device=device),
        w13_scale=torch.empty(e, *qc.scale_shape(2 * i, h), device=device),
        w2_scale=torch.empty(e, *qc.scale_shape(h, i), device=device))
    with torch.no_grad():
        for lo in range(0, e, chunk):
            hi = min(e, lo + chunk)
            for w, q, scale in ((src.w13, out.w13, out.w13_scale),
                                (src.w2, out.w2, out.w2_scale)):
                q[lo:hi], scale[lo:hi] = quantize_weight_blocks(w[lo:hi], qc.weight_block)
    del src
    return out


def draw_routing(tokens: int, num_experts: int, top_k: int, gen: torch.Generator,
                 device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random routing: ``(weights [T, K] fp32, ids [T, K] int32)``; each token gets K
    distinct experts of ``[0, num_experts)``, every K-subset equally likely (top-K of i.i.d.
    uniform scores); weights are a softmax of normal logits (rows sum to 1).

    Allocates on ``device``, draws from ``gen``; no host sync."""
    scores = torch.rand(tokens, num_experts, generator=gen, device=device)
    ids = scores.topk(top_k, dim=1).indices.to(torch.int32)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=gen, device=device), dim=1)
    return weights, ids


def make_case(shape: BenchShape, tokens: int, dtype: torch.dtype, device: torch.device | str,
              *, seed: int = 0, drop: float = 0.0) -> Case:
    """``x [T, H]`` random normal plus :func:`draw_routing` over ``shape``'s experts;
    ``drop`` of the ids (independently) become ``-1`` (another rank's slot / padding).

    Allocates on ``device``; no host sync."""
    if not 0.0 <= drop < 1.0:
        raise ValueError(f"make_case: drop={drop!r} must be in [0, 1)")
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, shape.hidden, generator=g, device=device, dtype=dtype)
    weights, ids = draw_routing(tokens, shape.num_experts, shape.top_k, g, device)
    if drop > 0:
        gone = torch.rand(ids.shape, generator=g, device=device) < drop
        ids = torch.where(gone, torch.full_like(ids, -1), ids)
    return Case(x=x, topk_weights=weights.contiguous(), topk_ids=ids.contiguous())


def reference_rows(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                   topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                   acc: torch.dtype = torch.float32) -> torch.Tensor:
    """Upcast reference for a few rows: ``[n, H]`` in ``acc`` (fp32 for the bench, fp64 in
    the GPU tests), each hit slot's weights upcast one at a time (so a 22 GB weight set never
    exists in fp32). Ids ``-1`` contribute nothing. TF32 off while it runs. Host syncs: yes.
    """
    n, h = x.shape
    inter = w13.shape[1] // 2
    out = torch.zeros(n, h, dtype=acc, device=x.device)
    ids = topk_ids.long()
    with exact_fp32():
        xa = x.to(acc)
        for e in torch.unique(ids[ids >= 0]).tolist():  # NOTE: host sync (check only)
            hit = ids == e
            rows = hit.any(dim=1).nonzero().squeeze(1)  # NOTE: host sync
            w = (topk_weights.to(acc) * hit.to(acc)).sum(dim=1)[rows]
            gate_up = xa[rows] @ w13[e].to(acc).t()
            act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
            out.index_add_(0, rows, (act @ w2[e].to(acc).t()) * w[:, None])
    return out
