"""Why the fp8 ws call reads more in the bench's eager timing than in the tuner's: the EP-local
layer call (``moerun.bench.fp8.layer_fp8_call``: ``quantize_rows`` then ``run_experts``) at
one cell, with the card's shipped config and with a grouped config forced by an override,
timed four ways. Device script.

    PYTHONPATH=. python3 benchmarks/experiments/session-2026-12-06c/eager_ws_probe.py --out e.json

Per config (launch programs on, the package default): ``host`` (``host_issue_samples``: the
host time of one call issued onto an idle device), ``eager`` (``time_samples``: what the bench
reports for an eager cell), ``graph`` (``time_graph_replay``: the device time of the same
calls), each the median of ``--samples``; 10 routings in turn, as the bench draws them.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from moerun.backends.triton import TritonExperts
from moerun.backends.triton.configs import (
    ConfigTable,
    DownConfig,
    ExpertsConfig,
    GateUpConfig,
    bucket_of,
)
from moerun.bench.fp8 import fp8_weights, layer_fp8_call
from moerun.bench.inputs import draw_routing
from moerun.bench.shapes import parse_shapes
from moerun.bench.timing import host_issue_samples, time_graph_replay, time_samples
from moerun.env import get_env
from moerun.quant import ExpertQuant, QuantConfig

GROUPED = ExpertsConfig(block_m=128, combine="reduce",
                        gate_up=GateUpConfig(block_n=128, block_k=128, group_m=8, num_warps=8,
                                             num_stages=4, paired=True),
                        down=DownConfig(block_n=64, block_k=128, group_m=8, num_warps=8,
                                        num_stages=3))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cell", default="qwen3-235b-ep8-local:2048")
    ap.add_argument("--samples", type=int, default=20)
    args = ap.parse_args()
    dev = torch.device("cuda")
    name, t = args.cell.split(":")
    t = int(t)
    shape = parse_shapes(name)[0]
    gen = torch.Generator(device=dev).manual_seed(0)
    w13, w2, s13, s2, _, _ = fp8_weights(shape, dev, gen, torch.bfloat16)
    eq = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
    x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
    routings = [draw_routing(t, shape.num_experts, shape.top_k, gen, dev) for _ in range(10)]
    out = {"device": torch.cuda.get_device_name(), "cell": args.cell, "rows": []}
    backends = {"shipped": TritonExperts(),
                "grouped-paired": TritonExperts(configs=ConfigTable(
                    device_name=get_env().device_name, overrides={bucket_of(t): GROUPED}))}
    for rnd in range(2):
        for label, be in backends.items():
            cfg = be.fp8_config_for(shape.num_experts, shape.intermediate, shape.hidden, t,
                                    shape.top_k)

            def call(j, be=be):
                w, ids = routings[j % 10]
                return layer_fp8_call(be, shape, x, w13, w2, w, ids, eq)

            host = statistics.median(host_issue_samples(call, dev, args.samples, warmup=3))
            eager = statistics.median(time_samples(call, dev, args.samples, warmup=3))
            graph = statistics.median(time_graph_replay(call, 10, args.samples, warmup=3))
            row = {"round": rnd, "config": label, "kernel": cfg.kernel,
                   "host_us": round(host * 1e6, 1), "eager_us": round(eager * 1e6, 1),
                   "graph_us": round(graph * 1e6, 1)}
            out["rows"].append(row)
            print(row, flush=True)
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
