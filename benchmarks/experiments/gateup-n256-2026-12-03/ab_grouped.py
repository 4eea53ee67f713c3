"""H200 A/B of the grouped gate/up kernel (``gate_up._gate_up_kernel``, two dots per K step)
against ``kernel_grouped.py`` (one ``[BK, 2 BN]`` dot), inside the shipped calls of every
bf16 matrix cell whose entry runs it (grouped or direct), eager, the two forms interleaved
over 4 routings, median of ``--reps``; outputs compared (``torch.equal``).

    PYTHONPATH=. python3 benchmarks/experiments/gateup-n256-2026-12-03/ab_grouped.py --out x.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = {"mixtral8x7b": (1, 16, 128, 1024), "qwen3-30b-a3b": (1, 16, 128, 1024),
          "qwen3-235b-a22b": (1, 16, 128, 1024, 8192), "deepseek-v3": (1, 16, 128, 1024),
          "deepseek-v3-ep8-local": (256,), "qwen3-235b-ep8-local": (256,)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    import kernel_grouped as kg
    from moerun._triton.launch import FastLauncher
    from moerun.backends.triton import gate_up as gm
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.inputs import draw_routing, make_weights
    from moerun.bench.shapes import parse_shapes

    shipped, one_dot = gm._LAUNCH, FastLauncher(kg.gate_up_one_dot_kernel)
    dev = torch.device("cuda")
    be = TritonExperts()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cells": {}}
    for name, ts in SHAPES.items():
        shape = parse_shapes(name)[0]
        torch.cuda.empty_cache()
        wts = make_weights(shape, torch.bfloat16, dev, seed=0)
        e, k = shape.num_experts, shape.top_k
        for t in ts:
            cfg = be.config_for(e, shape.intermediate, shape.hidden, t, k, torch.bfloat16)
            if cfg.kernel not in ("grouped", "direct"):
                print(name, t, "runs", cfg.kernel, "- skipped", flush=True)
                continue
            gen = torch.Generator(device=dev).manual_seed(t)
            x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
            routings = [draw_routing(t, e, k, gen, dev) for _ in range(4)]

            def run(form, j, x=x, r=routings, w=wts):
                gm._LAUNCH = one_dot if form == "one-dot" else shipped
                try:
                    return be.run_experts(x, w.w13, w.w2, *r[j % 4])
                finally:
                    gm._LAUNCH = shipped

            ref, o = run("shipped", 0), run("one-dot", 0)
            rel = float((o.float() - ref.float()).abs().max() / ref.float().abs().max())
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
            cell = {"config": str(cfg), "equal": bool(torch.equal(o, ref)), "max_rel_diff": rel,
                    "us": us, "median_us": med}
            out["cells"][f"{name}/T={t}"] = cell
            print(f"{name} T={t} {cfg.kernel} bm={cfg.block_m} gu n{cfg.gate_up.block_n} "
                  f"w{cfg.gate_up.num_warps}: shipped {med['shipped']:9.1f}  one-dot "
                  f"{med['one-dot']:9.1f} ({med['one-dot'] / med['shipped']:.3f})  "
                  f"equal={cell['equal']} diff={rel:.1e}", flush=True)
            if args.out:
                with open(args.out, "w") as fo:
                    json.dump(out, fo, indent=1)
        del wts


if __name__ == "__main__":
    main()
