"""The warp-specialized Gluon GEMM of ``ws_gemm.py`` (mode 4) as the two grouped fp8 MoE
GEMMs: a prototype timed as a whole fp8 MoE call against the shipped one (device probe).

Pipeline (``R`` aligned rows of ``moe_align`` at 128 rows per block, ``P`` pairs):

1. ``moe_align`` (shipped kernel), ``quantize_rows_fp8`` of ``x`` (shipped kernel);
2. the quantized rows and their scales gathered into aligned order by torch (``index_select``;
   padding rows read token 0, their results are never used);
3. gate/up: per 128-row block of one expert and 64 intermediate columns, each stage holds A
   (two 64-row halves) and the 64 gate and 64 up weight rows; each consumer warp group issues
   two N = 64 wgmmas (gate, up), waits, promotes both with their own block scales; epilogue
   ``silu(g) * u`` in fp32, rounded to bf16, TMA-stored to ``act [R, I]``;
4. ``quantize_rows_fp8(act)`` (shipped kernel);
5. down: per block and 128 hidden columns, the ``ws_gemm`` mode-4 loop; epilogue times the
   routing weight, stored to the pair's row of ``y [P, H]`` (rows of padding skipped);
6. ``moe_sum`` (shipped kernel).

    PYTHONPATH=. python3 benchmarks/experiments/gluon-2026-12-02/grouped_fp8.py
    python3 benchmarks/experiments/gluon-2026-12-02/grouped_fp8.py --compile-only   # CPU
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

G = 128
BM = 128
HALF = 64


@gluon.jit
def _tile(t, grid_m, grid_n, GROUP_M: gl.constexpr):
    width = GROUP_M * grid_n
    gid = t // width
    size = gl.minimum(grid_m - gid * GROUP_M, GROUP_M)
    return gid * GROUP_M + (t % size), (t % width) // size


@gluon.jit
def _loader(a_desc, b_desc, a_bufs, b_bufs, ready, empty, expert_ids_ptr, num_post_ptr, grid_n,
            k_tiles, n_rows_per_expert, up_offset, BN: gl.constexpr, STAGES: gl.constexpr,
            GROUP_M: gl.constexpr, GATE_UP: gl.constexpr):
    """TMA producer: per K step the two A halves and the weight rows (gate/up: 64 gate rows and
    the 64 up rows ``up_offset`` further; down: BN rows)."""
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    NBYTES: gl.constexpr = 2 * a_desc.block_type.nbytes + (2 if GATE_UP else 1) * \
        b_desc.block_type.nbytes
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, grid_m, grid_n, GROUP_M)
        expert = gl.load(expert_ids_ptr + pid_m)
        off_m = pid_m * BMC
        off_w = expert * n_rows_per_expert + pid_n * BN
        for i in range(k_tiles):
            s = c % STAGES
            mbarrier.wait(empty.index(s), ((c // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, NBYTES)
            tma.async_copy_global_to_shared(a_desc, [off_m, i * 128], bar, a_bufs.index(2 * s))
            tma.async_copy_global_to_shared(a_desc, [off_m + HALFC, i * 128], bar,
                                            a_bufs.index(2 * s + 1))
            if GATE_UP:
                tma.async_copy_global_to_shared(b_desc, [off_w, i * 128], bar,
                                                b_bufs.index(2 * s))
                tma.async_copy_global_to_shared(b_desc, [off_w + up_offset, i * 128], bar,
                                                b_bufs.index(2 * s + 1))
            else:
                tma.async_copy_global_to_shared(b_desc, [off_w, i * 128], bar, b_bufs.index(s))
            c += 1


@gluon.jit
def _gate_up_consumer(a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr,
                      expert_ids_ptr, num_post_ptr, grid_n, k_tiles, stride_as, stride_wse,
                      stride_wsn, inter_blocks, W: gl.constexpr, BN: gl.constexpr,
                      STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BN, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    dg = gl.zeros([HALFC, BN], gl.float32, mma)  # carried: the ignored C operands
    du = gl.zeros([HALFC, BN], gl.float32, mma)
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, grid_m, grid_n, GROUP_M)
        expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
        off_m = pid_m * BMC + W * HALFC
        off_n = pid_n * BN
        sa_p = as_ptr + (off_m + gl.arange(0, HALFC, rows_l)).to(gl.int64) * stride_as
        gs_p = ws_ptr + expert * stride_wse + (off_n // 128) * stride_wsn
        us_p = gs_p + inter_blocks * stride_wsn
        acc_g = gl.zeros([HALFC, BN], gl.float32, mma)
        acc_u = gl.zeros([HALFC, BN], gl.float32, mma)
        sa0 = gl.load(sa_p)
        sg0 = gl.load(gs_p)
        su0 = gl.load(us_p)
        for i in range(k_tiles):
            s = c % STAGES
            nxt = gl.minimum(i + 1, k_tiles - 1)
            sa1 = gl.load(sa_p + nxt)
            sg1 = gl.load(gs_p + nxt)
            su1 = gl.load(us_p + nxt)
            mbarrier.wait(ready.index(s), (c // STAGES) & 1)
            a = a_bufs.index(2 * s + W)
            bg = b_bufs.index(2 * s).permute((1, 0))
            bu = b_bufs.index(2 * s + 1).permute((1, 0))
            dg = warpgroup_mma(a, bg, dg, use_acc=False, is_async=True)
            du = warpgroup_mma(a, bu, du, use_acc=False, is_async=True)
            dg, du = warpgroup_mma_wait(num_outstanding=0, deps=(dg, du))
            mbarrier.arrive(empty.index(s), count=1)
            acc_g = acc_g + dg * gl.expand_dims(sa0 * sg0, 1)
            acc_u = acc_u + du * gl.expand_dims(sa0 * su0, 1)
            sa0 = sa1
            sg0 = sg1
            su0 = su1
            c += 1
        act = acc_g / (1.0 + gl.exp(-acc_g)) * acc_u
        tma.store_wait(pendings=0)
        cs = c_bufs.index(W)
        cs.store(act.to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [off_m, off_n], cs)
    tma.store_wait(pendings=0)


@gluon.jit
def _down_consumer(a_bufs, b_bufs, ready, empty, y_ptr, topk_w_ptr, sorted_ids_ptr, as_ptr,
                   ws_ptr, expert_ids_ptr, num_post_ptr, grid_n, k_tiles, stride_as, stride_wse,
                   stride_wsn, stride_y, num_pairs, W: gl.constexpr, BN: gl.constexpr,
                   STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BN, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    cols_l: gl.constexpr = gl.SliceLayout(0, mma)
    d = gl.zeros([HALFC, BN], gl.float32, mma)
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, grid_m, grid_n, GROUP_M)
        expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
        off_m = pid_m * BMC + W * HALFC
        off_n = pid_n * BN
        rows = off_m + gl.arange(0, HALFC, rows_l)
        sa_p = as_ptr + rows.to(gl.int64) * stride_as
        sb_p = ws_ptr + expert * stride_wse + (off_n // 128) * stride_wsn
        acc = gl.zeros([HALFC, BN], gl.float32, mma)
        sa0 = gl.load(sa_p)
        sb0 = gl.load(sb_p)
        for i in range(k_tiles):
            s = c % STAGES
            nxt = gl.minimum(i + 1, k_tiles - 1)
            sa1 = gl.load(sa_p + nxt)
            sb1 = gl.load(sb_p + nxt)
            mbarrier.wait(ready.index(s), (c // STAGES) & 1)
            a = a_bufs.index(2 * s + W)
            b = b_bufs.index(s).permute((1, 0))
            d = warpgroup_mma(a, b, d, use_acc=False, is_async=True)
            d, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(d, a, b))
            mbarrier.arrive(empty.index(s), count=1)
            acc = acc + d * gl.expand_dims(sa0 * sb0, 1)
            sa0 = sa1
            sb0 = sb1
            c += 1
        pair = gl.load(sorted_ids_ptr + rows)
        ok = pair < num_pairs
        wt = gl.load(topk_w_ptr + pair, mask=ok, other=0.0)
        yv = acc * gl.expand_dims(wt, 1)
        cols = off_n + gl.arange(0, BN, cols_l)
        ptrs = y_ptr + gl.expand_dims(pair.to(gl.int64) * stride_y, 1) + gl.expand_dims(cols, 0)
        gl.store(ptrs, yv.to(y_ptr.dtype.element_ty), mask=gl.expand_dims(ok, 1))


@gluon.jit
def gate_up_kernel(a_desc, b_desc, c_desc, as_ptr, ws_ptr, expert_ids_ptr, num_post_ptr, inter,
                   hidden, stride_as, stride_wse, stride_wsn, BN: gl.constexpr,
                   STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [2 * STAGES, 64, 128], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [2 * STAGES, BN, 128], b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2, 64, BN], c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    grid_n = inter // BN
    k_tiles = hidden // 128
    inter_blocks = inter // 128
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    GU: gl.constexpr = True
    gl.warp_specialize([
        (_gate_up_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr,
                             expert_ids_ptr, num_post_ptr, grid_n, k_tiles, stride_as,
                             stride_wse, stride_wsn, inter_blocks, WG0, BN, STAGES, GROUP_M)),
        (_gate_up_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, as_ptr, ws_ptr,
                             expert_ids_ptr, num_post_ptr, grid_n, k_tiles, stride_as,
                             stride_wse, stride_wsn, inter_blocks, WG1, BN, STAGES, GROUP_M)),
        (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, expert_ids_ptr, num_post_ptr,
                   grid_n, k_tiles, 2 * inter, inter, BN, STAGES, GROUP_M, GU)),
    ], [4, 1], [232, 40])


@gluon.jit
def down_kernel(a_desc, b_desc, y_ptr, topk_w_ptr, sorted_ids_ptr, as_ptr, ws_ptr,
                expert_ids_ptr, num_post_ptr, hidden, inter, stride_as, stride_wse, stride_wsn,
                stride_y, num_pairs, BN: gl.constexpr, STAGES: gl.constexpr,
                GROUP_M: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [2 * STAGES, 64, 128], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, 128], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    grid_n = hidden // BN
    k_tiles = inter // 128
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    GU: gl.constexpr = False
    gl.warp_specialize([
        (_down_consumer, (a_bufs, b_bufs, ready, empty, y_ptr, topk_w_ptr, sorted_ids_ptr,
                          as_ptr, ws_ptr, expert_ids_ptr, num_post_ptr, grid_n, k_tiles,
                          stride_as, stride_wse, stride_wsn, stride_y, num_pairs, WG0, BN,
                          STAGES, GROUP_M)),
        (_down_consumer, (a_bufs, b_bufs, ready, empty, y_ptr, topk_w_ptr, sorted_ids_ptr,
                          as_ptr, ws_ptr, expert_ids_ptr, num_post_ptr, grid_n, k_tiles,
                          stride_as, stride_wse, stride_wsn, stride_y, num_pairs, WG1, BN,
                          STAGES, GROUP_M)),
        (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, expert_ids_ptr, num_post_ptr,
                   grid_n, k_tiles, hidden, 0, BN, STAGES, GROUP_M, GU)),
    ], [4, 1], [232, 40])


def _desc(t, block):
    gdt = {torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16}[t.dtype]
    return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block,
                                                                                        gdt))


def run_experts_ws(x, w13, w2, s13, s2, topk_w, topk_ids, *, gu_stages=4, down_stages=4,
                   group_m=8, programs=None):
    """The whole fp8 MoE call (module docstring). ``x [M, H]`` bf16; weights e4m3
    ``[S, 2I, H]`` / ``[S, H, I]`` with ``[S, 2I/128, H/128]`` / ``[S, H/128, I/128]``
    scales. Returns ``[M, H]`` bf16. No host sync."""
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum
    from moerun.backends.triton.fp8 import quantize_rows_fp8

    m, h = x.shape
    s, two_i, _ = w13.shape
    inter = two_i // 2
    k = topk_ids.shape[1]
    p = m * k
    align = moe_align(topk_ids, s, BM)
    q = quantize_rows_fp8(x)
    r = align.sorted_ids.numel()
    sid = align.sorted_ids
    tok = torch.where((sid >= 0) & (sid < p), sid // k, 0).long()
    a = q.data.view(torch.uint8).index_select(0, tok).view(torch.float8_e4m3fn)
    a_s = q.scale.index_select(0, tok)
    act = torch.empty(r, inter, device=x.device, dtype=torch.bfloat16)
    nsm = programs or torch.cuda.get_device_properties(x.device).multi_processor_count
    bn_gu = 64
    gate_up_kernel[(nsm,)](
        _desc(a, [64, 128]), _desc(w13.view(s * two_i, h), [bn_gu, 128]),
        _desc(act, [64, bn_gu]), a_s, s13, align.expert_ids, align.num_post, inter, h,
        a_s.stride(0), s13.stride(0), s13.stride(1), bn_gu, gu_stages, group_m, num_warps=4)
    qa = quantize_rows_fp8(act)
    y = torch.empty(p, h, device=x.device, dtype=torch.bfloat16)
    bn = 128
    down_kernel[(nsm,)](
        _desc(qa.data, [64, 128]), _desc(w2.view(s * h, inter), [bn, 128]), y,
        topk_w.reshape(-1), align.sorted_ids, qa.scale, s2, align.expert_ids, align.num_post,
        h, inter, qa.scale.stride(0), s2.stride(0), s2.stride(1), y.stride(0), p, bn,
        down_stages, group_m, num_warps=4)
    return moe_sum(y, topk_ids, s)


# ------------------------------------------------------------------ offline compile (CPU)
def compile_only() -> None:
    import sys

    sys.path.insert(0, "benchmarks/experiments/gluon-2026-12-02")
    from ws_gemm import _ptxas_info
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as tcompile, make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    f8 = torch.float8_e4m3fn
    s, h, inter, r, p = 8, 1024, 512, 1024, 512
    a = torch.empty(r, h, dtype=torch.uint8).view(f8)
    w13 = torch.empty(s * 2 * inter, h, dtype=torch.uint8).view(f8)
    w2 = torch.empty(s * h, inter, dtype=torch.uint8).view(f8)
    act = torch.empty(r, inter, dtype=torch.bfloat16)
    qa = torch.empty(r, inter, dtype=torch.uint8).view(f8)
    a_s = torch.empty(r, h // G)
    s13 = torch.empty(s, 2 * inter // G, h // G)
    s2 = torch.empty(s, h // G, inter // G)
    ids = torch.empty(r, dtype=torch.int32)
    y = torch.empty(p, h, dtype=torch.bfloat16)
    w = torch.empty(p)
    cases = [
        (gate_up_kernel, (_desc(a, [64, 128]), _desc(w13, [64, 128]), _desc(act, [64, 64]), a_s,
                          s13, ids, ids, inter, h, a_s.stride(0), s13.stride(0), s13.stride(1),
                          64, 4, 8)),
        (down_kernel, (_desc(qa, [64, 128]), _desc(w2, [128, 128]), y, w, ids, a_s, s2, ids, ids,
                       h, inter, a_s.stride(0), s2.stride(0), s2.stride(1), y.stride(0), p, 128,
                       4, 8)),
    ]
    for fn, args in cases:
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound, spec, opts = binder(*args, num_warps=4)
        options, signature, constexprs, attrs = fn._pack_args(backend, {"num_warps": 4}, bound,
                                                              spec, opts)
        ck = tcompile(GluonASTSource(fn, signature, constexprs, attrs), target=target,
                      options=options.__dict__)
        ptx = ck.asm["ptx"]
        print(fn.fn.__name__, "shared", ck.metadata.shared, "wgmma",
              ptx.count("wgmma.mma_async"), "ptxas", _ptxas_info(ptx), flush=True)


# ------------------------------------------------------------------ device run
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--shapes", default="mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3")
    ap.add_argument("--tokens", default="1024,8192")
    args = ap.parse_args()
    if args.compile_only:
        compile_only()
        return
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.fp8 import fp8_weights
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.bench.timing import time_samples
    from moerun.quant import ExpertQuant, QuantConfig, reference_fp8_moe

    dev = torch.device("cuda")
    qc = QuantConfig()
    be = TritonExperts()
    for shape in parse_shapes(args.shapes):
        gen = torch.Generator(device=dev).manual_seed(0)
        w13, w2, s13, s2, d13, d2 = fp8_weights(shape, dev, gen, torch.bfloat16)
        del d13, d2
        eq = ExpertQuant(config=qc, w13_scale=s13, w2_scale=s2, out_dtype=torch.bfloat16)
        for t in (int(v) for v in args.tokens.split(",")):
            x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
            routings = [draw_routing(t, shape.num_experts, shape.top_k, gen, dev)
                        for _ in range(4)]

            def shipped(j, x=x, routings=routings):
                w, ids = routings[j % 4]
                return be.run_experts(be.quantize_rows(x, qc), w13, w2, w, ids, quant=eq)

            def ws(j, x=x, routings=routings, **kw):
                w, ids = routings[j % 4]
                return run_experts_ws(x, w13, w2, s13, s2, w, ids, **kw)

            try:
                w0, ids0 = routings[0]
                rows = torch.arange(0, t, max(1, t // 64), device=dev)
                ref = reference_fp8_moe(x[rows], w13, s13, w2, s2, w0[rows], ids0[rows], qc,
                                        out_dtype=torch.bfloat16).double()
                got = ws(0)
                torch.cuda.synchronize()
                err = ((got[rows].double() - ref).norm() / ref.norm()).item()
                err_s = ((shipped(0)[rows].double() - ref).norm() / ref.norm()).item()
                res = {}
                for name, fn in (("shipped", shipped), ("ws", ws), ("shipped2", shipped),
                                 ("ws2", ws)):
                    res[name] = statistics.median(time_samples(fn, dev, 10, warmup=2)) * 1e6
                print(f"{shape.name:16s} T={t:5d} shipped {res['shipped']:9.1f}/"
                      f"{res['shipped2']:9.1f} us  gluon ws {res['ws']:9.1f}/{res['ws2']:9.1f} us"
                      f"  err shipped {err_s:.2e} ws {err:.2e}", flush=True)
            except Exception as exc:  # noqa: BLE001 - the probe records the failure
                print(f"{shape.name} T={t}: {exc!r}"[:1500], flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
