"""Host time of the fp8 ws call's own Python, on the CPU machine (no GPU): every kernel launch
stubbed out (the Gluon kernels' ``kernel[grid]`` and every ``FastLauncher``), CPU tensors of
the cell's shapes, so what is timed is the argument checks, allocations, views and TMA
descriptors of ``run_experts_fp8_ws`` -- not the launches, and not CUDA allocations.

    PYTHONPATH=. python3 benchmarks/experiments/fp8-open-questions-2026-12-05/host_probe.py \
        --cells qwen3-30b-a3b:64,qwen3-30b-a3b:1024,qwen3-235b-ep8-local:2048 [--profile]

Prints, per cell, the median and lowest per-call time of 20 interleaved rounds of 100 calls
with the shared-memory layout cached (``fp8_ws_parts._smem_layout``, the shipped form) and
recomputed per descriptor (Triton's ``get_default_for``, the form before 2026-12-05 07:30
UTC); ``--profile`` adds a cProfile of the shipped form (functions by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch


def _stub_launches() -> None:
    import moerun.backends.triton.fp8_ws as ws
    import moerun.backends.triton.fp8_ws_carry as cw
    from moerun._triton import launch

    class _NoLaunch:
        def __getitem__(self, grid):
            return lambda *a, **k: None

    cw.gate_up_carry_kernel = _NoLaunch()
    cw.down_carry_kernel = _NoLaunch()
    launch.FastLauncher.__call__ = lambda self, grid, *a, **k: None
    ws.sm_count = lambda index: 132
    torch.cuda.current_device = lambda: 0  # the CPU tensors have no device index


def _call(cell: str):
    """The shipped carried form's ws call on CPU tensors of ``cell`` (``name:T``)."""
    from moerun.backends.triton.fp8_quant import quantize_rows_fp8
    from moerun.backends.triton.fp8_ws import run_experts_fp8_ws
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes

    name, t = cell.split(":")
    shape = parse_shapes(name)[0]
    e, k, h, i = shape.num_experts, shape.top_k, shape.hidden, shape.intermediate
    f8 = torch.float8_e4m3fn
    w13 = torch.empty(e, 2 * i, h, dtype=torch.uint8).view(f8)
    w2 = torch.empty(e, h, i, dtype=torch.uint8).view(f8)
    s13, s2 = torch.rand(e, 2 * i // 128, h // 128), torch.rand(e, h // 128, i // 128)
    q = quantize_rows_fp8(torch.randn(int(t), h, dtype=torch.bfloat16))
    w, ids = draw_routing(int(t), e, k, torch.Generator().manual_seed(0), "cpu")
    kw = {"gate_up_cols": 128, "down_cols": 256, "gate_up_stages": 4, "down_stages": 4,
          "group_m": 8, "out_dtype": torch.bfloat16}
    return lambda: run_experts_fp8_ws(q, w13, w2, s13, s2, w, ids, **kw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default="qwen3-30b-a3b:64,qwen3-30b-a3b:1024,"
                                       "qwen3-235b-ep8-local:2048")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    _stub_launches()
    from triton.experimental.gluon import language as gl

    import moerun.backends.triton.fp8_ws_parts as parts

    forms = {"cached": parts._smem_layout,
             "recomputed": lambda block, dtype: gl.NVMMASharedLayout.get_default_for(
                 list(block), parts._GL_DTYPES[dtype])}
    for cell in args.cells.split(","):
        fn = _call(cell)
        for _ in range(30):
            fn()
        us: dict[str, list[float]] = {f: [] for f in forms}
        for r in range(20):
            for f in (list(forms) if r % 2 == 0 else list(forms)[::-1]):
                parts._smem_layout = forms[f]
                t0 = time.perf_counter()
                for _ in range(100):
                    fn()
                us[f].append((time.perf_counter() - t0) / 100 * 1e6)
        parts._smem_layout = forms["cached"]
        print(cell, "median", {f: round(statistics.median(v), 1) for f, v in us.items()},
              "lowest", {f: round(min(v), 1) for f, v in us.items()}, flush=True)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(200):
                fn()
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
