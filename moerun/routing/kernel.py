"""Fused routing kernel: router logits -> ``(topk_weights, topk_ids)`` in one launch (DESIGN 6).

Legend: ``T`` rows, ``E`` experts, ``K`` top-k, ``G`` expert groups, ``E_g = E // G``.

One Triton program owns ``BLOCK_T`` rows and all ``E`` columns of each (``E`` padded to a
power of two, ``E_P2``). In registers it does what :mod:`moerun.routing.methods` does in
8-22 torch ops:

1. scores: ``softmax`` over E, or ``sigmoid`` (fp32, whatever the logits' dtype);
2. ``choice = scores (+ correction_bias)``: the bias shifts the selection only;
3. grouped selection (``G > 1`` and ``topk_group < G``): a group's score is the max of its
   choice values (``GROUP_SCORE = 1``, DeepSeek-V2) or the sum of its top-2
   (``GROUP_SCORE = 2``, DeepSeek-V3); the ``topk_group`` best groups stay, the other
   experts' choice becomes ``-inf``;
4. top-k by ``K`` rounds of argmax (descending choice; among exact ties the lowest id,
   ``torch.topk`` leaves that unspecified), weight = the *unbiased* score of the pick;
5. optional renormalisation ``w / (sum + eps)``, then ``* routed_scaling_factor`` (fp32);
6. rows ``>= valid_rows`` (DP padding) get id ``-1`` and weight ``0``.

Every family of :class:`~moerun.config.RoutingMethod` maps to constexpr switches of this one
kernel (:func:`kernel_spec`); the torch functions are its twin and oracle. No host sync, no
data-dependent shapes: capture-safe. Under ``TRITON_INTERPRET=1`` (CPU tests) only fp32 and
fp16 logits are correct (bf16 loads return garbage there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from moerun._triton.compat import patch_interpreter
from moerun._triton.launch import FastLauncher, cdiv, next_pow2
from moerun._triton.gdc import pdl_prologue
from moerun.config import RoutingConfig, RoutingMethod
from moerun.routing.methods import _RENORM_EPS, Routed

patch_interpreter()

__all__ = ["RouteSpec", "kernel_spec", "fused_route", "MAX_TOP_K", "MAX_EXPERTS"]

# ---------------------------------------------------------------- constants
MAX_TOP_K = 32  # K rounds of argmax are unrolled; beyond this the torch path routes
MAX_EXPERTS = 1024  # one program holds E_P2 columns of BLOCK_T rows in registers
_ELEMENTS_PER_PROGRAM = 4096  # BLOCK_T * E_P2 (fp32 registers of the scores tile)


@dataclass(frozen=True, kw_only=True)
class RouteSpec:
    """Kernel switches of one routing family (see the module docstring, steps 1-5).

    Fields: ``sigmoid`` (else softmax); ``has_bias``; ``group_score`` 0 none / 1 max / 2 top-2
    sum; ``num_groups`` G; ``topk_group``; ``renormalize``; ``eps`` (renormalisation
    epsilon); ``scale`` (``routed_scaling_factor``).
    """

    sigmoid: bool
    has_bias: bool
    group_score: int
    num_groups: int
    topk_group: int
    renormalize: bool
    eps: float
    scale: float


def kernel_spec(config: RoutingConfig) -> RouteSpec:
    """The :class:`RouteSpec` equal to ``moerun.routing.route(..., config=config)``. Pure."""
    m = config.method
    grouped = config.num_expert_group > 1 and config.topk_group < config.num_expert_group
    base = dict(num_groups=config.num_expert_group, topk_group=config.topk_group,
                scale=float(config.routed_scaling_factor))
    if m is RoutingMethod.SOFTMAX_TOPK:
        return RouteSpec(sigmoid=False, has_bias=False, group_score=0,
                         renormalize=config.renormalize, eps=0.0, **base)
    if m is RoutingMethod.TOPK_SOFTMAX:  # softmax over the selected = renormalised softmax
        return RouteSpec(sigmoid=False, has_bias=False, group_score=0, renormalize=True,
                         eps=0.0, **base)
    if m is RoutingMethod.GROUP_LIMITED_GREEDY:
        return RouteSpec(sigmoid=False, has_bias=False, group_score=1 if grouped else 0,
                         renormalize=config.renormalize, eps=_RENORM_EPS, **base)
    if m is RoutingMethod.NOAUX_TC:
        return RouteSpec(sigmoid=True, has_bias=True, group_score=2 if grouped else 0,
                         renormalize=config.renormalize, eps=_RENORM_EPS, **base)
    if m is RoutingMethod.LLAMA4:
        return RouteSpec(sigmoid=True, has_bias=False, group_score=0, renormalize=False,
                         eps=0.0, **base)
    if m is RoutingMethod.SIGMOID_TOPK:
        return RouteSpec(sigmoid=True, has_bias=False, group_score=0,
                         renormalize=config.renormalize, eps=_RENORM_EPS, **base)
    if m is RoutingMethod.SIGMOID_BIAS_TOPK:
        return RouteSpec(sigmoid=True, has_bias=True, group_score=0,
                         renormalize=config.renormalize, eps=_RENORM_EPS, **base)
    raise AssertionError(f"unhandled routing method {m!r}")


# ---------------------------------------------------------------- kernel
@triton.jit(do_not_specialize=["num_rows", "valid_rows"])
def _route_kernel(
    # tensors
    logits_ptr,  # [T, E] fp32/fp16/bf16, row stride stride_l, unit column stride
    bias_ptr,  # [E] fp32 (read iff HAS_BIAS)
    weights_ptr,  # [T, K] fp32 out, contiguous
    ids_ptr,  # [T, K] int32 out, contiguous
    # sizes
    num_rows, valid_rows, stride_l, scale,
    # meta
    NUM_EXPERTS: tl.constexpr, E_P2: tl.constexpr, TOP_K: tl.constexpr, K_P2: tl.constexpr,
    BLOCK_T: tl.constexpr, SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr,
    GROUP_SCORE: tl.constexpr, NUM_GROUPS: tl.constexpr, G_P2: tl.constexpr,
    TOPK_GROUP: tl.constexpr, RENORM: tl.constexpr, EPS: tl.constexpr,
    PDL: tl.constexpr,  # supplied by FastLauncher (moerun._triton.pdl)
):
    pdl_prologue(PDL)  # first: nothing touches global memory before the wait
    pid = tl.program_id(0)
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, E_P2)
    row_ok = rows < num_rows
    col_ok = cols < NUM_EXPERTS
    neg_inf = float("-inf")

    ptrs = logits_ptr + rows[:, None].to(tl.int64) * stride_l + cols[None, :]
    x = tl.load(ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
    # 1. scores (padded columns: -inf logits -> score 0, never selected below)
    if SIGMOID:
        scores = tl.sigmoid(x)
    else:
        x = tl.where(col_ok[None, :], x, neg_inf)
        e = tl.exp(x - tl.max(x, axis=1)[:, None])
        scores = e / tl.sum(e, axis=1)[:, None]
    scores = tl.where(col_ok[None, :], scores, 0.0)
    # 2. selection values
    choice = scores
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        choice = scores + bias[None, :]
    choice = tl.where(col_ok[None, :], choice, neg_inf)
    # 3. group-limited selection
    if GROUP_SCORE != 0:
        per_group: tl.constexpr = NUM_EXPERTS // NUM_GROUPS
        gid = cols // per_group
        gcols = tl.arange(0, G_P2)
        gscore = tl.full([BLOCK_T, G_P2], neg_inf, tl.float32)
        for g in tl.static_range(NUM_GROUPS):
            in_g = (gid == g) & col_ok
            cg = tl.where(in_g[None, :], choice, neg_inf)
            best = tl.max(cg, axis=1)
            if GROUP_SCORE == 2:  # sum of the top-2 (a tie at the top counts twice)
                first = tl.argmax(cg, axis=1)
                cg = tl.where(cols[None, :] == first[:, None], neg_inf, cg)
                best = best + tl.max(cg, axis=1)
            gscore = tl.where(gcols[None, :] == g, best[:, None], gscore)
        keep = tl.zeros([BLOCK_T, E_P2], tl.int1)
        for _ in tl.static_range(TOPK_GROUP):
            pick = tl.argmax(gscore, axis=1)
            keep = keep | (gid[None, :] == pick[:, None])
            gscore = tl.where(gcols[None, :] == pick[:, None], neg_inf, gscore)
        choice = tl.where(keep & col_ok[None, :], choice, neg_inf)
    # 4. top-k
    kcols = tl.arange(0, K_P2)
    out_w = tl.zeros([BLOCK_T, K_P2], tl.float32)
    out_id = tl.zeros([BLOCK_T, K_P2], tl.int32)
    for j in tl.static_range(TOP_K):
        idx = tl.argmax(choice, axis=1)
        hit = cols[None, :] == idx[:, None]
        w = tl.sum(tl.where(hit, scores, 0.0), axis=1)
        out_w = tl.where(kcols[None, :] == j, w[:, None], out_w)
        out_id = tl.where(kcols[None, :] == j, idx[:, None].to(tl.int32), out_id)
        choice = tl.where(hit, neg_inf, choice)
    # 5. renormalise, scale
    if RENORM:
        out_w = out_w / (tl.sum(out_w, axis=1)[:, None] + EPS)
    out_w = out_w * scale
    # 6. padded rows
    pad = rows >= valid_rows
    out_w = tl.where(pad[:, None], 0.0, out_w)
    out_id = tl.where(pad[:, None], -1, out_id)
    offs = rows[:, None].to(tl.int64) * TOP_K + kcols[None, :]
    omask = row_ok[:, None] & (kcols < TOP_K)[None, :]
    tl.store(weights_ptr + offs, out_w, mask=omask)
    tl.store(ids_ptr + offs, out_id, mask=omask)


_LAUNCH = FastLauncher(_route_kernel)


# ---------------------------------------------------------------- launcher
def block_rows(num_experts: int, num_rows: int | None = None) -> int:
    """Rows per program for ``E`` experts (a power of two; ``BLOCK_T * E_P2 <= 4096``), no
    more than ``num_rows`` needs (decode: one row, so one program's reductions stay short)."""
    rows = max(1, min(16, _ELEMENTS_PER_PROGRAM // next_pow2(num_experts)))
    return rows if num_rows is None else max(1, min(rows, next_pow2(num_rows)))


def _warps(elements: int) -> int:
    """Warps for a ``BLOCK_T x E_P2`` tile: one warp up to 512 elements (every reduction a
    warp shuffle, the decode case), up to 8 for the largest tiles."""
    if elements <= 512:
        return 1
    if elements <= 1024:
        return 2
    return 4 if elements <= 2048 else 8


def fused_route(router_logits: torch.Tensor, top_k: int, spec: RouteSpec, *,
                correction_bias: torch.Tensor | None = None,
                valid_rows: int | None = None) -> Routed:
    """Route ``T`` rows in one kernel launch.

    Args:
        router_logits: ``[T, E]`` fp32/fp16/bf16, unit column stride (a row slice of a
            larger tensor is fine).
        top_k: ``K`` in ``[1, min(E, MAX_TOP_K)]``.
        spec: from :func:`kernel_spec` (the routing family).
        correction_bias: ``[E]`` fp32, contiguous, required iff ``spec.has_bias``.
        valid_rows: rows ``>= valid_rows`` get id ``-1`` and weight 0 (default: none).

    Returns: :class:`~moerun.routing.methods.Routed` with new contiguous ``[T, K]`` fp32
    weights and int32 ids. One launch on the current stream (none for ``T == 0``); no host
    sync; capture-safe. Argument checks read only shapes, dtypes and strides.
    """
    t, e = router_logits.shape
    if router_logits.stride(1) != 1:
        raise ValueError("router_logits needs a unit column stride (call .contiguous())")
    if not 1 <= top_k <= min(e, MAX_TOP_K):
        raise ValueError(f"top_k={top_k} must be in [1, min(E={e}, {MAX_TOP_K})] for the fused "
                         "routing kernel")
    if e > MAX_EXPERTS:
        raise ValueError(f"E={e} exceeds the fused routing kernel's limit of {MAX_EXPERTS}")
    if spec.has_bias:
        if correction_bias is None or correction_bias.dtype != torch.float32 \
                or not correction_bias.is_contiguous() or correction_bias.numel() != e:
            raise ValueError(f"correction_bias must be a contiguous fp32 [E={e}] tensor")
    dev = router_logits.device
    weights = torch.empty((t, top_k), dtype=torch.float32, device=dev)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=dev)
    if t == 0:
        return Routed(topk_weights=weights, topk_ids=ids)
    valid = t if valid_rows is None else valid_rows
    e_p2 = next_pow2(e)
    bt = block_rows(e, t)
    _LAUNCH((cdiv(t, bt),),
            router_logits, correction_bias if spec.has_bias else weights, weights, ids,
            t, valid, router_logits.stride(0), spec.scale,
            e, e_p2, top_k, next_pow2(top_k), bt,
            spec.sigmoid, spec.has_bias, spec.group_score, spec.num_groups,
            next_pow2(spec.num_groups), spec.topk_group, spec.renormalize,
            spec.eps, num_warps=_warps(bt * e_p2))
    return Routed(topk_weights=weights, topk_ids=ids)
