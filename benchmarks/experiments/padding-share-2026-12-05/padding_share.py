"""How much of a prefill call the 128-row blocks' padding costs, bf16 and fp8, on one card.

Per cell and dtype: the shipped config (``TritonExperts``' own lookup) timed as whole calls
under uniform random routing (4 draws, as the bench draws them) and under balanced routing
(every expert exactly ``T*K/E`` rows, so no block is partial), in the bench's serving mode
(CUDA-graph replay of the 4 routings for model cells up to T=1024, else eager), two
interleaved rounds of ``--reps`` samples, the median of each. The ratio balanced/uniform is
the share of the call left if the padding rows cost nothing. The weights are the fp8 bench's
(``moerun.bench.fp8.fp8_weights``): e4m3 codes with block scales, and their dequantized
bf16 copy for the bf16 calls.

    PYTHONPATH=. python3 benchmarks/experiments/padding-share-2026-12-05/padding_share.py \
        --out padding.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

CELLS = ("deepseek-v3:8192,mixtral8x7b:1024,mixtral8x7b:8192,qwen3-30b-a3b:8192,"
         "qwen3-235b-a22b:8192,deepseek-v3-ep8-local:2048,qwen3-235b-ep8-local:2048")


def balanced_routing(t: int, e: int, k: int, dev: torch.device):
    """Pair p of token p // k goes to expert p % e: k consecutive (distinct) experts per
    token, every expert ``t * k / e`` pairs when e divides ``t * k``."""
    ids = (torch.arange(t * k, device=dev) % e).view(t, k).to(torch.int32).contiguous()
    return torch.full((t, k), 1.0 / k, device=dev), ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--cells", default=CELLS)
    args = ap.parse_args()
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.fp8 import fp8_weights, layer_fp8_call
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.bench.timing import time_graph_replay, time_samples
    from moerun.quant import ExpertQuant, QuantConfig

    dev = torch.device("cuda")
    be = TritonExperts()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cells": {}}
    for cell_name in args.cells.split(","):
        name, t = cell_name.split(":")[0], int(cell_name.split(":")[1])
        shape = parse_shapes(name)[0]
        e, k, h = shape.num_experts, shape.top_k, shape.hidden
        torch.cuda.empty_cache()
        gen = torch.Generator(device=dev).manual_seed(0)
        w13, w2, s13, s2, d13, d2 = fp8_weights(shape, dev, gen, torch.bfloat16)
        eq = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2,
                         out_dtype=torch.bfloat16)
        x = torch.randn(t, h, generator=gen, device=dev, dtype=torch.bfloat16)
        routes = {"uniform": [draw_routing(t, e, k, gen, dev) for _ in range(4)],
                  "balanced": [balanced_routing(t, e, k, dev)] * 4}
        graph = t <= 1024 and not shape.eager_only
        res = {"mode": "graph" if graph else "eager"}
        calls = {}
        for dtype in ("bf16", "fp8"):
            for r, rts in routes.items():
                def fn(j, dtype=dtype, rts=rts, x=x, d13=d13, d2=d2, w13=w13, w2=w2, eq=eq,
                       shape=shape):  # this cell's tensors, bound now (the loop deletes them)
                    w, ids = rts[j % 4]
                    if dtype == "bf16":
                        return be.run_experts(x, d13, d2, w, ids)
                    return layer_fp8_call(be, shape, x, w13, w2, w, ids, eq)
                calls[(dtype, r)] = fn
        samples = {key: [] for key in calls}
        for _round in range(2):
            for key, fn in calls.items():
                if graph:
                    s = time_graph_replay(fn, 4, args.reps, warmup=3)
                else:
                    s = time_samples(fn, dev, args.reps, warmup=3)
                samples[key] += [v * 1e6 for v in s]
        line = [f"{name} T={t} [{res['mode']}]"]
        for dtype in ("bf16", "fp8"):
            u = statistics.median(samples[(dtype, "uniform")])
            b = statistics.median(samples[(dtype, "balanced")])
            res[dtype] = {"uniform_us": u, "balanced_us": b, "ratio": b / u,
                          "samples": {r: samples[(dtype, r)] for r in routes}}
            line.append(f"{dtype} uniform {u:.1f} balanced {b:.1f} ratio {b / u:.3f}")
        print("  ".join(line), flush=True)
        out["cells"][f"{name}/T={t}"] = res
        if args.out:
            with open(args.out, "w") as fo:
                json.dump(out, fo, indent=1)
        del w13, w2, s13, s2, d13, d2, x, routes, calls


if __name__ == "__main__":
    main()
