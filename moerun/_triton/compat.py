"""Work-arounds for the installed Triton, applied when a kernel module is imported.

NOTE: Triton 3.6's interpreter converts scalar kernel arguments (1-element numpy arrays) to
Python ints with ``int(array)``, which numpy >= 2.4 refuses ("only 0-dimensional arrays can be
converted to Python scalars"), so any ``range(..., n, ...)`` over a runtime size fails under
``TRITON_INTERPRET=1``. Fixed upstream by triton-lang/triton#9172 (issue #9171); until the
pinned Triton has it, :func:`patch_interpreter` squeezes the array first. Compiled kernels
are unaffected; nothing happens without ``TRITON_INTERPRET=1``.
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
