"""L2 prefetch hints from Triton kernels (sm90+): :func:`l2_prefetch_rows`. Part of the
experiment's patch: copy to ``moerun/_triton/l2.py`` together with ``release-prefetch.diff``.

A ``cp.async.bulk.prefetch.L2.global`` asks L2 for a byte range and returns nothing: no value
any kernel computes depends on it, so a kernel may issue one before its PDL wait
(``moerun._triton.gdc``), on addresses it has not yet been allowed to read, as long as the
addresses lie inside an allocation. Not under ``TRITON_INTERPRET=1`` (the interpreter has no
inline assembly): callers turn it off where PDL is off (``moerun._triton.pdl.pdl_enabled``).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["l2_prefetch_rows"]


@triton.jit
def l2_prefetch_rows(base, offs_bytes, nbytes):
    """One bulk L2 prefetch of ``nbytes`` bytes (a multiple of 16; 0: none) at ``base +
    offs_bytes[i]`` for every element ``i`` of the int64 tensor ``offs_bytes`` (16-byte
    aligned addresses). Device code; reads and writes no value, no wait (the prefetches
    complete asynchronously); sm90+."""
    addr = base.to(tl.pointer_type(tl.int8)) + offs_bytes
    size = tl.zeros_like(offs_bytes).to(tl.int32) + nbytes
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.u32 p, $2, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)
