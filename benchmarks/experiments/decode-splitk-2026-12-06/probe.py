"""Would a split-K direct gate/up pay at decode? An emulation with the shipped kernels.

The direct gate/up (``gate_up.gate_up_direct``, ``fp8_direct.gate_up_fp8_direct``) runs
``K * I / BN`` programs, each streaming its pair's ``[2 BN, H]`` weight slice over ``H / BK``
sequential K steps. At qwen3-30b T=1 that is 96 programs (n64) for 132 SMs, and Nsight
Compute had the fp8 kernel at 52 % of DRAM peak (docs/DECISIONS.md, 2026-12-05). A split-K
form would run ``split`` times the programs, each over ``H / split``.

This probe times that main loop without building it: the same kernel over ``split`` tokens of
``H / split`` columns, each token routed to ``K`` slots of its own (``[2I, H / split]`` each),
so the launch streams exactly the bytes of the real call with ``split`` times the programs
and ``1 / split`` of the K steps each. What it leaves out is the split form's cross-program
sum (fp32 partials, an arrival counter, the last arrival's ``silu(g) * u``): a lower bound on
the split form's time, so a split that does not win here cannot win built.

Per cell and dtype (bf16 weights; fp8 codes with block scales and rows quantized first, as
the layer hands them), every direct gate/up tile of ``moerun tune`` (with its ``swap_ab``
form where eligible) at split 1, 2, 4 and 8, interleaved over ``--rounds`` rounds; each
figure the median over rounds of ``moerun.bench.timing.time_graph_replay``'s median (one
graph of ``--calls`` calls, each call on slots of its own so no call reads another's weights
from L2). Also the shipped whole call at the cell (the bench's routing), so the gate/up share
of it is seen.

    PYTHONPATH=. python3 benchmarks/experiments/decode-splitk-2026-12-06/probe.py --out p.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

SPLITS = (1, 2, 4, 8)


def _tiles(dtype: str):
    """The unique direct gate/up tiles of the tuner's space, with their swap flag."""
    from moerun.backends.triton.tune_direct import direct_candidates, fp8_direct_candidates

    cands = direct_candidates(1) if dtype == "bf16" else fp8_direct_candidates(1)
    seen, out = set(), []
    for c in cands:
        key = (c.gate_up.key() if hasattr(c.gate_up, "key") else repr(c.gate_up), c.swap_ab)
        if key not in seen:
            seen.add(key)
            out.append((c.gate_up, c.swap_ab))
    return out


def _median_us(fns, replays: int) -> float:
    from moerun.bench.timing import time_graph_replay

    return statistics.median(time_graph_replay(lambda i: fns[i](), len(fns), replays,
                                               warmup=3)) * 1e6


def _split_case(dtype: str, shape, split: int, calls: int, gen, dev):
    """Weights of ``calls * split * K`` slots of ``[2I, H / split]``, rows ``[split, H /
    split]`` and per-call ids: call c's token t uses slots ``(c * split + t) * K + j``."""
    from moerun.quant import quantize_rows

    k, h, i = shape.top_k, shape.hidden, shape.intermediate
    hs = h // split
    slots = calls * split * k
    if dtype == "bf16":
        w13 = torch.randn(slots, 2 * i, hs, generator=gen, device=dev,
                          dtype=torch.bfloat16) * hs ** -0.5
        w13s = None
    else:
        c = torch.randint(0, 254, (slots, 2 * i, hs), generator=gen, device=dev,
                          dtype=torch.uint8)
        w13 = torch.where(c >= 127, c + 1, c).view(torch.float8_e4m3fn)
        w13s = (torch.rand(slots, 2 * i // 128, hs // 128, generator=gen, device=dev) + 0.5) \
            * (hs ** -0.5 / 100)
    x = torch.randn(split, hs, generator=gen, device=dev, dtype=torch.bfloat16)
    xq = quantize_rows(x) if dtype == "fp8" else x
    ids = [(torch.arange(split * k, device=dev, dtype=torch.int32) + c * split * k)
           .reshape(split, k).contiguous() for c in range(calls)]
    w = torch.softmax(torch.randn(split, k, generator=gen, device=dev), dim=1)
    return w13, w13s, xq, ids, w


def _fns(dtype: str, case, gate_up, swap: bool):
    from moerun.backends.triton.fp8_direct import gate_up_fp8_direct
    from moerun.backends.triton.gate_up import gate_up_direct

    w13, w13s, xq, ids, w = case
    if dtype == "bf16":
        return [lambda c=c: gate_up_direct(xq, w13, c, w, gate_up, swap_ab=swap) for c in ids]
    return [lambda c=c: gate_up_fp8_direct(xq, w13, w13s, c, gate_up, torch.bfloat16,
                                           swap_ab=swap) for c in ids]


def _whole_call(name: str, dtype: str, calls: int, replays: int, gen, dev):
    """The shipped whole call at ``name`` T=1 (the bench's weights and routing)."""
    from moerun.backends.triton import TritonExperts
    from moerun.bench.fp8 import fp8_weights
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.quant import ExpertQuant, QuantConfig

    shape = parse_shapes(name)[0]
    q13, q2, s13, s2, d13, d2 = fp8_weights(shape, dev, gen, torch.bfloat16)
    x = torch.randn(1, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
    routings = [draw_routing(1, shape.num_experts, shape.top_k, gen, dev) for _ in range(calls)]
    be = TritonExperts()
    s, h, i, k = shape.num_experts, shape.hidden, shape.intermediate, shape.top_k
    if dtype == "bf16":
        cfg = be.config_for(s, i, h, 1, k, torch.bfloat16)
        fns = [lambda w=w, d=d: be.run_experts(x, d13, d2, w, d) for w, d in routings]
    else:
        cfg = be.fp8_config_for(s, i, h, 1, k)
        eq = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2,
                         out_dtype=torch.bfloat16)
        fns = [lambda w=w, d=d: be.run_experts(be.quantize_rows(x, eq.config), q13, q2, w, d,
                                               quant=eq) for w, d in routings]
    us = _median_us(fns, replays)
    del q13, q2, d13, d2
    return {"us": round(us, 2), "config": cfg.key()}


def _cell(name: str, dtype: str, calls: int, replays: int, rounds: int, read_bw: float,
          dev) -> dict:
    from moerun.bench.shapes import parse_shapes

    shape = parse_shapes(name)[0]
    k, h, i = shape.top_k, shape.hidden, shape.intermediate
    elt = 2 if dtype == "bf16" else 1
    gate_up_bytes = k * 2 * i * h * elt
    gen = torch.Generator(device=dev).manual_seed(0)
    rec = {"cell": name, "dtype": dtype, "gate_up_bytes": gate_up_bytes,
           "gate_up_floor_us": round(gate_up_bytes / read_bw * 1e6, 2),
           "whole_call": _whole_call(name, dtype, calls, replays, gen, dev), "tiles": []}
    print(dtype, name, "whole", rec["whole_call"], flush=True)
    splits = [s for s in SPLITS if h % (s * 256) == 0]
    cases = {s: _split_case(dtype, shape, s, calls, gen, dev) for s in splits}
    for gate_up, swap in _tiles(dtype):
        if any((h // s) % gate_up.block_k for s in splits):
            continue
        fns = {s: _fns(dtype, cases[s], gate_up, swap) for s in splits}
        samples = {s: [] for s in splits}
        for r in range(rounds):
            order = splits[r % len(splits):] + splits[:r % len(splits)]
            for s in order:
                samples[s].append(_median_us(fns[s], replays))
        row = {"tile": dataclasses.asdict(gate_up), "swap_ab": swap,
               "us": {s: round(statistics.median(v), 2) for s, v in samples.items()},
               "rounds": {s: [round(u, 2) for u in v] for s, v in samples.items()}}
        row["floor_over_time"] = {s: round(rec["gate_up_floor_us"] / u, 3)
                                  for s, u in row["us"].items()}
        rec["tiles"].append(row)
        print(dtype, name, f"n{gate_up.block_n}k{gate_up.block_k}s{gate_up.num_stages}"
              f"{' swap' if swap else ''}", row["us"], flush=True)
    best = {s: min(r["us"][s] for r in rec["tiles"]) for s in splits}
    rec["best_us"] = best
    del cases
    torch.cuda.empty_cache()
    return rec


def main() -> None:
    from moerun.bench.ceilings import measure_run_ceilings

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3,mixtral8x7b")
    ap.add_argument("--dtypes", default="fp8,bf16")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    dev = torch.device("cuda")
    ceil = measure_run_ceilings(dev, torch.bfloat16)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "ceilings": ceil.describe(), "cells": []}
    for dtype in args.dtypes.split(","):
        for name in args.cells.split(","):
            res["cells"].append(_cell(name, dtype, args.calls, args.replays, args.rounds,
                                      ceil.read_bw, dev))
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
