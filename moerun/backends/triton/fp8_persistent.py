"""Persistent block-scaled FP8 grouped GEMMs with TMA weights: the prefill kernels of the fp8
path (issue 12; an fp8 ``ExpertsConfig`` with ``kernel="persistent"``).

Legend as ``fp8.py``: ``M`` rows, ``K`` top-k, ``H`` hidden, ``I`` intermediate, ``S`` slots,
``R`` aligned rows, ``G = 128`` the quantization group and K tile.

The math of ``fp8.gate_up_fp8`` / ``fp8.down_fp8`` (their torch twins, ``moerun.quant``, are
these kernels' twins too), the schedule of ``persistent.py``:

* ``G_prog <= #SMs`` programs loop over the output tiles in use (``num_post / BM`` blocks,
  read on the device), in ``GROUP_M`` order so one expert's weight tiles stay in L2;
* the e4m3 weights through device-side TMA descriptors over the 3-D ``[S, 2I, H]`` /
  ``[S, H, I]`` tensors (``[1, BN, G]`` boxes); their fp32 block scales and the activation
  scales by pointer (one value per row / column per K step);
* gate/up: A = the pre-quantized activation rows (``QuantizedRows``: prefill sizes quantize
  ``x`` first), gathered by pointer; each K step ``acc += dot(a, w) * a_scale * w_scale``;
  ``silu(gate) * up`` in the epilogue, written as e4m3 + per-row group scales when a tile is
  one group (``BN == G``), else in the activation dtype;
* down: A = that intermediate through a TMA descriptor (e4m3 with its scales, or the
  activation dtype quantized in registers per 128-column group); routing weight in the
  epilogue; per-pair rows for ``combine.moe_sum`` (``combine="reduce"`` only).

TMA needs 16-byte aligned bases and row strides (H and I are multiples of 128 here, so only
the bases matter); :func:`run_persistent_fp8` returns None otherwise and the caller runs the
grouped fp8 kernels. No host sync; current stream; capture-safe (descriptor scratch from
torch's allocator, see ``FastLauncher``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moerun._triton.compat import patch_interpreter
from moerun._triton.launch import FastLauncher, cdiv
from moerun.backends.triton.align import Alignment
from moerun.backends.triton.configs import FP8_GROUP, DownConfig, GateUpConfig
from moerun.backends.triton.fp8 import _MID, _quantize_tile, _round_to
from moerun.backends.triton.gate_up import grouped_pid
from moerun.backends.triton.persistent import persistent_programs, tma_compatible
from moerun.quant import AMAX_EPS, FP8_DTYPE, FP8_MAX, QuantizedRows

patch_interpreter()

__all__ = ["gate_up_fp8_persistent", "down_fp8_persistent", "run_persistent_fp8"]

GROUP = FP8_GROUP


# ---------------------------------------------------------------- kernels
@triton.jit(do_not_specialize=["num_pairs", "num_slots", "num_programs"])
def _gate_up_fp8_persistent_kernel(
    x_ptr,  # [M, H] e4m3 (pre-quantized rows)
    xs_ptr,  # [M, H/G] fp32
    w_ptr,  # [S, 2I, H] e4m3
    ws_ptr,  # [S, 2I/G, H/G] fp32
    act_ptr,  # [R, I] out: e4m3 (OUT_FP8) or the activation dtype
    acts_ptr,  # [R, I/G] fp32 out (written iff OUT_FP8)
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    num_pairs, inter, hidden, num_slots, num_programs,
    stride_xm, stride_xsm, stride_we, stride_wn, stride_wse, stride_wsn, stride_am,
    stride_asm,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr,
    GROUP_M: tl.constexpr, OUT_FP8: tl.constexpr, MID: tl.constexpr, EPS: tl.constexpr,
    QMAX: tl.constexpr, NUM_STAGES: tl.constexpr, FLATTEN: tl.constexpr,
):
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[num_slots, 2 * inter, hidden],
                                       strides=[stride_we, stride_wn, 1],
                                       block_shape=[1, BLOCK_N, G])
    num_n = tl.cdiv(inter, BLOCK_N)
    used_blocks = tl.load(num_post_ptr) // BLOCK_M
    num_tiles = used_blocks * num_n
    k_tiles = hidden // G
    offs_k = tl.arange(0, G)
    for tile in tl.range(tl.program_id(0), num_tiles, num_programs, flatten=FLATTEN):
        pid_m, pid_n = grouped_pid(tile, used_blocks, num_n, GROUP_M)
        expert = tl.load(expert_ids_ptr + pid_m)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        n0 = pid_n * BLOCK_N
        offs_n = n0 + tl.arange(0, BLOCK_N)
        pair = tl.load(sorted_ids_ptr + offs_m)
        row_ok = pair < num_pairs
        tok = (pair // TOP_K).to(tl.int64)
        a_ptrs = x_ptr + tok[:, None] * stride_xm + offs_k[None, :]
        as_ptrs = xs_ptr + tok * stride_xsm
        e64 = expert.to(tl.int64)
        gs_ptrs = ws_ptr + e64 * stride_wse + ((offs_n % inter) // G) * stride_wsn
        us_ptrs = gs_ptrs + (inter // G) * stride_wsn
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in tl.range(0, k_tiles, num_stages=NUM_STAGES):
            a = tl.load(a_ptrs + k * G, mask=row_ok[:, None], other=0.0)
            a_s = tl.load(as_ptrs + k, mask=row_ok, other=0.0)
            g = w_desc.load([expert, n0, k * G]).reshape(BLOCK_N, G)
            u = w_desc.load([expert, inter + n0, k * G]).reshape(BLOCK_N, G)
            g_s = tl.load(gs_ptrs + k)
            u_s = tl.load(us_ptrs + k)
            acc_g += tl.dot(a, g.T) * (a_s[:, None] * g_s[None, :])
            acc_u += tl.dot(a, u.T) * (a_s[:, None] * u_s[None, :])
        act = acc_g * tl.sigmoid(acc_g) * acc_u
        out_ptrs = act_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_n[None, :]
        if OUT_FP8:  # BLOCK_N == G: one group of each row; rounded like the bf16 path first
            act = _round_to(act, MID)
            q, a_scale = _quantize_tile(act, EPS, QMAX)
            tl.store(out_ptrs, q)
            tl.store(acts_ptr + offs_m.to(tl.int64) * stride_asm + pid_n, a_scale)
        else:
            tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty),
                     mask=(offs_n < inter)[None, :])


@triton.jit(do_not_specialize=["num_pairs", "max_rows", "num_slots", "num_programs"])
def _down_fp8_persistent_kernel(
    act_ptr,  # [R, I] e4m3 (A_FP8) or the activation dtype
    acts_ptr,  # [R, I/G] fp32 (read iff A_FP8)
    w_ptr,  # [S, H, I] e4m3
    ws_ptr,  # [S, H/G, I/G] fp32
    out_ptr,  # [M*K, H] per-pair rows
    topk_weights_ptr,  # [M*K] fp32
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    num_pairs, hidden, inter, max_rows, num_slots, num_programs,
    stride_am, stride_asm, stride_we, stride_wn, stride_wse, stride_wsn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, GROUP_M: tl.constexpr,
    A_FP8: tl.constexpr, EPS: tl.constexpr, QMAX: tl.constexpr, NUM_STAGES: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    a_desc = tl.make_tensor_descriptor(act_ptr, shape=[max_rows, inter], strides=[stride_am, 1],
                                       block_shape=[BLOCK_M, G])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[num_slots, hidden, inter],
                                       strides=[stride_we, stride_wn, 1],
                                       block_shape=[1, BLOCK_N, G])
    num_n = tl.cdiv(hidden, BLOCK_N)
    used_blocks = tl.load(num_post_ptr) // BLOCK_M
    num_tiles = used_blocks * num_n
    k_tiles = inter // G
    for tile in tl.range(tl.program_id(0), num_tiles, num_programs, flatten=FLATTEN):
        pid_m, pid_n = grouped_pid(tile, used_blocks, num_n, GROUP_M)
        expert = tl.load(expert_ids_ptr + pid_m)
        row0 = pid_m * BLOCK_M
        offs_m = row0 + tl.arange(0, BLOCK_M)
        n0 = pid_n * BLOCK_N
        offs_n = n0 + tl.arange(0, BLOCK_N)
        as_ptrs = acts_ptr + offs_m.to(tl.int64) * stride_asm
        bs_ptrs = ws_ptr + expert.to(tl.int64) * stride_wse + \
            ((offs_n % hidden) // G) * stride_wsn
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in tl.range(0, k_tiles, num_stages=NUM_STAGES):
            if A_FP8:
                a = a_desc.load([row0, k * G])
                a_s = tl.load(as_ptrs + k)
            else:
                a, a_s = _quantize_tile(a_desc.load([row0, k * G]).to(tl.float32), EPS, QMAX)
            b = w_desc.load([expert, n0, k * G]).reshape(BLOCK_N, G)
            b_s = tl.load(bs_ptrs + k)
            acc += tl.dot(a, b.T) * (a_s[:, None] * b_s[None, :])
        pair = tl.load(sorted_ids_ptr + offs_m)
        row_ok = pair < num_pairs
        w = tl.load(topk_weights_ptr + pair, mask=row_ok, other=0.0)
        acc = acc * w[:, None]
        dst = out_ptr + pair[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        tl.store(dst, acc.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_n < hidden)[None, :])


_GATE_UP = FastLauncher(_gate_up_fp8_persistent_kernel)
_DOWN = FastLauncher(_down_fp8_persistent_kernel)


# ---------------------------------------------------------------- launchers
def gate_up_fp8_persistent(x: QuantizedRows, w13: torch.Tensor, w13_scale: torch.Tensor,
                           align: Alignment, top_k: int, cfg: GateUpConfig,
                           out_dtype: torch.dtype, *, fp8_out: bool = False,
                           programs: int = 0) -> torch.Tensor | QuantizedRows:
    """:func:`~moerun.backends.triton.fp8.gate_up_fp8` for pre-quantized rows as a persistent
    kernel with TMA weights (same result, same ``act`` layout).

    Args:
        x: ``QuantizedRows`` ``[M, H]`` e4m3 + ``[M, H/128]`` fp32 scales.
        w13: ``[S, 2I, H]`` e4m3, TMA-compatible; ``w13_scale [S, 2I/128, H/128]`` fp32.
        align, top_k, cfg (``block_k`` ignored: 128), out_dtype, fp8_out: as ``gate_up_fp8``.
        programs: persistent programs (0: the SM count).

    Returns ``act [R, I]`` (rows of unused blocks unwritten), or ``QuantizedRows`` with
    ``fp8_out``. One launch; current stream; no host sync.
    """
    if not isinstance(x, QuantizedRows):
        raise ValueError("gate_up_fp8_persistent takes pre-quantized rows (QuantizedRows)")
    xd, xs = x.data, x.scale
    m, h = xd.shape
    s, two_i, h2 = w13.shape
    inter = two_i // 2
    if h2 != h or w13.dtype != FP8_DTYPE or not tma_compatible(w13) or h % GROUP or \
            inter % GROUP:
        raise ValueError(f"w13 {tuple(w13.shape)} {w13.dtype} must be [S, 2I, {h}] {FP8_DTYPE},"
                         f" TMA-compatible, H and I multiples of {GROUP}")
    if tuple(w13_scale.shape) != (s, two_i // GROUP, h // GROUP) or \
            w13_scale.dtype != torch.float32 or w13_scale.stride(2) != 1:
        raise ValueError(f"w13_scale {list(w13_scale.shape)} {w13_scale.dtype} must be "
                         f"[{s}, {two_i // GROUP}, {h // GROUP}] float32")
    if xd.stride(1) != 1 or xs.stride(1) != 1 or align.num_pairs != m * top_k:
        raise ValueError(f"x needs contiguous last dims and {align.num_pairs} = {m}*{top_k} "
                         "pairs")
    if out_dtype not in _MID:
        raise ValueError(f"out_dtype={out_dtype}: use fp32, fp16 or bf16")
    if fp8_out and cfg.block_n != GROUP:
        raise ValueError(f"fp8_out needs cfg.block_n == {GROUP}, got {cfg.block_n}")
    rows = align.max_blocks * align.block_m
    out = torch.empty((rows, inter), dtype=FP8_DTYPE if fp8_out else out_dtype,
                      device=xd.device)
    scale = torch.empty((rows, inter // GROUP), dtype=torch.float32, device=xd.device) \
        if fp8_out else out
    g = persistent_programs(align.max_blocks * cdiv(inter, cfg.block_n), xd.device, programs)
    _GATE_UP(
        (g,),
        xd, xs, w13, w13_scale, out, scale, align.sorted_ids, align.expert_ids,
        align.num_post,
        align.num_pairs, inter, h, s, g,
        xd.stride(0), xs.stride(0), w13.stride(0), w13.stride(1), w13_scale.stride(0),
        w13_scale.stride(1), out.stride(0), scale.stride(0),
        # TOP_K, BLOCK_M, BLOCK_N, G, GROUP_M, OUT_FP8, MID, EPS, QMAX, NUM_STAGES, FLATTEN
        top_k, align.block_m, cfg.block_n, GROUP, cfg.group_m, fp8_out, _MID[out_dtype],
        AMAX_EPS, FP8_MAX, cfg.num_stages, cfg.flatten,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return QuantizedRows(data=out, scale=scale, group=GROUP) if fp8_out else out


def down_fp8_persistent(act: torch.Tensor | QuantizedRows, w2: torch.Tensor,
                        w2_scale: torch.Tensor, align: Alignment, topk_weights: torch.Tensor,
                        top_k: int, cfg: DownConfig, out_dtype: torch.dtype, *,
                        programs: int = 0) -> torch.Tensor:
    """:func:`~moerun.backends.triton.fp8.down_fp8` (per-pair rows, no split-K) as a
    persistent kernel with TMA for the intermediate and the weights.

    Args:
        act: ``[R, I]`` from a gate/up kernel: e4m3 ``QuantizedRows`` or the activation
            dtype (quantized in registers per 128-column group); TMA-compatible.
        w2: ``[S, H, I]`` e4m3, TMA-compatible; ``w2_scale [S, H/128, I/128]`` fp32.
        align, topk_weights (``[M, K]`` fp32 contiguous), top_k: as ``down_fp8``.
        cfg: tile (``block_k`` ignored: 128; ``split_k`` must be 1). out_dtype: of the rows.
        programs: persistent programs (0: the SM count).

    Returns ``y [M*K, H]`` in ``out_dtype`` (rows of excluded pairs unwritten). One launch;
    current stream; no host sync.
    """
    a_fp8 = isinstance(act, QuantizedRows)
    ad = act.data if a_fp8 else act
    asc = act.scale if a_fp8 else ad  # unread when not a_fp8
    rows, inter = ad.shape
    s, h, i2 = w2.shape
    if i2 != inter or w2.dtype != FP8_DTYPE or not tma_compatible(ad, w2) or h % GROUP or \
            inter % GROUP:
        raise ValueError(f"w2 {tuple(w2.shape)} {w2.dtype} must be [S, H, {inter}] {FP8_DTYPE}; "
                         f"act and w2 TMA-compatible, H and I multiples of {GROUP}")
    if tuple(w2_scale.shape) != (s, h // GROUP, inter // GROUP) or \
            w2_scale.dtype != torch.float32 or w2_scale.stride(2) != 1:
        raise ValueError(f"w2_scale {list(w2_scale.shape)} {w2_scale.dtype} must be "
                         f"[{s}, {h // GROUP}, {inter // GROUP}] float32")
    if topk_weights.dtype != torch.float32 or not topk_weights.is_contiguous() or \
            topk_weights.numel() != align.num_pairs:
        raise ValueError("topk_weights must be a contiguous fp32 [M, K] tensor")
    if cfg.split_k != 1:
        raise ValueError(f"down_fp8_persistent: split_k={cfg.split_k} unsupported (use 1)")
    if rows != align.max_blocks * align.block_m:
        raise ValueError(f"act has {rows} rows, the alignment {align.max_blocks * align.block_m}")
    out = torch.empty((align.num_pairs, h), dtype=out_dtype, device=ad.device)
    g = persistent_programs(align.max_blocks * cdiv(h, cfg.block_n), ad.device, programs)
    _DOWN(
        (g,),
        ad, asc, w2, w2_scale, out, topk_weights, align.sorted_ids, align.expert_ids,
        align.num_post,
        align.num_pairs, h, inter, rows, s, g,
        ad.stride(0), asc.stride(0), w2.stride(0), w2.stride(1), w2_scale.stride(0),
        w2_scale.stride(1), out.stride(0),
        # BLOCK_M, BLOCK_N, G, GROUP_M, A_FP8, EPS, QMAX, NUM_STAGES, FLATTEN
        align.block_m, cfg.block_n, GROUP, cfg.group_m, a_fp8, AMAX_EPS, FP8_MAX,
        cfg.num_stages, cfg.flatten,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def run_persistent_fp8(x: QuantizedRows, w13: torch.Tensor, w2: torch.Tensor,
                       w13_scale: torch.Tensor, w2_scale: torch.Tensor,
                       topk_weights: torch.Tensor, topk_ids: torch.Tensor, cfg,
                       out_dtype: torch.dtype) -> torch.Tensor | None:
    """``fp8.run_experts_fp8`` for a ``kernel="persistent"`` config on pre-quantized rows:
    align, persistent gate/up, persistent down, ``moe_sum`` (4 launches); None when a base
    is not 16-byte aligned (the caller runs the grouped fp8 kernels)."""
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum
    from moerun.backends.triton.configs import fp8_intermediate

    if not tma_compatible(w13, w2):
        return None
    s, k = w13.shape[0], topk_ids.shape[1]
    align = moe_align(topk_ids, s, cfg.block_m)
    act = gate_up_fp8_persistent(x, w13, w13_scale, align, k, cfg.gate_up, out_dtype,
                                 fp8_out=fp8_intermediate(cfg.block_m, cfg.gate_up),
                                 programs=cfg.programs)
    y = down_fp8_persistent(act, w2, w2_scale, align, topk_weights, k, cfg.down, out_dtype,
                            programs=cfg.programs)
    return moe_sum(y, topk_ids, s)
