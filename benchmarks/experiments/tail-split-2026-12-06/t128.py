"""mixtral8x7b T=128 bf16 (the peer-bar cell, 32 pairs per expert): the shipped grouped config
against narrower-row tiles with grouped (``group_m > 1``) program order, so an expert's second
block runs beside its first and reads the weight tile from L2 (the tuner's 16/32-row tiles
all have ``group_m=1``). Graph replay, 10 calls a graph, interleaved rounds, event-timed,
median; outputs against the shipped config's (max relative difference).

    PYTHONPATH=. python3 benchmarks/experiments/tail-split-2026-12-06/t128.py --out x.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def configs():
    from moerun.backends.triton.configs import DownConfig as D
    from moerun.backends.triton.configs import ExpertsConfig as E
    from moerun.backends.triton.configs import GateUpConfig as G

    out = {}
    for g in (1, 2, 4, 8):
        out[f"bm32 gu n64k128s4 g{g} | dn n64k256s3 atomic g{g}"] = E(
            block_m=32, gate_up=G(block_n=64, block_k=128, group_m=g, num_stages=4),
            down=D(block_n=64, block_k=256, group_m=g, num_stages=3), combine="atomic")
    for g in (2, 4):
        out[f"bm32 gu n32k128s4 g{g} | dn n64k256s3 atomic g{g}"] = E(
            block_m=32, gate_up=G(block_n=32, block_k=128, group_m=g, num_stages=4),
            down=D(block_n=64, block_k=256, group_m=g, num_stages=3), combine="atomic")
        out[f"bm32 gu n64k128s4 g{g} | dn n64k256s3 reduce g{g}"] = E(
            block_m=32, gate_up=G(block_n=64, block_k=128, group_m=g, num_stages=4),
            down=D(block_n=64, block_k=256, group_m=g, num_stages=3), combine="reduce")
        out[f"bm16 gu n32k128s4 g{g} | dn n64k256s3 atomic g{g}"] = E(
            block_m=16, gate_up=G(block_n=32, block_k=128, group_m=g, num_stages=4),
            down=D(block_n=64, block_k=256, group_m=g, num_stages=3), combine="atomic")
        out[f"bm64 gu n64k128s3 g{g} | dn n128k64 reduce g4"] = E(
            block_m=64, gate_up=G(block_n=64, block_k=128, group_m=g, num_stages=3),
            down=D(block_n=128, block_k=64, group_m=4), combine="reduce")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    from moerun.backends.triton.configs import ConfigTable
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.inputs import draw_routing, make_weights
    from moerun.bench.shapes import parse_shapes

    dev = torch.device("cuda")
    shape = parse_shapes("mixtral8x7b")[0]
    t = 128
    wts = make_weights(shape, torch.bfloat16, dev, seed=0)
    gen = torch.Generator(device=dev).manual_seed(t)
    x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
    tw, ids = draw_routing(t, shape.num_experts, shape.top_k, gen, dev)
    shipped = TritonExperts()
    variants = {"shipped " + shipped.config_for(shape.num_experts, shape.intermediate,
                                                shape.hidden, t, shape.top_k,
                                                torch.bfloat16).key(): shipped}
    for name, cfg in configs().items():
        variants[name] = TritonExperts(ConfigTable(overrides={b: cfg for b in range(1, 1 << 15)}))
    ref = next(iter(variants.values())).run_experts(x, wts.w13, wts.w2, tw, ids)
    res = {"device": torch.cuda.get_device_name(), "cell": "mixtral8x7b T=128",
           "variants": {}}
    graphs = {}
    for name, be in variants.items():
        o = be.run_experts(x, wts.w13, wts.w2, tw, ids)
        torch.cuda.synchronize()
        diff = float((o.float() - ref.float()).abs().max() / ref.float().abs().max())
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            be.run_experts(x, wts.w13, wts.w2, tw, ids)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(10):
                be.run_experts(x, wts.w13, wts.w2, tw, ids)
        graphs[name] = g
        res["variants"][name] = {"diff": diff, "us": []}
    for g in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    for _ in range(args.reps):
        for name, g in graphs.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            res["variants"][name]["us"].append(a.elapsed_time(b) * 1e3 / 10)
    for name, d in res["variants"].items():
        d["median_us"] = statistics.median(d["us"])
        print(f"{d['median_us']:8.1f} us  diff {d['diff']:.1e}  {name}", flush=True)
    if args.out:
        with open(args.out, "w") as fo:
            json.dump(res, fo, indent=1)


if __name__ == "__main__":
    main()
