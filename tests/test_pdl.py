"""``moerun._triton.pdl``: programmatic dependent launch is wired so that the launch attribute
and the kernel's wait can never disagree, and every kernel waits before it touches memory.

On the CPU: a real :class:`~moerun._triton.launch.FastLauncher` over a kernel ending in
``PDL: tl.constexpr``, with Triton's JIT entry point replaced by a recorder, shows what a
launch passes (the trailing argument, the ``launch_pdl`` option) with PDL on and off, on the
JIT path and the cached path; the source of every kernel moerun launches is checked for the
wait as its first statement. That the GPU results are the serialized launches' bit for bit,
eager and under CUDA-graph replay, is checked on the GPU (``tests/test_triton_gpu.py``).
"""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from moerun._triton import launch as launch_mod  # noqa: E402
from moerun._triton import pdl as pdl_mod  # noqa: E402
from moerun._triton.launch import FastLauncher  # noqa: E402


@triton.jit
def _pdl_kernel(x_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pass  # never compiled here


@triton.jit
def _plain_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass


class _Run:  # a compiled handle's ``run`` without the direct-launch attributes
    def __init__(self, calls):
        self.calls = calls

    def __call__(self, *a):
        self.calls.append(("run", a))


class _Compiled:
    function = 1
    packed_metadata = ()

    def __init__(self, calls):
        self.run = _Run(calls)

    def _init_handles(self):
        pass


class _JitRecorder:
    """Stands in for the ``@triton.jit`` object: ``kernel[grid](*args, **kw)`` records."""

    def __init__(self, real, calls):
        self.params = real.params
        self.arg_names = real.arg_names
        self.calls = calls

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls.append(("jit", args, kw))
            return _Compiled(self.calls)
        return launch


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 5, raising=False)

    def make(kernel):
        calls: list = []
        fast = FastLauncher(_JitRecorder(kernel, calls))
        fast._interpret = False
        fast._runtime = type("RT", (), {"launch_enter_hook": None,
                                        "launch_exit_hook": None})()
        return fast, calls
    return make


def test_only_a_kernel_ending_in_pdl_is_a_pdl_kernel():
    assert FastLauncher(_pdl_kernel)._pdl
    assert not FastLauncher(_plain_kernel)._pdl


@pytest.mark.parametrize("on", [True, False])
def test_the_launcher_supplies_the_argument_and_the_matching_launch_option(
        fake_cuda, monkeypatch, on):
    monkeypatch.setattr(launch_mod, "pdl_enabled", lambda device: on)
    fast, calls = fake_cuda(_pdl_kernel)
    x = torch.empty(4)
    fast((2,), x, 7, 64)  # the caller passes every parameter but PDL
    kind, args, kw = calls[0]
    assert kind == "jit" and args[:3] == (x, 7, 64) and args[3] is on and len(args) == 4
    assert kw.get("launch_pdl", False) is on
    fast((2,), x, 7, 64)  # cached: the compiled handle's launcher, same trailing value
    kind, launch_args = calls[1]
    assert kind == "run" and launch_args[-1] is on and launch_args[-3] == 7
    assert len(fast._cache) == 1


def test_pdl_on_and_off_are_two_specialisations(fake_cuda, monkeypatch):
    fast, calls = fake_cuda(_pdl_kernel)
    x = torch.empty(4)
    for on in (True, False, True):
        monkeypatch.setattr(launch_mod, "pdl_enabled", lambda device, on=on: on)
        fast((1,), x, 3, 16)
    assert [c[0] for c in calls] == ["jit", "jit", "run"]
    assert len(fast._cache) == 2


def test_a_plain_kernel_gets_no_argument_and_no_option(fake_cuda, monkeypatch):
    monkeypatch.setattr(launch_mod, "pdl_enabled", lambda device: True)
    fast, calls = fake_cuda(_plain_kernel)
    x = torch.empty(4)
    fast((1,), x, 3, 16)
    _, args, kw = calls[0]
    assert len(args) == 3 and "launch_pdl" not in kw


def test_the_first_launch_passes_num_stages_only_when_given(fake_cuda):
    # a Gluon kernel takes no num_stages: None is left out (Triton's option parsing drops a
    # None anyway), a value is passed through
    fast, calls = fake_cuda(_plain_kernel)
    x = torch.empty(4)
    fast((1,), x, 3, 16)
    fast((1,), x, 3, 32, num_stages=3)
    assert "num_stages" not in calls[0][2] and calls[1][2]["num_stages"] == 3


def test_a_descriptor_argument_is_passed_through_and_keyed_by_its_box(fake_cuda):
    hopper = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    gl = pytest.importorskip("triton.experimental.gluon.language")
    t = torch.empty(256, 256, dtype=torch.bfloat16)

    def desc(base, block):
        return hopper.TensorDescriptor.from_tensor(
            base, block, gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16))

    fast, calls = fake_cuda(_plain_kernel)
    a, b, c = desc(t, [64, 64]), desc(t[64:], [64, 64]), desc(t, [128, 64])
    fast((1,), a, 3, 16)  # compiles (jit)
    fast((1,), b, 3, 16)  # same box and layout, other base: the cached handle, b itself
    fast((1,), c, 3, 16)  # another box: another specialisation
    assert [k[0] for k in calls] == ["jit", "run", "jit"]
    assert calls[1][1][-3] is b and len(fast._cache) == 2


def test_under_the_interpreter_the_argument_is_false(monkeypatch):
    calls: list = []
    fast = FastLauncher(_JitRecorder(_pdl_kernel, calls))
    fast._interpret = True
    fast((1,), torch.empty(2), 2, 16)
    _, args, kw = calls[0]
    assert args[-1] is False and "launch_pdl" not in kw


def test_enabled_needs_hopper_and_no_interpreter_and_no_opt_out(monkeypatch):
    caps = {0: (9, 0), 1: (8, 0), 2: (10, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: caps[d])
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(pdl_mod.PDL_ENV, raising=False)
    monkeypatch.setattr(pdl_mod, "_BY_DEVICE", {})
    assert [pdl_mod.pdl_enabled(d) for d in (0, 1, 2)] == [True, False, True]
    for env, value in ((pdl_mod.PDL_ENV, "0"), ("TRITON_INTERPRET", "1")):
        monkeypatch.setattr(pdl_mod, "_BY_DEVICE", {})
        monkeypatch.setenv(env, value)
        assert not pdl_mod.pdl_enabled(0)
        monkeypatch.delenv(env)


_KERNEL_MODULES = ["moerun.routing.kernel", "moerun.backends.triton.align",
                   "moerun.backends.triton.gate_up", "moerun.backends.triton.down",
                   "moerun.backends.triton.combine", "moerun.backends.triton.persistent",
                   "moerun.backends.triton.gather",
                   "moerun.backends.triton.fp8", "moerun.backends.triton.fp8_paired",
                   "moerun.backends.triton.fp8_direct", "moerun.backends.triton.fp8_quant",
                   "moerun.backends.triton.dense"]


def _launched_kernels():
    """Every kernel a module-level ``FastLauncher`` of moerun launches, with its module."""
    out = []
    for name in _KERNEL_MODULES:
        mod = importlib.import_module(name)
        for value in vars(mod).values():
            if isinstance(value, FastLauncher):
                out.append((mod, value._kernel))
    return out


def test_every_launched_kernel_is_a_pdl_kernel_that_waits_first():
    kernels = _launched_kernels()
    assert len(kernels) >= 19  # the expert, routing, fp8 and dense kernels
    for _mod, kernel in kernels:
        fn = getattr(kernel, "fn", kernel)
        assert kernel.arg_names[-1] == "PDL", fn.__name__
        tree = ast.parse(inspect.getsource(fn).lstrip())
        body = tree.body[0].body
        first = body[0]
        assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Call), fn.__name__
        call = first.value
        assert getattr(call.func, "id", None) == "pdl_prologue", fn.__name__
        assert [getattr(a, "id", None) for a in call.args] == ["PDL"], fn.__name__
