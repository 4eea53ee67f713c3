"""Probe: the fp8 MoE prefill through cuBLAS block-scaled GEMMs, one per expert (issue 12).

``torch._scaled_mm`` accepts DESIGN 11a's scales on the H200 (activation scales ``[M, K/128]``
M-major, weight scales ``[K/128, N/128]`` as the transpose of the stored ``[N/128, K/128]``)
and ran 1000-1200 TFLOP/s on dense shapes (``ws_gemm.py``, same day) against the Triton
block-scaled GEMM's 680-790. This times, per T = 8192 / 1024 cell, the whole MoE call done
that way -- one host sync for the per-expert counts, rows gathered in expert order, a gate/up
GEMM per expert, one silu*up + quantize pass, a down GEMM per expert, weighting and the sum
over K -- against the shipped fp8 call, eager, same run, and checks it against
``reference_fp8_moe``.

    PYTHONPATH=. python3 benchmarks/experiments/gluon-2026-12-02/cublas_moe.py
"""

from __future__ import annotations

import statistics

import torch

from moerun.backends.triton.experts import TritonExperts
from moerun.bench.fp8 import fp8_weights
from moerun.bench.inputs import draw_routing
from moerun.bench.shapes import parse_shapes
from moerun.bench.timing import time_samples
from moerun.quant import ExpertQuant, QuantConfig, quantize_rows, reference_fp8_moe

G = 128


def _mmajor(s):
    """``[c, K/128]`` scales as cuBLAS wants them: column-major (a copy)."""
    return s.t().contiguous().t()


def run_bf16_cublas(x, d13, d2, topk_w, topk_ids):
    """The same per-expert structure in bf16 (``torch.mm``), for issue 11's eager cells."""
    m, h = x.shape
    e, two_i, _ = d13.shape
    inter = two_i // 2
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=e).tolist()  # host sync
    tok = order // k
    xg = x.index_select(0, tok)
    hbuf = torch.empty(order.numel(), two_i, device=x.device, dtype=x.dtype)
    start = 0
    for ex, c in enumerate(counts):
        if c:
            torch.mm(xg[start:start + c], d13[ex].t(), out=hbuf[start:start + c])
        start += c
    act = torch.nn.functional.silu(hbuf[:, :inter]) * hbuf[:, inter:]
    y = torch.empty(order.numel(), h, device=x.device, dtype=x.dtype)
    start = 0
    for ex, c in enumerate(counts):
        if c:
            torch.mm(act[start:start + c], d2[ex].t(), out=y[start:start + c])
        start += c
    out = torch.zeros(m, h, device=x.device, dtype=torch.float32)
    out.index_add_(0, tok, y.float() * topk_w.reshape(-1)[order][:, None])
    return out.to(x.dtype)


def run_cublas(x, w13, w2, s13, s2, topk_w, topk_ids):
    m, h = x.shape
    e, two_i, _ = w13.shape
    inter = two_i // 2
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=e).tolist()  # host sync: per-expert rows
    tok = order // k
    q = quantize_rows(x, G)
    xg = q.data.view(torch.uint8).index_select(0, tok).view(torch.float8_e4m3fn)
    xs = q.scale.index_select(0, tok)  # [R, H/G]; cuBLAS takes each expert's M-major
    hbuf = torch.empty(order.numel(), two_i, device=x.device, dtype=torch.bfloat16)
    start = 0
    for ex, c in enumerate(counts):
        if c:
            hbuf[start:start + c] = torch._scaled_mm(
                xg[start:start + c], w13[ex].t(), _mmajor(xs[start:start + c]), s13[ex].t(),
                out_dtype=torch.bfloat16)
        start += c
    hf = hbuf.float()
    act = (torch.nn.functional.silu(hf[:, :inter]) * hf[:, inter:]).to(torch.bfloat16)
    qa = quantize_rows(act, G)
    y = torch.empty(order.numel(), h, device=x.device, dtype=torch.bfloat16)
    start = 0
    for ex, c in enumerate(counts):
        if c:
            y[start:start + c] = torch._scaled_mm(
                qa.data[start:start + c], w2[ex].t(), _mmajor(qa.scale[start:start + c]),
                s2[ex].t(), out_dtype=torch.bfloat16)
        start += c
    wsorted = topk_w.reshape(-1)[order]
    out = torch.zeros(m, h, device=x.device, dtype=torch.float32)
    out.index_add_(0, tok, y.float() * wsorted[:, None])
    return out.to(torch.bfloat16)


def main() -> None:
    dev = torch.device("cuda")
    qc = QuantConfig()
    be = TritonExperts()
    for shape in parse_shapes("mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3"):
        gen = torch.Generator(device=dev).manual_seed(0)
        w13, w2, s13, s2, d13, d2 = fp8_weights(shape, dev, gen, torch.bfloat16)
        eq = ExpertQuant(config=qc, w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
        for t in (1024, 8192):
            x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
            routings = [draw_routing(t, shape.num_experts, shape.top_k, gen, dev)
                        for _ in range(4)]

            def shipped(j):
                w, ids = routings[j % 4]
                return be.run_experts(be.quantize_rows(x, qc), w13, w2, w, ids, quant=eq)

            def cublas(j):
                w, ids = routings[j % 4]
                return run_cublas(x, w13, w2, s13, s2, w, ids)

            def bf16_shipped(j):
                w, ids = routings[j % 4]
                return be.run_experts(x, d13, d2, w, ids)

            def bf16_cublas(j):
                w, ids = routings[j % 4]
                return run_bf16_cublas(x, d13, d2, w, ids)

            try:
                _cell(shape, t, x, shipped, cublas, routings, w13, w2, s13, s2, qc, dev)
            except Exception as exc:  # noqa: BLE001 - the probe records the failure
                print(f"{shape.name} T={t}: {exc!r}"[:1500], flush=True)
            try:
                res = {}
                for name, fn in (("shipped", bf16_shipped), ("mm", bf16_cublas),
                                 ("shipped2", bf16_shipped), ("mm2", bf16_cublas)):
                    res[name] = statistics.median(time_samples(fn, dev, 10, warmup=2)) * 1e6
                a, b = bf16_shipped(0).float(), bf16_cublas(0).float()
                diff = ((a - b).norm() / b.norm()).item()
                print(f"{shape.name:16s} T={t:5d} bf16 shipped {res['shipped']:9.1f}/"
                      f"{res['shipped2']:9.1f} us  per-expert mm {res['mm']:9.1f}/"
                      f"{res['mm2']:9.1f} us  rel diff {diff:.2e}", flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"{shape.name} T={t} bf16: {exc!r}"[:600], flush=True)
        torch.cuda.empty_cache()


def _cell(shape, t, x, shipped, cublas, routings, w13, w2, s13, s2, qc, dev):
    res = {}
    for name, fn in (("shipped", shipped), ("cublas", cublas), ("shipped2", shipped),
                     ("cublas2", cublas)):
        res[name] = statistics.median(time_samples(fn, dev, 10, warmup=2)) * 1e6
    w0, ids0 = routings[0]
    rows = torch.arange(0, t, max(1, t // 64), device=dev)
    ref = reference_fp8_moe(x[rows], w13, s13, w2, s2, w0[rows], ids0[rows], qc,
                            out_dtype=torch.bfloat16).double()
    errs = {}
    for name, fn in (("shipped", shipped), ("cublas", cublas)):
        got = fn(0)[rows].double()
        errs[name] = ((got - ref).norm() / ref.norm()).item()
    print(f"{shape.name:16s} T={t:5d} shipped {res['shipped']:9.1f}/{res['shipped2']:9.1f}"
          f" us  cublas {res['cublas']:9.1f}/{res['cublas2']:9.1f} us  err shipped "
          f"{errs['shipped']:.2e} cublas {errs['cublas']:.2e}", flush=True)


if __name__ == "__main__":
    main()
