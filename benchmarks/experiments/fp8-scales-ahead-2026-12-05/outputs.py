"""The fp8 call a layer makes (``moerun.bench.fp8.layer_fp8_call``, shipped tuned configs) on
fixed inputs at the cells the scale change touches, saved for a bit-for-bit comparison of two
source trees (this folder's README): run once per tree (``PYTHONPATH``), then ``--compare``.

    PYTHONPATH=TREE python3 outputs.py --save out.pt
    python3 outputs.py --compare old.pt new.pt
"""

from __future__ import annotations

import argparse
import sys

import torch

CELLS = (("mixtral8x7b", (1, 16, 128)), ("qwen3-30b-a3b", (1, 16, 128)),
         ("qwen3-235b-a22b", (1, 16, 128)), ("deepseek-v3", (1, 16, 128, 1024)),
         ("qwen3-235b-ep8-local", (256, 2048)), ("deepseek-v3-ep8-local", (256,)))


def save(path: str) -> None:
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.fp8 import fp8_weights, layer_fp8_call
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.quant import ExpertQuant, QuantConfig

    dev = torch.device("cuda")
    backend, out = TritonExperts(), {}
    for name, tokens in CELLS:
        shape = parse_shapes(name)[0]
        gen = torch.Generator(device=dev).manual_seed(11)
        w13, w2, s13, s2, _, _ = fp8_weights(shape, dev, gen, torch.bfloat16)
        eq = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2,
                         out_dtype=torch.bfloat16)
        for t in tokens:
            x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
            w, ids = draw_routing(t, shape.num_experts, shape.top_k, gen, dev)
            y = layer_fp8_call(backend, shape, x, w13, w2, w, ids, eq)
            out[f"{name}/T={t}"] = y.float().cpu()
            print(name, t, backend.fp8_config_source(shape.num_experts, shape.intermediate,
                                                     shape.hidden, t, shape.top_k), flush=True)
        del w13, w2, s13, s2
        torch.cuda.empty_cache()
    torch.save(out, path)


def compare(a_path: str, b_path: str) -> int:
    a, b = torch.load(a_path), torch.load(b_path)
    bad = 0
    for key in a:
        same = torch.equal(a[key], b[key])
        nonzero = bool(a[key].abs().sum() > 0) and bool(a[key].isfinite().all())
        bad += not (same and nonzero)
        diff = (a[key] - b[key]).abs().max().item()
        print(f"{key:32s} bit-equal {same}  finite and nonzero {nonzero}  max |diff| {diff:.3g}")
    print(f"{len(a)} outputs, {bad} not bit-equal (or zero)")
    return 1 if bad or a.keys() != b.keys() else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--save")
    ap.add_argument("--compare", nargs=2)
    args = ap.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    save(args.save)
