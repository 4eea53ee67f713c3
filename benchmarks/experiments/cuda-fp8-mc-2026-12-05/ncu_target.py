"""Device target for Nsight Compute: one cell's CUDA MoE call (``moe_probe.cuda_call``) run
twice, the first as warm-up, so ``ncu --launch-skip 2 --launch-count 2 -k regex:moe_kernel``
profiles the second call's gate/up and down kernels (call2.sh).

    PYTHONPATH=. python3 benchmarks/experiments/cuda-fp8-mc-2026-12-05/ncu_target.py \
        --dtype bf16 --cell deepseek-v3:8192 --mc 1 --stages 4
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_probe import _lib, _setup, cuda_call  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lib", default="/tmp/fp8_mc_moe.so")
    p.add_argument("--dtype", choices=("fp8", "bf16"), default="bf16")
    p.add_argument("--cell", default="deepseek-v3:8192")
    p.add_argument("--mc", type=int, default=1)
    p.add_argument("--stages", type=int, default=4)
    args = p.parse_args()
    lib = _lib(args.lib)
    name, t = args.cell.split(":")
    _, x, w13, w2, s13, s2, w, ids = _setup(name, int(t), torch.device("cuda"), args.dtype)
    for _ in range(2):
        cuda_call(lib, x, w13, w2, s13, s2, w, ids, mc=args.mc, stages=args.stages)
    torch.cuda.synchronize()
    print("ok", args.cell, args.dtype, flush=True)


if __name__ == "__main__":
    main()
