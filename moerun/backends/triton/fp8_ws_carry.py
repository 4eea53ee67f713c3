"""The 256-column ws consumers: ONE fp32 accumulator per consumer, carried across the K steps
in the current step's scale units (``kernel="ws"`` fp8 configs with a 256-row weight tile:
``gate_up.block_n == 128``, ``down.block_n == 256``; issue 12, DESIGN 11a).

Legend as ``fp8_ws.py``. Why a second accumulation scheme: the scaled K step of
``fp8_ws.py`` keeps two ``[64, N]`` fp32 tiles per consumer warp group (the wgmma result and
the accumulator it is scaled into), so a consumer's tile stops at N = 128 (2 x 128 registers
per thread for N = 256 is past the 232 a consumer gets). Nsight Compute (2026-12-05) put
those kernels' tensor pipe at 50-56 % of cycles with L2 at 74-88 % of its peak: a 128 x 128
CTA tile reads too many L2 bytes per FLOP. Here the accumulator itself is the wgmma's C
operand:

    before step k:  acc *= s[k-1] / s[k]    (s = a_scale[row] * w_scale[block], per row and
                                              128-column weight block; 1 at k = 0)
    step k:         acc += A_k @ B_k         (the raw e4m3 product, on the tensor cores)
    after the loop: acc *= s[K-1]

which is ``sum_k s[k] * A_k @ B_k``, the block-scaled product, with one ``[64, 256]`` tile
(128 registers): the CTA tile is 128 x 256, a quarter fewer L2 bytes per FLOP. The gate/up
tile is 128 gate and 128 up weight rows, so its 128 intermediate columns are a whole
quantization group and the e4m3 intermediate is written in one pass. The multiply sits
before the wgmma, so while one consumer rescales the other's wgmma runs (the 1-vs-2 select
between the two 128-column halves is folded by the compiler: no ``selp`` in the PTX).

Numerics: the rescale is one fp32 rounding per step (the promotion form has one too), but
the running sum now passes through the tensor cores' fp8 accumulation, which keeps fewer
bits than fp32, every step rather than within one 128-wide K block. Measured on the H200
(docs/DECISIONS.md, "256-column ws tiles"). Scale products are floored at
:data:`SCALE_FLOOR` so that a zero scale (padding rows carry scale 0; an all-zero weight
block may too) gives ratio 1 instead of 0/0; every real product of an activation scale
(at least ``AMAX_EPS / 448``) and a checkpoint weight scale is far above it.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from moerun._triton.launch import FastLauncher
from moerun.backends.triton.fp8_ws_parts import (
    LOAD_REGS,
    MMA_REGS,
    half_runs,
    loader,
    skip_steps,
    stage_ring,
    tile_of,
)
from moerun.quant import AMAX_EPS, FP8_MAX

__all__ = [
    "DOWN_CARRY",
    "GATE_UP_CARRY",
    "SCALE_FLOOR",
    "down_carry_kernel",
    "gate_up_carry_kernel",
]

#: Scale products below this are taken as it (see the module docstring).
SCALE_FLOOR = 1e-30
_FLOOR = gl.constexpr(SCALE_FLOOR)
EPS = gl.constexpr(AMAX_EPS)
QMAX = gl.constexpr(FP8_MAX)


@gluon.jit
def _round_to(v, MID: gl.constexpr):
    """fp32 rounded to the activation dtype (``MID``: 1 fp16, 2 bf16), kept fp32."""
    if MID == 1:
        v = v.to(gl.float16).to(gl.float32)
    else:
        v = v.to(gl.bfloat16).to(gl.float32)
    return v


@gluon.jit
def _carried_k_loop(a_bufs, b_bufs, ready, empty, acc, c, sa_p, s0_p, s1_p, k_tiles, wt,
                    LO: gl.constexpr, W: gl.constexpr, STAGES: gl.constexpr):
    """One tile's K loop: ``acc`` (``[64, 256]`` fp32, zero) is carried in each step's scale
    units (columns ``< LO`` scale by ``s0``'s block, the rest by ``s1``'s) and, after the
    last step, multiplied by that step's scales and, unless ``wt`` is None, by the per-row
    factor ``wt [64]`` (down's routing weights) in the same multiply. Returns the block-scaled
    product and the stage counter."""
    cols = gl.arange(0, 2 * LO, gl.SliceLayout(0, acc.type.layout))
    lo = gl.expand_dims(cols < LO, 0)
    sa = gl.load(sa_p)
    s0 = gl.load(s0_p)
    s1 = gl.load(s1_p)
    p0 = gl.maximum(sa * s0, _FLOOR)
    p1 = gl.maximum(sa * s1, _FLOOR)
    for i in range(k_tiles):
        s = c % STAGES
        c0 = gl.maximum(sa * s0, _FLOOR)
        c1 = gl.maximum(sa * s1, _FLOOR)
        nxt = gl.minimum(i + 1, k_tiles - 1)  # the next step's scales, loaded early
        sa = gl.load(sa_p + nxt)
        s0 = gl.load(s0_p + nxt)
        s1 = gl.load(s1_p + nxt)
        acc = acc * gl.where(lo, gl.expand_dims(p0 / c0, 1), gl.expand_dims(p1 / c1, 1))
        mbarrier.wait(ready.index(s), (c // STAGES) & 1)
        a = a_bufs.index(2 * s + W)
        b = b_bufs.index(s).permute((1, 0))
        acc = warpgroup_mma(a, b, acc, is_async=True)
        acc, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a, b))
        mbarrier.arrive(empty.index(s), count=1)
        p0 = c0
        p1 = c1
        c += 1
    if wt is not None:
        p0 = p0 * wt
        p1 = p1 * wt
    return acc * gl.where(lo, gl.expand_dims(p0, 1), gl.expand_dims(p1, 1)), c


@gluon.jit
def _gate_up_carry_consumer(args, W: gl.constexpr, STAGES: gl.constexpr,
                            GROUP_M: gl.constexpr, MID: gl.constexpr, EVERY_HALF: gl.constexpr):
    """Consumer warp group ``W`` of :func:`gate_up_carry_kernel` (``args``: that kernel's
    tuple, the same for both groups)."""
    (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr, qs_ptr, sorted_ids_ptr,
     expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles, stride_as, stride_wse,
     stride_wsn, stride_qs, inter_blocks) = args
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    BN: gl.constexpr = 128
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 2 * BN, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = tile_of(t, grid_m, grid_n, GROUP_M)
        off_m = pid_m * BMC + W * HALFC
        if half_runs(sorted_ids_ptr, off_m, num_pairs, EVERY_HALF):
            expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
            rows = (off_m + gl.arange(0, HALFC, rows_l)).to(gl.int64)
            gs_p = ws_ptr + expert * stride_wse + pid_n * stride_wsn  # the gate block
            acc = gl.zeros([HALFC, 2 * BN], gl.float32, mma)
            acc, c = _carried_k_loop(a_bufs, b_bufs, ready, empty, acc, c,
                                     as_ptr + rows * stride_as, gs_p,
                                     gs_p + inter_blocks * stride_wsn, k_tiles, None, BN, W,
                                     STAGES)
            g, u = gl.split(gl.permute(gl.reshape(acc, [HALFC, 2, BN]), [0, 2, 1]))
            # silu(g) * u rounded to the activation dtype, then quantize_rows_fp8's definition
            act = _round_to(g / (1.0 + gl.exp(-g)) * u, MID)
            scale = gl.maximum(gl.max(gl.abs(act), axis=1), EPS) * (1.0 / QMAX)
            q = gl.minimum(gl.maximum(act / gl.expand_dims(scale, 1), -QMAX), QMAX)
            tma.store_wait(pendings=0)
            c_bufs.index(W).store(q.to(c_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [off_m, pid_n * BN], c_bufs.index(W))
            srows = (off_m + gl.arange(0, HALFC, scale.type.layout)).to(gl.int64)
            gl.store(qs_ptr + srows * stride_qs + pid_n, scale)
        else:
            c = skip_steps(ready, empty, c, k_tiles, STAGES)
    tma.store_wait(pendings=0)


@gluon.jit
def _down_carry_consumer(args, W: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                         SPLIT: gl.constexpr, EVERY_HALF: gl.constexpr):
    """Consumer warp group ``W`` of :func:`down_carry_kernel` (``args``: that kernel's tuple,
    the same for both groups)."""
    (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, topk_w_ptr, sorted_ids_ptr, as_ptr, ws_ptr,
     expert_ids_ptr, num_post_ptr, grid_n, k_tiles, stride_as, stride_wse, stride_wsn,
     num_pairs) = args
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    BN: gl.constexpr = 256
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BN, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = tile_of(t, grid_m, grid_n, GROUP_M)
        off_m = pid_m * BMC + W * HALFC
        if half_runs(sorted_ids_ptr, off_m, num_pairs, EVERY_HALF):
            expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
            off_n = pid_n * BN
            rows = off_m + gl.arange(0, HALFC, rows_l)
            pair = gl.load(sorted_ids_ptr + rows)  # the epilogue's, loaded before the K loop
            wt = gl.load(topk_w_ptr + pair, mask=pair < num_pairs, other=0.0)
            s0_p = ws_ptr + expert * stride_wse + (off_n // 128) * stride_wsn
            acc = gl.zeros([HALFC, BN], gl.float32, mma)
            acc, c = _carried_k_loop(a_bufs, b_bufs, ready, empty, acc, c,
                                     as_ptr + rows.to(gl.int64) * stride_as, s0_p,
                                     s0_p + stride_wsn, k_tiles, wt, 128, W, STAGES)
            # rows in aligned order through TMA (padding rows: weight 0); moe_sum maps pairs
            cs = c_bufs.index(W)
            if SPLIT:  # two [64, 128] stores through one buffer (4 stages leave no room)
                lo, hi = gl.split(gl.permute(gl.reshape(acc, [HALFC, 2, 128]), [0, 2, 1]))
                tma.store_wait(pendings=0)
                cs.store(lo.to(c_desc.dtype))
                fence_async_shared()
                tma.async_copy_shared_to_global(c_desc, [off_m, off_n], cs)
                tma.store_wait(pendings=0)
                cs.store(hi.to(c_desc.dtype))
                fence_async_shared()
                tma.async_copy_shared_to_global(c_desc, [off_m, off_n + 128], cs)
            else:
                tma.store_wait(pendings=0)
                cs.store(acc.to(c_desc.dtype))
                fence_async_shared()
                tma.async_copy_shared_to_global(c_desc, [off_m, off_n], cs)
        else:
            c = skip_steps(ready, empty, c, k_tiles, STAGES)
    tma.store_wait(pendings=0)


@gluon.jit
def gate_up_carry_kernel(a_desc, b_desc, c_desc, as_ptr, ws_ptr, qs_ptr, sorted_ids_ptr,
                         expert_ids_ptr, num_post_ptr, num_pairs, inter, hidden, stride_as,
                         stride_wse, stride_wsn, stride_qs, STAGES: gl.constexpr,
                         GROUP_M: gl.constexpr, MID: gl.constexpr,
                         EVERY_HALF: gl.constexpr = True):
    """Per (block, 128 intermediate columns): e4m3 ``[R, I]`` and fp32 ``[R, I/128]`` scales
    out (``c_desc`` block ``[64, 128]``; ``b_desc`` block ``[128, 128]`` of ``w13`` viewed
    ``[S*2I, H]``). ``EVERY_HALF``: a consumer of 64 padding rows runs its K loop too (not
    ``ExpertsConfig.skip_padding``). Grid: one program per SM.

    Gluon kernel; launched by ``fp8_ws.run_experts_fp8_ws`` on the current stream."""
    BN: gl.constexpr = 128
    a_bufs, b_bufs, ready, empty = stage_ring(a_desc, b_desc, STAGES, 2 * BN)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2, 64, BN], c_desc.layout)
    grid_n = inter // BN
    k_tiles = hidden // 128
    inter_blocks = inter // 128
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    GU: gl.constexpr = True
    args = (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr, qs_ptr,
            sorted_ids_ptr, expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles,
            stride_as, stride_wse, stride_wsn, stride_qs, inter_blocks)
    gl.warp_specialize([
        (_gate_up_carry_consumer, (args, WG0, STAGES, GROUP_M, MID, EVERY_HALF)),
        (_gate_up_carry_consumer, (args, WG1, STAGES, GROUP_M, MID, EVERY_HALF)),
        (loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, sorted_ids_ptr,
                  expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles, 2 * inter, inter,
                  BN, STAGES, GROUP_M, GU)),
    ], [4, 1], [MMA_REGS, LOAD_REGS])


@gluon.jit
def down_carry_kernel(a_desc, b_desc, c_desc, topk_w_ptr, sorted_ids_ptr, as_ptr, ws_ptr,
                      expert_ids_ptr, num_post_ptr, hidden, inter, stride_as, stride_wse,
                      stride_wsn, num_pairs, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                      SPLIT: gl.constexpr, EVERY_HALF: gl.constexpr = True):
    """Per (block, 256 hidden columns): ``y [R, H]`` rows in aligned order (``c_desc`` block
    ``[64, 128]`` with ``SPLIT``, else ``[64, 256]``; ``b_desc`` block ``[256, 128]`` of
    ``w2`` viewed ``[S*H, I]``). ``EVERY_HALF`` as :func:`gate_up_carry_kernel`. Grid: one
    program per SM.

    Gluon kernel; launched by ``fp8_ws.run_experts_fp8_ws`` on the current stream."""
    BN: gl.constexpr = 256
    CN: gl.constexpr = 128 if SPLIT else 256
    a_bufs, b_bufs, ready, empty = stage_ring(a_desc, b_desc, STAGES, BN)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2, 64, CN], c_desc.layout)
    grid_n = hidden // BN
    k_tiles = inter // 128
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    GU: gl.constexpr = False
    args = (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, topk_w_ptr, sorted_ids_ptr, as_ptr,
            ws_ptr, expert_ids_ptr, num_post_ptr, grid_n, k_tiles, stride_as, stride_wse,
            stride_wsn, num_pairs)
    gl.warp_specialize([
        (_down_carry_consumer, (args, WG0, STAGES, GROUP_M, SPLIT, EVERY_HALF)),
        (_down_carry_consumer, (args, WG1, STAGES, GROUP_M, SPLIT, EVERY_HALF)),
        (loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, sorted_ids_ptr,
                  expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles, hidden, 0, BN,
                  STAGES, GROUP_M, GU)),
    ], [4, 1], [MMA_REGS, LOAD_REGS])


#: The two kernels' launchers (``moerun._triton.launch``: the compiled handle cached per
#: specialisation, the TMA descriptors keyed by box and layout).
GATE_UP_CARRY = FastLauncher(gate_up_carry_kernel)
DOWN_CARRY = FastLauncher(down_carry_kernel)
