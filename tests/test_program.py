"""``moerun._triton.program``: a recorded call replays its allocations and launches exactly.

On the CPU there is no compiled kernel, so these tests give a real ``FastLauncher`` a cached
"compiled handle" whose C launcher is a Python function that *performs* a small kernel
through the pointers it receives (ctypes reads and writes). A replay is right when the
tensors it returns hold what that kernel computes on the *new* inputs, checked against torch
arithmetic on those inputs, and when its launch arguments are the plain call's (pointers
moved to the replay's own buffers, every other value equal). The real kernels are checked
against the plain path on the GPU (``tests/test_layer_gpu.py``).
"""

from __future__ import annotations

import ctypes

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from moerun._triton import launch as launch_mod  # noqa: E402
from moerun._triton.launch import FastLauncher  # noqa: E402
from moerun._triton.program import ProgramCache, build, record  # noqa: E402


@triton.jit
def _kernel(src_ptr, dst_ptr, flag_ptr, n, scale, BLOCK: tl.constexpr):
    pass  # never compiled here: the fake C launcher below runs instead


class _Compiled:
    function = 1234
    packed_metadata = ("meta",)


def _fake_c_launcher(calls):
    """What the C launcher would get: (grid, stream, ..., *args). It runs the 'kernel':
    dst[j] = src[j] * scale for j < n (int32), then flag[0] = n."""
    def direct(g0, g1, g2, stream, function, coop, pdl, scratch, prof, meta, h1, h2, h3,
               src, dst, flag, n, scale, block):
        calls.append(dict(grid=(g0, g1, g2), stream=stream, function=function, meta=meta,
                          src=src, dst=dst, flag=flag, n=n, scale=scale, block=block))
        a = (ctypes.c_int32 * n).from_address(src)
        b = (ctypes.c_int32 * n).from_address(dst)
        for j in range(n):
            b[j] = a[j] * scale
        ctypes.c_int32.from_address(flag).value = n
    return direct


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 77, raising=False)
    calls: list[dict] = []
    fast = FastLauncher(_kernel)
    fast._interpret = False
    fast._runtime = type("RT", (), {"launch_enter_hook": None, "launch_exit_hook": None})()
    return fast, calls


def _wrapper(fast, calls, x: torch.Tensor, scale: int):
    """A kernel wrapper shaped like moe_align: one int32 allocation cut into views, a zeroed
    counter, one launch reading a view of the input, and a cast of the result."""
    n = x.shape[0] - 1
    buf = torch.empty(n + 8, dtype=torch.int32)
    dst = buf.narrow(0, 4, n)  # byte offset 16
    flag = torch.zeros(2, dtype=torch.int32)
    key_args = (x[1:], dst, flag, n, scale, 64)
    if not fast._cache:  # the first launch "compiles": give it the fake compiled handle
        spec, _ = launch_mod._prep_function(key_args, fast._kinds)(key_args)
        fast._prep = launch_mod._prep_function(key_args, fast._kinds)
        fast._cache[(0, 4, None, spec)] = (_Compiled(), _fake_c_launcher(calls), 0, 0, 0)
    fast((3, 2), *key_args, num_warps=4)
    return dst.to(torch.int64), flag


def test_replay_recomputes_on_new_inputs_and_passes_the_plain_arguments(fake_cuda):
    fast, calls = fake_cuda
    x = torch.arange(10, dtype=torch.int32)
    (out, flag), rec = record(lambda: _wrapper(fast, calls, x, 3))
    assert rec.refused is None and rec.device == 0
    program = build(rec, (x,), (out, flag))
    assert program is not None and program.num_launches == 1
    assert out.tolist() == [3 * v for v in range(1, 10)]
    x2 = torch.randint(-1000, 1000, (10,), dtype=torch.int32)
    plain = len(calls)
    p_out, p_flag = program(x2)
    replayed = calls[plain]
    assert p_out.dtype == torch.int64 and p_out.tolist() == (x2[1:].long() * 3).tolist()
    assert p_flag.tolist() == [9, 0]
    # the same arguments as a plain call, pointers on the new input and the replay's buffers
    assert replayed["src"] == x2.data_ptr() + 4
    assert replayed["dst"] - replayed["flag"] != 0
    first = calls[0]
    for k in ("grid", "stream", "function", "meta", "n", "scale", "block"):
        assert replayed[k] == first[k], k
    assert replayed["grid"] == (3, 2, 1) and replayed["stream"] == 77


def test_replay_uses_the_replays_own_buffers(fake_cuda):
    fast, calls = fake_cuda
    x = torch.arange(6, dtype=torch.int32)
    (out, flag), rec = record(lambda: _wrapper(fast, calls, x, 2))
    program = build(rec, (x,), (out, flag))
    a_out, a_flag = program(x)
    b_out, b_flag = program(x)
    assert a_flag.data_ptr() != b_flag.data_ptr()  # fresh allocations per replay
    assert a_out.tolist() == b_out.tolist() == [2, 4, 6, 8, 10]


def test_refuses_a_torch_op_outside_the_replayed_set(fake_cuda):
    fast, calls = fake_cuda
    x = torch.arange(6, dtype=torch.int32)

    def fn():
        out, flag = _wrapper(fast, calls, x, 2)
        return out.cumsum(0), flag

    (out, flag), rec = record(fn)
    assert rec.refused is not None and "cumsum" in rec.refused
    assert build(rec, (x,), (out, flag)) is None


def test_compute_ops_after_a_launch_are_replayed_on_the_new_values(fake_cuda):
    fast, calls = fake_cuda
    x = torch.arange(6, dtype=torch.int32)

    def fn():
        out, flag = _wrapper(fast, calls, x, 2)  # out = 2 * x[1:], int64
        return torch.cat([out + 1, out * out]), flag

    (out, flag), rec = record(fn)
    assert out.tolist() == [3, 5, 7, 9, 11, 4, 16, 36, 64, 100]
    program = build(rec, (x,), (out, flag))
    assert program is not None and program.num_launches == 1
    x2 = torch.randint(-1000, 1000, (6,), dtype=torch.int32)
    got, got_flag = program(x2)
    d = [2 * v for v in x2.tolist()[1:]]
    assert got.tolist() == [v + 1 for v in d] + [v * v for v in d]
    assert got_flag.tolist()[0] == 5 and got.data_ptr() != out.data_ptr()


def test_gemms_and_in_place_adds_replay_like_the_shared_expert():
    """No launch at all: a cuBLAS-style shared MLP (mm against a transposed weight, silu,
    mul, mm, in-place add of the routed rows) replayed on new values, against float64."""
    g = torch.Generator().manual_seed(3)
    t, h, i = 5, 12, 8

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    def mlp(x, w13, w2, routed):
        gu = torch.mm(x, w13.t())
        act = torch.nn.functional.silu(gu[:, :i]) * gu[:, i:]
        return torch.mm(act, w2.t()).add_(routed)

    inputs = (rnd(t, h), rnd(2 * i, h), rnd(h, i), rnd(t, h))
    out, rec = record(lambda: mlp(*inputs))
    program = build(rec, inputs, (out,))
    assert program is not None and program.num_launches == 0
    new = (rnd(t, h), rnd(2 * i, h), rnd(h, i), rnd(t, h))
    (got,) = program(*new)
    x, w13, w2, routed = (v.double() for v in new)
    gu = x @ w13.T
    ref = (torch.nn.functional.silu(gu[:, :i]) * gu[:, i:]) @ w2.T + routed
    assert (got.double() - ref).abs().max().item() < 1e-4
    assert not torch.equal(got, out)  # computed anew, not the recording's tensor
    assert new[3].double().sub(routed).abs().max().item() == 0  # routed is not modified


def test_a_cache_inside_a_recording_neither_replays_nor_records(fake_cuda, monkeypatch):
    """An enclosing recording must see every launch: a nested cache call runs plainly."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    fast, calls = fake_cuda
    x = torch.arange(6, dtype=torch.int32)
    inner = ProgramCache()
    for _ in range(2):  # the second call records
        inner.call("k", (x,), lambda: _wrapper(fast, calls, x, 2), outputs=lambda r: r,
                   wrap=lambda t: t)
    assert inner.get("k")  # recorded: the next call outside a recording would replay
    (out, flag), rec = record(lambda: inner.call("k", (x,), lambda: _wrapper(fast, calls, x, 3),
                                                 outputs=lambda r: r, wrap=lambda t: t))
    assert out.tolist() == [3, 6, 9, 12, 15]  # the plain call ran (scale 3), not the replay
    assert sum(1 for e in rec.events if type(e).__name__ == "_Launch") == 1
    assert len(inner) == 1


def test_refuses_a_pointer_nobody_owns(fake_cuda):
    fast, calls = fake_cuda
    x = torch.arange(6, dtype=torch.int32)
    other = torch.arange(6, dtype=torch.int32)  # read by the call, not given as an input
    (out, flag), rec = record(lambda: _wrapper(fast, calls, other, 2))
    assert build(rec, (x,), (out, flag)) is None


def test_refuses_scratch_launches_and_uncached_handles(fake_cuda):
    fast, calls = fake_cuda
    x = torch.arange(6, dtype=torch.int32)
    (out, flag), rec = record(lambda: _wrapper(fast, calls, x, 2))
    (entry_key, entry), = fast._cache.items()
    fast._cache[entry_key] = entry[:4] + (128,)  # per-program global scratch
    assert build(rec, (x,), (out, flag)) is None
    fast._cache.clear()
    assert build(rec, (x,), (out, flag)) is None


def test_a_host_sync_is_refused(fake_cuda):
    fast, calls = fake_cuda
    x = torch.arange(6, dtype=torch.int32)

    def fn():
        out, flag = _wrapper(fast, calls, x, 2)
        int(flag[0])  # a value read on the host
        return out, flag

    (out, flag), rec = record(fn)
    assert build(rec, (x,), (out, flag)) is None


def test_hooks_or_another_device_send_the_caller_back(fake_cuda, monkeypatch):
    fast, calls = fake_cuda
    x = torch.arange(6, dtype=torch.int32)
    (out, flag), rec = record(lambda: _wrapper(fast, calls, x, 2))
    program = build(rec, (x,), (out, flag))
    fast._runtime.launch_enter_hook = lambda *a: None
    assert program(x) is None
    fast._runtime.launch_enter_hook = None
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 1, raising=False)
    assert program(x) is None


def test_recordings_do_not_nest_and_the_cache_is_bounded():
    with pytest.raises(RuntimeError, match="already active"):
        record(lambda: record(lambda: None))
    assert not launch_mod._RECORDING.stack
    cache = ProgramCache(capacity=2)
    assert cache.get("a") is False
    cache.put("a", None)
    cache.put("b", None)
    assert cache.get("a") is None and len(cache) == 2
    cache.put("b", None)  # an existing key in a full cache: nothing else goes
    assert len(cache) == 2 and cache.get("a") is None
    cache.put("c", None)
    assert len(cache) == 1 and cache.get("a") is False


def _chain(fast, calls, x: torch.Tensor):
    """Three launches through two buffers only the launches read: x -> a -> b -> out."""
    n = x.shape[0]
    a = torch.empty(n, dtype=torch.int32)
    b = torch.empty(n + 4, dtype=torch.int32)
    out = torch.empty(n, dtype=torch.int32)
    flag = torch.zeros(2, dtype=torch.int32)
    for src, dst, scale in ((x, a, 2), (a, b[4:], 3), (b[4:], out, 5)):
        args = (src, dst, flag, n, scale, 64)
        if not fast._cache:
            fast._prep = launch_mod._prep_function(args, fast._kinds)
            spec, _ = fast._prep(args)
            fast._cache[(0, 4, None, spec)] = (_Compiled(), _fake_c_launcher(calls), 0, 0, 0)
        fast((1,), *args, num_warps=4)
    return out


def test_buffers_only_launches_read_share_one_allocation(fake_cuda):
    fast, calls = fake_cuda
    x = torch.arange(7, dtype=torch.int32)
    out, rec = record(lambda: _chain(fast, calls, x))
    assert out.tolist() == [30 * v for v in range(7)]
    program = build(rec, (x,), (out,))
    assert program is not None and program.num_launches == 3
    assert program.source.count("_torch.empty(") == 2  # the pool and the returned buffer
    x2 = torch.randint(-50, 50, (7,), dtype=torch.int32)
    (got,) = program(x2)
    assert got.tolist() == (x2 * 30).tolist()
    pool_calls = calls[-3:]
    assert pool_calls[0]["src"] == x2.data_ptr()
    a_ptr, b_ptr = pool_calls[0]["dst"], pool_calls[1]["dst"]
    assert pool_calls[1]["src"] == a_ptr and pool_calls[2]["src"] == b_ptr
    assert (b_ptr - 16 - a_ptr) % 512 == 0 and b_ptr - 16 >= a_ptr + 7 * 4  # disjoint parts
    assert pool_calls[2]["dst"] == got.data_ptr()


def test_a_key_is_recorded_at_its_second_call_and_replayed_from_its_third(fake_cuda,
                                                                           monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    fast, calls = fake_cuda
    cache = ProgramCache()
    plain_calls = []

    def fn(x):
        plain_calls.append(1)
        return _wrapper(fast, calls, x, 3)

    outs = []
    for _ in range(4):
        x = torch.randint(-9, 9, (6,), dtype=torch.int32)
        outs.append((x, cache.call("k", (x,), lambda x=x: fn(x), outputs=lambda r: r,
                                   wrap=lambda t: t)))
        if len(outs) == 1:
            assert cache.get("k") is False and len(cache) == 1  # seen once, not recorded
    assert len(plain_calls) == 2  # the first call and the recording; then replays
    assert cache.get("k")
    for x, (out, flag) in outs:
        assert out.tolist() == [3 * v for v in x.tolist()[1:]] and flag.tolist()[0] == 5


def test_a_compute_op_on_a_tensor_nobody_passed_in_is_refused():
    """A tensor the call reads but was not given as an input (a captured weight) would be
    baked into the program as it was: refused instead."""
    w = torch.randn(4, 3)  # read by the call, not an input
    x = torch.randn(2, 4)
    out, rec = record(lambda: torch.mm(x, w))
    assert build(rec, (x,), (out,)) is None
    assert build(rec, (x, w), (out,)) is not None


def test_addmm_keywords_replay():
    g = torch.Generator().manual_seed(9)
    inputs = tuple(torch.randn(*s, generator=g) for s in ((3, 5), (3, 4), (4, 5)))
    out, rec = record(lambda: torch.addmm(inputs[0], inputs[1], inputs[2], beta=0.5,
                                          alpha=2.0))
    program = build(rec, inputs, (out,))
    assert program is not None
    new = tuple(torch.randn(*t.shape, generator=g) for t in inputs)
    (got,) = program(*new)
    c, a, b = (t.double() for t in new)
    assert (got.double() - (0.5 * c + 2.0 * (a @ b))).abs().max().item() < 1e-5


def test_programs_off_runs_every_call_plainly(fake_cuda, monkeypatch):
    """``MOERUN_LAUNCH_PROGRAMS=0`` (the module's ``ENABLED``): no key is marked, recorded or
    replayed."""
    from moerun._triton import program as program_mod

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(program_mod, "ENABLED", False)
    fast, calls = fake_cuda
    cache = ProgramCache()
    x = torch.arange(6, dtype=torch.int32)
    for scale in (2, 3, 4):
        out, _ = cache.call("k", (x,), lambda s=scale: _wrapper(fast, calls, x, s),
                            outputs=lambda r: r, wrap=lambda t: t)
        assert out.tolist() == [scale * v for v in range(1, 6)]
    assert len(cache) == 0 and len(calls) == 3


def test_a_recording_watches_its_own_thread_only(fake_cuda):
    """While one thread records, another thread's launch does not report into the recording
    (it runs plainly) and that thread may record a call of its own."""
    import threading

    fast, calls = fake_cuda
    x = torch.arange(8, dtype=torch.int32)
    x2 = torch.arange(100, 108, dtype=torch.int32)
    seen = {}

    def other_thread():
        seen["stack"] = list(launch_mod._RECORDING.stack)
        out, _ = _wrapper(fast, calls, x2, 5)
        seen["out"] = out.tolist()
        _, inner = record(lambda: None)  # not "already active": that one is another thread's
        seen["inner"] = inner.refused

    def call():
        result = _wrapper(fast, calls, x, 3)
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        return result

    (out, flag), rec = record(call)
    assert seen == {"stack": [], "out": [5 * v for v in range(101, 108)], "inner": None}
    assert len(calls) == 2  # both launches ran
    program = build(rec, (x,), (out, flag))
    assert program is not None and program.num_launches == 1  # only this thread's
    x3 = torch.randint(-50, 50, (8,), dtype=torch.int32)
    assert program(x3)[0].tolist() == (x3[1:].long() * 3).tolist()
