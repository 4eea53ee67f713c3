"""Is the fp8 ws call host-bound at the EP-local prefill cells? (2026-12-06; README here.)

The tune of 2026-12-05 read qwen3-235b-ep8-local's ws forms at 715-762 µs (T=2048) and
1,222-1,362 µs (T=8192), four times the work for under twice the time, and one ws form once at
385 µs (DECISIONS, "The ws call's host time"). Per cell and config (the card's shipped fp8
entry and the first ``--ws`` ws candidates of ``moerun tune``), eager calls of the layer's
form (``moerun.bench.fp8.layer_fp8_call``: rows quantized first on an EP-local shape), each
timed four ways: back to back (``moerun.bench.timing.time_samples``, the bench's eager
timer), synced per call (events, a sync after each call), host issue time with an idle
device (``host_issue_samples``), and the sum of its kernels' device time (torch.profiler).
If back to back reads near the device sum, the host is hidden; if near the host time, the
host bounds the call.

    PYTHONPATH=. python3 benchmarks/experiments/ws-host-2026-12-06/probe.py --out p.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "ncu-2026-12-05"))
from ab import _kernels, _timed  # noqa: E402  (per-call synced events; profiler per kernel)


def _cell(cell: str, n_ws: int, n: int, rounds: int) -> dict:
    from moerun.backends.triton import TritonExperts
    from moerun.backends.triton.configs import ConfigTable, bucket_of
    from moerun.backends.triton.tune_plan import fp8_ws_candidates
    from moerun.bench.fp8 import fp8_weights, layer_fp8_call
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.bench.timing import host_issue_samples, time_samples
    from moerun.quant import ExpertQuant, QuantConfig

    name, t = cell.split(":")
    t = int(t)
    dev = torch.device("cuda")
    shape = parse_shapes(name)[0]
    e, h, i, k = shape.num_experts, shape.hidden, shape.intermediate, shape.top_k
    gen = torch.Generator(device=dev).manual_seed(0)
    w13, w2, s13, s2, _, _ = fp8_weights(shape, dev, gen, torch.bfloat16)
    torch.cuda.empty_cache()
    x = torch.randn(t, h, generator=gen, device=dev, dtype=torch.bfloat16)
    w, ids = draw_routing(t, e, k, gen, dev)
    eq = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
    shipped = TritonExperts()
    cfgs = {"shipped " + shipped.fp8_config_for(e, i, h, t, k).key(): shipped}
    for c in fp8_ws_candidates(e, k, t, h)[:n_ws]:
        cfgs[c.key()] = TritonExperts(ConfigTable(overrides={bucket_of(t): c}))
    fns = {key: (lambda be=be: layer_fp8_call(be, shape, x, w13, w2, w, ids, eq))
           for key, be in cfgs.items()}
    ref = next(iter(fns.values()))()
    rec = {"cell": cell, "configs": {}}
    times = {key: {"b2b": [], "synced": [], "host": []} for key in fns}
    for r in range(rounds):
        for key in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            fn = fns[key]
            times[key]["b2b"] += [s * 1e6 for s in time_samples(lambda _i: fn(), dev, n,
                                                                warmup=2)]
            times[key]["synced"] += _timed(fn, n)
            times[key]["host"] += [s * 1e6 for s in host_issue_samples(lambda _i: fn(), dev,
                                                                       n, warmup=2)]
    for key, fn in fns.items():
        kern = _kernels(fn, calls=5, top=None)
        out = fn()
        torch.cuda.synchronize()
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        rec["configs"][key] = {**{m: round(statistics.median(v), 1)
                                  for m, v in times[key].items()},
                               "device_sum": round(sum(kern.values()), 1), "kernels": kern,
                               "rel_diff_vs_shipped": err}
        print(cell, f"{key[:60]:60s}", json.dumps({m: rec["configs"][key][m] for m in
                                                    ("b2b", "synced", "host", "device_sum")}),
              flush=True)
    del w13, w2
    torch.cuda.empty_cache()
    return rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="qwen3-235b-ep8-local:2048,qwen3-235b-ep8-local:8192,"
                                       "deepseek-v3-ep8-local:2048,qwen3-30b-a3b:8192")
    ap.add_argument("--ws", type=int, default=3)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cells": []}
    for cell in args.cells.split(","):
        res["cells"].append(_cell(cell, args.ws, args.n, args.rounds))
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
