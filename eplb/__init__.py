"""Expert-parallel load balancing (DESIGN 8).

Today: the per-layer hook seam and the do-nothing balancer the scheduler calls when no
balancer is attached. Statistics, policy, placement and migration are a later issue.
"""

from eplb.hooks import LayerBalancerHooks, NullLayerBalancer

__all__ = ["LayerBalancerHooks", "NullLayerBalancer"]
