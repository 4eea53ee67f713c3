"""Device: from the minimal WS grouped GEMM with a pointer-store epilogue (correct on sm90)
# ruff: noqa: B023 -- each lambda is called inside the iteration that defines it
toward moerun's down kernel (wrong), one difference at a time."""

import json, os, torch, triton, triton.language as tl
from moerun._triton.compat import patch_interpreter

patch_interpreter()

SMALL = os.environ.get("SMALL") == "1"
DEV = "cpu" if SMALL else "cuda"
DT = torch.float16 if SMALL else torch.bfloat16
if not SMALL:
    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
    )


@triton.jit
def k(
    a_ptr,
    w_ptr,
    c_ptr,
    ids_ptr,
    scale_ptr,
    nb_ptr,
    M,
    N,
    K,
    S,
    NP,
    sa,
    swe,
    swn,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    RT_STRIDES: tl.constexpr,
    EXTRA_DESC: tl.constexpr,
    EPI_LOAD: tl.constexpr,
    NB_DIV: tl.constexpr,
    MASK: tl.constexpr,
    I64: tl.constexpr,
):
    if RT_STRIDES:
        a_d = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[sa, 1], block_shape=[BM, BK])
        w_d = tl.make_tensor_descriptor(
            w_ptr, shape=[S, N, K], strides=[swe, swn, 1], block_shape=[1, BN, BK]
        )
    else:
        a_d = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        w_d = tl.make_tensor_descriptor(
            w_ptr, shape=[S, N, K], strides=[N * K, K, 1], block_shape=[1, BN, BK]
        )
    if EXTRA_DESC:
        y_d = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])  # noqa: F841, E501 -- unused on purpose
    nn = tl.cdiv(N, BN)
    if NB_DIV:
        nm = tl.load(nb_ptr) // BM
    else:
        nm = tl.load(nb_ptr + 1)
    for t in tl.range(tl.program_id(0), nm * nn, NP, warp_specialize=True):
        pm = t // nn
        pn = t % nn
        e = tl.load(ids_ptr + pm)
        acc = tl.zeros([BM, BN], tl.float32)
        for kk in tl.range(0, tl.cdiv(K, BK), num_stages=3):
            a = a_d.load([pm * BM, kk * BK])
            b = w_d.load([e, pn * BN, kk * BK]).reshape(BN, BK)
            acc = tl.dot(a, b.T, acc)
        offs_m = pm * BM + tl.arange(0, BM)
        offs_n = pn * BN + tl.arange(0, BN)
        if EPI_LOAD:
            sc = tl.load(scale_ptr + offs_m)
            acc = acc * sc[:, None]
        rows = offs_m[:, None]
        if I64:
            rows = rows.to(tl.int64)
        if MASK:
            tl.store(
                c_ptr + rows * N + offs_n[None, :],
                acc.to(c_ptr.dtype.element_ty),
                mask=(offs_n < N)[None, :],
            )
        else:
            tl.store(c_ptr + rows * N + offs_n[None, :], acc.to(c_ptr.dtype.element_ty))


S, N, K, BM, BN, nblk = (4, 512, 256, 128, 256, 6) if SMALL else (32, 7168, 2048, 128, 256, 64)
M = nblk * BM
torch.manual_seed(0)
a = torch.randn(M, K, device=DEV, dtype=DT)
w = torch.randn(S, N, K, device=DEV, dtype=DT) / 30
ids = torch.randint(0, S, (nblk,), device=DEV, dtype=torch.int32)
scale = torch.rand(M, device=DEV)
nb = torch.tensor([M, nblk], device=DEV, dtype=torch.int32)
ref = torch.einsum("bmk,bnk->bmn", a.float().view(nblk, BM, K), w[ids.long()].float()).reshape(M, N)
nsm = 3 if SMALL else torch.cuda.get_device_properties(0).multi_processor_count
base = dict(RT_STRIDES=False, EXTRA_DESC=False, EPI_LOAD=True, NB_DIV=False, MASK=False, I64=False)
variants = (
    [("base", {})]
    + [(f, {f: not base[f]}) for f in base]
    + [
        (
            "down-like",
            dict(
                RT_STRIDES=True, EXTRA_DESC=True, EPI_LOAD=False, NB_DIV=True, MASK=True, I64=True
            ),
        ),
        (
            "down-like+load",
            dict(RT_STRIDES=True, EXTRA_DESC=True, EPI_LOAD=True, NB_DIV=True, MASK=True, I64=True),
        ),
    ]
)
for name, flip in variants:
    p = dict(base, **flip)
    c = torch.zeros(M, N, device=DEV, dtype=DT)
    try:
        k[(nsm,)](
            a,
            w,
            c,
            ids,
            scale,
            nb,
            M,
            N,
            K,
            S,
            nsm,
            a.stride(0),
            w.stride(0),
            w.stride(1),
            BM,
            BN,
            64,
            p["RT_STRIDES"],
            p["EXTRA_DESC"],
            p["EPI_LOAD"],
            p["NB_DIV"],
            p["MASK"],
            p["I64"],
            num_warps=4,
            num_stages=3,
        )
        if not SMALL:
            torch.cuda.synchronize()
        r = ref * scale[:, None] if p["EPI_LOAD"] else ref
        print(
            json.dumps({"v": name, "err": ((c.float() - r).norm() / r.norm()).item()}), flush=True
        )
    except Exception as ex:
        print(name, "FAIL", str(ex)[:300], flush=True)
