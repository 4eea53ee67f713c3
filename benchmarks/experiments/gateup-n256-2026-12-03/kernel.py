"""Experiment: gate/up of the bf16 persistent kernel as ONE dot per K step.

The shipped ``_gate_up_persistent_kernel`` (``moerun/backends/triton/persistent.py``) issues
two dots per K step, ``a @ gate.T`` and ``a @ up.T``, each ``[BM, BK] x [BK, BN]``: at 8 warps
each warp group runs n128 wgmmas that read the same A rows from shared memory twice. Here the
weights are seen through a 4-D descriptor ``w13 [S, 2, I, H]`` (gate rows, then up rows) with
a ``[1, 2, BN, BK]`` box, so one TMA copy brings both tiles, stacked, as ``[2 BN, BK]``, and
one dot ``[BM, BK] x [BK, 2 BN]`` (n256 per warp group at BN=128) produces ``[gate | up]``;
the epilogue splits the accumulator (reshape ``[BM, 2, BN]``, permute, ``tl.split``).
Same alignment, same ``act [R, I]``, same math as the shipped kernel (rounding aside: fp32
accumulation of the same products in the same K order, so the results should match it
bit for bit).
"""

from __future__ import annotations

import triton
import triton.language as tl

from moerun._triton.gdc import pdl_prologue
from moerun.backends.triton.gate_up import grouped_pid


@triton.jit(do_not_specialize=["num_pairs", "max_rows", "num_slots", "num_programs"])
def gate_up_n2_kernel(
    x_ptr, w13_ptr, act_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    num_pairs, inter, hidden, max_rows, num_slots, num_programs,
    stride_xm, stride_we, stride_wn, stride_am,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
    NUM_STAGES: tl.constexpr, FLATTEN: tl.constexpr, A_TMA: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    w_desc = tl.make_tensor_descriptor(w13_ptr, shape=[num_slots, 2, inter, hidden],
                                       strides=[stride_we, inter * stride_wn, stride_wn, 1],
                                       block_shape=[1, 2, BLOCK_N, BLOCK_K])
    if A_TMA:
        a_desc = tl.make_tensor_descriptor(x_ptr, shape=[max_rows, hidden],
                                           strides=[stride_xm, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
    num_n = tl.cdiv(inter, BLOCK_N)
    used_blocks = tl.load(num_post_ptr) // BLOCK_M
    num_tiles = used_blocks * num_n
    k_tiles = tl.cdiv(hidden, BLOCK_K)
    offs_k = tl.arange(0, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_tiles, num_programs, flatten=FLATTEN):
        pid_m, pid_n = grouped_pid(tile, used_blocks, num_n, GROUP_M)
        expert = tl.load(expert_ids_ptr + pid_m)
        row0 = pid_m * BLOCK_M
        offs_m = row0 + tl.arange(0, BLOCK_M)
        n0 = pid_n * BLOCK_N
        if not A_TMA:
            pair = tl.load(sorted_ids_ptr + offs_m)
            row_ok = pair < num_pairs
            tok = (pair // TOP_K).to(tl.int64)
            a_ptrs = x_ptr + tok[:, None] * stride_xm + offs_k[None, :]
        acc = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
        for k in tl.range(0, k_tiles, num_stages=NUM_STAGES):
            if A_TMA:
                a = a_desc.load([row0, k * BLOCK_K])
            elif EVEN_K:
                a = tl.load(a_ptrs + k * BLOCK_K, mask=row_ok[:, None], other=0.0)
            else:
                k_ok = offs_k < hidden - k * BLOCK_K
                a = tl.load(a_ptrs + k * BLOCK_K, mask=row_ok[:, None] & k_ok[None, :],
                            other=0.0)
            b = w_desc.load([expert, 0, n0, k * BLOCK_K]).reshape(2 * BLOCK_N, BLOCK_K)
            acc = tl.dot(a, b.T, acc, input_precision=PRECISION)
        g, u = tl.split(acc.reshape(BLOCK_M, 2, BLOCK_N).permute(0, 2, 1))
        act = g * tl.sigmoid(g) * u
        offs_n = n0 + tl.arange(0, BLOCK_N)
        out_ptrs = act_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_n[None, :]
        tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=(offs_n < inter)[None, :])
