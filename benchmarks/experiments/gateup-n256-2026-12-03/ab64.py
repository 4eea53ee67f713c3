"""H200 A/B: the persistent kernels (gate/up as one dot, as shipped from 2026-12-03) at
64-row blocks and one warp group per program against the shipped 128-row, 8-warp entries.

Why: with one dot per K step a 64-row, 4-warp gate/up tile runs the same n256 wgmmas per
warp group as the 128-row, 8-warp tile (``compile64.py``), while 64-row blocks halve the
padding of each expert's last block (useful rows 0.805 -> 0.892 at 256 rows per expert).
The 2026-12-01 64-row candidates ran two n128 dots and lost by 11-16 %.

Per cell: the shipped config and 64-row variants (gate/up ``[64, 2x128]``; down ``[64, 256]``;
2-4 stages; ``programs=264``: two programs per SM where 2-stage buffers fit
twice; where the shipped entry is not persistent, the 128-row persistent candidate too), whole
calls through ``TritonExperts``, eager, interleaved, median of ``--reps`` over 4
uniform routings; outputs compared with the shipped config's (max relative difference).

    PYTHONPATH=. python3 benchmarks/experiments/gateup-n256-2026-12-03/ab64.py --out x.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

CELLS = [("mixtral8x7b", 1024), ("deepseek-v3", 8192), ("deepseek-v3-ep8-local", 2048),
         ("qwen3-30b-a3b", 8192), ("qwen3-235b-ep8-local", 2048), ("qwen3-235b-a22b", 8192)]


def variants(shipped):
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig

    out = {"shipped": shipped}
    for tag, st, dn, progs in (("64 s4 d256", 4, 256, 0), ("64 s3 d256", 3, 256, 0),
                               ("64 s2 d256 x2", 2, 256, 264)):
        out[tag] = ExpertsConfig(
            block_m=64, combine="reduce", kernel="persistent", programs=progs,
            gate_up=GateUpConfig(block_n=128, block_k=64, group_m=16, num_warps=4,
                                 num_stages=st),
            down=DownConfig(block_n=dn, block_k=64, group_m=16, num_warps=4, num_stages=st))
    if shipped.kernel != "persistent":  # the tuner's first persistent candidate (128 rows)
        out["128 s3 d256"] = ExpertsConfig(
            block_m=128, combine="reduce", kernel="persistent",
            gate_up=GateUpConfig(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3),
            down=DownConfig(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--cells", default="", help="name:T,... (default: CELLS)")
    args = ap.parse_args()
    from moerun.backends.triton.configs import ConfigTable
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.inputs import draw_routing, make_weights
    from moerun.bench.shapes import parse_shapes

    dev = torch.device("cuda")
    be0 = TritonExperts()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cells": {}}
    cells = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cells.split(",")] \
        if args.cells else CELLS
    last, wts = None, None
    for name, t in cells:
        shape = parse_shapes(name)[0]
        if last != name:
            wts = None
            torch.cuda.empty_cache()
            wts = make_weights(shape, torch.bfloat16, dev, seed=0)
            last = name
        e, k = shape.num_experts, shape.top_k
        gen = torch.Generator(device=dev).manual_seed(t)
        x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
        routings = [draw_routing(t, e, k, gen, dev) for _ in range(4)]
        shipped = be0.config_for(e, shape.intermediate, shape.hidden, t, k, torch.bfloat16)
        forms = {tag: TritonExperts(ConfigTable(overrides={b: c for b in range(1, 1 << 16)}))
                 for tag, c in variants(shipped).items()}
        cell = {"shipped": str(shipped), "forms": {}}
        ref = forms["shipped"].run_experts(x, wts.w13, wts.w2, *routings[0]).float()
        ok = {}
        for tag, be in forms.items():
            try:
                o = be.run_experts(x, wts.w13, wts.w2, *routings[0]).float()
                torch.cuda.synchronize()
                ok[tag] = be
                cell["forms"][tag] = {"max_rel_diff": float((o - ref).abs().max()
                                                            / ref.abs().max()), "us": [],
                                      "config": be.config_for(e, shape.intermediate,
                                                              shape.hidden, t, k,
                                                              torch.bfloat16).to_json()}
            except Exception as ex:  # noqa: BLE001
                cell["forms"][tag] = {"error": str(ex)[:300]}
                print(name, t, tag, "ERROR", str(ex)[:300], flush=True)
        for j in range(2):
            for be in ok.values():
                be.run_experts(x, wts.w13, wts.w2, *routings[j % 4])
        for j in range(args.reps):
            for tag, be in ok.items():
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                be.run_experts(x, wts.w13, wts.w2, *routings[j % 4])
                b.record()
                b.synchronize()
                cell["forms"][tag]["us"].append(a.elapsed_time(b) * 1e3)
        base = statistics.median(cell["forms"]["shipped"]["us"])
        line = [f"{name} T={t}: shipped {base:9.1f}"]
        for tag in ok:
            d = cell["forms"][tag]
            d["median_us"] = statistics.median(d["us"])
            if tag != "shipped":
                line.append(f"{tag} {d['median_us']:9.1f} ({d['median_us'] / base:.3f}, "
                            f"diff {d['max_rel_diff']:.1e})")
        print("  ".join(line), flush=True)
        out["cells"][f"{name}/T={t}"] = cell
        if args.out:
            with open(args.out, "w") as fo:
                json.dump(out, fo, indent=1)


if __name__ == "__main__":
    main()
