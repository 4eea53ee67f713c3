"""moerun as a transformers 5.x experts implementation: ``model.set_experts_implementation("moerun")``.

Legend: ``T`` tokens, ``H`` hidden, ``I`` expert intermediate, ``E`` experts, ``K`` top-k.

transformers 5 dispatches the forward of every experts module decorated with
``@use_experts_implementation`` (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3, MiniMax-M2, ... but not
Llama 4's) through its ``ExpertsInterface``: ``fn(experts, hidden_states [T, H], top_k_index
[T, K], top_k_weights [T, K]) -> [T, H]``. The HF block keeps its own routing; moerun computes
only the experts, on one rank, with the backend ``"auto"`` picks for the shape, dtype and
device (:func:`moerun.fused_experts`). For expert parallelism use :func:`moerun.patch_model`.

Registration is explicit (:func:`register_experts_interface`): importing moerun never imports
``transformers`` (an optional dependency).
"""

from __future__ import annotations

from typing import Any

import torch

from moerun.backends import Backend, backend_candidates
from moerun.backends.base import Deployment, Problem
from moerun.config import Activation
from moerun.env import get_env
from moerun.functional import fused_experts
from moerun.hf import _expert_layout, _expert_weights

__all__ = ["EXPERTS_INTERFACE_NAME", "moerun_experts_forward", "register_experts_interface"]

#: The key moerun registers in transformers' ``ExpertsInterface``.
EXPERTS_INTERFACE_NAME = "moerun"


def _sizes(experts: Any) -> tuple[int, int, int]:
    """``(E, H, I)`` read from the fused tensors in their stored orientation."""
    gate_up = experts.gate_up_proj
    down = experts.down_proj
    if getattr(experts, "is_transposed", False):  # [E, H, 2I] / [E, I, H]
        return gate_up.shape[0], gate_up.shape[1], down.shape[1]
    return gate_up.shape[0], gate_up.shape[2], down.shape[2]


def _weights(experts: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``w13 [E, 2I, H]``, ``w2 [E, H, I]`` of an experts module (checked every call).

    The plain layout (``[E, 2I, H]``, gate rows then up rows) is used as stored, so it follows
    ``.to()`` and in-place weight updates; other layouts (transposed, interleaved) are
    converted once per weight version and cached on the module.
    """
    e, h, i = _sizes(experts)
    gate_up, down, transposed, concatenated = _expert_layout(
        experts, transposed_default=False, e=e, h=h, i=i)
    if not transposed and concatenated:
        return gate_up, down
    key = (gate_up.data_ptr(), gate_up._version, down.data_ptr(), down._version)
    cached = experts.__dict__.get("_moerun_weights")
    if cached is None or cached[0] != key:
        cached = (key, _expert_weights(experts, transposed_default=False, e=e, h=h, i=i))
        experts.__dict__["_moerun_weights"] = cached
    return cached[1]


def _backend(experts: Any, x: torch.Tensor, w13: torch.Tensor, top_k: int) -> Backend:
    """The first eligible ``"auto"`` backend for this problem, cached on the module."""
    problem = Problem(num_experts=w13.shape[0], num_slots=w13.shape[0], top_k=top_k,
                      hidden_size=x.shape[1], intermediate_size=w13.shape[1] // 2,
                      dtype=x.dtype, activation=Activation.SILU_GLU, device_type=x.device.type)
    cached = experts.__dict__.get("_moerun_backend")
    if cached is not None and cached[0] == problem:
        return cached[1]
    deployment = Deployment(rank=0, world_size=1, comm_backend="none",
                            num_local_slots=w13.shape[0], divisible=True)
    env = get_env()
    impl = next(c for c in backend_candidates()
                if c.can_implement(problem, deployment, env).ok)()
    experts.__dict__["_moerun_backend"] = (problem, impl)
    return impl


def moerun_experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                           top_k_weights: torch.Tensor) -> torch.Tensor:
    """The ``"moerun"`` experts implementation (called by transformers as ``experts(...)``).

    Args:
        self: the HF experts module (fused ``gate_up_proj`` / ``down_proj``, SiLU, no bias).
        hidden_states: ``[T, H]``, the experts' dtype.
        top_k_index: ``[T, K]`` int64 expert ids from the HF router.
        top_k_weights: ``[T, K]`` routing weights (fp32 or the logits' dtype; used in fp32).

    Returns ``[T, H]`` in ``hidden_states.dtype``. Single rank; no collective; no host sync on
    the plain layout. Raises ``ValueError`` under transformers' own expert parallelism, for a
    dtype mismatch, or for experts moerun does not implement (biases, other activations).
    """
    if getattr(self, "_is_expert_parallel", False):
        raise ValueError(f"experts_implementation='moerun' runs on one rank, but "
                         f"{type(self).__name__} is sharded by transformers' expert parallelism; "
                         "use moerun.patch_model(model, mapping=...) for moerun's own EP")
    w13, w2 = _weights(self)
    if hidden_states.dtype != w13.dtype:
        raise ValueError(f"experts_implementation='moerun': hidden_states.dtype="
                         f"{hidden_states.dtype} differs from {type(self).__name__} weights "
                         f"({w13.dtype}); cast the model with model.to(dtype)")
    impl = _backend(self, hidden_states, w13, top_k_index.shape[-1])
    return fused_experts(hidden_states, w13, w2, top_k_weights, top_k_index, backend=impl,
                         check_inputs=False)


def register_experts_interface() -> str:
    """Register :func:`moerun_experts_forward` as ``"moerun"`` in transformers'
    ``ExpertsInterface`` (process-wide, idempotent) and return ``"moerun"``.

    Afterwards ``model.set_experts_implementation("moerun")`` or
    ``from_pretrained(..., experts_implementation="moerun")`` runs the experts on moerun.
    Raises ``ImportError`` (how to install) without transformers 5.

    Host only; mutates transformers' process-wide ``ExpertsInterface`` registry.
    """
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError as exc:
        raise ImportError("register_experts_interface needs transformers 5.x: "
                          "pip install 'transformers>=5,<6'") from exc
    ExpertsInterface.register(EXPERTS_INTERFACE_NAME, moerun_experts_forward)
    return EXPERTS_INTERFACE_NAME
