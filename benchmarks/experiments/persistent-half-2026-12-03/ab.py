"""A/B of the bf16 persistent kernels with and without half tiles (device probe, eager).

``half_tiles``: a block whose used rows fit in its first ``BLOCK_M/2`` rows (an expert's
last, mostly padded block) runs a ``BLOCK_M/2``-row tile in both GEMMs instead of a full one.
Same config, same launches (``persistent.run_persistent``'s four). The two forms' outputs are
compared (max relative difference); timing: interleaved, ``--reps`` rounds over 4 routings,
median of the event-timed calls; then the per-kernel device time (torch.profiler).

    PYTHONPATH=. python3 benchmarks/experiments/persistent-half-2026-12-03/ab.py --out x.json
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

DOWN_HALF = False  # run 2: gate/up's wide half tiles only (run 1: both kernels' half tiles)
CELLS = [("mixtral8x7b", 1024), ("mixtral8x7b", 8192), ("qwen3-30b-a3b", 8192),
         ("qwen3-235b-a22b", 1024), ("qwen3-235b-a22b", 8192), ("deepseek-v3", 8192),
         ("deepseek-v3-ep8-local", 256), ("deepseek-v3-ep8-local", 2048),
         ("deepseek-v3-ep8-local", 8192), ("deepseek-v3-ep8-local", 32768),
         ("qwen3-235b-ep8-local", 256), ("qwen3-235b-ep8-local", 2048),
         ("qwen3-235b-ep8-local", 8192), ("qwen3-235b-ep8-local", 32768)]


def breakdown(fn, calls: int) -> dict[str, float]:
    """Device µs per call of each kernel name."""
    for j in range(3):
        fn(j)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for j in range(calls):
            fn(j)
        torch.cuda.synchronize()
    tot: dict[str, float] = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            tot[ev.name[:60]] += ev.device_time_total
    return {k: v / calls for k, v in sorted(tot.items(), key=lambda kv: -kv[1])}


def call(x, w13, w2, w, ids, cfg, half):
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum
    from moerun.backends.triton.persistent import down_persistent, gate_up_persistent

    s, k = w13.shape[0], ids.shape[1]
    align = moe_align(ids, s, cfg.block_m)
    act = gate_up_persistent(x, w13, align, k, cfg.gate_up, programs=cfg.programs,
                             half_tiles=half)
    y = down_persistent(act, w2, align, w, k, cfg.down, programs=cfg.programs,
                        half_tiles=DOWN_HALF and half)
    return moe_sum(y, ids, s)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cells", default="", help="name:T,... (default: CELLS)")
    args = ap.parse_args()
    from moerun.backends.triton.configs import ExpertsConfig
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.inputs import draw_routing, make_weights
    from moerun.bench.shapes import parse_shapes

    dev = torch.device("cuda")
    be = TritonExperts()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cells": {}}
    last = None
    cells = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cells.split(",")] \
        if args.cells else CELLS
    for name, t in cells:
        shape = parse_shapes(name)[0]
        if last != name:
            wts = None
            torch.cuda.empty_cache()
            wts = make_weights(shape, torch.bfloat16, dev, seed=0)
            last = name
        gen = torch.Generator(device=dev).manual_seed(t)
        x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
        routings = [draw_routing(t, shape.num_experts, shape.top_k, gen, dev) for _ in range(4)]
        cfg = be.config_for(shape.num_experts, shape.intermediate, shape.hidden, t,
                            shape.top_k, torch.bfloat16)
        if not isinstance(cfg, ExpertsConfig) or cfg.kernel != "persistent":
            print(name, t, "not persistent:", getattr(cfg, "kernel", cfg), flush=True)
            continue
        cell = {"config": str(cfg), "variants": {}}
        try:
            ref = call(x, wts.w13, wts.w2, *routings[0], cfg, False)
            o = call(x, wts.w13, wts.w2, *routings[0], cfg, True)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            print(name, t, "ERROR", str(e)[:400], flush=True)
            cell["error"] = str(e)[:400]
            out["cells"][f"{name}/T={t}"] = cell
            continue
        cell["max_rel_diff"] = float((o.float() - ref.float()).abs().max()
                                     / ref.float().abs().max())
        cell["equal"] = bool(torch.equal(o, ref))
        for half in (False, True):
            cell["variants"][str(half)] = {"us": []}
        for j in range(3):
            for half in (False, True):
                call(x, wts.w13, wts.w2, *routings[j % 4], cfg, half)
        for j in range(args.reps):
            for half in (False, True):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                call(x, wts.w13, wts.w2, *routings[j % 4], cfg, half)
                b.record()
                b.synchronize()
                cell["variants"][str(half)]["us"].append(a.elapsed_time(b) * 1e3)
        for half in (False, True):
            d = cell["variants"][str(half)]
            d["median_us"] = statistics.median(d["us"])
        f, h = (cell["variants"][k]["median_us"] for k in ("False", "True"))
        print(f"{name} T={t} bm={cfg.block_m}: full {f:9.1f} us  half {h:9.1f} us  "
              f"ratio {h / f:.3f}  equal={cell['equal']} diff={cell['max_rel_diff']:.1e}",
              flush=True)
        for half in (False, True):
            b = breakdown(lambda j, half=half, x=x, w=wts, r=routings, c=cfg:
                          call(x, w.w13, w.w2, *r[j % 4], c, half), 10)
            cell["variants"][str(half)]["kernels"] = b
            print(f"    kernels half={half}: " + "; ".join(
                f"{k[:26]} {us:.0f}" for k, us in list(b.items())[:3]), flush=True)
        out["cells"][f"{name}/T={t}"] = cell
        if args.out:
            with open(args.out, "w") as fo:
                json.dump(out, fo, indent=1)


if __name__ == "__main__":
    main()
