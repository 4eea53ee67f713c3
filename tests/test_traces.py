"""traces/: range names and nesting, NVTX calls (fake nvtx module), torch.profiler mirroring,
the schedule recorder, backend selection and import hygiene. CPU only, no timing asserts."""

from __future__ import annotations

import ast
import dataclasses
import logging
import pathlib
import subprocess
import sys
import threading
import types

import pytest
import torch

import traces
from traces import nvtx as N
from traces import ScheduleEvent, ScheduleRecorder, Tracer, range_name

TRACES_DIR = pathlib.Path(traces.__file__).parent
REPO_ROOT = TRACES_DIR.parent


class FakeNvtx(types.ModuleType):
    """Stands in for the ``nvtx`` package; logs every call with the range name."""

    def __init__(self) -> None:
        super().__init__("nvtx")
        self.calls: list[tuple] = []
        self._names: dict[object, str] = {}
        self._next = 0

    def start_range(self, message=None, color=None, domain=None, category=None, payload=None):
        self._next += 1
        handle = ("range", self._next)
        self._names[handle] = message
        self.calls.append(("start", message, domain))
        return handle

    def end_range(self, range_id):
        # the handle must be one we gave out and not yet ended
        self.calls.append(("end", self._names.pop(range_id)))

    def mark(self, message=None, color="blue", domain=None, category=None, payload=None):
        self.calls.append(("mark", message, domain))

    def open_names(self) -> list[str]:
        return list(self._names.values())


@pytest.fixture
def restore_backend(monkeypatch):
    """Whatever a test does to the cached backend is undone afterwards."""
    monkeypatch.setattr(N, "_backend", N._backend)


@pytest.fixture
def fake_nvtx(restore_backend):
    fake = FakeNvtx()
    N._set_backend_for_tests(fake)
    return fake


# ----------------------------------------------------------------------------------------------
# names


def test_range_name_hand_cases():
    assert range_name(3, "dispatch") == "moerun/L3/dispatch"
    assert range_name(0, "chunk2") == "moerun/L0/chunk2"
    assert range_name(12, "dbo/ub1") == "moerun/L12/dbo/ub1"
    assert range_name(None, "route") == "moerun/L-/route"
    assert range_name(5, "eplb.start_wait_gpu") == "moerun/L5/eplb.start_wait_gpu"


@pytest.mark.parametrize(
    "layer_idx, suffix, match",
    [
        (-1, "route", r"layer_idx=-1 is invalid"),
        ("3", "route", r"layer_idx='3' is invalid"),
        (True, "route", r"layer_idx=True is invalid"),
        (1, "", r"suffix='' is invalid"),
        (1, "/route", r"suffix='/route' is invalid"),
        (1, 7, r"suffix=7 is invalid"),
    ],
)
def test_range_name_errors(layer_idx, suffix, match):
    with pytest.raises(ValueError, match=match):
        range_name(layer_idx, suffix)


# ----------------------------------------------------------------------------------------------
# NVTX calls and nesting (fake nvtx module)


def test_nvtx_calls_nest_ub_chunk_phase(fake_nvtx):
    t = Tracer(layer_idx=3, rank=1)
    with t.ub(1):
        with t.chunk(0):
            with t.phase("route"):
                assert t.open_ranges == (
                    "moerun/L3/dbo/ub1",
                    "moerun/L3/chunk0",
                    "moerun/L3/route",
                )
                assert fake_nvtx.open_names() == list(t.open_ranges)
            with t.phase("dispatch", stream="comm") as r:
                assert r.name == "moerun/L3/dispatch"
            t.mark()
        with t.chunk(1):
            with t.phase("experts"):
                pass
    assert t.open_ranges == ()
    assert fake_nvtx.open_names() == []
    assert fake_nvtx.calls == [
        ("start", "moerun/L3/dbo/ub1", "moerun"),
        ("start", "moerun/L3/chunk0", "moerun"),
        ("start", "moerun/L3/route", "moerun"),
        ("end", "moerun/L3/route"),
        ("start", "moerun/L3/dispatch", "moerun"),
        ("end", "moerun/L3/dispatch"),
        ("mark", "moerun/L3/dbo/yield", "moerun"),
        ("end", "moerun/L3/chunk0"),
        ("start", "moerun/L3/chunk1", "moerun"),
        ("start", "moerun/L3/experts", "moerun"),
        ("end", "moerun/L3/experts"),
        ("end", "moerun/L3/chunk1"),
        ("end", "moerun/L3/dbo/ub1"),
    ]


def test_layer_none_uses_l_dash(fake_nvtx):
    t = Tracer(layer_idx=None)
    with t.chunk(0), t.phase("combine.wait"):
        pass
    t.mark()
    assert fake_nvtx.calls == [
        ("start", "moerun/L-/chunk0", "moerun"),
        ("start", "moerun/L-/combine.wait", "moerun"),
        ("end", "moerun/L-/combine.wait"),
        ("end", "moerun/L-/chunk0"),
        ("mark", "moerun/L-/dbo/yield", "moerun"),
    ]


def test_mark_is_zero_length(fake_nvtx):
    t = Tracer(layer_idx=0)
    with t.chunk(0):
        t.mark()
        t.mark("eplb.start_set_cpu", stream="aux")
        assert t.open_ranges == ("moerun/L0/chunk0",)
    # a mark is one call: never a start/end pair, nothing left open
    assert fake_nvtx.calls == [
        ("start", "moerun/L0/chunk0", "moerun"),
        ("mark", "moerun/L0/dbo/yield", "moerun"),
        ("mark", "moerun/L0/eplb.start_set_cpu", "moerun"),
        ("end", "moerun/L0/chunk0"),
    ]


def test_exception_closes_ranges_and_propagates(fake_nvtx):
    t = Tracer(layer_idx=2)
    with pytest.raises(RuntimeError, match="boom"):
        with t.chunk(4), t.phase("experts"):
            raise RuntimeError("boom")
    assert t.open_ranges == () and t.current_chunk is None
    assert [c[0:2] for c in fake_nvtx.calls] == [
        ("start", "moerun/L2/chunk4"),
        ("start", "moerun/L2/experts"),
        ("end", "moerun/L2/experts"),
        ("end", "moerun/L2/chunk4"),
    ]


def test_out_of_order_exit_on_one_tracer_is_caught(fake_nvtx):
    t = Tracer(layer_idx=1)
    outer, inner = t.chunk(0), t.phase("route")
    outer.__enter__()
    inner.__enter__()
    with pytest.raises(AssertionError, match="closed out of order"):
        outer.__exit__(None, None, None)


def _ub_forward(t: Tracer, u: int):
    """One micro-batch of an external-comm forward, yielding after each comm issue (DESIGN 7)."""
    with t.ub(u), t.chunk(0):
        with t.phase("route"):
            pass
        with t.phase("dispatch", stream="comm"):
            pass
        t.mark()
        yield
        with t.phase("dispatch.wait", stream="comm"):
            pass
        with t.phase("experts"):
            pass
        with t.phase("combine", stream="comm"):
            pass
        t.mark()
        yield
        with t.phase("combine.wait", stream="comm"):
            pass


def _run_dbo(recorder: ScheduleRecorder | None, layer_idx: int = 5) -> None:
    """Steps two micro-batches alternately on this thread, 1 starting after 0's first yield."""
    gens = [_ub_forward(Tracer(layer_idx=layer_idx, rank=0, recorder=recorder, ub=u), u) for u in (0, 1)]
    live = list(gens)
    while live:
        for g in list(live):
            try:
                next(g)
            except StopIteration:
                live.remove(g)


def test_interleaved_tracers_keep_names(fake_nvtx):
    rec = ScheduleRecorder()
    _run_dbo(rec)
    assert fake_nvtx.open_names() == []
    starts = [c[1] for c in fake_nvtx.calls if c[0] == "start"]
    ends = [c[1] for c in fake_nvtx.calls if c[0] == "end"]
    assert sorted(starts) == sorted(ends)
    # ub0's range ends while ub1's is still open: not LIFO across tracers (why start/end,
    # not push/pop), yet every end call closed the range its own tracer opened.
    assert ends.index("moerun/L5/dbo/ub0") < ends.index("moerun/L5/dbo/ub1")
    assert starts.index("moerun/L5/dbo/ub0") < starts.index("moerun/L5/dbo/ub1")
    # both micro-batches use the same chunk name; each event carries its own ub
    assert [(e.ub, e.phase) for e in rec.events if e.kind == "range"] == [
        (0, "ub"), (0, "chunk"), (0, "route"), (0, "dispatch"),
        (1, "ub"), (1, "chunk"), (1, "route"), (1, "dispatch"),
        (0, "dispatch.wait"), (0, "experts"), (0, "combine"),
        (1, "dispatch.wait"), (1, "experts"), (1, "combine"),
        (0, "combine.wait"),
        (1, "combine.wait"),
    ]  # fmt: skip
    assert rec.phases(ub=1, kind="range") == [
        "ub", "chunk", "route", "dispatch", "dispatch.wait", "experts", "combine", "combine.wait",
    ]  # fmt: skip
    assert all(e.name == f"moerun/L5/{e.phase}" for e in rec.events if e.phase not in ("ub", "chunk"))
    assert {e.name for e in rec.events if e.phase == "ub"} == {"moerun/L5/dbo/ub0", "moerun/L5/dbo/ub1"}


def test_dbo_issue_order_matches_design_7():
    rec = ScheduleRecorder()
    _run_dbo(rec)
    order = [(e.ub, e.phase) for e in rec.events]
    pos = {k: order.index(k) for k in order}
    chain = [
        (0, "dispatch"), (1, "dispatch"), (0, "dispatch.wait"), (0, "experts"), (0, "combine"),
        (1, "dispatch.wait"), (1, "experts"), (0, "combine.wait"), (1, "combine.wait"),
    ]  # fmt: skip
    assert [pos[k] for k in chain] == sorted(pos[k] for k in chain)


# ----------------------------------------------------------------------------------------------
# recorder


def test_recorder_events_carry_indices_in_issue_order(restore_backend):
    N._set_backend_for_tests(FakeNvtx())
    rec = ScheduleRecorder()
    t = Tracer(layer_idx=7, rank=3, recorder=rec)
    with t.phase("pad"):
        pass
    with t.chunk(0):
        with t.phase("dispatch", stream="comm"):
            with t.phase("shared", stream="aux"):
                pass
        t.mark(stream="main")
    t.set_ub(1)
    with t.chunk(2), t.phase("eplb.update_statistic"):
        pass
    t.set_chunk(9)
    t.mark("eplb.done_set_cpu")

    def ev(name, phase, chunk, ub, stream, kind="range"):
        return ScheduleEvent(
            name=name, phase=phase, layer_idx=7, chunk=chunk, ub=ub, stream=stream, rank=3, kind=kind
        )

    assert rec.events == [
        ev("moerun/L7/pad", "pad", None, None, "main"),
        ev("moerun/L7/chunk0", "chunk", 0, None, "main"),
        ev("moerun/L7/dispatch", "dispatch", 0, None, "comm"),
        ev("moerun/L7/shared", "shared", 0, None, "aux"),
        ev("moerun/L7/dbo/yield", "dbo/yield", 0, None, "main", kind="mark"),
        ev("moerun/L7/chunk2", "chunk", 2, 1, "main"),
        ev("moerun/L7/eplb.update_statistic", "eplb.update_statistic", 2, 1, "main"),
        ev("moerun/L7/eplb.done_set_cpu", "eplb.done_set_cpu", 9, 1, "main", kind="mark"),
    ]
    assert rec.phases(chunk=0) == ["chunk", "dispatch", "shared", "dbo/yield"]
    assert rec.phases(ub=1) == ["chunk", "eplb.update_statistic", "eplb.done_set_cpu"]
    assert rec.phases(rank=0) == []
    assert rec.phases(kind="mark") == ["dbo/yield", "eplb.done_set_cpu"]
    assert rec.names(chunk=2) == ["moerun/L7/chunk2", "moerun/L7/eplb.update_statistic"]
    assert len(rec) == 8
    rec.clear()
    assert rec.events == [] and rec.phases() == []


def test_recorder_names_equal_nvtx_names(fake_nvtx):
    rec = ScheduleRecorder()
    t = Tracer(layer_idx=None, recorder=rec)
    with t.ub(0), t.chunk(1), t.phase("quantize"):
        t.mark()
    emitted = [c[1] for c in fake_nvtx.calls if c[0] in ("start", "mark")]
    assert rec.names() == emitted


def test_recorder_works_without_any_backend(restore_backend):
    N._set_backend_for_tests(None)
    N._backend = N._NULL_BACKEND
    rec = ScheduleRecorder()
    t = Tracer(layer_idx=0, recorder=rec, ub=0)
    with t.chunk(0), t.phase("experts"):
        pass
    assert rec.phases() == ["chunk", "experts"]
    assert {e.ub for e in rec.events} == {0}


def test_recorder_thread_safe_append():
    rec = ScheduleRecorder()

    def worker(rank: int) -> None:
        t = Tracer(layer_idx=0, rank=rank, recorder=rec)
        for _ in range(500):
            with t.phase("combine", stream="comm"):
                pass

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(rec.events) == 2000
    assert all(len(rec.select(rank=r)) == 500 for r in range(4))


def test_schedule_event_validation_and_frozen():
    e = ScheduleEvent(
        name="moerun/L0/route", phase="route", layer_idx=0, chunk=0, ub=None,
        stream="main", rank=0, kind="range",
    )  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.phase = "pad"
    with pytest.raises(ValueError, match=r"ScheduleEvent.stream='gpu0' is invalid"):
        dataclasses.replace(e, stream="gpu0")
    with pytest.raises(ValueError, match=r"ScheduleEvent.kind='instant' is invalid"):
        dataclasses.replace(e, kind="instant")
    with pytest.raises(TypeError):
        ScheduleEvent("moerun/L0/route", "route", 0, 0, None, "main", 0, "range")  # kw_only
    with pytest.raises(ValueError, match=r"kind='x' is invalid"):
        ScheduleRecorder().select(kind="x")


# ----------------------------------------------------------------------------------------------
# Tracer validation and state


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(layer_idx=-2), ValueError, r"layer_idx=-2 is invalid"),
        (dict(layer_idx=1.0), ValueError, r"layer_idx=1.0 is invalid"),
        (dict(layer_idx=0, rank=-1), ValueError, r"rank=-1 is invalid"),
        (dict(layer_idx=0, recorder=[]), TypeError, r"recorder=\[\] is invalid"),
        (dict(layer_idx=0, ub=-1), ValueError, r"ub=-1 is invalid"),
    ],
)
def test_tracer_constructor_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        Tracer(**kwargs)


def test_tracer_call_errors():
    t = Tracer(layer_idx=0)
    with pytest.raises(ValueError, match=r"chunk='0' is invalid"):
        t.chunk("0")
    with pytest.raises(ValueError, match=r"ub=-1 is invalid"):
        t.ub(-1)
    with pytest.raises(ValueError, match=r"stream='gpu' is invalid"):
        t.phase("route", stream="gpu")
    with pytest.raises(ValueError, match=r"stream='x' is invalid"):
        t.mark(stream="x")
    with pytest.raises(ValueError, match=r"ub=1.5 is invalid"):
        t.set_ub(1.5)
    with pytest.raises(ValueError, match=r"chunk=-3 is invalid"):
        t.set_chunk(-3)


def test_tracer_state_restored_after_ranges():
    t = Tracer(layer_idx=4, rank=2, ub=1)
    assert (t.layer_idx, t.rank, t.recorder, t.current_ub, t.current_chunk) == (4, 2, None, 1, None)
    with t.ub(0):
        assert t.current_ub == 0
        with t.chunk(3):
            assert t.current_chunk == 3
            with t.chunk(5):  # nested chunk (allowed; restores the outer one)
                assert t.current_chunk == 5
            assert t.current_chunk == 3
        assert t.current_chunk is None
    assert t.current_ub == 1
    t.set_ub(None)
    assert t.current_ub is None


# ----------------------------------------------------------------------------------------------
# torch.profiler mirroring


def _workload(layer_idx: int) -> None:
    t = Tracer(layer_idx=layer_idx)
    x = torch.randn(8, 16)
    w = torch.randn(16, 16)
    with t.chunk(0):
        with t.phase("route"):
            x = torch.softmax(x, dim=-1)
        with t.phase("experts"):
            x = x @ w
        t.mark()


def test_ranges_appear_in_torch_profiler(restore_backend):
    N._set_backend_for_tests(FakeNvtx())
    _workload(layer_idx=7)  # before the profiler: must not show up
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _workload(layer_idx=8)
        _run_dbo(None, layer_idx=9)
    names = {e.name for e in prof.events()}
    for n in [
        "moerun/L8/chunk0", "moerun/L8/route", "moerun/L8/experts", "moerun/L8/dbo/yield",
        "moerun/L9/dbo/ub0", "moerun/L9/dbo/ub1", "moerun/L9/chunk0",
        "moerun/L9/dispatch", "moerun/L9/dispatch.wait", "moerun/L9/combine.wait",
    ]:  # fmt: skip
        assert n in names, n
    assert not any(n.startswith("moerun/L7/") for n in names)
    # the matmul ran inside the experts range
    experts = [e for e in prof.events() if e.name == "moerun/L8/experts"]
    assert len(experts) == 1
    assert any(c.name in ("aten::mm", "aten::matmul") for c in experts[0].cpu_children)


def test_record_function_only_while_profiling(restore_backend, monkeypatch):
    N._set_backend_for_tests(FakeNvtx())
    made: list[str] = []
    real = N._record_function

    def counting(name, *args, **kwargs):
        made.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(N, "_record_function", counting)
    _workload(layer_idx=1)
    assert made == []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        _workload(layer_idx=1)
    assert made == ["moerun/L1/chunk0", "moerun/L1/route", "moerun/L1/experts", "moerun/L1/dbo/yield"]
    made.clear()
    _workload(layer_idx=1)
    assert made == []


# ----------------------------------------------------------------------------------------------
# backend selection


def test_backend_prefers_nvtx_package(restore_backend, monkeypatch):
    monkeypatch.setenv("MOERUN_NVTX", "1")
    fake = FakeNvtx()
    monkeypatch.setitem(sys.modules, "nvtx", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    N._set_backend_for_tests(None)
    assert traces.nvtx_backend() == "nvtx"
    with Tracer(layer_idx=0).phase("route"):
        pass
    assert fake.calls == [("start", "moerun/L0/route", "moerun"), ("end", "moerun/L0/route")]


def test_backend_torch_cuda_nvtx_without_package(restore_backend, monkeypatch):
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/opt/nsight/libToolsInjection64.so")
    monkeypatch.delenv("MOERUN_NVTX", raising=False)
    calls: list[tuple] = []
    monkeypatch.setitem(sys.modules, "nvtx", None)  # `import nvtx` raises ImportError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_start", lambda msg: calls.append(("start", msg)) or 41)
    monkeypatch.setattr(torch.cuda.nvtx, "range_end", lambda h: calls.append(("end", h)))
    monkeypatch.setattr(torch.cuda.nvtx, "mark", lambda msg: calls.append(("mark", msg)))
    N._set_backend_for_tests(None)
    assert traces.nvtx_backend() == "torch.cuda.nvtx"
    t = Tracer(layer_idx=2)
    with t.phase("combine"):
        t.mark()
    assert calls == [("start", "moerun/L2/combine"), ("mark", "moerun/L2/dbo/yield"), ("end", 41)]


def test_backend_none_on_cpu_without_package(restore_backend, monkeypatch):
    monkeypatch.setitem(sys.modules, "nvtx", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    N._set_backend_for_tests(None)
    assert traces.nvtx_backend() == "none"
    t = Tracer(layer_idx=0)
    with t.chunk(0), t.phase("route"):
        t.mark()
    assert t.open_ranges == ()


def test_backend_incomplete_package_falls_back_with_warning(restore_backend, monkeypatch, caplog):
    monkeypatch.setenv("MOERUN_NVTX", "1")
    monkeypatch.setitem(sys.modules, "nvtx", types.ModuleType("nvtx"))  # no start_range etc.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    N._set_backend_for_tests(None)
    with caplog.at_level(logging.WARNING, logger="traces.nvtx"):
        assert traces.nvtx_backend() == "none"
    assert "pip install -U nvtx" in caplog.text


@pytest.mark.parametrize("env,expect", [
    ({}, "none"), ({"NVTX_INJECTION64_PATH": "/x/lib.so"}, "nvtx"),
    ({"NSYS_PROFILING_SESSION_ID": "3"}, "nvtx"), ({"MOERUN_NVTX": "1"}, "nvtx"),
    ({"MOERUN_NVTX": "0", "NVTX_INJECTION64_PATH": "/x/lib.so"}, "none")])
def test_no_nvtx_calls_without_an_attached_tool(restore_backend, monkeypatch, env, expect):
    # NVTX drops ranges when no tool listens; moerun then skips the calls (host cost)
    for var in ("NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH", "NSYS_PROFILING_SESSION_ID",
                "MOERUN_NVTX"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    fake = FakeNvtx()
    monkeypatch.setitem(sys.modules, "nvtx", fake)
    N._set_backend_for_tests(None)
    assert traces.nvtx_backend() == expect
    with Tracer(layer_idx=0).phase("route"):
        pass
    assert bool(fake.calls) == (expect == "nvtx")


def test_set_backend_for_tests_rejects_incomplete_module(restore_backend):
    with pytest.raises(TypeError, match=r"module lacks \['end_range', 'mark'\]"):
        N._set_backend_for_tests(types.SimpleNamespace(start_range=lambda **kw: None))


def test_tracer_captures_backend_at_construction(restore_backend):
    first, second = FakeNvtx(), FakeNvtx()
    N._set_backend_for_tests(first)
    t = Tracer(layer_idx=0)
    N._set_backend_for_tests(second)
    with t.phase("route"):
        pass
    assert len(first.calls) == 2 and second.calls == []


# ----------------------------------------------------------------------------------------------
# overhead helper (smoke only: timings are benchmarks, not tests)


def test_measure_range_overhead_smoke(restore_backend):
    N._set_backend_for_tests(FakeNvtx())
    out = traces.measure_range_overhead(n=200)
    assert set(out) == {"noop_ns", "recorder_ns", "backend", "backend_ns", "loop_ns", "profiler_active", "n"}
    assert out["backend"] == "nvtx" and out["n"] == 200 and out["profiler_active"] is False
    assert all(out[k] > 0 for k in ("noop_ns", "recorder_ns", "backend_ns"))
    with pytest.raises(ValueError, match=r"n=0 is invalid"):
        traces.measure_range_overhead(n=0)


# ----------------------------------------------------------------------------------------------
# dependency direction (DESIGN 12)


def test_traces_imports_only_stdlib_and_torch():
    allowed = set(sys.stdlib_module_names) | {"torch", "traces", "__future__"}
    lazy_optional = {"nvtx", "matplotlib"}
    for path in sorted(TRACES_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path.name}: use absolute imports"
                roots = [node.module.split(".")[0]]
            else:
                continue
            for root in roots:
                if root in lazy_optional:
                    assert node.col_offset > 0, f"{path.name}: {root} must be imported lazily"
                else:
                    assert root in allowed, f"{path.name} imports {root}"


def test_import_traces_first_in_fresh_interpreter():
    code = (
        "import sys, traces, traces.nvtx, traces.recorder, traces.overhead\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'moerun', 'schedulers', 'eplb', 'nvtx'})\n"
        "assert not bad, bad\n"
        "assert sorted(traces.__all__) == sorted(set(traces.__all__))\n"
        "assert all(hasattr(traces, n) for n in traces.__all__)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=120)
