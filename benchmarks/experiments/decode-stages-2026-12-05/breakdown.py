"""Per-kernel device time of whole calls at the compute-bound cells, fp8 and bf16, shipped
configs (torch.profiler over eager calls; µs per call; every kernel listed): how much of a
call is outside its two GEMMs. Device script.

    PYTHONPATH=. python3 benchmarks/experiments/decode-stages-2026-12-05/breakdown.py --out b.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ncu-2026-12-05"))
from ab import _cell, _kernels  # a cell's whole call (shipped config); per-kernel device µs

CELLS = ["qwen3-30b-a3b:8192", "deepseek-v3:8192", "mixtral8x7b:1024", "qwen3-235b-a22b:8192",
         "qwen3-30b-a3b:1024"]


def kernels(fn, calls: int) -> dict:
    """Every kernel's device µs per call over ``calls`` eager calls, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    return _kernels(fn, calls, top=None, width=48)


def main() -> None:
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.shapes import parse_shapes

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args()
    dev = torch.device("cuda")
    be = TritonExperts()
    rows = []
    for dtype in ("fp8", "bf16"):
        for cell in CELLS:
            name, t = cell.split(":")
            shape = parse_shapes(name)[0]
            fn, cfg = _cell(be, dtype, shape, int(t), dev)
            k = kernels(fn, args.calls)
            total = sum(k.values())
            rows.append({"cell": cell, "dtype": dtype, "config": str(cfg), "kernels_us": k,
                         "sum_us": round(total, 1)})
            print(f"{cell} {dtype}: sum {total:.1f} us | "
                  + " | ".join(f"{n} {v}" for n, v in k.items()), flush=True)
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
            del fn
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
