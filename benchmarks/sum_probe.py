"""Probe: ``combine.moe_sum`` alone at the prefill cells, on one GPU (device script).

    PYTHONPATH=. python3 benchmarks/sum_probe.py

Per cell (a ``moerun.bench`` shape x T, uniform random routing): random bf16 per-pair rows
``y [T*K, H]``, the launch timed alone (``moerun.bench.timing``: events around each call, no
sync between calls; median of 30 after 3 warm-up calls) with the shipped tile
(``SUM_BLOCK_T`` tokens x ``SUM_BLOCK_H`` columns, ``SUM_WARPS``) and five others, and each
time's bytes (``y`` read, ``[T, H]`` written) as a fraction of the copy rate measured in the
same run. Prints one JSON line per cell; the tile constants are module globals of
``combine.py``, set and restored here.
"""

from __future__ import annotations

import json
import statistics

import torch

import moerun.backends.triton.combine as C
from moerun.bench.ceilings import measure_run_ceilings
from moerun.bench.inputs import draw_routing
from moerun.bench.shapes import SHAPES
from moerun.bench.timing import time_samples

CELLS = (("qwen3-30b-a3b", 8192), ("qwen3-235b-a22b", 8192), ("deepseek-v3", 8192),
         ("mixtral8x7b", 8192), ("deepseek-v3-ep8-local", 2048),
         ("qwen3-235b-ep8-local", 2048), ("mixtral8x7b", 1024))
TILES = ((4, 1024, 4), (8, 1024, 8), (16, 512, 8), (2, 2048, 8), (8, 512, 4), (1, 2048, 4))


def _time_us(fn, n: int = 30) -> float:
    """Median of ``n`` event-timed calls after 3 warm-up calls (``moerun.bench.timing``)."""
    return statistics.median(time_samples(lambda i: fn(), torch.device("cuda"), n,
                                          warmup=3)) * 1e6


def main() -> None:
    ceil = measure_run_ceilings(torch.device("cuda"), torch.bfloat16)
    print("ceilings", ceil.describe(), flush=True)
    shipped = (C.SUM_BLOCK_T, C.SUM_BLOCK_H, C.SUM_WARPS)
    print("shipped", shipped)
    gen = torch.Generator(device="cuda").manual_seed(3)
    for name, t in CELLS:
        sh = SHAPES[name]
        _, ids = draw_routing(t, sh.num_experts, sh.top_k, gen, "cuda")
        y = torch.randn(t * sh.top_k, sh.hidden, device="cuda", dtype=torch.bfloat16)
        nbytes = (y.numel() + t * sh.hidden) * 2
        res = {}
        try:
            for bt, bh, nw in (shipped, *TILES[1:]):
                C.SUM_BLOCK_T, C.SUM_BLOCK_H, C.SUM_WARPS = bt, bh, nw
                us = _time_us(lambda y=y, ids=ids, s=sh.num_experts: C.moe_sum(y, ids, s))
                res[f"{bt}x{bh}w{nw}"] = (round(us, 1),
                                          round(nbytes / (us * 1e-6) / ceil.copy_bw, 3))
        finally:
            C.SUM_BLOCK_T, C.SUM_BLOCK_H, C.SUM_WARPS = shipped
        print(json.dumps({"cell": f"{name} T={t}", "MB": nbytes / 1e6,
                          "us_and_frac_of_copy": res}), flush=True)


if __name__ == "__main__":
    main()
