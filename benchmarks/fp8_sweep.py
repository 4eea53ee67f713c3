"""FP8 block-scaled expert kernels on one GPU: a config sweep per cell, then the whole path
against the fp8 floor and moerun's own bf16 path, in one run (issue 12, device script).

    python3 benchmarks/fp8_sweep.py --out DIR [--shapes a,b] [--tokens 1,16] [--budget-s 480]

Per cell (shape x T): fresh random bf16 ``x``, ``R`` fresh uniform routings; fp8 weights are
random e4m3 codes with random positive block scales, the bf16 weights their dequantized
values (so both paths compute the same function). Per block_m of the cell's regime, every
gate/up candidate and every down candidate is timed alone (one CUDA graph holding one launch
per routing, median of replays), the best pair is then timed as the whole path (alignment +
gate/up + down + combine): graph replay for T <= 1024, eager for larger T, like the bf16
matrix. The bf16 path is ``TritonExperts`` with its shipped configs, same inputs, same
method. Ceilings in the same run: read/copy bandwidth, the bf16 matmul rate and the fp8 rate
(``torch._scaled_mm`` 8192^3 e4m3, with and without fast accumulation; the larger).

fp8 floor (as ``shared/peers/fp8-h200-*.json``): ``max(flops / fp8_peak, (hit * 3*H*I +
scale bytes + 2*T*H*2) / BW)``; bf16 floor: ``max(flops / bf16_peak, (hit * 3*H*I*2 +
2*T*H*2) / BW)``.

History: run 4 of 2026-12-01 also timed a gate/up variant issuing one ``[BM, 2*BN]`` dot per
K step; it won alone at BN=64 but never as the whole path (BN=128 is what lets the
intermediate travel in fp8), so it was removed.

Writes ``DIR/fp8_sweep.json`` (every candidate's time, the chosen configs, the cell rows) and
prints a table. Stops starting new cells once ``--budget-s`` is spent.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from moerun.backends.triton.align import moe_align
from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig
from moerun.backends.triton.experts import TritonExperts
from moerun.backends.triton.fp8 import (GROUP, PREQUANT_BLOCK_M, down_fp8, gate_up_fp8,
                                        quantize_rows_fp8, run_experts_fp8)
from moerun.bench.ceilings import floor_for, measure_ceilings
from moerun.bench.fp8 import fp8_floor_us, fp8_weights, measure_fp8_rate
from moerun.bench.matrix import draw_routing
from moerun.bench.shapes import SHAPES, BenchShape, parse_tokens
from moerun.bench.timing import time_graph_replay, time_samples
from moerun.quant import QuantConfig, reference_fp8_moe

DEV = torch.device("cuda")
ACT = torch.bfloat16  # the activation dtype (fp16 in a CPU smoke run: bf16 is wrong there)
#: A CPU smoke shape (run with TRITON_INTERPRET=1 --device cpu --shapes smoke).
SMOKE = BenchShape(name="smoke", num_experts=4, top_k=2, hidden=128, intermediate=128)


def regime(shape, t):
    pairs = t * shape.top_k
    hit = min(shape.num_experts, pairs)
    tpe = pairs / hit
    if tpe <= 12:
        return [16]
    if tpe <= 40:
        return [32, 64]
    return [64, 128]


# Register budget (run 1 of 2026-12-01: the 128x128 two-accumulator tiles spilled and ran
# 5-10x slow): a scaled fp8 step keeps the accumulator AND the step's dot result live, so
# accumulators x 2 x BM x BN / threads must stay <= 128 fp32 registers per thread.
def _fits(bm, bn, warps, accs):
    return accs * 2 * bm * bn / (32 * warps) <= 128


def gate_up_candidates(bm):
    if bm <= 32:
        return [GateUpConfig(block_n=bn, block_k=GROUP, num_warps=4, num_stages=st)
                for bn in (32, 64, 128) for st in (3, 4)]
    out = []
    for bn in (32, 64, 128):
        for w in (4, 8):
            if _fits(bm, bn, w, 2) and (bm * bn) >= 64 * 64:
                for st in (2, 3):
                    out.append(GateUpConfig(block_n=bn, block_k=GROUP, group_m=8,
                                            num_warps=w, num_stages=st))
    return out


def down_candidates(bm, inter):
    groups = inter // GROUP
    splits = [s for s in (1, 2, 4) if groups % s == 0]
    if bm <= 32:
        return [DownConfig(block_n=bn, block_k=GROUP, split_k=s, num_warps=4, num_stages=3)
                for bn in (64, 128) for s in splits]
    out = []
    for bn in (64, 128, 256):
        for w in (4, 8):
            if _fits(bm, bn, w, 1) and bm * bn >= 64 * 128:
                for st in (2, 3):
                    out.append(DownConfig(block_n=bn, block_k=GROUP, group_m=8, num_warps=w,
                                          num_stages=st))
    return out


def timed(fn, n, use_graph, samples):
    if DEV.type == "cpu":
        samples = 1
    if use_graph:
        return statistics.median(time_graph_replay(fn, n, samples, warmup=2)) * 1e6
    return statistics.median(time_samples(fn, DEV, samples, warmup=2)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3")
    ap.add_argument("--tokens", default="1,16,128,1024,8192")
    ap.add_argument("--routings", type=int, default=8)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--final-samples", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run under TRITON_INTERPRET=1")
    args = ap.parse_args()
    global DEV, ACT
    DEV = torch.device(args.device)
    ACT = torch.float16 if DEV.type == "cpu" else torch.bfloat16
    t_start = time.time()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False

    cpu = DEV.type == "cpu"
    ceil = measure_ceilings(DEV, read_bytes=(1 << 20) if cpu else (2 << 30),
                            matmul_size=256 if cpu else 8192, matmul_dtype=torch.bfloat16)
    peaks = {"plain": ceil.flops, "fast": ceil.flops} if cpu else measure_fp8_rate(DEV)
    fp8_rate = max(peaks.values())
    print(f"ceilings: {ceil.describe()}; fp8 plain {peaks['plain'] / 1e12:.1f} fast "
          f"{peaks['fast'] / 1e12:.1f} TFLOP/s", flush=True)
    report = {"ceilings": {"read_bw": ceil.read_bw, "copy_bw": ceil.copy_bw,
                           "bf16_peak": ceil.flops, "fp8_peak_plain": peaks["plain"],
                           "fp8_peak_fast": peaks["fast"]},
              "device": "cpu" if cpu else torch.cuda.get_device_name(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cells": []}
    bf16_backend = TritonExperts()
    tokens = parse_tokens(args.tokens)
    for name in args.shapes.split(","):
        shape = SMOKE if name == "smoke" else SHAPES[name]
        if time.time() - t_start > args.budget_s:
            print(f"budget spent; skipping {name}", flush=True)
            continue
        gen = torch.Generator(device=DEV).manual_seed(0)
        w13, w2, s13, s2, b13, b2 = fp8_weights(shape, DEV, gen, ACT)
        h, i, e, k = shape.hidden, shape.intermediate, shape.num_experts, shape.top_k
        for t in tokens:
            if time.time() - t_start > args.budget_s:
                print(f"budget spent; skipping {name} T={t}", flush=True)
                continue
            t_cell = time.time()
            x = torch.randn(t, h, generator=gen, device=DEV, dtype=ACT)
            routings = [draw_routing(t, e, k, gen, DEV) for _ in range(args.routings)]
            hits = [int(torch.unique(ids).numel()) for _, ids in routings]
            hit = sum(hits) / len(hits)
            use_graph = t <= 1024 and not cpu
            n = len(routings)
            floor8 = fp8_floor_us(shape, t, hit, ceil, fp8_rate)
            floor16 = floor_for(shape, t, hit, 2, ceil).us
            cell = {"shape": name, "T": t, "experts_hit": hit, "floor_fp8_us": floor8,
                    "floor_bf16_us": floor16, "candidates": []}
            best = None
            for bm in regime(shape, t):
                prefill = bm >= PREQUANT_BLOCK_M
                xin = quantize_rows_fp8(x) if prefill else x
                aligns = [moe_align(ids, e, bm) for _, ids in routings]
                acts = [torch.randn(al.max_blocks * bm, i, device=DEV, dtype=ACT)
                        for al in aligns]
                acts8 = [quantize_rows_fp8(a) for a in acts] if prefill else None
                gu_best = {}  # fp8_out -> (us, cfg, one_dot)
                for cfg in gate_up_candidates(bm):
                    f8 = prefill and cfg.block_n == GROUP
                    for one in (False,):
                        try:
                            us = timed(lambda j, c=cfg, f8=f8, one=one: gate_up_fp8(
                                xin, w13, s13, aligns[j % n], k, c, ACT, fp8_out=f8), n,
                                use_graph, args.samples)
                        except Exception as exc:  # noqa: BLE001
                            cell["candidates"].append({"bm": bm, "gate_up": cfg.__dict__,
                                                       "one_dot": one,
                                                       "error": str(exc)[:200]})
                            continue
                        cell["candidates"].append({"bm": bm, "gate_up": cfg.__dict__,
                                                   "us": us, "fp8_out": f8, "one_dot": one})
                        if f8 not in gu_best or us < gu_best[f8][0]:
                            gu_best[f8] = (us, cfg, one)
                dn_best = {}  # fp8 act -> (us, cfg, atomic)
                for cfg in down_candidates(bm, i):
                    atomic = cfg.split_k > 1 or bm <= 32
                    accs = [torch.zeros(t, h, device=DEV) for _ in range(n)] if atomic else None
                    for f8 in ((False, True) if True in gu_best else (False,)):
                        src = acts8 if f8 else acts

                        def run_down(j, c=cfg, atomic=atomic, accs=accs, src=src):
                            w, _ = routings[j % n]
                            if atomic:
                                return down_fp8(src[j % n], w2, s2, aligns[j % n], w, k, c,
                                                atomic_out=accs[j % n])
                            return down_fp8(src[j % n], w2, s2, aligns[j % n], w, k, c,
                                            out_dtype=ACT)
                        try:
                            us = timed(run_down, n, use_graph, args.samples)
                        except Exception as exc:  # noqa: BLE001
                            cell["candidates"].append({"bm": bm, "down": cfg.__dict__,
                                                       "error": str(exc)[:200]})
                            continue
                        cell["candidates"].append({"bm": bm, "down": cfg.__dict__, "us": us,
                                                   "atomic": atomic, "fp8_act": f8})
                        if f8 not in dn_best or us < dn_best[f8][0]:
                            dn_best[f8] = (us, cfg, atomic)
                pairs = [(gu_best[f][0] + dn_best[f][0], gu_best[f][1], dn_best[f],
                          gu_best[f][2]) for f in gu_best if f in dn_best]
                if not pairs:
                    continue
                _, gu_cfg, dn, one = min(pairs, key=lambda p: p[0])
                cell["one_dot"] = one
                full = ExpertsConfig(block_m=bm, gate_up=gu_cfg, down=dn[1],
                                     combine="atomic" if dn[2] else "reduce")
                us = timed(lambda j, c=full: run_experts_fp8(
                    x, w13, w2, s13, s2, routings[j % n][0], routings[j % n][1], c,
                    ACT), n, use_graph, args.final_samples)
                cell.setdefault("full", []).append({"bm": bm, "us": us, "one_dot": one,
                                                    "config": full.to_json()})
                if best is None or us < best[0]:
                    best = (us, full, one)
                del aligns, acts, acts8
            if best is None:
                print(f"{name} T={t}: no fp8 config ran", flush=True)
                report["cells"].append(cell)
                continue
            fp8_us, full, one = best
            cell["one_dot"] = one
            # pre-quantized input (the post-quant dispatch form) with the same config
            q_us = timed(lambda j: run_experts_fp8(
                quantize_rows_fp8(x), w13, w2, s13, s2, routings[j % n][0],
                routings[j % n][1], full, ACT), n, use_graph, args.final_samples)
            bf16_us = timed(lambda j: bf16_backend.run_experts(
                x, b13, b2, routings[j % n][0], routings[j % n][1]), n, use_graph,
                args.final_samples)
            # correctness on sampled rows vs DESIGN 11a's reference
            rows = torch.randperm(t, generator=gen, device=DEV)[:32].sort().values
            w0, ids0 = routings[0]
            got = run_experts_fp8(x, w13, w2, s13, s2, w0, ids0, full, ACT)[rows]
            ref = reference_fp8_moe(x[rows], w13, s13, w2, s2, w0[rows], ids0[rows],
                                    QuantConfig(), out_dtype=ACT)
            err = ((got.double() - ref.double()).norm() / ref.double().norm()).item()
            cell.update(fp8_us=fp8_us, fp8_quant_then_run_us=q_us, bf16_us=bf16_us,
                        method="graph" if use_graph else "eager", err=err,
                        config=full.to_json(), fp8_floor_ratio=floor8 / fp8_us,
                        bf16_floor_ratio=floor16 / bf16_us, cell_s=time.time() - t_cell)
            report["cells"].append(cell)
            print(f"{name:16s} T={t:5d} {cell['method']:5s} fp8 {fp8_us:9.1f} us "
                  f"(floor {floor8:8.1f}, {floor8 / fp8_us:.3f}) quant+fp8 {q_us:9.1f} "
                  f"bf16 {bf16_us:9.1f} (floor/t {floor16 / bf16_us:.3f}) fp8/bf16 "
                  f"{fp8_us / bf16_us:.3f} err {err:.2e} cfg {full.key()} "
                  f"[{cell['cell_s']:.0f}s]", flush=True)
            (out_dir / "fp8_sweep.json").write_text(json.dumps(report, indent=1))
            del x, routings
        del w13, w2, s13, s2, b13, b2
        torch.cuda.empty_cache()
    ok = [c for c in report["cells"] if "fp8_us" in c]
    if ok:
        geo = math.exp(sum(math.log(c["fp8_floor_ratio"]) for c in ok) / len(ok))
        print(f"geomean fp8 floor/time over {len(ok)} cells: {geo:.3f}", flush=True)
        report["geomean_fp8_floor_ratio"] = geo
    (out_dir / "fp8_sweep.json").write_text(json.dumps(report, indent=1))
    print(f"total {time.time() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
