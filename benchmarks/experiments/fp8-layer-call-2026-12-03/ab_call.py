"""H200 A/B: the fp8 call a one-rank layer makes (``schedulers/one_rank.py``: TritonExperts
declares ``fuses_activation_quant``, so it gets the activation-dtype rows with ``quant=`` and
quantizes them inside its kernels) against the call ``moerun bench --dtype fp8`` timed up to
2026-12-03 (``quantize_rows`` as its own launch, then ``run_experts`` on the e4m3 rows, which
is what an EP rank does before dispatch).

Per model cell (the 20 cells of issue 12; T <= 1024 graph replay of 10 calls, T = 8192
eager, as the bench), both forms interleaved over two rounds of ``--reps`` samples, median;
outputs compared bit for bit, and against ``reference_fp8_moe`` on 64 sampled rows.

    PYTHONPATH=. python3 benchmarks/experiments/fp8-layer-call-2026-12-03/ab_call.py --out x.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", default="mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3")
    ap.add_argument("--tokens", default="1,16,128,1024,8192")
    args = ap.parse_args()
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.bench.timing import time_graph_replay, time_samples
    from moerun.quant import ExpertQuant, QuantConfig, reference_fp8_moe

    dev = torch.device("cuda")
    be = TritonExperts()
    qc = QuantConfig()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cells": {}}
    for shape in parse_shapes(args.shapes):
        gen = torch.Generator(device=dev).manual_seed(0)
        e, k, h, i = shape.num_experts, shape.top_k, shape.hidden, shape.intermediate

        def codes(*size, gen=gen):
            c = torch.randint(0, 254, size, generator=gen, device=dev, dtype=torch.uint8)
            return torch.where(c >= 127, c + 1, c).view(torch.float8_e4m3fn)

        w13, w2 = codes(e, 2 * i, h), codes(e, h, i)
        s13 = (torch.rand(e, 2 * i // 128, h // 128, generator=gen, device=dev) + 0.5) \
            * (h ** -0.5 / 100)
        s2 = (torch.rand(e, h // 128, i // 128, generator=gen, device=dev) + 0.5) \
            * (i ** -0.5 / 100)
        eq = ExpertQuant(config=qc, w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
        for t in (int(v) for v in args.tokens.split(",")):
            x = torch.randn(t, h, generator=gen, device=dev, dtype=torch.bfloat16)
            routings = [draw_routing(t, e, k, gen, dev) for _ in range(10)]

            def fused(j, x=x, routings=routings, w13=w13, w2=w2, eq=eq):
                w, ids = routings[j % 10]
                return be.run_experts(x, w13, w2, w, ids, quant=eq)

            def separate(j, x=x, routings=routings, w13=w13, w2=w2, eq=eq):
                w, ids = routings[j % 10]
                return be.run_experts(be.quantize_rows(x, qc), w13, w2, w, ids, quant=eq)

            graph = t <= 1024
            res = {"fused": [], "separate": []}
            for _round in range(2):
                for tag, fn in (("separate", separate), ("fused", fused)):
                    if graph:
                        s = time_graph_replay(fn, 10, args.reps, warmup=3)
                    else:
                        s = time_samples(fn, dev, args.reps, warmup=3)
                    res[tag] += [v * 1e6 for v in s]
            a, b = fused(0), separate(0)
            rows = torch.randperm(t, generator=gen, device=dev)[:64].sort().values
            w0, i0 = routings[0]
            ref = reference_fp8_moe(x[rows], w13, s13, w2, s2, w0[rows], i0[rows], qc,
                                    out_dtype=torch.bfloat16).double()
            err = float((a[rows].double() - ref).norm() / ref.norm())
            cell = {"mode": "graph" if graph else "eager",
                    "fused_us": statistics.median(res["fused"]),
                    "separate_us": statistics.median(res["separate"]),
                    "bit_equal": bool(torch.equal(a, b)), "err_fused": err,
                    "config": be.fp8_config_source(e, i, h, t, k), "samples": res}
            out["cells"][f"{shape.name}/T={t}"] = cell
            print(f"{shape.name:16s} T={t:5d} [{cell['mode']}] separate "
                  f"{cell['separate_us']:9.1f}  fused {cell['fused_us']:9.1f} "
                  f"({cell['fused_us'] / cell['separate_us']:.3f})  equal {cell['bit_equal']}"
                  f"  err {err:.1e}  {cell['config']}", flush=True)
            if args.out:
                with open(args.out, "w") as fo:
                    json.dump(out, fo, indent=1)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
