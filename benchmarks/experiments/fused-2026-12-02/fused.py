"""EXPERIMENT (not shipped; README.md here): a one-launch decode path for TritonExperts
(``ExpertsConfig.kernel == "fused"`` in ``integration.diff``):
gate/up, ``silu * up``, the routing weight, the down GEMM and the top-k sum in ONE kernel.

Legend as ``gate_up.py``: ``M`` tokens (at most ``DIRECT_MAX_TOKENS``), ``K`` top-k, ``H``
hidden, ``I`` intermediate, ``S`` slots, ``P = M*K`` pairs; ``BN`` the intermediate slice of a
program (``GateUpConfig.block_n``), ``BK`` its gate/up K step (``GateUpConfig.block_k``),
``BH`` its down chunk of ``H`` (``DownConfig.block_n``).

Program ``(n, p)`` owns pair ``p`` (token ``t = p // K``, slot ``e = topk_ids.flat[p]``) and
the intermediate columns ``[n*BN, (n+1)*BN)``:

1. gate/up over ``H`` in ``BK`` steps (row 0 of a 16-row tile, as the direct kernels):
   ``a = w_p * silu(x[t] @ W_gate[e, slice]^T) * (x[t] @ W_up[e, slice]^T)``, rounded to
   x.dtype (the two-launch path stores that rounding in ``act``);
2. its share of the down product, ``a @ w2[e, :, slice]^T`` (an ``[H]`` partial over the
   slice), in ``BH``-row chunks, added (fp32, relaxed atomics) into the token's row of the
   scratch ``part [M_max, H]``;
3. a ticket on the token's arrival counter; the program that arrives last (``K * ceil(I/BN)``
   arrivals, excluded pairs' programs too, with nothing added) writes ``out[t] = part[t]`` in
   x.dtype and puts the row and the counter back to zero.

No program waits for another, so there is no co-residency requirement and no deadlock; the
only cross-program traffic is the fp32 adds (``P * ceil(I/BN) * H``) and the ticket.

**The scratch is zero between calls** (:class:`FusedScratch`): allocated zeroed, every call
leaves it zero (step 3). That is what lets the path be one launch (no memset, no zeroing
launch). The calls that share one scratch must be ordered (one stream, or joined by events):
:func:`scratch_for` keeps one per (device, stream, H), so two micro-batches on two streams
never share one, while the layers of one stream do. A call with ``M`` rows uses rows
``[0, M)``. Under CUDA-graph capture the first call on the capture stream allocates that
stream's scratch, so its zeroing is one memset node of the graph (run once per replay, ahead
of the graph's first fused call; harmless, the scratch is zero then anyway).

Summation order: the fp32 adds arrive in any order, so the result may differ from run to run
in the last bits of the fp32 sum (bf16 output: usually identical); the two-launch path with
``combine="atomic"`` already has that property at prefill, this form has it at decode.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moerun._triton.compat import patch_interpreter
from moerun._triton.gdc import pdl_prologue
from moerun._triton.launch import FastLauncher, cdiv
from moerun.backends.triton.config_types import DownConfig, GateUpConfig
from moerun.backends.triton.gate_up import DIRECT_BLOCK_M, dot_precision

patch_interpreter()

__all__ = ["FusedScratch", "fused_direct", "fused_direct_torch", "scratch_for"]


# ---------------------------------------------------------------- kernel
@triton.jit
def _fused_direct_kernel(
    x_ptr,  # [M, H]
    w13_ptr,  # [S, 2I, H]
    w2_ptr,  # [S, H, I]
    out_ptr,  # [M, H] x.dtype
    part_ptr,  # [M_max, H] fp32 scratch, zero on entry and on exit
    cnt_ptr,  # [M_max] int32 arrival counters, zero on entry and on exit
    topk_ids_ptr,  # [M*K] int32
    topk_weights_ptr,  # [M*K] fp32
    inter, hidden, num_slots,
    stride_xm, stride_we, stride_wn, stride_w2e, stride_w2n, stride_om,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr, DOWN_STAGES: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_I: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    pid_n = tl.program_id(0)
    pair = tl.program_id(1).to(tl.int64)
    tok = pair // TOP_K
    e = tl.load(topk_ids_ptr + pair)
    rows = tl.arange(0, BLOCK_M)
    row0 = rows == 0
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < inter
    offs_nw = (offs_n % inter).to(tl.int64)  # columns past I read valid rows, add zeros
    offs_h = tl.arange(0, BLOCK_H)
    if (e >= 0) & (e < num_slots):
        ew = e.to(tl.int64)
        # 1. gate/up for the slice, row 0 of the tile
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = x_ptr + tok * stride_xm + offs_k[None, :] + rows[:, None] * 0
        g_ptrs = w13_ptr + ew * stride_we + offs_nw[None, :] * stride_wn + offs_k[:, None]
        u_ptrs = g_ptrs + inter * stride_wn
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, tl.cdiv(hidden, BLOCK_K)):
            if EVEN_K:
                a = tl.load(a_ptrs, mask=row0[:, None], other=0.0)
                g = tl.load(g_ptrs)
                u = tl.load(u_ptrs)
            else:
                k_ok = offs_k < hidden - k * BLOCK_K
                a = tl.load(a_ptrs, mask=row0[:, None] & k_ok[None, :], other=0.0)
                g = tl.load(g_ptrs, mask=k_ok[:, None], other=0.0)
                u = tl.load(u_ptrs, mask=k_ok[:, None], other=0.0)
            acc_g = tl.dot(a, g, acc_g, input_precision=PRECISION)
            acc_u = tl.dot(a, u, acc_u, input_precision=PRECISION)
            a_ptrs += BLOCK_K
            g_ptrs += BLOCK_K
            u_ptrs += BLOCK_K
        act = acc_g * tl.sigmoid(acc_g) * acc_u * tl.load(topk_weights_ptr + pair)
        keep = row0[:, None] & n_ok[None, :]  # row 0, columns inside I
        act = tl.where(keep, act, 0.0).to(x_ptr.dtype.element_ty)
        # 2. the slice's share of the down product, BH rows of H at a time
        b_ptrs = w2_ptr + ew * stride_w2e + offs_h[None, :].to(tl.int64) * stride_w2n \
            + offs_nw[:, None]
        for h0 in tl.range(0, hidden, BLOCK_H, num_stages=DOWN_STAGES):
            h_ok = offs_h < hidden - h0
            if EVEN_I:
                b = tl.load(b_ptrs, mask=h_ok[None, :], other=0.0)
            else:
                b = tl.load(b_ptrs, mask=n_ok[:, None] & h_ok[None, :], other=0.0)
            y = tl.dot(act, b, input_precision=PRECISION)  # [BM, BH], row 0 live
            tl.atomic_add(part_ptr + tok * hidden + h0 + offs_h, tl.sum(y, axis=0),
                          mask=h_ok, sem="relaxed")
            b_ptrs += BLOCK_H * stride_w2n
    # 3. every thread's adds issued before the ticket (release); the last arrival reads all
    tl.debug_barrier()
    arrivals = TOP_K * tl.num_programs(0)
    ticket = tl.atomic_add(cnt_ptr + tok, 1, sem="acq_rel")
    if ticket == arrivals - 1:
        tl.debug_barrier()
        for h0 in range(0, hidden, BLOCK_H):
            h_ok = offs_h < hidden - h0
            p_ptrs = part_ptr + tok * hidden + h0 + offs_h
            v = tl.load(p_ptrs, mask=h_ok, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + tok * stride_om + h0 + offs_h,
                     v.to(out_ptr.dtype.element_ty), mask=h_ok)
            tl.store(p_ptrs, tl.zeros([BLOCK_H], dtype=tl.float32), mask=h_ok)
        tl.store(cnt_ptr + tok, 0)


_LAUNCH = FastLauncher(_fused_direct_kernel)


# ---------------------------------------------------------------- scratch
class FusedScratch:
    """The zero-between-calls scratch of :func:`fused_direct`: ``part [rows, H]`` fp32 and
    ``cnt [rows]`` int32, allocated zeroed (one memset, at construction, host side) and left
    zero by every call. Calls sharing one must be stream-ordered (module docstring).

    Args:
        rows: the most tokens a call may have. hidden: ``H``. device: where it lives.
    """

    __slots__ = ("part", "cnt")

    def __init__(self, rows: int, hidden: int, device: torch.device | str) -> None:
        if rows <= 0 or hidden <= 0:
            raise ValueError(f"FusedScratch: rows={rows} and hidden={hidden} must be positive")
        self.part = torch.zeros(rows, hidden, dtype=torch.float32, device=device)
        self.cnt = torch.zeros(rows, dtype=torch.int32, device=device)

    @property
    def rows(self) -> int:
        """The most tokens one call may have."""
        return self.part.shape[0]

    @property
    def hidden(self) -> int:
        """``H`` of the calls it serves."""
        return self.part.shape[1]


def check_fused_tiles(gate_up: GateUpConfig, down: DownConfig) -> None:
    """ValueError unless the tiles form a fused config: the down K step is the gate/up slice
    (``down.block_k == gate_up.block_n``), one warp count, ``split_k == 1``, every tile
    dimension at least 16. (In ``integration.diff`` this lived in ``config_types.py``.)"""
    if down.block_k != gate_up.block_n:
        raise ValueError(f"fused needs down.block_k == gate_up.block_n: got {down.block_k} "
                         f"and {gate_up.block_n}")
    if down.num_warps != gate_up.num_warps:
        raise ValueError(f"fused is one kernel: down.num_warps={down.num_warps} must equal "
                         f"gate_up.num_warps={gate_up.num_warps}")
    if down.split_k != 1:
        raise ValueError(f"fused has no split-K: down.split_k={down.split_k}, use 1")
    if min(gate_up.block_n, gate_up.block_k, down.block_n) < 16:
        raise ValueError("fused tiles need block_n and block_k >= 16")


_SCRATCH: dict[tuple, FusedScratch] = {}


def scratch_for(x: torch.Tensor, rows: int) -> FusedScratch:
    """The scratch of calls on ``x``'s device and the current stream with ``x.shape[1]``
    columns, at least ``rows`` rows (allocated zeroed at the first request, replaced by a
    larger one when ``rows`` grows: the old one is zero, so dropping it is safe). Host only,
    except the allocation (one memset on the current stream; captured when capturing)."""
    stream = torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else 0
    key = (str(x.device), stream, x.shape[1])
    sc = _SCRATCH.get(key)
    if sc is None or sc.rows < rows:
        sc = _SCRATCH[key] = FusedScratch(rows, x.shape[1], x.device)
    return sc


# ---------------------------------------------------------------- launcher
def fused_direct(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor, gate_up: GateUpConfig, down: DownConfig,
                 scratch: FusedScratch, out: torch.Tensor | None = None) -> torch.Tensor:
    """``out[t] = sum_j w_tj * (silu(x[t] @ Wg[e]^T) * (x[t] @ Wu[e]^T)) @ w2[e]^T`` with
    ``e = topk_ids[t, j]`` over token ``t``'s local pairs, in one launch (module docstring).

    Args:
        x: ``[M, H]`` fp32/fp16/bf16, last dim contiguous; ``M <= scratch.rows``.
        w13: ``[S, 2I, H]``, w2: ``[S, H, I]``, x.dtype, last dims contiguous.
        topk_ids: ``[M, K]`` int32 contiguous (``-1`` / ``>= S``: excluded).
        topk_weights: ``[M, K]`` fp32 contiguous.
        gate_up, down: the tiles (:func:`check_fused_tiles`).
        scratch: zero on entry, left zero; ``hidden == H``; on x's device.
        out: optional ``[M, H]`` x.dtype buffer.

    Returns: ``out [M, H]`` x.dtype (zeros for a token with no local pair). One launch;
    current stream; no host sync; capture-safe (the scratch must outlive the graph).
    """
    check_fused_tiles(gate_up, down)
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [M, H] with a contiguous last dim, got {tuple(x.shape)}")
    m, h = x.shape
    if w13.dim() != 3 or w13.shape[2] != h or w13.shape[1] % 2 or w13.dtype != x.dtype \
            or w13.stride(2) != 1:
        raise ValueError(f"w13 {tuple(w13.shape)} {w13.dtype} does not match x "
                         f"{tuple(x.shape)} {x.dtype}: expected [S, 2*I, {h}], last dim "
                         "contiguous")
    s, two_i, _ = w13.shape
    inter = two_i // 2
    if w2.shape != (s, h, inter) or w2.dtype != x.dtype or w2.stride(2) != 1:
        raise ValueError(f"w2 {tuple(w2.shape)} {w2.dtype} must be [{s}, {h}, {inter}] "
                         f"{x.dtype}, last dim contiguous")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != m or topk_ids.dtype != torch.int32 \
            or not topk_ids.is_contiguous():
        raise ValueError(f"topk_ids must be a contiguous int32 [{m}, K] tensor")
    if topk_weights.shape != topk_ids.shape or topk_weights.dtype != torch.float32 or \
            not topk_weights.is_contiguous():
        raise ValueError(f"topk_weights must be a contiguous fp32 {tuple(topk_ids.shape)} "
                         "tensor")
    if m > scratch.rows or scratch.hidden != h or scratch.part.device != x.device:
        raise ValueError(f"scratch ({scratch.rows} rows x {scratch.hidden} on "
                         f"{scratch.part.device}) does not serve x {tuple(x.shape)} on "
                         f"{x.device}: build a FusedScratch(rows>={m}, hidden={h})")
    if out is None:
        out = torch.empty(m, h, dtype=x.dtype, device=x.device)
    elif out.shape != (m, h) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {h}] {x.dtype}")
    if m == 0:
        return out
    k = topk_ids.shape[1]
    _LAUNCH(
        (cdiv(inter, gate_up.block_n), m * k),
        x, w13, w2, out, scratch.part, scratch.cnt, topk_ids, topk_weights,
        inter, h, s,
        x.stride(0), w13.stride(0), w13.stride(1), w2.stride(0), w2.stride(1), out.stride(0),
        k, DIRECT_BLOCK_M, gate_up.block_n, gate_up.block_k, down.block_n, down.num_stages,
        h % gate_up.block_k == 0, inter % gate_up.block_n == 0, dot_precision(x.dtype),
        num_warps=gate_up.num_warps, num_stages=gate_up.num_stages,
    )
    return out


# ---------------------------------------------------------------- torch twin
def fused_direct_torch(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                       topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """Pure-torch twin of :func:`fused_direct`: the two-launch path's twins composed (fp32
    math, the weighted intermediate rounded to x.dtype between them, as the kernel does)."""
    from moerun.backends.triton.down import down_direct_torch
    from moerun.backends.triton.gate_up import gate_up_direct_torch

    return down_direct_torch(gate_up_direct_torch(x, w13, topk_ids, topk_weights), w2,
                             topk_ids)
