"""`moerun tune` with the persistent TMA candidates offered at every 2-byte point, not only
above 160 rows per hit expert (tune_plan.persistent_candidates' threshold, set 2026-12-02 from
three 64-column configs that lost). Question: do the six shipped-space persistent configs
(128-row blocks, flattened down among them) beat the grouped entries at the 64-rows-per-expert
cells (qwen3-30b and qwen3-235b T=1024, qwen3-235b-ep8-local T=256)? Same arguments as
`moerun tune`; use --dry-run or an --out-dir copy."""
import sys

import moerun.backends.triton.tune_plan as tp

_orig = tp.persistent_candidates


def _always(num_slots, top_k, tokens, elt=2):
    # the list does not depend on T beyond the threshold; ask as if far above it
    return _orig(num_slots, top_k, 10 ** 6, elt)


tp.persistent_candidates = _always

if __name__ == "__main__":  # the tuner's compile workers re-import this file (spawn)
    from moerun.cli import main

    sys.exit(main(["tune", *sys.argv[1:]]))
