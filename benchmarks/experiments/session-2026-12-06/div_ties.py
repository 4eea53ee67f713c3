"""Does Triton's fp32 ``/`` (``div.full.f32``, at most 2 ulp) flip e4m3 codes against torch's
IEEE quotient? (2026-12-06; device probe, any CUDA card.)

The package's activation quantization (``moerun/backends/triton/fp8_tiles.quantize_tile``)
computes ``x / scale`` with Triton's ``/``; its torch twin ``moerun.quant.quantize_rows``
divides a tensor by a tensor on CUDA, which is ``div.rn.f32``. Where the exact quotient sits
on an e4m3 rounding tie, one ulp decides the code. Such ties are common in structured bf16
data: with ``amax = 1.75 * 2^e`` the scale is ``amax * fp32(1/448)`` and every element with a
5-bit mantissa lands within an ulp of a tie.

Three inputs, ``[rows, 7168]`` bf16: ``ties`` (each group's first element ``+-1.75 * 2^e``,
the others random 5-bit mantissas at exponents <= e), ``mixed`` (half ties, half randn) and
``randn``. For each: codes of torch (``quantize_rows``, CUDA), of the package's kernel
(``quantize_rows_fp8``) and of a probe kernel with the same math, once with ``/`` and once
with ``tl.math.div_rn``; mismatching codes are counted. Then the two probe kernels are timed
at 8192 x 7168 (CUDA events, median of 50).

    PYTHONPATH=. python3 benchmarks/experiments/session-2026-12-06/div_ties.py
"""

from __future__ import annotations

import json

import torch
import triton
import triton.language as tl

from moerun.backends.triton.fp8 import quantize_rows_fp8
from moerun.quant import AMAX_EPS, FP8_DTYPE, FP8_MAX, quantize_rows


@triton.jit
def _probe_kernel(x_ptr, q_ptr, s_ptr, H: tl.constexpr, G: tl.constexpr, EPS: tl.constexpr,
                  QMAX: tl.constexpr, RN: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    grp = tl.program_id(1)
    offs = grp * G + tl.arange(0, G)
    xf = tl.load(x_ptr + row * H + offs).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(xf), axis=0), EPS) * (1.0 / QMAX)
    if RN:
        q = tl.math.div_rn(xf, tl.zeros_like(xf) + scale)
    else:
        q = xf / scale
    q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
    tl.store(q_ptr + row * H + offs, q.to(q_ptr.dtype.element_ty))
    tl.store(s_ptr + row * (H // G) + grp, scale)


def probe(x: torch.Tensor, rn: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rows, h = x.shape
    q = torch.empty(rows, h, dtype=FP8_DTYPE, device=x.device)
    s = torch.empty(rows, h // 128, dtype=torch.float32, device=x.device)
    _probe_kernel[(rows, h // 128)](x, q, s, H=h, G=128, EPS=AMAX_EPS, QMAX=FP8_MAX, RN=rn)
    return q, s


def ties(rows: int, h: int, gen: torch.Generator) -> torch.Tensor:
    groups = rows * h // 128
    e = torch.randint(-6, 4, (groups, 1), generator=gen).float()
    mant = 1.0 + torch.randint(0, 16, (groups, 128), generator=gen).float() / 16  # 5 bits
    sub = torch.randint(0, 6, (groups, 128), generator=gen).float()
    sign = torch.randint(0, 2, (groups, 128), generator=gen).float() * 2 - 1
    v = sign * mant * torch.exp2(e - sub)
    v[:, 0] = sign[:, 0] * 1.75 * torch.exp2(e[:, 0])
    return v.reshape(rows, h).bfloat16()


def count(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.view(torch.uint8) != b.view(torch.uint8)).sum())


def main() -> None:
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    rows, h = 512, 7168
    t = ties(rows, h, gen)
    r = torch.randn(rows, h, generator=gen).bfloat16()
    mixed = torch.where(torch.rand(rows, h // 128, 1, generator=gen) < 0.5,
                        t.view(rows, -1, 128), r.view(rows, -1, 128)).reshape(rows, h)
    out = {"device": torch.cuda.get_device_name(), "elements": rows * h}
    for name, x in (("ties", t), ("mixed", mixed), ("randn", r)):
        xd = x.to(dev)
        ref = quantize_rows(xd)
        cpu = quantize_rows(x)
        pkg = quantize_rows_fp8(xd)
        q_div, s_div = probe(xd, rn=False)
        q_rn, s_rn = probe(xd, rn=True)
        out[name] = {
            "scales_equal": bool(torch.equal(pkg.scale, ref.scale) and torch.equal(s_div, ref.scale)
                                 and torch.equal(s_rn, ref.scale)),
            "torch_cuda_vs_cpu": count(ref.data.cpu(), cpu.data),
            "package_kernel": count(pkg.data, ref.data),
            "probe_div": count(q_div, ref.data),
            "probe_div_rn": count(q_rn, ref.data),
        }
        print(name, json.dumps(out[name]), flush=True)
    xd = torch.randn(8192, h, device=dev).bfloat16()
    for rn in (False, True):
        times = []
        for _ in range(50):
            xd.normal_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            probe(xd, rn)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1e3)
        out[f"us_8192x7168_{'div_rn' if rn else 'div'}"] = sorted(times)[len(times) // 2]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
