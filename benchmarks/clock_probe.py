"""Why a cell can be slower under graph replay than eager: SM clock and power per phase.

A device-run probe (not a benchmark claim). For one expert-matrix cell it runs
``TritonExperts.run_experts`` for ``--seconds`` eagerly (calls back to back, each timed with
events, as ``moerun bench`` times eager) and then as replays of a CUDA graph of
``--calls-per-graph`` calls (as ``moerun bench`` times graphs), while ``nvidia-smi`` samples
the SM clock and the power draw every 50 ms; it prints per phase the median µs per call, the
mean SM clock and the mean power. Usage (GPU)::

    python benchmarks/clock_probe.py [--shape mixtral8x7b] [--tokens 1024] [--seconds 4]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch


def _phase(fn, seconds: float) -> tuple[float, float, float]:
    """Run ``fn(i)`` for ``seconds``; (start, end, median µs per call from events)."""
    torch.cuda.synchronize()
    t0 = time.time()
    samples = []
    i = 0
    while time.time() - t0 < seconds:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        per = fn(i)
        e.record()
        e.synchronize()
        samples.append(s.elapsed_time(e) * 1e3 / per)
        i += 1
    return t0, time.time(), statistics.median(samples)


def main() -> None:
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.inputs import make_case, make_weights
    from moerun.bench.shapes import parse_shapes

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="mixtral8x7b")
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--calls-per-graph", type=int, default=10)
    args = p.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    shape = parse_shapes(args.shape)[0]
    w = make_weights(shape, dt, dev)
    n = args.calls_per_graph
    cases = [make_case(shape, args.tokens, dt, dev, seed=s) for s in range(n)]
    be = TritonExperts()
    cfg = be.kernel_config(num_slots=shape.num_experts, hidden=shape.hidden,
                           intermediate=shape.intermediate, num_tokens=args.tokens,
                           top_k=shape.top_k, dtype=dt)

    def call(i):
        c = cases[i % n]
        return be.run_experts(c.x, w.w13, w.w2, c.topk_weights, c.topk_ids)

    for i in range(n):
        call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [call(i) for i in range(n)]
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                            "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=subprocess.PIPE, text=True)
    stamps: list[float] = []
    time.sleep(1.0)
    phases = {}
    phases["idle"] = (time.time() - 0.9, time.time(), 0.0)
    phases["eager"] = _phase(lambda i: (call(i), 1)[1], args.seconds)
    time.sleep(1.0)
    phases["graph"] = _phase(lambda i: (graph.replay(), n)[1], args.seconds)
    time.sleep(0.3)
    smi.terminate()
    lines = smi.communicate()[0].splitlines()
    del outs
    # nvidia-smi -lms prints one line per period; map them onto wall time evenly
    t_start, t_end = phases["idle"][0] - 0.1, time.time() - 0.3
    for k in range(len(lines)):
        stamps.append(t_start + (t_end - t_start) * k / max(1, len(lines) - 1))
    print(f"{shape.name} T={args.tokens} config {cfg}")
    for name, (a, b, us) in phases.items():
        rows = [tuple(float(v) for v in line.split(",")) for t, line in zip(stamps, lines)
                if a + 0.2 <= t <= b and "," in line]
        clk = statistics.mean(r[0] for r in rows) if rows else float("nan")
        pw = statistics.mean(r[1] for r in rows) if rows else float("nan")
        print(f"{name:6s} {us:9.1f} us/call  SM clock {clk:7.0f} MHz  power {pw:6.0f} W  "
              f"({len(rows)} samples)")


if __name__ == "__main__":
    main()
