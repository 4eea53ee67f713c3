"""Routing: router logits -> ``(topk_weights, topk_ids)`` (DESIGN 2, 6).

- :mod:`moerun.routing.methods`: one torch function per :class:`~moerun.config.RoutingMethod`
  and the dispatcher :func:`route` (the CPU path, the twin and oracle of the kernel);
- :mod:`moerun.routing.kernel`: the fused Triton kernel (imported lazily: triton is optional);
- :mod:`moerun.routing.router`: the per-layer :class:`Router` (torch or fused kernel).
"""

from moerun.routing.methods import (
    Routed,
    group_limited_greedy,
    llama4_top1,
    noaux_tc,
    route,
    sigmoid_bias_topk,
    sigmoid_topk,
    softmax_topk,
    topk_softmax,
)
from moerun.routing.router import ROUTER_NAMES, Router, TorchRouter, TritonRouter, router_class

__all__ = [
    "Routed", "route", "softmax_topk", "topk_softmax", "group_limited_greedy", "noaux_tc",
    "llama4_top1", "sigmoid_topk", "sigmoid_bias_topk",
    "Router", "TorchRouter", "TritonRouter", "ROUTER_NAMES", "router_class",
]
