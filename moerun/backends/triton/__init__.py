"""Triton expert kernels (``TritonExperts``). Importing this package does not import triton.

Kernel families (one file each): ``align`` (token -> expert alignment), ``gate_up`` (grouped
GEMM + ``silu(gate) * up``), ``down`` (grouped GEMM + routing weight, atomic or per-pair
output), ``combine`` (top-k sum); ``configs`` (tuned JSON lookup by the local shape),
``tune`` (``moerun tune``) with ``tune_plan`` (its candidate space, plan and file merge) and
``precompile`` (parallel compilation), ``devbench`` (per-launch diagnostics over
``moerun.bench``).
"""

from moerun.backends.triton.experts import LAUNCHES_PER_CALL, TritonExperts

__all__ = ["TritonExperts", "LAUNCHES_PER_CALL"]
