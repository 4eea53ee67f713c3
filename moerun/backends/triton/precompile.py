"""Compile many kernel configurations in parallel worker processes (``moerun tune``,
``devbench``), so Triton's on-disk cache holds the binaries before anything is timed:
compiling one config takes seconds, timing it milliseconds. Needs CUDA.
"""

from __future__ import annotations

import json
import os

__all__ = ["precompile"]


def _compile_one(task: str) -> str:
    """Worker: launch each kernel of one config on a 4-token problem of the real sizes (fp8:
    the layer's call, ``quantize_rows`` then ``run_experts(..., quant=)``)."""
    import time

    import torch

    from moerun.backends.triton.configs import ConfigTable, ExpertsConfig
    from moerun.backends.triton.experts import TritonExperts

    t0 = time.time()
    d = json.loads(task)
    dtype = getattr(torch, d["dtype"])
    fp8 = dtype == torch.float8_e4m3fn
    act = getattr(torch, d["act"]) if fp8 else dtype
    cfg = ExpertsConfig.from_json(d["config"])
    h, i, k, s = d["H"], d["I"], d["top_k"], d["S"]
    # one slot's weights broadcast to S slots (stride 0 specialises like the real stride)
    w13 = torch.randn(1, 2 * i, h, device="cuda", dtype=act).to(dtype).expand(s, 2 * i, h)
    w2 = torch.randn(1, h, i, device="cuda", dtype=act).to(dtype).expand(s, h, i)
    m = 4
    x = torch.randn(m, h, device="cuda", dtype=act)
    ids = torch.randint(0, s, (m, k), device="cuda", dtype=torch.int32)
    w = torch.rand(m, k, device="cuda")
    be = TritonExperts(ConfigTable(overrides={b: cfg for b in range(1, 1 << 15)}))
    try:
        if fp8:
            from moerun.quant import ExpertQuant, QuantConfig

            qc = QuantConfig()  # the scales are small: real tensors, real strides
            quant = ExpertQuant(
                config=qc, out_dtype=act,
                w13_scale=torch.rand(s, *qc.scale_shape(2 * i, h), device="cuda") + 0.5,
                w2_scale=torch.rand(s, *qc.scale_shape(h, i), device="cuda") + 0.5)
            be.run_experts(be.quantize_rows(x, qc), w13, w2, w, ids, quant=quant)
        else:
            be.run_experts(x, w13, w2, w, ids)
        torch.cuda.synchronize()
        return f"ok {time.time() - t0:.1f}s {cfg.key()}"
    except Exception as e:  # noqa: BLE001 -- reported, the caller decides
        return f"FAIL {cfg.key()}: {type(e).__name__}: {str(e)[:200]}"


def precompile(items, workers: int | None = None, activation_dtype=None) -> list[str]:
    """Compile ``items`` = ``[(BenchShape, ExpertsConfig, torch.dtype)]`` in parallel
    spawned processes (each distinct (S, H, I, K, dtype, config) once); a dtype
    ``float8_e4m3fn`` compiles the fp8 block-scaled kernels with ``activation_dtype`` rows
    (default bf16). Returns the workers' status lines (``ok ...`` or ``FAIL <config>:
    <error>``). Default workers: CPU cores - 2.

    Side effects: spawns worker processes, each launching the configs' kernels on CUDA (so
    compiling them into Triton's on-disk cache); this process does no device work."""
    import concurrent.futures as cf
    import multiprocessing as mp

    act = str(activation_dtype or "bfloat16").replace("torch.", "")
    tasks = sorted({json.dumps({"S": s.num_experts, "H": s.hidden, "I": s.intermediate,
                                "top_k": s.top_k, "dtype": str(dt).replace("torch.", ""),
                                "config": c.to_json(),
                                **({"act": act} if "float8" in str(dt) else {})},
                               sort_keys=True)
                    for s, c, dt in items})
    if not tasks:
        return []
    workers = workers or min(len(tasks), max(1, (os.cpu_count() or 2) - 2))
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
        return list(ex.map(_compile_one, tasks))
