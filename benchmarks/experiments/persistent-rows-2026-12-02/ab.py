"""A/B of the bf16 persistent kernels' store forms (device probe, eager, event-timed).

Variants of the shipped ``kernel="persistent"`` call (``persistent.run_persistent``), same
config, same launches:

* ``act_tma``: gate/up's ``act`` tile TMA-stored (instead of a pointer store);
* ``rows``: down writes ``y [R, H]`` in aligned order through TMA (``rows=1``: one tile,
  ``rows=2``: two half tiles) and the pair-to-row map; ``moe_sum`` follows the map
  (``rows=0``: per-pair rows by pointer, as shipped).

Every variant's output is compared with the shipped form's (``torch.equal``: the same sums in
the same order). Timing: the variants interleaved, ``--reps`` rounds over 4 routings, median
of the event-timed calls; then a per-kernel device-time breakdown (torch.profiler) of the
shipped form and the last variant.

    PYTHONPATH=. python3 benchmarks/experiments/persistent-rows-2026-12-02/ab.py --out x.json
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

CELLS = [("mixtral8x7b", 1024), ("mixtral8x7b", 8192), ("qwen3-30b-a3b", 8192),
         ("qwen3-235b-a22b", 8192), ("deepseek-v3", 8192), ("deepseek-v3-ep8-local", 2048),
         ("deepseek-v3-ep8-local", 8192), ("qwen3-235b-ep8-local", 2048),
         ("qwen3-235b-ep8-local", 8192)]
VARIANTS = [(False, 0), (True, 0), (False, 2), (True, 2), (True, 1)]


def breakdown(fn, calls: int) -> dict[str, float]:
    """Device µs per call of each kernel name (as ``fp8-ws-2026-12-02/profile.py``)."""
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


def call(x, w13, w2, w, ids, cfg, act_tma, rows):
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum
    from moerun.backends.triton.persistent import down_persistent, gate_up_persistent

    s, k = w13.shape[0], ids.shape[1]
    align = moe_align(ids, s, cfg.block_m)
    act = gate_up_persistent(x, w13, align, k, cfg.gate_up, programs=cfg.programs,
                             act_tma=act_tma)
    if rows == 0:
        y = down_persistent(act, w2, align, w, k, cfg.down, programs=cfg.programs)
        return moe_sum(y, ids, s)
    pr = torch.empty(ids.numel(), dtype=torch.int32, device=x.device)
    y = down_persistent(act, w2, align, w, k, cfg.down, programs=cfg.programs, pair_rows=pr,
                        rows_split=rows)
    return moe_sum(y, ids, s, rows=pr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=25)
    args = ap.parse_args()
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.inputs import draw_routing, make_weights
    from moerun.bench.shapes import parse_shapes

    dev = torch.device("cuda")
    be = TritonExperts()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cells": {}}
    last = None
    for name, t in CELLS:
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
        if cfg.kernel != "persistent":
            print(name, t, "not persistent:", cfg.kernel, flush=True)
            continue
        variants = [v for v in VARIANTS if not (v[1] == 1 and cfg.down.num_stages > 3)
                    and not (v[0] and cfg.gate_up.num_stages > 4)]
        ref = call(x, wts.w13, wts.w2, *routings[0], cfg, False, 0)
        cell = {"config": str(cfg), "variants": {}}
        for v in variants:
            try:
                o = call(x, wts.w13, wts.w2, *routings[0], cfg, *v)
                torch.cuda.synchronize()
                cell["variants"][str(v)] = {"equal": bool(torch.equal(o, ref)), "us": []}
            except Exception as e:  # noqa: BLE001
                cell["variants"][str(v)] = {"error": str(e)[:300]}
                print(name, t, v, "ERROR", str(e)[:300], flush=True)
        good = [v for v in variants if "error" not in cell["variants"][str(v)]]
        for j in range(3):
            for v in good:
                call(x, wts.w13, wts.w2, *routings[j % 4], cfg, *v)
        for j in range(args.reps):
            for v in good:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                call(x, wts.w13, wts.w2, *routings[j % 4], cfg, *v)
                b.record()
                b.synchronize()
                cell["variants"][str(v)]["us"].append(a.elapsed_time(b) * 1e3)
        for v in good:
            d = cell["variants"][str(v)]
            d["median_us"] = statistics.median(d["us"])
            print(f"{name} T={t} act_tma={v[0]} rows={v[1]}: {d['median_us']:9.1f} us "
                  f"equal={d['equal']}", flush=True)
        for v in (good[0], good[-1]):
            b = breakdown(lambda j, v=v, x=x, w=wts, r=routings, c=cfg:
                          call(x, w.w13, w.w2, *r[j % 4], c, *v), 10)
            cell["variants"][str(v)]["kernels"] = b
            print(f"    kernels {v}: " + "; ".join(f"{k[:28]} {us:.0f}" for k, us in
                                                   list(b.items())[:5]), flush=True)
        out["cells"][f"{name}/T={t}"] = cell
        if args.out:
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
