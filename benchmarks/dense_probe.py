"""The shared expert's MLP + add: torch form (cuBLAS) against the dense Triton kernels.

A device-run probe (not a benchmark claim) that sets ``MAX_DENSE_ROWS`` in
``moerun/backends/triton/dense.py``: per T, graph-replay time per call and host issue time
per call (sync, then a host clock around one call; median) of ``SharedExpert.add_to`` and of
``dense.shared_mlp_add``, with the floor (weights + activations over the read bandwidth, or
flops over the matmul rate, measured in the same run) and the relative error against fp64 on
sampled rows. Usage (GPU)::

    python benchmarks/dense_probe.py [--tokens 1,2,4,8,16,32,64,128,256] [--hidden 7168]
                                     [--shared 2048]
"""

from __future__ import annotations

import argparse
import statistics

import torch


def _host_us(fn, n: int = 200) -> float:
    """Median host µs of ``fn()`` issued with an idle device queue."""
    from moerun.bench.timing import host_issue_samples

    dev = torch.device("cuda")
    return statistics.median(host_issue_samples(lambda i: fn(), dev, n, warmup=0)) * 1e6


def main() -> None:
    from moerun.backends.triton.dense import shared_mlp_add
    from moerun.bench.ceilings import measure_run_ceilings
    from moerun.bench.timing import time_graph_replay
    from moerun.shared_expert import SharedExpert

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--shared", type=int, default=2048)
    p.add_argument("--calls-per-graph", type=int, default=10)
    args = p.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    ceil = measure_run_ceilings(dev, dt)
    print(f"ceilings: read {ceil.read_bw / 1e12:.3f} TB/s, matmul {ceil.flops / 1e12:.1f} TFLOP/s")
    h, si = args.hidden, args.shared
    se = SharedExpert(h, si, gated=False, dtype=dt, device=dev)
    se.load(torch.randn(2 * si, h, device=dev, dtype=dt) * h ** -0.5,
            torch.randn(h, si, device=dev, dtype=dt) * si ** -0.5, None)
    print(f"{'T':>5} {'floor':>8} {'torch':>8} {'dense':>8} {'dense/torch':>11} "
          f"{'host torch':>10} {'host dense':>10} {'err dense':>9}")
    for t in (int(v) for v in args.tokens.split(",")):
        n = args.calls_per_graph
        xs = [torch.randn(t, h, device=dev, dtype=dt) for _ in range(n)]
        rs = [torch.randn(t, h, device=dev, dtype=dt) for _ in range(n)]
        bytes_ = 3 * h * si * 2 + 3 * t * h * 2
        floor = max(bytes_ / ceil.read_bw, 6 * t * h * si / ceil.flops) * 1e6
        tt = statistics.median(time_graph_replay(lambda i: se.add_to(rs[i], xs[i]), n, 20,
                                                 warmup=3)) * 1e6
        td = statistics.median(time_graph_replay(
            lambda i: shared_mlp_add(xs[i], se.w13, se.w2, rs[i]), n, 20, warmup=3)) * 1e6
        ht = _host_us(lambda: se.add_to(rs[0], xs[0]))
        hd = _host_us(lambda: shared_mlp_add(xs[0], se.w13, se.w2, rs[0]))
        rows = slice(0, min(t, 8))
        y = shared_mlp_add(xs[0][rows], se.w13, se.w2, rs[0][rows]).double()
        xd = xs[0][rows].double()
        gu = xd @ se.w13.double().t()
        ref = (torch.nn.functional.silu(gu[:, :si]) * gu[:, si:]) @ se.w2.double().t() \
            + rs[0][rows].double()
        err = float((y - ref).norm() / ref.norm())
        print(f"{t:5d} {floor:8.1f} {tt:8.1f} {td:8.1f} {td / tt:11.3f} {ht:10.1f} {hd:10.1f} "
              f"{err:9.2e}", flush=True)


if __name__ == "__main__":
    main()
