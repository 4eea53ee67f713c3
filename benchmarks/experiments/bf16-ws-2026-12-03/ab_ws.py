"""H200 A/B: the bf16 warp-specialized Gluon kernels (``moerun/backends/triton/bf16_ws.py``,
``kernel="ws"``) against the shipped bf16 entries, whole calls through ``TritonExperts``.

Per cell: the shipped config and ws variants (gate/up columns and stages, down columns and
stages, ``group_m``), same inputs, 4 uniform routings. T <= 1024 model cells are timed as the
bench times them (CUDA-graph replay of 10 calls, ``time_graph_replay``), the others eager; the
forms alternate over two rounds of ``--reps`` samples and each form's median of all samples is
reported. ``--balanced`` cells are timed again under balanced routing (every expert exactly
``T*K/E`` rows: no padding), the padding bound of each form. Correctness: relative error of
64 sampled rows against the fp32 reference (``reference_rows``), and against the shipped output.

    PYTHONPATH=. python3 benchmarks/experiments/bf16-ws-2026-12-03/ab_ws.py --out x.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

CELLS = ("mixtral8x7b:1024,mixtral8x7b:8192,qwen3-30b-a3b:1024,qwen3-30b-a3b:8192,"
         "qwen3-235b-a22b:1024,qwen3-235b-a22b:8192,deepseek-v3:1024,deepseek-v3:8192,"
         "deepseek-v3-ep8-local:256,deepseek-v3-ep8-local:2048,deepseek-v3-ep8-local:8192,"
         "deepseek-v3-ep8-local:32768,qwen3-235b-ep8-local:256,qwen3-235b-ep8-local:2048,"
         "qwen3-235b-ep8-local:8192,qwen3-235b-ep8-local:32768")
BALANCED = "mixtral8x7b:1024,deepseek-v3:8192,deepseek-v3-ep8-local:2048"

#: tag -> (gate/up cols, gate/up stages, down cols, down stages, group_m)
VARIANTS = {"ws g128s4 d256s3": (128, 4, 256, 3, 8), "ws g128s3 d256s3": (128, 3, 256, 3, 8),
            "ws g128s4 d128s5": (128, 4, 128, 5, 8), "ws g64s5 d128s5": (64, 5, 128, 5, 8),
            "ws g128s4 d256s3 m16": (128, 4, 256, 3, 16)}


def ws_config(gu, gs, dn, ds, gm):
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig

    return ExpertsConfig(block_m=128, combine="reduce", kernel="ws",
                         gate_up=GateUpConfig(block_n=gu, block_k=64, group_m=gm, num_warps=8,
                                              num_stages=gs),
                         down=DownConfig(block_n=dn, block_k=64, group_m=gm, num_warps=8,
                                         num_stages=ds))


def balanced_routing(t, e, k, dev):
    pair = torch.arange(t * k, device=dev)
    ids = (pair % e).view(t, k).to(torch.int32)  # k consecutive experts: distinct for k <= e
    return torch.full((t, k), 1.0 / k, device=dev), ids.contiguous()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--cells", default=CELLS)
    ap.add_argument("--balanced", default=BALANCED)
    args = ap.parse_args()
    from moerun.backends.triton.configs import ConfigTable
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.inputs import draw_routing, make_weights, reference_rows
    from moerun.bench.shapes import parse_shapes
    from moerun.bench.timing import time_graph_replay
    from moerun.testing import rel_err

    dev = torch.device("cuda")
    be0 = TritonExperts()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cells": {}}
    balanced = set(args.balanced.split(",")) if args.balanced else set()
    jobs = [(c, False) for c in args.cells.split(",")] + [(c, True) for c in balanced]
    last, wts = None, None
    for cell_name, bal in jobs:
        name, t = cell_name.split(":")[0], int(cell_name.split(":")[1])
        shape = parse_shapes(name)[0]
        if last != name:
            wts = None
            torch.cuda.empty_cache()
            wts = make_weights(shape, torch.bfloat16, dev, seed=0)
            last = name
        e, k = shape.num_experts, shape.top_k
        gen = torch.Generator(device=dev).manual_seed(t)
        x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
        routings = [balanced_routing(t, e, k, dev)] * 4 if bal else \
            [draw_routing(t, e, k, gen, dev) for _ in range(4)]
        shipped = be0.config_for(e, shape.intermediate, shape.hidden, t, k, torch.bfloat16)
        cfgs = {"shipped": shipped, **{tag: ws_config(*v) for tag, v in VARIANTS.items()}}
        forms = {tag: TritonExperts(ConfigTable(overrides={b: c for b in range(1, 1 << 16)}))
                 for tag, c in cfgs.items()}
        graph = t <= 1024 and "ep8" not in name
        key = f"{name}/T={t}" + (" balanced" if bal else "")
        cell = {"shipped": shipped.to_json(), "mode": "graph" if graph else "eager",
                "forms": {}}
        w0, i0 = routings[0]
        sample = torch.randperm(t, generator=torch.Generator().manual_seed(1))[:64].to(dev)
        ref = reference_rows(x[sample], wts.w13, wts.w2, w0[sample], i0[sample])
        base = forms["shipped"].run_experts(x, wts.w13, wts.w2, w0, i0).float()
        ok = {}
        for tag, be in forms.items():
            try:
                o = be.run_experts(x, wts.w13, wts.w2, w0, i0)
                torch.cuda.synchronize()
                ok[tag] = be
                cell["forms"][tag] = {"err_ref": rel_err(o[sample].float(), ref),
                                      "diff_shipped": rel_err(o.float(), base), "us": [],
                                      "config": cfgs[tag].to_json()}
            except Exception as ex:  # noqa: BLE001 - the probe records the failure
                cell["forms"][tag] = {"error": repr(ex)[:400]}
                print(key, tag, "ERROR", repr(ex)[:400], flush=True)
        for _round in range(2):
            for tag, be in ok.items():
                def fn(j, be=be, x=x, wts=wts, routings=routings):
                    w, ids = routings[j % 4]
                    return be.run_experts(x, wts.w13, wts.w2, w, ids)
                if graph:
                    us = [s * 1e6 for s in time_graph_replay(fn, 10, args.reps, warmup=3)]
                else:
                    for j in range(2):
                        fn(j)
                    us = []
                    for j in range(args.reps):
                        a = torch.cuda.Event(enable_timing=True)
                        b = torch.cuda.Event(enable_timing=True)
                        a.record()
                        fn(j)
                        b.record()
                        b.synchronize()
                        us.append(a.elapsed_time(b) * 1e3)
                cell["forms"][tag]["us"] += us
        line = [f"{key} [{cell['mode']}]"]
        ship = statistics.median(cell["forms"]["shipped"]["us"]) if "shipped" in ok else None
        for tag in ok:
            d = cell["forms"][tag]
            d["median_us"] = statistics.median(d["us"])
            ratio = f" ({d['median_us'] / ship:.3f})" if ship and tag != "shipped" else ""
            line.append(f"{tag} {d['median_us']:.1f}{ratio} e{d['err_ref']:.1e}"
                        f" d{d['diff_shipped']:.1e}")
        print("  ".join(line), flush=True)
        out["cells"][key] = cell
        if args.out:
            with open(args.out, "w") as fo:
                json.dump(out, fo, indent=1)


if __name__ == "__main__":
    main()
