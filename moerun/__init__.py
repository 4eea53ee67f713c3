"""moerun: a scheduler-centric Mixture-of-Experts runtime for PyTorch.

Public names are resolved lazily (module ``__getattr__``), so ``import schedulers`` or
``import eplb`` first never half-initialises this package (DESIGN 12).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "ConfigurableMoE": "moerun.layer",
    "MoEConfig": "moerun.config",
    "RoutingConfig": "moerun.config",
    "RoutingMethod": "moerun.config",
    "Activation": "moerun.config",
    "Mapping": "moerun.mapping",
    "fused_experts": "moerun.functional",
    "resolve": "moerun.resolve",
    "ResolutionReport": "moerun.resolve",
    "SharedExpertOrder": "moerun.shared_expert",
    "CommTimeoutError": "moerun.errors",
    "LayerClosedError": "moerun.errors",
    "EPLBStepMismatch": "moerun.errors",
    "get_env": "moerun.env",
    "from_hf": "moerun.hf",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'moerun' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
