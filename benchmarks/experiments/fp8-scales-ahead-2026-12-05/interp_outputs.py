"""The fp8 Triton paths (``run_experts_fp8``) under the Triton interpreter on fixed cases,
saved for a bit-for-bit comparison of two source trees (README here: 48 outputs, 12 cases x
float / ``QuantizedRows`` input x fp32 / fp16 output). Run once per tree, then compare:

    TRITON_INTERPRET=1 PYTHONPATH=TREE python3 interp_outputs.py OUT.pt
    python3 interp_outputs.py --compare A.pt B.pt
"""

from __future__ import annotations

import os
import sys

import torch

#: name, M, K, S, H, I, (block_m, gate/up n, down n, combine, kernel, split_k, paired, group_m)
CASES = [
    ("g-bm16-atomic", 9, 2, 4, 256, 256, (16, 64, 64, "atomic", None, 1, False, 1)),
    ("g-splitk2", 7, 3, 5, 128, 256, (16, 32, 128, "atomic", None, 2, False, 1)),
    ("g-bm32-reduce-dn256", 21, 2, 3, 256, 128, (32, 128, 256, "reduce", None, 1, False, 2)),
    ("g-gu256", 11, 2, 3, 256, 256, (16, 256, 64, "reduce", None, 1, False, 1)),
    ("prefill-fp8act", 40, 2, 3, 256, 256, (64, 128, 64, "reduce", None, 1, False, 2)),
    ("prefill-fp8act-dn256", 40, 2, 3, 512, 256, (64, 128, 256, "reduce", None, 1, False, 1)),
    ("prefill-bf16act-atomic", 40, 2, 3, 256, 384, (64, 64, 128, "atomic", None, 3, False, 1)),
    ("prefill-paired", 40, 2, 3, 256, 256, (64, 128, 64, "reduce", None, 1, True, 2)),
    ("decode-paired", 9, 2, 4, 256, 256, (16, 32, 64, "atomic", None, 1, True, 1)),
    ("direct-reduce", 5, 3, 4, 256, 256, (16, 64, 32, "reduce", "direct", 1, False, 1)),
    ("direct-atomic", 4, 2, 3, 128, 384, (16, 64, 64, "atomic", "direct", 1, False, 1)),
    ("direct-reduce-k1", 3, 1, 2, 256, 384, (16, 32, 128, "reduce", "direct", 1, False, 1)),
]


def _problem(m, k, s, h, i, seed):
    from moerun.quant import quantize_weight_blocks

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g)
    x[0] *= 30.0  # one row with a much larger range
    w13, s13 = quantize_weight_blocks(torch.randn(s, 2 * i, h, generator=g) / h ** 0.5)
    w2, s2 = quantize_weight_blocks(torch.randn(s, h, i, generator=g) / i ** 0.5)
    ids = torch.stack([torch.randperm(s, generator=g)[:k] for _ in range(m)]).int()
    if m > 2:
        ids[1, -1] = -1  # an excluded pair
    if m > 3:
        ids[2] = -1  # a row with none
    return x, w13, s13, w2, s2, torch.rand(m, k, generator=g), ids


def save(path: str) -> None:
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig
    from moerun.backends.triton.fp8 import run_experts_fp8
    from moerun.quant import quantize_rows

    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"
    out = {}
    for n, (name, m, k, s, h, i, (bm, gn, dn, comb, kernel, split, paired, gm)) in \
            enumerate(CASES):
        kw = {} if kernel is None else {"kernel": kernel}
        cfg = ExpertsConfig(
            block_m=bm, combine=comb, **kw,
            gate_up=GateUpConfig(block_n=gn, block_k=128, group_m=gm, paired=paired),
            down=DownConfig(block_n=dn, block_k=128, split_k=split, group_m=gm))
        x, w13, s13, w2, s2, w, ids = _problem(m, k, s, h, i, 100 + n)
        for form, xin in (("float", x), ("quant", quantize_rows(x))):
            for dtype in (torch.float32, torch.float16):
                y = run_experts_fp8(xin, w13, w2, s13, s2, w, ids, cfg, dtype)
                out[f"{name}/{form}/{dtype}"] = y.clone()
        print(name, flush=True)
    torch.save(out, path)


def compare(a_path: str, b_path: str) -> int:
    a, b = torch.load(a_path), torch.load(b_path)
    bad = [key for key in a if key not in b or not torch.equal(a[key], b[key])]
    print(f"{len(a)} outputs; not bit-equal: {bad}")
    return 1 if bad or a.keys() != b.keys() else 0


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    save(sys.argv[1])
