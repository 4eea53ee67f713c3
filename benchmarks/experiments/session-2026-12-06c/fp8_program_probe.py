"""Host time of the fp8 backend call (quantized rows in, as the layer hands them) with and
without its launch program (``TritonExperts._call_fp8``; ``_replay_fp8`` when this ran),
at the shipped configs of the card. Device script.

    PYTHONPATH=. python3 benchmarks/experiments/session-2026-12-06c/fp8_program_probe.py \
        --out p.json

Per cell, programs off and on in turn (``moerun._triton.program.ENABLED``), ``--rounds``
rounds: host µs a call (``perf_counter`` over ``--calls`` calls issued back to back, before
the sync; at most 4 launches a call, so the launch queue never blocks the issue) and
back-to-back µs a call (CUDA events over the same number of calls, median of 7 samples:
the larger of host and device time). The outputs of the two paths are compared on the same
inputs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from moerun._triton import program
from moerun.backends.triton import TritonExperts
from moerun.bench.inputs import draw_routing, make_fp8_weights
from moerun.bench.shapes import parse_shapes
from moerun.quant import ExpertQuant, QuantConfig, quantize_rows


def host_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6 / calls


def b2b_us(fn, calls: int) -> float:
    out = []
    for _ in range(7):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="qwen3-30b-a3b:1,qwen3-30b-a3b:16,qwen3-30b-a3b:128,"
                    "qwen3-235b-a22b:1,qwen3-235b-a22b:16,mixtral8x7b:1,"
                    "qwen3-235b-ep8-local:256,deepseek-v3-ep8-local:256")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    weights = {}
    for cell in args.cells.split(","):
        name, t = cell.split(":")
        t = int(t)
        shape = parse_shapes(name)[0]
        if name not in weights:
            weights.clear()
            torch.cuda.empty_cache()
            weights[name] = make_fp8_weights(shape, torch.bfloat16, dev)
        w = weights[name]
        quant = ExpertQuant(config=QuantConfig(), w13_scale=w.w13_scale, w2_scale=w.w2_scale,
                            out_dtype=torch.bfloat16)
        gen = torch.Generator(device=dev).manual_seed(t)
        x = torch.randn(t, shape.hidden, generator=gen, device=dev).to(torch.bfloat16)
        tw, ids = draw_routing(t, shape.num_experts, shape.top_k, gen, dev)
        q = quantize_rows(x)
        be = TritonExperts()
        cfg = be.fp8_config_for(shape.num_experts, shape.intermediate, shape.hidden, t,
                                shape.top_k)

        def call():
            return be.run_experts(q, w.w13, w.w2, tw, ids, quant=quant)

        res = {"off": {"host": [], "b2b": []}, "on": {"host": [], "b2b": []}}
        outs = {}
        for _ in range(args.rounds):
            for mode in ("off", "on"):
                program.ENABLED = mode == "on"
                for _ in range(3):
                    outs[mode] = call()
                res[mode]["host"].append(host_us(call, args.calls))
                res[mode]["b2b"].append(b2b_us(call, args.calls))
        program.ENABLED = True
        torch.cuda.synchronize()
        (entry,) = be._programs._entries.values() if len(be._programs) == 1 else (None,)
        recorded = getattr(entry, "num_launches", None)
        same = bool(torch.equal(outs["on"], outs["off"]))
        diff = float((outs["on"].float() - outs["off"].float()).abs().max())
        med = {m: {k: round(statistics.median(v), 1) for k, v in d.items()}
               for m, d in res.items()}
        rec = {"cell": cell, "config": str(cfg), "program_launches": recorded,
               "equal": same, "max_abs_diff": diff, "us": med, "raw": res}
        rows.append(rec)
        print(f"{cell} [{cfg.kernel} m{cfg.block_m} {cfg.combine}] program launches "
              f"{recorded}, equal {same} (max diff {diff:.2e}) | host off {med['off']['host']}"
              f" on {med['on']['host']} | back-to-back off {med['off']['b2b']} on "
              f"{med['on']['b2b']}", flush=True)
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
