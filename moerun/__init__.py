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
    "ForwardHandle": "moerun.forward_handle",
    "MoEConfig": "moerun.config",
    "RoutingConfig": "moerun.config",
    "RoutingMethod": "moerun.config",
    "Activation": "moerun.config",
    "QuantConfig": "moerun.quant",
    "QuantizedRows": "moerun.quant",
    "ExpertQuant": "moerun.quant",
    "Mapping": "moerun.mapping",
    "fused_experts": "moerun.functional",
    "resolve": "moerun.resolve",
    "ResolutionReport": "moerun.resolve",
    "SharedExpertOrder": "moerun.shared_expert",
    "CommTimeoutError": "moerun.errors",
    "LayerClosedError": "moerun.errors",
    "EPLBStepMismatch": "moerun.errors",
    "LayerStepMismatch": "moerun.errors",
    "get_env": "moerun.env",
    "from_hf": "moerun.hf",
    "router_weight": "moerun.hf",
    "SUPPORTED_BLOCKS": "moerun.hf",
    "patch_model": "moerun.hf_patch",
    "HFMoEBlock": "moerun.hf_patch",
    "register_experts_interface": "moerun.hf_experts",
    "checkpoint_expert_items": "moerun.hf_checkpoint",
    "load_expert_checkpoint": "moerun.hf_checkpoint",
}

#: Submodules reachable as attributes without importing them first (``moerun.hf.from_hf``).
_SUBMODULES = ("hf",)

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"moerun.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'moerun' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
