"""A/B of the ws fp8 call: the shipped TritonExperts fp8 call (the cell's tuned entry) and the
ws kernels of ``--variants`` (``new``: ``moerun/backends/triton/fp8_ws.py``; ``ws_v1.py``: the
first form, torch gathers, no skip; ``ws_v2.py``: the gather kernel, the padding skip and both
gate/up forms, per-pair down stores), in one run.

Eager: median of 20 event-timed calls per form, forms interleaved in 2 rounds. Graph (T <=
1024): 10 calls per graph, median of 20 replays, per call. Fresh routings per call index.
Correctness: relative error against ``reference_fp8_moe`` on sampled rows, and whether two
forms of the same gate/up columns give the same output bit for bit.

    PYTHONPATH=. python3 benchmarks/experiments/fp8-ws-2026-12-02/ab.py --out ab.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import statistics

import torch

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
    from moerun.bench.timing import time_graph_replay, time_samples
    from moerun.quant import ExpertQuant, QuantConfig, reference_fp8_moe

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
        w0, ids0 = routings[0]
        rows = torch.arange(0, t, max(1, t // 64), device=dev)
        ref = reference_fp8_moe(x[rows], w13, s13, w2, s2, w0[rows], ids0[rows], qc,
                                out_dtype=torch.bfloat16).double()
        outs = {}
        for label, fn in forms.items():
            o = fn(0)
            torch.cuda.synchronize()
            outs[label] = o
            row[f"err {label}"] = ((o[rows].double() - ref).norm() / ref.norm()).item()
        for a in forms:  # each form against the first other module's form of its columns
            for b in forms:
                if a < b and "shipped" not in (a, b) and a.split()[1] == b.split()[1]:
                    row[f"{a} == {b}"] = bool(torch.equal(outs[a], outs[b]))
        del outs
        eager = {k: [] for k in forms}
        for _ in range(2):
            for label, fn in forms.items():
                eager[label] += time_samples(fn, dev, 10, warmup=2)
        for label in forms:
            row[f"eager {label}"] = statistics.median(eager[label]) * 1e6
        if t <= 1024:
            for label, fn in forms.items():
                try:
                    row[f"graph {label}"] = statistics.median(
                        time_graph_replay(fn, 10, 20, warmup=3)) * 1e6
                except Exception as exc:  # noqa: BLE001 - recorded
                    row[f"graph {label}"] = repr(exc)[:200]
        print(json.dumps(row), flush=True)
        out.append(row)
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
