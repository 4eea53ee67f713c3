"""Same-run A/B of the ws fp8 kernels' grid (``lockstep.diff`` applied): mode 0 = the shipped
grid (one program per SM, ``group_m`` from the config), 1 = the carried gate/up on
``group_m' * grid_n`` programs with ``group_m' = SMs // grid_n`` (each program then keeps one
weight column tile and one row offset in every round, so the programs that share a weight
tile stay the same ones), 2 = the carried down too. Only where that grid keeps >= 90 % of the
SMs. Whole layer fp8 calls (eager, device events), modes interleaved per round, medians;
outputs compared bit for bit with mode 0.

    PYTHONPATH=. python3 benchmarks/experiments/ws-lockstep-2026-12-05/ab.py --out ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

CELLS = ["deepseek-v3:8192", "qwen3-235b-a22b:8192", "qwen3-30b-a3b:8192",
         "deepseek-v3-ep8-local:8192", "mixtral8x7b:8192"]


def _timed(fn, n):
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return ts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=8)
    args = ap.parse_args()
    from moerun.backends.triton import TritonExperts
    from moerun.bench.fp8 import fp8_weights, layer_fp8_call
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import SHAPES
    from moerun.quant import ExpertQuant, QuantConfig

    dev = torch.device("cuda")
    be = TritonExperts()
    out = {"device": torch.cuda.get_device_name(0), "cells": {}}
    for cell in args.cells.split(","):
        name, t = cell.split(":")
        t = int(t)
        shape = SHAPES[name]
        gen = torch.Generator(device=dev).manual_seed(0)
        e, h, i = shape.num_experts, shape.hidden, shape.intermediate
        x = torch.randn(t, h, generator=gen, device=dev, dtype=torch.bfloat16)
        w, ids = draw_routing(t, e, shape.top_k, gen, dev)
        w13, w2, s13, s2, d13, d2 = fp8_weights(shape, dev, gen, torch.bfloat16)
        del d13, d2
        torch.cuda.empty_cache()
        eq = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2,
                         out_dtype=torch.bfloat16)
        cfg = be.config_for(e, i, h, t, shape.top_k, torch.float8_e4m3fn)

        def call():
            return layer_fp8_call(be, shape, x, w13, w2, w, ids, eq)

        ref = None
        times = {0: [], 1: [], 2: []}
        equal = {}
        for r in range(args.rounds):
            for mode in (0, 1, 2) if r % 2 == 0 else (2, 1, 0):
                os.environ["MOERUN_WS_LOCKSTEP"] = str(mode)
                y = call()
                torch.cuda.synchronize()
                if mode == 0 and ref is None:
                    ref = y.clone()
                elif ref is not None and mode not in equal:
                    equal[mode] = bool(torch.equal(y, ref))
                times[mode].append(statistics.median(_timed(call, args.n)))
        os.environ["MOERUN_WS_LOCKSTEP"] = "0"
        med = {m: round(statistics.median(v), 1) for m, v in times.items()}
        row = {"config": str(cfg), "median_us": med,
               "ratio_1": round(med[1] / med[0], 4), "ratio_2": round(med[2] / med[0], 4),
               "rounds": {m: [round(v, 1) for v in vs] for m, vs in times.items()},
               "bit_equal": equal}
        out["cells"][cell] = row
        print(cell, json.dumps({k: row[k] for k in ("median_us", "ratio_1", "ratio_2",
                                                    "bit_equal")}), flush=True)
        del w13, w2, s13, s2, x
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
