"""Offline sm90 compile of the shipped ws kernels (``moerun/backends/triton/fp8_ws.py``) on a
CPU machine: shared memory, wgmma count, registers and spills per ptxas.

    python3 benchmarks/experiments/fp8-ws-2026-12-02/compile_ws.py
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, "benchmarks/experiments/gluon-2026-12-02")


def main() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as tcompile, make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature
    from ws_gemm import _ptxas_info

    from moerun.backends.triton import fp8_ws as ws

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    f8 = torch.float8_e4m3fn
    s, h, inter, r, p = 8, 1024, 512, 1024, 512
    a = torch.empty(r, h, dtype=torch.uint8).view(f8)
    w13 = torch.empty(s * 2 * inter, h, dtype=torch.uint8).view(f8)
    w2 = torch.empty(s * h, inter, dtype=torch.uint8).view(f8)
    qa = torch.empty(r, inter, dtype=torch.uint8).view(f8)
    a_s = torch.empty(r, h // 128)
    qa_s = torch.empty(r, inter // 128)
    s13 = torch.empty(s, 2 * inter // 128, h // 128)
    s2 = torch.empty(s, h // 128, inter // 128)
    ids = torch.empty(r, dtype=torch.int32)
    ya = torch.empty(r, h, dtype=torch.bfloat16)
    w = torch.empty(p)
    act = torch.empty(r, inter, dtype=torch.bfloat16)
    for stages in (4,):
        cases = [
            (ws._gate_up_kernel, (ws._desc(a, [64, 128]), ws._desc(w13, [64, 128]),
                                  ws._desc(c, [64, 64]), a_s, s13, qa_s, ids, ids, ids, p, inter,
                                  h, a_s.stride(0), s13.stride(0), s13.stride(1),
                                  qa_s.stride(0), 64, stages, 8, fuse, 2))
            for c, fuse in ((qa, True), (act, False))
        ] + [
            (ws._down_kernel, (ws._desc(qa, [64, 128]), ws._desc(w2, [128, 128]),
                               ws._desc(ya, [64, 128]), w, ids, qa_s, s2, ids, ids, h, inter,
                               qa_s.stride(0), s2.stride(0), s2.stride(1), p, 128, stages, 8)),
        ]
        for fn, args in cases:
            binder = create_function_from_signature(fn.signature, fn.params, backend)
            bound, spec, opts = binder(*args, num_warps=4)
            options, signature, constexprs, attrs = fn._pack_args(backend, {"num_warps": 4},
                                                                  bound, spec, opts)
            ck = tcompile(GluonASTSource(fn, signature, constexprs, attrs), target=target,
                          options=options.__dict__)
            ptx = ck.asm["ptx"]
            print(fn.fn.__name__, "stages", stages, "shared", ck.metadata.shared, "wgmma",
                  ptx.count("wgmma.mma_async"), "ptxas", _ptxas_info(ptx), flush=True)


if __name__ == "__main__":
    main()
