"""The fp8 prefill kernels written in Gluon: warp-specialized grouped GEMMs for Hopper
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
   only, padding rows zero; also the pair-to-row map);
3. gate/up, one of two forms (``gate_up_cols``):
   - 64 (:func:`_gate_up_kernel`): per (block, 64 intermediate columns) each stage holds the
     block's two 64-row halves and the 64 gate and 64 up weight rows, stacked in one
     ``[128, 128]`` stage buffer; each consumer issues ONE wgmma of N = 128 over
     ``[gate | up]`` (the A tile read from shared memory once; two N = 64 wgmmas gave the
     same bits and were 2-5 % slower at T=8192, docs/DECISIONS.md "Gate/up as one dot"),
     waits, releases the stage, and adds the result times ``a_scale[row] * w_scale`` (the
     gate block's scale on the gate half, the up block's on the up half) to its
     accumulator; epilogue ``silu(g) * u`` in fp32, TMA-stored in the activation dtype, and
     4. quantized by ``quantize_rows_fp8``;
   - 128 (``fp8_ws_carry.gate_up_carry_kernel``): 128 gate and 128 up weight rows per tile,
     one carried accumulator per consumer (that module's docstring), the epilogue quantizing
     the whole 128-column group and TMA-storing e4m3 ``[R, I]`` with fp32 ``[R, I/128]``
     scales (no step 4);
5. down, ``down_cols`` 128 (:func:`_down_kernel`: the 64-column form's K loop over one
   weight tile) or 256 (``fp8_ws_carry.down_carry_kernel``); epilogue times the pair's
   routing weight, TMA-stored in aligned order to ``y [R, H]`` (so the consumer moves on
   while the copy drains);
6. ``moe_sum`` over the K rows of each token, found through the pair-to-row map the gather
   wrote.

A consumer whose 64 rows are all padding (an expert's last block holding at most 64 pairs)
gets no A rows from the loader. By default (``skip_padding=False``) it runs the K loop
anyway, on whatever its A buffers hold, and stores into padding rows, which nothing reads
(down's routing weight there is 0 and ``moe_sum`` reads pair rows only): every tile then
takes the same time, and the programs that share a weight tile stay in step. With
``skip_padding=True`` it issues no wgmma and only releases the stages (``skip_steps``).
In the promoted kernels (this module) each wgmma's C operand is the previous step's (already
used) result, so ``use_acc=False`` costs no register copy. Needs CUDA sm90, ``H % 128 == 0``
and ``I % 128 == 0`` (checked by the fp8 path); the kernels compile on a CPU for sm90 (no
interpreter runs them: GPU tests).
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

from moerun._triton.device import sm_count
from moerun._triton.launch import FastLauncher
from moerun.backends.triton.config_types import WS_MAX_STAGES
from moerun.backends.triton.fp8_ws_parts import (
    LOAD_REGS,
    MMA_REGS,
    half_runs,
    loader,
    skip_steps,
    stage_ring,
    tile_of,
    tma_desc,
)
from moerun.quant import FP8_DTYPE, QuantizedRows

__all__ = [
    "WS_BLOCK_M",
    "WS_DOWN_COLS",
    "WS_GATE_UP_COLS",
    "run_experts_fp8_ws",
]

#: Rows per block (two consumer warp groups of 64); the gate/up tile's intermediate columns
#: and the down tile's hidden columns of the two forms each (the first: promoted per K step,
#: this module; the second: carried, ``fp8_ws_carry.py``); the K step is the 128-column
#: quantization group.
WS_BLOCK_M = 128
WS_GATE_UP_COLS = (64, 128)
WS_DOWN_COLS = (128, 256)


@gluon.jit
def _gate_up_pass(a_bufs, b_bufs, ready, empty, d, c, sa_p, gs_p, us_p, k_tiles,
                  W: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                  HALF: gl.constexpr):
    """One run over K for BN intermediate columns: ONE wgmma of N = 2 BN per K step over
    ``[gate | up]`` (the stage buffer holds the gate rows, then the up rows), each half
    scaled by its weight block; ``silu(g) * u`` in fp32 in layout ``HALF`` (and the carried
    C operand and stage counter)."""
    cols = gl.arange(0, 2 * BN, gl.SliceLayout(0, d.type.layout))
    is_gate = gl.expand_dims(cols < BN, 0)
    acc = gl.zeros_like(d)
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
        b = b_bufs.index(s).permute((1, 0))
        d = warpgroup_mma(a, b, d, use_acc=False, is_async=True)
        d, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(d, a, b))
        mbarrier.arrive(empty.index(s), count=1)
        sa = gl.expand_dims(sa0, 1)
        acc = acc + d * gl.where(is_gate, sa * sg0, sa * su0)
        sa0 = sa1
        sg0 = sg1
        su0 = su1
        c += 1
    g, u = gl.split(gl.permute(gl.reshape(acc, [64, 2, BN]), [0, 2, 1]))
    g = gl.convert_layout(g, HALF)
    u = gl.convert_layout(u, HALF)
    return g / (1.0 + gl.exp(-g)) * u, d, c


@gluon.jit
def _gate_up_consumer(args, W: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                      GROUP_M: gl.constexpr, EVERY_HALF: gl.constexpr):
    """Consumer warp group ``W`` of :func:`_gate_up_kernel` (``args``: that kernel's tuple,
    the same for both groups)."""
    (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr, sorted_ids_ptr,
     expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles, stride_as, stride_wse,
     stride_wsn, inter_blocks) = args
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BN, 32])
    mma2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                   instr_shape=[16, 2 * BN, 32])
    d = gl.zeros([HALFC, 2 * BN], gl.float32, mma2)  # carried: the ignored C operand
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = tile_of(t, grid_m, grid_n, GROUP_M)
        off_m = pid_m * BMC + W * HALFC
        off_n = pid_n * BN
        if half_runs(sorted_ids_ptr, off_m, num_pairs, EVERY_HALF):
            expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
            rows2 = (off_m + gl.arange(0, HALFC, gl.SliceLayout(1, mma2))).to(gl.int64)
            sa_p = as_ptr + rows2 * stride_as  # the K loop's layout (N = 2 BN)
            gs_p = ws_ptr + expert * stride_wse + (off_n // 128) * stride_wsn
            us_p = gs_p + inter_blocks * stride_wsn
            act, d, c = _gate_up_pass(a_bufs, b_bufs, ready, empty, d, c, sa_p, gs_p, us_p,
                                      k_tiles, W, BN, STAGES, mma)
            tma.store_wait(pendings=0)
            cs = c_bufs.index(W)
            cs.store(act.to(c_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [off_m, off_n], cs)
        else:
            c = skip_steps(ready, empty, c, k_tiles, STAGES)
    tma.store_wait(pendings=0)


@gluon.jit
def _down_consumer(args, W: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                   GROUP_M: gl.constexpr, EVERY_HALF: gl.constexpr):
    """Consumer warp group ``W`` of :func:`_down_kernel` (``args``: that kernel's tuple, the
    same for both groups)."""
    (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, topk_w_ptr, sorted_ids_ptr, as_ptr, ws_ptr,
     expert_ids_ptr, num_post_ptr, grid_n, k_tiles, stride_as, stride_wse, stride_wsn,
     num_pairs) = args
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BN, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    d = gl.zeros([HALFC, BN], gl.float32, mma)
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
            # rows in aligned order through TMA (padding rows: weight 0); moe_sum maps pairs
            tma.store_wait(pendings=0)
            cs = c_bufs.index(W)
            cs.store((acc * gl.expand_dims(wt, 1)).to(c_desc.dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(c_desc, [off_m, off_n], cs)
        else:
            c = skip_steps(ready, empty, c, k_tiles, STAGES)
    tma.store_wait(pendings=0)


@gluon.jit
def _gate_up_kernel(a_desc, b_desc, c_desc, as_ptr, ws_ptr, sorted_ids_ptr, expert_ids_ptr,
                    num_post_ptr, num_pairs, inter, hidden, stride_as, stride_wse, stride_wsn,
                    BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                    EVERY_HALF: gl.constexpr = True):
    a_bufs, b_bufs, ready, empty = stage_ring(a_desc, b_desc, STAGES, 2 * BN)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2, 64, BN], c_desc.layout)
    grid_n = inter // BN
    k_tiles = hidden // 128
    inter_blocks = inter // 128
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    GU: gl.constexpr = True
    args = (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr, sorted_ids_ptr,
            expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles, stride_as, stride_wse,
            stride_wsn, inter_blocks)
    gl.warp_specialize([
        (_gate_up_consumer, (args, WG0, BN, STAGES, GROUP_M, EVERY_HALF)),
        (_gate_up_consumer, (args, WG1, BN, STAGES, GROUP_M, EVERY_HALF)),
        (loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, sorted_ids_ptr,
                  expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles, 2 * inter, inter,
                  BN, STAGES, GROUP_M, GU)),
    ], [4, 1], [MMA_REGS, LOAD_REGS])


@gluon.jit
def _down_kernel(a_desc, b_desc, c_desc, topk_w_ptr, sorted_ids_ptr, as_ptr, ws_ptr,
                expert_ids_ptr, num_post_ptr, hidden, inter, stride_as, stride_wse, stride_wsn,
                num_pairs, BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                EVERY_HALF: gl.constexpr = True):
    a_bufs, b_bufs, ready, empty = stage_ring(a_desc, b_desc, STAGES, BN)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2, 64, BN], c_desc.layout)
    grid_n = hidden // BN
    k_tiles = inter // 128
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    GU: gl.constexpr = False
    args = (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, topk_w_ptr, sorted_ids_ptr, as_ptr,
            ws_ptr, expert_ids_ptr, num_post_ptr, grid_n, k_tiles, stride_as, stride_wse,
            stride_wsn, num_pairs)
    gl.warp_specialize([
        (_down_consumer, (args, WG0, BN, STAGES, GROUP_M, EVERY_HALF)),
        (_down_consumer, (args, WG1, BN, STAGES, GROUP_M, EVERY_HALF)),
        (loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, sorted_ids_ptr,
                  expert_ids_ptr, num_post_ptr, num_pairs, grid_n, k_tiles, hidden, 0, BN,
                  STAGES, GROUP_M, GU)),
    ], [4, 1], [MMA_REGS, LOAD_REGS])


#: The promoted kernels' launchers (``moerun._triton.launch``: the compiled handle cached per
#: specialisation, the TMA descriptors keyed by box and layout).
_GATE_UP = FastLauncher(_gate_up_kernel)
_DOWN = FastLauncher(_down_kernel)


def run_experts_fp8_ws(x: torch.Tensor | QuantizedRows, w13: torch.Tensor, w2: torch.Tensor,
                       w13_scale: torch.Tensor, w2_scale: torch.Tensor,
                       topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                       gate_up_cols: int, down_cols: int, gate_up_stages: int,
                       down_stages: int, group_m: int, out_dtype: torch.dtype,
                       skip_padding: bool = False) -> torch.Tensor:
    """``out[t] = sum_j w[t, j] * expert_{ids[t, j]}(x[t])`` through the Gluon kernels.

    ``x [M, H]`` in ``out_dtype`` (fp16/bf16) or :class:`QuantizedRows`; ``w13 [S, 2I, H]`` /
    ``w2 [S, H, I]`` e4m3 contiguous with fp32 ``[S, 2I/128, H/128]`` / ``[S, H/128, I/128]``
    block scales; ``topk_ids [M, K]`` int32 contiguous (``-1`` skipped), ``topk_weights
    [M, K]`` fp32 contiguous. ``gate_up_cols`` 64 or 128 and ``down_cols`` 128 or 256 pick
    the forms (module docstring; 256 needs ``H % 256 == 0``); stages at most
    ``config_types.WS_MAX_STAGES`` of the tile's weight rows; ``skip_padding``
    (``ExpertsConfig.skip_padding``): a consumer whose 64 rows are all padding skips its K
    loop, else it runs it and writes padding rows nothing reads. Returns ``[M, H]``
    ``out_dtype``. 7 to 9 launches: the quantization unless given, the alignment (one kernel,
    plus its counters' memset where it runs on several programs), the two gathers (codes,
    scales), gate/up, the intermediate's quantization (64 columns only), down, the sum;
    current stream; no host sync; capturable (the TMA descriptors are launch arguments, by
    value). Shapes, dtypes, scale layouts and the
    knobs are checked first (``fp8_checks``; ValueError naming the argument)."""
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum
    from moerun.backends.triton.fp8_checks import check_w2_fp8, check_w13_fp8
    from moerun.backends.triton.fp8_quant import gather_rows_fp8, quantize_rows_fp8
    from moerun.backends.triton.fp8_ws_carry import DOWN_CARRY, GATE_UP_CARRY

    if out_dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"out_dtype={out_dtype}: the ws fp8 kernels write fp16 or bf16")
    if gate_up_cols not in WS_GATE_UP_COLS:
        raise ValueError(f"gate_up_cols={gate_up_cols!r}: use 64 (the intermediate quantized "
                         "after) or 128 (256-row weight tiles, quantized in the epilogue)")
    if down_cols not in WS_DOWN_COLS:
        raise ValueError(f"down_cols={down_cols!r}: use 128 or 256")
    for name, st, rows in (("gate_up_stages", gate_up_stages, 2 * gate_up_cols),
                           ("down_stages", down_stages, down_cols)):
        if not 2 <= st <= WS_MAX_STAGES[rows]:
            raise ValueError(f"{name}={st!r}: use 2..{WS_MAX_STAGES[rows]} with a {rows}-row "
                             "weight tile (shared memory)")
    check_w13_fp8(x.data if isinstance(x, QuantizedRows) else x, w13, w13_scale)
    check_w2_fp8(torch.empty(0, w13.shape[1] // 2, device="meta"), w2, w2_scale)
    if w2.shape[1] % down_cols:
        raise ValueError(f"down_cols={down_cols} must divide the hidden size {w2.shape[1]}; "
                         "use 128")
    q = x if isinstance(x, QuantizedRows) else quantize_rows_fp8(x)
    m, h = q.data.shape
    s, two_i, _ = w13.shape
    inter = two_i // 2
    k = topk_ids.shape[1]
    p = m * k
    dev = q.data.device
    align = moe_align(topk_ids, s, WS_BLOCK_M)
    sid = align.sorted_ids
    gathered = gather_rows_fp8(q, align, k)
    g, pair_rows = gathered.rows, gathered.pair_rows
    r = sid.numel()
    every = not skip_padding
    grid = (sm_count(dev),)
    gu_w = tma_desc(w13.view(s * two_i, h), [gate_up_cols, 128])
    if gate_up_cols == 128:  # carried: e4m3 and scales out of the epilogue
        qa = torch.empty(r, inter, device=dev, dtype=FP8_DTYPE)
        qa_s = torch.empty(r, inter // 128, device=dev, dtype=torch.float32)
        GATE_UP_CARRY(
            grid,
            tma_desc(g.data, [64, 128]), gu_w, tma_desc(qa, [64, 128]), g.scale, w13_scale, qa_s,
            sid, align.expert_ids, align.num_post, p, inter, h, g.scale.stride(0),
            w13_scale.stride(0), w13_scale.stride(1), qa_s.stride(0), gate_up_stages, group_m,
            1 if out_dtype == torch.float16 else 2, every, num_warps=4)
    else:
        act = torch.empty(r, inter, device=dev, dtype=out_dtype)
        _GATE_UP(
            grid,
            tma_desc(g.data, [64, 128]), gu_w, tma_desc(act, [64, 64]), g.scale, w13_scale, sid,
            align.expert_ids, align.num_post, p, inter, h, g.scale.stride(0),
            w13_scale.stride(0), w13_scale.stride(1), 64, gate_up_stages, group_m, every,
            num_warps=4)
        iq = quantize_rows_fp8(act)
        qa, qa_s = iq.data, iq.scale
    y = torch.empty(r, h, device=dev, dtype=out_dtype)  # aligned order
    a_desc = tma_desc(qa, [64, 128])
    dn_w = tma_desc(w2.view(s * h, inter), [down_cols, 128])
    if down_cols == 256:  # carried; 4 stages leave room for a [64, 128] store buffer only
        split = down_stages > 3
        DOWN_CARRY(
            grid,
            a_desc, dn_w, tma_desc(y, [64, 128 if split else 256]), topk_weights, sid, qa_s,
            w2_scale, align.expert_ids, align.num_post, h, inter, qa_s.stride(0),
            w2_scale.stride(0), w2_scale.stride(1), p, down_stages, group_m, split, every,
            num_warps=4)
    else:
        _DOWN(
            grid,
            a_desc, dn_w, tma_desc(y, [64, 128]), topk_weights, sid, qa_s, w2_scale,
            align.expert_ids, align.num_post, h, inter, qa_s.stride(0), w2_scale.stride(0),
            w2_scale.stride(1), p, 128, down_stages, group_m, every, num_warps=4)
    return moe_sum(y, topk_ids, s, rows=pair_rows)
