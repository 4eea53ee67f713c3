"""Second A/B (bf16 persistent down kernel), installed by patching ``persistent.down_persistent``
(looked up at call time by ``run_persistent``):

* ``base``: as shipped;
* ``early``: the epilogue's ``sorted_ids`` / routing-weight loads issued before the K loop
  (``down_persistent(..., early_rows=True)``): Nsight Compute showed the down kernel's warps
  stalled on long scoreboard 2x as often as gate/up's (7.3 against 3.4 per issue), and at
  deepseek-v3 T=8192 a down tile's K loop is only 32 steps;
* ``dflat``: the down tile loop flattened (``DownConfig.flatten=True``: Triton pipelines the
  next tile's first loads into this tile's tail);
* ``early+dflat``: both.

Same products in the same order per tile: outputs bit-equal to ``base``.
"""

from __future__ import annotations

import dataclasses
import functools

from moerun.backends.triton import persistent

_ORIG_DOWN = persistent.down_persistent
VARIANTS_BF16 = ("base", "early", "dflat", "early+dflat")
VARIANTS_FP8 = ("base",)


def _down(act, w2, align, topk_weights, top_k, cfg, *, early, flat, **kw):
    if flat:
        cfg = dataclasses.replace(cfg, flatten=True)
    return _ORIG_DOWN(act, w2, align, topk_weights, top_k, cfg, early_rows=early, **kw)


def install(variant: str) -> None:
    persistent.down_persistent = _ORIG_DOWN
    if variant == "base":
        return
    if variant not in VARIANTS_BF16:
        raise ValueError(f"variant={variant!r}: one of {VARIANTS_BF16}")
    persistent.down_persistent = functools.partial(_down, early="early" in variant,
                                                   flat="dflat" in variant)
