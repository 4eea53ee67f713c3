"""The direct decode path with and without the L2 prefetch of the down weights
(``GateUpConfig.prefetch``, ``moerun/_triton/prefetch.py``; this folder's README), timed as
the bench times a graph cell (``moerun.bench.timing.time_graph_replay``: one graph of
``--calls`` calls with fresh routings, event-timed replays, seconds per call).

Per cell (``name:T``) and dtype (bf16 on the dequantized weights; fp8 as the layer calls it,
rows quantized first):

1. ``sweep``: every direct candidate of ``moerun tune`` (``direct_candidates`` /
   ``fp8_direct_candidates``) at prefetch 0, 1 and 2, one median each;
2. ``ab``: the shipped entry's tile (if direct) and the sweep's best tile, each at prefetch
   0, 1 and 2,
   interleaved over ``--rounds`` rounds (a median per round; the order rotates);
3. ``equal``: for each A/B tile, whether the three modes' outputs are bit-equal, and the
   relative error of the mode-0 output against the fp32 reference (bf16) or DESIGN 11a's
   (fp8);
4. ``kernels``: for each A/B config, the per-kernel device time of eager calls (torch
   profiler, µs per call; with PDL a kernel's time includes its wait for the previous one),
   which says whether the down launch got faster and the gate/up one slower.

``plan`` records, per mode, whether ``prefetch_plan`` turned the prefetch on for the call
(off past half the L2). Floors are ``moerun bench``'s (measured ceilings of this run).

    PYTHONPATH=. python3 benchmarks/experiments/decode-prefetch-2026-12-05/prefetch_probe.py \\
        --out probe.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "ncu-2026-12-05"))
from ab import _kernels  # noqa: E402  (the per-kernel profiler of the ncu experiment's A/B)

MODES = (0, 1, 2)


def _setup(name: str, t: int, calls: int, seed: int):
    from moerun.bench.fp8 import fp8_weights
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.quant import ExpertQuant, QuantConfig

    dev = torch.device("cuda")
    shape = parse_shapes(name)[0]
    gen = torch.Generator(device=dev).manual_seed(seed)
    q13, q2, s13, s2, d13, d2 = fp8_weights(shape, dev, gen, torch.bfloat16)
    x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
    routings = [draw_routing(t, shape.num_experts, shape.top_k, gen, dev) for _ in range(calls)]
    eq = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
    return shape, x, (q13, q2, d13, d2), routings, eq


def _calls(dtype: str, cfg, t, x, weights, routings, eq):
    """One call per routing through a TritonExperts whose bucket of T holds ``cfg``."""
    from moerun.backends.triton import TritonExperts
    from moerun.backends.triton.configs import ConfigTable, bucket_of

    q13, q2, d13, d2 = weights
    be = TritonExperts(ConfigTable(overrides={bucket_of(t): cfg}))
    if dtype == "bf16":
        return [lambda w=w, ids=ids: be.run_experts(x, d13, d2, w, ids) for w, ids in routings]
    return [lambda w=w, ids=ids: be.run_experts(be.quantize_rows(x, eq.config), q13, q2, w, ids,
                                                quant=eq) for w, ids in routings]


def _time(fns, replays: int) -> float:
    from moerun.bench.timing import time_graph_replay

    return statistics.median(time_graph_replay(lambda i: fns[i](), len(fns), replays,
                                               warmup=3)) * 1e6


def _with(cfg, mode: int):
    return dataclasses.replace(cfg, gate_up=dataclasses.replace(cfg.gate_up, prefetch=mode))


def _cell(name: str, t: int, dtype: str, calls: int, replays: int, rounds: int,
          floor_us: float) -> dict:
    from moerun._triton.prefetch import prefetch_plan
    from moerun.backends.triton import TritonExperts
    from moerun.backends.triton.tune_plan import direct_candidates, fp8_direct_candidates
    from moerun.backends.reference import reference_moe
    from moerun.quant import reference_fp8_moe

    shape, x, weights, routings, eq = _setup(name, t, calls, 0)
    s, h, i, k = shape.num_experts, shape.hidden, shape.intermediate, shape.top_k
    be0 = TritonExperts()
    shipped = (be0.config_for(s, i, h, t, k, torch.bfloat16) if dtype == "bf16"
               else be0.fp8_config_for(s, i, h, t, k))
    w2 = weights[3] if dtype == "bf16" else weights[1]
    plan = {m: prefetch_plan(m, w2, x, t * k).mode for m in MODES}
    rec = {"cell": f"{name}:{t}", "name": name, "T": t, "dtype": dtype,
           "floor_us": round(floor_us, 2),
           "shipped": shipped.key(), "plan": plan, "sweep": [], "ab": {}}
    if shipped.kernel != "direct":
        rec["note"] = "shipped entry is not direct"
    tiles = direct_candidates(t) if dtype == "bf16" else fp8_direct_candidates(t)
    for cfg in tiles:
        for m in MODES:
            us = _time(_calls(dtype, _with(cfg, m), t, x, weights, routings, eq), replays)
            rec["sweep"].append({"config": _with(cfg, m).key(), "us": round(us, 2)})
        print(dtype, name, t, rec["sweep"][-3:], flush=True)
    by_key = {r["config"]: r["us"] for r in rec["sweep"]}
    best = min(tiles, key=lambda c: min(by_key[_with(c, m).key()] for m in MODES))
    ab_tiles = [shipped] if shipped.kernel == "direct" else []  # (else: no direct entry)
    if best not in ab_tiles:
        ab_tiles.append(best)
    ab_cfgs = [_with(c, m) for c in ab_tiles for m in MODES]
    fns = {c.key(): _calls(dtype, c, t, x, weights, routings, eq) for c in ab_cfgs}
    samples = {c.key(): [] for c in ab_cfgs}
    for r in range(rounds):
        order = ab_cfgs[r % len(ab_cfgs):] + ab_cfgs[:r % len(ab_cfgs)]
        for c in order:
            samples[c.key()].append(_time(fns[c.key()], replays))
    for key, v in samples.items():
        med = statistics.median(v)
        rec["ab"][key] = {"us": round(med, 2), "rounds": [round(u, 2) for u in v],
                          "floor_over_time": round(floor_us / med, 4),
                          "kernels": _kernels(fns[key][0], calls=20),
                          "config": next(c for c in ab_cfgs if c.key() == key).to_json()}
    w, ids = routings[0]
    q13, q2, d13, d2 = weights
    for c in ab_tiles:
        outs = [_calls(dtype, _with(c, m), t, x, weights, [(w, ids)], eq)[0]() for m in MODES]
        torch.cuda.synchronize()
        if dtype == "bf16":
            ref = reference_moe(x.float(), d13.float(), d2.float(), w, ids)
        else:
            ref = reference_fp8_moe(x, q13, eq.w13_scale, q2, eq.w2_scale, w, ids, eq.config)
        err = ((outs[0].float() - ref.float()).norm() / ref.float().norm()).item()
        rec.setdefault("equal", {})[_with(c, 0).key()] = {
            "bit_equal": all(torch.equal(o, outs[0]) for o in outs[1:]), "rel_err": err}
    print("ab", json.dumps({k: v["us"] for k, v in rec["ab"].items()}), flush=True)
    return rec


def main() -> None:
    from moerun.bench.ceilings import floor_for, measure_run_ceilings
    from moerun.bench.fp8 import fp8_floor_us, measure_fp8_rate
    from moerun.bench.shapes import parse_shapes

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="qwen3-30b-a3b:1")
    ap.add_argument("--dtypes", default="bf16,fp8")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--replays", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    dev = torch.device("cuda")
    ceil = measure_run_ceilings(dev, torch.bfloat16)
    rate = max(measure_fp8_rate(dev).values())
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "ceilings": ceil.describe(), "fp8_rate": rate, "cells": []}
    for cell in args.cells.split(","):
        name, t = cell.split(":")
        shape = parse_shapes(name)[0]
        hit = min(shape.num_experts, int(t) * shape.top_k)  # upper bound; exact at T = 1
        for dtype in args.dtypes.split(","):
            floor_us = (floor_for(shape, int(t), hit, 2, ceil).us if dtype == "bf16"
                        else fp8_floor_us(shape, int(t), hit, ceil, rate))
            res["cells"].append(_cell(name, int(t), dtype, args.calls, args.replays,
                                      args.rounds, floor_us))
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
