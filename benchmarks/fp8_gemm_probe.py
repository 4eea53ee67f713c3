"""Probe: how fast can a Triton block-scaled fp8 GEMM run on this GPU, and which form of the
scaled K step gets there (issue 12; a device script, not a benchmark claim).

    PYTHONPATH=. python3 benchmarks/fp8_gemm_probe.py --out $OUT/fp8gemm.json

A dense ``C[M, N] = A[M, K] B[N, K]^T`` with DESIGN 11a's scales (A: fp32 per row and
128-column group; B: fp32 per 128 x 128 block), e4m3 operands, bf16 out, K tile 128 = one
scale group. Forms of the K step:

* ``plain``  -- ``acc = dot(a, b, acc)``, no scales: the Triton fp8 ceiling for the tile;
* ``scaled`` -- ``acc += dot(a, b) * (sa x sb)`` (what ``moerun/backends/triton/fp8.py``
  does): the dot result and the accumulator both live, the wgmma waited on every step;
* ``carry``  -- the accumulator carried in the scale of the current step and handed to the
  tensor cores as the dot's addend: ``u = dot(a, b, u * (s_prev / s))``, ``acc = u * s``
  at the end. One accumulator tile; the tensor cores do the fp32 additions;
* ``lag``    -- ``scaled`` with the scaling of step k issued after the dot of step k + 1;
* ``rowscale`` -- ``scaled`` with the weight scale loaded once per tile and step as a scalar
  (valid for ``BN <= 128``: the tile's columns lie in one weight block), so the step's scale
  is one ``[BM]`` vector: ``acc += dot(a, b) * (sa * sb)[:, None]``.

Each form x tile x pointer/TMA loads is compiled, checked against an fp32 reference of the
dequantized operands on a 256 x 512 corner (relative error), and timed with device events:
the median of ``--samples`` calls. ``torch._scaled_mm`` (plain and fast accumulation, scale
1) on the same operands and the bf16 ``torch.matmul`` rate are measured in the same run.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import torch
import triton
import triton.language as tl

G = 128
PLAIN, SCALED, CARRY, LAG, ROWSCALE = 0, 1, 2, 3, 4
MODES = {"plain": PLAIN, "scaled": SCALED, "carry": CARRY, "lag": LAG, "rowscale": ROWSCALE}


@triton.jit
def _gemm(a_ptr, b_ptr, as_ptr, bs_ptr, c_ptr, M, N, K,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
          MODE: tl.constexpr, TMA: tl.constexpr):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BM)
    grid_n = tl.cdiv(N, BN)
    width = GROUP_M * grid_n
    gid = pid // width
    size = tl.minimum(grid_m - gid * GROUP_M, GROUP_M)
    pid_m = gid * GROUP_M + (pid % size)
    pid_n = (pid % width) // size
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    if TMA:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1],
                                           block_shape=[BM, BK])
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1],
                                           block_shape=[BN, BK])
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * K + offs_k[None, :]
    b_ptrs = b_ptr + offs_n[None, :].to(tl.int64) * K + offs_k[:, None]
    as_ptrs = as_ptr + offs_m * (K // BK)
    bs_ptrs = bs_ptr + (offs_n // BK) * (K // BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    d_prev = tl.zeros([BM, BN], dtype=tl.float32)
    sa_prev = tl.full([BM], 1.0, tl.float32)
    sb_prev = tl.full([BN], 1.0, tl.float32)
    for k in range(0, K // BK):
        if TMA:
            a = a_desc.load([pid_m * BM, k * BK])
            b = b_desc.load([pid_n * BN, k * BK]).T
        else:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        if MODE == 0:
            acc = tl.dot(a, b, acc)
        else:
            sa = tl.load(as_ptrs + k)
            if MODE != 4:
                sb = tl.load(bs_ptrs + k)
            if MODE == 1:
                acc += tl.dot(a, b) * (sa[:, None] * sb[None, :])
            elif MODE == 4:
                sbs = tl.load(bs_ptr + (pid_n * BN // BK) * (K // BK) + k)
                acc += tl.dot(a, b) * (sa * sbs)[:, None]
            elif MODE == 2:
                r = (sa_prev / sa)[:, None] * (sb_prev / sb)[None, :]
                acc = tl.dot(a, b, acc * r)
                sa_prev = sa
                sb_prev = sb
            else:
                d = tl.dot(a, b)
                acc += d_prev * (sa_prev[:, None] * sb_prev[None, :])
                d_prev = d
                sa_prev = sa
                sb_prev = sb
        a_ptrs += BK
        b_ptrs += BK
    if MODE == 2:
        acc = acc * (sa_prev[:, None] * sb_prev[None, :])
    if MODE == 3:
        acc += d_prev * (sa_prev[:, None] * sb_prev[None, :])
    c = c_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(c, acc.to(tl.bfloat16))


def _time(fn, samples: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) * 1e-3)
    return statistics.median(out)


def _codes(*size, gen):
    c = torch.randint(0, 254, size, generator=gen, device="cuda", dtype=torch.uint8)
    return torch.where(c >= 127, c + 1, c).view(torch.float8_e4m3fn)  # no NaN codes


VARIANTS = [  # (mode, BM, BN, warps, stages, tma)
    ("plain", 128, 256, 8, 3, True), ("plain", 128, 128, 8, 4, True),
    ("plain", 128, 256, 8, 3, False),
    ("scaled", 64, 128, 4, 4, False), ("scaled", 64, 128, 4, 4, True),
    ("scaled", 128, 128, 8, 3, False), ("scaled", 128, 128, 8, 4, True),
    ("scaled", 128, 128, 8, 3, True), ("scaled", 64, 256, 8, 3, True),
    ("carry", 128, 128, 8, 4, True), ("carry", 128, 128, 8, 4, False),
    ("carry", 128, 256, 8, 3, True), ("carry", 128, 256, 8, 3, False),
    ("carry", 128, 128, 4, 4, True), ("carry", 64, 256, 4, 3, True),
    ("carry", 256, 128, 8, 3, True),
    ("lag", 128, 128, 8, 3, True), ("lag", 64, 128, 4, 4, True),
    ("rowscale", 128, 128, 8, 4, True), ("rowscale", 128, 128, 8, 3, False),
    ("rowscale", 64, 128, 4, 4, False),
]
SHAPES = [(8192, 8192, 4096), (8192, 7168, 2048), (2048, 28672, 4096)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--samples", type=int, default=30)
    args = p.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                  device="cuda"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    rec = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                               time.gmtime()),
           "shapes": []}
    for m, n, k in SHAPES:
        a, b = _codes(m, k, gen=gen), _codes(n, k, gen=gen)
        sa = (torch.rand(m, k // G, generator=gen, device="cuda") + 0.5) * 1e-2
        sb = (torch.rand(n // G, k // G, generator=gen, device="cuda") + 0.5) * 1e-3
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        ra = (a[:256].float() * sa[:256].repeat_interleave(G, 1))
        rb = (b[:512].float() * sb[:4].repeat_interleave(G, 0).repeat_interleave(G, 1))
        ref = ra @ rb.t()
        one = torch.ones((), device="cuda")
        cell = {"M": m, "N": n, "K": k, "variants": []}
        for fast in (False, True):
            s = _time(functools.partial(torch._scaled_mm, a, b.t(), scale_a=one, scale_b=one,
                                        out_dtype=torch.bfloat16, use_fast_accum=fast),
                      args.samples)
            cell["scaled_mm_fast" if fast else "scaled_mm_plain"] = flops / s / 1e12
        x16, w16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16), \
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        cell["bf16_matmul"] = flops / _time(functools.partial(torch.matmul, x16, w16.t()),
                                            args.samples) / 1e12
        del x16, w16
        for mode, bm, bn, w, st, tma in VARIANTS:
            v = {"mode": mode, "BM": bm, "BN": bn, "warps": w, "stages": st, "tma": tma}
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
            call = functools.partial(_gemm[grid], a, b, sa, sb, c, m, n, k, bm, bn, G, 8,
                                     MODES[mode], tma, num_warps=w, num_stages=st)
            try:
                kern = call()
                torch.cuda.synchronize()
                if mode != "plain":
                    got = c[:256, :512].float()
                    v["rel_err"] = float((got - ref).norm() / ref.norm())
                v["tflops"] = flops / _time(call, args.samples) / 1e12
                v["n_regs"] = getattr(kern, "n_regs", None)
                v["n_spills"] = getattr(kern, "n_spills", None)
            except Exception as exc:  # noqa: BLE001 - a probe records what failed
                v["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            cell["variants"].append(v)
            print(m, n, k, v, flush=True)
        rec["shapes"].append(cell)
        print(m, n, k, {x: cell[x] for x in ("scaled_mm_plain", "scaled_mm_fast",
                                             "bf16_matmul")}, flush=True)
    with open(args.out, "w") as f:
        json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
