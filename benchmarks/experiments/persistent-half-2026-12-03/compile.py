"""Offline sm90 compile of the bf16 persistent kernels (``moerun/backends/triton/persistent.py``)
on a CPU machine, with and without half tiles: shared memory, registers and spills per ptxas.

    python3 benchmarks/experiments/persistent-half-2026-12-03/compile.py
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, "benchmarks/experiments/gluon-2026-12-02")


def main() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as tcompile, make_backend
    from triton.runtime.jit import create_function_from_signature
    from ws_gemm import _ptxas_info

    from moerun.backends.triton import persistent as pm

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    bf = torch.bfloat16
    s, h, inter, r, p = 8, 1024, 512, 1024, 512
    x = torch.empty(p, h, dtype=bf)
    w13 = torch.empty(s, 2 * inter, h, dtype=bf)
    w2 = torch.empty(s, h, inter, dtype=bf)
    act = torch.empty(r, inter, dtype=bf)
    y = torch.empty(r, h, dtype=bf)
    ids = torch.empty(r, dtype=torch.int32)
    w = torch.empty(p)
    cases = []
    for stages, a_tma, half in ((3, False, False), (3, False, True), (4, False, True),
                                (3, True, True)):
        cases.append((f"gate_up st{stages} a_tma={a_tma} half={half}",
                      pm._gate_up_persistent_kernel,
                      (x, w13, act, ids, ids, ids, p, inter, h, r, s, 132,
                       x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
                       1, 128, 128, 64, 8, True, "tf32", stages, False, a_tma, half,
                       min(stages, 3), True),  # HALF_STAGES: half-tiles-wide.patch's argument
                      dict(num_warps=8, num_stages=stages)))
    for stages, half in ((3, False), (3, True), (4, True)):
        cases.append((f"down st{stages} half={half}", pm._down_persistent_kernel,
                      (act, w2, y, w, ids, ids, ids, p, h, inter, r, s, 132,
                       act.stride(0), w2.stride(0), w2.stride(1), y.stride(0),
                       128, 256, 64, 8, "tf32", stages, False, half, True),
                      dict(num_warps=8, num_stages=stages)))
    for name, fn, args, kw in cases:
        try:
            binder = create_function_from_signature(fn.signature, fn.params, backend)
            bound, spec, opts = binder(*args, **kw)
            options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, spec, opts)
            ck = tcompile(ASTSource(fn, signature, constexprs, attrs), target=target,
                          options=options.__dict__)
            ptx = ck.asm["ptx"]
            print(name, "shared", ck.metadata.shared, "wgmma", ptx.count("wgmma.mma_async"),
                  "tma_store", ptx.count("cp.async.bulk.tensor") , "ptxas", _ptxas_info(ptx),
                  flush=True)
        except Exception as e:  # noqa: BLE001
            print(name, "FAILED", str(e).splitlines()[-1][:300], flush=True)


if __name__ == "__main__":
    main()
