"""H200 A/B of the bf16 persistent gate/up kernel: shipped (two n128 dots per K step) against
the one-dot form of ``kernel.py`` (one n256 dot over a 4-D weight descriptor), and the
shipped call under balanced routing (the padding bound).

Per cell whose shipped entry is ``kernel="persistent"``, eager, event-timed, the forms
interleaved over 4 uniform routings, ``--reps`` rounds, median µs:

* ``shipped`` and ``one-dot``: the whole call (align, gate/up, down, sum), the gate/up launch
  swapped (``persistent._LAUNCH_GATE_UP``); outputs compared (``torch.equal`` and the max
  relative difference); then a profiler breakdown of each (device µs per call per kernel);
* ``balanced``: the shipped call with every expert given exactly ``T*K/E`` rows (token ``t``
  routed to experts ``t*K+j mod E``): no partial blocks when that count is a multiple of
  128, so ``shipped / balanced`` bounds what any handling of partial blocks can gain (the
  row order differs too, so it is a bound, not a measurement of such a change).

    PYTHONPATH=. python3 benchmarks/experiments/gateup-n256-2026-12-03/ab.py --out x.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CELLS = [("mixtral8x7b", 1024), ("mixtral8x7b", 8192), ("qwen3-30b-a3b", 8192),
         ("deepseek-v3", 8192), ("deepseek-v3-ep8-local", 2048),
         ("deepseek-v3-ep8-local", 8192), ("deepseek-v3-ep8-local", 32768),
         ("qwen3-235b-ep8-local", 2048), ("qwen3-235b-ep8-local", 8192),
         ("qwen3-235b-ep8-local", 32768)]
FORMS = ("shipped", "one-dot", "balanced")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cells", default="", help="name:T,... (default: CELLS)")
    args = ap.parse_args()
    import kernel as kn
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "rows_ab", os.path.join(HERE, "..", "persistent-rows-2026-12-02", "ab.py"))
    rows_ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rows_ab)
    breakdown = rows_ab.breakdown
    from moerun._triton.launch import FastLauncher
    from moerun.backends.triton import persistent as pm
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.configs import ExpertsConfig
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.inputs import draw_routing, make_weights
    from moerun.bench.shapes import parse_shapes

    shipped_launch = pm._LAUNCH_GATE_UP
    one_dot_launch = FastLauncher(kn.gate_up_n2_kernel)
    dev = torch.device("cuda")
    be = TritonExperts()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cells": {}}
    cells = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cells.split(",")] \
        if args.cells else CELLS
    last, wts = None, None
    for name, t in cells:
        shape = parse_shapes(name)[0]
        if last != name:
            wts = None
            torch.cuda.empty_cache()
            wts = make_weights(shape, torch.bfloat16, dev, seed=0)
            last = name
        e, k = shape.num_experts, shape.top_k
        gen = torch.Generator(device=dev).manual_seed(t)
        x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
        routings = [draw_routing(t, e, k, gen, dev) for _ in range(4)]
        bal_ids = ((torch.arange(t, device=dev)[:, None] * k + torch.arange(k, device=dev))
                   % e).to(torch.int32).contiguous()
        balanced = [(w, bal_ids) for w, _ in routings]
        cfg = be.config_for(e, shape.intermediate, shape.hidden, t, k, torch.bfloat16)
        if not isinstance(cfg, ExpertsConfig) or cfg.kernel != "persistent":
            print(name, t, "not persistent:", getattr(cfg, "kernel", cfg), flush=True)
            continue
        bm = cfg.block_m
        used = [int(moe_align(ids, e, bm).num_post.item()) for _, ids in routings]
        useful = t * k / statistics.mean(used)

        def run(form, j, x=x, w=wts, cfg=cfg, r=routings, b=balanced):
            pm._LAUNCH_GATE_UP = one_dot_launch if form == "one-dot" else shipped_launch
            try:
                tw, ids = (b if form == "balanced" else r)[j % 4]
                return be.run_experts(x, w.w13, w.w2, tw, ids)
            finally:
                pm._LAUNCH_GATE_UP = shipped_launch

        cell = {"config": str(cfg), "useful_rows": useful, "forms": {}}
        try:
            ref, o = run("shipped", 0), run("one-dot", 0)
            torch.cuda.synchronize()
        except Exception as ex:  # noqa: BLE001
            print(name, t, "ERROR", str(ex)[:400], flush=True)
            cell["error"] = str(ex)[:400]
            out["cells"][f"{name}/T={t}"] = cell
            continue
        cell["equal"] = bool(torch.equal(o, ref))
        cell["max_rel_diff"] = float((o.float() - ref.float()).abs().max()
                                     / ref.float().abs().max())
        us = {f: [] for f in FORMS}
        for j in range(3):
            for f in FORMS:
                run(f, j)
        for j in range(args.reps):
            for f in FORMS:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                run(f, j)
                b.record()
                b.synchronize()
                us[f].append(a.elapsed_time(b) * 1e3)
        med = {f: statistics.median(v) for f, v in us.items()}
        for f in FORMS:
            cell["forms"][f] = {"us": us[f], "median_us": med[f]}
        print(f"{name} T={t}: shipped {med['shipped']:9.1f}  one-dot {med['one-dot']:9.1f} "
              f"({med['one-dot'] / med['shipped']:.3f})  balanced {med['balanced']:9.1f} "
              f"({med['balanced'] / med['shipped']:.3f})  useful rows {useful:.3f}  "
              f"equal={cell['equal']} diff={cell['max_rel_diff']:.1e}", flush=True)
        for f in ("shipped", "one-dot"):
            bd = breakdown(lambda j, f=f: run(f, j), 10)
            cell["forms"][f]["kernels"] = bd
            print(f"    kernels {f}: " + "; ".join(f"{kk[:28]} {v:.0f}"
                                                  for kk, v in list(bd.items())[:3]), flush=True)
        out["cells"][f"{name}/T={t}"] = cell
        if args.out:
            with open(args.out, "w") as fo:
                json.dump(out, fo, indent=1)


if __name__ == "__main__":
    main()
