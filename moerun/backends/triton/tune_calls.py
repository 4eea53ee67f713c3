"""What one point of ``moerun tune`` times: the calls of the gate/up stage and the whole
calls, for the bf16/fp16 kernels (:class:`FloatCalls`) and the fp8 block-scaled kernels
(:class:`Fp8Calls`), on ``moerun.bench``'s inputs.

The whole call is what the shape's layer runs:

* bf16/fp16: ``TritonExperts.run_experts(x, w13, w2, topk_weights, topk_ids)``;
* fp8: :func:`moerun.bench.fp8.layer_fp8_call` on e4m3 weights with fp32 128 x 128 block
  scales (random ``dtype`` weights quantized with
  :func:`moerun.quant.quantize_weight_blocks`), as ``moerun bench --dtype fp8`` times it:
  ``quantize_rows(x)`` (its own launch; the layer's ``quantize`` step, since TritonExperts
  does not fuse it) then ``run_experts(..., quant=)``.

The gate/up stage times the gate/up kernel alone on the form it gets inside the whole call
(fp8: the quantized rows, and the intermediate written in fp8 exactly when
``configs.fp8_intermediate`` says so). Each ``*_fns`` method returns one zero-argument
callable per routing (the caller times them in the point's mode). Legend: ``S`` slots, ``K``
top-k, ``H`` hidden, ``I`` intermediate, ``T`` rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from moerun.bench.ceilings import Ceilings, Floor, floor_for
from moerun.bench.shapes import BenchShape

__all__ = ["FloatCalls", "Fp8Calls", "make_weights_for"]

Fn = Callable[[], Any]


def make_weights_for(shape: BenchShape, dtype: torch.dtype, activation_dtype: torch.dtype,
                     device: torch.device):
    """One shape's weights: :func:`moerun.bench.inputs.make_weights` in ``dtype``, or for
    ``dtype`` ``float8_e4m3fn`` :func:`~moerun.bench.inputs.make_fp8_weights` (random
    ``activation_dtype`` weights, block-quantized).

    Allocates and fills the weights on ``device`` (current stream); no host sync."""
    from moerun.bench.inputs import make_fp8_weights, make_weights

    if dtype == torch.float8_e4m3fn:
        return make_fp8_weights(shape, activation_dtype, device, seed=0)
    return make_weights(shape, dtype, device, seed=0)


class FloatCalls:
    """The bf16/fp16 (or fp32) kernels of one point: ``weights`` from
    :func:`make_weights_for`, ``cases`` from ``moerun.bench.inputs.make_case``."""

    def __init__(self, shape: BenchShape, weights, cases: list, dtype: torch.dtype):
        self.shape, self.weights, self.cases, self.dtype = shape, weights, cases, dtype
        self._aligns: dict[int, list] = {}

    def floor(self, experts_hit: float, ceilings: Ceilings, fp8_rate: float | None) -> Floor:
        """``moerun.bench``'s floor of the point (``fp8_rate`` unused). Pure; host only."""
        elt = torch.empty((), dtype=self.dtype).element_size()
        return floor_for(self.shape, len(self.cases[0].x), experts_hit, elt, ceilings)

    def _aligned(self, block_m: int) -> list:
        from moerun.backends.triton.align import moe_align

        if block_m not in self._aligns:
            self._aligns[block_m] = [moe_align(c.topk_ids, self.shape.num_experts, block_m)
                                     for c in self.cases]
        return self._aligns[block_m]

    def gate_up_fns(self, block_m: int, cfg, swap_ab: bool = False) -> list[Fn]:
        """The gate/up kernel alone with tile ``cfg`` (``swap_ab``: its ``W x^T`` form) on
        ``block_m``'s alignments.

        The first call per ``block_m`` aligns every case (launches on the current stream,
        cached); each returned closure launches on the current stream. No host sync."""
        from moerun.backends.triton.gate_up import gate_up

        w13, k = self.weights.w13, self.shape.top_k
        return [lambda c=c, a=a: gate_up(c.x, w13, a, k, cfg, swap_ab=swap_ab)
                for c, a in zip(self.cases, self._aligned(block_m))]

    def whole_fns(self, bucket: int, cfg) -> list[Fn]:
        """``run_experts`` with ``cfg`` as the bucket's config.

        Host only: builds closures; each launches ``run_experts`` on the current stream, no host
        sync."""
        from moerun.backends.triton.configs import ConfigTable
        from moerun.backends.triton.experts import TritonExperts

        be = TritonExperts(ConfigTable(overrides={bucket: cfg}))
        w13, w2 = self.weights.w13, self.weights.w2
        return [lambda c=c: be.run_experts(c.x, w13, w2, c.topk_weights, c.topk_ids)
                for c in self.cases]


class Fp8Calls(FloatCalls):
    """The fp8 block-scaled kernels of one point: ``weights`` a
    :class:`moerun.bench.inputs.Fp8Weights`, ``cases`` in ``activation_dtype`` (the layer's
    dtype: the output and the intermediate's rounding)."""

    def __init__(self, shape: BenchShape, weights, cases: list, activation_dtype: torch.dtype):
        from moerun.backends.triton.experts import TritonExperts
        from moerun.quant import ExpertQuant, QuantConfig

        super().__init__(shape, weights, cases, activation_dtype)
        self.qc = QuantConfig()
        self.quant = ExpertQuant(config=self.qc, w13_scale=weights.w13_scale,
                                 w2_scale=weights.w2_scale, out_dtype=activation_dtype)
        # the rows as the gate/up kernel gets them inside the layer's call (quantized by
        # the backend's own launch); made once, outside every timed region
        self._rows = [TritonExperts().quantize_rows(c.x, self.qc) for c in cases]

    def floor(self, experts_hit: float, ceilings: Ceilings, fp8_rate: float | None) -> Floor:
        """``moerun.bench.fp8``'s fp8 floor: the fp8 GEMM rate ``fp8_rate`` (measured in the
        same run) and ``ceilings.bandwidth``. Pure; host only."""
        from moerun.bench.fp8 import fp8_floor

        if fp8_rate is None:
            raise ValueError("the fp8 floor needs fp8_rate (FLOP/s of the fp8 GEMM)")
        return fp8_floor(self.shape, len(self.cases[0].x), experts_hit, ceilings, fp8_rate)

    def gate_up_fns(self, block_m: int, cfg, swap_ab: bool = False) -> list[Fn]:
        """``gate_up_fp8`` alone on the quantized rows (``swap_ab``: its ``W x^T`` form, not
        for a ``paired`` tile), writing the intermediate in the form the whole call would
        (``fp8_intermediate`` of ``block_m`` and ``cfg``): a ``paired`` tile's stage is its
        kernel and the intermediate's quantization launch, as in ``fp8.run_experts_fp8``.

        The first call per ``block_m`` aligns every case (launches on the current stream,
        cached); each returned closure launches on the current stream. No host sync."""
        from moerun.backends.triton.configs import fp8_intermediate
        from moerun.backends.triton.fp8 import gate_up_fp8, quantize_rows_fp8

        w = self.weights
        k, act = self.shape.top_k, self.dtype
        f8 = fp8_intermediate(block_m, cfg)
        if cfg.paired:
            def stage(q, a):
                out = gate_up_fp8(q, w.w13, w.w13_scale, a, k, cfg, act)
                return quantize_rows_fp8(out) if f8 else out
        else:
            def stage(q, a):
                return gate_up_fp8(q, w.w13, w.w13_scale, a, k, cfg, act, fp8_out=f8,
                                   swap_ab=swap_ab)
        return [lambda q=q, a=a: stage(q, a) for q, a in zip(self._rows, self._aligned(block_m))]

    def whole_fns(self, bucket: int, cfg) -> list[Fn]:
        """The layer's call with ``cfg`` as the bucket's fp8 config
        (:func:`moerun.bench.fp8.layer_fp8_call`, the call ``moerun bench --dtype fp8``
        times).

        Host only: builds closures; each launches the layer's fp8 call on the current stream, no
        host sync."""
        from moerun.backends.triton.configs import ConfigTable
        from moerun.backends.triton.experts import TritonExperts
        from moerun.bench.fp8 import layer_fp8_call

        be = TritonExperts(ConfigTable(overrides={bucket: cfg}))
        w, shape, quant = self.weights, self.shape, self.quant
        return [lambda c=c: layer_fp8_call(be, shape, c.x, w.w13, w.w2, c.topk_weights,
                                           c.topk_ids, quant)
                for c in self.cases]
