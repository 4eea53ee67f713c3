"""Work-arounds for the installed Triton, applied when a kernel module is imported.

NOTE: Triton 3.6's interpreter converts scalar kernel arguments (1-element numpy arrays) to
Python ints with ``int(array)``, which numpy >= 2.4 refuses ("only 0-dimensional arrays can be
converted to Python scalars"), so any ``range(..., n, ...)`` over a runtime size fails under
``TRITON_INTERPRET=1``. Fixed upstream by triton-lang/triton#9172 (issue #9171); until the
pinned Triton has it, :func:`patch_interpreter` squeezes the array first. Compiled kernels
are unaffected; nothing happens without ``TRITON_INTERPRET=1``.

NOTE: the same interpreter's float downcast to fp8 (``x.to(tl.float8e4nv)``) rounds the
mantissa without carrying into the exponent, so a value just below a power of two comes out
as half of it (31.4 -> 16 instead of 32: about 3 % of random values). Compiled kernels use the
hardware's round-to-nearest-even conversion. :func:`patch_interpreter` routes fp32/fp16/bf16
-> e4m3fn/e5m2 downcasts through torch's conversion (round to nearest even), which is what
the hardware and ``moerun.quant`` compute for values inside the fp8 range (callers clamp to
it first).
"""

from __future__ import annotations

import os

__all__ = ["patch_interpreter"]

_done = False


def patch_interpreter() -> None:
    global _done
    if _done or os.environ.get("TRITON_INTERPRET", "0") != "1":
        return
    _done = True
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_moerun_fixed", False):
        return

    def _index(self):
        return int(self.handle.data.reshape(-1)[0])

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", _index)

    patched._moerun_fixed = True
    interpreter._patch_lang_tensor = patched
    _patch_fp8_downcast(interpreter)


def _patch_fp8_downcast(interpreter) -> None:
    import numpy as np
    import torch
    import triton.language as tl

    builder = interpreter.InterpreterBuilder
    original = builder.create_fp_to_fp
    if getattr(original, "_moerun_fixed", False):
        return
    targets = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}
    sources = {tl.float32: torch.float32, tl.float16: torch.float16}

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        dst = targets.get(dst_type.scalar)
        if dst is None or src.dtype.scalar not in sources:
            return original(self, src, dst_type, rounding_mode)
        data = torch.from_numpy(np.ascontiguousarray(src.data)).to(dst).view(torch.uint8)
        return interpreter.TensorHandle(data.numpy(), dst_type.scalar)

    create_fp_to_fp._moerun_fixed = True
    builder.create_fp_to_fp = create_fp_to_fp
