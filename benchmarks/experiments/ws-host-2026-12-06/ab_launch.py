"""The fp8 ws call with its Gluon kernels launched through ``FastLauncher`` (the tree) against
Triton's own ``kernel[grid](...)`` path (patched back in for the "jit" variant), same process,
alternating rounds (2026-12-06; README here). Per cell, the first ws candidate of ``moerun
tune`` as the layer calls it (``layer_fp8_call``): back-to-back, synced and host-issue times
as ``probe.py``, and the two variants' outputs compared bit for bit.

    PYTHONPATH=. python3 benchmarks/experiments/ws-host-2026-12-06/ab_launch.py --out ab.json
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
from ab import _timed  # noqa: E402


class _Jit:
    """``kernel[grid](*args, num_warps=)``: the launch path before FastLauncher."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __call__(self, grid, *args, num_warps=4):
        self.kernel[grid](*args, num_warps=num_warps)


def _patch(jit: bool) -> None:
    from moerun.backends.triton import fp8_ws, fp8_ws_carry

    if not hasattr(_patch, "fast"):
        _patch.fast = (fp8_ws._GATE_UP, fp8_ws._DOWN, fp8_ws_carry.GATE_UP_CARRY,
                       fp8_ws_carry.DOWN_CARRY)
    launchers = tuple(_Jit(f._kernel) for f in _patch.fast) if jit else _patch.fast
    (fp8_ws._GATE_UP, fp8_ws._DOWN, fp8_ws_carry.GATE_UP_CARRY,
     fp8_ws_carry.DOWN_CARRY) = launchers


def _cell(cell: str, n: int, rounds: int) -> dict:
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
    e, h, k = shape.num_experts, shape.hidden, shape.top_k
    gen = torch.Generator(device=dev).manual_seed(0)
    w13, w2, s13, s2, _, _ = fp8_weights(shape, dev, gen, torch.bfloat16)
    torch.cuda.empty_cache()
    x = torch.randn(t, h, generator=gen, device=dev, dtype=torch.bfloat16)
    w, ids = draw_routing(t, e, k, gen, dev)
    eq = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
    rec = {"cell": cell, "variants": {}}
    for c in fp8_ws_candidates(e, k, t, h)[:2]:
        be = TritonExperts(ConfigTable(overrides={bucket_of(t): c}))
        fn = lambda be=be: layer_fp8_call(be, shape, x, w13, w2, w, ids, eq)  # noqa: E731
        times = {v: {"b2b": [], "synced": [], "host": []} for v in ("fast", "jit")}
        outs = {}
        for r in range(rounds):
            for v in (("fast", "jit") if r % 2 == 0 else ("jit", "fast")):
                _patch(v == "jit")
                outs[v] = fn()
                times[v]["b2b"] += [s * 1e6 for s in time_samples(lambda _i: fn(), dev, n,
                                                                  warmup=2)]
                times[v]["synced"] += _timed(fn, n)
                times[v]["host"] += [s * 1e6 for s in host_issue_samples(lambda _i: fn(), dev,
                                                                         n, warmup=2)]
        _patch(False)
        torch.cuda.synchronize()
        row = {v: {m: round(statistics.median(x), 1) for m, x in tv.items()}
               for v, tv in times.items()}
        row["bit_equal"] = bool(torch.equal(outs["fast"], outs["jit"]))
        rec["variants"][c.key()] = row
        print(cell, c.key(), json.dumps(row), flush=True)
    del w13, w2
    torch.cuda.empty_cache()
    return rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="qwen3-235b-ep8-local:2048,deepseek-v3-ep8-local:2048,"
                                       "qwen3-235b-ep8-local:8192,qwen3-30b-a3b:8192")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cells": []}
    for cell in args.cells.split(","):
        res["cells"].append(_cell(cell, args.n, args.rounds))
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
