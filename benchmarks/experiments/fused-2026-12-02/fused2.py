"""EXPERIMENT (README.md here), second form: the two decode kernels of the shipped
``kernel="direct"`` path (gate/up, then the per-pair down with the K-th-arrival sum) as the
two ROLES of one launch, ordered by counters instead of a kernel boundary.

Every program first takes a ticket (an atomic counter): tickets ``[0, G)`` are gate/up
programs (pair ``p``, intermediate slice ``n``: the direct gate/up tile, ``act[p, slice]``
stored in x.dtype, then one arrival on ``ready[p]``), tickets ``[G, G + D)`` down programs
(pair ``p``, H tile ``n``: its first weight tile loaded, then a wait until ``ready[p]``
counts every slice, then the per-pair down product, its fp32 partial stored, a ticket on
``(t, n)``; the K-th arrival sums the token's K partials in pair order and writes
``out[t, n-tile]``). A program gets its ticket only once it runs, so every gate/up program
has started before any down program waits: no deadlock, whatever the residency (the
decoupled look-back argument). The last program to finish puts the counters back to zero
(the scratch is zero between calls, as in ``fused.py``).
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

__all__ = ["Fused2Scratch", "fused2_direct"]


@triton.jit
def _fused2_kernel(
    x_ptr,  # [M, H]
    w13_ptr,  # [S, 2I, H]
    w2_ptr,  # [S, H, I]
    act_ptr,  # [P, I] x.dtype, written by the gate/up role
    part_ptr,  # [P, H] fp32, each pair's partial
    out_ptr,  # [M, H] x.dtype
    ctl_ptr,  # int32 [2 + P_max + M_max * T_max] zero on entry and exit: ticket, done,
    #           ready[p], arrivals[t, n]
    topk_ids_ptr, topk_weights_ptr,  # [P] int32, [P] fp32
    inter, hidden, num_slots, num_pairs, p_max,
    stride_xm, stride_we, stride_wn, stride_w2e, stride_w2n,
    TOP_K: tl.constexpr, K_P2: tl.constexpr, BLOCK_M: tl.constexpr,
    GU_N: tl.constexpr, GU_K: tl.constexpr, GU_STAGES: tl.constexpr,
    DN_N: tl.constexpr, DN_K: tl.constexpr, DN_STAGES: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    ticket = tl.atomic_add(ctl_ptr, 1, sem="relaxed")
    n_slices = tl.cdiv(inter, GU_N)
    n_tiles = tl.cdiv(hidden, DN_N)
    n_gu = num_pairs * n_slices
    rows = tl.arange(0, BLOCK_M)
    row0 = rows == 0
    ready_ptr = ctl_ptr + 2
    arr_ptr = ctl_ptr + 2 + p_max
    if ticket < n_gu:  # ---- the gate/up role
        pair = (ticket // n_slices).to(tl.int64)
        pid_n = ticket % n_slices
        e = tl.load(topk_ids_ptr + pair)
        if (e >= 0) & (e < num_slots):
            offs_n = pid_n * GU_N + tl.arange(0, GU_N)
            offs_nw = (offs_n % inter).to(tl.int64)
            offs_k = tl.arange(0, GU_K)
            tok = pair // TOP_K
            a_ptrs = x_ptr + tok * stride_xm + offs_k[None, :] + rows[:, None] * 0
            g_ptrs = w13_ptr + e.to(tl.int64) * stride_we + offs_nw[None, :] * stride_wn \
                + offs_k[:, None]
            u_ptrs = g_ptrs + inter * stride_wn
            acc_g = tl.zeros([BLOCK_M, GU_N], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_M, GU_N], dtype=tl.float32)
            for k in tl.range(0, tl.cdiv(hidden, GU_K), num_stages=GU_STAGES):
                k_ok = offs_k < hidden - k * GU_K
                a = tl.load(a_ptrs, mask=row0[:, None] & k_ok[None, :], other=0.0)
                g = tl.load(g_ptrs, mask=k_ok[:, None], other=0.0)
                u = tl.load(u_ptrs, mask=k_ok[:, None], other=0.0)
                acc_g = tl.dot(a, g, acc_g, input_precision=PRECISION)
                acc_u = tl.dot(a, u, acc_u, input_precision=PRECISION)
                a_ptrs += GU_K
                g_ptrs += GU_K
                u_ptrs += GU_K
            act = acc_g * tl.sigmoid(acc_g) * acc_u * tl.load(topk_weights_ptr + pair)
            tl.store(act_ptr + pair * inter + offs_n[None, :] + rows[:, None] * 0,
                     act.to(act_ptr.dtype.element_ty),
                     mask=row0[:, None] & (offs_n < inter)[None, :])
        tl.debug_barrier()  # every thread's stores issued before the arrival (release)
        tl.atomic_add(ready_ptr + pair, 1, sem="release")
    else:  # ---- the down role: pair, H tile
        d = ticket - n_gu
        pair = (d // n_tiles).to(tl.int64)
        pid_n = d % n_tiles
        tok = pair // TOP_K
        e = tl.load(topk_ids_ptr + pair)
        ok = (e >= 0) & (e < num_slots)
        offs_n = pid_n * DN_N + tl.arange(0, DN_N)
        n_ok = offs_n < hidden
        offs_nw = (offs_n % hidden).to(tl.int64)
        offs_k = tl.arange(0, DN_K)
        b_ptrs = w2_ptr + tl.where(ok, e, 0).to(tl.int64) * stride_w2e \
            + offs_nw[None, :] * stride_w2n + offs_k[:, None]
        acc = tl.zeros([BLOCK_M, DN_N], dtype=tl.float32)
        if ok:
            # wait for the pair's slices (acquire), then read its act row from L2
            while tl.atomic_add(ready_ptr + pair, 0, sem="acquire") < n_slices:
                pass
            tl.debug_barrier()
            a_ptrs = act_ptr + pair * inter + offs_k[None, :] + rows[:, None] * 0
            for k in tl.range(0, tl.cdiv(inter, DN_K), num_stages=DN_STAGES):
                k_ok = offs_k < inter - k * DN_K
                a = tl.load(a_ptrs, mask=row0[:, None] & k_ok[None, :], other=0.0,
                            cache_modifier=".cg")
                b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
                acc = tl.dot(a, b, acc, input_precision=PRECISION)
                a_ptrs += DN_K
                b_ptrs += DN_K
        tl.store(part_ptr + pair * hidden + offs_n, tl.sum(acc, axis=0), mask=n_ok)
        tl.debug_barrier()
        arrival = tl.atomic_add(arr_ptr + tok * n_tiles + pid_n, 1, sem="acq_rel")
        if arrival == TOP_K - 1:
            tl.debug_barrier()
            offs_j = tl.arange(0, K_P2)
            parts = tl.load(part_ptr + (tok * TOP_K + offs_j)[:, None] * hidden
                            + offs_n[None, :],
                            mask=(offs_j < TOP_K)[:, None] & n_ok[None, :], other=0.0,
                            cache_modifier=".cg")
            tl.store(out_ptr + tok * hidden + offs_n,
                     tl.sum(parts, axis=0).to(out_ptr.dtype.element_ty), mask=n_ok)
    # the last program to finish puts every counter back to zero
    tl.debug_barrier()
    total = n_gu + num_pairs * n_tiles
    if tl.atomic_add(ctl_ptr + 1, 1, sem="acq_rel") == total - 1:
        for i in range(0, num_pairs):
            tl.store(ready_ptr + i, 0)
        for i in range(0, (num_pairs // TOP_K) * n_tiles):
            tl.store(arr_ptr + i, 0)
        tl.store(ctl_ptr + 1, 0)
        tl.store(ctl_ptr, 0)


_LAUNCH = FastLauncher(_fused2_kernel)


class Fused2Scratch:
    """The zero-between-calls counters of :func:`fused2_direct` for calls of at most
    ``rows`` tokens, ``top_k`` pairs each and at most ``tiles`` H tiles."""

    def __init__(self, rows: int, top_k: int, tiles: int, device) -> None:
        self.p_max = rows * top_k
        self.rows, self.tiles = rows, tiles
        self.ctl = torch.zeros(2 + self.p_max + rows * tiles, dtype=torch.int32, device=device)


def fused2_direct(x, w13, w2, topk_ids, topk_weights, gate_up: GateUpConfig, down: DownConfig,
                  scratch: Fused2Scratch) -> torch.Tensor:
    """``out [M, H]`` x.dtype, as the direct path with ``combine="atomic"``; one launch."""
    m, h = x.shape
    s, two_i, _ = w13.shape
    inter = two_i // 2
    k = topk_ids.shape[1]
    pairs = m * k
    n_tiles = cdiv(h, down.block_n)
    if pairs > scratch.p_max or n_tiles > scratch.tiles or m > scratch.rows:
        raise ValueError("scratch too small for this call")
    act = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    part = torch.empty(pairs, h, dtype=torch.float32, device=x.device)
    out = torch.empty(m, h, dtype=x.dtype, device=x.device)
    grid = pairs * cdiv(inter, gate_up.block_n) + pairs * n_tiles
    _LAUNCH(
        (grid,),
        x, w13, w2, act, part, out, scratch.ctl, topk_ids, topk_weights,
        inter, h, s, pairs, scratch.p_max,
        x.stride(0), w13.stride(0), w13.stride(1), w2.stride(0), w2.stride(1),
        k, max(2, triton.next_power_of_2(k)), DIRECT_BLOCK_M,
        gate_up.block_n, gate_up.block_k, gate_up.num_stages,
        down.block_n, down.block_k, down.num_stages, dot_precision(x.dtype),
        num_warps=gate_up.num_warps, num_stages=gate_up.num_stages,
    )
    return out
