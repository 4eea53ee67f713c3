"""Offline sm90 compile (CPU machine) of the shipped gate/up persistent kernel and the
one-dot form of ``kernel.py``: shared memory, wgmma shapes, layout conversions, registers.

    python3 benchmarks/experiments/gateup-n256-2026-12-03/compile.py
"""

from __future__ import annotations

import re
import sys

import torch

sys.path.insert(0, "benchmarks/experiments/gluon-2026-12-02")
sys.path.insert(0, "benchmarks/experiments/gateup-n256-2026-12-03")


def main() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as tcompile, make_backend
    from triton.runtime.jit import create_function_from_signature
    from ws_gemm import _ptxas_info

    import kernel as kn
    from moerun.backends.triton import persistent as pm

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    bf = torch.bfloat16
    s, h, inter, r, p = 8, 1024, 512, 1024, 512
    x = torch.empty(p, h, dtype=bf)
    w13 = torch.empty(s, 2 * inter, h, dtype=bf)
    act = torch.empty(r, inter, dtype=bf)
    ids = torch.empty(r, dtype=torch.int32)
    for name, fn in (("shipped", pm._gate_up_persistent_kernel), ("one-dot", kn.gate_up_n2_kernel)):
        for stages, bn, a_tma in ((3, 128, False), (4, 128, False), (3, 128, True), (3, 64, False)):
            args = (x, w13, act, ids, ids, ids, p, inter, h, r, s, 132,
                    x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
                    1, 128, bn, 64, 8, True, "tf32", stages, False, a_tma, True)
            kw = dict(num_warps=8, num_stages=stages)
            tag = f"{name} st{stages} bn{bn} a_tma={a_tma}"
            try:
                binder = create_function_from_signature(fn.signature, fn.params, backend)
                bound, spec, opts = binder(*args, **kw)
                options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, spec,
                                                                      opts)
                ck = tcompile(ASTSource(fn, signature, constexprs, attrs), target=target,
                              options=options.__dict__)
                ptx, ttgir = ck.asm["ptx"], ck.asm["ttgir"]
                shapes = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)",
                                               ptx)))
                print(tag, "shared", ck.metadata.shared, "wgmma", shapes,
                      "convert_layout", ttgir.count("ttg.convert_layout"),
                      "local_alloc", ttgir.count("ttg.local_alloc"), "ptxas", _ptxas_info(ptx),
                      flush=True)
                if "--ttgir" in sys.argv and name == "one-dot" and stages == 3 and bn == 128 \
                        and not a_tma:
                    print(ttgir)
            except Exception as e:  # noqa: BLE001
                print(tag, "FAILED", str(e).splitlines()[-1][:300], flush=True)


if __name__ == "__main__":
    main()
