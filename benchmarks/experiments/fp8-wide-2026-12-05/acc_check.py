"""Accuracy of the 256-column carry kernels (``ws_wide.py``) against the shipped ws kernels:
relative error on sampled rows against (a) DESIGN 11a's reference (``reference_fp8_moe``:
identically quantized activations, dequantized weights, fp32) and (b) the fp32 block with
dequantized weights and UNquantized activations (what the model computes), for two weight
kinds: the bench's random e4m3 codes (``bench.fp8.fp8_weights``) and Gaussian weights
block-quantized like a checkpoint (``quant.quantize_weight_blocks``).

    PYTHONPATH=. python3 benchmarks/experiments/fp8-wide-2026-12-05/acc_check.py --out acc.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CASES = ["deepseek-v3:2048", "mixtral8x7b:1024", "qwen3-30b-a3b:2048", "qwen3-235b-a22b:1024"]


def unquantized(x, w13, s13, w2, s2, w, ids):
    """fp32 ``sum_j w * (silu(x Wg^T) * (x Wu^T)) W2^T`` with dequantized weights, x as is."""
    from moerun.quant import dequantize_weight_blocks

    xf = x.float()
    inter = w13.shape[1] // 2
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        hit = ids == e
        rows = hit.any(dim=1).nonzero().squeeze(1)
        wt = (w.float() * hit.float()).sum(dim=1)[rows]
        g13 = dequantize_weight_blocks(w13[e], s13[e])
        g2 = dequantize_weight_blocks(w2[e], s2[e])
        gu = xf[rows] @ g13.t()
        a = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        out.index_add_(0, rows, (a @ g2.t()) * wt[:, None])
    return out


def gauss_weights(shape, dev, gen):
    from moerun.quant import quantize_weight_blocks

    e, h, i = shape.num_experts, shape.hidden, shape.intermediate
    w13 = torch.empty(e, 2 * i, h, device=dev, dtype=torch.float8_e4m3fn)
    w2 = torch.empty(e, h, i, device=dev, dtype=torch.float8_e4m3fn)
    s13 = torch.empty(e, 2 * i // 128, h // 128, device=dev)
    s2 = torch.empty(e, h // 128, i // 128, device=dev)
    for j in range(e):  # one expert at a time (fp32 temporaries)
        a, b = quantize_weight_blocks(torch.randn(2 * i, h, device=dev, generator=gen) * h ** -0.5)
        w13[j], s13[j] = a, b
        a, b = quantize_weight_blocks(torch.randn(h, i, device=dev, generator=gen) * i ** -0.5)
        w2[j], s2[j] = a, b
    return w13, w2, s13, s2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=256)
    args = ap.parse_args()

    from ws_wide import run_experts_fp8_wide

    from moerun.backends.triton.fp8_ws import run_experts_fp8_ws
    from moerun.bench.fp8 import fp8_weights
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.quant import QuantConfig, reference_fp8_moe

    dev = torch.device("cuda")
    res = {}
    for case in CASES:
        name, t = case.split(":")
        t = int(t)
        shape = parse_shapes(name)[0]
        for kind in ("bench", "gauss"):
            gen = torch.Generator(device=dev).manual_seed(1)
            if kind == "bench":
                w13, w2, s13, s2, d13, d2 = fp8_weights(shape, dev, gen, torch.bfloat16)
                del d13, d2
            else:
                w13, w2, s13, s2 = gauss_weights(shape, dev, gen)
            torch.cuda.empty_cache()
            x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
            w, ids = draw_routing(t, shape.num_experts, shape.top_k, gen, dev)
            rows = torch.randperm(t, generator=gen, device=dev)[:args.rows].sort().values
            ref = reference_fp8_moe(x[rows], w13, s13, w2, s2, w[rows], ids[rows],
                                    QuantConfig(), out_dtype=torch.float32).double()
            unq = unquantized(x[rows], w13, s13, w2, s2, w[rows], ids[rows]).double()
            forms = {
                "ws64": lambda: run_experts_fp8_ws(x, w13, w2, s13, s2, w, ids, gate_up_cols=64,
                                                   gate_up_stages=4, down_stages=4, group_m=8,
                                                   out_dtype=torch.bfloat16),
                "ws128": lambda: run_experts_fp8_ws(x, w13, w2, s13, s2, w, ids,
                                                    gate_up_cols=128, gate_up_stages=4,
                                                    down_stages=4, group_m=8,
                                                    out_dtype=torch.bfloat16),
                "wide": lambda: run_experts_fp8_wide(x, w13, w2, s13, s2, w, ids),
                "wideGU": lambda: run_experts_fp8_wide(x, w13, w2, s13, s2, w, ids,
                                                       down="narrow", down_stages=4),
                "wideDN": lambda: run_experts_fp8_wide(x, w13, w2, s13, s2, w, ids,
                                                       gate_up=128),
            }
            rec = {"ref_vs_unq": ((ref - unq).norm() / unq.norm()).item()}
            for f, fn in forms.items():
                got = fn()[rows].double()
                rec[f] = {"vs_ref": ((got - ref).norm() / ref.norm()).item(),
                          "vs_unq": ((got - unq).norm() / unq.norm()).item(),
                          "max_row_vs_unq": ((got - unq).norm(dim=1)
                                             / unq.norm(dim=1).clamp_min(1e-30)).max().item()}
            res[f"{case}:{kind}"] = rec
            print(case, kind, f"ref_vs_unq {rec['ref_vs_unq']:.4e}", "  ".join(
                f"{f} ref {rec[f]['vs_ref']:.3e} unq {rec[f]['vs_unq']:.3e} "
                f"maxrow {rec[f]['max_row_vs_unq']:.3e}" for f in forms), flush=True)
            del w13, w2, s13, s2, x
            torch.cuda.empty_cache()
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
