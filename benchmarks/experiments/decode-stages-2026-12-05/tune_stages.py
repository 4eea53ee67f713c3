"""``moerun tune`` at the T=1 points with deeper software pipelines in the direct decode space
(``tune_plan.fp8_direct_candidates`` / ``direct_candidates`` extended in this process only).

The shipped direct candidates pipeline 2-4 K steps. A decode call is bound by the bytes in
flight, and an fp8 weight tile of the same shape holds half the bytes of a bf16 one; the
2026-12-05 H200 tune log already had the 32-column fp8 gate/up 10 % faster at 4 stages than
at 3 (10.9 against 12.1 µs). Added here: the same tiles at 6 and 8 stages (gate/up and both
down forms), besides the shipped candidates, so the tuner's incumbent and the shipped tiles
are timed in the same run. Arguments are passed to ``moerun tune``.

    PYTHONPATH=. python3 benchmarks/experiments/decode-stages-2026-12-05/tune_stages.py \
        --dtype fp8 --shapes qwen3-30b-a3b --T 1 --out-dir DIR
"""

from __future__ import annotations

import sys


def _deeper(shipped, gate_ups, per_token, per_pair):
    """``shipped`` plus every (gate/up, down) pair of the deeper tiles, direct kernels."""
    from moerun.backends.triton.configs import ExpertsConfig

    def space(tokens: int) -> list[ExpertsConfig]:
        base = shipped(tokens)
        if not base:
            return base
        extra = [ExpertsConfig(block_m=16, gate_up=g, down=d, combine=c, kernel="direct")
                 for c, downs in (("reduce", per_token), ("atomic", per_pair))
                 for g in gate_ups for d in downs]
        return base + [e for e in extra if e not in base]

    return space


def main() -> int:
    from moerun.backends.triton import tune_plan as tp
    from moerun.backends.triton.configs import FP8_GROUP, DownConfig, GateUpConfig
    from moerun.cli import main as cli

    G, D = GateUpConfig, DownConfig
    f8 = FP8_GROUP
    tp.fp8_direct_candidates = _deeper(
        tp.fp8_direct_candidates,
        gate_ups=tuple(G(block_n=n, block_k=f8, num_stages=s) for n, s in
                       ((32, 4), (32, 6), (32, 8), (64, 6), (16, 8))),
        per_token=tuple(D(block_n=n, block_k=f8, num_stages=s) for n, s in ((16, 6), (32, 6))),
        per_pair=tuple(D(block_n=n, block_k=f8, num_stages=s) for n, s in
                       ((64, 4), (64, 6), (32, 6), (128, 5))))
    tp.direct_candidates = _deeper(
        tp.direct_candidates,
        gate_ups=tuple(G(block_n=n, block_k=k, num_stages=s) for n, k, s in
                       ((32, 128, 4), (32, 128, 6), (64, 128, 5), (32, 256, 4), (16, 256, 6))),
        per_token=tuple(D(block_n=n, block_k=k, num_stages=s) for n, k, s in
                        ((16, 256, 6), (32, 128, 6))),
        per_pair=tuple(D(block_n=n, block_k=k, num_stages=s) for n, k, s in
                       ((64, 128, 4), (64, 128, 6), (64, 256, 4), (32, 256, 4))))
    return cli(["tune", *sys.argv[1:]])


if __name__ == "__main__":
    raise SystemExit(main())
