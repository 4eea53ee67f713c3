"""Shared helpers of ``devbench`` and ``tune``: the benchmark matrix, inputs, ceilings,
timing, an upcast reference, and parallel pre-compilation. Device-side code; needs CUDA.

Timing (METHOD.md): warm up, then CUDA events; for ``T <= 1024`` a CUDA graph of ``R`` calls
on different pre-drawn routings is replayed and the time is per call (the serving regime);
for larger T the calls run eagerly, rotating over the same routings.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass

import torch

__all__ = [
    "SHAPES", "T_LIST", "GRAPH_MAX_T", "Shape", "Case", "make_weights", "make_case",
    "measure_ceilings", "floor_us", "time_per_call", "reference_out", "rel_err",
    "poison_allocator", "precompile",
]


@dataclass(frozen=True)
class Shape:
    name: str
    E: int
    top_k: int
    H: int
    I: int


SHAPES = {
    "mixtral8x7b": Shape("mixtral8x7b", 8, 2, 4096, 14336),
    "qwen3-30b-a3b": Shape("qwen3-30b-a3b", 128, 8, 2048, 768),
    "qwen3-235b-a22b": Shape("qwen3-235b-a22b", 128, 8, 4096, 1536),
    "deepseek-v3": Shape("deepseek-v3", 256, 8, 7168, 2048),
}
T_LIST = (1, 16, 128, 1024, 8192)
GRAPH_MAX_T = 1024
#: default ceilings (bytes/s, flop/s) -- measured again by ``measure_ceilings``.
READ_BW, BF16_FLOPS = 4.12e12, 7.74e14


def make_weights(shape: Shape, dtype=torch.bfloat16, device="cuda", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    w13 = torch.randn(shape.E, 2 * shape.I, shape.H, device=device, dtype=dtype, generator=g)
    w13.mul_(shape.H ** -0.5)
    w2 = torch.randn(shape.E, shape.H, shape.I, device=device, dtype=dtype, generator=g)
    w2.mul_(shape.I ** -0.5)
    return w13, w2


@dataclass
class Case:
    x: torch.Tensor  # [T, H]
    topk_weights: torch.Tensor  # [T, K] fp32
    topk_ids: torch.Tensor  # [T, K] int32


def make_case(shape: Shape, T: int, dtype=torch.bfloat16, device="cuda", seed=0,
              drop: float = 0.0) -> Case:
    """Uniform random routing: K distinct experts per token; ``drop`` of the ids -> -1."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(T, shape.H, device=device, dtype=dtype, generator=g)
    ids = torch.rand(T, shape.E, device=device, generator=g).topk(shape.top_k, dim=1).indices
    if drop > 0:
        ids = torch.where(torch.rand(ids.shape, device=device, generator=g) < drop,
                          torch.full_like(ids, -1), ids)
    w = torch.softmax(torch.randn(T, shape.top_k, device=device, generator=g), dim=1)
    return Case(x, w.float().contiguous(), ids.to(torch.int32).contiguous())


def measure_ceilings(device="cuda") -> dict:
    """Read bandwidth (2 GiB sum), copy bandwidth (2 GiB copy, read+write bytes), bf16
    matmul rate (8192^3, random data). Medians of 10 after warm-up."""
    n = 1 << 30  # bf16 elements = 2 GiB
    a = torch.randn(n, device=device, dtype=torch.bfloat16)
    b = torch.empty_like(a)

    def med(fn, reps=10):
        for _ in range(3):
            fn()
        ts = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) * 1e-3)
        return statistics.median(ts)

    read = 2 * n / med(lambda: a.sum(dtype=torch.float32))
    copy = 2 * 2 * n / med(lambda: b.copy_(a))
    del a, b
    m = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    m2 = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    flops = 2 * 8192 ** 3 / med(lambda: m @ m2)
    del m, m2
    torch.cuda.empty_cache()
    return {"read_bw": read, "copy_bw": copy, "bf16_flops": flops}


def floor_us(shape: Shape, T: int, hit: int, ceil: dict | None = None) -> float:
    """max(flops / peak, (hit x 3*H*I*2 + 2*T*H*2) / bandwidth), in microseconds."""
    ceil = ceil or {}
    bw = max(ceil.get("read_bw", READ_BW), ceil.get("copy_bw", 0) / 2)
    fl = ceil.get("bf16_flops", BF16_FLOPS)
    flops = 2 * T * shape.top_k * 3 * shape.H * shape.I
    byts = hit * 3 * shape.H * shape.I * 2 + 2 * T * shape.H * 2
    return max(flops / fl, byts / bw) * 1e6


def time_per_call(fns, graph: bool, reps: int = 10, warmup: int = 2) -> float:
    """Median microseconds per call of ``fns`` (a list, run in turn).

    ``graph``: capture all of them into one CUDA graph and time its replays; else eager.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            for f in fns:
                f()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for f in fns:
                f()
        g.replay()
        torch.cuda.synchronize()
        run = g.replay
    else:
        def run():
            for f in fns:
                f()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / len(fns))
    if graph:
        del g
    return statistics.median(ts)


def reference_out(x, w13, w2, topk_weights, topk_ids, acc=torch.float64):
    """``reference_moe`` math, upcasting one slot's weights at a time (no full upcast copy).

    Host sync: yes (per hit slot)."""
    m, h = x.shape
    inter = w13.shape[1] // 2
    out = torch.zeros(m, h, dtype=acc, device=x.device)
    ids = topk_ids.long()
    xa = x.to(acc)
    for s in torch.unique(ids[ids >= 0]).tolist():  # NOTE: host sync (reference only)
        if s >= w13.shape[0]:
            continue
        hit = ids == s
        rows = hit.any(1).nonzero().squeeze(1)
        w = (topk_weights.to(acc) * hit.to(acc)).sum(1)[rows]
        gu = xa[rows] @ w13[s].to(acc).t()
        y = (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]) @ w2[s].to(acc).t()
        out.index_add_(0, rows, y * w[:, None])
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("nan")
    den = r.norm().item()
    return (o - r).norm().item() / (den if den > 0 else 1.0)


def poison_allocator(nbytes: int, device="cuda") -> None:
    """Fill ``nbytes`` of fresh caching-allocator memory with NaN and free it, so buffers the
    next call allocates start as NaN (unwritten elements then show up in the error)."""
    t = torch.empty(max(1, nbytes // 4), dtype=torch.float32, device=device)
    t.fill_(float("nan"))
    del t


# ---------------------------------------------------------------- parallel compile
def _compile_one(task: str) -> str:
    """Worker: launch each kernel of one config on a 4-token problem of the real sizes, so
    Triton's on-disk cache holds the binary the real launch will ask for."""
    import time

    from moerun.backends.triton.configs import ExpertsConfig
    from moerun.backends.triton.experts import TritonExperts
    from moerun.backends.triton.configs import ConfigTable

    t0 = time.time()
    d = json.loads(task)
    dtype = getattr(torch, d["dtype"])
    cfg = ExpertsConfig.from_json(d["config"])
    H, I, K, s = d["H"], d["I"], d["top_k"], d["E"]
    # one slot's weights broadcast to S slots (stride 0 specialises like the real stride)
    w13 = torch.randn(1, 2 * I, H, device="cuda", dtype=dtype).expand(s, 2 * I, H)
    w2 = torch.randn(1, H, I, device="cuda", dtype=dtype).expand(s, H, I)
    m = 4
    x = torch.randn(m, H, device="cuda", dtype=dtype)
    ids = torch.randint(0, s, (m, K), device="cuda", dtype=torch.int32)
    w = torch.rand(m, K, device="cuda")
    try:
        TritonExperts(ConfigTable(overrides={b: cfg for b in range(1, 1 << 15)})).run_experts(
            x, w13, w2, w, ids)
        torch.cuda.synchronize()
        return f"ok {time.time() - t0:.1f}s {cfg.key()}"
    except Exception as e:  # noqa: BLE001 -- reported, the caller decides
        return f"FAIL {cfg.key()}: {type(e).__name__}: {str(e)[:200]}"


def precompile(items, workers: int | None = None) -> list[str]:
    """Compile ``items`` = [(shape, ExpertsConfig, dtype)] in parallel worker processes.

    Each distinct (H, I, K, dtype, config) compiles once; returns the workers' status lines.
    """
    import concurrent.futures as cf
    import multiprocessing as mp

    tasks = sorted({json.dumps({"E": s.E, "H": s.H, "I": s.I, "top_k": s.top_k,
                                "dtype": str(dt).replace("torch.", ""),
                                "config": c.to_json()}, sort_keys=True)
                    for s, c, dt in items})
    if not tasks:
        return []
    workers = workers or min(len(tasks), max(1, (os.cpu_count() or 2) - 2))
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
        return list(ex.map(_compile_one, tasks))


def geomean(xs) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")
