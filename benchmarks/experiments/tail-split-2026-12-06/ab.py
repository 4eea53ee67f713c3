"""A/B of the bf16 persistent kernels' tail split (``ExpertsConfig.tail_split``; device
probe).

Variants of one call at each cell's shipped persistent config: ``head`` (the persistent
module as it was before the split, ``persistent.py`` at a24d6c3 through ``git show``), ``off``
(the tree's kernels without the split: the refactor alone), ``on`` (with it). The runs in
h100-0510/ (variants ``t1``, ``t2``, ``t4``: an earlier int form) and h100-0520/, h100-0524/
(a stream-K form) timed earlier kernels; README.md. Outputs are compared with ``head`` (max
relative difference).
Timing: interleaved rounds over 4 routings, event-timed, median; eager for every cell (as
``moerun bench`` times eager: no sync between the calls of a round; the first run synced
after each call, which put the host's launch time inside the figure; the order rotates from
round to round, as the first call after the sync reads slower), and for T <= 1024 also
graph replay (10 calls a graph). Then the per-kernel device time (torch.profiler) of
``off`` and ``on`` at T <= 2048. The tiles in use and the tail each GEMM has are printed per
cell (from the alignment's ``num_post``).

    PYTHONPATH=. python3 benchmarks/experiments/tail-split-2026-12-06/ab.py --out x.json
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
import json
import pathlib
import statistics
import subprocess
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

CELLS = [("mixtral8x7b", 1024), ("mixtral8x7b", 8192), ("qwen3-30b-a3b", 8192),
         ("qwen3-235b-a22b", 8192), ("deepseek-v3", 8192),
         ("deepseek-v3-ep8-local", 2048), ("deepseek-v3-ep8-local", 8192),
         ("deepseek-v3-ep8-local", 32768), ("qwen3-235b-ep8-local", 2048),
         ("qwen3-235b-ep8-local", 8192), ("qwen3-235b-ep8-local", 32768)]
VARIANTS = ("head", "off", "on")
BASE_REV = "a24d6c3"  # the tree before the tail split


def _head_module():
    """``moerun/backends/triton/persistent.py`` as of a24d6c3, imported from ``git show``
    (the runs of 2026-12-06 imported the same text from a copy in this folder)."""
    src = subprocess.run(["git", "show", f"{BASE_REV}:moerun/backends/triton/persistent.py"],
                         capture_output=True, text=True, check=True).stdout
    path = pathlib.Path(tempfile.mkdtemp()) / "persistent_head.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("persistent_head", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


HEAD = _head_module()


def call(x, w13, w2, w, ids, cfg, variant):
    from moerun.backends.triton.persistent import run_persistent

    if variant == "head":
        return HEAD.run_persistent(x, w13, w2, w, ids, cfg)
    return run_persistent(x, w13, w2, w, ids,
                          dataclasses.replace(cfg, tail_split=variant == "on"))


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


def graph_of(fn, calls: int):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return g


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--cells", default="", help="name:T,... (default: CELLS)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--no-breakdown", action="store_true")
    args = ap.parse_args()
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.inputs import draw_routing, make_weights
    from moerun.bench.shapes import parse_shapes

    variants = args.variants.split(",")
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    be = TritonExperts()
    out = {"device": torch.cuda.get_device_name(), "sms": sms, "torch": torch.__version__,
           "cells": {}}
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
        if cfg.kernel != "persistent":
            print(name, t, "not persistent:", cfg.kernel, flush=True)
            continue
        tails = []
        for _, ids in routings:
            used = int(moe_align(ids, shape.num_experts, cfg.block_m).num_post[0]) // cfg.block_m
            gu = used * -(-shape.intermediate // cfg.gate_up.block_n)
            dn = used * -(-shape.hidden // cfg.down.block_n)
            tails.append({"blocks": used, "gate_up_tiles": gu, "gate_up_rem": gu % sms,
                          "down_tiles": dn, "down_rem": dn % sms})
        cell = {"config": cfg.key(), "tails": tails, "variants": {}}
        ref = call(x, wts.w13, wts.w2, *routings[0], cfg, "head")
        for v in variants:
            o = call(x, wts.w13, wts.w2, *routings[0], cfg, v)
            torch.cuda.synchronize()
            cell["variants"][v] = {
                "eager_us": [],
                "max_rel_diff": float((o.float() - ref.float()).abs().max()
                                      / ref.float().abs().max()),
                "equal": bool(torch.equal(o, ref))}
        for j in range(3):
            for v in variants:
                call(x, wts.w13, wts.w2, *routings[j % 4], cfg, v)
        torch.cuda.synchronize()
        for j in range(args.reps):  # as moerun bench's eager: no sync between calls
            evs = []
            for v in variants[j % len(variants):] + variants[:j % len(variants)]:  # rotated
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                call(x, wts.w13, wts.w2, *routings[j % 4], cfg, v)
                b.record()
                evs.append((v, a, b))
            torch.cuda.synchronize()
            for v, a, b in evs:
                cell["variants"][v]["eager_us"].append(a.elapsed_time(b) * 1e3)
        for v in variants:
            d = cell["variants"][v]
            d["eager_median_us"] = statistics.median(d["eager_us"])
        if t <= 1024:  # graph replay, 10 calls a graph, as the bench's serving regime
            graphs = {v: graph_of(lambda v=v: call(x, wts.w13, wts.w2, *routings[0], cfg, v),
                                  10) for v in variants}
            for v in variants:
                cell["variants"][v]["graph_us"] = []
                graphs[v].replay()
            torch.cuda.synchronize()
            for _ in range(args.reps):
                for v in variants:
                    a, b = torch.cuda.Event(enable_timing=True), \
                        torch.cuda.Event(enable_timing=True)
                    a.record()
                    graphs[v].replay()
                    b.record()
                    b.synchronize()
                    cell["variants"][v]["graph_us"].append(a.elapsed_time(b) * 1e3 / 10)
            for v in variants:
                d = cell["variants"][v]
                d["graph_median_us"] = statistics.median(d["graph_us"])
            del graphs
        base = cell["variants"]["head"]
        line = f"{name} T={t} tails={[(r['gate_up_rem'], r['down_rem']) for r in tails]}"
        for v in variants:
            d = cell["variants"][v]
            line += (f"\n    {v:4s} eager {d['eager_median_us']:9.1f} "
                     f"({d['eager_median_us'] / base['eager_median_us']:.3f})")
            if "graph_median_us" in d:
                line += (f" graph {d['graph_median_us']:9.1f} "
                         f"({d['graph_median_us'] / base['graph_median_us']:.3f})")
            line += f" equal={d['equal']} diff={d['max_rel_diff']:.1e}"
        print(line, flush=True)
        if not args.no_breakdown and t <= 2048:
            for v in ("off", "on"):
                if v not in variants:
                    continue
                b = breakdown(lambda j, v=v, x=x, w=wts, r=routings, c=cfg:
                              call(x, w.w13, w.w2, *r[j % 4], c, v), 8)
                cell["variants"][v]["kernels"] = b
                print(f"    kernels {v}: " + "; ".join(
                    f"{k[:28]} {us:.0f}" for k, us in list(b.items())[:4]), flush=True)
        out["cells"][f"{name}/T={t}"] = cell
        if args.out:
            with open(args.out, "w") as fo:
                json.dump(out, fo, indent=1)


if __name__ == "__main__":
    main()
