"""Launch a ``@triton.jit`` kernel through its cached compiled handle (host cost, issue 8).

``kernel[grid](*args)`` re-binds the arguments, re-derives their specialisation, builds a
cache key (including ``str(options)``), checks the kernel's globals and builds launch
metadata on every call: about 12 µs of host time per launch on the H200 machine. A
:class:`FastLauncher` does that once per *specialisation* and afterwards calls the compiled
kernel's launcher directly.

Correctness rests on the key: it holds everything Triton 3.6 specialises on (checked against
``native_specialize_impl`` by a CPU test), so a call never reuses a binary compiled under
other assumptions:

* every constexpr argument's value and the launch options (``num_warps``, ``num_stages``);
* each tensor's dtype, and whether its ``data_ptr`` is 16-byte aligned (unless the parameter
  opts out of alignment specialisation);
* each specialised int: ``== 1`` (Triton turns it into a constexpr), ``% 16 == 0`` and
  whether it needs 64 bits; a ``do_not_specialize`` int only its width;
* the current CUDA device.

It falls back to the plain ``kernel[grid](...)`` path under ``TRITON_INTERPRET=1`` (CPU tests)
and whenever a Triton launch hook is installed (profilers such as proton rely on it). Not
thread-safe for the first launch of a key (two threads may both compile; harmless).
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["FastLauncher", "specialization_key"]

_I32_MIN, _I32_MAX = -(2 ** 31), 2 ** 31 - 1


def specialization_key(args: tuple[Any, ...], kinds: tuple[int, ...]) -> tuple[Any, ...]:
    """The part of the cache key that depends on the argument values.

    ``kinds[i]``: 0 constexpr (the value itself), 1 specialised (tensor alignment, int
    ``== 1`` / ``% 16`` / width), 2 do-not-specialise (tensor: dtype only; int: width only),
    3 specialised value without alignment (tensor: dtype; int: ``== 1`` and width).
    Pure; host only.
    """
    key = []
    for a, kind in zip(args, kinds):
        if kind == 0:
            key.append(a)
        elif isinstance(a, torch.Tensor):
            key.append((a.dtype, kind == 1 and a.data_ptr() & 15 == 0))
        elif type(a) is int:
            wide = a < _I32_MIN or a > _I32_MAX
            if kind == 2:
                key.append(wide)
            elif kind == 1:
                key.append((a == 1, a & 15 == 0, wide))
            else:
                key.append((a == 1, wide))
        else:  # float, bool, None: the type is the whole specialisation
            key.append(type(a))
    return tuple(key)


class FastLauncher:
    """``launcher(grid, *args, num_warps=..., num_stages=...)`` == ``kernel[grid](*args, ...)``.

    Args:
        kernel: a ``triton.JITFunction`` (the ``@triton.jit`` object).

    ``args`` are *all* the kernel's parameters, positionally, constexprs included. Side
    effects: one kernel launch on the current CUDA stream; no host sync; capture-safe (the
    compiled launcher is what ``kernel[grid]`` would call).
    """

    __slots__ = ("_kernel", "_kinds", "_cache", "_interpret")

    def __init__(self, kernel: Any) -> None:
        self._kernel = kernel
        self._cache: dict[tuple[Any, ...], Any] = {}
        self._interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
        kinds = []
        for p in getattr(kernel, "params", ()):  # an InterpretedFunction has none
            if p.is_constexpr:
                kinds.append(0)
            elif p.do_not_specialize:
                kinds.append(2)
            elif getattr(p, "do_not_specialize_on_alignment", False):
                kinds.append(3)
            else:
                kinds.append(1)
        self._kinds = tuple(kinds)

    @property
    def compiled_variants(self) -> int:
        """How many specialisations have a cached compiled handle."""
        return len(self._cache)

    def __call__(self, grid: tuple[int, ...], *args: Any, num_warps: int = 4,
                 num_stages: int | None = None) -> None:
        if self._interpret:
            self._kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
            return
        from triton import knobs

        if knobs.runtime.launch_enter_hook is not None \
                or knobs.runtime.launch_exit_hook is not None:
            self._kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
            return
        device = torch.cuda.current_device()
        key = (device, num_warps, num_stages, specialization_key(args, self._kinds))
        compiled = self._cache.get(key)
        if compiled is None:  # first launch of this specialisation: the JIT path compiles
            compiled = self._kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
            if hasattr(compiled, "result"):  # async compilation mode returns a future
                compiled = compiled.result()
            compiled._init_handles()
            self._cache[key] = compiled
            return
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        stream = torch._C._cuda_getCurrentRawStream(device)
        compiled.run(grid[0], g1, g2, stream, compiled.function, compiled.packed_metadata,
                     None, None, None, *args)
