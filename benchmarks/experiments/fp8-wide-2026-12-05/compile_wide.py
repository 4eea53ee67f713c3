"""Offline sm90 compile (CPU machine) of ``ws_wide.py``'s kernels and the shipped ws kernels:
shared memory, wgmma shapes, registers and spills per ptxas.

    python3 benchmarks/experiments/fp8-wide-2026-12-05/compile_wide.py
"""

from __future__ import annotations

import os
import re
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "gluon-2026-12-02"))


def _compile(fn, args):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as tcompile, make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, opts = binder(*args, num_warps=4)
    options, signature, constexprs, attrs = fn._pack_args(backend, {"num_warps": 4}, bound,
                                                          spec, opts)
    return tcompile(GluonASTSource(fn, signature, constexprs, attrs), target=target,
                    options=options.__dict__)


def main() -> None:
    import ws_wide as ww
    from ws_gemm import _ptxas_info

    from moerun.backends.triton.fp8_ws import _desc

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
    cases = []
    for st in (3, 4):
        cases.append((f"gate_up wide st{st}", ww.gate_up_wide_kernel,
                      (_desc(a, [64, 128]), _desc(w13, [128, 128]), _desc(qa, [64, 128]), a_s,
                       s13, qa_s, ids, ids, ids, p, inter, h, a_s.stride(0), s13.stride(0),
                       s13.stride(1), qa_s.stride(0), st, 8, 2)))
        for split in (False, True):
            cases.append((f"down wide st{st} split{int(split)}", ww.down_wide_kernel,
                          (_desc(qa, [64, 128]), _desc(w2, [256, 128]),
                           _desc(ya, [64, 128 if split else 256]), w, ids, qa_s, s2, ids, ids,
                           h, inter, qa_s.stride(0), s2.stride(0), s2.stride(1), p, st, 8,
                           split)))
    for name, fn, args in cases:
        try:
            ck = _compile(fn, args)
        except Exception as e:  # noqa: BLE001
            print(name, "FAILED", str(e)[-1500:], flush=True)
            continue
        ptx = ck.asm["ptx"]
        shapes = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))
        print(name, "shared", ck.metadata.shared, "wgmma", shapes,
              "mul.f32", ptx.count("mul.f32"), "selp.f32", ptx.count("selp.f32"),
              "div", ptx.count("div."), "ptxas", _ptxas_info(ptx), flush=True)


if __name__ == "__main__":
    main()
