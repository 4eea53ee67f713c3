"""mixtral8x7b T=128 bf16 (the peer-bar cell: 32 pairs per expert, 2.8 GB of weights streamed
once) with the persistent TMA kernels (``kernel="persistent"``, 64- and 128-row blocks: one
block per expert) against the shipped grouped entry. The tuner offers persistent configs
only from 160 rows per hit expert (``tune_plan.PERSISTENT_MIN_TPE``), and the 64-rows-per-
expert points where they lost (2026-12-02, 2026-12-05) had short weights; mixtral's T=128
has eight experts with 14336-wide intermediates, where a TMA weight stream might read HBM
better than the grouped kernels' pointer loads. The harness is ``../tail-split-2026-12-06/
t128.py``'s (graph replay, 10 calls a graph, interleaved rounds, median; each output's max
difference from the shipped config's) with this file's configs.

    PYTHONPATH=. python3 benchmarks/experiments/t128-persistent-2026-12-06/probe.py --out x.json
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "tail-split-2026-12-06"))
import t128  # noqa: E402


def configs():
    from moerun.backends.triton.configs import DownConfig as D
    from moerun.backends.triton.configs import ExpertsConfig as E
    from moerun.backends.triton.configs import GateUpConfig as G

    def p(bm, gu, dn, **kw):
        return E(block_m=bm, gate_up=gu, down=dn, combine="reduce", kernel="persistent", **kw)

    gu3 = G(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)
    gu4 = G(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=4)
    gu5 = G(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=5)
    gu64 = G(block_n=64, block_k=128, group_m=4, num_warps=4, num_stages=4)
    dn3 = D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3)
    dn4 = D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=4)
    dn128 = D(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=4)
    dn128w4 = D(block_n=128, block_k=128, group_m=4, num_warps=4, num_stages=4)
    dn64 = D(block_n=64, block_k=128, group_m=4, num_warps=4, num_stages=4)
    return {
        "bm64 gu n128k64 s3 | dn n256k64 s3": p(64, gu3, dn3),
        "bm64 gu n128k64 s4 | dn n256k64 s4": p(64, gu4, dn4),
        "bm64 gu n128k64 s5 | dn n256k64 s4": p(64, gu5, dn4),
        "bm64 gu n128k64 s4 | dn n128k64 s4": p(64, gu4, dn128),
        "bm64 gu n64k128 w4 s4 | dn n128k128 w4 s4": p(64, gu64, dn128w4),
        "bm64 gu n64k128 w4 s4 | dn n64k128 w4 s4": p(64, gu64, dn64),
        "bm64 gu n128k64 s4 | dn n256k64 s4 tail_split": p(64, gu4, dn4, tail_split=True),
        "bm128 gu n128k64 s4 | dn n256k64 s4": p(128, gu4, dn4),
    }


if __name__ == "__main__":
    t128.configs = configs
    t128.main()
