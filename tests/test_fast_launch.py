"""``moerun._triton.launch``: the cached-handle launcher's key is at least as fine as Triton's.

A :class:`FastLauncher` reuses a compiled kernel for every call whose key matches the call
that compiled it, so two argument values with equal keys must get equal specialisations from
Triton's own binder (``native_specialize_impl``, the function ``kernel[grid]`` uses). This is
checked here on the CPU over pairs of values that differ in exactly the ways Triton cares
about (== 1, divisibility by 16, 32 vs 64 bits, dtype, pointer alignment). The launch itself
is checked on the GPU (``tests/test_triton_gpu.py``, ``tests/test_layer_gpu.py``).
"""

from __future__ import annotations

import itertools

import pytest
import torch

triton = pytest.importorskip("triton")

from moerun._triton.launch import specialization_key  # noqa: E402

# kind -> (specialize, align) arguments of native_specialize_impl
_FLAGS = {1: (True, True), 2: (False, True), 3: (True, False)}


def _values() -> list:
    base = torch.empty(64, dtype=torch.float32)
    ints = [0, 1, 2, 15, 16, 17, 32, -16, -1, 2 ** 31 - 16, 2 ** 31 - 1, 2 ** 31, 2 ** 31 + 16,
            -(2 ** 31), -(2 ** 31) - 16]
    tensors = [base, base[1:], base[4:], base[2:], base.to(torch.bfloat16),
               base.to(torch.bfloat16)[8:], base.to(torch.bfloat16)[1:],
               base.to(torch.int32), base.to(torch.int32)[3:]]
    return ints + tensors + [0.5, 3.0, True, False, None]


def _native(value, kind):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend

    specialize, align = _FLAGS[kind]
    return native_specialize_impl(CUDABackend, value, False, specialize, align)


@pytest.mark.parametrize("kind", [1, 2, 3])
def test_equal_keys_mean_equal_triton_specialisation(kind):
    values = _values()
    checked = 0
    for a, b in itertools.combinations(values, 2):
        if specialization_key((a,), (kind,)) == specialization_key((b,), (kind,)):
            assert _native(a, kind) == _native(b, kind), (a, b, kind)
            checked += 1
    assert checked > 20  # the pairs with equal keys are many (same class, different values)


def test_key_separates_what_triton_separates():
    # the converse on the interesting cases: a different specialisation -> a different key
    base = torch.empty(64)
    pairs = [(16, 17), (1, 2), (2 ** 31 - 16, 2 ** 31 + 16), (base, base[1:]),
             (base, base.to(torch.bfloat16))]
    for a, b in pairs:
        assert _native(a, 1) != _native(b, 1)
        assert specialization_key((a,), (1,)) != specialization_key((b,), (1,))


def test_constexpr_values_are_part_of_the_key():
    assert specialization_key((64, 128), (0, 0)) != specialization_key((64, 256), (0, 0))
    assert specialization_key(("ieee",), (0,)) != specialization_key(("tf32",), (0,))


def test_hooks_count_as_installed_only_when_a_chain_holds_a_call():
    # triton 3.6 keeps launch hooks as (empty) HookChain objects, never None by default
    from triton.knobs import HookChain

    from moerun._triton.launch import _hook_active

    chain = HookChain()
    assert not _hook_active(chain) and not _hook_active(None)
    chain.add(lambda *a: None)
    assert _hook_active(chain)
    assert _hook_active(lambda *a: None)  # an older triton's plain callable


@pytest.mark.parametrize("kind", [1, 2, 3])
def test_generated_key_function_separates_exactly_like_the_generic_key(kind):
    from moerun._triton.launch import _prep_function

    values = _values()
    for a, b in itertools.combinations(values, 2):
        if type(a) is not type(b):
            continue  # other types: a different key by construction (types are in it)
        fn = _prep_function((a,), (kind,))
        same_generated = fn((a,))[0] == fn((b,))[0]
        same_generic = specialization_key((a,), (kind,)) == specialization_key((b,), (kind,))
        assert same_generated == same_generic, (a, b, kind)


def test_prepared_launch_arguments_pass_tensors_as_their_pointers():
    from moerun._triton.launch import _prep_function

    t = torch.empty(8)
    args = (t, 5, 3.0, "ieee")
    key, launch = _prep_function(args, (1, 1, 1, 0))(args)
    assert launch == (t.data_ptr(), 5, 3.0, "ieee")
    assert "ieee" in key and torch.float32 in key


def _descs() -> list:
    """Gluon TMA descriptors that differ in what Triton specialises on (base dtype, block
    shape, shared layout) and in what it does not (base pointer, shape, strides)."""
    gl = pytest.importorskip("triton.experimental.gluon.language")
    hopper = pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    f8 = torch.float8_e4m3fn
    a = torch.empty(256, 512, dtype=torch.uint8).view(f8)
    b = torch.empty(512, 1024, dtype=torch.uint8).view(f8)
    h = torch.empty(256, 512, dtype=torch.bfloat16)

    def desc(t, block, dtype, swizzle=None):
        lay = gl.NVMMASharedLayout.get_default_for(block, dtype) if swizzle is None else \
            gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=8, rank=2)
        return hopper.TensorDescriptor.from_tensor(t, block, lay)

    return [desc(a, [64, 128], gl.float8e4nv), desc(a[64:], [64, 128], gl.float8e4nv),
            desc(b, [64, 128], gl.float8e4nv), desc(a, [128, 128], gl.float8e4nv),
            desc(a, [64, 64], gl.float8e4nv), desc(a, [64, 128], gl.float8e4nv, swizzle=64),
            desc(h, [64, 64], gl.bfloat16), desc(h[64:], [64, 64], gl.bfloat16)]


def test_descriptor_keys_separate_exactly_what_triton_specialises():
    # a Gluon kernel's TMA descriptor argument: equal keys <=> equal specialisation, in both
    # the generic key and the generated one (which also passes the descriptor through)
    from moerun._triton.launch import _prep_function

    descs = _descs()
    equal_pairs = 0
    for a, b in itertools.combinations(descs, 2):
        same_native = _native(a, 1) == _native(b, 1)
        same_key = specialization_key((a,), (1,)) == specialization_key((b,), (1,))
        fn = _prep_function((a,), (1,))
        assert same_key == same_native, (a.block_shape, b.block_shape)
        assert (fn((a,))[0] == fn((b,))[0]) == same_native
        equal_pairs += same_native
    assert equal_pairs == 4  # other base or shape, same box and layout: fp8 3, bf16 1
    key, launch = _prep_function((descs[0], 7), (1, 1))((descs[0], 7))
    assert launch[0] is descs[0] and launch[1] == 7


def test_a_launch_program_refuses_a_descriptor_argument():
    from moerun._triton.program import Recording

    class _Launcher:
        _interpret = False

    rec = Recording()
    rec.launch(_Launcher(), (1,), (_descs()[0], 3), 4, None)
    assert rec.refused == "a launch with a TMA descriptor argument" and not rec.events
