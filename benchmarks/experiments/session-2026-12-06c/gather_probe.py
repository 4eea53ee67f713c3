"""The row gather of the fp8 ws path (and of the bf16 ``a_tma`` tiles) in other shapes:
does a program that holds more of a row per load, or one launch for codes and scales, close
the gap to a plain copy of the same bytes? Device script (any sm90 card); ``--small`` runs
a CPU check of every variant against the shipped gather under ``TRITON_INTERPRET=1``.

    PYTHONPATH=. python3 benchmarks/experiments/session-2026-12-06c/gather_probe.py --out g.json

Each cell: uniform routing (``moerun.bench.inputs.draw_routing``, seed 0), ``moe_align`` at
128 rows per block, random e4m3 codes and fp32 scales (fp8) or random bf16 rows. Variants
are timed interleaved over ``--rounds`` rounds, each a CUDA-event median of ``--samples``
samples of ``--reps`` back-to-back launches; every variant's output is compared with the
shipped one on the rows in use (bit-equal or the script exits 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import triton
import triton.language as tl

from moerun._triton.gdc import pdl_prologue
from moerun._triton.launch import FastLauncher, cdiv
from moerun.backends.triton import gather as G
from moerun.backends.triton.align import moe_align
from moerun.bench.inputs import draw_routing
from moerun.bench.shapes import parse_shapes


@triton.jit(do_not_specialize=["num_pairs", "max_rows"])
def _gather_both_kernel(x_ptr, xs_ptr, s_ptr, ss_ptr, sorted_ids_ptr, num_post_ptr, rows_ptr,
                        num_pairs, hidden, groups, max_rows, stride_xm, stride_om, stride_sm,
                        stride_ssm, TOP_K: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_H: tl.constexpr, GP: tl.constexpr, PDL: tl.constexpr):
    """Codes and scales of BLOCK_M aligned rows in one program (and the inverse map)."""
    pdl_prologue(PDL)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    if tl.program_id(0) * BLOCK_M >= tl.load(num_post_ptr):
        return
    pair = tl.load(sorted_ids_ptr + offs_m, mask=offs_m < max_rows, other=num_pairs)
    row_ok = pair < num_pairs
    tl.store(rows_ptr + pair, offs_m, mask=row_ok)
    tok = (pair // TOP_K).to(tl.int64)
    out_ok = offs_m < max_rows
    o64 = offs_m.to(tl.int64)
    offs_g = tl.arange(0, GP)
    g_ok = offs_g < groups
    sv = tl.load(s_ptr + tok[:, None] * stride_sm + offs_g[None, :],
                 mask=row_ok[:, None] & g_ok[None, :], other=0.0)
    tl.store(ss_ptr + o64[:, None] * stride_ssm + offs_g[None, :], sv,
             mask=out_ok[:, None] & g_ok[None, :])
    for h0 in range(0, hidden, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        h_ok = offs_h < hidden
        v = tl.load(x_ptr + tok[:, None] * stride_xm + offs_h[None, :],
                    mask=row_ok[:, None] & h_ok[None, :], other=0)
        tl.store(xs_ptr + o64[:, None] * stride_om + offs_h[None, :], v,
                 mask=out_ok[:, None] & h_ok[None, :])


_BOTH = FastLauncher(_gather_both_kernel)


def rows_variant(bm: int, bh: int, warps: int):
    """The shipped kernel at other constants (codes or bf16 rows only, map written)."""
    def run(x, align, k, rows_out):
        h = x.shape[1]
        rows = align.max_blocks * align.block_m
        out = torch.empty(rows, h, dtype=x.dtype, device=x.device)
        G._LAUNCH_GATHER((cdiv(rows, bm),), x, out, align.sorted_ids, align.num_post,
                         rows_out, align.num_pairs, h, rows, x.stride(0), out.stride(0),
                         k, bm, min(bh, triton.next_power_of_2(h)), True, num_warps=warps)
        return out
    return run


def both_variant(bm: int, bh: int, warps: int):
    def run(q, s, align, k, rows_out):
        h = q.shape[1]
        groups = s.shape[1]
        rows = align.max_blocks * align.block_m
        out = torch.empty(rows, h, dtype=q.dtype, device=q.device)
        sout = torch.empty(rows, groups, dtype=s.dtype, device=s.device)
        _BOTH((cdiv(rows, bm),), q, out, s, sout, align.sorted_ids, align.num_post, rows_out,
              align.num_pairs, h, groups, rows, q.stride(0), out.stride(0), s.stride(0),
              sout.stride(0), k, bm, min(bh, triton.next_power_of_2(h)),
              triton.next_power_of_2(groups), num_warps=warps)
        return out, sout
    return run


ROWS = {"r16x512w4": (16, 512, 4), "r16x1024w4": (16, 1024, 4), "r16x2048w4": (16, 2048, 4),
        "r8x2048w4": (8, 2048, 4), "r32x1024w8": (32, 1024, 8), "r32x2048w8": (32, 2048, 8),
        "r4x2048w2": (4, 2048, 2), "r64x512w8": (64, 512, 8)}
BOTH = {"both16x1024w4": (16, 1024, 4), "both16x2048w4": (16, 2048, 4),
        "both32x2048w8": (32, 2048, 8), "both8x2048w4": (8, 2048, 4)}


def time_fn(fn, reps: int, samples: int) -> float:
    """CUDA-event median over ``samples`` samples of ``reps`` back-to-back calls, µs a call."""
    out = []
    for _ in range(samples):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(out)


def cell_inputs(name: str, t: int, dtype: str, dev, gen):
    shape = parse_shapes(name)[0]
    _, ids = draw_routing(t, shape.num_experts, shape.top_k, gen, dev)
    align = moe_align(ids, shape.num_experts, 128)
    h = shape.hidden
    if dtype == "fp8":
        x = torch.randint(0, 256, (t, h), generator=gen, device=dev, dtype=torch.uint8)
        x = torch.where(x == 0x7F, 0, x).where(x != 0xFF, 0)  # no NaN codes
        s = torch.rand(t, h // 128, generator=gen, device=dev) + 0.01
    else:
        x = torch.randn(t, h, generator=gen, device=dev).to(torch.bfloat16)
        s = None
    return shape, align, x, s


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="fp8:qwen3-30b-a3b:8192,fp8:qwen3-235b-a22b:8192,"
                    "fp8:deepseek-v3:8192,fp8:mixtral8x7b:8192,fp8:mixtral8x7b:1024,"
                    "fp8:qwen3-30b-a3b:1024,bf16:mixtral8x7b:8192,bf16:mixtral8x7b:1024")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=9)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--small", action="store_true", help="CPU check at small T")
    args = ap.parse_args()
    dev = torch.device("cpu" if args.small else "cuda")
    rows_out = []
    bad = 0
    for cell in args.cells.split(","):
        dtype, name, t = cell.split(":")
        t = 48 if args.small else int(t)
        gen = torch.Generator(device=dev).manual_seed(0)
        shape, align, x, s = cell_inputs(name, t, dtype, dev, gen)
        k = shape.top_k
        used = int(align.num_post[0])
        m = torch.empty(align.num_pairs, dtype=torch.int32, device=dev)
        ref = G.gather_rows(x, align, k, pair_rows=m)[:used]
        ref_s = G.gather_rows(s, align, k)[:used] if s is not None else None
        fns = {}
        if s is not None:
            fns["base_codes+scales"] = lambda: (G.gather_rows(x, align, k, pair_rows=m),
                                                G.gather_rows(s, align, k))
            fns["base_scales_only"] = lambda: G.gather_rows(s, align, k)
        fns["base_rows"] = lambda: G.gather_rows(x, align, k, pair_rows=m)
        for n, c in ROWS.items():
            v = rows_variant(*c)
            out = v(x, align, k, m)
            if not torch.equal(out[:used], ref):
                print(f"{cell} {n}: NOT EQUAL", flush=True)
                bad += 1
            fns[n] = (lambda v=v: v(x, align, k, m))
        if s is not None:
            for n, c in BOTH.items():
                v = both_variant(*c)
                o, so = v(x, s, align, k, m)
                if not (torch.equal(o[:used], ref) and torch.equal(so[:used], ref_s)):
                    print(f"{cell} {n}: NOT EQUAL", flush=True)
                    bad += 1
                fns[n] = (lambda v=v: v(x, s, align, k, m))
        src = torch.empty(used, x.shape[1], dtype=x.dtype, device=dev)
        dst = torch.empty_like(src)
        fns["copy_same_bytes"] = lambda: dst.copy_(src)
        if args.small:
            print(f"{cell}: {len(fns)} variants checked", flush=True)
            continue
        times = {n: [] for n in fns}
        for _ in range(args.rounds):
            for n, f in fns.items():
                f()
                torch.cuda.synchronize()
                times[n].append(time_fn(f, args.reps, args.samples))
        med = {n: round(statistics.median(v), 2) for n, v in times.items()}
        mb = used * x.shape[1] * x.element_size() / 1e6
        rec = {"cell": cell, "rows_used": used, "MB_written": round(mb, 1), "us": med,
               "rounds": times}
        rows_out.append(rec)
        print(f"{cell}: used rows {used}, {mb:.1f} MB | "
              + " | ".join(f"{n} {v}" for n, v in med.items()), flush=True)
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "cells": rows_out}, f, indent=1)
        fns.clear()
        torch.cuda.empty_cache()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
