"""Offline sm90 compile (CPU machine) of the shipped persistent kernels (gate/up as one dot
since 2026-12-03) at 64-row blocks and 4 warps (one warp group): shared memory, wgmma shapes,
registers and spills, against the 128-row, 8-warp form.

    python3 benchmarks/experiments/gateup-n256-2026-12-03/compile64.py
"""

from __future__ import annotations

import re
import sys

import torch

sys.path.insert(0, "benchmarks/experiments/gluon-2026-12-02")


def _compile(fn, args, kw):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as tcompile, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, opts = binder(*args, **kw)
    options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, spec, opts)
    return tcompile(ASTSource(fn, signature, constexprs, attrs), target=target,
                    options=options.__dict__)


def main() -> None:
    from ws_gemm import _ptxas_info

    from moerun.backends.triton import persistent as pm

    bf = torch.bfloat16
    s, h, inter, r, p = 8, 1024, 512, 1024, 512
    x = torch.empty(p, h, dtype=bf)
    w13 = torch.empty(s, 2 * inter, h, dtype=bf)
    w2 = torch.empty(s, h, inter, dtype=bf)
    act = torch.empty(r, inter, dtype=bf)
    y = torch.empty(r, h, dtype=bf)
    ids = torch.empty(r, dtype=torch.int32)
    w = torch.empty(p)
    for bm, warps in ((128, 8), (64, 4)):
        for stages in (3, 4):
            gu = (x, w13, act, ids, ids, ids, p, inter, h, r, s, 132,
                  x.stride(0), w13.stride(0), w13.stride(1), act.stride(0),
                  1, bm, 128, 64, 8, True, "tf32", stages, False, False, True)
            for bn in (256, 128):
                dn = (act, w2, y, w, ids, ids, ids, p, h, inter, r, s, 132,
                      act.stride(0), w2.stride(0), w2.stride(1), y.stride(0),
                      bm, bn, 64, 8, "tf32", stages, False, True)
                for name, fn, args in (("gate_up bn128", pm._gate_up_persistent_kernel, gu),
                                       (f"down bn{bn}", pm._down_persistent_kernel, dn)):
                    if name.startswith("gate_up") and bn == 128:
                        continue
                    tag = f"bm{bm} w{warps} st{stages} {name}"
                    try:
                        ck = _compile(fn, args, dict(num_warps=warps, num_stages=stages))
                        ptx = ck.asm["ptx"]
                        shapes = sorted(set(re.findall(
                            r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)))
                        print(tag, "shared", ck.metadata.shared, "wgmma", shapes, "ptxas",
                              _ptxas_info(ptx), flush=True)
                    except Exception as e:  # noqa: BLE001
                        print(tag, "FAILED", str(e).splitlines()[-1][:300], flush=True)


if __name__ == "__main__":
    main()
