"""Launch a ``@triton.jit`` (or ``@gluon.jit``) kernel through its cached compiled handle (host
cost, issue 8).

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
* each host-side TMA descriptor's (Gluon's or ``triton.tools``') base dtype, block shape
  and shared layout (what Triton's ``tensordesc<...>`` type carries; its shape and strides
  are launch arguments, encoded per launch by the compiled launcher);
* the current CUDA device.

It falls back to the plain ``kernel[grid](...)`` path under ``TRITON_INTERPRET=1`` (CPU tests)
and whenever a Triton launch hook is installed (profilers such as proton rely on it; Triton
3.6 keeps the hooks as ``HookChain`` objects, empty by default, so "installed" means a
non-empty chain). Without hooks the launch metadata and hook arguments are ``None``, which
also spares the C launcher a Python call per launch. Not thread-safe for the first launch of
a key (two threads may both compile; harmless).

A kernel whose last parameter is ``PDL: tl.constexpr`` is a programmatic-dependent-launch
kernel (``moerun._triton.pdl``): the launcher appends that argument itself, from
:func:`~moerun._triton.pdl.pdl_enabled`, and launches with ``launch_pdl`` equal to it.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

import torch

from moerun._triton.pdl import pdl_enabled

__all__ = ["FastLauncher", "specialization_key", "cdiv", "next_pow2"]

_I32_MIN, _I32_MAX = -(2 ** 31), 2 ** 31 - 1
class _Recordings(threading.local):
    """This thread's active ``moerun._triton.program`` recording (at most one), in ``stack``;
    per thread, so a launch on another thread never reports into it."""

    def __init__(self) -> None:
        self.stack: list[Any] = []


#: launches report to ``_RECORDING.stack[-1]`` when this thread records
_RECORDING = _Recordings()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for host ints. NOTE: ``triton.cdiv`` is a constexpr function in Triton
    3.6 and costs ~2 µs per host call; launchers call this one instead."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``); a host-side
    ``triton.next_power_of_2`` without its constexpr-function overhead."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def specialization_key(args: tuple[Any, ...], kinds: tuple[int, ...]) -> tuple[Any, ...]:
    """The part of the cache key that depends on the argument values.

    ``kinds[i]``: 0 constexpr (the value itself), 1 specialised (tensor alignment, int
    ``== 1`` / ``% 16`` / width), 2 do-not-specialise (tensor: dtype only; int: width only),
    3 specialised value without alignment (tensor: dtype; int: ``== 1`` and width). A TMA
    descriptor argument contributes :func:`_desc_key` whatever its kind.
    Pure; host only.
    """
    key = []
    for a, kind in zip(args, kinds):
        if kind == 0:
            key.append(a)
        elif _is_desc(a):
            key.append(_desc_key(a))
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


def _is_desc(a: Any) -> bool:
    """Whether ``a`` is a host-side TMA descriptor (``triton.experimental.gluon.nvidia.hopper``
    or ``triton.tools.tensor_descriptor``'s ``TensorDescriptor``): a tensor ``base`` with a
    ``block_shape``. Pure."""
    return hasattr(a, "block_shape") and isinstance(getattr(a, "base", None), torch.Tensor)


def _desc_key(a: Any) -> tuple[Any, ...]:
    """A descriptor's share of the key: its type, base dtype, block shape and (Gluon) shared
    layout -- what Triton specialises a ``tensordesc`` argument on. Pure."""
    return (type(a), a.base.dtype, tuple(a.block_shape), getattr(a, "layout", None))


def _prep_function(args: tuple[Any, ...], kinds: tuple[int, ...]) -> Callable[..., tuple]:
    """A generated ``prep(args) -> (key, launch_args)`` for calls whose argument types match
    ``args``: ``key`` is :func:`specialization_key` plus every argument's type; in
    ``launch_args`` each tensor is replaced by its ``data_ptr()`` (read once, for the key and
    the launch: given an int, Triton's C launcher skips its per-pointer Python method call and
    driver query); a TMA descriptor stays itself (the compiled launcher encodes it) and keys
    by :func:`_desc_key`. Several times faster than the generic loop.

    A call with other types gets a different key (the types are in it) or raises inside the
    function (e.g. ``.data_ptr`` of an int); the launcher then uses the generic path."""
    wide = "({v} > 2147483647 or {v} < -2147483648)"
    pre, key, out = [], [], []
    for i, (a, kind) in enumerate(zip(args, kinds)):
        v = f"a[{i}]"
        if kind == 0:
            key.append(v)
            out.append(v)
            continue
        key.append(f"type({v})")
        if _is_desc(a):
            key.append(f"desc_key({v})")
            out.append(v)
            continue
        if isinstance(a, torch.Tensor):
            pre.append(f"p{i} = {v}.data_ptr()")
            key.append(f"{v}.dtype")
            if kind == 1:
                key.append(f"p{i} & 15 == 0")
            out.append(f"p{i}")
            continue
        if type(a) is int:
            if kind != 2:
                key.append(f"{v} == 1")
            if kind == 1:
                key.append(f"{v} & 15 == 0")
            key.append(wide.format(v=v))
        out.append(v)
    body = "".join(f"    {line}\n" for line in pre)
    src = f"def prep(a):\n{body}    return ({', '.join(key)},), ({', '.join(out)},)\n"
    namespace: dict[str, Any] = {"desc_key": _desc_key}
    exec(src, namespace)  # noqa: S102 - generated from the kernel's own parameter list
    return namespace["prep"]


def _direct_launch(compiled: Any) -> tuple[Callable[..., Any] | None, int, int, int]:
    """``(launch, cooperative, pdl, scratch)`` of the compiled kernel's C launcher when it can
    be called without Triton's Python wrapper (no profile scratch), else ``(None, 0, 0, 0)``;
    ``scratch``: bytes of global scratch per program (device-side TMA descriptors need it;
    the launcher allocates it from torch, see :func:`_torch_scratch`). Tied to Triton 3.6's
    ``CudaLauncher``; anything else takes the wrapper."""
    run = compiled.run
    needed = ("launch", "global_scratch_size", "profile_scratch_size",
              "launch_cooperative_grid", "launch_pdl")
    if not all(hasattr(run, n) for n in needed):
        return None, 0, 0, 0
    if run.profile_scratch_size or getattr(run, "global_scratch_align", 1) > 256:
        return None, 0, 0, 0
    scratch = run.global_scratch_size * getattr(run, "num_ctas", 1)
    return run.launch, run.launch_cooperative_grid, run.launch_pdl, scratch


def _torch_scratch(size: int, alignment: int, stream: Any) -> torch.Tensor:
    """A Triton allocator: ``size`` bytes from torch's caching allocator on the current
    stream (its blocks are 512-byte aligned, above any alignment Triton asks for), so the
    memory is stream-ordered and taken from the graph's pool under capture."""
    return torch.empty(size, dtype=torch.uint8, device="cuda")


class _allocator_scope:
    """Within it, Triton's launch-time allocator is :func:`_torch_scratch` unless the user
    set one (``triton.set_allocator``); restored on exit. For the JIT and hook paths, whose
    launches allocate the scratch through Triton's own wrapper."""

    __slots__ = ("_token", "_var")

    def __enter__(self):
        from triton.runtime import _allocation

        self._var = getattr(_allocation, "_allocator", None)
        self._token = None
        if self._var is not None and hasattr(self._var, "reset") and \
                isinstance(self._var.get(), _allocation.NullAllocator):
            self._token = self._var.set(_torch_scratch)
        return self

    def __exit__(self, *exc):
        if self._token is not None:
            self._var.reset(self._token)
        return False


def _hook_active(hook: Any) -> bool:
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)  # triton >= 3.5: a HookChain, empty by default
    return bool(calls) if calls is not None else True


def _hooks_installed(rt: Any) -> bool:
    """A Triton launch hook (enter or exit) is installed now on ``knobs.runtime``."""
    return _hook_active(rt.launch_enter_hook) or _hook_active(rt.launch_exit_hook)


class FastLauncher:
    """``launcher(grid, *args, num_warps=..., num_stages=...)`` == ``kernel[grid](*args, ...)``.

    Args:
        kernel: a ``triton.JITFunction`` (the ``@triton.jit`` object) or a Gluon kernel
            (``@gluon.jit``; its TMA descriptor arguments key by :func:`_desc_key`).

    ``args`` are *all* the kernel's parameters, positionally, constexprs included -- except
    a trailing ``PDL`` constexpr, which the launcher supplies (module docstring). Side
    effects: one kernel launch on the current CUDA stream; no host sync; capture-safe (the
    compiled launcher is what ``kernel[grid]`` would call).
    """

    __slots__ = ("_kernel", "_kinds", "_cache", "_interpret", "_runtime", "_prep", "_pdl")

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
        names = list(getattr(kernel, "arg_names", None) or ())
        #: the kernel takes a trailing ``PDL`` constexpr (``moerun._triton.pdl``)
        self._pdl = bool(names) and names[-1] == "PDL"
        self._prep: Callable[..., tuple] | None = None  # generated at the first launch
        from triton import knobs

        self._runtime = knobs.runtime  # read per launch: hooks may be installed later

    @property
    def compiled_variants(self) -> int:
        """How many specialisations have a cached compiled handle."""
        return len(self._cache)

    def __call__(self, grid: tuple[int, ...], *args: Any, num_warps: int = 4,
                 num_stages: int | None = None) -> None:
        if self._interpret:
            if self._pdl:
                args = (*args, False)
            self._kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
            if _RECORDING.stack:
                _RECORDING.stack[-1].launch(self, grid, args, num_warps, num_stages)
            return
        device = torch._C._cuda_getDevice()
        if self._pdl:
            args = (*args, pdl_enabled(device))
        if _hooks_installed(self._runtime):
            with _allocator_scope():
                self._jit(grid, args, num_warps, num_stages)
            if _RECORDING.stack:
                _RECORDING.stack[-1].launch(self, grid, args, num_warps, num_stages)
            return
        prep = self._prep
        try:
            spec, launch_args = prep(args)  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - not generated yet, or other argument types
            if prep is None:
                self._prep = prep = _prep_function(args, self._kinds)
                spec, launch_args = prep(args)
            else:
                spec = specialization_key(args, self._kinds) + tuple(type(a) for a in args)
                launch_args = args
        key = (device, num_warps, num_stages, spec)
        entry = self._cache.get(key)
        if entry is None:  # first launch of this specialisation: the JIT path compiles
            with _allocator_scope():
                compiled = self._jit(grid, args, num_warps, num_stages)
            if hasattr(compiled, "result"):  # async compilation mode returns a future
                compiled = compiled.result()
            compiled._init_handles()
            direct, coop, pdl, scratch = _direct_launch(compiled)
            self._cache[key] = (compiled, direct, coop, pdl, scratch)
            if _RECORDING.stack:
                _RECORDING.stack[-1].launch(self, grid, args, num_warps, num_stages)
            return
        compiled, direct, coop, pdl, scratch = entry
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        stream = torch._C._cuda_getCurrentRawStream(device)
        if direct is not None:
            # NOTE: per-launch global scratch (device-side TMA descriptors) comes from torch's
            # caching allocator on this stream: freed after the launch is queued, reused only
            # by work ordered after it on the stream (what Triton's allocator hook does too)
            buf = torch.empty(grid[0] * g1 * g2 * scratch, dtype=torch.uint8,
                              device=device) if scratch else None
            direct(grid[0], g1, g2, stream, compiled.function, coop, pdl, buf, None,
                   compiled.packed_metadata, None, None, None, *launch_args)
        else:
            with _allocator_scope():
                compiled.run(grid[0], g1, g2, stream, compiled.function,
                             compiled.packed_metadata, None, None, None, *launch_args)
        if _RECORDING.stack:
            _RECORDING.stack[-1].launch(self, grid, args, num_warps, num_stages)

    def _jit(self, grid: tuple[int, ...], args: tuple[Any, ...], num_warps: int,
             num_stages: int | None) -> Any:
        """``kernel[grid](*args)`` through Triton's own path (compiles on a cache miss);
        ``launch_pdl`` set from a PDL kernel's trailing argument."""
        kw: dict[str, Any] = {"num_warps": num_warps}
        if num_stages is not None:  # None: the kernel's default (the Gluon kernels pass none)
            kw["num_stages"] = num_stages
        if self._pdl and args[-1]:
            kw["launch_pdl"] = True
        return self._kernel[grid](*args, **kw)
