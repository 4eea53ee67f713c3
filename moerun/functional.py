"""``moerun.fused_experts``: the single-rank functional entry (DESIGN 3)."""

from __future__ import annotations

import functools

import torch

from moerun.backends import Backend, backend_candidates, backend_class
from moerun.capability import Deployment, Problem
from moerun.config import SUPPORTED_DTYPES, Activation
from moerun.env import get_env
from moerun.quant import FP8_DTYPE, ExpertQuant, QuantConfig, QuantizedRows

__all__ = ["fused_experts"]


def _check_quant(x, w13, w2, quant) -> None:
    """The FP8 arguments: ``quant`` an :class:`ExpertQuant`, e4m3 weights, scales of the
    weight-block shape, ``x`` float or :class:`QuantizedRows` of ``act_group`` columns."""
    if not isinstance(quant, ExpertQuant):
        raise TypeError(f"quant must be a moerun.ExpertQuant or None, got "
                        f"{type(quant).__name__}")
    if quant.out_dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"quant.out_dtype={quant.out_dtype} is unsupported; use float32, "
                         "float16 or bfloat16")
    for name, w in (("w13", w13), ("w2", w2)):
        if isinstance(w, torch.Tensor) and w.dtype != FP8_DTYPE:
            raise ValueError(f"{name}.dtype={w.dtype}: quant= needs {FP8_DTYPE} weights "
                             "(moerun.quant.quantize_weight_blocks)")
    if isinstance(x, QuantizedRows) and x.group != quant.config.act_group:
        raise ValueError(f"x is QuantizedRows of group {x.group} but quant.config.act_group="
                         f"{quant.config.act_group}")
    if isinstance(w13, torch.Tensor) and w13.dim() == 3 and isinstance(w2, torch.Tensor) \
            and w2.dim() == 3:
        e, two_i, h = w13.shape
        for name, t, want in (("quant.w13_scale", quant.w13_scale,
                               (e, *quant.config.scale_shape(two_i, h))),
                              ("quant.w2_scale", quant.w2_scale,
                               (e, *quant.config.scale_shape(h, two_i // 2)))):
            if tuple(t.shape) != want or t.dtype != torch.float32:
                raise ValueError(f"{name} is {tuple(t.shape)} {t.dtype}; expected {list(want)} "
                                 "float32 (one scale_inv per weight block)")


def _check(x, w13, w2, topk_weights, topk_ids, quant=None, *, scan_ids: bool) -> None:
    """Shapes, dtypes, layout and devices (host-only); with ``scan_ids`` also the
    ``topk_ids`` range (a device->host sync, skipped while a CUDA graph is captured)."""
    if quant is not None:
        _check_quant(x, w13, w2, quant)
        if isinstance(x, QuantizedRows):
            x = x.data
    for name, t in (("x", x), ("w13", w13), ("w2", w2), ("topk_weights", topk_weights),
                    ("topk_ids", topk_ids)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2:
        raise ValueError(f"x must be [T, H], got shape {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES + (torch.float64,) and not (
            quant is not None and x.dtype == FP8_DTYPE):
        raise ValueError(f"x.dtype={x.dtype} is unsupported; use float32, float16 or bfloat16")
    t, h = x.shape
    if w13.dim() != 3 or w13.shape[2] != h or w13.shape[1] % 2:
        raise ValueError(f"w13 must be [E, 2*I, H={h}], got shape {tuple(w13.shape)}")
    e, inter = w13.shape[0], w13.shape[1] // 2
    if tuple(w2.shape) != (e, h, inter):
        raise ValueError(f"w2 must be [E={e}, H={h}, I={inter}], got shape {tuple(w2.shape)}")
    if quant is None and (w13.dtype != x.dtype or w2.dtype != x.dtype):
        raise ValueError(f"w13.dtype={w13.dtype} and w2.dtype={w2.dtype} must equal "
                         f"x.dtype={x.dtype}")
    for name, w in (("w13", w13), ("w2", w2)):
        if not w.is_contiguous():  # issue 14: a transposed view used to hit a bare assert
            raise ValueError(f"{name} must be contiguous, got strides {tuple(w.stride())} for "
                             f"shape {tuple(w.shape)} (a transposed or sliced view): pass "
                             f"{name}.contiguous() and reuse it (fused_experts never copies "
                             "weights per call; ConfigurableMoE.load_weights takes any layout)")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != t:
        raise ValueError(f"topk_ids must be [T={t}, K], got shape {tuple(topk_ids.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_weights shape {tuple(topk_weights.shape)} must equal topk_ids "
                         f"shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids.dtype={topk_ids.dtype} must be int32 or int64")
    if not topk_weights.is_floating_point():
        raise ValueError(f"topk_weights.dtype={topk_weights.dtype} must be floating point")
    if topk_ids.shape[1] > e:
        raise ValueError(f"top_k={topk_ids.shape[1]} exceeds num_experts={e}")
    devs = {t_.device for t_ in (x, w13, w2, topk_weights, topk_ids)}
    if len(devs) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devs))}")
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
    if scan_ids and topk_ids.numel() and not capturing:  # a sync: never under capture
        lo, hi = int(topk_ids.min()), int(topk_ids.max())  # NOTE: device->host sync
        if lo < -1 or hi >= e:
            raise ValueError(f"topk_ids must be in [-1, {e}) (-1 = skip), got range "
                             f"[{lo}, {hi}]")


def fused_experts(x: torch.Tensor | QuantizedRows, w13: torch.Tensor, w2: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  backend: str | Backend = "auto", *, check_inputs: bool | None = None,
                  quant: ExpertQuant | None = None) -> torch.Tensor:
    """``out[t] = sum_j w[t, j] * (silu(x W_gate^T) * (x W_up^T)) W_2^T`` over ``topk_ids``.

    Args:
        x: ``[T, H]``; with ``quant`` also a :class:`~moerun.quant.QuantizedRows` (a float
            ``x`` is then quantized first with the backend's ``quantize_rows``).
            w13: ``[E, 2*I, H]`` (gate rows then up rows). w2: ``[E, H, I]``.
            Both contiguous (a view is a ValueError naming it, not a silent copy per call).
        topk_weights: ``[T, K]`` (float, used as fp32). topk_ids: ``[T, K]`` int32/int64 in
            ``[0, E)`` or ``-1`` (skipped).
        backend: ``"auto"``, ``"reference"``, ``"triton"``, ``"grouped_mm"`` or a Backend.
        check_inputs: ``True``: validate shapes, dtypes, layout and devices (host-only),
            and the ``topk_ids`` range (a device->host sync, skipped while a CUDA graph is
            being captured). ``False``: no checks. ``None`` (default): by device, as the
            layer's ``MoEConfig.check_inputs`` (DESIGN 9): everything on CPU; on CUDA the
            host-only checks without the range scan, so the default never syncs.
        quant: the FP8 block-scaled path (DESIGN 11a; :class:`~moerun.quant.ExpertQuant`:
            ``w13`` / ``w2`` e4m3 with ``quant.w13_scale [E, 2I/bn, H/bk]`` /
            ``quant.w2_scale [E, H/bn, I/bk]`` fp32); only backends that declare
            ``supports_fp8_block`` run it (``"auto"`` picks one).

    Returns ``[T, H]`` in x.dtype (with ``quant``: ``quant.out_dtype``). Single rank; no
    collective; on the current stream; a host sync only for the id range scan (above), so
    capturable in a CUDA graph. The backend for a given choice and shape is resolved once
    and reused (backends hold no per-call state).
    """
    if check_inputs is not None and not isinstance(check_inputs, bool):
        raise TypeError(f"check_inputs must be True, False or None (by device), got "
                        f"{check_inputs!r}")
    if check_inputs is not False:
        data = x.data if isinstance(x, QuantizedRows) else x
        scan = check_inputs or not (isinstance(data, torch.Tensor) and data.is_cuda)
        _check(x, w13, w2, topk_weights, topk_ids, quant, scan_ids=scan)
    if isinstance(backend, Backend):
        impl = backend
    else:
        if not (isinstance(backend, str)
                or (isinstance(backend, type) and issubclass(backend, Backend))):
            raise TypeError(f"backend must be a name, a Backend instance or class, got "
                            f"{type(backend).__name__}")
        dtype = x.dtype if quant is None else quant.out_dtype
        impl = _backend_for(backend, w13.shape[0], topk_ids.shape[1], x.shape[1],
                            w13.shape[1] // 2, dtype, x.device.type,
                            None if quant is None else quant.config)
    if topk_weights.dtype != torch.float32:
        topk_weights = topk_weights.to(torch.float32)
    if topk_ids.dtype != torch.int32:
        topk_ids = topk_ids.to(torch.int32)
    if quant is None:
        return impl.run_experts(x, w13, w2, topk_weights, topk_ids)
    if not impl.supports_fp8_block:
        raise ValueError(f"backend {impl.name} has no FP8 block-scaled path "
                         "(supports_fp8_block=False); use backend='reference' or 'auto'")
    if not isinstance(x, QuantizedRows):
        x = impl.quantize_rows(x, quant.config)
    return impl.run_experts(x, w13, w2, topk_weights, topk_ids, quant=quant)


@functools.lru_cache(maxsize=64)
def _backend_for(choice: str | type[Backend], e: int, k: int, h: int, inter: int,
                 dtype: torch.dtype, device_type: str,
                 quant: QuantConfig | None = None) -> Backend:
    """The backend instance ``choice`` resolves to for this shape (ValueError if it cannot
    run). Pure apart from the one-time environment probe; memoised."""
    problem = Problem(num_experts=e, num_slots=e, top_k=k, hidden_size=h,
                      intermediate_size=inter, dtype=dtype, activation=Activation.SILU_GLU,
                      device_type=device_type, quant=quant)
    dep = Deployment(rank=0, world_size=1, comm_backend="none", num_local_slots=e,
                     divisible=True)
    env = get_env()
    if choice == "auto":
        return next(c for c in backend_candidates() if c.eligibility(problem, dep, env).ok)()
    cls = backend_class(choice) if isinstance(choice, str) else choice
    elig = cls.eligibility(problem, dep, env)
    if not elig.ok:
        raise ValueError(f"backend={choice!r} cannot run here: {elig.reason.value}: "
                         f"{elig.detail}")
    return cls()
