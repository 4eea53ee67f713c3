"""H200 A/B of the fp8 ws gate/up kernel: shipped (two N = 64 wgmmas per K step) against
``fp8_ws_onedot.py`` (one N = 128 wgmma over ``[gate | up]``), inside the shipped fp8 calls
of the cells whose entry is ``kernel="ws"``, eager, interleaved over 4 routings, median of
``--reps``; outputs compared with each other (``torch.equal``) and with DESIGN 11a's
reference on 64 sampled rows.

    PYTHONPATH=. python3 benchmarks/experiments/gateup-n256-2026-12-03/ab_fp8.py --out x.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CELLS = {"mixtral8x7b": (1024, 8192), "qwen3-30b-a3b": (1024, 8192),
         "qwen3-235b-a22b": (1024, 8192), "deepseek-v3": (8192,)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    import fp8_ws_onedot as variant
    from moerun.backends.triton import fp8_ws
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.fp8 import fp8_weights
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.quant import ExpertQuant, QuantConfig, reference_fp8_moe

    shipped_fn, one_dot_fn = fp8_ws.run_experts_fp8_ws, variant.run_experts_fp8_ws
    dev = torch.device("cuda")
    be = TritonExperts()
    qc = QuantConfig()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cells": {}}
    for name, ts in CELLS.items():
        shape = parse_shapes(name)[0]
        torch.cuda.empty_cache()
        gen = torch.Generator(device=dev).manual_seed(0)
        w13, w2, s13, s2, d13, d2 = fp8_weights(shape, dev, gen, torch.bfloat16)
        del d13, d2
        torch.cuda.empty_cache()
        eq = ExpertQuant(config=qc, w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
        e, k = shape.num_experts, shape.top_k
        for t in ts:
            x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
            routings = [draw_routing(t, e, k, gen, dev) for _ in range(4)]

            def run(form, j, x=x, r=routings, w13=w13, w2=w2, eq=eq):
                fp8_ws.run_experts_fp8_ws = one_dot_fn if form == "one-dot" else shipped_fn
                try:
                    return be.run_experts(be.quantize_rows(x, qc), w13, w2, *r[j % 4], quant=eq)
                finally:
                    fp8_ws.run_experts_fp8_ws = shipped_fn

            ref, o = run("shipped", 0), run("one-dot", 0)
            rows = torch.randperm(t, generator=gen, device=dev)[:64].sort().values
            w0, ids0 = routings[0]
            oracle = reference_fp8_moe(x[rows], w13, s13, w2, s2, w0[rows], ids0[rows], qc,
                                       out_dtype=torch.bfloat16).double()
            errs = {f: float((v[rows].double() - oracle).norm() / oracle.norm())
                    for f, v in (("shipped", ref), ("one-dot", o))}
            us = {"shipped": [], "one-dot": []}
            for j in range(3):
                for f in us:
                    run(f, j)
            for j in range(args.reps):
                for f in us:
                    a, b = (torch.cuda.Event(enable_timing=True),
                            torch.cuda.Event(enable_timing=True))
                    a.record()
                    run(f, j)
                    b.record()
                    b.synchronize()
                    us[f].append(a.elapsed_time(b) * 1e3)
            med = {f: statistics.median(v) for f, v in us.items()}
            cell = {"equal": bool(torch.equal(o, ref)), "err": errs, "us": us, "median_us": med,
                    "config": be.fp8_config_source(e, shape.intermediate, shape.hidden, t, k)}
            out["cells"][f"{name}/T={t}"] = cell
            print(f"{name} T={t}: shipped {med['shipped']:9.1f}  one-dot {med['one-dot']:9.1f} "
                  f"({med['one-dot'] / med['shipped']:.3f})  equal={cell['equal']}  err "
                  f"{errs['shipped']:.1e} / {errs['one-dot']:.1e}  {cell['config']}", flush=True)
            if args.out:
                with open(args.out, "w") as fo:
                    json.dump(out, fo, indent=1)
        del w13, w2, s13, s2, eq


if __name__ == "__main__":
    main()
