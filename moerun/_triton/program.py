"""Launch programs: one call's allocations and Triton launches, replayed without its Python.

A decode step is host-bound (DESIGN 3): after :class:`~moerun._triton.launch.FastLauncher`,
what is left of a kernel wrapper's host time is Python -- argument checks, size arithmetic,
views, the launcher's argument preparation -- repeated on every call although, for a given
call shape, every one of those values is the same. A :class:`Program` is that call with the
Python taken out:

    record (one normal call, watched) -> build (resolve pointers, generate code) -> replay

* **record**: the wrapper runs once as usual inside :func:`record`. A ``TorchDispatchMode``
  sees every torch op (allocations, views, dtype casts, compute ops) and every
  ``FastLauncher`` launch reports its grid and arguments.
* **build**: every tensor argument of a launch is resolved to an *input* of the call or to an
  allocation the call made (by address: the most recent allocation holding the pointer, else
  the input starting at it), with its byte offset; everything else is a constant. A call that
  does anything else -- a host sync, a torch op outside the replayed set (:data:`_COMPUTE`:
  GEMMs and a few elementwise ops whose outputs depend on shapes and values only), a launch
  with per-launch scratch or through Triton's wrapper, a pointer nobody owns -- is refused
  (``build`` returns None).
* **replay**: a generated function that reads the inputs' pointers, redoes the allocations
  (``torch.empty`` / ``torch.zeros``; the buffers only launches read share one allocation,
  512-byte aligned parts), the dtype casts and the compute ops (the same aten op on the
  replay's tensors), and calls each compiled kernel's C launcher with the recorded
  constants. Same kernels, same arguments, same stream: the result is the normal call's,
  bit for bit.

The caller owns the cache and its key, which must determine every host-side value the
recorded call computed: the inputs' shapes, strides, dtypes, devices and pointer alignment
(16 bytes: Triton specialises on it), and any configuration the call looked up. Weights are
inputs like any other (their pointers are read per call), so nothing long-lived is baked in.
A program does not run while a Triton launch hook is installed or on another device than it
was recorded on (:meth:`Program.__call__` returns None: take the normal path). A recording
watches its own thread only (torch's dispatch modes and the launch report are per thread);
a :class:`ProgramCache` itself is not locked (one thread per layer). No host sync; replay is
capture-safe (allocations come from the graph's pool, launches are the compiled launchers
``FastLauncher`` calls).
"""

from __future__ import annotations

import dataclasses
import gc
import os
from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from moerun._triton import launch as _launch

__all__ = ["Program", "Recording", "record", "build", "ProgramCache", "layout_key"]

_aten = torch.ops.aten
_POOL_ALIGN = 512  # bytes; what torch's caching allocator aligns blocks to
#: torch ops a program replays (allocations and dtype casts); views are resolved by address
_REPLAYED = {_aten.empty.memory_format: "empty", _aten.zeros.default: "zeros",
             _aten._to_copy.default: "cast"}
#: device compute ops a program replays as calls of the same op on the replay's tensors:
#: each output is a function of the inputs' values and of shapes only (no host sync, no
#: value-dependent shape). The cuBLAS GEMMs and elementwise ops of the shared expert.
_COMPUTE = frozenset({_aten.mm.default, _aten.addmm.default, _aten.add.Tensor,
                      _aten.mul.Tensor, _aten.silu.default, _aten.sigmoid.default,
                      _aten.cat.default})
#: the in-place ones (they return their first argument)
_INPLACE = frozenset({_aten.add_.Tensor, _aten.mul_.Tensor})


@dataclasses.dataclass(frozen=True, slots=True)
class _Op:
    func: Any
    args: tuple
    kwargs: dict
    out: torch.Tensor


@dataclasses.dataclass(frozen=True, slots=True)
class _Launch:
    launcher: Any  # the FastLauncher
    grid: tuple[int, ...]
    args: tuple
    num_warps: int
    num_stages: int | None


@dataclasses.dataclass(slots=True)
class Recording:
    """What one watched call did: ``events`` (ops and launches, in order), ``refused`` (why
    it cannot be replayed, or None) and the CUDA ``device`` index its launches used."""

    events: list = dataclasses.field(default_factory=list)
    refused: str | None = None
    device: int | None = None

    def launch(self, launcher: Any, grid: tuple[int, ...], args: tuple, num_warps: int,
               num_stages: int | None) -> None:
        """Called by ``FastLauncher`` after each launch while this recording is active."""
        if launcher._interpret:  # the interpreter: nothing compiled to replay
            self.refused = "a launch under TRITON_INTERPRET=1"
            return
        if any(_launch._is_desc(a) for a in args):  # its tensor is inside: not remapped
            self.refused = "a launch with a TMA descriptor argument"
            return
        dev = torch._C._cuda_getDevice()
        if self.device is None:
            self.device = dev
        elif dev != self.device:
            self.refused = "launches on two devices"
        self.events.append(_Launch(launcher, tuple(grid), args, num_warps, num_stages))


class _Watch(TorchDispatchMode):
    def __init__(self, rec: Recording) -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _REPLAYED or func in _COMPUTE or func in _INPLACE:
            self.rec.events.append(_Op(func, args, kwargs, out))
        elif not func.is_view and self.rec.refused is None:
            self.rec.refused = f"{func} is not replayed by a program"
        return out


def record(fn: Callable[[], Any]) -> tuple[Any, Recording]:
    """Run ``fn()`` normally, watching its torch ops and ``FastLauncher`` launches. Returns
    ``(fn's result, the Recording)``. Same side effects as ``fn()`` (plus the watch's host
    time); refuses nested recordings (RuntimeError)."""
    if _launch._RECORDING.stack:
        raise RuntimeError("a program recording is already active")
    rec = Recording()
    _launch._RECORDING.stack.append(rec)
    collecting = gc.isenabled()
    # NOTE: no garbage collection while watching: a finalizer run by it would put its torch
    # ops into the recording (and a CUDA object's destructor inside a dispatch mode has been
    # seen to abort the process: torch 2.11, a green context's)
    gc.disable()
    try:
        with _Watch(rec):
            out = fn()
    finally:
        if collecting:
            gc.enable()
        _launch._RECORDING.stack.pop()
    return out, rec


class _Refused(Exception):
    pass


def _extent(t: torch.Tensor) -> int:
    """Bytes from ``t.data_ptr()`` to one past its last element (0 for an empty tensor)."""
    if t.numel() == 0:
        return 0
    last = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))
    return (last + 1) * t.element_size()


class Program:
    """A replayable call (see the module docstring); build it with :func:`build`.

    ``program(*inputs)`` -> the call's outputs (a tuple, in the order given to :func:`build`),
    or None when it cannot run now (a Triton launch hook is installed, or the current device
    is not the recorded one): the caller then takes the normal path. ``inputs`` must match
    the recorded ones in everything the caller's cache key covers."""

    __slots__ = ("_run", "_runtime", "device", "num_launches", "source")

    def __init__(self, run: Callable[..., tuple], runtime: Any, device: int | None,
                 num_launches: int, source: str) -> None:
        self._run = run
        self._runtime = runtime  # triton.knobs.runtime (its launch hooks), None: no launch
        self.device = device
        self.num_launches = num_launches
        self.source = source  # the generated code, for debugging

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        if self._runtime is not None and (_launch._hooks_installed(self._runtime)
                                          or torch._C._cuda_getDevice() != self.device):
            return None
        return self._run(*inputs)


def build(rec: Recording, inputs: Sequence[torch.Tensor],
          outputs: Sequence[torch.Tensor]) -> Program | None:
    """The :class:`Program` replaying ``rec``, whose call read ``inputs`` and returned
    ``outputs`` (tensors the call allocated or cast); None if the call cannot be replayed
    (see the module docstring). Host only."""
    try:
        return _build(rec, list(inputs), list(outputs))
    except _Refused:
        return None


def _build(rec: Recording, inputs: list, outputs: list) -> Program:
    if rec.refused is not None:
        raise _Refused(rec.refused)
    ns: dict[str, Any] = {"_torch": torch,
                          "_stream": getattr(torch._C, "_cuda_getCurrentRawStream", None)}
    by_id: dict[int, str] = {}  # id(input) -> its name in the generated code
    regions: list[tuple[int, int, str]] = []  # allocations: (start, end, name), in order
    lines: list[str] = []
    ptrs_needed: set[str] = set()
    for i, t in enumerate(inputs):
        by_id[id(t)] = f"i{i}"
    in_starts: dict[int, str] = {}
    for i, t in enumerate(inputs):
        p = t.data_ptr()
        if p in in_starts:  # two inputs at one address: which one a pointer means is unknown
            raise _Refused("two inputs start at one address")
        in_starts[p] = f"i{i}"
    in_ranges = [(t.data_ptr(), t.data_ptr() + _extent(t), f"i{i}")
                 for i, t in enumerate(inputs)]

    def const(value: Any) -> str:
        if value is None or type(value) in (int, bool):
            return repr(value)  # a literal: no global lookup per replay
        name = f"c{len(ns)}"
        ns[name] = value
        return name

    dtypes: dict[str, torch.dtype] = {f"i{i}": t.dtype for i, t in enumerate(inputs)}
    layouts: dict[str, tuple] = {}  # op output name -> (shape, stride, dtype)
    materialized: set[str] = set()  # allocations an op or the caller reads as a tensor
    scratch_allocs: dict[str, tuple[int, Any]] = {}  # torch.empty name -> (bytes, device)

    def tensor_ref(t: torch.Tensor) -> str:
        """The expression for ``t``: an input or op output by identity, else a view of the
        newest allocation (or the input) its address falls in, rebuilt by ``as_strided``."""
        name = by_id.get(id(t))
        if name is not None:
            return name
        p = t.data_ptr()
        base = start = None
        for s0, e0, n0 in reversed(regions):
            if s0 <= p < e0 or p == s0:
                base, start = n0, s0
                materialized.add(n0)
                if p == s0 and layouts[n0] == (t.shape, t.stride(), t.dtype):
                    return n0  # the op's output itself (the mode hands back other objects)
                break
        if base is None:
            inside = [n for s0, e0, n in in_ranges if s0 <= p < e0]
            if len(inside) == 1:
                base, start = inside[0], inputs[int(inside[0][1:])].data_ptr()
        if base is None or dtypes[base] != t.dtype or (p - start) % t.element_size():
            raise _Refused("an op reads a tensor that is neither an input nor an allocation")
        off = (p - start) // t.element_size()
        offset = f"{base}.storage_offset() + {off}" if base.startswith("i") else str(off)
        return (f"{base}.as_strided({const(tuple(t.shape))}, {const(tuple(t.stride()))}, "
                f"{offset})")

    def pointer(p: int) -> str:
        for start, end, name in reversed(regions):  # the newest allocation holding p
            if start <= p < end or p == start:
                ptrs_needed.add(name)
                return f"p_{name}" if p == start else f"(p_{name} + {p - start})"
        name = in_starts.get(p)
        if name is None:
            inside = [n for s, e, n in in_ranges if s <= p < e]
            if len(inside) != 1:
                raise _Refused("a launch pointer that no input or allocation owns")
            name = inside[0]
            start = inputs[int(name[1:])].data_ptr()
            ptrs_needed.add(name)
            return f"(p_{name} + {p - start})"
        ptrs_needed.add(name)
        return f"p_{name}"

    body: list[tuple[str, str | None]] = []  # (line, the name it defines)
    launches, runtime = 0, None

    def value(v: Any) -> str:
        """A compute op's argument: a tensor expression, a list of them, or a constant."""
        if isinstance(v, torch.Tensor):
            return tensor_ref(v)
        if isinstance(v, (list, tuple)) and any(isinstance(a, torch.Tensor) for a in v):
            inner = ", ".join(value(a) for a in v)
            return f"[{inner}]" if isinstance(v, list) else f"({inner},)"
        return const(v)

    for n, ev in enumerate(rec.events):
        if isinstance(ev, _Op) and ev.func not in _REPLAYED:  # a compute op: call it again
            if not isinstance(ev.out, torch.Tensor):
                raise _Refused(f"{ev.func} returned {type(ev.out).__name__}")
            call = ", ".join([value(a) for a in ev.args]
                             + [f"{k}={value(v)}" for k, v in ev.kwargs.items()])
            op = const(ev.func)
            if ev.func in _INPLACE:  # writes its first argument, which it returns
                if ev.out.data_ptr() != ev.args[0].data_ptr():
                    raise _Refused(f"{ev.func} did not return its first argument")
                body.append((f"{op}({call})", None))
                continue
            name = f"v{n}"
            body.append((f"{name} = {op}({call})", name))
            st = ev.out.untyped_storage()
            regions.append((st.data_ptr(), st.data_ptr() + st.nbytes(), name))
            materialized.add(name)
            dtypes[name] = ev.out.dtype
            layouts[name] = (ev.out.shape, ev.out.stride(), ev.out.dtype)
            continue
        if isinstance(ev, _Op):
            name = f"v{n}"
            kind = _REPLAYED[ev.func]
            if kind in ("empty", "zeros"):
                kw = {k: v for k, v in ev.kwargs.items() if k in ("dtype", "device")}
                if set(ev.kwargs) - {"dtype", "device", "pin_memory", "layout",
                                     "memory_format"} or ev.kwargs.get("pin_memory"):
                    raise _Refused(f"{ev.func} with {ev.kwargs}")
                fn = "_torch.empty" if kind == "empty" else "_torch.zeros"
                size = const(tuple(ev.args[0]))
                body.append((f"{name} = {fn}({size}, dtype={const(kw.get('dtype'))}, "
                             f"device={const(kw.get('device'))})", name))
                st = ev.out.untyped_storage()
                regions.append((st.data_ptr(), st.data_ptr() + st.nbytes(), name))
                if kind == "empty":
                    scratch_allocs[name] = (st.nbytes(), kw.get("device"))
            else:  # cast
                src = tensor_ref(ev.args[0])
                if len(ev.args) != 1 or set(ev.kwargs) - {"dtype"}:
                    raise _Refused(f"{ev.func} with {ev.args[1:]} {ev.kwargs}")
                body.append((f"{name} = {src}.to({const(ev.kwargs['dtype'])})", name))
                st = ev.out.untyped_storage()
                regions.append((st.data_ptr(), st.data_ptr() + st.nbytes(), name))
            dtypes[name] = ev.out.dtype
            layouts[name] = (ev.out.shape, ev.out.stride(), ev.out.dtype)
            continue
        launches += 1
        lname = f"L{n}"
        fast = ev.launcher
        runtime = fast._runtime
        prep = fast._prep
        if prep is None:
            raise _Refused("a launch without a generated argument preparation")
        try:
            spec, launch_args = prep(ev.args)
        except Exception as e:  # noqa: BLE001 - other argument types than prep expects
            raise _Refused(f"argument preparation failed: {e!r}") from None
        entry = fast._cache.get((rec.device, ev.num_warps, ev.num_stages, spec))
        if entry is None:
            raise _Refused("a launch whose compiled handle is not cached")
        compiled, direct, coop, pdl, scratch = entry
        if direct is None or scratch:
            raise _Refused("a launch through Triton's wrapper or with per-launch scratch")
        args = []
        for a, la in zip(ev.args, launch_args, strict=True):
            args.append(pointer(la) if isinstance(a, torch.Tensor) else const(la))
        g = ev.grid + (1,) * (3 - len(ev.grid))
        ns[lname] = direct
        head = (f"{g[0]}, {g[1]}, {g[2]}, s, {const(compiled.function)}, {const(coop)}, "
                f"{const(pdl)}, None, None, {const(compiled.packed_metadata)}, None, None, "
                f"None")
        body.append((f"{lname}({head}, {', '.join(args)})", None))
    outs = [tensor_ref(t) for t in outputs]
    # buffers only launches read (by pointer) share one allocation: one torch.empty, not many
    pooled: dict[str, int] = {}
    devices = {dev for name, (_, dev) in scratch_allocs.items() if name not in materialized}
    if len(devices) == 1:
        total = 0
        for name, (nbytes, _) in scratch_allocs.items():
            if name not in materialized:
                pooled[name] = total
                total += -(-nbytes // _POOL_ALIGN) * _POOL_ALIGN
        if len(pooled) < 2:
            pooled = {}
    params = ", ".join(f"i{i}" for i in range(len(inputs)))
    lines.append(f"def run({params}):")
    for i in range(len(inputs)):
        if f"i{i}" in ptrs_needed:
            lines.append(f"    p_i{i} = i{i}.data_ptr()")
    if launches:
        lines.append(f"    s = _stream({rec.device})")
    if pooled:
        lines.append(f"    pool = _torch.empty({total}, dtype=_torch.uint8, "
                     f"device={const(devices.pop())})")
        lines.append("    p_pool = pool.data_ptr()")
        for name, off in pooled.items():
            if name in ptrs_needed:
                lines.append(f"    p_{name} = p_pool + {off}")
    for line, defined in body:
        if defined in pooled:
            continue
        lines.append(f"    {line}")
        if defined in ptrs_needed:
            lines.append(f"    p_{defined} = {defined}.data_ptr()")
    lines.append(f"    return ({', '.join(outs)},)")
    source = "\n".join(lines) + "\n"
    exec(compile(source, "<moerun launch program>", "exec"), ns)  # noqa: S102 - generated
    return Program(ns["run"], runtime, rec.device, launches, source)


def layout_key(tensors: Sequence[torch.Tensor]) -> tuple:
    """The part of a program's cache key its inputs decide: each tensor's shape, strides,
    dtype, device index and whether its pointer is 16-byte aligned (Triton specialises on
    it). A caller adds the host values it looks up (a tile config, a row count). Host only;
    a few attribute reads per tensor."""
    return tuple((t.shape, t.stride(), t.dtype, t.data_ptr() & 15, t.get_device())
                 for t in tensors)


#: a key called once: recorded at its next call
_SEEN = object()
#: ``MOERUN_LAUNCH_PROGRAMS=0`` (read once, at import): every cache runs its calls plainly
#: -- an escape hatch for debugging a suspected replay, at the plain path's host cost
ENABLED = os.environ.get("MOERUN_LAUNCH_PROGRAMS", "1") != "0"


class ProgramCache:
    """Programs by the caller's key, with the keys refused remembered (None) so a call that
    cannot be replayed is recorded once. A key is recorded at its *second* call: recording
    (the dispatch mode, code generation) costs more host time than the call, so a shape seen
    once -- a one-off prefill length -- never pays for it. At most ``capacity`` keys (cleared
    when full: call shapes in serving repeat, so the working set refills at once). Host
    only."""

    __slots__ = ("_entries", "capacity")

    def __init__(self, capacity: int = 512) -> None:
        self._entries: dict[Any, Program | None] = {}
        self.capacity = capacity

    def call(self, key: Any, inputs: Sequence[torch.Tensor], fn: Callable[[], Any],
             outputs: Callable[[Any], tuple] = lambda r: (r,),
             wrap: Callable[[tuple], Any] = lambda t: t[0]) -> Any:
        """``fn()``, through the program of ``key`` when there is one (``wrap`` turns its
        output tuple into ``fn``'s result), recorded on the second call of ``key``
        (``outputs`` lists the result's tensors), and plainly on the first call, when the key
        was refused, while a graph is captured on a call that would record, inside another
        recording (an enclosing program must see this call's launches, so it neither replays
        nor records), when the program cannot run now, and always with
        ``MOERUN_LAUNCH_PROGRAMS=0``. ``fn`` must read exactly ``inputs`` (see
        :func:`build`)."""
        if _launch._RECORDING.stack or not ENABLED:  # NOTE: inside a caller's recording its
            return fn()  # launches must be seen
        program = self._entries.get(key, False)
        if program is False:  # first call: remember the key
            self.put(key, _SEEN)
            return fn()
        if program is _SEEN:
            if torch.cuda.is_current_stream_capturing():
                return fn()
            out, rec = record(fn)
            self.put(key, build(rec, inputs, outputs(out)))
            return out
        if program is None:
            return fn()
        res = program(*inputs)
        return fn() if res is None else wrap(res)

    def get(self, key: Any) -> Program | None | bool:
        """The program for ``key``; None if refused; False if not recorded (yet)."""
        program = self._entries.get(key, False)
        return False if program is _SEEN else program

    def put(self, key: Any, program: Program | None) -> None:
        """Store ``key``'s program (None: refused); a new key in a full cache clears it."""
        if key not in self._entries and len(self._entries) >= self.capacity:
            self._entries.clear()
        self._entries[key] = program

    def __len__(self) -> int:
        return len(self._entries)
