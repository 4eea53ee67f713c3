"""``torch.ops.moerun.moe_forward``: the layer as one opaque op under ``torch.compile``
(DESIGN 3, vLLM's ``moe_forward`` pattern).

Dynamo never traces the scheduler: while compiling, ``ConfigurableMoE.forward`` calls this
op with the layer's registry key, and the op's fake implementation (``empty_like(x)``) is all
the compiler sees. At run time the op looks the layer up and runs its eager forward, so
collectives, host syncs of the scheduler, EPLB hooks and counters behave exactly as in eager
mode.

The only module state is one weak-value registry ``{layer_key: layer}``: a layer registers at
construction and disappears from it when it is garbage-collected.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

__all__ = ["register_layer", "lookup_layer", "moe_forward"]

_LAYERS: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
_NEXT_ID = itertools.count()


def register_layer(layer: Any) -> str:
    """Register ``layer`` and return its key (``"L{layer_idx}/{n}"``, unique per process).

    Host only; adds a weak reference to the process-wide registry."""
    idx = "-" if layer.layer_idx is None else layer.layer_idx
    key = f"L{idx}/{next(_NEXT_ID)}"
    _LAYERS[key] = layer
    return key


def lookup_layer(layer_key: str) -> Any:
    """The live layer registered as ``layer_key``; RuntimeError if it is gone.

    Host only; reads the process-wide registry."""
    layer = _LAYERS.get(layer_key)
    if layer is None:
        raise RuntimeError(f"moerun layer {layer_key!r} no longer exists (it was garbage-"
                           "collected); a compiled graph outlived the ConfigurableMoE it calls")
    return layer


@torch.library.custom_op("moerun::moe_forward", mutates_args=())
def moe_forward(x: torch.Tensor, router_logits: torch.Tensor, layer_key: str,
                all_rank_num_tokens: list[int] | None, use_dp_padding: bool) -> torch.Tensor:
    """Run the registered layer's forward: ``x [T, H]``, ``router_logits [T, E]`` -> a new
    ``[T, H]`` tensor in x.dtype. Side effects: those of ``ConfigurableMoE.forward``
    (collectives, host syncs, counters)."""
    return lookup_layer(layer_key)(x, router_logits, all_rank_num_tokens=all_rank_num_tokens,
                                   use_dp_padding=use_dp_padding)


@moe_forward.register_fake
def _moe_forward_fake(x: torch.Tensor, router_logits: torch.Tensor, layer_key: str,
                      all_rank_num_tokens: list[int] | None,
                      use_dp_padding: bool) -> torch.Tensor:
    return torch.empty_like(x)
