"""Per-kernel device time of the fp8 expert call (device probe, torch.profiler).

For each cell, the shipped TritonExperts fp8 call and the ws (Gluon) call run 10 times under
the profiler (eager, fresh routings); kernel times are summed per kernel name and divided by
the call count, so each line is "µs per call" of that kernel.

    PYTHONPATH=. python3 benchmarks/experiments/fp8-ws-2026-12-02/profile.py --out x.json
"""

from __future__ import annotations

import argparse
import collections
import json

import torch
from torch.profiler import ProfilerActivity, profile

CELLS = [("mixtral8x7b", 1024), ("mixtral8x7b", 8192), ("qwen3-30b-a3b", 1024),
         ("qwen3-30b-a3b", 8192), ("qwen3-235b-a22b", 1024), ("qwen3-235b-a22b", 8192),
         ("deepseek-v3", 1024), ("deepseek-v3", 8192)]


def breakdown(fn, calls: int) -> dict[str, float]:
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
            tot[ev.name[:60]] += ev.device_time_total if hasattr(ev, "device_time_total") \
                else ev.cuda_time_total
    return {k: v / calls for k, v in sorted(tot.items(), key=lambda kv: -kv[1])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args()
    from moerun.backends.triton.experts import TritonExperts
    from moerun.backends.triton.fp8_ws import run_experts_fp8_ws
    from moerun.bench.fp8 import fp8_weights
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.quant import ExpertQuant, QuantConfig

    dev = torch.device("cuda")
    qc = QuantConfig()
    be = TritonExperts()
    out = {}
    last = None
    for name, t in CELLS:
        shape = parse_shapes(name)[0]
        if last != name:
            gen = torch.Generator(device=dev).manual_seed(0)
            w13, w2, s13, s2, d13, d2 = fp8_weights(shape, dev, gen, torch.bfloat16)
            del d13, d2
            eq = ExpertQuant(config=qc, w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
            last = name
        x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
        routings = [draw_routing(t, shape.num_experts, shape.top_k, gen, dev) for _ in range(4)]

        def shipped(j, x=x, routings=routings):
            w, ids = routings[j % 4]
            return be.run_experts(be.quantize_rows(x, qc), w13, w2, w, ids, quant=eq)

        def ws(j, x=x, routings=routings):
            w, ids = routings[j % 4]
            return run_experts_fp8_ws(x, w13, w2, s13, s2, w, ids, gate_up_stages=4,
                                      down_stages=4, group_m=8, out_dtype=torch.bfloat16)

        cell = {}
        for label, fn in (("shipped", shipped), ("ws", ws)):
            b = breakdown(fn, args.calls)
            cell[label] = b
            print(f"{name} T={t} {label}: total {sum(b.values()):.1f} us", flush=True)
            for k, v in list(b.items())[:9]:
                print(f"    {v:9.1f}  {k}", flush=True)
        out[f"{name}/T={t}"] = cell
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
