"""Offline sm90 builds for CPU tests: a ``@triton.jit`` or ``@gluon.jit`` kernel compiled for
an H100/H200 with Triton's own compiler and ptxas, with no GPU and no launch, and what ptxas
reports of the result. Used by the tests that check device code where no device is at hand
(``test_fp8_ws_compile.py``, ``test_prefetch.py``)."""

from __future__ import annotations

import os
import re
import subprocess


def compile_sm90(fn, args, *, num_warps: int = 4, num_stages: int | None = None,
                 maxnreg: int | None = None):
    """``fn[grid](*args, num_warps=, num_stages=, maxnreg=)``'s compile for sm90 (a Gluon
    kernel through Gluon's source class; None: Triton's default): the ``CompiledKernel``
    (``.asm["ptx"]``, ``.asm["cubin"]``, ``.metadata.shared``). Raises Triton's error (a
    ``PTXASError`` naming the ptxas message) for a kernel ptxas refuses."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.compiler import compile as tcompile
    from triton.runtime.jit import create_function_from_signature

    source_cls = ASTSource
    if type(fn).__module__.startswith("triton.experimental.gluon"):
        from triton.experimental.gluon._runtime import GluonASTSource as source_cls
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    kw = {"num_warps": num_warps}
    for name, value in (("num_stages", num_stages), ("maxnreg", maxnreg)):
        if value is not None:
            kw[name] = value
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, opts = binder(*args, **kw)
    options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, spec, opts)
    return tcompile(source_cls(fn, signature, constexprs, attrs), target=target,
                    options=options.__dict__)


def ptxas_report(ptx: str, tmp_path) -> tuple[int, int]:
    """``(registers, spill store bytes)`` ptxas reports for ``ptx`` (sm_90a)."""
    from triton.backends.nvidia import compiler as nvc

    src = os.path.join(tmp_path, "k.ptx")
    with open(src, "w") as f:
        f.write(ptx)
    r = subprocess.run([nvc.get_ptxas(90).path, "-v", "--gpu-name=sm_90a", src, "-o",
                        os.path.join(tmp_path, "k.o")], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stderr[-500:]
    regs = re.findall(r"Used (\d+) registers", r.stderr)
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert regs and spills, r.stderr[-500:]
    return max(int(x) for x in regs), sum(int(x) for x in spills)
