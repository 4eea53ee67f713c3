"""Is a prefill cell held back by its kernel or by the H200's power cap? (device probe)

``moerun bench`` takes its matmul ceiling from a short burst (3 warm-up and 10 timed cuBLAS
8192^3 GEMMs, about 20 ms), during which the SM clock is still at its boost. A T=8192 cell
runs for seconds at 640-660 W (``benchmarks/clock-probe-h200-2026-12-01.txt``), where the
clock is lower. This probe measures, in one process, with ``nvidia-smi`` sampling the SM clock
and the power draw every 50 ms:

* ``mm short``: the bench's ceiling method (bf16 8192^3, median of 10 after 3, 2 s idle first);
* ``mm sustained``: the same GEMM back to back for ``--seconds`` (batches of 10 calls per
  event pair; median of the batches in the second half of the phase);
* the same two for the fp8 rate of ``moerun bench --dtype fp8`` (``torch._scaled_mm`` e4m3,
  fast accumulation);
* moerun's bf16 and fp8 calls of the prefill cells, back to back for ``--seconds`` (batches
  of 3 calls per event pair), with their useful FLOP/s.

Printed per phase: µs per call, TFLOP/s, mean SM clock and power over the phase's second half.
The ratio a cell's FLOP/s / sustained cuBLAS FLOP/s is its efficiency at the clock the power cap
leaves, against the floor/time of the bench, which is against the boost-clock burst.

    PYTHONPATH=. python3 benchmarks/experiments/power-2026-12-03/power.py --out x.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import time

import torch

BF16_CELLS = [("deepseek-v3", 8192), ("qwen3-235b-a22b", 8192), ("mixtral8x7b", 8192),
              ("qwen3-30b-a3b", 8192), ("mixtral8x7b", 1024), ("deepseek-v3-ep8-local", 8192)]
FP8_CELLS = [("deepseek-v3", 8192), ("mixtral8x7b", 8192)]


class Sampler:
    """``nvidia-smi`` at 50 ms in the background; ``window(a, b)`` -> (clock MHz, W, n)."""

    def __init__(self) -> None:
        q = "timestamp,clocks.sm,power.draw"
        self.p = subprocess.Popen(["nvidia-smi", f"--query-gpu={q}",
                                   "--format=csv,noheader,nounits", "-lms", "50"],
                                  stdout=subprocess.PIPE, text=True)
        self.rows: list[tuple[float, float, float]] = []

    def stop(self) -> None:
        self.p.terminate()
        for line in self.p.communicate()[0].splitlines():
            parts = [v.strip() for v in line.split(",")]
            if len(parts) != 3:
                continue
            try:
                ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                self.rows.append((ts, float(parts[1]), float(parts[2])))
            except ValueError:
                continue

    def window(self, a: float, b: float) -> tuple[float, float, int]:
        r = [x for x in self.rows if a <= x[0] <= b]
        if not r:
            return float("nan"), float("nan"), 0
        return statistics.mean(x[1] for x in r), statistics.mean(x[2] for x in r), len(r)


def sustained(fn, seconds: float, per: int) -> dict:
    """``fn()`` back to back for ``seconds``, ``per`` calls per event pair; median µs per call
    of the batches in the second half, and that half's wall window."""
    torch.cuda.synchronize()
    t0 = time.time()
    samples: list[tuple[float, float]] = []
    while time.time() - t0 < seconds:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per):
            fn()
        b.record()
        b.synchronize()
        samples.append((time.time(), a.elapsed_time(b) * 1e3 / per))
    half = t0 + seconds / 2
    late = [us for ts, us in samples if ts >= half]
    return {"us": statistics.median(late), "a": half, "b": time.time(), "batches": len(late)}


def short(fn, idle: float = 2.0) -> dict:
    """The bench's ceiling method after ``idle`` seconds: 3 warm-up calls, median of 10."""
    torch.cuda.synchronize()
    time.sleep(idle)
    t0 = time.time()
    for _ in range(3):
        fn()
    us = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        us.append(a.elapsed_time(b) * 1e3)
    return {"us": statistics.median(us), "a": t0, "b": time.time(), "batches": 10}


def gemm_phases(dev: torch.device, add, seconds: float) -> None:
    """The cuBLAS phases: bf16 ``mm`` and fp8 ``_scaled_mm`` at 8192^3, short and sustained."""
    n = 8192
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=dev).to(torch.bfloat16)
    b = torch.randn(n, n, generator=g, device=dev).to(torch.bfloat16)
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)

    def mm():
        return torch.mm(a, b, out=c)

    add("bf16 mm 8192^3 short", short(mm), 2.0 * n ** 3)
    add("bf16 mm 8192^3 sustained", sustained(mm, seconds, 10), 2.0 * n ** 3)
    add("bf16 mm 8192^3 short again", short(mm), 2.0 * n ** 3)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=dev)

    def f8():
        return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                use_fast_accum=True)

    add("fp8 scaled_mm 8192^3 short", short(f8), 2.0 * n ** 3)
    add("fp8 scaled_mm 8192^3 sustained", sustained(f8, seconds, 10), 2.0 * n ** 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.fp8 import fp8_weights
    from moerun.bench.inputs import draw_routing, make_weights
    from moerun.bench.shapes import parse_shapes
    from moerun.quant import ExpertQuant, QuantConfig

    dev = torch.device("cuda")
    smi = Sampler()
    phases: list[dict] = []

    def add(name, r, flops):
        r.update(name=name, tflops=flops / (r["us"] * 1e-6) / 1e12)
        phases.append(r)
        print(f"{name:34s} {r['us']:10.1f} us  {r['tflops']:7.1f} TFLOP/s", flush=True)

    gemm_phases(dev, add, args.seconds)
    torch.cuda.empty_cache()

    be = TritonExperts()
    last, w = None, None
    for name, t in BF16_CELLS:
        shape = parse_shapes(name)[0]
        if name != last:
            w = None
            torch.cuda.empty_cache()
            w = make_weights(shape, torch.bfloat16, dev, seed=0)
            last = name
        gen = torch.Generator(device=dev).manual_seed(t)
        x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
        tw, ids = draw_routing(t, shape.num_experts, shape.top_k, gen, dev)
        flops = 2.0 * t * shape.top_k * 3 * shape.hidden * shape.intermediate
        call = (lambda x=x, w=w, tw=tw, ids=ids: be.run_experts(x, w.w13, w.w2, tw, ids))
        for _ in range(3):
            call()
        time.sleep(1.0)
        add(f"bf16 {name} T={t}", sustained(call, args.seconds, 3), flops)
    w = None
    torch.cuda.empty_cache()
    qc = QuantConfig()
    for name, t in FP8_CELLS:
        shape = parse_shapes(name)[0]
        gen = torch.Generator(device=dev).manual_seed(0)
        w13, w2, s13, s2, d13, d2 = fp8_weights(shape, dev, gen, torch.bfloat16)
        del d13, d2
        torch.cuda.empty_cache()
        eq = ExpertQuant(config=qc, w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
        x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
        tw, ids = draw_routing(t, shape.num_experts, shape.top_k, gen, dev)
        flops = 2.0 * t * shape.top_k * 3 * shape.hidden * shape.intermediate
        call = (lambda x=x, tw=tw, ids=ids, w13=w13, w2=w2, eq=eq:
                be.run_experts(be.quantize_rows(x, qc), w13, w2, tw, ids, quant=eq))
        for _ in range(3):
            call()
        time.sleep(1.0)
        add(f"fp8 {name} T={t}", sustained(call, args.seconds, 3), flops)
        del w13, w2, s13, s2, eq
        torch.cuda.empty_cache()
    time.sleep(0.3)
    smi.stop()
    print(f"\n{'phase':34s} {'us/call':>10s} {'TFLOP/s':>8s} {'SM MHz':>7s} {'W':>5s} samples")
    for r in phases:
        clk, pw, k = smi.window(r["a"], r["b"])
        r.update(clock_mhz=clk, power_w=pw, samples=k)
        print(f"{r['name']:34s} {r['us']:10.1f} {r['tflops']:8.1f} {clk:7.0f} {pw:5.0f} {k}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "phases": phases, "smi_rows": len(smi.rows)}, f, indent=1)


if __name__ == "__main__":
    main()
