"""``moerun.patch_model``: run a whole transformers 5.x model's sparse-MoE blocks on moerun.

Legend: ``B`` batch, ``S`` sequence, ``T = B * S`` tokens, ``H`` hidden, ``E`` experts.

Every supported block (:data:`moerun.hf.SUPPORTED_BLOCKS`) is replaced by an
:class:`HFMoEBlock`: it keeps the block's own router module (``gate``, Llama 4 ``router``) and
calls it, so the router logits are exactly the ones the HF code computes (in the dtype that
family uses: x.dtype for Mixtral / Qwen / Llama 4, the router weight's dtype for MiniMax-M2,
fp32 for DeepSeek) and transformers' output recorder still collects them for
``output_router_logits`` and the auxiliary loss. The experts (and the shared expert) live in a
:class:`moerun.ConfigurableMoE` (``block.moe``), which does the routing, the communication
under expert parallelism and the expert math. ``transformers`` is never imported here.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from moerun.backends import Backend
from moerun.config import SUPPORTED_DTYPES
from moerun.hf import (SUPPORTED_BLOCKS, _attr, _block_parts, _BlockSpec, _spec_or_none,
                       _split_kwargs)
from moerun.layer import ConfigurableMoE
from moerun.mapping import Mapping

__all__ = ["HFMoEBlock", "patch_model"]


def _slot_items(layer: ConfigurableMoE):
    """``(expert_id, name, tensor)`` of a loaded layer's local experts (one slot per logical
    expert: EPLB replicas hold the same weights), with the FP8 scales of a quantized layer."""
    seen: set[int] = set()
    for s, expert in enumerate(layer.balancer.local_experts(layer.slot_start, layer.slot_end)):
        if expert in seen:
            continue
        seen.add(expert)
        yield int(expert), "gate_up_proj", layer.w13[s]
        yield int(expert), "down_proj", layer.w2[s]
        if layer.config.quant is not None:  # FP8: the block scales travel with the weights
            yield int(expert), "gate_up_proj_scale_inv", layer.w13_scale[s]
            yield int(expert), "down_proj_scale_inv", layer.w2_scale[s]


class HFMoEBlock(nn.Module):
    """A transformers sparse-MoE block whose experts run on a :class:`ConfigurableMoE`.

    Submodules: the HF router under its HF name (``gate`` or ``router``, the same object as
    in the replaced block, so hooks on it keep firing) and ``moe`` (the layer). MiniMax-M2's
    block-level ``e_score_correction_bias`` buffer is kept as well. Built by
    :func:`patch_model`; the replaced block's experts module is dropped.

    ``forward(hidden_states [..., H])`` returns the block's output in the block's format:
    ``[..., H]`` (same shape as the input), or for Llama 4 the tuple ``(out [T, H], router
    logits [T, E])``. Per call: one router call, then ``moe(x [T, H], logits [T, E])`` (a
    collective under expert parallelism: every rank must call every layer the same number of
    times; the token counts are all-gathered, a host sync). Inference semantics: the expert
    weights are frozen (``requires_grad=False``), training-only router jitter is not applied,
    and training through the layer is not tested.

    ``.to(dtype)`` / ``.to(device)`` / ``.half()`` ... (any ``nn.Module._apply``): the router
    and buffers are converted as usual; if the target dtype or device differs from the
    layer's, ``moe`` is rebuilt with ``config.replace(dtype=...)`` on the new device from its
    own local weights (cast with ``copy_``, as ``.to`` casts the HF weights), the correction
    bias re-read from the (converted) HF buffer, and the old layer closed. Host memory: one
    more copy of this rank's experts while rebuilding. Call it between forwards.
    """

    def __init__(self, block: nn.Module, *, mapping: Mapping | None, backend: str | Backend,
                 comm: Any, layer_idx: int | None, device: torch.device | str | None,
                 config_kwargs: dict, layer_kwargs: dict) -> None:
        super().__init__()
        parts = _block_parts(block, config_kwargs)
        self._spec: _BlockSpec = parts.spec
        self.add_module(parts.spec.router, _attr(block, parts.spec.router))
        if parts.spec.router_takes_bias:  # MiniMax-M2: the block owns the router's bias
            self.register_buffer(parts.spec.bias, _attr(block, parts.spec.bias))
        self._build = dict(backend=backend, comm=comm, layer_kwargs=dict(layer_kwargs))
        self.moe = ConfigurableMoE(parts.config, mapping, backend=backend, comm=comm,
                                   layer_idx=layer_idx,
                                   device=parts.device if device is None else device,
                                   **layer_kwargs)
        self.moe.load_expert_weights(parts.items, shared=parts.shared,
                                     e_score_correction_bias=parts.bias)

    @property
    def hf_router(self) -> nn.Module:
        """The HF router module (``self.gate``, Llama 4 ``self.router``)."""
        return self._modules[self._spec.router]

    def forward(self, hidden_states: torch.Tensor) -> Any:
        """The HF block's forward on moerun: ``hidden_states [..., H]`` through the block's own
        router, then the moerun layer; returns ``[..., H]`` in the input's dtype, or
        ``(out [T, H], router_logits [T, E])`` where the HF block returns its logits.

        Side effects: the HF router's launches, then those of :meth:`ConfigurableMoE.forward`
        (collectives over ``mapping.group`` with several ranks; its host syncs)."""
        spec = self._spec
        shape = hidden_states.shape
        x_TH = hidden_states.reshape(-1, shape[-1])
        if spec.router_takes_bias:
            routed = self.hf_router(x_TH, getattr(self, spec.bias))
        else:
            routed = self.hf_router(x_TH)
        logits_TE = routed[spec.logits_index]
        moe_logits = logits_TE
        if moe_logits.dtype not in (torch.float32, x_TH.dtype):
            moe_logits = moe_logits.float()  # the layer takes fp32 or x.dtype
        out_TH = self.moe(x_TH, moe_logits)
        if spec.returns_router_logits:
            return out_TH, logits_TE
        return out_TH.view(shape)

    # -- dtype / device changes -----------------------------------------------------------------
    def _apply(self, fn: Any, recurse: bool = True) -> "HFMoEBlock":
        if recurse:
            for name, child in self.named_children():
                if name != "moe":
                    child._apply(fn)
        for key, buf in self._buffers.items():
            if buf is not None:
                self._buffers[key] = fn(buf)
        if recurse:
            layer = self.moe
            probe = fn(torch.empty(0, dtype=layer.config.dtype, device=layer.device))
            if probe.dtype != layer.config.dtype or probe.device != layer.device:
                self._rebuild(probe.dtype, probe.device)
        return self

    @torch.no_grad()
    def _rebuild(self, dtype: torch.dtype, device: torch.device) -> None:
        old = self.moe
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{type(self).__name__} (layer {old.layer_idx}) cannot run in "
                             f"{dtype}: moerun layers take float32, float16 or bfloat16")
        bias = None
        if old.e_score_correction_bias is not None:
            # the HF buffer, converted like the unpatched model's would be
            bias = _attr(self, self._spec.bias).detach().float()
        shared = None
        if old.shared_expert is not None:
            se = old.shared_expert
            shared = {"w13": se.w13, "w2": se.w2}
            if se.gate is not None:
                shared["gate"] = se.gate
        build = self._build
        new = ConfigurableMoE(old.config.replace(dtype=dtype), old.mapping,
                              backend=build["backend"], comm=build["comm"],
                              layer_idx=old.layer_idx, device=device, **build["layer_kwargs"])
        new.load_expert_weights(_slot_items(old), shared=shared, e_score_correction_bias=bias)
        self.moe = new
        old.close()

    def extra_repr(self) -> str:
        """The patched block's model family, ``on moerun``. Pure; host only."""
        return f"{self._spec.name} on moerun"


def _layer_index(path: str) -> int | None:
    """The last integer component of a module path (``model.layers.3.mlp`` -> 3), else None."""
    numbers = [p for p in path.split(".") if re.fullmatch(r"\d+", p)]
    return int(numbers[-1]) if numbers else None


def patch_model(model: nn.Module, *, mapping: Mapping | None = None,
                backend: str | Backend = "auto", **layer_kwargs: Any) -> int:
    """Replace every supported sparse-MoE block of ``model`` by an :class:`HFMoEBlock`.

    Supported blocks: those of :func:`moerun.from_hf` (:data:`moerun.hf.SUPPORTED_BLOCKS`:
    Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2, DeepSeek-V3, Llama 4 text, MiniMax-M2). Each
    keeps its HF router call and gets a :class:`ConfigurableMoE` built like
    :func:`moerun.from_hf` builds it, with ``layer_idx`` the last integer of the block's module
    path (``model.layers.3.mlp`` -> 3). The model's output is the unpatched model's up to
    floating-point rounding (fp32: ~1e-7 relative), ``output_router_logits`` and the
    auxiliary loss keep working, and ``model.to(dtype or device)`` afterwards rebuilds the
    layers (:class:`HFMoEBlock`).

    Args:
        model: a transformers 5.x model (any ``nn.Module`` holding supported blocks).
        mapping: :class:`moerun.Mapping` for expert parallelism (default one rank). With
            ``ep_size > 1`` every rank runs its own copy of the model on its own batch (attention
            data parallel), keeps only its experts, and every rank must run the same number of
            forwards (e.g. ``generate`` with ``min_new_tokens == max_new_tokens``).
        backend: ``"auto"``, ``"reference"``, ``"triton"``, ``"grouped_mm"`` or a Backend.
        **layer_kwargs: ``comm``, ``device`` (default: each block's expert-weight device),
            ``shared_expert_order``, ``repeat_count``, ``recorder``, ``chunk_overlap`` for
            every layer; the :class:`MoEConfig` fields ``max_num_tokens`` and ``check_inputs``;
            ``balancer``: an ``eplb.LoadBalancer`` (the ``n``-th replaced block, in module
            order, gets ``balancer.layer(n)``).

    Returns:
        The number of blocks replaced (0 when every supported block was already replaced).

    Raises:
        ValueError: the model holds no supported block (lists the supported ones) or is one
            (use :func:`moerun.from_hf`); ``balancer``
            is a per-layer handle (it must be an ``eplb.LoadBalancer``); any error of
            :func:`moerun.from_hf`, before any block is replaced.
        TypeError: ``layer_idx`` was passed (it comes from the module path).

    Side effects: copies this rank's experts of every block, then drops the HF experts
    modules (their memory is freed once nothing else refers to them). No collective here.
    """
    if "layer_idx" in layer_kwargs:
        raise TypeError("patch_model(layer_idx=...) is not accepted: each layer's index is "
                        "read from its module path (model.layers.3.mlp -> 3)")
    comm = layer_kwargs.pop("comm", "auto")
    device = layer_kwargs.pop("device", None)
    balancer = layer_kwargs.pop("balancer", None)
    if balancer is not None and not callable(getattr(balancer, "layer", None)):
        raise ValueError(f"patch_model(balancer={type(balancer).__name__}): pass the model-wide "
                         "eplb.LoadBalancer; each replaced block gets balancer.layer(n)")
    config_kwargs, layer_kwargs = _split_kwargs(layer_kwargs)
    targets = [(name, m) for name, m in model.named_modules() if _spec_or_none(m) is not None]
    if not targets:
        if any(isinstance(m, HFMoEBlock) for m in model.modules()):
            return 0
        raise ValueError(f"patch_model found no supported MoE block in "
                         f"{type(model).__name__}; supported transformers 5.x blocks: "
                         f"{', '.join(SUPPORTED_BLOCKS)}")
    if targets[0][0] == "":
        raise ValueError(f"patch_model got a bare {type(model).__name__}; it replaces the "
                         "blocks inside a model. For one block use moerun.from_hf(block)")
    for _, block in targets:  # every check first, so an error leaves the model untouched
        _block_parts(block, config_kwargs)
    for n, (name, block) in enumerate(targets):
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        kwargs = dict(layer_kwargs)
        if balancer is not None:
            kwargs["balancer"] = balancer.layer(n)
        parent._modules[attr] = HFMoEBlock(
            block, mapping=mapping, backend=backend, comm=comm, layer_idx=_layer_index(name),
            device=device, config_kwargs=config_kwargs, layer_kwargs=kwargs)
    return len(targets)
