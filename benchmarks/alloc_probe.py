"""Host cost of large allocations and of one grouped-GEMM launch (a device-run probe).

Why gate/up and down cost 50-110 µs of host time at T=1024 when a launch costs ~13 µs:
times ``torch.empty`` at the sizes those calls allocate, the launch with a preallocated
output, and the views ``moe_align`` cuts. Usage (GPU): ``python benchmarks/alloc_probe.py``.
"""

from __future__ import annotations

import os
import statistics

import torch


def med(fn, n=200):
    """Median host µs of ``fn()`` issued with an idle device queue."""
    from moerun.bench.timing import host_issue_samples

    dev = torch.device("cuda")
    return statistics.median(host_issue_samples(lambda i: fn(), dev, n, warmup=10)) * 1e6


def main() -> None:
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.configs import ConfigTable
    from moerun.backends.triton.gate_up import gate_up

    print("PYTORCH_CUDA_ALLOC_CONF =", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    bf = torch.bfloat16
    for rows, cols in ((16, 768), (1024, 7168), (24320, 768), (24320, 2048), (8192, 7168)):
        mb = rows * cols * 2 / 2**20
        print(f"torch.empty [{rows}, {cols}] bf16 ({mb:.0f} MB): "
              f"{med(lambda r=rows, c=cols: torch.empty(r, c, dtype=bf, device='cuda')):.1f} us")
    keep = [torch.empty(24320, 2048, dtype=bf, device="cuda") for _ in range(2)]
    print(f"torch.empty 100 MB while two are held: "
          f"{med(lambda: torch.empty(24320, 2048, dtype=bf, device='cuda')):.1f} us")
    del keep
    buf = torch.empty(30000, dtype=torch.int32, device="cuda")
    print(f"narrow: {med(lambda: buf.narrow(0, 100, 200)):.1f} us   "
          f"slice: {med(lambda: buf[100:300]):.1f} us")
    # DeepSeek-V3 T=1024 gate/up: E=256, K=8, H=7168, I=2048, BM=64
    e, k, h, i, t = 256, 8, 7168, 2048, 1024
    w13 = torch.randn(e, 2 * i, h, dtype=bf, device="cuda") * h ** -0.5
    x = torch.randn(t, h, dtype=bf, device="cuda")
    ids = torch.randint(0, e, (t, k), dtype=torch.int32, device="cuda")
    cfg = ConfigTable(device_name=torch.cuda.get_device_name()).lookup(e, i, h, t, k, bf).config
    al = moe_align(ids, e, cfg.block_m)
    out = gate_up(x, w13, al, k, cfg.gate_up)
    print(f"gate_up (fresh out): {med(lambda: gate_up(x, w13, al, k, cfg.gate_up)):.1f} us")
    print(f"gate_up (out=):      "
          f"{med(lambda: gate_up(x, w13, al, k, cfg.gate_up, out=out)):.1f} us")
    print(f"moe_align:           {med(lambda: moe_align(ids, e, cfg.block_m)):.1f} us")


if __name__ == "__main__":
    main()
