"""One profiled call for Nsight Compute (device probe, issue 11/12): what bounds the prefill
GEMMs -- tensor pipe, L2 -> SM traffic or DRAM?

Warms the target up (compiles, autotunes nothing), then brackets ONE call with
``cudaProfilerStart/Stop`` so ``ncu --profile-from-start off`` sees only its kernels.

    PYTHONPATH=. ncu --profile-from-start off ... python3 target.py --target fp8:deepseek-v3:8192

Targets: ``{bf16,fp8}:<bench shape>:<T>`` (the shipped TritonExperts call the bench times,
uniform routing), ``cublas_bf16`` (8192^3 ``torch.matmul``), ``cublas_fp8_block``
(8192x8192x4096 ``torch._scaled_mm`` with 1x128 / 128x128 scales),
``cublas_fp8_fast`` (8192^3 tensorwise, fast accumulation).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import torch


def _codes(*size, gen):
    c = torch.randint(0, 254, size, generator=gen, device="cuda", dtype=torch.uint8)
    return torch.where(c >= 127, c + 1, c).view(torch.float8_e4m3fn)


def build(target: str):
    gen = torch.Generator(device="cuda").manual_seed(0)
    if target == "cublas_bf16":
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, generator=gen)
        return lambda: torch.matmul(a, b.t())
    if target.startswith("cublas_fp8"):
        m, n, k = (8192, 8192, 4096) if target == "cublas_fp8_block" else (8192, 8192, 8192)
        a8, b8 = _codes(m, k, gen=gen), _codes(n, k, gen=gen)
        if target == "cublas_fp8_block":
            sa = (torch.rand(m, k // 128, device="cuda", generator=gen) * 0.01 + 1e-3)
            sa = sa.t().contiguous().t()  # M-major, the layout torch 2.11 takes on sm90
            sb = (torch.rand(n // 128, k // 128, device="cuda", generator=gen) * 0.01 + 1e-3)
            sb = sb.t().contiguous()
            return lambda: torch._scaled_mm(a8, b8.t(), sa, sb, out_dtype=torch.bfloat16)
        one = torch.ones((), device="cuda")
        return lambda: torch._scaled_mm(a8, b8.t(), one, one, out_dtype=torch.bfloat16,
                                        use_fast_accum=True)
    dtype, name, t = target.split(":")
    t = int(t)
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes

    shape = parse_shapes(name)[0]
    be = TritonExperts()
    x = torch.randn(t, shape.hidden, generator=gen, device="cuda", dtype=torch.bfloat16)
    w, ids = draw_routing(t, shape.num_experts, shape.top_k, gen, "cuda")
    if dtype == "bf16":
        e, h, i = shape.num_experts, shape.hidden, shape.intermediate
        w13 = torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16,
                          generator=gen) * h ** -0.5
        w2 = torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16, generator=gen) * i ** -0.5
        return lambda: be.run_experts(x, w13, w2, w, ids)
    from moerun.bench.fp8 import fp8_weights, layer_fp8_call
    from moerun.quant import ExpertQuant, QuantConfig

    w13, w2, s13, s2, d13, d2 = fp8_weights(shape, torch.device("cuda"), gen, torch.bfloat16)
    del d13, d2
    eq = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
    return lambda: layer_fp8_call(be, shape, x, w13, w2, w, ids, eq)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--time", action="store_true", help="also print the call's event time")
    ap.add_argument("--variant", default="base", help="variants.py: base, eg, eg2, order, ...")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if args.variant != "base":  # (variants.py needs its patch applied; variants2.py does not)
        mod = "variants2" if args.variant in ("early", "dflat", "early+dflat") else "variants"
        importlib.import_module(mod).install(args.variant)
    fn = build(args.target)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    if args.time:
        from ab import _timed  # the A/B's timer: an event pair per call, synced per call

        ts = sorted(_timed(fn, 10))
        print(f"{args.target}: median {ts[5]:.1f} us per call (eager, events)", flush=True)
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
