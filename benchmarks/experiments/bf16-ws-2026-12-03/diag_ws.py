"""H200 diagnosis of ``ab_ws.py``'s finding (the bf16 ws kernels lose more to uniform routing
than the persistent ones): per-kernel event times of both paths, and the ws kernels with the
padding-half skip on and off, under uniform and balanced routing.

Per cell and routing, eager, median of ``--reps`` calls over 4 routings: the shipped
persistent path step by step (align, gate/up, down, sum) and the ws path step by step (align,
gather, gate/up, down, sum) with ``skip_padding`` True / False, at ``--tiles``.

    PYTHONPATH=. python3 benchmarks/experiments/bf16-ws-2026-12-03/diag_ws.py --out x.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

CELLS = "mixtral8x7b:1024,deepseek-v3:8192,deepseek-v3-ep8-local:2048,qwen3-235b-a22b:8192"


def ws_steps(x, w13, w2, wt, ids, tiles, skip):
    """run_experts_ws's launches, returned as (name, thunk) in order."""
    from moerun.backends.triton import bf16_ws as ws
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum
    from moerun.backends.triton.persistent import gather_rows
    from moerun.backends.triton.ws_common import nvmma_desc, sm_count

    gu, gs, dn, ds, gm = tiles
    m, h = x.shape
    s, two_i, _ = w13.shape
    inter = two_i // 2
    k = ids.shape[1]
    p = m * k
    st = {}
    grid = (sm_count(0),)

    def align():
        st["a"] = moe_align(ids, s, 128)
        st["pr"] = torch.empty(p, dtype=torch.int32, device=x.device)

    def gather():
        st["xs"] = gather_rows(x, st["a"], k, pair_rows=st["pr"])
        r = st["xs"].shape[0]
        st["act"] = torch.empty(r, inter, device=x.device, dtype=x.dtype)
        st["y"] = torch.empty(r, h, device=x.device, dtype=x.dtype)

    def gate_up():
        a = st["a"]
        ws._gate_up_kernel[grid](
            nvmma_desc(st["xs"], [64, 64]), nvmma_desc(w13.view(s * two_i, h), [gu, 64]),
            nvmma_desc(st["act"], [64, gu]), a.sorted_ids, a.expert_ids, a.num_post, p, inter,
            h, gu, gs, gm, skip, num_warps=4)

    def down():
        a = st["a"]
        ws._down_kernel[grid](
            nvmma_desc(st["act"], [64, 64]), nvmma_desc(w2.view(s * h, inter), [dn, 64]),
            nvmma_desc(st["y"], [64, dn]), wt, a.sorted_ids, a.expert_ids, a.num_post, p, h,
            inter, dn, ds, gm, skip, num_warps=4)

    def total():
        st["out"] = moe_sum(st["y"], ids, s, rows=st["pr"])

    return [("align", align), ("gather", gather), ("gate_up", gate_up), ("down", down),
            ("sum", total)], st


def persistent_steps(x, w13, w2, wt, ids, cfg):
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum
    from moerun.backends.triton.persistent import down_persistent, gate_up_persistent

    s, k = w13.shape[0], ids.shape[1]
    st = {}

    def align():
        st["a"] = moe_align(ids, s, cfg.block_m)

    def gate_up():
        st["act"] = gate_up_persistent(x, w13, st["a"], k, cfg.gate_up, programs=cfg.programs)

    def down():
        st["y"] = down_persistent(st["act"], w2, st["a"], wt, k, cfg.down,
                                  programs=cfg.programs)

    def total():
        st["out"] = moe_sum(st["y"], ids, s)

    return [("align", align), ("gate_up", gate_up), ("down", down), ("sum", total)], st


def time_steps(make, routings, reps):
    per = {}
    for j in range(reps + 2):
        steps, st = make(*routings[j % 4])
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(steps) + 1)]
        ev[0].record()
        for n, (_, fn) in enumerate(steps):
            fn()
            ev[n + 1].record()
        ev[-1].synchronize()
        if j >= 2:
            for n, (name, _) in enumerate(steps):
                per.setdefault(name, []).append(ev[n].elapsed_time(ev[n + 1]) * 1e3)
    med = {k: statistics.median(v) for k, v in per.items()}
    med["total"] = sum(med.values())
    return med, st["out"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--cells", default=CELLS)
    ap.add_argument("--tiles", default="128,3,256,3,8")
    args = ap.parse_args()
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.inputs import draw_routing, make_weights
    from moerun.bench.shapes import parse_shapes

    sys_path = __import__("sys").path
    sys_path.insert(0, "benchmarks/experiments/bf16-ws-2026-12-03")
    from ab_ws import balanced_routing

    tiles = tuple(int(v) for v in args.tiles.split(","))
    dev = torch.device("cuda")
    be0 = TritonExperts()
    out = {"device": torch.cuda.get_device_name(), "tiles": tiles, "cells": {}}
    last, wts = None, None
    for cell_name in args.cells.split(","):
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
        shipped = be0.config_for(e, shape.intermediate, shape.hidden, t, k, torch.bfloat16)
        for routing in ("uniform", "balanced"):
            routings = [balanced_routing(t, e, k, dev)] * 4 if routing == "balanced" else \
                [draw_routing(t, e, k, gen, dev) for _ in range(4)]
            res = {}
            ref = None
            if shipped.kernel == "persistent":
                res["shipped"], ref = time_steps(
                    lambda w, i, x=x, wts=wts, c=shipped: persistent_steps(x, wts.w13, wts.w2, w,
                                                                     i, c),
                    routings, args.reps)
            for skip in (True, False):
                tag = "ws skip" if skip else "ws noskip"
                res[tag], o = time_steps(
                    lambda w, i, skip=skip, x=x, wts=wts: ws_steps(x, wts.w13, wts.w2, w, i,
                                                                 tiles, skip),
                    routings, args.reps)
                if ref is not None:
                    res[tag]["equal_shipped"] = bool(torch.equal(o, ref))
            key = f"{name}/T={t} {routing}"
            out["cells"][key] = res
            for tag, r in res.items():
                print(f"{key:40s} {tag:10s} " + " ".join(
                    f"{k2} {v:.1f}" if isinstance(v, float) else f"{k2} {v}"
                    for k2, v in r.items()), flush=True)
            if args.out:
                with open(args.out, "w") as fo:
                    json.dump(out, fo, indent=1)


if __name__ == "__main__":
    main()
