"""Programmatic dependent launch (PDL) for moerun's Triton kernels (Hopper and later).

Between two kernels on one stream the GPU normally drains the first, then launches the
second: at decode sizes, where a kernel lasts 5-15 µs, that boundary is a visible share of
the call. With PDL the second kernel is launched with CUDA's *programmatic stream
serialization* attribute: the launch is prepared while the first still runs, its blocks may
start when every block of the first has signalled (``griddepcontrol.launch_dependents``) or
exited, and they wait in ``griddepcontrol.wait`` until the first has completed and its
memory is visible.

The contract every PDL kernel of moerun keeps (``moerun._triton.gdc.pdl_prologue``, its
first statement): **wait first**. Nothing before the wait touches global memory, neither a
load (the previous kernel may be writing it) nor a store (it may still be reading it), so
the result is the serialized launch's, bit for bit.

No kernel signals early (no ``launch_dependents``): its dependents start as its blocks exit.
Measured on the H200 (2026-12-02, ``benchmarks/RESULTS.md``): signalling right after the wait
made the two-launch direct decode path 5-25 µs *slower* per call (qwen3-30b T=1 25.4 -> 34.2
µs, deepseek-v3 165.7 -> 190.6), while the wait alone made it faster (24.2 and 165.0) and
left the grouped cells equal or up to 1 % faster.

Wiring: a kernel opts in by ending its parameter list with ``PDL: tl.constexpr``.
:class:`~moerun._triton.launch.FastLauncher` then supplies that argument itself (callers do
not pass it) from :func:`pdl_enabled`, and sets the ``launch_pdl`` launch option to the same
value, so the attribute and the wait can never disagree. A kernel without the parameter is
launched as before.

It is on for CUDA devices of compute capability 9.0 or more, and off under
``TRITON_INTERPRET=1``, on older GPUs and with ``MOERUN_PDL=0`` (read once per process, the
escape hatch and the benchmarks' A/B switch). Works under CUDA-graph capture (the edge becomes
a programmatic dependency of the graph); dependencies across streams (events) stay full
dependencies.

This module is the host side and imports no Triton (``moerun`` imports without it); the
device side is ``moerun._triton.gdc``.
"""

from __future__ import annotations

import os

__all__ = ["pdl_enabled", "PDL_ENV"]

#: environment variable: ``0`` turns PDL off for the process (default on where supported)
PDL_ENV = "MOERUN_PDL"

_BY_DEVICE: dict[int, bool] = {}


def pdl_enabled(device: int) -> bool:
    """Whether launches on CUDA device index ``device`` use PDL: compute capability >= 9.0,
    not under the Triton interpreter, and ``MOERUN_PDL`` not ``0``. Cached per device (one
    property query at the first call); host only."""
    on = _BY_DEVICE.get(device)
    if on is None:
        if os.environ.get("TRITON_INTERPRET", "0") == "1" or \
                os.environ.get(PDL_ENV, "1") == "0":
            on = False
        else:
            import torch

            on = torch.cuda.get_device_capability(device)[0] >= 9
        _BY_DEVICE[device] = on
    return on
