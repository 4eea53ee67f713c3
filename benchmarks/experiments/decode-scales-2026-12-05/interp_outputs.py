"""The fp8 direct decode kernels' outputs under the Triton interpreter, saved for a
bit-for-bit comparison of two trees (run once per tree, then ``--compare A B``).

    TRITON_INTERPRET=1 PYTHONPATH=. python3 interp_outputs.py --out old.pt
    TRITON_INTERPRET=1 PYTHONPATH=. python3 interp_outputs.py --compare old.pt new.pt
"""

from __future__ import annotations

import argparse

import torch


def outputs() -> dict:
    from moerun.backends.triton.configs import DownConfig, GateUpConfig
    from moerun.backends.triton.down import down_direct
    from moerun.backends.triton.fp8_direct import gate_up_fp8_direct
    from moerun.backends.triton.fp8_quant import quantize_rows_fp8
    from moerun.quant import FP8_DTYPE

    out = {}
    for m, s, k, h, i, bn_g, bn_d in ((1, 8, 2, 256, 384, 32, 64), (3, 6, 3, 384, 256, 64, 128),
                                      (2, 4, 2, 128, 128, 128, 32), (1, 16, 4, 640, 896, 16, 64)):
        g = torch.Generator().manual_seed(m * 1000 + h)
        x = torch.randn(m, h, generator=g) * 0.5
        w13 = (torch.randn(s, 2 * i, h, generator=g) * 0.1).to(FP8_DTYPE)
        w2 = (torch.randn(s, h, i, generator=g) * 0.1).to(FP8_DTYPE)
        s13 = torch.rand(s, 2 * i // 128, h // 128, generator=g) + 0.5
        s2 = torch.rand(s, h // 128, i // 128, generator=g) + 0.5
        ids = torch.stack([torch.randperm(s, generator=g)[:k] for _ in range(m)]).to(torch.int32)
        ids[0, -1] = -1  # an excluded pair
        tw = torch.softmax(torch.randn(m, k, generator=g), dim=1)
        for a_fp8 in (False, True):
            xin = quantize_rows_fp8(x) if a_fp8 else x
            act = gate_up_fp8_direct(xin, w13, s13, ids, GateUpConfig(block_n=bn_g, block_k=128),
                                     torch.float32)
            key = f"m{m}s{s}k{k}h{h}i{i}a{int(a_fp8)}"
            out[key + "-act"] = act.clone().masked_fill(  # excluded pairs' rows: unwritten
                (ids.reshape(-1, 1) < 0), 0.0)
            cnt = torch.zeros(m * ((h + bn_d - 1) // bn_d), dtype=torch.int32)
            out[key + "-pairs"] = down_direct(act, w2, ids, DownConfig(block_n=bn_d, block_k=128),
                                              counters=cnt, w2_scale=s2, topk_weights=tw)
            out[key + "-token"] = down_direct(act, w2, ids, DownConfig(block_n=bn_d, block_k=128),
                                              w2_scale=s2, topk_weights=tw)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2)
    a = ap.parse_args()
    if a.compare:
        x, y = (torch.load(p) for p in a.compare)
        bad = [k for k in x if not torch.equal(x[k], y[k])]
        print(f"{len(x) - len(bad)} of {len(x)} outputs bit-equal; differ: {bad}")
    else:
        torch.save(outputs(), a.out)
