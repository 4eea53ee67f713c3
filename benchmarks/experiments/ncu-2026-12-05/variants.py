"""Experiment variants of the shipped prefill paths, installed by patching the two lazily
imported entry points (``persistent.run_persistent``, ``fp8_ws.run_experts_fp8_ws``):

* ``base``: as shipped;
* ``eg``: tiles in expert-aligned groups (``moerun/backends/triton/tile_order.py``), ``GE``
  from the config's ``group_m`` (:func:`group_experts_for`); ``eg2``: twice that ``GE``;
* ``order`` (fp8 ws only): the two consumer warp groups issue their wgmmas in turns;
* ``eg+order``: both.

Every variant computes the same tiles with the same products in the same order per tile, so
outputs are bit-equal to ``base`` (the A/B checks it).
"""

from __future__ import annotations

import functools

from moerun.backends.triton.tile_order import expert_group_bounds, group_experts_for

from moerun.backends.triton import fp8_ws, persistent

_ORIG_PERSISTENT = persistent.run_persistent
_ORIG_WS = fp8_ws.run_experts_fp8_ws
VARIANTS_BF16 = ("base", "eg", "eg2")
VARIANTS_FP8 = ("base", "eg", "order", "eg+order")


def _persistent_eg(x, w13, w2, topk_weights, topk_ids, cfg, shared=None, *, mult=1):
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum

    if shared is not None or not persistent.tma_compatible(w13, w2):
        return _ORIG_PERSISTENT(x, w13, w2, topk_weights, topk_ids, cfg, shared=shared)
    s, k = w13.shape[0], topk_ids.shape[1]
    align = moe_align(topk_ids, s, cfg.block_m)
    ge = mult * group_experts_for(cfg.gate_up.group_m, topk_ids.numel(), s, cfg.block_m)
    b = expert_group_bounds(align.expert_ids, ge)
    act = persistent.gate_up_persistent(x, w13, align, k, cfg.gate_up, programs=cfg.programs,
                                        bounds=b)
    y = persistent.down_persistent(act, w2, align, topk_weights, k, cfg.down,
                                   programs=cfg.programs, bounds=b)
    return moe_sum(y, topk_ids, s)


def _ws(x, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, *, eg, ordered, **kw):
    ge = 0
    if eg:
        ge = group_experts_for(kw["group_m"], topk_ids.numel(), w13.shape[0], fp8_ws.WS_BLOCK_M)
    return _ORIG_WS(x, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids,
                    group_experts=ge, ordered=ordered, **kw)


def install(variant: str) -> None:
    """Patch the entry points for ``variant`` (``base`` restores the shipped ones)."""
    persistent.run_persistent = _ORIG_PERSISTENT
    fp8_ws.run_experts_fp8_ws = _ORIG_WS
    if variant == "base":
        return
    if variant in ("eg", "eg2"):
        persistent.run_persistent = functools.partial(_persistent_eg,
                                                      mult=2 if variant == "eg2" else 1)
    if variant in ("eg", "order", "eg+order", "eg2"):
        fp8_ws.run_experts_fp8_ws = functools.partial(
            _ws, eg=variant in ("eg", "eg+order", "eg2"), ordered="order" in variant)
        return
    raise ValueError(f"variant={variant!r}: one of {VARIANTS_BF16 + VARIANTS_FP8}")
