"""Filling a :class:`moerun.layer.ConfigurableMoE`'s weights: its two public loaders
(``load_weights`` from global logical tensors, ``load_expert_weights`` from per-expert
items, DESIGN 11b) with their checks, the FP8 weight scales (DESIGN 11a) and the copies into
this rank's slots.

The layer's methods of the same names document the arguments and delegate here; these
functions read the layer's config, mapping, balancer and slot range, copy in place into its
parameters (``w13``, ``w2``, ``w13_scale``, ``w2_scale``, the shared expert, the selection
bias; tensor identities never change) and set its loaded flag. The FP8 dtype and scale
checks themselves are :mod:`moerun._quant_weights`. No collective; no host sync beyond the
copies. Legend: ``E`` logical experts, ``H`` hidden, ``I`` intermediate, ``S`` local slots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from moerun._quant_weights import (
    SCALE_PARTS,
    check_global_scales,
    check_weight_dtype,
    dequantize_shared,
    expert_scale_shapes,
)
from moerun.quant import FP8_DTYPE

if TYPE_CHECKING:  # the layer imports this module; no import back at run time
    from moerun.layer import ConfigurableMoE

__all__ = ["EXPERT_PARTS", "check_extras", "load_expert_items", "load_global"]

#: Parts of one expert each name fills: w13 rows [0, I) are the gate, [I, 2I) the up rows.
EXPERT_PARTS = {"gate_proj": ("gate",), "up_proj": ("up",), "down_proj": ("down",),
                "gate_up_proj": ("gate", "up")}


def load_global(layer: ConfigurableMoE, w13: torch.Tensor, w2: torch.Tensor,
                shared: dict | None = None, *, w13_scale: torch.Tensor | None = None,
                w2_scale: torch.Tensor | None = None,
                e_score_correction_bias: torch.Tensor | None = None) -> None:
    """:meth:`ConfigurableMoE.load_weights` (arguments there): every check first, then the
    copies of this rank's slots, so a failed call leaves the previous weights untouched."""
    cfg = layer.config
    e, h, i = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    if tuple(w13.shape) != (e, 2 * i, h):
        raise ValueError(f"w13 has shape {tuple(w13.shape)}; expected [E={e}, 2*I={2 * i}, "
                         f"H={h}] (gate rows, then up rows)")
    if tuple(w2.shape) != (e, h, i):
        raise ValueError(f"w2 has shape {tuple(w2.shape)}; expected [E={e}, H={h}, I={i}]")
    check_weight_dtype(cfg, "w13", w13)
    check_weight_dtype(cfg, "w2", w2)
    check_global_scales(cfg, w13_scale, w2_scale)
    shared = check_extras(layer, shared, e_score_correction_bias)
    # every check passed: copy (a failed call leaves the previous weights untouched)
    experts = torch.tensor(layer.balancer.local_experts(layer.slot_start, layer.slot_end),
                           dtype=torch.long, device=w13.device)
    layer.w13.copy_(w13.index_select(0, experts))
    layer.w2.copy_(w2.index_select(0, experts))
    if cfg.quant is not None:
        layer.w13_scale.copy_(w13_scale.index_select(0, experts.to(w13_scale.device)))
        layer.w2_scale.copy_(w2_scale.index_select(0, experts.to(w2_scale.device)))
    if layer.shared_expert is not None:
        layer.shared_expert.load(shared["w13"], shared["w2"], shared.get("gate"))
    if layer.e_score_correction_bias is not None:
        layer.e_score_correction_bias.copy_(e_score_correction_bias)
    layer._loaded = True


def check_extras(layer: ConfigurableMoE, shared: dict | None,
                 bias: torch.Tensor | None) -> dict | None:
    """The shared-expert weights and the selection bias both loaders take: present iff the
    config uses them, of the right shapes. Raises ``ValueError``; copies nothing into the
    layer. Returns ``shared`` with fp8 shared weights dequantized (new tensors)."""
    cfg = layer.config
    shared = dequantize_shared(cfg, shared)
    e = cfg.num_experts
    if layer.shared_expert is not None:
        if shared is None:
            raise ValueError("shared is required: config.shared_intermediate_size="
                             f"{cfg.shared_intermediate_size} > 0")
        layer.shared_expert.check(shared["w13"], shared["w2"], shared.get("gate"))
    elif shared is not None:
        raise ValueError("shared given but config.shared_intermediate_size == 0")
    if layer.e_score_correction_bias is not None:
        if bias is None:
            raise ValueError(f"e_score_correction_bias [E={e}] is required by routing "
                             f"method {cfg.routing.method.value}")
        if tuple(bias.shape) != (e,):
            raise ValueError(f"e_score_correction_bias has shape {tuple(bias.shape)}; "
                             f"expected [{e}]")
    elif bias is not None:
        raise ValueError(f"e_score_correction_bias given but routing method "
                         f"{cfg.routing.method.value} does not use one")
    return shared


def load_expert_items(layer: ConfigurableMoE, items: Any, *, shared: dict | None = None,
                      e_score_correction_bias: torch.Tensor | None = None) -> int:
    """:meth:`ConfigurableMoE.load_expert_weights` (arguments, errors and the not-loaded
    state after an error there); returns the number of items copied."""
    cfg = layer.config
    e_total, h, i = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size
    shared = check_extras(layer, shared, e_score_correction_bias)
    bias = e_score_correction_bias
    shapes = {"gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i),
              "gate_up_proj": (2 * i, h), **expert_scale_shapes(cfg)}
    part_names = dict(EXPERT_PARTS)
    required = ("gate", "up", "down")
    if cfg.quant is not None:
        part_names.update(SCALE_PARTS)
        required += ("gate_scale", "up_scale", "down_scale")
        scale_rows = cfg.quant.scale_shape(i, h)[0]  # rows of one of gate / up
    slots: dict[int, list[int]] = {}
    for s, expert in enumerate(layer.balancer.local_experts(layer.slot_start, layer.slot_end)):
        slots.setdefault(int(expert), []).append(s)
    filled: dict[int, set[str]] = {expert: set() for expert in slots}
    copied = 0
    for expert_id, name, value in items:
        if isinstance(expert_id, bool) or not isinstance(expert_id, int) \
                or not 0 <= expert_id < e_total:
            raise ValueError(f"load_expert_weights: expert_id={expert_id!r} must be an int "
                             f"in [0, num_experts={e_total})")
        parts = part_names.get(name)
        if parts is None and name in SCALE_PARTS:
            raise ValueError(f"load_expert_weights: name={name!r} (expert {expert_id}) is "
                             "a weight scale but config.quant is None: build the layer "
                             "with MoEConfig(quant=moerun.QuantConfig()) for fp8 experts")
        if parts is None:
            raise ValueError(f"load_expert_weights: name={name!r} (expert {expert_id}) is "
                             f"unknown; valid: {', '.join(part_names)}")
        if expert_id not in slots:
            continue  # another rank's expert: never read
        if filled[expert_id] & set(parts):
            raise ValueError(f"load_expert_weights: expert {expert_id} {name} given twice "
                             "(gate_up_proj also counts as gate_proj + up_proj)")
        if isinstance(value, torch.Tensor):
            t = value
        elif callable(value):
            t = value()
        elif hasattr(value, "__getitem__"):
            t = value[:]
        else:
            t = value
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shapes[name]:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"load_expert_weights: expert {expert_id} {name} is {got}; "
                             f"expected a tensor of shape {shapes[name]} (I={i}, H={h})")
        if name in SCALE_PARTS:
            if not t.is_floating_point() or t.dtype == FP8_DTYPE:
                raise ValueError(f"load_expert_weights: expert {expert_id} {name} is "
                                 f"{t.dtype}; expected fp32 scale_inv blocks")
        else:
            check_weight_dtype(cfg, f"load_expert_weights: expert {expert_id} {name}", t)
        layer._loaded = False  # from the first copy on, until every local slot is filled
        for s in slots[expert_id]:
            if name == "down_proj":
                layer.w2[s].copy_(t)
            elif name == "down_proj_scale_inv":
                layer.w2_scale[s].copy_(t)
            elif name in SCALE_PARTS:
                lo = scale_rows if name == "up_proj_scale_inv" else 0
                layer.w13_scale[s, lo:lo + t.shape[0]].copy_(t)
            else:
                lo = i if name == "up_proj" else 0
                layer.w13[s, lo:lo + t.shape[0]].copy_(t)
        filled[expert_id].update(parts)
        copied += 1
    missing = {expert: [p for p in required if p not in got]
               for expert, got in filled.items() if len(got) < len(required)}
    if missing:
        def item_name(part: str) -> str:
            return part + "_proj" if not part.endswith("_scale") \
                else part[:-6] + "_proj_scale_inv"

        listed = "; ".join(f"expert {expert} (local slots {slots[expert]}): "
                           f"{', '.join(item_name(p) for p in names)}"
                           for expert, names in sorted(missing.items())[:8])
        more = f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""
        raise ValueError(f"load_expert_weights: rank {layer.mapping.rank} is missing parts "
                         f"of {len(missing)} local experts: {listed}{more}; every local "
                         "expert needs gate_proj + up_proj (or gate_up_proj) and down_proj"
                         + (", each with its _scale_inv" if cfg.quant is not None else ""))
    if layer.shared_expert is not None:
        layer.shared_expert.load(shared["w13"], shared["w2"], shared.get("gate"))
    if layer.e_score_correction_bias is not None:
        layer.e_score_correction_bias.copy_(bias)
    layer._loaded = True
    return copied
