"""Per-kernel device time (torch.profiler, 10 eager calls per form, 2 interleaved rounds, µs
per call per kernel name) of the shipped TritonExperts fp8 call and the ws forms of
``--variants`` (as in ``ab.py``).

    PYTHONPATH=. python3 benchmarks/experiments/fp8-ws-2026-12-02/profile_ab.py --out p.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib

import torch
from torch.profiler import ProfilerActivity, profile


def breakdown(fn, calls: int) -> dict[str, float]:
    """µs of device time per call, per kernel name (``calls`` calls under the profiler)."""
    import collections

    for j in range(3):
        fn(j)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for j in range(calls):
            fn(j)
        torch.cuda.synchronize()
    tot = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            tot[ev.name[:40]] += ev.device_time_total
    return {k: v / calls for k, v in sorted(tot.items(), key=lambda kv: -kv[1])}

CELLS = "mixtral8x7b:1024,mixtral8x7b:8192,qwen3-30b-a3b:1024,qwen3-30b-a3b:8192," \
        "qwen3-235b-a22b:1024,qwen3-235b-a22b:8192,deepseek-v3:1024,deepseek-v3:8192"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default=CELLS)
    # module (new, ws_v2; ws_v1 takes no columns), gate/up columns, gate/up stages, down
    # stages, group_m; ;-separated
    ap.add_argument("--variants", default="new,64,4,4,8;ws_v2,64,4,4,8")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from moerun.backends.triton.experts import TritonExperts
    from moerun.backends.triton.fp8_ws import run_experts_fp8_ws
    from moerun.bench.fp8 import fp8_weights
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.quant import ExpertQuant, QuantConfig

    mods = {"new": run_experts_fp8_ws}
    for old in ("ws_v1", "ws_v2"):
        spec = importlib.util.spec_from_file_location(
            old, pathlib.Path(__file__).with_name(f"{old}.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mods[old] = mod.run_experts_fp8_ws
    variants = [s.split(",") for s in args.variants.split(";")]

    dev = torch.device("cuda")
    qc = QuantConfig()
    be = TritonExperts()
    out = []
    last = None
    for cell in args.cells.split(","):
        name, t = cell.split(":")
        t = int(t)
        shape = parse_shapes(name)[0]
        if last != name:
            gen = torch.Generator(device=dev).manual_seed(0)
            w13, w2, s13, s2, d13, d2 = fp8_weights(shape, dev, gen, torch.bfloat16)
            del d13, d2
            eq = ExpertQuant(config=qc, w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
            last = name
        x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
        routings = [draw_routing(t, shape.num_experts, shape.top_k, gen, dev) for _ in range(10)]

        def shipped(j, x=x, routings=routings):
            w, ids = routings[j % 10]
            return be.run_experts(be.quantize_rows(x, qc), w13, w2, w, ids, quant=eq)

        def make(fn, gu, dn, gm, **kw):
            def call(j, x=x, routings=routings):
                w, ids = routings[j % 10]
                return fn(x, w13, w2, s13, s2, w, ids, gate_up_stages=gu, down_stages=dn,
                          group_m=gm, out_dtype=torch.bfloat16, **kw)
            return call

        forms = {"shipped": shipped}
        for mod, cols, gu, dn, gm in variants:
            kw = {} if mod == "ws_v1" else dict(gate_up_cols=int(cols))
            forms[f"{mod} n{cols} {gu}/{dn}/g{gm}"] = make(mods[mod], int(gu), int(dn),
                                                          int(gm), **kw)
        row = {"shape": name, "T": t}
        for rnd in range(2):
            for label, fn in forms.items():
                b = breakdown(fn, 10)
                row[f"{label} r{rnd}"] = {k: round(v, 1) for k, v in b.items() if v >= 2.0}
                row[f"{label} r{rnd} total"] = round(sum(b.values()), 1)
        print(json.dumps(row), flush=True)
        out.append(row)
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
