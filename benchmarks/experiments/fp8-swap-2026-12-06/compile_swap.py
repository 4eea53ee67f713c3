"""Offline sm90 compile (CPU machine) of the direct decode kernels, and of the grouped ones at
16/32-row tiles, with and without ``SWAP_AB``: which MMA each form issues, conversions,
shared memory, registers and spills.

    PYTHONPATH=. python3 benchmarks/experiments/fp8-swap-2026-12-06/compile_swap.py
"""

from __future__ import annotations

import re
import tempfile

import torch

from tests.sm90 import compile_sm90, ptxas_report


def main() -> None:
    from moerun.backends.triton.down import _down_direct_pairs_kernel
    from moerun.backends.triton.fp8_direct import _gate_up_fp8_direct_kernel
    from moerun.backends.triton.gate_up import _gate_up_kernel

    f8 = torch.float8_e4m3fn
    m, k, s, h, i = 1, 8, 128, 2048, 768
    x8 = torch.empty(m, h, dtype=torch.uint8).view(f8)
    xb = torch.empty(m, h, dtype=torch.bfloat16)
    xs = torch.empty(m, h // 128)
    w13 = torch.empty(s, 2 * i, h, dtype=torch.uint8).view(f8)
    w13b = torch.empty(s, 2 * i, h, dtype=torch.bfloat16)
    s13 = torch.empty(s, 2 * i // 128, h // 128)
    w2 = torch.empty(s, h, i, dtype=torch.uint8).view(f8)
    w2b = torch.empty(s, h, i, dtype=torch.bfloat16)
    s2 = torch.empty(s, h // 128, i // 128)
    act = torch.empty(m * k, i, dtype=torch.bfloat16)
    ids = torch.empty(m * k, dtype=torch.int32)
    tw = torch.empty(m * k)
    out = torch.empty(m, h, dtype=torch.bfloat16)
    part = torch.empty(m * k, h)
    cnt = torch.empty(m * 32, dtype=torch.int32)
    cases = []
    for bn, st in ((32, 4), (64, 4), (128, 3)):
        for swap in (False, True):
            cases.append((f"fp8 gate/up n{bn} s{st} swap={swap}", _gate_up_fp8_direct_kernel,
                          (x8, xs, w13, s13, act, ids, cnt, 0, i, h, s, x8.stride(0),
                           xs.stride(0), w13.stride(0), w13.stride(1), s13.stride(0),
                           s13.stride(1), act.stride(0), k, 16, bn, 128, True, 1e-12, 448.0,
                           0, swap, True), st))
    for bn, st in ((64, 4), (128, 3)):
        for fp8 in (True, False):
            for swap in (False, True):
                w, ws = (w2, s2) if fp8 else (w2b, w2b)
                cases.append((f"{'fp8' if fp8 else 'bf16'} down pairs n{bn} s{st} swap={swap}",
                              _down_direct_pairs_kernel,
                              (act, w, out, part, cnt, ids, ws, tw, h, i, s, act.stride(0),
                               w.stride(0), w.stride(1), out.stride(0), part.stride(0),
                               ws.stride(0), ws.stride(1), k, 8, 16, bn, 128, True, "tf32",
                               fp8, 1e-12, 448.0, swap, True), st))
    for bn, st in ((64, 4), (128, 3)):
        for swap in (False, True):
            cases.append((f"bf16 gate/up n{bn} s{st} swap={swap}", _gate_up_kernel,
                          (xb, w13b, w13b, act, ids, ids, ids, tw, cnt, 0, m * k, i, h,
                           m * k, s, i, xb.stride(0), w13b.stride(0), w13b.stride(1),
                           act.stride(0), k, 16, bn, 128, 1, True, "tf32", 0, 1, 0, swap,
                           True), st))
    # the grouped kernels at 16/32-row tiles (ExpertsConfig.swap_ab with kernel="grouped")
    from moerun.backends.triton.down import _down_kernel
    from moerun.backends.triton.fp8 import _down_fp8_kernel, _gate_up_fp8_kernel

    r = 1024
    xg8, actg = torch.empty(r, h, dtype=torch.uint8).view(f8), torch.empty(r, i, dtype=torch.bfloat16)
    yg = torch.empty(r, h, dtype=torch.bfloat16)
    rid = torch.empty(r, dtype=torch.int32)
    for bm in (16, 32):
        for swap in (False, True):
            cases.append((f"fp8 grouped gate/up m{bm} n64 swap={swap}", _gate_up_fp8_kernel,
                          (x8, xs, w13, s13, actg, actg, rid, rid, rid, r, i, h, 64,
                           x8.stride(0), xs.stride(0), w13.stride(0), w13.stride(1),
                           s13.stride(0), s13.stride(1), actg.stride(0), 1, k, bm, 64, 128, 1,
                           True, False, 2, 1e-12, 448.0, swap, True), 3))
            cases.append((f"fp8 grouped down m{bm} n128 swap={swap}", _down_fp8_kernel,
                          (actg, actg, w2, s2, yg, tw, rid, rid, rid, r, h, i, 64,
                           actg.stride(0), 1, w2.stride(0), w2.stride(1), s2.stride(0),
                           s2.stride(1), yg.stride(0), k, bm, 128, 128, 1, 1, False, False,
                           1e-12, 448.0, swap, True), 3))
            cases.append((f"bf16 grouped down m{bm} n128 swap={swap}", _down_kernel,
                          (actg, w2b, w2b, yg, tw, rid, rid, rid, r, h, i, 64, s,
                           actg.stride(0), w2b.stride(0), w2b.stride(1), yg.stride(0),
                           w2b.stride(1), k, bm, 128, 64, 1, 1, True, False, "tf32", 0, swap,
                           True), 3))
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn, args, st in cases:
            ck = compile_sm90(fn, args, num_warps=4, num_stages=st)
            ptx = ck.asm["ptx"]
            mma = sorted(set(re.findall(r"(wgmma\.mma_async\.sync\.aligned\.\w+\.\w+\.\w+\.\w+|"
                                        r"mma\.sync\.aligned\.\w+\.row\.col\.\w+\.\w+\.\w+)",
                                        ptx)))
            cvt = len(re.findall(r"cvt\.rn\.f16x2\.e4m3x2", ptx))
            regs, spill = ptxas_report(ptx, tmp)
            print(f"{name:36s} {','.join(mma):60s} cvt={cvt:3d} smem={ck.metadata.shared:6d} "
                  f"regs={regs} spill={spill}")


if __name__ == "__main__":
    main()
