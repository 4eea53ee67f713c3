"""Same-run A/B of the 256-column carry ws kernels (``ws_wide.py``) against the shipped fp8
call and the shipped ws kernels on the fp8 prefill cells: whole calls, eager, device
events, interleaved rounds, medians; each form's error against DESIGN 11a's reference on
sampled rows; per-kernel device time at two cells.

    PYTHONPATH=. python3 benchmarks/experiments/fp8-wide-2026-12-05/ab_wide.py --out ab.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "ncu-2026-12-05"))
from ab import _kernels, _timed  # noqa: E402 -- the ncu experiment's timers, same method

CELLS = ["deepseek-v3:8192", "mixtral8x7b:8192", "qwen3-235b-a22b:8192", "qwen3-30b-a3b:8192",
         "mixtral8x7b:1024", "qwen3-235b-a22b:1024", "qwen3-30b-a3b:1024", "deepseek-v3:1024",
         "deepseek-v3-ep8-local:8192", "qwen3-235b-ep8-local:8192"]
WIDE = {  # name: run_experts_fp8_wide keywords
    "w43": dict(gate_up_stages=4, down_stages=3),
    "wGU": dict(gate_up_stages=4, down="narrow", down_stages=4),
    "wDN": dict(gate_up=None, gate_up_stages=4, down_stages=3),  # None: the cell's ws columns
    "w44s": dict(gate_up_stages=4, down_stages=4, down_split=True),
    "w33": dict(gate_up_stages=3, down_stages=3),
    "w43g16": dict(gate_up_stages=4, down_stages=3, group_m=16),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--profile", default="deepseek-v3:8192,mixtral8x7b:8192")
    args = ap.parse_args()

    from ws_wide import run_experts_fp8_wide

    from moerun.backends.triton import TritonExperts
    from moerun.backends.triton.fp8_ws import run_experts_fp8_ws
    from moerun.bench.fp8 import fp8_weights, layer_fp8_call
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.quant import ExpertQuant, QuantConfig, reference_fp8_moe

    dev = torch.device("cuda")
    be = TritonExperts()
    qc = QuantConfig()
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cells": {}}
    profile_cells = set(args.profile.split(",")) if args.profile else set()
    for cell in args.cells.split(","):
        name, t = cell.split(":")
        t = int(t)
        shape = parse_shapes(name)[0]
        gen = torch.Generator(device=dev).manual_seed(0)
        w13, w2, s13, s2, d13, d2 = fp8_weights(shape, dev, gen, torch.bfloat16)
        del d13, d2
        torch.cuda.empty_cache()
        e, k, h = shape.num_experts, shape.top_k, shape.hidden
        eq = ExpertQuant(config=qc, w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
        x = torch.randn(t, h, generator=gen, device=dev, dtype=torch.bfloat16)
        w, ids = draw_routing(t, e, k, gen, dev)
        cfg = be.config_for(e, shape.intermediate, h, t, k, torch.float8_e4m3fn)
        ws_kw = dict(gate_up_cols=128 if t <= 1024 else 64, gate_up_stages=4, down_stages=4,
                     group_m=8)
        if cfg.kernel == "ws":
            ws_kw = dict(gate_up_cols=cfg.gate_up.block_n, gate_up_stages=cfg.gate_up.num_stages,
                         down_stages=cfg.down.num_stages, group_m=cfg.gate_up.group_m)
        forms = {
            "shipped": lambda: layer_fp8_call(be, shape, x, w13, w2, w, ids, eq),
            "ws": lambda: run_experts_fp8_ws(x, w13, w2, s13, s2, w, ids, out_dtype=torch.bfloat16,
                                             **ws_kw),
        }
        for vn, kw in WIDE.items():
            if "gate_up" in kw and kw["gate_up"] is None:
                kw = dict(kw, gate_up=ws_kw["gate_up_cols"])
            forms[vn] = (lambda kw=kw: run_experts_fp8_wide(x, w13, w2, s13, s2, w, ids, **kw))
        rows = torch.randperm(t, generator=gen, device=dev)[:64].sort().values
        ref = reference_fp8_moe(x[rows], w13, s13, w2, s2, w[rows], ids[rows], qc,
                                out_dtype=torch.bfloat16).double()
        rec = {"config": f"{cfg.kernel} {ws_kw if cfg.kernel == 'ws' else ''}", "err": {},
               "diff_vs_shipped": {}, "us": collections.defaultdict(list)}
        base_out = forms["shipped"]().double()
        for fn_name, fn in forms.items():
            try:
                out = fn()
                torch.cuda.synchronize()
            except Exception as ex:  # noqa: BLE001
                rec["err"][fn_name] = f"FAILED {type(ex).__name__}: {str(ex)[-300:]}"
                continue
            got = out[rows].double()
            rec["err"][fn_name] = (got - ref).norm().item() / ref.norm().item()
            rec["diff_vs_shipped"][fn_name] = ((out.double() - base_out).norm()
                                               / base_out.norm()).item()
            bad = (~torch.isfinite(out)).sum().item()
            if bad:
                rec["err"][fn_name] = f"{bad} non-finite outputs"
        ok = [f for f in forms if isinstance(rec["err"].get(f), float)]
        for f in ok:
            _timed(forms[f], 3)
        for _ in range(args.rounds):
            for f in ok:
                rec["us"][f] += _timed(forms[f], args.n)
        rec["median_us"] = {f: round(statistics.median(v), 1) for f, v in rec["us"].items()}
        del rec["us"]
        if cell in profile_cells:
            best = min((f for f in ok if f in WIDE), key=lambda f: rec["median_us"][f],
                       default=None)
            rec["kernels"] = {f: _kernels(forms[f]) for f in ("shipped", "ws", best) if f}
        results["cells"][cell] = rec
        print(cell, rec["config"], json.dumps(rec["median_us"]),
              {f: (round(v, 5) if isinstance(v, float) else v) for f, v in rec["err"].items()},
              flush=True)
        if "kernels" in rec:
            for f, kk in rec["kernels"].items():
                print("   ", f, kk, flush=True)
        del w13, w2, s13, s2, x, base_out, forms
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
