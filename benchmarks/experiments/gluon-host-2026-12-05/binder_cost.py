"""Host cost of Triton 3.6's launch-time argument binding for the Gluon ws kernels, on the CPU
machine (no GPU, no launch): the part of ``kernel[grid](...)`` a fast launcher skips.

Each call of ``JITFunction.run`` binds the arguments and derives their specialisation
(``binder``), then builds the cache key (``compute_cache_key``); with ``TensorDescriptor``
arguments the binder also describes each descriptor's block, layout and dtype. This times
those two steps, median of 2000, for three ws kernel forms with the descriptors
``run_experts_fp8_ws`` builds, and for the fp8 direct gate/up (a plain Triton kernel of a
similar argument count, launched through ``FastLauncher`` in the package).

    python3 benchmarks/experiments/gluon-host-2026-12-05/binder_cost.py
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import make_backend  # noqa: E402
from triton.runtime.jit import compute_cache_key, create_function_from_signature  # noqa: E402

from tests.test_fp8_ws_compile import _build  # noqa: E402

BACKEND = make_backend(GPUTarget("cuda", 90, 32))


def binder_us(fn, args, kw, n=2000):
    binder = create_function_from_signature(fn.signature, fn.params, BACKEND)
    cache, ts = {}, []
    for _ in range(n):
        t = time.perf_counter()
        _, spec, opts = binder(*args, **kw)
        compute_cache_key(cache, spec, opts)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def main():
    for form in ("promoted_gate_up", "carried_gate_up", "carried_down_split"):
        fn, args = _build(form, 4)
        print(f"{form}: {binder_us(fn, args, dict(num_warps=4)):.1f} us")
    from moerun.backends.triton.fp8_direct import _gate_up_fp8_direct_kernel as k

    f8 = torch.float8_e4m3fn
    x, xs = torch.empty(1, 2048, dtype=f8), torch.empty(1, 16)
    w, ws = torch.empty(128, 1536, 2048, dtype=f8), torch.empty(128, 12, 16)
    act = torch.empty(8, 768, dtype=torch.bfloat16)
    ids, z = torch.empty(1, 8, dtype=torch.int32), torch.empty(24, dtype=torch.int32)
    args = (x, xs, w, ws, act, ids, z, 24, 768, 2048, 128, 2048, 16, w.stride(0), w.stride(1),
            ws.stride(0), ws.stride(1), 768, 8, 16, 32, 128, True, 1e-12, 448.0, 16, True)
    print(f"fp8 direct gate/up (Triton): "
          f"{binder_us(k, args, dict(num_warps=4, num_stages=4)):.1f} us")


if __name__ == "__main__":
    main()
