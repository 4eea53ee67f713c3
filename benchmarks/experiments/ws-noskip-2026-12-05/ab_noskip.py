"""A/B of the fp8 ws kernels' padding skip (``ExpertsConfig.skip_padding``: with True a
consumer whose 64 rows are all padding skips its K loop; with False, the default since this
experiment, it runs it, so every tile of a ws launch takes the same time, and its stores land
in padding rows nothing reads). The run of 17:38 UTC (``ab-h100-run1.json``) used the
experiment's first form, ``noskip.diff``: the same kernels, chosen by ``MOERUN_WS_NOSKIP``.

Per cell: the file's fp8 config with ``skip_padding`` True ("skip") and False ("noskip"),
whole fp8 calls (``run_experts_fp8`` on the bench's weights: the bf16 rows for one-rank
shapes, quantized first for the EP-local ones, as ``moerun.bench.fp8.layer_fp8_call``), 4
uniform routings, in the bench's serving mode (CUDA-graph replay for model cells up to
T=1024, else eager); the two alternate over ``--rounds`` rounds of ``--reps`` samples,
medians. Outputs of the two compared bit for bit. Cells whose config is not ``ws`` are
skipped.

    PYTHONPATH=. python3 benchmarks/experiments/ws-noskip-2026-12-05/ab_noskip.py --out ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

CELLS = ("deepseek-v3:8192,mixtral8x7b:1024,mixtral8x7b:8192,qwen3-30b-a3b:1024,"
         "qwen3-30b-a3b:8192,qwen3-235b-a22b:1024,qwen3-235b-a22b:8192,"
         "deepseek-v3-ep8-local:2048,deepseek-v3-ep8-local:8192,qwen3-235b-ep8-local:2048,"
         "qwen3-235b-ep8-local:8192")


def one_cell(name: str, t: int, args, be, dev) -> dict | None:
    """One cell's A/B (module docstring); None where the file's config is not ws."""
    from dataclasses import replace

    from moerun.backends.triton.fp8 import quantize_rows_fp8, run_experts_fp8
    from moerun.bench.fp8 import fp8_weights
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.bench.timing import time_graph_replay, time_samples

    shape = parse_shapes(name)[0]
    e, k, h = shape.num_experts, shape.top_k, shape.hidden
    base = be.fp8_config_for(e, shape.intermediate, h, t, k)
    src = be.fp8_config_source(e, shape.intermediate, h, t, k)
    if base.kernel != "ws":
        print(f"{name} T={t}: {base.kernel} config, skipped", flush=True)
        return None
    gen = torch.Generator(device=dev).manual_seed(0)
    w13, w2, s13, s2, _, _ = fp8_weights(shape, dev, gen, torch.bfloat16)
    x = torch.randn(t, h, generator=gen, device=dev, dtype=torch.bfloat16)
    xin = quantize_rows_fp8(x) if shape.group == "ep-local" else x
    rts = [draw_routing(t, e, k, gen, dev) for _ in range(4)]
    cfgs = {"0": replace(base, skip_padding=True), "1": replace(base, skip_padding=False)}
    graph = t <= 1024 and not shape.eager_only

    def call(j, c):
        w, ids = rts[j % 4]
        return run_experts_fp8(xin, w13, w2, s13, s2, w, ids, c, torch.bfloat16)

    outs = {mode: call(0, c).clone() for mode, c in cfgs.items()}
    same = bool(torch.equal(outs["0"], outs["1"]))
    samples = {"0": [], "1": []}
    for _round in range(args.rounds):
        for mode, c in cfgs.items():
            def fn(j, c=c):
                return call(j, c)
            s = (time_graph_replay(fn, 4, args.reps, warmup=3) if graph
                 else time_samples(fn, dev, args.reps, warmup=3))
            samples[mode] += [v * 1e6 for v in s]
    m0, m1 = statistics.median(samples["0"]), statistics.median(samples["1"])
    cfg = f"{src}: {base.key()}"
    print(f"{name} T={t} [{'graph' if graph else 'eager'}] skip {m0:.1f}  noskip {m1:.1f}"
          f"  ratio {m1 / m0:.3f}  bit-equal {same}  {cfg}", flush=True)
    return {"mode": "graph" if graph else "eager", "config": cfg, "skip_us": m0,
            "noskip_us": m1, "ratio": m1 / m0, "bit_equal": same, "samples": samples}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cells", default=CELLS)
    args = ap.parse_args()
    from moerun.backends.triton.experts import TritonExperts

    dev = torch.device("cuda")
    be = TritonExperts()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cells": {}}
    for cell_name in args.cells.split(","):
        name, t = cell_name.split(":")[0], int(cell_name.split(":")[1])
        torch.cuda.empty_cache()
        cell = one_cell(name, t, args, be, dev)
        if cell is not None:
            out["cells"][f"{name}/T={t}"] = cell
            if args.out:
                with open(args.out, "w") as fo:
                    json.dump(out, fo, indent=1)


if __name__ == "__main__":
    main()
