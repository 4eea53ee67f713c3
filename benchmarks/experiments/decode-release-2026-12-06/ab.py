"""The fp8 decode call with the rows' quantization releasing the gate/up launch early, and the
gate/up asking L2 for its weights before its PDL wait (2026-12-06; README here).

At T=1 the fp8 call is three launches: ``quantize_rows_fp8`` (one row), the direct gate/up
and the direct down. Under PDL each launch waits for the one before it, so HBM idles through
the quantization and the launch boundaries. Here the quantization calls
``griddepcontrol.launch_dependents`` right after its own wait (``release=True``), and each
gate/up program, before its wait, issues ``cp.async.bulk.prefetch.L2`` for the first
``prefetch_bytes / (pairs * 2I)`` bytes of each of its weight rows
(``fp8_direct.gate_up_fp8_direct(prefetch_bytes=)``). Values cannot change (hints only).

Per cell (``name``, T=1, the shipped fp8 config of this card, which must be direct), the
variants below as whole calls (quantize, gate/up, down), graph replay (``--calls`` calls a
graph, each on its own routing), interleaved over ``--rounds`` rounds, median of the round
medians; and each variant's output against the shipped one's on one routing (bit equality).

    PYTHONPATH=. python3 benchmarks/experiments/decode-release-2026-12-06/ab.py --out ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

MB = 1 << 20
#: name -> (release the gate/up early, L2 prefetch budget in bytes)
VARIANTS = {
    "shipped": (False, 0),
    "release": (True, 0),
    "release+pf4M": (True, 4 * MB),
    "release+pf8M": (True, 8 * MB),
    "release+pf16M": (True, 16 * MB),
    "release+pf32M": (True, 32 * MB),
    "pf16M": (False, 16 * MB),
}


def _codes(gen, dev, *size):
    c = torch.randint(0, 254, size, generator=gen, device=dev, dtype=torch.uint8)
    return torch.where(c >= 127, c + 1, c).view(torch.float8_e4m3fn)  # no NaN codes


def _cell(name: str, calls: int, replays: int, rounds: int, dev) -> dict:
    from moerun.backends.triton import TritonExperts
    from moerun.backends.triton.fp8_direct import run_experts_fp8_direct
    from moerun.backends.triton.fp8_quant import quantize_rows_fp8
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.bench.timing import time_graph_replay

    shape = parse_shapes(name)[0]
    e, h, i, k = shape.num_experts, shape.hidden, shape.intermediate, shape.top_k
    gen = torch.Generator(device=dev).manual_seed(0)
    w13, w2 = _codes(gen, dev, e, 2 * i, h), _codes(gen, dev, e, h, i)
    s13 = (torch.rand(e, 2 * i // 128, h // 128, generator=gen, device=dev) + 0.5) * h ** -0.5 / 100
    s2 = (torch.rand(e, h // 128, i // 128, generator=gen, device=dev) + 0.5) * i ** -0.5 / 100
    x = torch.randn(1, h, generator=gen, device=dev, dtype=torch.bfloat16)
    routings = [draw_routing(1, e, k, gen, dev) for _ in range(calls)]
    cfg = TritonExperts().fp8_config_for(e, i, h, 1, k)
    rec = {"cell": name, "config": cfg.key(), "variants": {}}
    if cfg.kernel != "direct":
        rec["note"] = "shipped fp8 T=1 entry is not direct: skipped"
        return rec

    def call(variant, w, ids):
        release, budget = VARIANTS[variant]
        q = quantize_rows_fp8(x, release=release)
        return run_experts_fp8_direct(q, w13, w2, s13, s2, w, ids, cfg, torch.bfloat16,
                                      prefetch_bytes=budget)

    fns = {v: [lambda w=w, d=d, v=v: call(v, w, d) for w, d in routings] for v in VARIANTS}
    samples = {v: [] for v in VARIANTS}
    names = list(VARIANTS)
    for r in range(rounds):
        for v in names[r % len(names):] + names[:r % len(names)]:
            us = time_graph_replay(lambda j, v=v: fns[v][j](), calls, replays, warmup=3)
            samples[v].append(statistics.median(us) * 1e6)
    w, d = routings[0]
    ref = call("shipped", w, d)
    for v in names:
        out = call(v, w, d)
        torch.cuda.synchronize()
        rec["variants"][v] = {"us": round(statistics.median(samples[v]), 2),
                              "rounds": [round(u, 2) for u in samples[v]],
                              "bit_equal": bool(torch.equal(out, ref))}
    base = rec["variants"]["shipped"]["us"]
    for v in names:
        rec["variants"][v]["vs_shipped"] = round(rec["variants"][v]["us"] / base, 4)
    print(name, cfg.key(), json.dumps({v: (r["us"], r["bit_equal"])
                                       for v, r in rec["variants"].items()}), flush=True)
    del w13, w2
    torch.cuda.empty_cache()
    return rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3,mixtral8x7b")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cells": []}
    for name in args.cells.split(","):
        res["cells"].append(_cell(name, args.calls, args.replays, args.rounds, dev))
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
