"""Questions 2-4 of this folder's README, answered by timing only (device script).

2. ``layer``: in ``fp8-wide-2026-12-05/ab_wide.py`` the layer's fp8 call read 2-5 % slower
   than the same ws kernels called directly (``run_experts_fp8_ws``). That script synced
   before every call, so host issue time before the first big kernel counts; the bench times
   calls back to back (``moerun.bench.timing.time_samples``), where it does not. Here both
   forms and the bf16 call on the dequantized weights are timed both ways, the order
   alternating between rounds, with each form's host issue time (``host_issue_samples``)
   and the layer call's per-kernel device time. If the gap is host time, it shows in the
   per-call-sync timer and the host column and not in the back-to-back one. The two
   qwen3-235b-ep8-local cells (grouped entries; fp8 196.5 µs against bf16 193.5 at T=256 in
   the last matrix) ask whether a small eager fp8 call is bound by its host time.
3. ``clock``: mixtral8x7b T=1024 fp8 read 940 µs in the bench and 847 µs in the tune for the
   same entry. The bench replays 10 routings per graph for 3 + 20 replays; the tune 4
   routings for 2 + 10. Here the shipped entry is replayed in both settings, and at 4x the
   bench's replays, in alternation, while ``nvidia-smi`` samples the SM clock (the caller
   starts it; this script prints a UTC timestamp per phase to line the samples up).
4. ``decode``: qwen3-30b T=1 fp8 is the matrix's lowest cell (21.1 µs against an 8.5 µs
   floor; bf16 24.6 µs). Per form (the layer's fp8 call, bf16 on the dequantized weights),
   the graph-replay time per call against the per-kernel device time of the same captured
   calls (profiler over replays): kernel time or the gaps between kernels?

    PYTHONPATH=. python3 benchmarks/experiments/fp8-open-questions-2026-12-05/timing_check.py \
        --out timing.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ncu-2026-12-05"))
from ab import _kernels, _timed  # the A/B's timers: per-call synced events, profiler

LAYER_CELLS = ["qwen3-30b-a3b:8192", "mixtral8x7b:1024", "qwen3-235b-a22b:1024",
               "qwen3-235b-ep8-local:256", "qwen3-235b-ep8-local:2048"]


def _stamp() -> str:
    return time.strftime("%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}"


def _setup(name: str, t: int, calls: int, seed: int, *, dequantized: bool = False):
    from moerun.backends.triton import TritonExperts
    from moerun.bench.fp8 import fp8_weights
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.quant import ExpertQuant, QuantConfig

    dev = torch.device("cuda")
    shape = parse_shapes(name)[0]
    gen = torch.Generator(device=dev).manual_seed(seed)
    w13, w2, s13, s2, d13, d2 = fp8_weights(shape, dev, gen, torch.bfloat16)
    if not dequantized:
        d13 = d2 = None
        torch.cuda.empty_cache()
    x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
    routings = [draw_routing(t, shape.num_experts, shape.top_k, gen, dev) for _ in range(calls)]
    eq = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
    return TritonExperts(), shape, x, (w13, w2, s13, s2, d13, d2), routings, eq


def _layer_cell(cell: str, rounds: int, n: int) -> dict:
    """One cell of question 2: the layer's fp8 call, the same ws kernels called directly (ws
    entries only) and the bf16 call on the dequantized weights, each timed per-call synced,
    back to back and as host issue time; per-kernel device time of the layer's call."""
    from moerun.backends.triton.fp8_ws import run_experts_fp8_ws
    from moerun.bench.fp8 import layer_fp8_call
    from moerun.bench.timing import host_issue_samples, time_samples

    name, t = cell.split(":")
    t = int(t)
    be, shape, x, (w13, w2, s13, s2, d13, d2), routings, eq = _setup(name, t, 1, 0,
                                                                      dequantized=True)
    w, ids = routings[0]
    cfg = be.fp8_config_for(shape.num_experts, shape.intermediate, shape.hidden, t,
                            shape.top_k)
    forms = {"layer": lambda: layer_fp8_call(be, shape, x, w13, w2, w, ids, eq),
             "bf16": lambda: be.run_experts(x, d13, d2, w, ids)}
    rec = {"config": cfg.key()}
    if cfg.kernel == "ws":
        kw = {"gate_up_cols": cfg.gate_up.block_n, "down_cols": cfg.down.block_n,
              "gate_up_stages": cfg.gate_up.num_stages, "down_stages": cfg.down.num_stages,
              "group_m": cfg.gate_up.group_m, "out_dtype": torch.bfloat16}
        forms["direct"] = lambda: run_experts_fp8_ws(x, w13, w2, s13, s2, w, ids, **kw)
        rec["bit_equal"] = bool(torch.equal(forms["layer"](), forms["direct"]()))
    dev = torch.device("cuda")
    times = {k: {f: [] for f in forms} for k in ("synced_us", "b2b_us", "host_us")}
    for r in range(rounds):
        for f in (list(forms) if r % 2 == 0 else list(forms)[::-1]):
            fn = forms[f]
            times["synced_us"][f] += _timed(fn, n)
            times["b2b_us"][f] += [s * 1e6 for s in time_samples(
                lambda _i, fn=fn: fn(), dev, n, warmup=2)]
            times["host_us"][f] += [s * 1e6 for s in host_issue_samples(
                lambda _i, fn=fn: fn(), dev, n, warmup=2)]
    for key, per_form in times.items():
        rec[key] = {f: round(statistics.median(v), 1) for f, v in per_form.items()}
    rec["layer_kernels_us"] = _kernels(forms["layer"])
    rec["layer_host_profile"] = _host_profile(forms["layer"])
    return rec


def _host_profile(fn, calls: int = 50, top: int = 14) -> list[str]:
    """cProfile of ``calls`` calls of ``fn`` (device synced before, not between): the
    functions with the most cumulative host time, as ``µs per call  name``."""
    import cProfile
    import pstats

    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][3])[:top]  # (cc, nc, tt, ct, ..)
    return [f"{v[3] / calls * 1e6:8.1f} us  {k[2]} ({os.path.basename(k[0])}:{k[1]})"
            for k, v in rows]


def layer_question(cells: list[str], rounds: int, n: int) -> dict:
    """Question 2 over ``cells`` (``name:T``)."""
    out = {}
    for cell in cells:
        out[cell] = _layer_cell(cell, rounds, n)
        print("layer", cell, json.dumps(out[cell]), flush=True)
        torch.cuda.empty_cache()
    return out


def clock_question(rounds: int) -> dict:
    from moerun.bench.fp8 import layer_fp8_call
    from moerun.bench.timing import time_graph_replay

    be, shape, x, (w13, w2, *_), routings, eq = _setup("mixtral8x7b", 1024, 10, 0)
    settings = {  # name: (routings per graph, timed replays, warm-up replays)
        "tune": (4, 10, 2), "bench": (10, 20, 3), "bench_x4": (10, 80, 3)}
    rec = {"config": be.fp8_config_for(8, shape.intermediate, shape.hidden, 1024, 2).key(),
           "us": {k: [] for k in settings}, "phases": []}
    for _ in range(rounds):
        for name, (calls, samples, warm) in settings.items():
            fns = [lambda w=w, ids=ids: layer_fp8_call(be, shape, x, w13, w2, w, ids, eq)
                   for w, ids in routings[:calls]]
            t0 = _stamp()
            per_call = time_graph_replay(lambda i, fns=fns: fns[i](), calls, samples,
                                         warmup=warm)
            rec["phases"].append([name, t0, _stamp()])
            rec["us"][name].append(round(statistics.median(per_call) * 1e6, 1))
            time.sleep(0.5)
    rec["median_us"] = {k: statistics.median(v) for k, v in rec["us"].items()}
    # each routing's 128-row tiles (the tune-like setting replays the first 4, the others 10)
    tiles = []
    for _, ids in routings:
        n = torch.bincount(ids.flatten().long(), minlength=8)
        tiles.append(int(((n + 127) // 128).sum()))
    rec["tiles_per_routing"] = tiles
    print("clock", json.dumps(rec), flush=True)
    return rec


def _decode_cell(cell: str, calls: int) -> dict:
    """One cell of question 4 (``name:T``): per form, the replay time per call, the
    per-kernel device time per call, and the difference (launch gaps)."""
    from moerun.bench.fp8 import layer_fp8_call
    from moerun.bench.timing import time_graph_replay

    name, t = cell.split(":")
    be, shape, x, (w13, w2, _, _, d13, d2), routings, eq = _setup(name, int(t), calls, 0,
                                                                  dequantized=True)
    forms = {
        "fp8": [lambda w=w, ids=ids: layer_fp8_call(be, shape, x, w13, w2, w, ids, eq)
                for w, ids in routings],
        "bf16": [lambda w=w, ids=ids: be.run_experts(x, d13, d2, w, ids) for w, ids in routings],
    }
    rec = {}
    for f, fns in forms.items():
        replay_us = statistics.median(time_graph_replay(
            lambda i, fns=fns: fns[i](), calls, 50, warmup=3)) * 1e6
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for fn in fns:
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for fn in fns:
                fn()
        kern = {k: round(v / calls, 2) for k, v in _kernels(graph.replay, calls=10).items()}
        graph.reset()
        rec[f] = {"replay_us_per_call": round(replay_us, 2), "kernels_us_per_call": kern,
                  "gaps_us_per_call": round(replay_us - sum(kern.values()), 2)}
    return rec


def decode_question(cells: list[str], calls: int) -> dict:
    """Question 4: where a decode call's graph-replay time goes -- per-kernel device time of
    the captured calls (profiler over replays) against the replay time per call; the rest is
    launch gaps. fp8 (the layer's call) and bf16 (dequantized weights) at each cell."""
    out = {}
    for cell in cells:
        out[cell] = _decode_cell(cell, calls)
        print("decode", cell, json.dumps(out[cell]), flush=True)
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="layer,clock,decode", help="which questions to run")
    ap.add_argument("--cells", default=",".join(LAYER_CELLS))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--decode", default="qwen3-30b-a3b:1,deepseek-v3:1,qwen3-30b-a3b:16")
    args = ap.parse_args()
    only = set(args.only.split(","))
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "MOERUN_PDL": os.environ.get("MOERUN_PDL", "")}
    if "layer" in only:
        res["layer"] = layer_question(args.cells.split(","), args.rounds, args.n)
    if "clock" in only:
        res["clock"] = clock_question(args.rounds)
    if "decode" in only:
        res["decode"] = decode_question(args.decode.split(","), 10)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
