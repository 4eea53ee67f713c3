"""Experiment: the grouped (non-persistent) gate/up kernel of ``moerun/backends/triton/
gate_up.py`` with one dot per K step, as the persistent kernel has since 2026-12-03: the B
tile is ``[BK, 2 BN]`` pointers (the gate columns, then the up columns of the same rows),
one ``[BM, BK] x [BK, 2 BN]`` dot, the accumulator split in the epilogue. Everything else is
a copy of ``_gate_up_kernel`` as it stands (shared expert and direct modes included).
"""

from __future__ import annotations

import triton
import triton.language as tl

from moerun._triton.gdc import pdl_prologue
from moerun.backends.triton.gate_up import grouped_pid


@triton.jit(do_not_specialize=["num_pairs", "max_blocks"])
def gate_up_one_dot_kernel(
    # tensors
    x_ptr,  # [M, H]
    w13_ptr,  # [S, 2I, H]
    sw13_ptr,  # [2*Is, H] shared expert (read iff SHARED)
    act_ptr,  # [R, I] out, x.dtype
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,  # alignment (DIRECT: -, topk_ids, -)
    topk_weights_ptr,  # [M*K] fp32, read iff DIRECT
    zero_ptr, zero_numel,  # int32 buffer zeroed iff ZBLOCK (the direct down's counters)
    # sizes
    num_pairs, inter, hidden, max_blocks, num_routed, s_inter,
    # strides in elements (the last dim of every tensor is contiguous; the shared tensor's
    # row stride equals stride_wn = H)
    stride_xm, stride_we, stride_wn, stride_am,
    # meta
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
    SHARED: tl.constexpr, DIRECT: tl.constexpr, ZBLOCK: tl.constexpr,
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    pid = tl.program_id(0)
    if ZBLOCK > 0:  # every program zeroes its share, excluded pairs' programs too
        offs_z = pid * ZBLOCK + tl.arange(0, ZBLOCK)
        tl.store(zero_ptr + offs_z, tl.zeros([ZBLOCK], dtype=tl.int32), mask=offs_z < zero_numel)
    pid_m, pid_n = grouped_pid(pid, max_blocks, tl.cdiv(inter, BLOCK_N), GROUP_M)
    if DIRECT:  # pid_m is the pair; its slot straight from topk_ids
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
        if (expert < 0) | (expert >= num_routed):
            return
        rows = tl.arange(0, BLOCK_M)
        row_ok = rows == 0
        tok = (pid_m // TOP_K + rows * 0).to(tl.int64)
        offs_m = pid_m + rows * 0  # output row: the pair's (only row 0 is stored)
    else:
        if pid_m * BLOCK_M >= tl.load(num_post_ptr):
            return
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(sorted_ids_ptr + offs_m)
        row_ok = pair < num_pairs
        tok = (pair // TOP_K).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)

    a_ptrs = x_ptr + tok[:, None] * stride_xm + offs_k[None, :]
    if SHARED == 0:
        w_base = w13_ptr + expert * stride_we
        up_rows = inter
    else:
        if expert >= num_routed:  # a shared slot: its I-wide slice of the shared tensor
            w_base = sw13_ptr + (expert - num_routed) * inter * stride_wn
            up_rows = s_inter if SHARED == 2 else inter
        else:
            w_base = w13_ptr + expert * stride_we
            up_rows = inter
    # [BK, 2 BN]: the gate columns, then the up columns of the same rows (columns past I
    # read valid rows, wrapped; their results are dropped)
    offs_j = tl.arange(0, 2 * BLOCK_N)
    w_rows = (pid_n * BLOCK_N + offs_j % BLOCK_N) % inter + (offs_j // BLOCK_N) * up_rows
    b_ptrs = w_base + w_rows[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(hidden, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            k_ok = offs_k < hidden - k * BLOCK_K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    acc_g, acc_u = tl.split(acc.reshape(BLOCK_M, 2, BLOCK_N).permute(0, 2, 1))
    act = acc_g * tl.sigmoid(acc_g) * acc_u  # silu(gate) * up, fp32
    out_ptrs = act_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_n[None, :]
    if DIRECT:
        act = act * tl.load(topk_weights_ptr + pid_m)
        tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_n < inter)[None, :])
    else:
        tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=(offs_n < inter)[None, :])
