"""Prototype: the fp8 ws path's activation rows put into aligned order by a scatter in token
order instead of a gather in row order (issue 12).

``gather_rows_fp8`` runs one program per 16 aligned rows, each reading its rows' tokens:
a token's row is read K times, 1/K of the pass apart, so where the quantized rows exceed L2
(deepseek-v3 T=8192: 59 MB) they come from HBM K times. The H100 breakdown of 2026-12-05
(``../decode-stages-2026-12-05/breakdown-h100-run1.json``) has the two gathers at 344 µs of
a 7,510 µs deepseek-v3 T=8192 fp8 call, 170 of 2,791 at qwen3-235b, 79 of 888 at qwen3-30b.
Here one program per 16 tokens loads each 128-column chunk of its rows once and stores it to
its K pairs' aligned rows (the inverse map ``pair_rows``, which ``moe_align`` can write as it
places the pairs); scales go in the same launch; trailing programs zero the padding rows.

    TRITON_INTERPRET=1 python3 scatter.py --check     # CPU: equal to gather_rows_fp8
    PYTHONPATH=. python3 scatter.py --out ab.json     # GPU: timed against gather_rows_fp8
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ncu-2026-12-05"))
from ab import _timed  # event-timed calls, each synced (the ncu experiment's timer)

PAD_M = 16


@triton.jit
def _scatter_kernel(q_ptr, qs_ptr, out_ptr, outs_ptr, pair_rows_ptr, topk_ids_ptr,
                    sorted_ids_ptr, num_post_ptr, num_tokens, num_slots, num_pairs, hidden,
                    groups, n_tok, stride_qm, stride_qsm, stride_om, stride_osm,
                    TOP_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                    G_P2: tl.constexpr, PAD_M: tl.constexpr):
    pid = tl.program_id(0)
    offs_g = tl.arange(0, G_P2)
    g_ok = offs_g < groups
    if pid < n_tok:
        offs_t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
        t_ok = offs_t < num_tokens
        t64 = offs_t.to(tl.int64)
        sc = tl.load(qs_ptr + t64[:, None] * stride_qsm + offs_g[None, :],
                     mask=t_ok[:, None] & g_ok[None, :], other=0.0)
        for j in range(TOP_K):
            e = tl.load(topk_ids_ptr + t64 * TOP_K + j, mask=t_ok, other=-1)
            ok = t_ok & (e >= 0) & (e < num_slots)
            row = tl.load(pair_rows_ptr + t64 * TOP_K + j, mask=ok, other=0).to(tl.int64)
            tl.store(outs_ptr + row[:, None] * stride_osm + offs_g[None, :], sc,
                     mask=ok[:, None] & g_ok[None, :])
        for h0 in range(0, hidden, BLOCK_H):
            offs_h = h0 + tl.arange(0, BLOCK_H)
            h_ok = offs_h < hidden
            v = tl.load(q_ptr + t64[:, None] * stride_qm + offs_h[None, :],
                        mask=t_ok[:, None] & h_ok[None, :], other=0)
            for j in range(TOP_K):
                e = tl.load(topk_ids_ptr + t64 * TOP_K + j, mask=t_ok, other=-1)
                ok = t_ok & (e >= 0) & (e < num_slots)
                row = tl.load(pair_rows_ptr + t64 * TOP_K + j, mask=ok, other=0).to(tl.int64)
                tl.store(out_ptr + row[:, None] * stride_om + offs_h[None, :], v,
                         mask=ok[:, None] & h_ok[None, :])
    else:
        blk = pid - n_tok
        if blk * PAD_M < tl.load(num_post_ptr):
            offs_m = blk * PAD_M + tl.arange(0, PAD_M)
            pad = tl.load(sorted_ids_ptr + offs_m) >= num_pairs
            m64 = offs_m.to(tl.int64)
            tl.store(outs_ptr + m64[:, None] * stride_osm + offs_g[None, :],
                     tl.zeros([PAD_M, G_P2], tl.float32), mask=pad[:, None] & g_ok[None, :])
            for h0 in range(0, hidden, BLOCK_H):
                offs_h = h0 + tl.arange(0, BLOCK_H)
                tl.store(out_ptr + m64[:, None] * stride_om + offs_h[None, :],
                         tl.zeros([PAD_M, BLOCK_H], tl.uint8),
                         mask=pad[:, None] & (offs_h < hidden)[None, :])


def scatter_rows(q, qs, align, topk_ids, num_slots, pair_rows, block_t=16, block_h=512):
    m, h = q.shape
    k = topk_ids.shape[1]
    rows = align.max_blocks * align.block_m
    out = torch.empty(rows, h, dtype=torch.uint8, device=q.device)
    outs = torch.empty(rows, qs.shape[1], dtype=torch.float32, device=q.device)
    n_tok = triton.cdiv(m, block_t)
    grid = (n_tok + rows // PAD_M,)
    _scatter_kernel[grid](q.view(torch.uint8), qs, out, outs, pair_rows, topk_ids,
                          align.sorted_ids, align.num_post, m, num_slots, align.num_pairs, h,
                          qs.shape[1], n_tok, q.stride(0), qs.stride(0), out.stride(0),
                          outs.stride(0), k, block_t, block_h,
                          triton.next_power_of_2(qs.shape[1]), PAD_M, num_warps=4)
    return out, outs


def _setup(t, e, k, h, dev, seed):
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.fp8_quant import quantize_rows_fp8
    from moerun.bench.inputs import draw_routing

    gen = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(t, h, generator=gen, device=dev, dtype=torch.bfloat16)
    _, ids = draw_routing(t, e, k, gen, dev)
    q = quantize_rows_fp8(x)
    return q, ids, moe_align(ids, e, 128)


def check(dev):
    from moerun.backends.triton.fp8_quant import gather_rows_fp8

    for t, e, k, h in ((37, 8, 2, 256), (64, 16, 4, 384), (5, 4, 3, 128)):
        q, ids, align = _setup(t, e, k, h, dev, 0)
        ids[0, 0] = -1  # an excluded pair
        from moerun.backends.triton.align import moe_align
        align = moe_align(ids, e, 128)
        g = gather_rows_fp8(q, align, k)
        out, outs = scatter_rows(q.data, q.scale, align, ids, e, g.pair_rows)
        used = int(align.num_post.item())
        a = g.rows.data.view(torch.uint8)[:used]
        assert torch.equal(out[:used], a), (t, e, k, h)
        assert torch.equal(outs[:used], g.rows.scale[:used]), (t, e, k, h)
    print("scatter equals gather_rows_fp8 on the used rows (codes and scales)")


def _time(fn, n=30):
    """Median µs of ``n`` event-timed calls, each synced, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    return statistics.median(_timed(fn, n))


def ab(out_path):
    from moerun.backends.triton.fp8_quant import gather_rows_fp8
    from moerun.bench.shapes import parse_shapes

    dev = torch.device("cuda")
    rows = []
    cells = ["qwen3-30b-a3b:8192", "deepseek-v3:8192", "qwen3-235b-a22b:8192",
             "mixtral8x7b:8192", "deepseek-v3-ep8-local:8192", "qwen3-235b-ep8-local:8192",
             "mixtral8x7b:1024", "qwen3-235b-a22b:1024"]
    for cell in cells:
        name, t = cell.split(":")
        s = parse_shapes(name)[0]
        q, ids, align = _setup(int(t), s.num_experts, s.top_k, s.hidden, dev, 1)
        g = gather_rows_fp8(q, align, s.top_k)
        used = int(align.num_post.item())
        res = {"cell": cell}
        for bt, bh in ((16, 512), (32, 256), (8, 1024)):
            out, outs = scatter_rows(q.data, q.scale, align, ids, s.num_experts, g.pair_rows,
                                     bt, bh)
            same = torch.equal(out[:used], g.rows.data.view(torch.uint8)[:used]) and \
                torch.equal(outs[:used], g.rows.scale[:used])
            res[f"scatter_t{bt}_h{bh}_us"] = round(_time(functools.partial(
                scatter_rows, q.data, q.scale, align, ids, s.num_experts, g.pair_rows, bt, bh)),
                1)
            res[f"scatter_t{bt}_h{bh}_equal"] = same
        res["gather_us"] = round(_time(functools.partial(gather_rows_fp8, q, align, s.top_k)), 1)
        rows.append(res)
        print(json.dumps(res), flush=True)
        with open(out_path, "w") as f:
            json.dump(rows, f, indent=1)
        del q, ids, align, g
        torch.cuda.empty_cache()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.check:
        check(torch.device("cpu"))
    else:
        ab(a.out)
