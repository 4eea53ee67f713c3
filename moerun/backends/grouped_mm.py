"""``GroupedMMExperts``: expert compute on ``torch._grouped_mm`` (DESIGN 6).

Legend: ``M`` rows given to the backend, ``K`` top-k, ``P = M * K`` (token, j) pairs, ``H``
hidden, ``I`` intermediate, ``S`` local slots.

``torch._grouped_mm(a [P, Kd], b [S, Kd, N], offs [S] int32) -> [P, N]`` multiplies the rows
``[offs[s-1], offs[s])`` of ``a`` by ``b[s]``; rows at and past ``offs[-1]`` are neither read nor
written (they hold whatever the allocator left there, NaN included), so this module never lets
them reach the output.

Pipeline of :meth:`GroupedMMExperts.run_experts` (eager launches in brackets, about 20):

1. ``key_P = ids.masked_fill(ids < 0, S)``; a stable sort of ``key_P`` groups the pairs by slot with
   the ``-1`` pairs last, in token order inside each slot [2-3].
2. ``counts_S1`` by ``scatter_add_`` of ones into ``S + 1`` bins, ``offs_S`` = int32 ``cumsum``
   of the first ``S`` bins [3]: built on the device, no host round trip.
3. ``x_PH = x[token_P]`` in slot order (the ``-1`` pairs gather a real row: finite, unused) [2].
4. ``gate_up_P2I = _grouped_mm(x_PH, w13.transpose(1, 2) [S, H, 2I], offs)`` [1].
5. ``act_PI = silu(gate) * up`` [2].
6. ``y_PH = _grouped_mm(act_PI, w2.transpose(1, 2) [S, I, H], offs)`` [1].
7. ``acc_(M+1)H`` fp32 zeros; ``acc.index_add_(0, dest_P, y * w_P[:, None])`` (the product
   promotes to fp32 in one kernel), ``dest_P`` the token of a local pair and the spare row
   ``M`` for a ``-1`` pair: the unwritten rows past ``offs[-1]`` only ever land in the spare
   row, which is dropped [4].
8. ``out = acc[:M].to(x.dtype)`` [1].

Host syncs: none (every branch depends on shapes only). CUDA-graph safe: yes, on the bf16
sm90/sm100 path (``can_implement`` rejects the others, whose kernels copy ``offs`` to the host).
The summation order of step 7 on CUDA follows atomics, so bitwise results can differ between
runs (set ``torch.use_deterministic_algorithms(True)`` for a deterministic ``index_add_``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from moerun.backends.base import Backend
from moerun.capability import Deployment, Eligibility, Problem, RejectReason
from moerun.config import Activation
from moerun.env import Env

__all__ = ["GroupedMMExperts", "SlotOrder", "grouped_mm_experts", "slot_offsets"]

# NOTE: CUTLASS (and the CPU kernel's checks) need every row stride 16-byte aligned.
_STRIDE_ALIGN_BYTES = 16
_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # seen working on torch 2.13 CPU
# NOTE: on CUDA only bf16 on sm90/sm100 takes the CUTLASS grouped kernel; every other
# dtype/arch falls back to a per-group loop that copies ``offs`` to the host (a sync per call,
# not capturable, and slow), so it is rejected rather than run silently.
_CUDA_DTYPES = (torch.bfloat16,)
_CUDA_MAJORS = (9, 10)


@dataclass(frozen=True, kw_only=True, slots=True)
class SlotOrder:
    """The (token, j) pairs sorted by slot, with the group offsets ``torch._grouped_mm`` reads.

    Fields:
        order: ``[P]`` int64 indices into the flattened pairs, sorted by slot with ``-1``
            pairs last (stable: token order inside a slot).
        sorted_key: ``[P]`` the slot of each sorted pair (``S`` for a ``-1`` pair).
        offsets: ``[S]`` int32 cumulative end offsets; ``offsets[-1]`` = number of local pairs.
    """

    order: torch.Tensor
    sorted_key: torch.Tensor
    offsets: torch.Tensor


def slot_offsets(topk_ids: torch.Tensor, num_slots: int) -> SlotOrder:
    """Sort the (token, j) pairs by slot and build the int32 group offsets, on the device.

    Args:
        topk_ids: ``[M, K]`` integer slot ids in ``[0, S)`` or ``-1``.
        num_slots: ``S``.

    Returns:
        a :class:`SlotOrder` over the ``P = M*K`` pairs. No host sync; capture-safe.
    """
    key_p = topk_ids.reshape(-1)
    key_p = key_p.masked_fill(key_p < 0, num_slots)
    sorted_key_p, order_p = torch.sort(key_p, stable=True)
    counts = torch.zeros(num_slots + 1, dtype=torch.int32, device=topk_ids.device)
    counts.scatter_add_(0, key_p.to(torch.int64), torch.ones_like(key_p, dtype=torch.int32))
    offs_s = torch.cumsum(counts[:num_slots], dim=0, dtype=torch.int32)
    return SlotOrder(order=order_p, sorted_key=sorted_key_p, offsets=offs_s)


def _check_strides(w13: torch.Tensor, w2: torch.Tensor) -> None:
    """ValueError naming a weight whose last dim is not contiguous or whose other strides are
    not multiples of 16 bytes. NOTE: not an assert: reachable from
    ``fused_experts(check_inputs=False)``, and asserts vanish under ``python -O``."""
    for name, w in (("w13", w13), ("w2", w2)):
        elt = w.element_size()
        if w.stride(-1) != 1 or any((w.stride(d) * elt) % _STRIDE_ALIGN_BYTES
                                    for d in range(w.dim() - 1) if w.shape[d] > 1):
            raise ValueError(f"{name} has strides {tuple(w.stride())} for shape "
                             f"{tuple(w.shape)}: GroupedMMExperts needs a contiguous last "
                             f"dimension and every other stride a multiple of "
                             f"{_STRIDE_ALIGN_BYTES} bytes; pass {name}.contiguous()")


def grouped_mm_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """``out[t] = sum_j w[t, j] * expert_{ids[t, j]}(x[t])`` through two grouped GEMMs.

    Args:
        x: ``[M, H]`` fp32/fp16/bf16 activations.
        w13: ``[S, 2I, H]`` gate rows then up rows, last dim contiguous, other strides
            multiples of 16 bytes (else ValueError).
        w2: ``[S, H, I]``, the same layout rule.
        topk_weights: ``[M, K]`` (fp32; other float dtypes are upcast).
        topk_ids: ``[M, K]`` integer local slot ids in ``[0, S)`` or ``-1`` (skipped).

    Returns:
        ``[M, H]`` in ``x.dtype``; rows without a local pair are exactly zero. Runs on the
        current stream; no host sync; CUDA-graph safe; the fp32 accumulator costs ``4*(M+1)*H``
        bytes plus ``4*P*H`` for the weighted rows.
    """
    m, h = x.shape
    num_slots, two_i, _ = w13.shape
    inter = two_i // 2
    if m == 0 or topk_ids.numel() == 0:
        return torch.zeros(m, h, dtype=x.dtype, device=x.device)
    if not (w13.is_contiguous() and w2.is_contiguous()):  # contiguous: aligned (can_implement)
        _check_strides(w13, w2)
    k = topk_ids.shape[1]

    slots = slot_offsets(topk_ids, num_slots)
    order_p, sorted_key_p, offs_s = slots.order, slots.sorted_key, slots.offsets
    token_p = torch.div(order_p, k, rounding_mode="floor")
    weight_p = topk_weights.reshape(-1).to(torch.float32)[order_p]
    # A -1 pair (sorted past offs[-1]) sends its unwritten row to the spare accumulator row M.
    dest_p = token_p.masked_fill(sorted_key_p == num_slots, m)

    x_ph = x.index_select(0, token_p)
    gate_up = torch._grouped_mm(x_ph, w13.transpose(1, 2), offs=offs_s)  # [P, 2I]
    act_pi = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    y_ph = torch._grouped_mm(act_pi, w2.transpose(1, 2), offs=offs_s)  # [P, H]

    acc = torch.zeros(m + 1, h, dtype=torch.float32, device=x.device)
    # bf16/fp16 * fp32 promotes: one kernel upcasts and weights each row in fp32.
    acc.index_add_(0, dest_p, y_ph * weight_p[:, None])
    return acc[:m].to(x.dtype)


class GroupedMMExperts(Backend):
    """Sorted-pair expert compute on ``torch._grouped_mm`` (CPU, and bf16 on Hopper/Blackwell).

    Declarations: ``name = "grouped_mm"``; any split of slots over ranks is fine (it only sees
    its local ``S``), so ``supports_non_divisible_ep = True``. Stateless.
    """

    name: ClassVar[str] = "grouped_mm"
    supports_non_divisible_ep: ClassVar[bool] = True

    @classmethod
    def can_implement(cls, problem: Problem, deployment: Deployment, env: Env) -> Eligibility:
        """Pure: reads ``problem`` and the probed ``env`` only.

        Rejections: ``ACTIVATION`` (not silu-GLU), ``PACKAGE_MISSING`` (no ``torch._grouped_mm``),
        ``DEVICE`` (device type other than cpu/cuda, or a CUDA arch without the grouped kernel),
        ``DTYPE`` (CPU: not fp32/fp16/bf16; CUDA: not bf16), ``SHAPE`` (``H`` or ``I`` row
        stride not a multiple of 16 bytes).
        """
        if problem.activation != Activation.SILU_GLU:
            return Eligibility.no(RejectReason.ACTIVATION, f"{problem.activation} unsupported")
        if not env.has_grouped_mm:
            return Eligibility.no(
                RejectReason.PACKAGE_MISSING,
                f"torch {env.torch_version} has no torch._grouped_mm; install torch>=2.9")
        if problem.device_type == "cpu":
            if problem.dtype not in _CPU_DTYPES:
                return Eligibility.no(RejectReason.DTYPE,
                                      f"{problem.dtype} on CPU; torch._grouped_mm takes "
                                      "float32, float16 or bfloat16")
        elif problem.device_type == "cuda":
            cap = env.device_capability
            if cap is None or cap[0] not in _CUDA_MAJORS:
                return Eligibility.no(RejectReason.DEVICE,
                                      f"compute capability {cap}: the grouped kernel needs "
                                      "sm90 or sm100")
            if problem.dtype not in _CUDA_DTYPES:
                return Eligibility.no(RejectReason.DTYPE,
                                      f"{problem.dtype} on CUDA: only bfloat16 has the grouped "
                                      "kernel; other dtypes copy offsets to the host per call")
        else:
            return Eligibility.no(RejectReason.DEVICE,
                                  f"device type {problem.device_type!r} unsupported")
        elt = torch.empty((), dtype=problem.dtype).element_size()
        for field, size in (("hidden_size", problem.hidden_size),
                            ("intermediate_size", problem.intermediate_size)):
            if (size * elt) % _STRIDE_ALIGN_BYTES:
                return Eligibility.no(
                    RejectReason.SHAPE,
                    f"{field}={size}: its row stride {size * elt} B in {problem.dtype} is not a "
                    f"multiple of {_STRIDE_ALIGN_BYTES} B")
        return Eligibility.yes()

    def run_experts(self, x, w13, w2, topk_weights, topk_ids, shared=None, *, quant=None):
        """See :func:`grouped_mm_experts` (no host sync; CUDA-graph safe). ``shared`` and
        ``quant`` are not supported (``supports_fused_shared`` and ``supports_fp8_block``
        are False)."""
        if quant is not None:
            raise ValueError("GroupedMMExperts has no FP8 block-scaled path "
                             "(supports_fp8_block=False); use backend='reference'")
        if shared is not None:
            raise ValueError("GroupedMMExperts does not fuse the shared expert; use another "
                             "shared_expert_order")
        return grouped_mm_experts(x, w13, w2, topk_weights, topk_ids)

    def workspace_bytes(self, problem: Problem, rows: int) -> int:
        """Peak temporaries for ``rows`` rows: per pair the gathered row, gate/up, activation,
        expert output (``x.dtype``) and its fp32 weighted copy; the fp32 accumulator; indices.
        Pure; host only."""
        elt = torch.empty((), dtype=problem.dtype).element_size()
        k, h, i = problem.top_k, problem.hidden_size, problem.intermediate_size
        pairs = rows * k
        per_pair = (h + 2 * i + i + h) * elt + h * 4 + 4 * 8
        return pairs * per_pair + (rows + 1) * h * 4 + (problem.num_slots + 1) * 8
