"""The fp8 ws kernels with 256-column tiles and ONE accumulator per consumer ("carry").

Why: the shipped ws kernels (``moerun/backends/triton/fp8_ws.py``) keep two ``[64, 128]``
fp32 tiles per consumer warp group (the wgmma result and the scaled accumulator), so a
consumer cannot hold a 256-column tile (2 x 128 registers per thread plus addresses is past
the 232 it gets). Counters (2026-12-05) put their tensor pipe at 50-56 % with L2 at 74-88 %
of peak: the 128 x 128 CTA tile reads too many L2 bytes per FLOP.

Here the accumulator is carried in the current K step's scale units: before step k's wgmma
the accumulator is multiplied by ``s[k-1] / s[k]`` (per row and 128-column weight block,
``s = a_scale * w_scale``), the wgmma adds the raw fp8 product into it, and after the last
step it is multiplied by ``s[K-1]``. Same sum, one ``[64, 256]`` tile (128 registers), so
the CTA tile is 128 x 256 (gate/up: 128 gate and 128 up weight rows, that is a whole
128-column quantization group of the intermediate in one pass; down: 256 hidden columns).
L2 bytes per FLOP drop by a quarter. Scale products are floored at ``1e-30`` (padding rows
carry scale 0; a zero weight block would too), which changes no product of real scales.

Dense A/B against the promotion form was not done in Gluon before (the Triton ``carry``
form lost, 2026-12-01, but there the rescale sat between two dependent dots of ONE warp
group; here the other consumer's wgmma runs while one rescales).
"""

from __future__ import annotations

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

from moerun.backends.triton.fp8_ws import (
    _LOAD_REGS,
    _MMA_REGS,
    EPS,
    QMAX,
    _desc,
    _loader,
    _round_to,
    _skip_steps,
    _sm_count,
    _tile,
)
from moerun.quant import FP8_DTYPE, QuantizedRows

FLOOR = gl.constexpr(1e-30)
GU_N = 128  # intermediate columns per gate/up tile (128 gate + 128 up weight rows)
DN_N = 256  # hidden columns per down tile


@gluon.jit
def _gate_up_wide_consumer(a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr, qs_ptr,
                           sorted_ids_ptr, expert_ids_ptr, num_post_ptr, num_pairs, grid_n,
                           k_tiles, stride_as, stride_wse, stride_wsn, stride_qs, inter_blocks,
                           W: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                           MID: gl.constexpr):
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    BN: gl.constexpr = 128
    mma2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                   instr_shape=[16, 2 * BN, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma2)
    cols = gl.arange(0, 2 * BN, gl.SliceLayout(0, mma2))
    is_gate = gl.expand_dims(cols < BN, 0)
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, grid_m, grid_n, GROUP_M)
        off_m = pid_m * BMC + W * HALFC
        if gl.load(sorted_ids_ptr + off_m) < num_pairs:
            expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
            rows = (off_m + gl.arange(0, HALFC, rows_l)).to(gl.int64)
            sa_p = as_ptr + rows * stride_as
            gs_p = ws_ptr + expert * stride_wse + pid_n * stride_wsn
            us_p = gs_p + inter_blocks * stride_wsn
            sa = gl.load(sa_p)
            sg = gl.load(gs_p)
            su = gl.load(us_p)
            pg = gl.maximum(sa * sg, FLOOR)
            pu = gl.maximum(sa * su, FLOOR)
            acc = gl.zeros([HALFC, 2 * BN], gl.float32, mma2)
            for i in range(k_tiles):
                s = c % STAGES
                cg = gl.maximum(sa * sg, FLOOR)
                cu = gl.maximum(sa * su, FLOOR)
                nxt = gl.minimum(i + 1, k_tiles - 1)
                sa = gl.load(sa_p + nxt)
                sg = gl.load(gs_p + nxt)
                su = gl.load(us_p + nxt)
                acc = acc * gl.where(is_gate, gl.expand_dims(pg / cg, 1),
                                     gl.expand_dims(pu / cu, 1))
                mbarrier.wait(ready.index(s), (c // STAGES) & 1)
                a = a_bufs.index(2 * s + W)
                b = b_bufs.index(s).permute((1, 0))
                acc = warpgroup_mma(a, b, acc, is_async=True)
                acc, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a, b))
                mbarrier.arrive(empty.index(s), count=1)
                pg = cg
                pu = cu
                c += 1
            acc = acc * gl.where(is_gate, gl.expand_dims(pg, 1), gl.expand_dims(pu, 1))
            g, u = gl.split(gl.permute(gl.reshape(acc, [HALFC, 2, BN]), [0, 2, 1]))
            act = _round_to(g / (1.0 + gl.exp(-g)) * u, MID)
            amax = gl.max(gl.abs(act), axis=1)
            scale = gl.maximum(amax, EPS) / QMAX
            q = gl.minimum(gl.maximum(act / gl.expand_dims(scale, 1), -QMAX), QMAX)
            tma.store_wait(pendings=0)
            c_bufs.index(W).store(q.to(c_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [off_m, pid_n * BN], c_bufs.index(W))
            srows = (off_m + gl.arange(0, HALFC, scale.type.layout)).to(gl.int64)
            gl.store(qs_ptr + srows * stride_qs + pid_n, scale)
        else:
            c = _skip_steps(ready, empty, c, k_tiles, STAGES)
    tma.store_wait(pendings=0)


@gluon.jit
def _down_wide_consumer(a_bufs, b_bufs, ready, empty, c_desc, c_bufs, topk_w_ptr, sorted_ids_ptr,
                        as_ptr, ws_ptr, expert_ids_ptr, num_post_ptr, grid_n, k_tiles, stride_as,
                        stride_wse, stride_wsn, num_pairs, W: gl.constexpr,
                        STAGES: gl.constexpr, GROUP_M: gl.constexpr, SPLIT: gl.constexpr):
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    BN: gl.constexpr = 256
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BN, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    cols = gl.arange(0, BN, gl.SliceLayout(0, mma))
    is_lo = gl.expand_dims(cols < 128, 0)
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, grid_m, grid_n, GROUP_M)
        off_m = pid_m * BMC + W * HALFC
        if gl.load(sorted_ids_ptr + off_m) < num_pairs:
            expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
            off_n = pid_n * BN
            rows = off_m + gl.arange(0, HALFC, rows_l)
            pair = gl.load(sorted_ids_ptr + rows)
            wt = gl.load(topk_w_ptr + pair, mask=pair < num_pairs, other=0.0)
            sa_p = as_ptr + rows.to(gl.int64) * stride_as
            s0_p = ws_ptr + expert * stride_wse + (off_n // 128) * stride_wsn
            s1_p = s0_p + stride_wsn
            sa = gl.load(sa_p)
            s0 = gl.load(s0_p)
            s1 = gl.load(s1_p)
            p0 = gl.maximum(sa * s0, FLOOR)
            p1 = gl.maximum(sa * s1, FLOOR)
            acc = gl.zeros([HALFC, BN], gl.float32, mma)
            for i in range(k_tiles):
                s = c % STAGES
                c0 = gl.maximum(sa * s0, FLOOR)
                c1 = gl.maximum(sa * s1, FLOOR)
                nxt = gl.minimum(i + 1, k_tiles - 1)
                sa = gl.load(sa_p + nxt)
                s0 = gl.load(s0_p + nxt)
                s1 = gl.load(s1_p + nxt)
                acc = acc * gl.where(is_lo, gl.expand_dims(p0 / c0, 1),
                                     gl.expand_dims(p1 / c1, 1))
                mbarrier.wait(ready.index(s), (c // STAGES) & 1)
                a = a_bufs.index(2 * s + W)
                b = b_bufs.index(s).permute((1, 0))
                acc = warpgroup_mma(a, b, acc, is_async=True)
                acc, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a, b))
                mbarrier.arrive(empty.index(s), count=1)
                p0 = c0
                p1 = c1
                c += 1
            wv = gl.expand_dims(wt, 1)
            acc = acc * gl.where(is_lo, gl.expand_dims(p0, 1) * wv, gl.expand_dims(p1, 1) * wv)
            if SPLIT:  # two [64, 128] stores through one buffer
                lo, hi = gl.split(gl.permute(gl.reshape(acc, [HALFC, 2, 128]), [0, 2, 1]))
                tma.store_wait(pendings=0)
                cs = c_bufs.index(W)
                cs.store(lo.to(c_desc.dtype))
                fence_async_shared()
                tma.async_copy_shared_to_global(c_desc, [off_m, off_n], cs)
                tma.store_wait(pendings=0)
                cs.store(hi.to(c_desc.dtype))
                fence_async_shared()
                tma.async_copy_shared_to_global(c_desc, [off_m, off_n + 128], cs)
            else:
                tma.store_wait(pendings=0)
                cs = c_bufs.index(W)
                cs.store(acc.to(c_desc.dtype))
                fence_async_shared()
                tma.async_copy_shared_to_global(c_desc, [off_m, off_n], cs)
        else:
            c = _skip_steps(ready, empty, c, k_tiles, STAGES)
    tma.store_wait(pendings=0)


@gluon.jit
def gate_up_wide_kernel(a_desc, b_desc, c_desc, as_ptr, ws_ptr, qs_ptr, sorted_ids_ptr,
                        expert_ids_ptr, num_post_ptr, num_pairs, inter, hidden, stride_as,
                        stride_wse, stride_wsn, stride_qs, STAGES: gl.constexpr,
                        GROUP_M: gl.constexpr, MID: gl.constexpr):
    BN: gl.constexpr = 128
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [2 * STAGES, 64, 128], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, 2 * BN, 128], b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2, 64, BN], c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    grid_n = inter // BN
    k_tiles = hidden // 128
    inter_blocks = inter // 128
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    GU: gl.constexpr = True
    PASSES: gl.constexpr = 1
    gl.warp_specialize([
        (_gate_up_wide_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr,
                                  qs_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
                                  num_pairs, grid_n, k_tiles, stride_as, stride_wse, stride_wsn,
                                  stride_qs, inter_blocks, WG0, STAGES, GROUP_M, MID)),
        (_gate_up_wide_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr,
                                  qs_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
                                  num_pairs, grid_n, k_tiles, stride_as, stride_wse, stride_wsn,
                                  stride_qs, inter_blocks, WG1, STAGES, GROUP_M, MID)),
        (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, sorted_ids_ptr,
                   expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles, 2 * inter, inter,
                   BN, PASSES, STAGES, GROUP_M, GU)),
    ], [4, 1], [_MMA_REGS, _LOAD_REGS])


@gluon.jit
def down_wide_kernel(a_desc, b_desc, c_desc, topk_w_ptr, sorted_ids_ptr, as_ptr, ws_ptr,
                     expert_ids_ptr, num_post_ptr, hidden, inter, stride_as, stride_wse,
                     stride_wsn, num_pairs, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                     SPLIT: gl.constexpr):
    BN: gl.constexpr = 256
    CN: gl.constexpr = 128 if SPLIT else 256
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [2 * STAGES, 64, 128], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, 128], b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2, 64, CN], c_desc.layout)
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
        (_down_wide_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, topk_w_ptr,
                               sorted_ids_ptr, as_ptr, ws_ptr, expert_ids_ptr, num_post_ptr,
                               grid_n, k_tiles, stride_as, stride_wse, stride_wsn, num_pairs,
                               WG0, STAGES, GROUP_M, SPLIT)),
        (_down_wide_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, topk_w_ptr,
                               sorted_ids_ptr, as_ptr, ws_ptr, expert_ids_ptr, num_post_ptr,
                               grid_n, k_tiles, stride_as, stride_wse, stride_wsn, num_pairs,
                               WG1, STAGES, GROUP_M, SPLIT)),
        (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, sorted_ids_ptr,
                   expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles, hidden, 0, BN,
                   PASSES, STAGES, GROUP_M, GU)),
    ], [4, 1], [_MMA_REGS, _LOAD_REGS])


def run_experts_fp8_wide(x, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, *,
                         gate_up="wide", down="wide", gate_up_stages=4, down_stages=3,
                         group_m=8, down_split=None, out_dtype=torch.bfloat16):
    """As ``fp8_ws.run_experts_fp8_ws`` (same arguments and result). ``gate_up``: ``"wide"``
    (this module's kernel), or 64 / 128 (the shipped kernel with those columns); ``down``:
    ``"wide"`` or ``"narrow"`` (the shipped kernel). ``down_split`` None: split the wide
    down store when the stages would not fit otherwise."""
    from moerun.backends.triton import fp8_ws
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum
    from moerun.backends.triton.fp8_quant import gather_rows_fp8, quantize_rows_fp8

    q = x if isinstance(x, QuantizedRows) else quantize_rows_fp8(x)
    m, h = q.data.shape
    s, two_i, _ = w13.shape
    inter = two_i // 2
    if h % DN_N or inter % GU_N:
        raise ValueError(f"hidden={h} must be a multiple of {DN_N}, inter={inter} of {GU_N}")
    k = topk_ids.shape[1]
    p = m * k
    dev = q.data.device
    align = moe_align(topk_ids, s, 128)
    sid = align.sorted_ids
    gathered = gather_rows_fp8(q, align, k)
    g, pair_rows = gathered.rows, gathered.pair_rows
    r = sid.numel()
    mid = 1 if out_dtype == torch.float16 else 2
    grid = (_sm_count(dev.index if dev.index is not None else torch.cuda.current_device()),)
    if gate_up == "wide":
        qa = torch.empty(r, inter, device=dev, dtype=FP8_DTYPE)
        qa_s = torch.empty(r, inter // 128, device=dev, dtype=torch.float32)
        gate_up_wide_kernel[grid](
            _desc(g.data, [64, 128]), _desc(w13.view(s * two_i, h), [GU_N, 128]),
            _desc(qa, [64, GU_N]), g.scale, w13_scale, qa_s, sid, align.expert_ids,
            align.num_post, p, inter, h, g.scale.stride(0), w13_scale.stride(0),
            w13_scale.stride(1), qa_s.stride(0), gate_up_stages, group_m, mid, num_warps=4)
    else:
        fuse = gate_up == 128
        qa = torch.empty(r, inter, device=dev, dtype=FP8_DTYPE if fuse else out_dtype)
        qa_s = torch.empty(r, inter // 128, device=dev, dtype=torch.float32) if fuse \
            else g.scale
        fp8_ws._gate_up_kernel[grid](
            _desc(g.data, [64, 128]), _desc(w13.view(s * two_i, h), [64, 128]),
            _desc(qa, [64, 64]), g.scale, w13_scale, qa_s, sid, align.expert_ids,
            align.num_post, p, inter, h, g.scale.stride(0), w13_scale.stride(0),
            w13_scale.stride(1), qa_s.stride(0), 64, gate_up_stages, group_m, fuse, mid,
            num_warps=4)
        if not fuse:
            iq = quantize_rows_fp8(qa)
            qa, qa_s = iq.data, iq.scale
    y = torch.empty(r, h, device=dev, dtype=out_dtype)
    if down == "wide":
        split = down_stages > 3 if down_split is None else down_split
        down_wide_kernel[grid](
            _desc(qa, [64, 128]), _desc(w2.view(s * h, inter), [DN_N, 128]),
            _desc(y, [64, 128 if split else DN_N]), topk_weights, sid, qa_s, w2_scale,
            align.expert_ids, align.num_post, h, inter, qa_s.stride(0), w2_scale.stride(0),
            w2_scale.stride(1), p, down_stages, group_m, split, num_warps=4)
    else:
        fp8_ws._down_kernel[grid](
            _desc(qa, [64, 128]), _desc(w2.view(s * h, inter), [128, 128]),
            _desc(y, [64, 128]), topk_weights, sid, qa_s, w2_scale, align.expert_ids,
            align.num_post, h, inter, qa_s.stride(0), w2_scale.stride(0), w2_scale.stride(1),
            p, 128, down_stages, group_m, num_warps=4)
    return moe_sum(y, topk_ids, s, rows=pair_rows)
