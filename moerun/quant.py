"""Block-scaled FP8 (DESIGN 11a): the quantization config, the quantized-rows container, and
the torch functions that define the numbers every FP8 kernel must reproduce.

Legend: ``M`` rows, ``H`` hidden, ``I`` intermediate, ``S`` slots, ``g`` the activation group
(128 columns), ``(bn, bk)`` the weight block (128 x 128).

Conventions (the DeepSeek-V3 / Qwen3-FP8 checkpoint layout, transformers 5 ``FP8Experts``):

* weights are ``float8_e4m3fn`` with an fp32 ``scale_inv`` per ``bn x bk`` block:
  ``w ~= w_fp8 * scale_inv[n // bn, k // bk]``;
* activations are quantized per row and ``g``-column group:
  ``scale = max(amax(|x_group|), 1e-10) * fp32(1 / 448)`` and ``x_fp8 = clamp(x / scale,
  +-448)`` rounded to nearest-even e4m3; ``x ~= x_fp8 * scale``. The scale is a product by the
  fp32 reciprocal, not a division: torch on CUDA computes ``tensor / 448`` that way and on the
  CPU exactly, and a one-bit difference in a scale flips the e4m3 codes that sit on a rounding
  tie (bf16 inputs make ties common), so every implementation uses the product.

Everything here is pure torch on any device (the twin and the CPU path); no host sync.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "QuantConfig",
    "QuantizedRows",
    "ExpertQuant",
    "ZERO_ROW_SCALE",
    "quantize_rows",
    "dequantize_rows",
    "quantize_weight_blocks",
    "dequantize_weight_blocks",
    "reference_fp8_moe",
]

FP8_DTYPE = torch.float8_e4m3fn
#: Largest finite e4m3fn value.
FP8_MAX = 448.0
#: Floor on a group's amax, so an all-zero group gets a finite scale (and zero codes).
AMAX_EPS = 1e-10


def _scale_of(amax: torch.Tensor) -> torch.Tensor:
    """fp32 ``amax [...]`` -> the e4m3 scale ``max(amax, AMAX_EPS) * fp32(1 / 448)`` (the
    product, see the module docstring): the one torch statement of the rule. Pure torch."""
    return amax.clamp(min=AMAX_EPS) * (1.0 / FP8_MAX)


#: The scale of an all-zero group (what :func:`quantize_rows` gives a zero or padded row), as
#: the kernels compute it.
ZERO_ROW_SCALE = _scale_of(torch.zeros((), dtype=torch.float32)).item()

_METHODS = ("fp8_block",)


@dataclass(frozen=True, kw_only=True)
class QuantConfig:
    """How a layer's experts are quantized (``MoEConfig.quant``; ``None`` = unquantized).

    Fields:
        method: only ``"fp8_block"`` (e4m3 weights with fp32 per-block ``scale_inv``,
            activations quantized per row and column group at run time).
        weight_block: ``(bn, bk)`` rows x columns of one weight scale block.
        act_group: columns of one activation scale group; must equal ``bk`` (each K step of a
            kernel then uses one weight scale and one activation scale).
    """

    method: str = "fp8_block"
    weight_block: tuple[int, int] = (128, 128)
    act_group: int = 128

    def __post_init__(self) -> None:
        if self.method not in _METHODS:
            raise ValueError(f"QuantConfig.method={self.method!r} is invalid: only "
                             f"{_METHODS} is supported")
        wb = self.weight_block
        if isinstance(wb, list):
            wb = tuple(wb)
            object.__setattr__(self, "weight_block", wb)
        if not (isinstance(wb, tuple) and len(wb) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in wb)):
            raise ValueError(f"QuantConfig.weight_block={self.weight_block!r} is invalid: "
                             "give two positive ints (rows, columns), e.g. (128, 128)")
        g = self.act_group
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ValueError(f"QuantConfig.act_group={g!r} is invalid: must be a positive int")
        if g != wb[1]:
            raise ValueError(f"QuantConfig.act_group={g} must equal weight_block[1]="
                             f"{wb[1]} (one activation and one weight scale per K step)")

    def scale_shape(self, n: int, k: int) -> tuple[int, int]:
        """``(ceil(n / bn), ceil(k / bk))``: the ``scale_inv`` blocks of an ``[n, k]`` weight.

        Pure; host only."""
        bn, bk = self.weight_block
        return -(-n // bn), -(-k // bk)


@dataclass(frozen=True, eq=False, kw_only=True)
class QuantizedRows:
    """Activations in FP8 with their per-group scales (what travels under post-quant dispatch).

    Fields:
        data: ``[M, H]`` ``float8_e4m3fn``.
        scale: ``[M, ceil(H / g)]`` fp32; ``x ~= data * scale`` per group.
        group: ``g``.
    """

    data: torch.Tensor
    scale: torch.Tensor
    group: int

    def __post_init__(self) -> None:
        m, h = self.data.shape
        if self.data.dtype != FP8_DTYPE:
            raise ValueError(f"QuantizedRows.data must be {FP8_DTYPE}, got {self.data.dtype}")
        want = (m, math.ceil(h / self.group))
        if tuple(self.scale.shape) != want or self.scale.dtype != torch.float32:
            raise ValueError(f"QuantizedRows.scale must be {list(want)} float32, got "
                             f"{list(self.scale.shape)} {self.scale.dtype}")

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device


@dataclass(frozen=True, kw_only=True, eq=False)
class ExpertQuant:
    """What a backend needs to run the FP8 expert path (``Backend.run_experts(..., quant=)``).

    Fields:
        config: the layer's :class:`QuantConfig`.
        w13_scale: ``[S_local, 2I/bn, H/bk]`` fp32 ``scale_inv`` of ``w13`` (e4m3).
        w2_scale: ``[S_local, H/bn, I/bk]`` fp32 ``scale_inv`` of ``w2`` (e4m3).
        out_dtype: dtype of the ``[M, H]`` output (the layer's activation dtype).
    """

    config: QuantConfig
    w13_scale: torch.Tensor
    w2_scale: torch.Tensor
    out_dtype: torch.dtype


def _groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, int]:
    """``[..., C]`` -> fp32 ``[..., ceil(C/g), g]`` (zero-padded) and the pad width."""
    c = x.shape[-1]
    pad = (-c) % group
    xf = x.float()
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    return xf.reshape(*x.shape[:-1], (c + pad) // group, group), pad


def quantize_rows(x: torch.Tensor, group: int = 128) -> QuantizedRows:
    """Quantize ``x [M, H]`` (any float dtype) per row and ``group`` columns to e4m3.

    Returns :class:`QuantizedRows` on ``x.device``. Pure torch; no host sync; capturable.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be [M, H], got {list(x.shape)}")
    xg, pad = _groups(x, group)
    scale = _scale_of(xg.abs().amax(dim=-1))  # [M, G]
    q = (xg / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    q = q.reshape(x.shape[0], xg.shape[-2] * group)  # explicit: M may be 0
    if pad:
        q = q[:, : x.shape[1]].contiguous()
    return QuantizedRows(data=q, scale=scale.contiguous(), group=group)


def dequantize_rows(q: QuantizedRows) -> torch.Tensor:
    """``[M, H]`` fp32 values ``data * scale`` of :class:`QuantizedRows`.

    Allocates; current stream; no host sync; capturable."""
    m, h = q.data.shape
    s = q.scale.repeat_interleave(q.group, dim=1)[:, :h]
    return q.data.float() * s


def quantize_weight_blocks(w: torch.Tensor, block: tuple[int, int] = (128, 128)
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``w [..., N, K]`` per ``block`` to e4m3 with fp32 ``scale_inv``.

    Returns ``(w_fp8 [..., N, K], scale_inv [..., ceil(N/bn), ceil(K/bk)])`` with
    ``scale_inv = max(amax, 1e-10) * fp32(1 / 448)`` per block (the checkpoint convention).
    For tests and benchmarks (checkpoints ship already quantized).

    Allocates; current stream; no host sync; capturable.
    """
    bn, bk = block
    *lead, n, k = w.shape
    pn, pk = (-n) % bn, (-k) % bk
    wf = torch.nn.functional.pad(w.float(), (0, pk, 0, pn))
    gn, gk = (n + pn) // bn, (k + pk) // bk
    blocks = wf.reshape(*lead, gn, bn, gk, bk)
    scale = _scale_of(blocks.abs().amax(dim=(-3, -1)))  # [..., gn, gk]
    q = (blocks / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    q = q.reshape(*lead, n + pn, k + pk)[..., :n, :k].contiguous()
    return q, scale.contiguous()


def dequantize_weight_blocks(w: torch.Tensor, scale_inv: torch.Tensor,
                             block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    """``[..., N, K]`` fp32 ``w * scale_inv`` broadcast over ``block``.

    Allocates; current stream; no host sync; capturable."""
    bn, bk = block
    n, k = w.shape[-2:]
    want = (math.ceil(n / bn), math.ceil(k / bk))
    if tuple(scale_inv.shape[-2:]) != want or scale_inv.shape[:-2] != w.shape[:-2]:
        raise ValueError(f"scale_inv {list(scale_inv.shape)} does not match weight "
                         f"{list(w.shape)} in blocks of {block}: expected "
                         f"{[*w.shape[:-2], *want]}")
    s = scale_inv.float().repeat_interleave(bn, dim=-2).repeat_interleave(bk, dim=-1)
    return w.float() * s[..., :n, :k]


def reference_fp8_moe(
    x: torch.Tensor | QuantizedRows,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    quant: QuantConfig,
    *,
    out_dtype: torch.dtype = torch.float32,
    intermediate_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """DESIGN 11a's reference: dequantized weights (fp32) applied to identically quantized
    activations.

    ``x`` ([M, H] float, quantized here per ``quant.act_group``; or already
    :class:`QuantizedRows`) is dequantized; per slot, ``a = silu(x W_gate^T) * (x W_up^T)``
    in fp32, rounded to ``intermediate_dtype`` (default ``out_dtype``: the kernels hold the
    intermediate in the layer's activation dtype), quantized per row and group exactly as
    the kernels re-quantize it, dequantized, and multiplied by ``W_2^T``; the weighted sum
    over the local (t, j) pairs (ids ``-1`` skipped) is accumulated in fp32.

    Shapes: ``w13 [S, 2I, H]`` e4m3, ``w13_scale [S, ceil(2I/bn), ceil(H/bk)]``, ``w2 [S, H,
    I]`` e4m3, ``w2_scale [S, ceil(H/bn), ceil(I/bk)]``, ``topk_* [M, K]``. Returns ``[M, H]``
    in ``out_dtype``. Host sync: yes (``nonzero`` per slot; the oracle, not a fast path).
    """
    q = x if isinstance(x, QuantizedRows) else quantize_rows(x, quant.act_group)
    xd = dequantize_rows(q)
    m, h = xd.shape
    s_num, two_i, _ = w13.shape
    inter = two_i // 2
    out = torch.zeros(m, h, dtype=torch.float32, device=xd.device)
    ids = topk_ids.long()
    mid_dtype = out_dtype if intermediate_dtype is None else intermediate_dtype
    for s in range(s_num):
        hit = ids == s
        rows = hit.any(dim=1).nonzero().squeeze(1)  # NOTE: host sync
        if rows.numel() == 0:
            continue
        w = (topk_weights.float() * hit.float()).sum(dim=1)[rows]
        g13 = dequantize_weight_blocks(w13[s], w13_scale[s], quant.weight_block)
        g2 = dequantize_weight_blocks(w2[s], w2_scale[s], quant.weight_block)
        gu = xd[rows] @ g13.t()
        act = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        act = dequantize_rows(quantize_rows(act.to(mid_dtype), quant.act_group))
        out.index_add_(0, rows, (act @ g2.t()) * w[:, None])
    return out.to(out_dtype)
