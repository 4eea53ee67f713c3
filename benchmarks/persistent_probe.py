"""Probe: the persistent TMA kernels (``ExpertsConfig.kernel="persistent"``) against today's
grouped kernels with their tuned configs, on one H200 (issue 11 item 1; device script).

    PYTHONPATH=. python3 benchmarks/persistent_probe.py --out $OUT/probe.json [--budget-s 300]

Cells: mixtral8x7b, qwen3-30b-a3b, qwen3-235b-a22b, deepseek-v3 at T=8192 (eager) and
T=1024 (CUDA-graph replay of one call per routing); deepseek-v3-ep8-local and
qwen3-235b-ep8-local at T=2048 and 8192 (eager). Per cell: fresh random ``x`` and
``--routings`` fresh uniform routings (``moerun.bench``'s weights and ``draw_routing``), the
floor from ``moerun.bench.ceilings.floor_for`` with ceilings measured in this run, device
events, the median of ``--samples`` timed calls (rotating the routings). Timed: the whole
``TritonExperts.run_experts`` call (align + GEMMs + combine) with the shipped tuned config,
then with each persistent candidate (same ``TritonExperts``, a config override). A
candidate is checked against the current kernels' output before it is timed (rel err <=
2e-2, else recorded as wrong and not timed); the best of each kind is checked against the
fp32 reference on 32 sampled rows.

Compiles first, in parallel worker processes (every candidate of every shape, and the
tuned configs), so Triton's disk cache holds the binaries before anything is timed; a
candidate whose compile fails is recorded with its error and skipped; one still compiling
after ``--compile-s`` is compiled in the main process when reached (``--no-jit`` skips it).
Stops starting new cells once ``--budget-s`` is spent (the compile counts).

Writes ``--out`` (JSON: ceilings, every candidate's time or error, per cell the winner and a
``tuned_entry`` to paste into the shape's tuned file) and prints a table last.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

import torch

# (shape, T, graph): most informative first (the EP-local and T=8192 cells are the bar)
CELLS = [
    ("deepseek-v3-ep8-local", 8192, False), ("qwen3-235b-ep8-local", 8192, False),
    ("mixtral8x7b", 8192, False), ("qwen3-235b-a22b", 8192, False),
    ("deepseek-v3", 8192, False), ("qwen3-30b-a3b", 8192, False),
    ("deepseek-v3-ep8-local", 2048, False), ("qwen3-235b-ep8-local", 2048, False),
    ("mixtral8x7b", 1024, True), ("qwen3-235b-a22b", 1024, True),
    ("qwen3-30b-a3b", 1024, True), ("deepseek-v3", 1024, True),
    ("qwen3-235b-ep8-local", 256, False),  # 64 rows per expert: one 128-row tile each
]
#: ``--device cpu`` (a smoke run of this script under ``TRITON_INTERPRET=1``): the tiny shape
SMOKE_CELLS = [("tiny", 64, False), ("tiny", 200, False)]
DTYPE = torch.bfloat16  # fp16 in the CPU smoke run (bf16 is wrong under the interpreter)
CHECK_TOL = 2e-2  # candidate vs current kernels (bf16 outputs, two summation orders)


def tile_candidates():
    """``--set tiles``: the shipped 8-warp persistent config's neighbours -- 128-deep K steps
    (half the K iterations of a short-K tile: qwen3-30b's down has 12 at ``BK=64``), a
    wider ``group_m`` (more blocks sharing a weight tile in L2) and 4 stages."""
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig

    def cfg(gu, dn):
        return ExpertsConfig(block_m=128, gate_up=gu, down=dn, combine="reduce",
                             kernel="persistent")

    def gu(k=64, s=3, g=8):
        return GateUpConfig(block_n=128, block_k=k, group_m=g, num_warps=8, num_stages=s)

    def dn(k=64, s=3, g=8):
        return DownConfig(block_n=256, block_k=k, group_m=g, num_warps=8, num_stages=s)

    return [cfg(gu(), dn(k=128, s=2)), cfg(gu(k=128, s=2), dn()),
            cfg(gu(k=128, s=2), dn(k=128, s=2)), cfg(gu(g=16), dn(g=16)),
            cfg(gu(s=4), dn()), cfg(gu(g=4), dn(g=4))]


def candidates(shape, t, tuned, which="base"):
    """Persistent configs for one cell, most promising first (a small set: one probe run).

    ``tuned`` is the cell's current config: its block_m is kept as one option (the padding
    it was tuned for), 128-row wgmma tiles are the other. ``which="tiles"``:
    :func:`tile_candidates` instead. (The warp-specialized set of 2026-12-02 is in
    ``benchmarks/experiments/ws-2026-12-02/``: ``ExpertsConfig`` now refuses it.)"""
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig

    if which == "tiles":
        return tile_candidates()

    def cfg(bm, gu, dn, programs=0):
        return ExpertsConfig(block_m=bm, gate_up=gu, down=dn, combine="reduce",
                             kernel="persistent", programs=programs)

    gu = GateUpConfig(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)
    dn = DownConfig(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)
    dn256 = DownConfig(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3)
    out = [
        cfg(128, gu, dn256),
        cfg(128, gu, dn),
        cfg(128, dataclasses.replace(gu, a_tma=True), dn256),
        cfg(128, dataclasses.replace(gu, num_stages=4), dataclasses.replace(dn, num_stages=4)),
        cfg(128, dataclasses.replace(gu, flatten=True), dataclasses.replace(dn256,
                                                                           flatten=True)),
        # NOTE: warp_specialize=True (gate/up with the pointer-gathered A) aborts Triton 3.6's
        # sm90 compiler (WSLowerToken.cpp assertion, H200 2026-12-01), killing the compile pool
        cfg(128, dataclasses.replace(gu, a_tma=True, num_stages=4),
            dataclasses.replace(dn256, num_stages=4)),
    ]
    rows_per_expert = t * shape.top_k / shape.num_experts
    if tuned.block_m < 128 or rows_per_expert < 192:
        # NOTE: 64-row persistent tiles were also timed at ~256 rows per expert (H200,
        # 2026-12-01 21:13 UTC, benchmarks/persistent-probe-h200-2026-12-01-64row.json):
        # 1.11-1.19x slower than the 128-row ones, so they are offered below 192 rows only
        gu64 = GateUpConfig(block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4)
        dn64 = DownConfig(block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4)
        out.insert(1, cfg(64, gu64, dn64))
    return out


# ---------------------------------------------------------------- compile workers
def _compile_one(task: str) -> str:
    """Worker: run one config's whole path on a 4-token problem with the real H, I, K (one
    real slot: the kernels do not specialise on S, so the binaries are the ones used)."""
    t0 = time.time()
    d = json.loads(task)
    try:
        from moerun.backends.triton.configs import ConfigTable, ExpertsConfig
        from moerun.backends.triton.experts import TritonExperts

        cfg = ExpertsConfig.from_json(d["config"])
        h, i, k = d["H"], d["I"], d["K"]
        w13 = torch.randn(1, 2 * i, h, device="cuda", dtype=DTYPE)
        w2 = torch.randn(1, h, i, device="cuda", dtype=DTYPE)
        x = torch.randn(4, h, device="cuda", dtype=DTYPE)
        ids = torch.zeros(4, k, device="cuda", dtype=torch.int32)
        w = torch.rand(4, k, device="cuda")
        TritonExperts(ConfigTable(overrides={b: cfg for b in range(1, 1 << 15)})).run_experts(
            x, w13, w2, w, ids)
        torch.cuda.synchronize()
        return f"ok {time.time() - t0:.1f}s"
    except Exception as e:  # noqa: BLE001 -- reported, the caller skips the config
        return f"FAIL {type(e).__name__}: {str(e)[:600]}"


def _task(shape, cfg) -> str:
    return json.dumps({"H": shape.hidden, "I": shape.intermediate, "K": shape.top_k,
                       "config": cfg.to_json()}, sort_keys=True)


def _precompile(tasks: list[str], workers: int, timeout_s: float) -> dict[str, str]:
    """``{task: "ok ..." | "FAIL ..."}`` for the tasks compiled within ``timeout_s``."""
    workers = workers or max(1, min(len(tasks), (os.cpu_count() or 4) - 2))
    print(f"compiling {len(tasks)} configs on {workers} workers", flush=True)
    status: dict[str, str] = {}
    ex = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    futs = {ex.submit(_compile_one, task): task for task in tasks}
    try:
        for f in cf.as_completed(futs, timeout=timeout_s):
            try:
                status[futs[f]] = f.result()
            except Exception as e:  # noqa: BLE001 -- a crashed worker breaks the pool
                status[futs[f]] = f"FAIL worker: {type(e).__name__}: {str(e)[:300]}"
    except cf.TimeoutError:
        print(f"compile: {len(futs) - len(status)} configs still compiling after "
              f"{timeout_s:.0f} s", flush=True)
    ex.shutdown(wait=False, cancel_futures=True)
    for proc in list((getattr(ex, "_processes", None) or {}).values()):  # still compiling:
        proc.terminate()  # stop them: they would share the GPU and CPU with the timed calls
    return status


# ---------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--budget-s", type=float, default=300,
                    help="stop starting new cells after this many seconds (compile included)")
    ap.add_argument("--compile-s", type=float, default=150,
                    help="wait at most this long for the parallel compile")
    ap.add_argument("--workers", type=int, default=0, help="compile processes (0: cores - 2)")
    ap.add_argument("--routings", type=int, default=4)
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--cells", default="", help="comma list of shape:T (default: all)")
    ap.add_argument("--no-jit", action="store_true",
                    help="skip candidates the parallel compile did not finish")
    ap.add_argument("--set", default="base", choices=("base", "tiles"),
                    help="candidate family: base (the 2026-12-01 space) or tiles (K-step, "
                    "group and stage neighbours of the shipped config)")
    ap.add_argument("--device", default="cuda",
                    help="cpu: a smoke run on the tiny shape (needs TRITON_INTERPRET=1)")
    args = ap.parse_args()
    t_start = time.time()
    global DTYPE
    cpu = args.device == "cpu"
    if cpu:
        DTYPE = torch.float16

    from moerun.backends.triton import TritonExperts
    from moerun.backends.triton.configs import ConfigTable, bucket_of
    from moerun.bench.ceilings import floor_for, measure_run_ceilings
    from moerun.bench.inputs import draw_routing, make_weights, reference_rows
    from moerun.bench.shapes import SHAPES
    from moerun.bench.timing import time_graph_replay, time_samples
    from moerun.env import get_env
    from moerun.testing import rel_err

    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    cells = SMOKE_CELLS if cpu else CELLS
    if args.cells:
        want = {(c.split(":")[0], int(c.split(":")[1])) for c in args.cells.split(",")}
        cells = [c for c in cells if (c[0], c[1]) in want]
    current = TritonExperts()
    table = ConfigTable(device_name=get_env().device_name)
    plan = []  # (shape, T, graph, tuned choice, candidates)
    for name, t, graph in cells:
        shape = SHAPES[name]
        choice = table.lookup(shape.num_experts, shape.intermediate, shape.hidden, t,
                              shape.top_k, DTYPE)
        plan.append((shape, t, graph, choice, candidates(shape, t, choice.config, args.set)))

    # 1. compile everything in parallel (candidates in plan order: most promising first)
    tasks = []
    for shape, _, _, choice, cands in plan:
        for c in [choice.config, *cands]:
            task = _task(shape, c)
            if task not in tasks:
                tasks.append(task)
    status: dict[str, str] = {}
    if not cpu:
        status = _precompile(tasks, args.workers, args.compile_s)
    n_fail = sum(s.startswith("FAIL") for s in status.values())
    print(f"compiled {len(status)}/{len(tasks)} ({n_fail} failed) in "
          f"{time.time() - t_start:.0f} s", flush=True)

    # 2. ceilings, measured in this run
    ceil = measure_run_ceilings(dev, DTYPE)
    print(f"ceilings: {ceil.describe()}", flush=True)
    report = {"device": "cpu" if cpu else torch.cuda.get_device_name(),
              "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]),
              "ceilings": {"read_bw": ceil.read_bw, "copy_bw": ceil.copy_bw,
                           "flops": ceil.flops},
              "compile": [{"task": json.loads(k), "status": status.get(k, "not finished")}
                          for k in tasks],
              "cells": [], "winners": []}
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out_path.write_text(json.dumps(report, indent=1))

    # 3. cells
    weights_of: dict = {}
    for shape, t, graph, choice, cands in plan:
        if time.time() - t_start > args.budget_s:
            print(f"budget spent: skipping {shape.name} T={t}", flush=True)
            report["cells"].append({"shape": shape.name, "T": t, "skipped": "budget"})
            continue
        t_cell = time.time()
        if shape.name not in weights_of:
            weights_of.clear()
            if not cpu:
                torch.cuda.empty_cache()
            weights_of[shape.name] = make_weights(shape, DTYPE, dev, seed=11)
        w = weights_of[shape.name]
        gen = torch.Generator(device=dev).manual_seed(1000 + t)
        x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=DTYPE)
        routings = [draw_routing(t, shape.num_experts, shape.top_k, gen, dev)
                    for _ in range(args.routings)]
        hit = sum(int(torch.unique(ids).numel()) for _, ids in routings) / len(routings)
        floor = floor_for(shape, t, hit, 2, ceil)
        n = len(routings)

        def timed(be, x=x, w=w, routings=routings, n=n, graph=graph):
            def call(j):
                tw, ids = routings[j % n]
                return be.run_experts(x, w.w13, w.w2, tw, ids)
            if graph:
                return statistics.median(time_graph_replay(call, n, args.samples,
                                                           warmup=2)) * 1e6
            samples = 2 if cpu else args.samples
            return statistics.median(time_samples(call, dev, samples, warmup=1 if cpu else 2)) * 1e6

        cell = {"shape": shape.name, "T": t, "method": "graph" if graph else "eager",
                "experts_hit": hit, "floor_us": floor.us, "bound": floor.bound,
                "current_config": choice.config.to_json(), "current_source": choice.source,
                "candidates": []}
        tw0, ids0 = routings[0]
        try:
            cur_out = current.run_experts(x, w.w13, w.w2, tw0, ids0)
            cell["current_us"] = timed(current)
        except Exception as e:  # noqa: BLE001
            cell["current_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            cur_out = None
        best = None
        for c in cands:
            rec = {"config": c.to_json(), "key": c.key()}
            cell["candidates"].append(rec)
            st = status.get(_task(shape, c))
            if st is None and args.no_jit:
                rec["error"] = "not compiled in time (--no-jit)"
                continue
            if st is not None and st.startswith("FAIL"):
                rec["error"] = "compile: " + st
                continue
            be = TritonExperts(ConfigTable(overrides={bucket_of(t): c}))
            try:
                got = be.run_experts(x, w.w13, w.w2, tw0, ids0)
                if not cpu:
                    torch.cuda.synchronize()
                if cur_out is not None:
                    rec["vs_current"] = rel_err(got, cur_out)
                    if not rec["vs_current"] <= CHECK_TOL:
                        rec["error"] = f"wrong: rel err {rec['vs_current']:.3g} vs current"
                        continue
                rec["us"] = timed(be)
            except Exception as e:  # noqa: BLE001 -- record and go on
                rec["error"] = f"{type(e).__name__}: {str(e)[:600]}"
                try:
                    if not cpu:
                        torch.cuda.synchronize()
                except Exception:  # noqa: BLE001 -- a sticky CUDA error: nothing after it runs
                    report["fatal"] = f"{shape.name} T={t} {c.key()}: {rec['error']}"
                    break
                continue
            if best is None or rec["us"] < best[0]:
                best = (rec["us"], c, be)
        if "fatal" in report:
            report["cells"].append(cell)
            print(f"FATAL (sticky CUDA error, the run stops): {report['fatal']}", flush=True)
            break
        # correctness vs the fp32 reference on sampled rows
        rows = torch.randperm(t, generator=gen, device=dev)[:32].sort().values
        ref = reference_rows(x[rows], w.w13, w.w2, tw0[rows], ids0[rows], acc=torch.float32)
        if cur_out is not None:
            cell["current_err"] = rel_err(cur_out[rows], ref)
        if best is not None:
            cell["persistent_us"], cfg, be = best[0], best[1], best[2]
            cell["persistent_key"] = cfg.key()
            cell["persistent_config"] = cfg.to_json()
            cell["persistent_err"] = rel_err(be.run_experts(x, w.w13, w.w2, tw0, ids0)[rows],
                                             ref)
            if "current_us" in cell:
                cell["speedup"] = cell["current_us"] / best[0]
                winner = cfg if best[0] < cell["current_us"] else choice.config
                report["winners"].append({
                    "shape": shape.name, "S": shape.num_experts, "N": shape.intermediate,
                    "K": shape.hidden, "top_k": shape.top_k, "T": t, "bucket": bucket_of(t),
                    "kind": winner.kernel, "us": min(best[0], cell["current_us"]),
                    "floor_us": floor.us,
                    "tuned_entry": {"config": winner.to_json(),
                                    "us": round(min(best[0], cell["current_us"]), 2),
                                    "floor_us": round(floor.us, 2),
                                    "timing": "graph" if graph else "eager"}})
        cell["cell_s"] = time.time() - t_cell
        report["cells"].append(cell)
        save()
        cur = cell.get("current_us", float("nan"))
        per = cell.get("persistent_us", float("nan"))
        print(f"{shape.name:22s} T={t:5d} {cell['method']:5s} current {cur:9.1f} us "
              f"(floor/t {floor.us / cur:.3f}) persistent {per:9.1f} us "
              f"(floor/t {floor.us / per:.3f}) [{cell['cell_s']:.0f}s]", flush=True)
        del x, routings

    # 4. the table
    print("\n| cell | method | floor µs | current µs | floor/t | best persistent µs | floor/t | "
          "speedup | config | err current | err persistent |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in report["cells"]:
        if "floor_us" not in c:
            print(f"| {c['shape']} T={c['T']} | skipped ({c.get('skipped')}) |"
                  " | | | | | | | | |")
            continue
        cur, per = c.get("current_us"), c.get("persistent_us")

        def f(v, fmt):
            return format(v, fmt) if isinstance(v, float) and math.isfinite(v) else "-"
        print(f"| {c['shape']} T={c['T']} | {c['method']} | {c['floor_us']:.0f} | "
              f"{f(cur, '.1f')} | {f(c['floor_us'] / cur if cur else None, '.3f')} | "
              f"{f(per, '.1f')} | {f(c['floor_us'] / per if per else None, '.3f')} | "
              f"{f(c.get('speedup'), '.3f')} | {c.get('persistent_key', '-')} | "
              f"{f(c.get('current_err'), '.2e')} | {f(c.get('persistent_err'), '.2e')} |")
    errs = [(c["shape"], c["T"], r["key"], r["error"][:160]) for c in report["cells"]
            for r in c.get("candidates", []) if "error" in r]
    if errs:
        print(f"\n{len(errs)} candidate errors (full text in the JSON):")
        for e in errs:
            print("  ", *e)
    report["total_s"] = time.time() - t_start
    save()
    print(f"\ntotal {report['total_s']:.0f} s; wrote {out_path}", flush=True)
    return 1 if "fatal" in report else 0


if __name__ == "__main__":
    sys.exit(main())
