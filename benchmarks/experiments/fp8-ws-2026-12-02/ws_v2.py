"""(Snapshot of fp8_ws.py before the down kernel's TMA-store epilogue, for ab.py.)

The fp8 prefill kernels written in Gluon: warp-specialized grouped GEMMs for Hopper
(``ExpertsConfig.kernel == "ws"`` in an fp8 file; issue 12, DESIGN 11a).

Legend as ``fp8.py``: ``M`` tokens, ``K`` top-k, ``P = M*K`` pairs, ``H`` hidden, ``I``
intermediate, ``S`` slots, ``R`` aligned rows (``moe_align`` at 128 rows per block).

Why: Triton 3.6 pipelines the block-scaled K step badly on sm90 (each step's wgmma is waited
before its result is scaled, and its own warp specialization gives wrong results there), so
the compute-bound fp8 buckets ran at 0.36-0.41 of the fp8 floor. Here each persistent program
(one per SM) is three partitions sharing a ring of ``STAGES`` shared-memory stages guarded by
mbarriers: one loader warp issuing the TMA copies, and two consumer warp groups of 64 rows
each; while one group scales its dot result into its accumulator the other's wgmma runs.
Dense probe (``benchmarks/experiments/gluon-2026-12-02/ws_gemm.py``, H200): 900 / 590 / 840
TFLOP/s against Triton's 720-790 / 550 / 680 at 8192x8192x4096 / 8192x7168x2048 /
2048x28672x4096.

The call (:func:`run_experts_fp8_ws`), 5 or 6 device steps, no host sync, capturable:

1. ``moe_align`` at 128 rows per block; the activations quantized (``quantize_rows_fp8``)
   unless they arrive as :class:`QuantizedRows`;
2. the rows and scales gathered into aligned order (``gather_rows_fp8``: the rows in use
   only, padding rows zero);
3. gate/up (:func:`_gate_up_kernel`): per (block, ``gate_up_cols`` intermediate columns) and
   64-column pass each stage holds the block's two 64-row halves and the 64 gate and 64 up
   weight rows; each consumer issues the gate and the up wgmma (N = 64), waits, releases the
   stage, and adds both results times ``a_scale[row] * w_scale`` (one weight block per half
   and step) to its accumulators; epilogue ``silu(g) * u`` in fp32, rounded to the activation
   dtype; with 128 columns (two passes) quantized there per row and 128-column group and
   TMA-stored as e4m3 ``[R, I]`` with fp32 ``[R, I/128]`` scales, with 64 TMA-stored in the
   activation dtype and
4. quantized by ``quantize_rows_fp8`` (the same definition);
5. down (:func:`_down_kernel`): per (block, 128 hidden columns) the same K loop over one
   weight tile; epilogue times the pair's routing weight, stored to the pair's row of
   ``y [P, H]`` (padding rows skipped);
6. ``moe_sum`` over the K rows of each token.

A consumer whose 64 rows are all padding (an expert's last block holding at most 64 pairs)
issues no wgmma and only releases the stages, and the loader copies no A rows for it.
Each wgmma's C operand is the previous step's (already used) result, so ``use_acc=False``
costs no register copy. Needs CUDA sm90, ``H % 128 == 0`` and ``I % 128 == 0`` (checked by
the fp8 path); the kernels compile on a CPU for sm90 (no interpreter runs them: GPU tests).
"""

from __future__ import annotations

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from moerun.quant import AMAX_EPS, FP8_DTYPE, FP8_MAX, QuantizedRows

__all__ = ["WS_BLOCK_M", "WS_GATE_UP_N", "WS_DOWN_N", "run_experts_fp8_ws"]

#: Rows per block (two consumer warp groups of 64), the gate/up tile's intermediate columns
#: and the down tile's hidden columns; the K step is the 128-column quantization group.
WS_BLOCK_M = 128
WS_GATE_UP_N = 64
WS_DOWN_N = 128
_MMA_REGS = gl.constexpr(232)  # per consumer thread (setmaxnreg); the loader warp gets 40
_LOAD_REGS = gl.constexpr(40)
EPS = gl.constexpr(AMAX_EPS)
QMAX = gl.constexpr(FP8_MAX)


@gluon.jit
def _tile(t, grid_m, grid_n, GROUP_M: gl.constexpr):
    width = GROUP_M * grid_n
    gid = t // width
    size = gl.minimum(grid_m - gid * GROUP_M, GROUP_M)
    return gid * GROUP_M + (t % size), (t % width) // size


@gluon.jit
def _loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, sorted_ids_ptr, expert_ids_ptr,
            num_post_ptr, num_pairs, grid_n, k_tiles, n_rows_per_expert, up_offset,
            BN: gl.constexpr, PASSES: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
            GATE_UP: gl.constexpr):
    """TMA producer: per tile ``PASSES`` runs over K, each K step the block's two A halves
    (the second only when it holds a pair) and the weight rows of that pass (gate/up: 64
    gate rows and the 64 up rows ``up_offset`` further; down: BN rows)."""
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    A_BYTES: gl.constexpr = a_desc.block_type.nbytes
    B_BYTES: gl.constexpr = (2 if GATE_UP else 1) * b_desc.block_type.nbytes
    FULL: gl.constexpr = 2 * A_BYTES + B_BYTES
    HALF_ONLY: gl.constexpr = A_BYTES + B_BYTES
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, grid_m, grid_n, GROUP_M)
        expert = gl.load(expert_ids_ptr + pid_m)
        off_m = pid_m * BMC
        second = gl.load(sorted_ids_ptr + off_m + HALFC)
        live = second < num_pairs  # rows 64..127 hold a pair (they fill from row 0)
        dead = second >= num_pairs
        for p in gl.static_range(PASSES):
            off_w = expert * n_rows_per_expert + (pid_n * PASSES + p) * BN
            for i in range(k_tiles):
                s = c % STAGES
                mbarrier.wait(empty.index(s), ((c // STAGES) & 1) ^ 1)
                bar = ready.index(s)
                mbarrier.expect(bar, FULL, pred=live)
                mbarrier.expect(bar, HALF_ONLY, pred=dead)
                tma.async_copy_global_to_shared(a_desc, [off_m, i * 128], bar,
                                                a_bufs.index(2 * s))
                tma.async_copy_global_to_shared(a_desc, [off_m + HALFC, i * 128], bar,
                                                a_bufs.index(2 * s + 1), pred=live)
                if GATE_UP:
                    tma.async_copy_global_to_shared(b_desc, [off_w, i * 128], bar,
                                                    b_bufs.index(2 * s))
                    tma.async_copy_global_to_shared(b_desc, [off_w + up_offset, i * 128], bar,
                                                    b_bufs.index(2 * s + 1))
                else:
                    tma.async_copy_global_to_shared(b_desc, [off_w, i * 128], bar,
                                                    b_bufs.index(s))
                c += 1


@gluon.jit
def _skip_steps(ready, empty, c, steps, STAGES: gl.constexpr):
    """A consumer whose 64 rows are all padding: release ``steps`` stages unread."""
    for _ in range(steps):
        s = c % STAGES
        mbarrier.wait(ready.index(s), (c // STAGES) & 1)
        mbarrier.arrive(empty.index(s), count=1)
        c += 1
    return c


@gluon.jit
def _gate_up_pass(a_bufs, b_bufs, ready, empty, dg, du, c, sa_p, gs_p, us_p, k_tiles,
                  W: gl.constexpr, STAGES: gl.constexpr):
    """One run over K for 64 intermediate columns: ``silu(g) * u`` in fp32 (and the carried
    C operands and stage counter)."""
    acc_g = gl.zeros_like(dg)
    acc_u = gl.zeros_like(du)
    sa0 = gl.load(sa_p)
    sg0 = gl.load(gs_p)
    su0 = gl.load(us_p)
    for i in range(k_tiles):
        s = c % STAGES
        nxt = gl.minimum(i + 1, k_tiles - 1)
        sa1 = gl.load(sa_p + nxt)
        sg1 = gl.load(gs_p + nxt)
        su1 = gl.load(us_p + nxt)
        mbarrier.wait(ready.index(s), (c // STAGES) & 1)
        a = a_bufs.index(2 * s + W)
        bg = b_bufs.index(2 * s).permute((1, 0))
        bu = b_bufs.index(2 * s + 1).permute((1, 0))
        dg = warpgroup_mma(a, bg, dg, use_acc=False, is_async=True)
        du = warpgroup_mma(a, bu, du, use_acc=False, is_async=True)
        dg, du = warpgroup_mma_wait(num_outstanding=0, deps=(dg, du))
        mbarrier.arrive(empty.index(s), count=1)
        acc_g = acc_g + dg * gl.expand_dims(sa0 * sg0, 1)
        acc_u = acc_u + du * gl.expand_dims(sa0 * su0, 1)
        sa0 = sa1
        sg0 = sg1
        su0 = su1
        c += 1
    return acc_g / (1.0 + gl.exp(-acc_g)) * acc_u, dg, du, c


@gluon.jit
def _round_to(v, MID: gl.constexpr):
    """fp32 rounded to the activation dtype (``MID``: 1 fp16, 2 bf16), kept fp32."""
    if MID == 1:
        v = v.to(gl.float16).to(gl.float32)
    else:
        v = v.to(gl.bfloat16).to(gl.float32)
    return v


@gluon.jit
def _gate_up_consumer(a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr, qs_ptr,
                      sorted_ids_ptr, expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles,
                      stride_as, stride_wse, stride_wsn, stride_qs, inter_blocks,
                      W: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                      GROUP_M: gl.constexpr, FUSE_Q: gl.constexpr, MID: gl.constexpr):
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    PASSES: gl.constexpr = 2 if FUSE_Q else 1
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BN, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    dg = gl.zeros([HALFC, BN], gl.float32, mma)  # carried: the ignored C operands
    du = gl.zeros([HALFC, BN], gl.float32, mma)
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, grid_m, grid_n, GROUP_M)
        off_m = pid_m * BMC + W * HALFC
        off_n = pid_n * (PASSES * BN)
        if gl.load(sorted_ids_ptr + off_m) < num_pairs:
            expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
            rows = (off_m + gl.arange(0, HALFC, rows_l)).to(gl.int64)
            sa_p = as_ptr + rows * stride_as
            gs_p = ws_ptr + expert * stride_wse + (off_n // 128) * stride_wsn
            us_p = gs_p + inter_blocks * stride_wsn
            act0, dg, du, c = _gate_up_pass(a_bufs, b_bufs, ready, empty, dg, du, c, sa_p,
                                            gs_p, us_p, k_tiles, W, STAGES)
            if FUSE_Q:
                # the second 64 columns of the 128-column group, then the group's quantization
                # as quantize_rows_fp8 of the rounded values
                act1, dg, du, c = _gate_up_pass(a_bufs, b_bufs, ready, empty, dg, du, c, sa_p,
                                                gs_p, us_p, k_tiles, W, STAGES)
                act0 = _round_to(act0, MID)
                act1 = _round_to(act1, MID)
                amax = gl.maximum(gl.max(gl.abs(act0), axis=1), gl.max(gl.abs(act1), axis=1))
                scale = gl.maximum(amax, EPS) / QMAX
                sc = gl.expand_dims(scale, 1)
                q0 = gl.minimum(gl.maximum(act0 / sc, -QMAX), QMAX).to(c_desc.dtype)
                q1 = gl.minimum(gl.maximum(act1 / sc, -QMAX), QMAX).to(c_desc.dtype)
                tma.store_wait(pendings=0)
                c_bufs.index(2 * W).store(q0)
                c_bufs.index(2 * W + 1).store(q1)
                fence_async_shared()
                tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_bufs.index(2 * W))
                tma.async_copy_shared_to_global(c_desc, [off_m, off_n + BN],
                                                c_bufs.index(2 * W + 1))
                gl.store(qs_ptr + rows * stride_qs + pid_n, scale)
            else:
                tma.store_wait(pendings=0)
                cs = c_bufs.index(W)
                cs.store(act0.to(c_desc.dtype))
                fence_async_shared()
                tma.async_copy_shared_to_global(c_desc, [off_m, off_n], cs)
        else:
            c = _skip_steps(ready, empty, c, PASSES * k_tiles, STAGES)
    tma.store_wait(pendings=0)


@gluon.jit
def _down_consumer(a_bufs, b_bufs, ready, empty, y_ptr, topk_w_ptr, sorted_ids_ptr, as_ptr,
                   ws_ptr, expert_ids_ptr, num_post_ptr, grid_n, k_tiles, stride_as, stride_wse,
                   stride_wsn, stride_y, num_pairs, W: gl.constexpr, BN: gl.constexpr,
                   STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BN, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    cols_l: gl.constexpr = gl.SliceLayout(0, mma)
    d = gl.zeros([HALFC, BN], gl.float32, mma)
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, grid_m, grid_n, GROUP_M)
        off_m = pid_m * BMC + W * HALFC
        if gl.load(sorted_ids_ptr + off_m) < num_pairs:
            expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
            off_n = pid_n * BN
            rows = off_m + gl.arange(0, HALFC, rows_l)
            pair = gl.load(sorted_ids_ptr + rows)  # the epilogue's, loaded before the K loop
            ok = pair < num_pairs
            wt = gl.load(topk_w_ptr + pair, mask=ok, other=0.0)
            sa_p = as_ptr + rows.to(gl.int64) * stride_as
            sb_p = ws_ptr + expert * stride_wse + (off_n // 128) * stride_wsn
            acc = gl.zeros([HALFC, BN], gl.float32, mma)
            sa0 = gl.load(sa_p)
            sb0 = gl.load(sb_p)
            for i in range(k_tiles):
                s = c % STAGES
                nxt = gl.minimum(i + 1, k_tiles - 1)
                sa1 = gl.load(sa_p + nxt)
                sb1 = gl.load(sb_p + nxt)
                mbarrier.wait(ready.index(s), (c // STAGES) & 1)
                a = a_bufs.index(2 * s + W)
                b = b_bufs.index(s).permute((1, 0))
                d = warpgroup_mma(a, b, d, use_acc=False, is_async=True)
                d, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(d, a, b))
                mbarrier.arrive(empty.index(s), count=1)
                acc = acc + d * gl.expand_dims(sa0 * sb0, 1)
                sa0 = sa1
                sb0 = sb1
                c += 1
            yv = acc * gl.expand_dims(wt, 1)
            cols = off_n + gl.arange(0, BN, cols_l)
            ptrs = y_ptr + gl.expand_dims(pair.to(gl.int64) * stride_y, 1) + \
                gl.expand_dims(cols, 0)
            gl.store(ptrs, yv.to(y_ptr.dtype.element_ty), mask=gl.expand_dims(ok, 1))
        else:
            c = _skip_steps(ready, empty, c, k_tiles, STAGES)


@gluon.jit
def _gate_up_kernel(a_desc, b_desc, c_desc, as_ptr, ws_ptr, qs_ptr, sorted_ids_ptr,
                   expert_ids_ptr, num_post_ptr, num_pairs, inter, hidden, stride_as,
                   stride_wse, stride_wsn, stride_qs, BN: gl.constexpr, STAGES: gl.constexpr,
                   GROUP_M: gl.constexpr, FUSE_Q: gl.constexpr, MID: gl.constexpr):
    PASSES: gl.constexpr = 2 if FUSE_Q else 1
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [2 * STAGES, 64, 128], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [2 * STAGES, BN, 128], b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2 * PASSES, 64, BN], c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    grid_n = inter // (PASSES * BN)
    k_tiles = hidden // 128
    inter_blocks = inter // 128
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    GU: gl.constexpr = True
    gl.warp_specialize([
        (_gate_up_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr,
                             qs_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, num_pairs,
                             grid_n, k_tiles, stride_as, stride_wse, stride_wsn, stride_qs,
                             inter_blocks, WG0, BN, STAGES, GROUP_M, FUSE_Q, MID)),
        (_gate_up_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr,
                             qs_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, num_pairs,
                             grid_n, k_tiles, stride_as, stride_wse, stride_wsn, stride_qs,
                             inter_blocks, WG1, BN, STAGES, GROUP_M, FUSE_Q, MID)),
        (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, sorted_ids_ptr,
                   expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles, 2 * inter, inter,
                   BN, PASSES, STAGES, GROUP_M, GU)),
    ], [4, 1], [_MMA_REGS, _LOAD_REGS])


@gluon.jit
def _down_kernel(a_desc, b_desc, y_ptr, topk_w_ptr, sorted_ids_ptr, as_ptr, ws_ptr,
                expert_ids_ptr, num_post_ptr, hidden, inter, stride_as, stride_wse, stride_wsn,
                stride_y, num_pairs, BN: gl.constexpr, STAGES: gl.constexpr,
                GROUP_M: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [2 * STAGES, 64, 128], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, 128], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    grid_n = hidden // BN
    k_tiles = inter // 128
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    GU: gl.constexpr = False
    PASSES: gl.constexpr = 1
    gl.warp_specialize([
        (_down_consumer, (a_bufs, b_bufs, ready, empty, y_ptr, topk_w_ptr, sorted_ids_ptr,
                          as_ptr, ws_ptr, expert_ids_ptr, num_post_ptr, grid_n, k_tiles,
                          stride_as, stride_wse, stride_wsn, stride_y, num_pairs, WG0, BN,
                          STAGES, GROUP_M)),
        (_down_consumer, (a_bufs, b_bufs, ready, empty, y_ptr, topk_w_ptr, sorted_ids_ptr,
                          as_ptr, ws_ptr, expert_ids_ptr, num_post_ptr, grid_n, k_tiles,
                          stride_as, stride_wse, stride_wsn, stride_y, num_pairs, WG1, BN,
                          STAGES, GROUP_M)),
        (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, sorted_ids_ptr,
                   expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles, hidden, 0, BN,
                   PASSES, STAGES, GROUP_M, GU)),
    ], [4, 1], [_MMA_REGS, _LOAD_REGS])


def _desc(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    gdt = {torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16,
           torch.float16: gl.float16}[t.dtype]
    return TensorDescriptor.from_tensor(t, block,
                                        gl.NVMMASharedLayout.get_default_for(block, gdt))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def run_experts_fp8_ws(x: torch.Tensor | QuantizedRows, w13: torch.Tensor, w2: torch.Tensor,
                       w13_scale: torch.Tensor, w2_scale: torch.Tensor,
                       topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                       gate_up_cols: int, gate_up_stages: int, down_stages: int,
                       group_m: int, out_dtype: torch.dtype) -> torch.Tensor:
    """``out[t] = sum_j w[t, j] * expert_{ids[t, j]}(x[t])`` through the Gluon kernels.

    ``x [M, H]`` in ``out_dtype`` (fp16/bf16) or :class:`QuantizedRows`; ``w13 [S, 2I, H]`` /
    ``w2 [S, H, I]`` e4m3 contiguous with fp32 ``[S, 2I/128, H/128]`` / ``[S, H/128, I/128]``
    block scales; ``topk_ids [M, K]`` int32 contiguous (``-1`` skipped), ``topk_weights
    [M, K]`` fp32 contiguous. Returns ``[M, H]`` ``out_dtype``. About a dozen launches: the
    alignment (and its memset), the quantization unless given, the gathers and their index
    math (torch, 5), gate/up, the intermediate's quantization, down, the sum; current stream;
    no host sync; capturable (the TMA descriptors are launch arguments, by value). Shapes,
    dtypes and scale layouts are checked first (``fp8_checks``, ValueError naming the
    argument)."""
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum
    from moerun.backends.triton.fp8_checks import check_w2_fp8, check_w13_fp8
    from moerun.backends.triton.fp8_quant import gather_rows_fp8, quantize_rows_fp8

    if out_dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"out_dtype={out_dtype}: the ws fp8 kernels write fp16 or bf16")
    if gate_up_cols not in (64, 128):
        raise ValueError(f"gate_up_cols={gate_up_cols!r}: use 64 (one pass, the intermediate "
                         "quantized after) or 128 (two passes, quantized in the epilogue)")
    check_w13_fp8(x.data if isinstance(x, QuantizedRows) else x, w13, w13_scale)
    check_w2_fp8(torch.empty(0, w13.shape[1] // 2, device="meta"), w2, w2_scale)
    q = x if isinstance(x, QuantizedRows) else quantize_rows_fp8(x)
    m, h = q.data.shape
    s, two_i, _ = w13.shape
    inter = two_i // 2
    k = topk_ids.shape[1]
    p = m * k
    dev = q.data.device
    align = moe_align(topk_ids, s, WS_BLOCK_M)
    sid = align.sorted_ids
    g = gather_rows_fp8(q, align, k).rows  # (the current signature)
    r = sid.numel()
    fuse = gate_up_cols == 128
    qa = torch.empty(r, inter, device=dev, dtype=FP8_DTYPE if fuse else out_dtype)
    qa_s = torch.empty(r, inter // 128 if fuse else 1, device=dev, dtype=torch.float32)
    grid = (_sm_count(dev.index if dev.index is not None else torch.cuda.current_device()),)
    _gate_up_kernel[grid](
        _desc(g.data, [64, 128]), _desc(w13.view(s * two_i, h), [WS_GATE_UP_N, 128]),
        _desc(qa, [64, WS_GATE_UP_N]), g.scale, w13_scale, qa_s, sid, align.expert_ids,
        align.num_post, p, inter, h, g.scale.stride(0), w13_scale.stride(0),
        w13_scale.stride(1), qa_s.stride(0), WS_GATE_UP_N, gate_up_stages, group_m, fuse,
        1 if out_dtype == torch.float16 else 2, num_warps=4)
    if not fuse:
        iq = quantize_rows_fp8(qa)
        qa, qa_s = iq.data, iq.scale
    y = torch.empty(p, h, device=dev, dtype=out_dtype)
    _down_kernel[grid](
        _desc(qa, [64, 128]), _desc(w2.view(s * h, inter), [WS_DOWN_N, 128]), y,
        topk_weights, sid, qa_s, w2_scale, align.expert_ids, align.num_post, h, inter,
        qa_s.stride(0), w2_scale.stride(0), w2_scale.stride(1), y.stride(0), p, WS_DOWN_N,
        down_stages, group_m, num_warps=4)
    return moe_sum(y, topk_ids, s)
