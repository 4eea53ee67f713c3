"""Same-run A/B of the tile-order and ordered-issue variants (``variants.py``) on the
prefill cells: whole calls, eager, device events, interleaved rounds, medians; outputs
checked bit-equal to ``base``; per-kernel device time of each variant at one cell.

    PYTHONPATH=. python3 benchmarks/experiments/ncu-2026-12-05/ab.py --out ab.json \
        [--module variants2 --which bf16]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
variants = None  # the variants module (--module), imported in main()

BF16_CELLS = ["deepseek-v3:8192", "mixtral8x7b:1024", "mixtral8x7b:8192", "qwen3-30b-a3b:8192",
              "qwen3-235b-a22b:8192", "deepseek-v3-ep8-local:2048",
              "deepseek-v3-ep8-local:8192", "qwen3-235b-ep8-local:2048"]
FP8_CELLS = ["deepseek-v3:8192", "mixtral8x7b:1024", "mixtral8x7b:8192", "qwen3-30b-a3b:8192",
             "qwen3-235b-a22b:8192", "qwen3-30b-a3b:1024", "qwen3-235b-a22b:1024"]


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


def _kernels(fn, calls=5, top=6, width=40):
    """Device µs per call of each kernel (name cut to ``width``) over ``calls`` calls under
    torch.profiler, the ``top`` largest (None: all), largest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    tot = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            tot[ev.name[:width]] += ev.device_time_total
    return {k: round(v / calls, 1) for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:top]}


def _cell(be, dtype, shape, t, dev):
    """``(fn, cfg)``: one whole call of ``shape`` at ``t`` tokens (fresh seeded inputs, uniform
    routing) and the config the backend picks for it."""
    from moerun.bench.inputs import draw_routing

    gen = torch.Generator(device=dev).manual_seed(0)
    e, h, i = shape.num_experts, shape.hidden, shape.intermediate
    x = torch.randn(t, h, generator=gen, device=dev, dtype=torch.bfloat16)
    w, ids = draw_routing(t, e, shape.top_k, gen, dev)
    if dtype == "bf16":
        w13 = torch.randn(e, 2 * i, h, device=dev, dtype=torch.bfloat16, generator=gen)
        w13 *= h ** -0.5
        w2 = torch.randn(e, h, i, device=dev, dtype=torch.bfloat16, generator=gen) * i ** -0.5
        cfg = be.config_for(e, i, h, t, shape.top_k, torch.bfloat16)
        return (lambda: be.run_experts(x, w13, w2, w, ids)), cfg
    from moerun.bench.fp8 import fp8_weights, layer_fp8_call
    from moerun.quant import ExpertQuant, QuantConfig

    w13, w2, s13, s2, _, _ = fp8_weights(shape, dev, gen, torch.bfloat16)
    eq = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
    cfg = be.config_for(e, i, h, t, shape.top_k, torch.float8_e4m3fn)
    return (lambda: layer_fp8_call(be, shape, x, w13, w2, w, ids, eq)), cfg


def run(dtype, cells, variant_names, rounds, n, breakdown_cell, emit):
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.shapes import parse_shapes

    be = TritonExperts()
    dev = torch.device("cuda")
    for cell in cells:
        name, t = cell.split(":")
        fn, cfg = _cell(be, dtype, parse_shapes(name)[0], int(t), dev)
        ref = None
        times = {v: [] for v in variant_names}
        same = {}
        t0 = time.time()
        for v in variant_names:  # compile + warm + check
            variants.install(v)
            out = fn()
            fn()
            torch.cuda.synchronize()
            if ref is None:
                ref = out.clone()
            same[v] = bool(torch.equal(out, ref))
        for _ in range(rounds):
            for v in variant_names:
                variants.install(v)
                times[v] += _timed(fn, n)
        med = {v: statistics.median(ts) for v, ts in times.items()}
        row = {"dtype": dtype, "cell": cell, "kernel": cfg.kernel, "group_m": cfg.gate_up.group_m,
               "median_us": {v: round(m, 1) for v, m in med.items()},
               "ratio": {v: round(med[v] / med["base"], 4) for v in variant_names},
               "bit_equal": same, "samples": rounds * n, "wall_s": round(time.time() - t0, 1)}
        if cell == breakdown_cell:
            row["kernels_us"] = {}
            for v in variant_names:
                variants.install(v)
                row["kernels_us"][v] = _kernels(fn)
        variants.install("base")
        emit(row)
        del fn, ref, out
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--which", default="fp8,bf16")
    ap.add_argument("--module", default="variants", help="variants (run 1) or variants2")
    args = ap.parse_args()
    global variants
    import importlib

    variants = importlib.import_module(args.module)
    rows = []

    def emit(r):
        rows.append(r)
        print(json.dumps(r), flush=True)
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)

    for which in args.which.split(","):
        if which == "fp8":
            run("fp8", FP8_CELLS, variants.VARIANTS_FP8, args.rounds, args.n,
                "deepseek-v3:8192", emit)
        else:
            run("bf16", BF16_CELLS, variants.VARIANTS_BF16, args.rounds, args.n,
                "deepseek-v3:8192", emit)
    print("\ncell | dtype | kernel | variant median µs (ratio to base)")
    for r in rows:
        print(f"{r['cell']} | {r['dtype']} | {r['kernel']} | "
              + " | ".join(f"{v} {r['median_us'][v]:.0f} ({r['ratio'][v]:.3f})"
                           f"{'' if r['bit_equal'][v] else ' NOT EQUAL'}"
                           for v in r["median_us"]))


if __name__ == "__main__":
    main()
