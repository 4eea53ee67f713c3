"""Interpreter check (CPU, ``TRITON_INTERPRET=1``, fp32 and fp16) of ``kernel.py``'s one-dot
gate/up against ``gate_up_torch`` and against the shipped persistent kernel, on a small problem
with uneven expert rows, zero-row slots, an N tail (I not a multiple of BN) and a K tail.

    TRITON_INTERPRET=1 python3 benchmarks/experiments/gateup-n256-2026-12-03/check_cpu.py
"""

from __future__ import annotations

import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402


def main() -> None:
    import kernel as kn
    from moerun._triton.launch import FastLauncher
    from moerun.backends.triton import persistent as pm
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.configs import GateUpConfig
    from moerun.backends.triton.gate_up import gate_up_torch

    shipped = pm._LAUNCH_GATE_UP
    one_dot = FastLauncher(kn.gate_up_n2_kernel)
    worst = 0.0
    for dt, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        for (m, s, k, h, inter, bn, bk) in ((40, 4, 2, 96, 48, 32, 32), (23, 5, 3, 80, 40, 16, 32)):
            g = torch.Generator().manual_seed(m + s)
            x = torch.randn(m, h, generator=g).to(dt)
            w13 = (torch.randn(s, 2 * inter, h, generator=g) * h ** -0.5).to(dt)
            ids = torch.stack([torch.randperm(s - 1, generator=g)[:k] for _ in range(m)])
            ids = ids.to(torch.int32)  # slot s-1 gets no rows
            ids[ids == 2] = 0 if k == 1 else ids[ids == 2]
            align = moe_align(ids, s, 16)
            cfg = GateUpConfig(block_n=bn, block_k=bk, group_m=2, num_warps=4, num_stages=2)
            ref = gate_up_torch(x, w13, align, k).float()
            used = int(align.num_post.item())
            outs = {}
            for name, launcher in (("shipped", shipped), ("one-dot", one_dot)):
                pm._LAUNCH_GATE_UP = launcher
                try:
                    outs[name] = pm.gate_up_persistent(x, w13, align, k, cfg, programs=3)
                finally:
                    pm._LAUNCH_GATE_UP = shipped
            for name, o in outs.items():
                err = ((o[:used].float() - ref[:used]).abs().max() /
                       ref[:used].abs().max()).item()
                worst = max(worst, err)
                print(f"{dt} m={m} s={s} k={k} h={h} i={inter} bn={bn} bk={bk} {name}: "
                      f"max rel err vs twin {err:.2e}", flush=True)
                assert err <= tol, (name, err)
            same = torch.equal(outs["shipped"][:used], outs["one-dot"][:used])
            print(f"    one-dot == shipped bit for bit: {same}")
    print(f"OK, worst {worst:.2e}")


if __name__ == "__main__":
    main()
