"""The warp-specialized Gluon GEMM of ``ws_gemm.py`` (mode 0, bf16) as the two grouped MoE
GEMMs: a prototype timed as a whole bf16 MoE call against the shipped one (device probe).

As ``grouped_fp8.py`` without the quantization: the rows gathered into aligned order, the
gate/up tile (``GU_N`` gate and ``GU_N`` up weight rows per stage, two accumulators chained
through their wgmmas, one step in flight) with ``silu(g) * u`` in its epilogue, the down tile
(``DN_N`` columns) with the routing weight, ``moe_sum``. K step 64.

"""
from __future__ import annotations

import argparse
import statistics

import torch
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
            k_tiles, n_rows_per_expert, up_offset, BN: gl.constexpr, BK: gl.constexpr,
            STAGES: gl.constexpr, GROUP_M: gl.constexpr, GATE_UP: gl.constexpr):
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
            tma.async_copy_global_to_shared(a_desc, [off_m, i * BK], bar, a_bufs.index(2 * s))
            tma.async_copy_global_to_shared(a_desc, [off_m + HALFC, i * BK], bar,
                                            a_bufs.index(2 * s + 1))
            if GATE_UP:
                tma.async_copy_global_to_shared(b_desc, [off_w, i * BK], bar,
                                                b_bufs.index(2 * s))
                tma.async_copy_global_to_shared(b_desc, [off_w + up_offset, i * BK], bar,
                                                b_bufs.index(2 * s + 1))
            else:
                tma.async_copy_global_to_shared(b_desc, [off_w, i * BK], bar, b_bufs.index(s))
            c += 1


@gluon.jit
def _gate_up_consumer(a_bufs, b_bufs, ready, empty, c_desc, c_bufs, expert_ids_ptr,
                      num_post_ptr, grid_n, k_tiles, W: gl.constexpr, BN: gl.constexpr,
                      STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BN, 16])
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, grid_m, grid_n, GROUP_M)
        off_m = pid_m * BMC + W * HALFC
        off_n = pid_n * BN
        acc_g = gl.zeros([HALFC, BN], gl.float32, mma)
        acc_u = gl.zeros([HALFC, BN], gl.float32, mma)
        for i in range(k_tiles):
            s = c % STAGES
            mbarrier.wait(ready.index(s), (c // STAGES) & 1)
            a = a_bufs.index(2 * s + W)
            acc_g = warpgroup_mma(a, b_bufs.index(2 * s).permute((1, 0)), acc_g, is_async=True)
            acc_u = warpgroup_mma(a, b_bufs.index(2 * s + 1).permute((1, 0)), acc_u,
                                  is_async=True)
            # two wgmmas in flight: the previous step's are complete, release its stage
            acc_g, acc_u = warpgroup_mma_wait(num_outstanding=2, deps=(acc_g, acc_u))
            mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), count=1, pred=i > 0)
            c += 1
        acc_g, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=(acc_g, acc_u))
        mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), count=1)
        act = acc_g / (1.0 + gl.exp(-acc_g)) * acc_u
        tma.store_wait(pendings=0)
        cs = c_bufs.index(W)
        cs.store(act.to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [off_m, off_n], cs)
    tma.store_wait(pendings=0)


@gluon.jit
def _down_consumer(a_bufs, b_bufs, ready, empty, y_ptr, topk_w_ptr, sorted_ids_ptr,
                   expert_ids_ptr, num_post_ptr, grid_n, k_tiles, stride_y, num_pairs,
                   W: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                   GROUP_M: gl.constexpr):
    BMC: gl.constexpr = 128
    HALFC: gl.constexpr = 64
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BN, 16])
    rows_l: gl.constexpr = gl.SliceLayout(1, mma)
    cols_l: gl.constexpr = gl.SliceLayout(0, mma)
    grid_m = gl.load(num_post_ptr) // BMC
    c = 0
    for t in range(gl.program_id(0), grid_m * grid_n, gl.num_programs(0)):
        pid_m, pid_n = _tile(t, grid_m, grid_n, GROUP_M)
        off_m = pid_m * BMC + W * HALFC
        off_n = pid_n * BN
        acc = gl.zeros([HALFC, BN], gl.float32, mma)
        for i in range(k_tiles):
            s = c % STAGES
            mbarrier.wait(ready.index(s), (c // STAGES) & 1)
            a = a_bufs.index(2 * s + W)
            b = b_bufs.index(s).permute((1, 0))
            acc = warpgroup_mma(a, b, acc, is_async=True)
            acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a, b))
            mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), count=1, pred=i > 0)
            c += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((c + STAGES - 1) % STAGES), count=1)
        rows = off_m + gl.arange(0, HALFC, rows_l)
        pair = gl.load(sorted_ids_ptr + rows)
        ok = pair < num_pairs
        wt = gl.load(topk_w_ptr + pair, mask=ok, other=0.0)
        yv = acc * gl.expand_dims(wt, 1)
        cols = off_n + gl.arange(0, BN, cols_l)
        ptrs = y_ptr + gl.expand_dims(pair.to(gl.int64) * stride_y, 1) + gl.expand_dims(cols, 0)
        gl.store(ptrs, yv.to(y_ptr.dtype.element_ty), mask=gl.expand_dims(ok, 1))


@gluon.jit
def gate_up_kernel(a_desc, b_desc, c_desc, expert_ids_ptr, num_post_ptr, inter, hidden,
                   BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    BK: gl.constexpr = a_desc.block_type.shape[1]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [2 * STAGES, 64, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [2 * STAGES, BN, BK], b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2, 64, BN], c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    grid_n = inter // BN
    k_tiles = hidden // BK
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    GU: gl.constexpr = True
    gl.warp_specialize([
        (_gate_up_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, expert_ids_ptr,
                             num_post_ptr, grid_n, k_tiles, WG0, BN, STAGES, GROUP_M)),
        (_gate_up_consumer, (a_bufs, b_bufs, ready, empty, c_desc, c_bufs, expert_ids_ptr,
                             num_post_ptr, grid_n, k_tiles, WG1, BN, STAGES, GROUP_M)),
        (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, expert_ids_ptr, num_post_ptr,
                   grid_n, k_tiles, 2 * inter, inter, BN, BK, STAGES, GROUP_M, GU)),
    ], [4, 1], [232, 40])


@gluon.jit
def down_kernel(a_desc, b_desc, y_ptr, topk_w_ptr, sorted_ids_ptr, expert_ids_ptr,
                num_post_ptr, hidden, inter, stride_y, num_pairs, BN: gl.constexpr,
                STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    BK: gl.constexpr = a_desc.block_type.shape[1]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [2 * STAGES, 64, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    grid_n = hidden // BN
    k_tiles = inter // BK
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    GU: gl.constexpr = False
    gl.warp_specialize([
        (_down_consumer, (a_bufs, b_bufs, ready, empty, y_ptr, topk_w_ptr, sorted_ids_ptr,
                          expert_ids_ptr, num_post_ptr, grid_n, k_tiles, stride_y, num_pairs,
                          WG0, BN, STAGES, GROUP_M)),
        (_down_consumer, (a_bufs, b_bufs, ready, empty, y_ptr, topk_w_ptr, sorted_ids_ptr,
                          expert_ids_ptr, num_post_ptr, grid_n, k_tiles, stride_y, num_pairs,
                          WG1, BN, STAGES, GROUP_M)),
        (_loader, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, expert_ids_ptr, num_post_ptr,
                   grid_n, k_tiles, hidden, 0, BN, BK, STAGES, GROUP_M, GU)),
    ], [4, 1], [232, 40])


def _desc(t, block):
    gdt = {torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16}[t.dtype]
    return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block,
                                                                                        gdt))


def run_experts_ws(x, w13, w2, topk_w, topk_ids, *, gu_n=128, dn_n=256, bk=64, gu_stages=4,
                   down_stages=4, group_m=8):
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum

    m, h = x.shape
    s, two_i, _ = w13.shape
    inter = two_i // 2
    k = topk_ids.shape[1]
    p = m * k
    align = moe_align(topk_ids, s, BM)
    sid = align.sorted_ids
    tok = torch.where((sid >= 0) & (sid < p), sid // k, torch.zeros_like(sid))
    a = x.index_select(0, tok)
    r = sid.numel()
    act = torch.empty(r, inter, device=x.device, dtype=x.dtype)
    nsm = _SM[0] or torch.cuda.get_device_properties(x.device).multi_processor_count
    _SM[0] = nsm
    gate_up_kernel[(nsm,)](_desc(a, [64, bk]), _desc(w13.view(s * two_i, h), [gu_n, bk]),
                           _desc(act, [64, gu_n]), align.expert_ids, align.num_post, inter, h,
                           gu_n, gu_stages, group_m, num_warps=4)
    y = torch.empty(p, h, device=x.device, dtype=x.dtype)
    down_kernel[(nsm,)](_desc(act, [64, bk]), _desc(w2.view(s * h, inter), [dn_n, bk]), y,
                        topk_w.reshape(-1), sid, align.expert_ids, align.num_post, h, inter,
                        y.stride(0), p, dn_n, down_stages, group_m, num_warps=4)
    return moe_sum(y, topk_ids, s)


_SM = [0]
VARIANTS = [dict(gu_n=128, dn_n=256, gu_stages=4, down_stages=4),
            dict(gu_n=64, dn_n=128, gu_stages=5, down_stages=5),
            dict(gu_n=128, dn_n=128, gu_stages=4, down_stages=5)]


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
    bf = torch.bfloat16
    s, h, inter, r, p = 8, 1024, 512, 1024, 512
    a = torch.empty(r, h, dtype=bf)
    w13 = torch.empty(s * 2 * inter, h, dtype=bf)
    w2 = torch.empty(s * h, inter, dtype=bf)
    act = torch.empty(r, inter, dtype=bf)
    ids = torch.empty(r, dtype=torch.int32)
    y = torch.empty(p, h, dtype=bf)
    w = torch.empty(p)
    for v in VARIANTS:
        cases = [
            (gate_up_kernel, (_desc(a, [64, 64]), _desc(w13, [v["gu_n"], 64]),
                              _desc(act, [64, v["gu_n"]]), ids, ids, inter, h, v["gu_n"],
                              v["gu_stages"], 8)),
            (down_kernel, (_desc(act, [64, 64]), _desc(w2, [v["dn_n"], 64]), y, w, ids, ids,
                           ids, h, inter, y.stride(0), p, v["dn_n"], v["down_stages"], 8)),
        ]
        for fn, args in cases:
            binder = create_function_from_signature(fn.signature, fn.params, backend)
            bound, spec, opts = binder(*args, num_warps=4)
            options, signature, constexprs, attrs = fn._pack_args(backend, {"num_warps": 4},
                                                                  bound, spec, opts)
            ck = tcompile(GluonASTSource(fn, signature, constexprs, attrs), target=target,
                          options=options.__dict__)
            ptx = ck.asm["ptx"]
            print(v, fn.fn.__name__, "shared", ck.metadata.shared, "wgmma",
                  ptx.count("wgmma.mma_async"), "ptxas", _ptxas_info(ptx), flush=True)


# ------------------------------------------------------------------ device run
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--cells", default="mixtral8x7b:1024,mixtral8x7b:8192,qwen3-30b-a3b:8192,"
                    "qwen3-235b-a22b:8192,deepseek-v3:8192,deepseek-v3-ep8-local:2048,"
                    "deepseek-v3-ep8-local:8192,deepseek-v3-ep8-local:32768,"
                    "qwen3-235b-ep8-local:2048,qwen3-235b-ep8-local:8192,"
                    "qwen3-235b-ep8-local:32768")
    args = ap.parse_args()
    if args.compile_only:
        compile_only()
        return
    from moerun.backends.triton.experts import TritonExperts
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.bench.timing import time_samples

    dev = torch.device("cuda")
    be = TritonExperts()
    cur = None
    for cell in args.cells.split(","):
        name, t = cell.split(":")
        t = int(t)
        shape = parse_shapes(name)[0]
        if cur != name:
            gen = torch.Generator(device=dev).manual_seed(0)
            e, h, i = shape.num_experts, shape.hidden, shape.intermediate
            w13 = (torch.randn(e, 2 * i, h, generator=gen, device=dev) * h ** -0.5).bfloat16()
            w2 = (torch.randn(e, h, i, generator=gen, device=dev) * i ** -0.5).bfloat16()
            cur = name
        x = torch.randn(t, shape.hidden, generator=gen, device=dev, dtype=torch.bfloat16)
        routings = [draw_routing(t, shape.num_experts, shape.top_k, gen, dev) for _ in range(4)]

        def shipped(j, x=x, routings=routings):
            w, ids = routings[j % 4]
            return be.run_experts(x, w13, w2, w, ids)

        try:
            base = shipped(0).float()
            res = {"shipped": statistics.median(time_samples(shipped, dev, 10, warmup=2)) * 1e6}
            for n, v in enumerate(VARIANTS):
                def ws(j, x=x, routings=routings, v=v):
                    w, ids = routings[j % 4]
                    return run_experts_ws(x, w13, w2, w, ids, **v)
                diff = ((ws(0).float() - base).norm() / base.norm()).item()
                res[f"ws{n}"] = statistics.median(time_samples(ws, dev, 10, warmup=2)) * 1e6
                res[f"diff{n}"] = diff
            res["shipped2"] = statistics.median(time_samples(shipped, dev, 10, warmup=2)) * 1e6
            print(f"{name:22s} T={t:5d} " + " ".join(
                f"{k} {v:.1f}" if not k.startswith("diff") else f"{k} {v:.1e}"
                for k, v in res.items()), flush=True)
        except Exception as exc:  # noqa: BLE001 - the probe records the failure
            print(f"{name} T={t}: {exc!r}"[:1500], flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
