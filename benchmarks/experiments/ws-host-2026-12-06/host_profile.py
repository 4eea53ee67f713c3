"""cProfile of the fp8 layer call's host time at one cell and config (2026-12-06; README
here): ``--config shipped`` or ``ws`` (the first ws candidate of ``moerun tune``). Synced
before the profiled calls, not between them; the top functions by cumulative time, µs/call.

    PYTHONPATH=. python3 benchmarks/experiments/ws-host-2026-12-06/host_profile.py \\
        --cell qwen3-235b-ep8-local:2048 --config ws
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats

import torch


def main() -> None:
    from moerun.backends.triton import TritonExperts
    from moerun.backends.triton.configs import ConfigTable, bucket_of
    from moerun.backends.triton.tune_plan import fp8_ws_candidates
    from moerun.bench.fp8 import fp8_weights, layer_fp8_call
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.quant import ExpertQuant, QuantConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--cell", default="qwen3-235b-ep8-local:2048")
    ap.add_argument("--config", default="ws", choices=("ws", "shipped"))
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    name, t = args.cell.split(":")
    t = int(t)
    dev = torch.device("cuda")
    shape = parse_shapes(name)[0]
    e, h, i, k = shape.num_experts, shape.hidden, shape.intermediate, shape.top_k
    gen = torch.Generator(device=dev).manual_seed(0)
    w13, w2, s13, s2, _, _ = fp8_weights(shape, dev, gen, torch.bfloat16)
    x = torch.randn(t, h, generator=gen, device=dev, dtype=torch.bfloat16)
    w, ids = draw_routing(t, e, k, gen, dev)
    eq = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
    be = TritonExperts() if args.config == "shipped" else TritonExperts(
        ConfigTable(overrides={bucket_of(t): fp8_ws_candidates(e, k, t, h)[0]}))
    fn = lambda: layer_fp8_call(be, shape, x, w13, w2, w, ids, eq)  # noqa: E731
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(prof)
    print(args.cell, args.config, be.fp8_config_for(e, i, h, t, k).key())
    for label, key in (("cumulative", 3), ("own", 2)):
        print(f"-- by {label} time, µs per call (calls per call)")
        rows = sorted(st.stats.items(), key=lambda kv: -kv[1][key])[:args.top]
        for fk, v in rows:
            print(f"{v[key] / args.calls * 1e6:9.1f}  {v[1] / args.calls:7.1f}  {fk[2]} "
                  f"({os.path.basename(fk[0])}:{fk[1]})")


if __name__ == "__main__":
    main()
