"""The shared expert's SwiGLU MLP plus the routed output, as two Triton launches (decode).

Legend: ``T`` rows, ``H`` hidden, ``Is`` shared intermediate.

    act = silu(x @ Wg^T) * (x @ Wu^T)          [T, Is]   launch 1 (``w13 [2*Is, H]``)
    y   = round(act @ W2^T) + routed           [T, H]    launch 2 (``w2 [H, Is]``)

A decode step is host-bound: the torch form (``SharedExpert.add_to``: two cuBLAS GEMMs,
``chunk``, ``silu``, ``mul_``, ``add_``) costs six torch ops of host time per forward, the
cuBLAS ones the dearest. These two kernels read every weight byte once, like the routed
decode kernels. The shared output is rounded to x.dtype before the add, as the Hugging Face
blocks round it, so the result matches ``SharedExpert.add_to`` to the GEMM's rounding.

Kernels per T (``dense_config``): ``T == 1`` a GEMV (broadcast-multiply-reduce, no
tensor-core tile to pad, 8-16 columns per program so the grid has hundreds of programs);
``T > 1`` ``tl.dot`` tiles of 16 rows (up to :data:`MAX_DENSE_ROWS`). Only the ungated shared expert (DeepSeek-V3 style)
is served here; :meth:`TritonExperts.shared_mlp_add` keeps the torch form otherwise.

Above :data:`MAX_DENSE_ROWS` cuBLAS runs the two GEMMs (:func:`shared_mlp_add_gemm`) and one
launch of :func:`silu_mul` replaces the torch form's ``chunk``, ``silu`` and ``mul_`` (four
ops instead of six, rounded as the torch form rounds: silu's output to x.dtype, then the
product).

Torch twins: :func:`shared_mlp_add_torch`, :func:`silu_mul_torch`. No host sync; capture-safe;
current stream.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from moerun._triton.compat import patch_interpreter
from moerun._triton.launch import FastLauncher, cdiv
from moerun._triton.gdc import pdl_prologue
from moerun.backends.triton.gate_up import dot_precision, gate_up_acc

patch_interpreter()

__all__ = ["DenseConfig", "dense_config", "shared_mlp_add", "shared_mlp_add_torch",
           "shared_mlp_add_gemm", "silu_mul", "silu_mul_torch", "MAX_DENSE_ROWS"]

SILU_BLOCK = 1024  # columns per silu_mul program

#: Up to this many rows the kernels serve the shared expert; above it cuBLAS does. Measured
#: on the H200 (``benchmarks/dense_probe.py``, DeepSeek-V3's 7168 x 2048 shared expert,
#: graph replay): 1.03x cuBLAS at T=1, 0.90-0.92x at T=2-16, 1.05-1.26x at T=32-128, and
#: 51 against 120 µs of host time per call at every T.
MAX_DENSE_ROWS = 16


@dataclasses.dataclass(frozen=True, kw_only=True)
class DenseConfig:
    """Tiles of the two dense launches (``block_m == 1``: the GEMV form)."""

    block_m: int
    gate_up_n: int
    down_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


def dense_config(rows: int) -> DenseConfig:
    """The tiles for ``rows`` rows (host-only, pure)."""
    if rows <= 1:
        return DenseConfig(block_m=1, gate_up_n=8, down_n=16, block_k=256, num_warps=4,
                           num_stages=3)
    bm = 16 if rows <= 16 else (32 if rows <= 32 else 64)
    return DenseConfig(block_m=bm, gate_up_n=32, down_n=32, block_k=128, num_warps=4,
                       num_stages=4)


# ---------------------------------------------------------------- kernels
@triton.jit(do_not_specialize=["rows"])
def _dense_gate_up_kernel(
    x_ptr, w13_ptr, act_ptr,  # [T, H], [2*Is, H], [T, Is] out
    rows, inter, hidden, stride_xm, stride_wn, stride_am,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_nw = offs_n % inter  # columns past Is read valid rows; their results are dropped
    offs_k = tl.arange(0, BLOCK_K)
    g_ptrs = w13_ptr + offs_nw[None, :].to(tl.int64) * stride_wn + offs_k[:, None]  # [BK, BN]
    u_ptrs = g_ptrs + inter * stride_wn
    if BLOCK_M == 1:  # GEMV: one row, weights as [BK, BN] tiles reduced over k
        a_ptrs = x_ptr + pid_m.to(tl.int64) * stride_xm + offs_k
        acc_g = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k in range(0, tl.cdiv(hidden, BLOCK_K)):
            if EVEN_K:
                a = tl.load(a_ptrs)
                g = tl.load(g_ptrs)
                u = tl.load(u_ptrs)
            else:
                k_ok = offs_k < hidden - k * BLOCK_K
                a = tl.load(a_ptrs, mask=k_ok, other=0.0)
                g = tl.load(g_ptrs, mask=k_ok[:, None], other=0.0)
                u = tl.load(u_ptrs, mask=k_ok[:, None], other=0.0)
            af = a.to(tl.float32)[:, None]
            acc_g += tl.sum(af * g.to(tl.float32), axis=0)
            acc_u += tl.sum(af * u.to(tl.float32), axis=0)
            a_ptrs += BLOCK_K
            g_ptrs += BLOCK_K
            u_ptrs += BLOCK_K
        act = acc_g * tl.sigmoid(acc_g) * acc_u
        tl.store(act_ptr + pid_m.to(tl.int64) * stride_am + offs_n,
                 act.to(act_ptr.dtype.element_ty), mask=offs_n < inter)
    else:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < rows
        a_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
        acc_g, acc_u = gate_up_acc(a_ptrs, g_ptrs, u_ptrs, row_ok, hidden, BLOCK_M, BLOCK_N,
                                   BLOCK_K, EVEN_K, PRECISION, False)
        act = acc_g * tl.sigmoid(acc_g) * acc_u
        out_ptrs = act_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_n[None, :]
        tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_n < inter)[None, :])


@triton.jit(do_not_specialize=["rows"])
def _dense_down_add_kernel(
    act_ptr, w2_ptr, routed_ptr, out_ptr,  # [T, Is], [H, Is], [T, H], [T, H] out
    rows, hidden, inter, stride_am, stride_wn, stride_rm, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < hidden
    offs_nw = offs_n % hidden
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w2_ptr + offs_nw[None, :].to(tl.int64) * stride_wn + offs_k[:, None]  # [BK, BN]
    if BLOCK_M == 1:
        a_ptrs = act_ptr + pid_m.to(tl.int64) * stride_am + offs_k
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k in range(0, tl.cdiv(inter, BLOCK_K)):
            if EVEN_K:
                a = tl.load(a_ptrs)
                w = tl.load(w_ptrs)
            else:
                k_ok = offs_k < inter - k * BLOCK_K
                a = tl.load(a_ptrs, mask=k_ok, other=0.0)
                w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
            acc += tl.sum(a.to(tl.float32)[:, None] * w.to(tl.float32), axis=0)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        row = pid_m.to(tl.int64)
        routed = tl.load(routed_ptr + row * stride_rm + offs_n, mask=n_ok, other=0.0)
        y = acc.to(out_ptr.dtype.element_ty).to(tl.float32) + routed.to(tl.float32)
        tl.store(out_ptr + row * stride_om + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_ok)
    else:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < rows
        a_ptrs = act_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, tl.cdiv(inter, BLOCK_K)):
            if EVEN_K:
                a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
                w = tl.load(w_ptrs)
            else:
                k_ok = offs_k < inter - k * BLOCK_K
                a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
            acc = tl.dot(a, w, acc, input_precision=PRECISION)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        rows64 = offs_m[:, None].to(tl.int64)
        mask = row_ok[:, None] & n_ok[None, :]
        routed = tl.load(routed_ptr + rows64 * stride_rm + offs_n[None, :], mask=mask, other=0.0)
        y = acc.to(out_ptr.dtype.element_ty).to(tl.float32) + routed.to(tl.float32)
        tl.store(out_ptr + rows64 * stride_om + offs_n[None, :], y.to(out_ptr.dtype.element_ty),
                 mask=mask)


@triton.jit(do_not_specialize=["inter"])
def _silu_mul_kernel(h_ptr, out_ptr, inter, stride_h, stride_o, BLOCK: tl.constexpr,
                     PDL: tl.constexpr):  # PDL: supplied by FastLauncher (moerun._triton.pdl)
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < inter
    src = h_ptr + row * stride_h + offs
    g = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(src + inter, mask=ok, other=0.0).to(tl.float32)
    # torch's F.silu(gate).mul_(up): silu rounded to the dtype, then the product
    s = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (s * u).to(out_ptr.dtype.element_ty), mask=ok)


_LAUNCH_GATE_UP = FastLauncher(_dense_gate_up_kernel)
_LAUNCH_DOWN = FastLauncher(_dense_down_add_kernel)
_LAUNCH_SILU = FastLauncher(_silu_mul_kernel)


def silu_mul(h: torch.Tensor) -> torch.Tensor:
    """``silu(h[:, :I]) * h[:, I:]`` for ``h [T, 2I]`` (last dim contiguous) -> new ``[T, I]``
    in h.dtype, rounded as ``F.silu(gate).mul_(up)`` rounds. One launch (none for T == 0);
    current stream; no host sync; capture-safe."""
    if h.dim() != 2 or h.shape[1] % 2 or h.stride(1) != 1:
        raise ValueError(f"h {tuple(h.shape)} must be [T, 2*I] with a contiguous last dim")
    t, two_i = h.shape
    inter = two_i // 2
    out = torch.empty((t, inter), dtype=h.dtype, device=h.device)
    if t:
        block = min(SILU_BLOCK, max(16, 1 << (inter - 1).bit_length()))
        _LAUNCH_SILU((t, cdiv(inter, block)), h, out, inter, h.stride(0), out.stride(0), block,
                     num_warps=4)
    return out


def silu_mul_torch(h: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`silu_mul` (the torch form's two ops).

    Allocates the output; no host sync; current stream; capturable."""
    gate, up = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate).mul_(up)


def shared_mlp_add_gemm(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                        routed: torch.Tensor) -> torch.Tensor:
    """:func:`shared_mlp_add` for any number of rows with cuBLAS GEMMs: ``linear``,
    :func:`silu_mul`, ``linear``, ``add_`` (the torch form with its three elementwise ops as
    one launch; the same rounding: act and the shared output in x.dtype, then one add).
    Returns a new ``[T, H]`` tensor; ``routed`` is not modified. Current stream; no host
    sync; capture-safe."""
    act = silu_mul(torch.nn.functional.linear(x, w13))
    return torch.nn.functional.linear(act, w2).add_(routed)


# ---------------------------------------------------------------- launcher
def shared_mlp_add(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                   routed: torch.Tensor, cfg: DenseConfig | None = None) -> torch.Tensor:
    """``round(silu(x Wg^T) * (x Wu^T) @ W2^T) + routed`` in x.dtype.

    Args:
        x: ``[T, H]`` fp32/fp16/bf16, last dim contiguous.
        w13: ``[2*Is, H]`` x.dtype, contiguous (gate rows, then up rows).
        w2: ``[H, Is]`` x.dtype, contiguous.
        routed: ``[T, H]`` x.dtype, last dim contiguous (not modified).
        cfg: tiles (default :func:`dense_config`).

    Returns: a new ``[T, H]`` tensor. Two launches (none for ``T == 0``) on the current
    stream; no host sync; capture-safe. Argument checks read shapes, dtypes and strides only.
    """
    t, h = x.shape
    two_i = w13.shape[0]
    inter = two_i // 2
    if w13.shape != (two_i, h) or two_i % 2 or w2.shape != (h, inter) or \
            w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise ValueError(f"w13 {tuple(w13.shape)} {w13.dtype} / w2 {tuple(w2.shape)} "
                         f"{w2.dtype} do not match x {tuple(x.shape)} {x.dtype}: expected "
                         f"[2*Is, {h}] and [{h}, Is] in {x.dtype}")
    if routed.shape != (t, h) or routed.dtype != x.dtype:
        raise ValueError(f"routed {tuple(routed.shape)} {routed.dtype} must be [{t}, {h}] "
                         f"{x.dtype}")
    if x.stride(1) != 1 or routed.stride(1) != 1 or not w13.is_contiguous() or \
            not w2.is_contiguous():
        raise ValueError("x and routed need a contiguous last dimension, w13 and w2 must be "
                         "contiguous")
    out = torch.empty((t, h), dtype=x.dtype, device=x.device)  # NOTE: not empty_like: a
    if t == 0:  # launch program replays torch.empty
        return out
    cfg = dense_config(t) if cfg is None else cfg
    act = torch.empty(t, inter, dtype=x.dtype, device=x.device)
    prec = dot_precision(x.dtype)
    gm = t if cfg.block_m == 1 else cdiv(t, cfg.block_m)
    _LAUNCH_GATE_UP((cdiv(inter, cfg.gate_up_n), gm),
                    x, w13, act, t, inter, h, x.stride(0), w13.stride(0), act.stride(0),
                    cfg.block_m, cfg.gate_up_n, cfg.block_k, h % cfg.block_k == 0, prec,
                    num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    _LAUNCH_DOWN((cdiv(h, cfg.down_n), gm),
                 act, w2, routed, out, t, h, inter, act.stride(0), w2.stride(0),
                 routed.stride(0), out.stride(0),
                 cfg.block_m, cfg.down_n, cfg.block_k, inter % cfg.block_k == 0, prec,
                 num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


# ---------------------------------------------------------------- torch twin
def shared_mlp_add_torch(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                         routed: torch.Tensor) -> torch.Tensor:
    """Pure-torch twin of :func:`shared_mlp_add` (fp32 math, the shared output rounded to
    x.dtype before the add)."""
    gu = x.float() @ w13.float().t()
    inter = w13.shape[0] // 2
    act = (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]).to(x.dtype)
    y = (act.float() @ w2.float().t()).to(x.dtype)
    return (y.float() + routed.float()).to(x.dtype)
