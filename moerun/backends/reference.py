"""``ReferenceExperts``: the torch oracle every other backend is compared with.

Runs on any device and dtype (fp64 included), and the FP8 block-scaled path (DESIGN 11a)
through :func:`moerun.quant.reference_fp8_moe`, the definition of its numbers. It loops over local slots and uses boolean
masks and ``nonzero`` (host-synchronising, not capturable): it is the oracle, not the fast
path.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from moerun.backends.base import Backend, FusedShared
from moerun.capability import Deployment, Eligibility, Problem, RejectReason
from moerun.config import Activation
from moerun.env import Env
from moerun.quant import ExpertQuant, QuantizedRows, reference_fp8_moe

__all__ = ["ReferenceExperts", "reference_moe", "slot_w13", "slot_w2"]


def slot_w13(s: int, w13: torch.Tensor, shared: FusedShared | None) -> torch.Tensor:
    """``[2I, H]`` gate and up rows of slot ``s``: routed (``s < S``) or the ``I``-wide slice
    ``s - S`` of the fused shared expert (a copy of its gate and up rows).

    A view for a routed slot; for a shared slot one ``torch.cat`` copy on the current stream. No
    host sync; capturable."""
    if s < w13.shape[0]:
        return w13[s]
    assert shared is not None
    inter = w13.shape[1] // 2
    s_inter = shared.w13.shape[0] // 2
    lo = (s - w13.shape[0]) * inter
    return torch.cat([shared.w13[lo:lo + inter], shared.w13[s_inter + lo:s_inter + lo + inter]])


def slot_w2(s: int, w2: torch.Tensor, shared: FusedShared | None) -> torch.Tensor:
    """``[H, I]`` down projection of slot ``s`` (see :func:`slot_w13`).

    Returns a view: no device work, no host sync."""
    if s < w2.shape[0]:
        return w2[s]
    assert shared is not None
    inter = w2.shape[2]
    lo = (s - w2.shape[0]) * inter
    return shared.w2[:, lo:lo + inter]


def reference_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    shared: FusedShared | None = None,
) -> torch.Tensor:
    """Pure-torch ``sum_j w[t,j] * (silu(x W_gate^T) * (x W_up^T)) W_2^T``.

    Shapes as :meth:`Backend.run_experts` (``shared``: the fused shared slots). Accumulates
    in fp32 (fp64 for fp64 inputs) and returns ``x.dtype``. Host sync: yes (``nonzero`` per
    slot).
    """
    m, h = x.shape
    num_slots, two_i, _ = w13.shape
    inter = two_i // 2
    acc_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    out = torch.zeros(m, h, dtype=acc_dtype, device=x.device)
    if m == 0:
        return out.to(x.dtype)
    ids = topk_ids.to(torch.int64)
    total = num_slots + (0 if shared is None else shared.num_slots)
    for s in range(total):
        hit = ids == s  # [M, K]
        rows = hit.any(dim=1).nonzero().squeeze(1)  # NOTE: host sync
        if rows.numel() == 0:
            continue
        w = (topk_weights.to(acc_dtype) * hit.to(acc_dtype)).sum(dim=1)[rows]  # [R]
        xs = x[rows]
        w13_s, w2_s = slot_w13(s, w13, shared), slot_w2(s, w2, shared)
        gate_up = xs @ w13_s.to(x.dtype).t()
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = act @ w2_s.to(x.dtype).t()
        out.index_add_(0, rows, y.to(acc_dtype) * w[:, None])
    return out.to(x.dtype)


class ReferenceExperts(Backend):
    """The oracle backend: any device, any float dtype, non-divisible EP, FP8 block-scaled
    experts (the CPU path of a quantized layer)."""

    name: ClassVar[str] = "reference"
    supports_non_divisible_ep: ClassVar[bool] = True
    supports_fused_shared: ClassVar[bool] = True
    supports_fp8_block: ClassVar[bool] = True

    @classmethod
    def can_implement(cls, problem: Problem, deployment: Deployment, env: Env) -> Eligibility:
        """Eligibility of the reference backend for ``problem``: SiLU-GLU activations only.

        Pure; host only."""
        if problem.activation != Activation.SILU_GLU:
            return Eligibility.no(RejectReason.ACTIVATION, f"{problem.activation} unsupported")
        return Eligibility.yes()

    def run_experts(self, x, w13, w2, topk_weights, topk_ids, shared=None, *,
                    quant: ExpertQuant | None = None):
        """See :meth:`Backend.run_experts`. With ``quant``: :func:`moerun.quant.
        reference_fp8_moe` on the already quantized rows, output in ``quant.out_dtype``.
        Host sync: yes (``nonzero`` per slot)."""
        if quant is None:
            return reference_moe(x, w13, w2, topk_weights, topk_ids, shared)
        if shared is not None:
            raise ValueError("run_experts(quant=..., shared=...): the shared expert is not "
                             "FP8 (dequantized at load); it cannot ride in the fp8 slots")
        if not isinstance(x, QuantizedRows):
            raise TypeError(f"run_experts(quant=...) takes x as moerun.quant.QuantizedRows "
                            f"(quantize with backend.quantize_rows), got {type(x).__name__}")
        return reference_fp8_moe(x, w13, quant.w13_scale, w2, quant.w2_scale, topk_weights,
                                 topk_ids, quant.config, out_dtype=quant.out_dtype)
