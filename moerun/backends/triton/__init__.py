"""Triton expert kernels (``TritonExperts``). Importing this package does not import triton.

Kernel families (one file each): ``align`` (token -> expert alignment), ``gate_up`` (grouped
GEMM + ``silu(gate) * up``), ``down`` (grouped GEMM + routing weight, atomic or per-pair
output), ``combine`` (top-k sum); ``configs`` (tuned JSON lookup), ``tune`` (``moerun tune``),
``devbench`` (the device benchmark).
"""

from moerun.backends.triton.experts import LAUNCHES_PER_CALL, TritonExperts

__all__ = ["TritonExperts", "LAUNCHES_PER_CALL"]
