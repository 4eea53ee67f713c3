"""The device side of programmatic dependent launch (``moerun._triton.pdl`` has the
contract and the host switch): the prologue every moerun kernel starts with."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

__all__ = ["pdl_prologue"]


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    """The first statement of a PDL kernel: wait for the previous kernel on the stream to
    complete, its writes visible. Compiles to nothing when ``PDL`` is false; a no-op on a
    launch without the attribute.

    NOTE: no ``gdc_launch_dependents``: the next kernel is released when this one exits
    (measured, ``moerun._triton.pdl``)."""
    if PDL:
        gdc_wait()
