"""Gate/up grouped GEMM with ``silu(gate) * up`` fused in the epilogue.

Legend: ``M`` tokens, ``K`` top-k, ``H`` hidden, ``I`` intermediate, ``S`` slots, ``BM`` rows
per block, ``R = max_blocks*BM`` aligned rows (see ``align.py``).

Program ``(m, n)`` owns aligned rows ``[m*BM, (m+1)*BM)`` (all routed to one slot ``e``) and
output columns ``[n*BN, (n+1)*BN)``. It gathers the rows' tokens from ``x``, and streams the
gate rows ``w13[e, n*BN:...]`` and the up rows ``w13[e, I + n*BN:...]`` side by side, so both
accumulators for the same columns live in registers and ``silu(g) * u`` is formed there. The
result is written in *aligned row order* (``act[R, I]``), so the down GEMM reads contiguous
rows. Padding rows load zeros and write zeros.

Fused shared expert (``SHARED > 0``): blocks of slots ``>= num_routed`` stream the shared
expert's own ``[2*Is, H]`` tensor instead (slot ``j``: gate rows ``j*I..``, up rows
``Is + j*I..``); ``SHARED = 1`` when ``Is == I`` (the up offset is the routed one),
``SHARED = 2`` otherwise. ``SHARED = 0`` compiles exactly the routed-only kernel.

Direct rows (``DIRECT = 1``, :func:`gate_up_direct`, the ``kernel="direct"`` decode path):
no alignment -- program ``(p, n)`` owns pair ``p`` alone (row 0 of its tile; the other rows
load nothing), reads its slot straight from ``topk_ids.flat[p]`` (excluded pairs write
nothing), multiplies ``silu(g) * u`` by the routing weight ``topk_weights.flat[p]`` and writes
row ``p`` of ``act [M*K, I]``, so the down kernel only sums.

Ordering: programs are grouped ``GROUP_M`` blocks at a time (m fastest inside a group) so the
blocks of one expert share weight tiles through L2; ``GROUP_M = 1`` puts every block's N
tiles together, which also leaves the unused blocks (past ``num_post``) at the grid's end.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moerun._triton.compat import patch_interpreter
from moerun._triton.launch import FastLauncher, cdiv, next_pow2
from moerun._triton.gdc import pdl_prologue

from moerun.backends.base import FusedShared
from moerun.backends.reference import slot_w13
from moerun.backends.triton.align import Alignment
from moerun.backends.triton.configs import GateUpConfig
from moerun.backends.triton.direct_tiles import direct_acc, direct_dot

patch_interpreter()

__all__ = ["gate_up", "gate_up_torch", "gate_up_direct", "gate_up_direct_torch",
           "dot_precision", "grouped_pid", "gate_up_acc"]


# ---------------------------------------------------------------- constants / config
def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: IEEE for fp32 (no TF32), the default otherwise. Pure."""
    return "ieee" if dtype == torch.float32 else "tf32"


#: Rows of the direct path's tile (one live row; the smallest ``tl.dot`` M).
DIRECT_BLOCK_M = 16


# ---------------------------------------------------------------- kernel
@triton.jit
def grouped_pid(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """``pid -> (pid_m, pid_n)``: ``GROUP_M`` m-blocks at a time, m fastest in a group.
    Device code (inlined into the calling kernel); no host effects."""
    in_group = GROUP_M * num_n
    group = pid // in_group
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    return pid_m, pid_n


@triton.jit
def gate_up_acc(a_ptrs, g_ptrs, u_ptrs, row_ok, hidden, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                PRECISION: tl.constexpr, SWAP_AB: tl.constexpr):
    """The gate/up K loop of a row tile: ``(acc_g, acc_u)``, fp32 ``[BM, BN]``, the rows at
    ``a_ptrs`` (``[BM, BK]`` pointers; rows not ``row_ok`` read as zeros) times the gate and
    up weight tiles at ``g_ptrs`` / ``u_ptrs`` (``[BK, BN]``), over ``hidden`` in ``BK``
    steps (``EVEN_K``: ``hidden % BK == 0``, no K mask). ``SWAP_AB``: the products as
    ``w^T a^T`` into ``[BN, BM]`` accumulators (the weight rows on the MMA's M side: wgmmas
    on sm90 for ``BN`` >= 64 at a 16-row tile), transposed back at the end. Device code
    (inlined into the calling kernel): global loads only, no stores."""
    offs_k = tl.arange(0, BLOCK_K)
    acc_g = direct_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    acc_u = direct_acc(BLOCK_M, BLOCK_N, SWAP_AB)
    for k in range(0, tl.cdiv(hidden, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            g = tl.load(g_ptrs)
            u = tl.load(u_ptrs)
        else:
            k_ok = offs_k < hidden - k * BLOCK_K
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            g = tl.load(g_ptrs, mask=k_ok[:, None], other=0.0)
            u = tl.load(u_ptrs, mask=k_ok[:, None], other=0.0)
        acc_g = direct_dot(acc_g, a, g, PRECISION, SWAP_AB)
        acc_u = direct_dot(acc_u, a, u, PRECISION, SWAP_AB)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    if SWAP_AB:
        acc_g = tl.trans(acc_g)
        acc_u = tl.trans(acc_u)
    return acc_g, acc_u


@triton.jit(do_not_specialize=["num_pairs", "max_blocks"])
def _gate_up_kernel(
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
    SWAP_AB: tl.constexpr,  # gate_up_acc's: weights x rows^T
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
    offs_nw = offs_n % inter  # columns past I read valid rows; their results are dropped
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
    g_ptrs = w_base + offs_nw[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    u_ptrs = g_ptrs + up_rows * stride_wn

    acc_g, acc_u = gate_up_acc(a_ptrs, g_ptrs, u_ptrs, row_ok, hidden, BLOCK_M, BLOCK_N,
                               BLOCK_K, EVEN_K, PRECISION, SWAP_AB)
    act = acc_g * tl.sigmoid(acc_g) * acc_u  # silu(gate) * up, fp32
    out_ptrs = act_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_n[None, :]
    if DIRECT:
        act = act * tl.load(topk_weights_ptr + pid_m)
        tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_n < inter)[None, :])
    else:
        tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=(offs_n < inter)[None, :])


_LAUNCH = FastLauncher(_gate_up_kernel)


# ---------------------------------------------------------------- launcher
def gate_up(x: torch.Tensor, w13: torch.Tensor, align: Alignment, top_k: int,
            cfg: GateUpConfig, out: torch.Tensor | None = None,
            shared: FusedShared | None = None, swap_ab: bool = False) -> torch.Tensor:
    """``act[r] = silu(x[tok(r)] @ W_gate[e]^T) * (x[tok(r)] @ W_up[e]^T)`` per aligned row.

    Args:
        x: ``[M, H]`` fp32/fp16/bf16, last dim contiguous.
        w13: ``[S, 2I, H]`` same dtype, last dim contiguous (gate rows, then up rows).
        align: from :func:`moe_align` with ``M*K`` pairs.
        top_k: ``K``.
        cfg: tile (``block_m`` comes from ``align``).
        out: optional ``[max_blocks*BM, I]`` buffer (tests poison it).
        shared: the fused shared expert (slots ``S..S+n-1``; ``align`` built with ``S + n``
            slots).
        swap_ab: compute ``W x^T`` (``ExpertsConfig.swap_ab``; ``direct_tiles.py``): at
            ``block_m`` 16/32 a ``block_n`` of 64 or more then runs wgmmas on sm90.

    Returns: ``act [max_blocks*BM, I]`` x.dtype, rows in aligned order; rows of blocks past
    ``num_post`` are not written. One launch; current stream; no host sync.
    """
    _check_weights(x, w13, cfg)
    m, h = x.shape
    s, two_i, _ = w13.shape
    inter = two_i // 2
    if align.num_pairs != m * top_k:
        raise ValueError(f"alignment covers {align.num_pairs} pairs, expected {m}*{top_k}")
    rows = align.max_blocks * align.block_m
    if out is None:
        out = torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    elif out.shape != (rows, inter) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{rows}, {inter}] {x.dtype}")
    mode, sw13, s_inter = 0, w13, inter
    if shared is not None:
        sw13, s_inter = shared.w13, shared.w13.shape[0] // 2
        if sw13.dtype != x.dtype or sw13.shape[1] != h or sw13.stride(0) != w13.stride(1) \
                or sw13.stride(1) != 1 or shared.first_slot != s:
            raise ValueError(f"shared w13 {tuple(sw13.shape)} {sw13.dtype} must be [2*Is, {h}] "
                             f"{x.dtype}, contiguous, first_slot == S={s}")
        mode = 1 if s_inter == inter else 2
    grid = (align.max_blocks * cdiv(inter, cfg.block_n),)
    _LAUNCH(
        grid,
        x, w13, sw13, out, align.sorted_ids, align.expert_ids, align.num_post, x, x, 0,
        align.num_pairs, inter, h, align.max_blocks, s, s_inter,
        x.stride(0), w13.stride(0), w13.stride(1), out.stride(0),
        # TOP_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EVEN_K, PRECISION, SHARED, DIRECT, ZBLOCK,
        # SWAP_AB
        top_k, align.block_m, cfg.block_n, cfg.block_k, cfg.group_m, h % cfg.block_k == 0,
        dot_precision(x.dtype), mode, 0, 0, swap_ab,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


def _check_weights(x: torch.Tensor, w13: torch.Tensor, cfg: GateUpConfig) -> None:
    if cfg.paired:
        raise ValueError("GateUpConfig.paired is a tile of the fp8 kernels (fp8.gate_up_fp8); "
                         "the bf16/fp16 gate/up kernel has no paired form: drop paired=True")
    h = x.shape[1]
    two_i, h2 = w13.shape[1:]
    if h2 != h or two_i % 2 or w13.dtype != x.dtype:
        raise ValueError(f"w13 {tuple(w13.shape)} {w13.dtype} does not match x {tuple(x.shape)} "
                         f"{x.dtype}: expected [S, 2*I, {h}] {x.dtype}")
    if x.stride(1) != 1 or w13.stride(2) != 1:
        raise ValueError("x and w13 need a contiguous last dimension")


def gate_up_direct(x: torch.Tensor, w13: torch.Tensor, topk_ids: torch.Tensor,
                   topk_weights: torch.Tensor, cfg: GateUpConfig,
                   out: torch.Tensor | None = None,
                   zero: torch.Tensor | None = None, swap_ab: bool = False) -> torch.Tensor:
    """``act[p] = w_p * silu(x[t] @ W_gate[e]^T) * (x[t] @ W_up[e]^T)`` for every pair
    ``p = t*K + j`` with ``e = topk_ids[t, j]``, ``w_p = topk_weights[t, j]``, no alignment
    (the ``kernel="direct"`` decode path; one 16-row tile per pair, row 0 live).

    Args:
        x: ``[M, H]`` fp32/fp16/bf16, last dim contiguous. w13: ``[S, 2I, H]`` same dtype.
        topk_ids: ``[M, K]`` int32 contiguous (``-1`` / ``>= S``: excluded, row not written).
        topk_weights: ``[M, K]`` fp32 contiguous. cfg: the tile (``block_m`` is 16).
        out: optional ``[M*K, I]`` buffer (tests poison it).
        zero: optional contiguous int32 buffer the launch also zeroes (the arrival counters
            of :func:`~moerun.backends.triton.down.down_direct`'s pair-parallel form), so
            they cost no launch of their own.
        swap_ab: compute ``W x^T`` (``ExpertsConfig.swap_ab``): the tile's weight rows on
            the MMA's M side, so on sm90 a ``block_n`` of 64 or 128 runs wgmmas.

    Returns: ``act [M*K, I]`` x.dtype; rows of excluded pairs are not written. One launch;
    current stream; no host sync; capture-safe.
    """
    _check_weights(x, w13, cfg)
    m, h = x.shape
    s, two_i, _ = w13.shape
    inter = two_i // 2
    pairs = topk_ids.numel()
    if topk_ids.dim() != 2 or topk_ids.shape[0] != m or topk_ids.dtype != torch.int32 \
            or not topk_ids.is_contiguous():
        raise ValueError(f"topk_ids must be a contiguous int32 [{m}, K] tensor")
    if topk_weights.shape != topk_ids.shape or topk_weights.dtype != torch.float32 or \
            not topk_weights.is_contiguous():
        raise ValueError(f"topk_weights must be a contiguous fp32 {tuple(topk_ids.shape)} "
                         "tensor")
    if out is None:
        out = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    elif out.shape != (pairs, inter) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{pairs}, {inter}] {x.dtype}")
    if zero is not None and (zero.dtype != torch.int32 or not zero.is_contiguous()):
        raise ValueError("zero must be a contiguous int32 tensor")
    if pairs == 0:
        return out
    programs = pairs * cdiv(inter, cfg.block_n)
    znum = 0 if zero is None else zero.numel()
    zblock = max(16, next_pow2(cdiv(znum, programs))) if znum else 0
    _LAUNCH(
        (programs,),
        x, w13, w13, out, topk_ids, topk_ids, topk_ids, topk_weights,
        x if zero is None else zero, znum,
        pairs, inter, h, pairs, s, inter,
        x.stride(0), w13.stride(0), w13.stride(1), out.stride(0),
        topk_ids.shape[1], DIRECT_BLOCK_M, cfg.block_n, cfg.block_k, 1, h % cfg.block_k == 0,
        dot_precision(x.dtype), 0, 1, zblock, swap_ab,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out


# ---------------------------------------------------------------- torch twin
def gate_up_torch(x: torch.Tensor, w13: torch.Tensor, align: Alignment,
                  top_k: int, shared: FusedShared | None = None) -> torch.Tensor:
    """Pure-torch twin of :func:`gate_up` (fp32 math, one loop step per block; a host sync
    per block to pick the slot's weights).

    Rows of blocks past ``num_post`` are zero here (the kernel leaves them unwritten).
    """
    m, h = x.shape
    inter = w13.shape[1] // 2
    bm = align.block_m
    out = torch.zeros(align.max_blocks * bm, inter, dtype=x.dtype, device=x.device)
    xf = torch.cat([x.float(), x.new_zeros(1, h, dtype=torch.float32)])  # row M = padding
    for b in range(align.max_blocks):
        rows = align.sorted_ids[b * bm:(b + 1) * bm].long()
        tok = torch.where(rows < align.num_pairs, rows // top_k, torch.full_like(rows, m))
        e = int(align.expert_ids[b].clamp(min=0))  # NOTE: host sync (twin only)
        gu = xf[tok] @ slot_w13(e, w13, shared).float().t()
        act = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        live = (align.expert_ids[b] >= 0) & (b * bm < align.num_post[0])
        out[b * bm:(b + 1) * bm] = torch.where(live, act, torch.zeros_like(act)).to(x.dtype)
    return out


def gate_up_direct_torch(x: torch.Tensor, w13: torch.Tensor, topk_ids: torch.Tensor,
                         topk_weights: torch.Tensor) -> torch.Tensor:
    """Pure-torch twin of :func:`gate_up_direct` (fp32 math, x.dtype result); rows of excluded
    pairs are zero here (the kernel leaves them unwritten)."""
    m, h = x.shape
    s, two_i, _ = w13.shape
    inter = two_i // 2
    ids = topk_ids.reshape(-1).long()
    ok = (ids >= 0) & (ids < s)
    w = w13[ids.clamp(0, max(s - 1, 0))].float()  # [P, 2I, H]
    xt = x.float().repeat_interleave(topk_ids.shape[1], dim=0)  # [P, H]
    gu = torch.einsum("ph,pnh->pn", xt, w)
    act = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
    act = act * topk_weights.reshape(-1, 1).float()
    return torch.where(ok[:, None], act, torch.zeros_like(act)).to(x.dtype)
