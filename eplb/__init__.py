"""Expert-parallel load balancing (DESIGN 8): statistics, policy, placement, migration, hook
timing. ``LoadBalancer`` is model-wide; ``balancer.layer(l)`` is the hook handle a
``ConfigurableMoE`` takes as ``balancer=``. ``NullLayerBalancer`` is the do-nothing seam.
"""

from eplb.balancer import EPLBConfig, LayerBalancer, LoadBalancer, MigrationStats
from eplb.hooks import LayerBalancerHooks, NullLayerBalancer
from eplb.placement import Placement, default_phy2log, placement_from_phy2log
from eplb.policy import default_placement, rebalance

__all__ = [
    "EPLBConfig",
    "LoadBalancer",
    "LayerBalancer",
    "MigrationStats",
    "LayerBalancerHooks",
    "NullLayerBalancer",
    "Placement",
    "default_phy2log",
    "placement_from_phy2log",
    "rebalance",
    "default_placement",
]
