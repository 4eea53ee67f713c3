"""Interpreter check (CPU, ``TRITON_INTERPRET=1``, fp32 and fp16) of ``kernel_grouped.py``
against ``gate_up_torch`` and the shipped grouped kernel, 16- and 32-row blocks, N and K tails.

    TRITON_INTERPRET=1 python3 benchmarks/experiments/gateup-n256-2026-12-03/check_grouped_cpu.py
"""

from __future__ import annotations

import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402


def main() -> None:
    import kernel_grouped as kg
    from moerun._triton.launch import FastLauncher
    from moerun.backends.triton import gate_up as gm
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.configs import GateUpConfig

    shipped, one_dot = gm._LAUNCH, FastLauncher(kg.gate_up_one_dot_kernel)
    for dt, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        for (m, s, k, h, inter, bm, bn, bk) in ((40, 4, 2, 96, 48, 16, 32, 32),
                                                (23, 5, 3, 80, 40, 32, 16, 32)):
            g = torch.Generator().manual_seed(m + s)
            x = torch.randn(m, h, generator=g).to(dt)
            w13 = (torch.randn(s, 2 * inter, h, generator=g) * h ** -0.5).to(dt)
            ids = torch.stack([torch.randperm(s - 1, generator=g)[:k] for _ in range(m)])
            align = moe_align(ids.to(torch.int32), s, bm)
            cfg = GateUpConfig(block_n=bn, block_k=bk, group_m=2, num_warps=4, num_stages=2)
            ref = gm.gate_up_torch(x, w13, align, k).float()
            used = int(align.num_post.item())
            outs = {}
            for name, launcher in (("shipped", shipped), ("one-dot", one_dot)):
                gm._LAUNCH = launcher
                try:
                    outs[name] = gm.gate_up(x, w13, align, k, cfg)
                finally:
                    gm._LAUNCH = shipped
                err = ((outs[name][:used].float() - ref[:used]).abs().max()
                       / ref[:used].abs().max()).item()
                print(f"{dt} bm={bm} bn={bn} i={inter} h={h} {name}: rel err {err:.2e}")
                assert err <= tol, (name, err)
            print("    bit-equal:", torch.equal(outs["shipped"][:used], outs["one-dot"][:used]))
    print("OK")


if __name__ == "__main__":
    main()
