"""CPU check: the fp8 decode pair's arithmetic, emulated in torch, against DESIGN 11a's
reference (``moerun.quant.reference_fp8_moe``) on the probe's inputs.

    PYTHONPATH=. python3 benchmarks/experiments/cuda-fp8-mc-2026-12-05/decode_emulation.py

It quantizes ``x`` per 128 columns as ``fp8_decode.cu``'s ``quantize_group`` does (fp32 scale
from ``max(amax, 1e-10)``, codes by division, saturated, round to nearest even), runs gate/up
with dequantized block-scaled weights, rounds the unweighted intermediate to bf16,
re-quantizes it the same way and runs the down, summing the weighted pairs. Two scale rules:

- ``quotient``: ``amax / 448`` exactly, as the pair did at its first run (H100, 2026-12-05,
  0.95-2.52e-2 from the reference on the device);
- ``product``: ``amax * fp32(1/448)``, what torch on CUDA computes for ``tensor / 448`` and
  what ``moerun.quant`` now writes on every device, and the pair since.

Until 2026-12-06 the reference divided exactly on the CPU (and by the product on CUDA), so
the quotient emulation matched it to 1e-7 here and hid the device gap. Now the quotient rule
reads a gap of the device's size and the product rule matches (a helper's diagnosis of
2026-12-06; README).
"""
import sys, torch
import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_probe as mp
torch.manual_seed(0)
dev = torch.device("cpu")
for name, T in (("qwen3-30b-a3b", 1), ("qwen3-30b-a3b", 3), ("mixtral8x7b", 2)):
    shape, x, w13, w2, s13, s2, w, ids = mp._setup(name, T, dev, "fp8")
    if T > 1: ids[0, -1] = -1
    ref = mp._reference(x, w13, w2, s13, s2, w, ids)
    H, I = shape.hidden, shape.intermediate
    def q(v, rule):  # the CUDA pair's quantize_group on fp32 v [n], per 128
        g = v.float().view(-1, 128)
        amax = g.abs().amax(1).clamp(min=1e-10)
        sc = amax / 448 if rule == "quotient" else amax * (1.0 / 448)
        c = (g / sc[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn).float()
        return (c * sc[:, None]).view(-1)
    def deqw(wc, ws):
        return wc.float() * ws.repeat_interleave(128, 0).repeat_interleave(128, 1)
    for rule in ("quotient", "product"):
        out = torch.zeros(T, H)
        for t in range(T):
            xq = q(x[t], rule)
            for j in range(ids.shape[1]):
                e = int(ids[t, j])
                if e < 0: continue
                W13 = deqw(w13[e], s13[e]); W2 = deqw(w2[e], s2[e])
                gu = W13 @ xq
                a = (torch.nn.functional.silu(gu[:I]) * gu[I:]).to(torch.bfloat16)
                out[t] += w[t, j] * (W2 @ q(a, rule))
        print(name, T, rule, "emulation vs reference", mp._rel(out, ref), flush=True)
