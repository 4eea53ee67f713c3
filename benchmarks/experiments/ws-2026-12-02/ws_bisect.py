"""Device: bisect the warp-specialized persistent down kernel (moerun's vs the minimal one)."""
# ruff: noqa: B023 -- each lambda is called inside the iteration that defines it

import json, itertools, os, torch, triton, triton.language as tl
from moerun.backends.triton.align import moe_align
from moerun.backends.triton.gate_up import grouped_pid
from moerun.bench.inputs import draw_routing


@triton.jit
def k_down(
    act_ptr,
    w2_ptr,
    out_ptr,
    ya_ptr,
    tw_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_post_ptr,
    num_pairs,
    hidden,
    inter,
    max_rows,
    num_slots,
    num_programs,
    stride_am,
    stride_we,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    WS: tl.constexpr,
    GP: tl.constexpr,
    EPI: tl.constexpr,
):
    a_desc = tl.make_tensor_descriptor(
        act_ptr, shape=[max_rows, inter], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K]
    )
    w_desc = tl.make_tensor_descriptor(
        w2_ptr,
        shape=[num_slots, hidden, inter],
        strides=[stride_we, stride_wn, 1],
        block_shape=[1, BLOCK_N, BLOCK_K],
    )
    y_desc = tl.make_tensor_descriptor(
        ya_ptr, shape=[max_rows, hidden], strides=[hidden, 1], block_shape=[BLOCK_M, BLOCK_N]
    )
    num_n = tl.cdiv(hidden, BLOCK_N)
    used_blocks = tl.load(num_post_ptr) // BLOCK_M
    num_tiles = used_blocks * num_n
    k_tiles = tl.cdiv(inter, BLOCK_K)
    for tile in tl.range(tl.program_id(0), num_tiles, num_programs, warp_specialize=WS):
        if GP:
            pid_m, pid_n = grouped_pid(tile, used_blocks, num_n, GROUP_M)
        else:
            pid_m = tile // num_n
            pid_n = tile % num_n
        expert = tl.load(expert_ids_ptr + pid_m)
        row0 = pid_m * BLOCK_M
        n0 = pid_n * BLOCK_N
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in tl.range(0, k_tiles, num_stages=3):
            a = a_desc.load([row0, k * BLOCK_K])
            b = w_desc.load([expert, n0, k * BLOCK_K]).reshape(BLOCK_N, BLOCK_K)
            acc = tl.dot(a, b.T, acc)
        offs_m = row0 + tl.arange(0, BLOCK_M)
        offs_n = n0 + tl.arange(0, BLOCK_N)
        if EPI == 0:  # TMA store, aligned rows, no weight
            y_desc.store([row0, n0], acc.to(ya_ptr.dtype.element_ty))
        elif EPI == 1:  # pointer store, aligned rows, no weight
            tl.store(
                ya_ptr + offs_m[:, None].to(tl.int64) * hidden + offs_n[None, :],
                acc.to(ya_ptr.dtype.element_ty),
            )
        elif EPI == 2:  # pointer store aligned rows, weight via pair (indirect load)
            pair = tl.load(sorted_ids_ptr + offs_m)
            row_ok = pair < num_pairs
            w = tl.load(tw_ptr + pair, mask=row_ok, other=0.0)
            tl.store(
                ya_ptr + offs_m[:, None].to(tl.int64) * hidden + offs_n[None, :],
                (acc * w[:, None]).to(ya_ptr.dtype.element_ty),
            )
        elif EPI == 3:  # scattered store by pair, no weight, masked
            pair = tl.load(sorted_ids_ptr + offs_m)
            row_ok = pair < num_pairs
            dst = out_ptr + pair[:, None].to(tl.int64) * stride_om + offs_n[None, :]
            tl.store(
                dst,
                acc.to(ya_ptr.dtype.element_ty),
                mask=row_ok[:, None] & (offs_n < hidden)[None, :],
            )
        elif EPI == 5:  # EPI 1 with int32 offsets
            tl.store(
                ya_ptr + offs_m[:, None] * hidden + offs_n[None, :], acc.to(ya_ptr.dtype.element_ty)
            )
        elif EPI == 6:  # moerun's with int32 offsets
            pair = tl.load(sorted_ids_ptr + offs_m)
            row_ok = pair < num_pairs
            w = tl.load(tw_ptr + pair, mask=row_ok, other=0.0)
            acc = acc * w[:, None]
            dst = out_ptr + pair[:, None] * stride_om + offs_n[None, :]
            tl.store(
                dst,
                acc.to(ya_ptr.dtype.element_ty),
                mask=row_ok[:, None] & (offs_n < hidden)[None, :],
            )
        else:  # moerun's
            pair = tl.load(sorted_ids_ptr + offs_m)
            row_ok = pair < num_pairs
            w = tl.load(tw_ptr + pair, mask=row_ok, other=0.0)
            acc = acc * w[:, None]
            dst = out_ptr + pair[:, None].to(tl.int64) * stride_om + offs_n[None, :]
            tl.store(
                dst,
                acc.to(ya_ptr.dtype.element_ty),
                mask=row_ok[:, None] & (offs_n < hidden)[None, :],
            )


SMALL = os.environ.get("SMALL") == "1"
DEV = "cpu" if SMALL else "cuda"
DT = torch.float16 if SMALL else torch.bfloat16
if not SMALL:
    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
    )
S, K, H, I, T, BM = (4, 2, 512, 128, 64, 128) if SMALL else (32, 4, 7168, 2048, 2048, 128)
gen = torch.Generator(device=DEV).manual_seed(1)
tw, ids = draw_routing(T, S, K, gen, DEV)
al = moe_align(ids, S, BM)
R = al.max_blocks * BM
act = torch.randn(R, I, device=DEV, dtype=DT)
w2 = torch.randn(S, H, I, device=DEV, dtype=DT) / 30
used = int(al.num_post.item())
eids = al.expert_ids[: used // BM].long()
ya_ref = torch.empty(used, H, device=DEV)
for b in range(used // BM):
    ya_ref[b * BM : (b + 1) * BM] = act[b * BM : (b + 1) * BM].float() @ w2[eids[b]].float().T
sid = al.sorted_ids[:used].long()
ok = sid < T * K
wrow = torch.zeros(used, device=DEV)
wrow[ok] = tw.flatten()[sid[ok]]
y_ref = torch.zeros(T * K, H, device=DEV)
y_ref[sid[ok]] = ya_ref[ok]
rel = lambda a, b: ((a.float() - b).norm() / b.norm()).item()
nsm = 3 if SMALL else torch.cuda.get_device_properties(0).multi_processor_count
for ws, gp, epi in itertools.product((True, False), (0, 1), (0, 1, 2, 3, 4, 5, 6)):
    if not ws and (gp, epi) not in ((1, 4),):
        continue
    ya = torch.zeros(R, H, device=DEV, dtype=DT)
    y = torch.zeros(T * K, H, device=DEV, dtype=DT)
    try:
        k_down[(nsm,)](
            act,
            w2,
            y,
            ya,
            tw,
            al.sorted_ids,
            al.expert_ids,
            al.num_post,
            T * K,
            H,
            I,
            R,
            S,
            nsm,
            act.stride(0),
            w2.stride(0),
            w2.stride(1),
            y.stride(0),
            BM,
            256,
            64,
            8,
            ws,
            gp,
            epi,
            num_warps=4 if ws else 8,
            num_stages=3,
        )
        torch.cuda.synchronize() if not SMALL else None
        if epi in (0, 1, 5):
            err = rel(ya[:used], ya_ref)
        elif epi == 2:
            err = rel(ya[:used], ya_ref * wrow[:, None])
        elif epi == 3:
            err = rel(y, y_ref)
        else:
            err = rel(
                y,
                y_ref * 0
                + torch.zeros_like(y_ref).index_put_((sid[ok],), (ya_ref * wrow[:, None])[ok]),
            )
        print(json.dumps({"ws": ws, "gp": gp, "epi": epi, "err": err}), flush=True)
    except Exception as e:
        print(ws, gp, epi, "FAIL", str(e)[:300], flush=True)
