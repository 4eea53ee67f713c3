"""Probe: the persistent fp8 kernels (``fp8_persistent.py``, an fp8 ``ExpertsConfig`` with
``kernel="persistent"``) against the shipped fp8 configs, on one H200 (issue 12; a device
script, not a benchmark claim: the claims come from ``moerun bench --dtype fp8``).

    PYTHONPATH=. python3 benchmarks/fp8_persistent_probe.py --out $OUT/fp8p.json [--cells ...]

Per cell (shape x T: compute-bound prefill sizes): ``moerun.bench.fp8``'s random e4m3 weights
and scales, fresh ``x`` and ``--routings`` uniform routings, the fp8 floor with the fp8 rate
and ceilings measured in this run; device events, the median of ``--samples`` timed calls
(graph replay at T <= 1024, eager above, as ``moerun bench --dtype fp8``). Timed: the whole
fp8 ``run_experts`` (quantize + align + GEMMs + combine) with the shipped config, then each
persistent candidate (a config override), each checked against the shipped config's output
first (rel err <= 1e-2, the same math), and the bf16 path on the dequantized weights.
Prints a table and writes ``--out`` (every time, and per cell the winner as a tuned entry).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

CELLS = [("mixtral8x7b", 8192), ("qwen3-30b-a3b", 8192), ("qwen3-235b-a22b", 8192),
         ("deepseek-v3", 8192), ("mixtral8x7b", 1024), ("qwen3-30b-a3b", 1024),
         ("qwen3-235b-a22b", 1024), ("deepseek-v3", 1024)]


def candidates():
    """Persistent fp8 configs (tiles obey ``configs.fp8_tile_fits``)."""
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig

    def cfg(bm, gu, dn):
        return ExpertsConfig(block_m=bm, gate_up=gu, down=dn, combine="reduce",
                             kernel="persistent")

    gu64 = GateUpConfig(block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=3)
    gu128 = GateUpConfig(block_n=64, block_k=128, group_m=8, num_warps=8, num_stages=3)
    dn4 = DownConfig(block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=3)
    dn8 = DownConfig(block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=3)
    dn256 = DownConfig(block_n=256, block_k=128, group_m=8, num_warps=8, num_stages=3)

    def st(c, n):
        return type(c)(**{**c.__dict__, "num_stages": n})

    return [cfg(64, gu64, dn4), cfg(128, gu128, dn8), cfg(64, gu64, dn256),
            cfg(64, st(gu64, 4), st(dn4, 4)), cfg(128, st(gu128, 4), st(dn8, 4)),
            cfg(64, GateUpConfig(**{**gu64.__dict__, "flatten": True}),
                DownConfig(**{**dn4.__dict__, "flatten": True}))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="", help="comma list of shape:T (default: all)")
    ap.add_argument("--routings", type=int, default=4)
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--budget-s", type=float, default=420)
    args = ap.parse_args()
    t_start = time.time()

    from moerun.backends.triton import TritonExperts
    from moerun.backends.triton.configs import ConfigTable
    from moerun.bench.ceilings import measure_run_ceilings
    from moerun.bench.fp8 import fp8_floor_us, fp8_weights, measure_fp8_rate
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import SHAPES
    from moerun.bench.timing import time_graph_replay, time_samples
    from moerun.quant import ExpertQuant, QuantConfig
    from moerun.testing import rel_err

    dev = torch.device("cuda")
    ceil = measure_run_ceilings(dev, torch.bfloat16)
    rate = measure_fp8_rate(dev)
    fp8_rate = max(rate.values())
    print(f"ceilings {ceil.describe()}; fp8 rate {fp8_rate / 1e12:.0f} TFLOP/s", flush=True)
    cells = CELLS
    if args.cells:
        want = {(c.split(":")[0], int(c.split(":")[1])) for c in args.cells.split(",")}
        cells = [c for c in CELLS if c in want]
    qc = QuantConfig()
    shipped = TritonExperts()
    cands = candidates()
    report = {"ceilings": ceil.describe(), "fp8_rate": fp8_rate, "cells": []}
    rows = []
    for name, t in cells:
        if time.time() - t_start > args.budget_s:
            print(f"budget spent: skipping {name} T={t}", flush=True)
            continue
        shape = SHAPES[name]
        gen = torch.Generator(device=dev).manual_seed(7)
        w13, w2, s13, s2, d13, d2 = fp8_weights(shape, dev, gen, torch.bfloat16)
        eq = ExpertQuant(config=qc, w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
        e, k, h = shape.num_experts, shape.top_k, shape.hidden
        x = torch.randn(t, h, generator=gen, device=dev, dtype=torch.bfloat16)
        routings = [draw_routing(t, e, k, gen, dev) for _ in range(args.routings)]
        hit = sum(int(torch.unique(ids).numel()) for _, ids in routings) / len(routings)
        floor = fp8_floor_us(shape, t, hit, ceil, fp8_rate)
        graph = t <= 1024
        n = len(routings)

        def timed(fn):
            if graph:
                return statistics.median(time_graph_replay(fn, n, args.samples, warmup=2)) * 1e6
            return statistics.median(time_samples(fn, dev, args.samples, warmup=2)) * 1e6

        def call(backend):
            def fn(j):
                w, ids = routings[j % n]
                return backend.run_experts(x, w13, w2, w, ids, quant=eq)
            return fn

        cell = {"shape": name, "T": t, "floor_us": floor, "times": {}}
        base_cfg = shipped.fp8_config_for(e, shape.intermediate, h, t, k)
        ref = call(shipped)(0)
        cell["times"]["shipped " + base_cfg.key()] = us = timed(call(shipped))
        bf16 = TritonExperts()
        cell["bf16_us"] = bus = timed(lambda j: bf16.run_experts(x, d13, d2, *routings[j % n]))
        best = ("shipped", us)
        for c in cands:
            key = c.key()
            try:
                be = TritonExperts(ConfigTable(overrides={b: c for b in range(1, 1 << 15)}))
                out = call(be)(0)
                err = rel_err(out.float(), ref.double())
                if err > 1e-2:
                    cell["times"][key] = f"wrong: rel err {err:.2e}"
                    continue
                cell["times"][key] = cu = timed(call(be))
                if cu < best[1]:
                    best = (key, cu, c.to_json())
            except Exception as ex:  # noqa: BLE001 -- a probe: record and go on
                cell["times"][key] = f"FAIL {type(ex).__name__}: {str(ex)[:300]}"
            print(f"  {name} T={t} {key}: {cell['times'][key]}", flush=True)
        cell["best"] = best
        report["cells"].append(cell)
        rows.append(f"{name:16s} T={t:<5d} floor {floor:9.1f}  shipped {us:9.1f} "
                    f"({floor / us:.3f})  best {best[1]:9.1f} ({floor / best[1]:.3f}) "
                    f"x{us / best[1]:.3f}  bf16 {bus:9.1f}  fp8/bf16 {best[1] / bus:.3f}  "
                    f"{best[0]}")
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print("\n".join(rows))
    print(f"wall {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
