"""Device: which part of a warp-specialized persistent grouped GEMM goes wrong on sm90."""
# ruff: noqa: B023 -- each lambda is called inside the iteration that defines it

import json, statistics
import torch, triton, triton.language as tl


def alloc(size, align, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


triton.set_allocator(alloc)


@triton.jit
def k_dense(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    NP,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    WS: tl.constexpr,
    STAGES: tl.constexpr,
):
    a_d = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_d = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
    c_d = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    nn = tl.cdiv(N, BN)
    tiles = tl.cdiv(M, BM) * nn
    for t in tl.range(tl.program_id(0), tiles, NP, warp_specialize=WS):
        pm = t // nn
        pn = t % nn
        acc = tl.zeros([BM, BN], tl.float32)
        for k in tl.range(0, tl.cdiv(K, BK), num_stages=STAGES):
            a = a_d.load([pm * BM, k * BK])
            b = b_d.load([pn * BN, k * BK])
            acc = tl.dot(a, b.T, acc)
        c_d.store([pm * BM, pn * BN], acc.to(tl.bfloat16))


@triton.jit
def k_group(
    a_ptr,
    w_ptr,
    c_ptr,
    ids_ptr,
    scale_ptr,
    M,
    N,
    K,
    S,
    NP,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    WS: tl.constexpr,
    STAGES: tl.constexpr,
    PTR_EPI: tl.constexpr,
    NUM_FROM_PTR: tl.constexpr,
):
    a_d = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    w_d = tl.make_tensor_descriptor(
        w_ptr, shape=[S, N, K], strides=[N * K, K, 1], block_shape=[1, BN, BK]
    )
    c_d = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    nn = tl.cdiv(N, BN)
    if NUM_FROM_PTR:
        nm = tl.load(scale_ptr + M).to(tl.int32)
    else:
        nm = tl.cdiv(M, BM)
    tiles = nm * nn
    for t in tl.range(tl.program_id(0), tiles, NP, warp_specialize=WS):
        pm = t // nn
        pn = t % nn
        e = tl.load(ids_ptr + pm)
        acc = tl.zeros([BM, BN], tl.float32)
        for k in tl.range(0, tl.cdiv(K, BK), num_stages=STAGES):
            a = a_d.load([pm * BM, k * BK])
            b = w_d.load([e, pn * BN, k * BK]).reshape(BN, BK)
            acc = tl.dot(a, b.T, acc)
        if PTR_EPI:
            offs_m = pm * BM + tl.arange(0, BM)
            sc = tl.load(scale_ptr + offs_m)
            acc = acc * sc[:, None]
            offs_n = pn * BN + tl.arange(0, BN)
            tl.store(c_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(tl.bfloat16))
        else:
            c_d.store([pm * BM, pn * BN], acc.to(tl.bfloat16))


def ev_time(fn, n=20):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts)


def main():
    torch.manual_seed(0)
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    M, N, K = 8192, 8192, 4096
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float().T
    for ws, nw, bm, bn, st in (
        (False, 8, 128, 256, 3),
        (True, 4, 128, 256, 3),
        (True, 4, 128, 256, 4),
        (True, 4, 128, 128, 4),
    ):
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        run = lambda: k_dense[(nsm,)](
            a, b, c, M, N, K, nsm, bm, bn, 64, ws, st, num_warps=nw, num_stages=st
        )
        try:
            run()
            torch.cuda.synchronize()
            err = ((c.float() - ref).norm() / ref.norm()).item()
            us = ev_time(run)
            print(
                json.dumps(
                    {
                        "k": "dense",
                        "ws": ws,
                        "nw": nw,
                        "bm": bm,
                        "bn": bn,
                        "st": st,
                        "err": err,
                        "us": us,
                        "tflops": 2 * M * N * K / us / 1e6,
                    }
                ),
                flush=True,
            )
        except Exception as ex:
            print("dense", ws, nw, "FAIL", str(ex)[:300], flush=True)
    us_mm = ev_time(lambda: a @ b.T)
    print(
        json.dumps({"k": "torch.mm", "us": us_mm, "tflops": 2 * M * N * K / us_mm / 1e6}),
        flush=True,
    )
    # grouped: S experts, M rows in BM blocks each assigned an expert
    S, N2, K2 = 32, 7168, 2048
    BM = 128
    nblk = 64
    M2 = nblk * BM
    a2 = torch.randn(M2, K2, device="cuda", dtype=torch.bfloat16)
    w2 = torch.randn(S, N2, K2, device="cuda", dtype=torch.bfloat16) / 30
    ids = torch.randint(0, S, (nblk,), device="cuda", dtype=torch.int32)
    scale = torch.rand(M2 + 1, device="cuda")
    scale[M2] = nblk
    wsel = w2[ids.long()].float()  # [nblk, N, K]
    ref2 = torch.einsum("bmk,bnk->bmn", a2.float().view(nblk, BM, K2), wsel).reshape(M2, N2)
    for ws, nw, ptr_epi, numptr in (
        (False, 8, False, False),
        (True, 4, False, False),
        (True, 4, True, False),
        (True, 4, False, True),
        (True, 4, True, True),
        (False, 8, True, True),
    ):
        c = torch.empty(M2, N2, device="cuda", dtype=torch.bfloat16)
        run = lambda: k_group[(nsm,)](
            a2,
            w2,
            c,
            ids,
            scale,
            M2,
            N2,
            K2,
            S,
            nsm,
            BM,
            256,
            64,
            ws,
            3,
            ptr_epi,
            numptr,
            num_warps=nw,
            num_stages=3,
        )
        try:
            run()
            torch.cuda.synchronize()
            r = ref2 * scale[:M2, None] if ptr_epi else ref2
            err = ((c.float() - r).norm() / r.norm()).item()
            print(
                json.dumps(
                    {
                        "k": "group",
                        "ws": ws,
                        "nw": nw,
                        "ptr_epi": ptr_epi,
                        "num_from_ptr": numptr,
                        "err": err,
                        "us": ev_time(run),
                    }
                ),
                flush=True,
            )
        except Exception as ex:
            print("group", ws, ptr_epi, numptr, "FAIL", str(ex)[:300], flush=True)


if __name__ == "__main__":
    main()
