"""``moerun tune --dtype fp8`` at decode points with a wider fp8 direct candidate space
(``tune_plan.fp8_direct_candidates`` and ``direct_candidates`` extended in this process
only): gate/up tiles of 16 columns and 2 or 8 warps, per-pair down tiles of 32 columns and 8
warps, besides the shipped candidates (15 fp8, 21 bf16). Arguments are passed to ``moerun tune``.

    PYTHONPATH=. python3 benchmarks/experiments/fp8-wide-2026-12-05/tune_direct.py \
        --dtype fp8 --shapes qwen3-30b-a3b --T 1 --out-dir DIR
"""

from __future__ import annotations

import sys


def main() -> int:
    from moerun.backends.triton import tune_plan as tp
    from moerun.backends.triton.configs import FP8_GROUP, DownConfig, ExpertsConfig, GateUpConfig
    from moerun.cli import main as cli

    shipped = tp.fp8_direct_candidates

    def wider(tokens: int) -> list[ExpertsConfig]:
        base = shipped(tokens)
        if not base:
            return base
        G, D = GateUpConfig, DownConfig
        gate_ups = (G(block_n=16, block_k=FP8_GROUP, num_stages=4),
                    G(block_n=16, block_k=FP8_GROUP, num_stages=4, num_warps=2),
                    G(block_n=32, block_k=FP8_GROUP, num_stages=4, num_warps=2),
                    G(block_n=64, block_k=FP8_GROUP, num_stages=4, num_warps=8))
        old_g = (G(block_n=32, block_k=FP8_GROUP, num_stages=4),
                 G(block_n=64, block_k=FP8_GROUP, num_stages=4))
        per_token = (D(block_n=16, block_k=FP8_GROUP, num_stages=4),
                     D(block_n=32, block_k=FP8_GROUP, num_stages=4))
        per_pair = (D(block_n=32, block_k=FP8_GROUP, num_stages=4),
                    D(block_n=64, block_k=FP8_GROUP, num_stages=4),
                    D(block_n=64, block_k=FP8_GROUP, num_stages=4, num_warps=8))
        extra = [ExpertsConfig(block_m=16, gate_up=g, down=d, combine=c, kernel="direct")
                 for c, downs in (("reduce", per_token), ("atomic", per_pair))
                 for g in gate_ups + old_g for d in downs]
        return base + [e for e in extra if e not in base]

    shipped16 = tp.direct_candidates

    def wider16(tokens: int) -> list[ExpertsConfig]:
        base = shipped16(tokens)
        if not base:
            return base
        G, D = GateUpConfig, DownConfig
        gate_ups = (G(block_n=16, block_k=128, num_stages=4),
                    G(block_n=16, block_k=128, num_stages=4, num_warps=2),
                    G(block_n=32, block_k=128, num_stages=4, num_warps=2),
                    G(block_n=64, block_k=128, num_stages=4, num_warps=8),
                    G(block_n=32, block_k=128, num_stages=4),
                    G(block_n=64, block_k=128, num_stages=4))
        per_pair = (D(block_n=32, block_k=128, num_stages=4),
                    D(block_n=32, block_k=256, num_stages=4),
                    D(block_n=64, block_k=128, num_stages=4),
                    D(block_n=64, block_k=128, num_stages=4, num_warps=8))
        extra = [ExpertsConfig(block_m=16, gate_up=g, down=d, combine="atomic", kernel="direct")
                 for g in gate_ups for d in per_pair]
        return base + [e for e in extra if e not in base]

    tp.fp8_direct_candidates = wider
    tp.direct_candidates = wider16
    return cli(["tune", *sys.argv[1:]])


if __name__ == "__main__":
    raise SystemExit(main())
