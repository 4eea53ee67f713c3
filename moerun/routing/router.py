"""The layer's router: routing of one chunk, on the torch twin or the fused kernel (DESIGN 6).

A :class:`Router` is built once per layer (``resolve`` picks which) and called once per
chunk with the chunk's logits and how many of its rows are real (the rest are DP padding and
come back as id ``-1``, weight ``0``):

* :class:`TorchRouter`: the functions of :mod:`moerun.routing.methods` (any device; the CPU
  path and the oracle);
* :class:`TritonRouter`: :func:`moerun.routing.kernel.fused_route`, one launch (CUDA; on CPU
  only under ``TRITON_INTERPRET=1``, for tests).

Both return a :class:`~moerun.routing.methods.Routed` of new contiguous ``[n, K]`` fp32
weights and int32 ids; no host sync; capture-safe.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import torch

from moerun._triton.program import ProgramCache, layout_key
from moerun.capability import Eligibility, Problem, RejectReason
from moerun.config import MoEConfig
from moerun.env import Env
from moerun.routing.methods import Routed, route

__all__ = ["Router", "TorchRouter", "TritonRouter", "ROUTER_NAMES", "router_class",
           "MAX_KERNEL_TOP_K", "MAX_KERNEL_EXPERTS"]

#: Limits of the fused kernel (mirrors ``moerun.routing.kernel``; kept here so checking them
#: imports no triton).
MAX_KERNEL_TOP_K = 32
MAX_KERNEL_EXPERTS = 1024


class Router(abc.ABC):
    """Routing of one chunk for one layer.

    Args:
        config: the layer's :class:`MoEConfig` (routing method, top-k, E).
        correction_bias: the layer's ``[E]`` fp32 selection bias parameter (read at every
            call, so in-place updates apply), or None.
    """

    name: ClassVar[str]

    def __init__(self, config: MoEConfig, correction_bias: torch.Tensor | None) -> None:
        self.config = config
        self.top_k = config.top_k
        self.correction_bias = correction_bias

    @classmethod
    @abc.abstractmethod
    def can_implement(cls, problem: Problem, env: Env) -> Eligibility:
        """Pure static check (no device work)."""

    @abc.abstractmethod
    def __call__(self, router_logits: torch.Tensor, *, valid_rows: int) -> Routed:
        """``router_logits [n, E]`` (fp32 or the layer dtype) -> ``Routed`` ``[n, K]``;
        rows ``>= valid_rows`` get id -1 and weight 0. Current stream; no host sync."""


class TorchRouter(Router):
    """The torch functions of :mod:`moerun.routing.methods` (8-22 small ops per call)."""

    name: ClassVar[str] = "torch"

    @classmethod
    def can_implement(cls, problem: Problem, env: Env) -> Eligibility:
        """Always eligible (the torch twin runs every method on every device). Pure."""
        return Eligibility.yes()

    def __call__(self, router_logits: torch.Tensor, *, valid_rows: int) -> Routed:
        routed = route(router_logits, top_k=self.top_k, config=self.config.routing,
                       correction_bias=self.correction_bias)
        if valid_rows < router_logits.shape[0]:  # padded rows: fresh tensors, set in place
            routed.topk_ids[valid_rows:] = -1
            routed.topk_weights[valid_rows:] = 0.0
        return routed


class TritonRouter(Router):
    """One fused Triton launch per call (:mod:`moerun.routing.kernel`)."""

    name: ClassVar[str] = "triton"

    def __init__(self, config: MoEConfig, correction_bias: torch.Tensor | None) -> None:
        super().__init__(config, correction_bias)
        from moerun.routing.kernel import fused_route, kernel_spec

        self._spec = kernel_spec(config.routing)
        self._run = fused_route
        self._programs = ProgramCache()  # logits shape -> launch program (host cost)

    @classmethod
    def can_implement(cls, problem: Problem, env: Env) -> Eligibility:
        """Eligible where triton imports and can run on the problem's device (see the
        reasons below). Host only, pure given ``env``."""
        if env.triton_version is None:
            return Eligibility.no(RejectReason.PACKAGE_MISSING,
                                  "triton is not importable; pip install 'moerun[gpu]'")
        if problem.top_k > MAX_KERNEL_TOP_K or problem.num_experts > MAX_KERNEL_EXPERTS:
            return Eligibility.no(RejectReason.SHAPE,
                                  f"the fused routing kernel takes top_k <= {MAX_KERNEL_TOP_K}"
                                  f" and E <= {MAX_KERNEL_EXPERTS} (have {problem.top_k}, "
                                  f"{problem.num_experts})")
        if problem.device_type == "cpu":
            if not env.triton_interpret:
                return Eligibility.no(RejectReason.INTERPRETER,
                                      "on CPU the torch twin routes (the kernel needs "
                                      "TRITON_INTERPRET=1 set before triton is imported)")
            if problem.dtype == torch.bfloat16:
                return Eligibility.no(RejectReason.INTERPRETER,
                                      "bf16 logits under the Triton interpreter return wrong "
                                      "results")
            return Eligibility.yes()
        if problem.device_type != "cuda" or not env.cuda_available:
            return Eligibility.no(RejectReason.DEVICE, f"device {problem.device_type!r}")
        if env.triton_interpret:
            return Eligibility.no(RejectReason.INTERPRETER,
                                  "TRITON_INTERPRET=1 would run the kernel on the CPU")
        return Eligibility.yes()

    def __call__(self, router_logits: torch.Tensor, *, valid_rows: int) -> Routed:
        """See :meth:`Router.__call__`. On CUDA, from the third call of a logits shape on,
        the launch is replayed as a launch program (``moerun._triton.program``: the same
        allocations and launch, the checks done once)."""
        bias = self.correction_bias

        def plain():
            return self._run(router_logits, self.top_k, self._spec, correction_bias=bias,
                             valid_rows=valid_rows)

        if not router_logits.is_cuda:
            return plain()
        inputs = (router_logits,) if bias is None else (router_logits, bias)
        key = (valid_rows, layout_key(inputs))
        return self._programs.call(key, inputs, plain,
                                   outputs=lambda r: (r.topk_weights, r.topk_ids),
                                   wrap=lambda t: Routed(topk_weights=t[0], topk_ids=t[1]))


#: Names ``router=`` accepts besides ``"auto"``.
ROUTER_NAMES = ("torch", "triton")


def router_class(name: str) -> type[Router]:
    """The router registered as ``name``; ValueError listing the valid names otherwise.
    Pure."""
    if name == "torch":
        return TorchRouter
    if name == "triton":
        return TritonRouter
    raise ValueError(f"router={name!r} is unknown; valid: 'auto', "
                     f"{', '.join(repr(n) for n in ROUTER_NAMES)}")
