"""Probe: the one-launch decode kernel (``fused.py``, ``kernel="fused"``) against the shipped
decode configs (the two-launch ``kernel="direct"`` path), on one H200 (issue 11; device
script).

    PYTHONPATH=. python3 benchmarks/experiments/fused-2026-12-02/fused_probe.py --out $OUT/f.json

Cells: mixtral8x7b, qwen3-30b-a3b, qwen3-235b-a22b, deepseek-v3 at T=1, plus qwen3-30b-a3b
and deepseek-v3 at T=4 (the largest direct bucket). Per cell: fresh random ``x`` and
``--routings`` fresh uniform routings (``moerun.bench``'s weights and ``draw_routing``), the
floor from ``moerun.bench.ceilings.floor_for`` with ceilings measured in this run, CUDA-graph
replay of one call per routing (``moerun.bench.timing.time_graph_replay``), the median of
``--samples`` replays. Timed: the whole ``TritonExperts.run_experts`` call with the shipped
config, then ``fused_direct`` with each candidate tile (checked first against the shipped
output, rel err <= 2e-2, and against the fp32 reference on every row). Prints one JSON line
per candidate and writes ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fused.py, beside this script

from fused import FusedScratch, fused_direct  # noqa: E402
from fused2 import Fused2Scratch, fused2_direct  # noqa: E402

from moerun.backends.triton.configs import DownConfig, GateUpConfig  # noqa: E402
from moerun.backends.triton.experts import TritonExperts  # noqa: E402
from moerun.bench.ceilings import floor_for, measure_run_ceilings  # noqa: E402
from moerun.bench.inputs import draw_routing, make_weights, reference_rows  # noqa: E402
from moerun.bench.shapes import SHAPES  # noqa: E402
from moerun.bench.timing import time_graph_replay  # noqa: E402
from moerun.testing import rel_err  # noqa: E402

CELLS = (("qwen3-30b-a3b", 1), ("qwen3-235b-a22b", 1), ("deepseek-v3", 1), ("mixtral8x7b", 1),
         ("qwen3-30b-a3b", 4), ("deepseek-v3", 4))
#: (gate/up slice BN, gate/up K step BK, down chunk BH, gate/up stages, down stages[, warps:
#: 4 if absent])
TILES = ((64, 128, 512, 4, 4), (128, 128, 128, 3, 6), (64, 256, 256, 3, 6))  # run 2's best
#: ``fused2.py`` (the two roles in one launch): (gate/up BN, BK, stages, down BN, BK, stages)
TILES2 = ((64, 128, 4, 64, 128, 4), (32, 128, 4, 128, 128, 3), (64, 128, 4, 64, 256, 3),
          (64, 128, 4, 32, 256, 4), (64, 128, 4, 128, 128, 3), (128, 64, 4, 64, 128, 4),
          (32, 128, 4, 64, 128, 4), (64, 128, 3, 64, 128, 6), (64, 256, 3, 64, 128, 4))
DTYPE = torch.bfloat16


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--routings", type=int, default=10)
    ap.add_argument("--samples", type=int, default=50)
    args = ap.parse_args()
    dev = torch.device("cuda")
    ceil = measure_run_ceilings(dev, DTYPE)
    print(f"ceilings: {ceil.describe()}", flush=True)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "ceilings": {"read_bw": ceil.read_bw, "flops": ceil.flops}, "cells": []}
    shipped = TritonExperts()
    weights = {}
    for name, t in CELLS:
        shape = SHAPES[name]
        if name not in weights:
            weights.clear()
            torch.cuda.empty_cache()
            weights[name] = make_weights(shape, DTYPE, dev, seed=11)
        w = weights[name]
        gen = torch.Generator(device=dev).manual_seed(1000 + t)
        x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=DTYPE)
        routings = [draw_routing(t, shape.num_experts, shape.top_k, gen, dev)
                    for _ in range(args.routings)]
        hit = sum(int(torch.unique(ids).numel()) for _, ids in routings) / len(routings)
        floor = floor_for(shape, t, hit, 2, ceil)
        n = len(routings)
        scratch = FusedScratch(4, shape.hidden, dev)

        def timed(fn, n=n, routings=routings):
            return statistics.median(time_graph_replay(lambda j: fn(*routings[j % n]), n,
                                                       args.samples, warmup=3)) * 1e6

        def cur(tw, ids, x=x, w=w):
            return shipped.run_experts(x, w.w13, w.w2, tw, ids)

        tw0, ids0 = routings[0]
        ref = reference_rows(x, w.w13, w.w2, tw0, ids0)
        cur_out = cur(tw0, ids0)
        cell = {"shape": name, "T": t, "floor_us": floor.us, "hit": hit,
                "current_config": shipped.config_for(shape.num_experts, shape.intermediate,
                                                     shape.hidden, t, shape.top_k,
                                                     DTYPE).key(),
                "current_us": timed(cur), "current_err": rel_err(cur_out, ref),
                "candidates": []}
        print(json.dumps({k: v for k, v in cell.items() if k != "candidates"}), flush=True)
        scratch2 = Fused2Scratch(4, shape.top_k, 512, dev)
        for form, tile in [("fused", t) for t in TILES] + [("fused2", t) for t in TILES2]:
            if form == "fused":
                bn, bk, bh, gs, ds = tile[:5]
                nw = tile[5] if len(tile) > 5 else 4
                g = GateUpConfig(block_n=bn, block_k=bk, num_warps=nw, num_stages=gs)
                d = DownConfig(block_n=bh, block_k=bn, num_warps=nw, num_stages=ds)
            else:
                g = GateUpConfig(block_n=tile[0], block_k=tile[1], num_stages=tile[2])
                d = DownConfig(block_n=tile[3], block_k=tile[4], num_stages=tile[5])
            rec = {"form": form, "tile": list(tile)}

            def fz(tw, ids, g=g, d=d, x=x, w=w, scratch=scratch, form=form,
                   scratch2=scratch2):
                if form == "fused2":
                    return fused2_direct(x, w.w13, w.w2, ids, tw, g, d, scratch2)
                return fused_direct(x, w.w13, w.w2, ids, tw, g, d, scratch)
            try:
                got = fz(tw0, ids0)
                torch.cuda.synchronize()
                rec["vs_current"] = rel_err(got, cur_out)
                rec["err"] = rel_err(got, ref)
                again = fz(tw0, ids0)  # the scratch was left zero: same answer again
                rec["repeat_diff"] = float((again.float() - got.float()).abs().max())
                if rec["vs_current"] > 2e-2:
                    rec["error"] = "wrong"
                else:
                    rec["us"] = timed(fz)
                    rec["floor_over_time"] = floor.us / rec["us"]
            except Exception as e:  # noqa: BLE001 -- recorded, the next tile runs
                rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            cell["candidates"].append(rec)
            print(json.dumps({"shape": name, "T": t, **rec}), flush=True)
        report["cells"].append(cell)
        Path(args.out).write_text(json.dumps(report, indent=1))
    for c in report["cells"]:
        line = (f"{c['shape']:16s} T={c['T']}  floor {c['floor_us']:7.1f}  shipped "
                f"{c['current_us']:7.1f} ({c['floor_us'] / c['current_us']:.3f})")
        for form in ("fused", "fused2"):
            ok = [r for r in c["candidates"] if "us" in r and r["form"] == form]
            best = min(ok, key=lambda r: r["us"]) if ok else None
            line += f"  {form} best " + (f"{best['us']:7.1f} ({best['floor_over_time']:.3f}) "
                                         f"{best['tile']}" if best else "none")
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
