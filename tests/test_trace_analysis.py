"""traces.capture / traces.overlap / traces.timeline (DESIGN 10).

Order: interval helpers -> hand-written Chrome traces with known overlap (CPU: a shared range
and a gloo worker; GPU: kernels on three streams tied to host ranges by correlation ids) ->
DBO attribution (a fake-clock DBO run with known per-micro-batch times; a real profiler run
checked against the schedule recorder) -> empty / foreign traces and bad input -> real
traces: a 1-rank ConfigurableMoE forward, a 2-rank gloo all-reduce in flight during a
``shared`` range -> PNG timelines.

Synthetic times are integers in µs, so every figure is checked exactly.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys

import pytest
import torch

import traces
from traces import _intervals as iv
from traces import PhaseKey

PID = 100
MAIN, WORKER = 1, 2


def X(name, ts, dur, *, tid=MAIN, pid=PID, cat="user_annotation", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def kernel(name, ts, dur, *, stream, corr, device=0, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": ts,
            "dur": dur, "args": {"device": device, "stream": stream, "correlation": corr}}


def launch(ts, corr, *, tid=MAIN):
    return X("cudaLaunchKernel", ts, 2, tid=tid, cat="cuda_runtime", correlation=corr)


def trace(*events):
    return {"traceEvents": [
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": MAIN, "args": {"name": "main"}},
        *events]}


def lane_roles(rep):
    return {ln.id: ln.role for ln in rep.lanes}


def host_times(rep):
    return {k: t.host_us for k, t in rep.phases.items()}


# ----------------------------------------------------------------------------------------------
# interval helpers


def test_interval_helpers_hand_cases():
    a = iv.union([(5, 7), (0, 2), (1, 3), (7, 8), (9, 9)])
    assert a == ((0, 3), (5, 8))
    b = ((2, 6), (7.5, 10))
    assert iv.intersect(a, b) == ((2, 3), (5, 6), (7.5, 8))
    assert iv.subtract(a, b) == ((0, 2), (6, 7.5))
    assert iv.subtract(b, a) == ((3, 5), (8, 10))
    assert iv.length(a) == 6 and iv.clip(a, 1, 6) == ((1, 3), (5, 6))
    assert iv.subtract(a, ()) == a and iv.intersect(a, ()) == () and iv.union([]) == ()


# ----------------------------------------------------------------------------------------------
# CPU: shared range on the main thread, a gloo collective on a worker thread


@pytest.mark.parametrize("name,want", [
    ("moerun/L3/dispatch.wait", ("phase", 3, "dispatch.wait", None)),
    ("moerun/L-/eplb.route", ("phase", None, "eplb.route", None)),
    ("moerun/L12/chunk4", ("chunk", 12, "chunk", 4)),
    ("moerun/L0/dbo/ub1", ("ub", 0, "ub", 1)),
    ("moerun/L7/dbo/yield", ("mark", 7, "dbo/yield", None)),
    ("aten::mm", None),
    ("moerunL3/route", None),
])
def test_parse_name_hand_cases(name, want):
    from traces._ranges import parse_name

    got = parse_name(name)
    assert (None if got is None else (got.kind, got.layer, got.phase, got.index)) == want


def test_cpu_shared_hidden_by_gloo_worker():
    #   main    |shared 0..100|
    #   worker          |gloo:all_reduce 40..140|
    rep = traces.overlap(trace(
        X("moerun/L0/shared", 0, 100),
        X("gloo:all_reduce", 40, 100, tid=WORKER),
    ))
    assert rep.device == "cpu"
    assert lane_roles(rep) == {f"cpu:{PID}:{MAIN}": "main", f"cpu:{PID}:{WORKER}": "comm"}
    assert rep.lanes_with_role("main")[0].label == "main"
    assert rep.shared_us == 100 and rep.hidden_shared_us == 60
    assert rep.hidden_shared_pct == 60.0
    assert rep.comm_us == 100 and rep.exposed_comm_us == 40
    assert rep.window_us == (0, 140)
    assert dict(host_times(rep)) == {PhaseKey(layer=0, ub=None, chunk=None, phase="shared"): 100}
    assert rep.phases[PhaseKey(layer=0, ub=None, chunk=None, phase="shared")].device_us is None


def test_cpu_wait_ranges_are_not_compute():
    #   main    |shared 0..100|combine.wait 100..140|aten::add 140..150|
    #   worker          |gloo:all_reduce 40..145 (copy nested)|
    rep = traces.overlap(trace(
        X("moerun/L0/chunk0", 0, 140),
        X("moerun/L0/shared", 0, 100),
        X("moerun/L0/combine.wait", 100, 40),
        X("aten::add", 140, 10, cat="cpu_op"),
        X("gloo:all_reduce", 40, 105, tid=WORKER),
        X("aten::copy_", 130, 10, tid=WORKER, cat="cpu_op"),
    ))
    main = rep.lanes_with_role("main")[0]
    assert main.busy == ((0, 100), (140, 150))  # blocked in wait() is not busy
    assert rep.lanes_with_role("comm")[0].busy == ((40, 145),)
    assert rep.comm_us == 105 and rep.exposed_comm_us == 40  # 100..140
    assert rep.hidden_shared_pct == 60.0
    assert rep.phases[PhaseKey(layer=0, ub=None, chunk=0, phase="combine.wait")].host_us == 40


def test_cpu_p2p_spans_on_issuing_thread_form_a_comm_lane():
    # gloo:send starts inside c10d::send on the issuing thread and lasts until completion
    rep = traces.overlap(trace(
        X("c10d::send", 0, 10, cat="cpu_op"),
        X("gloo:send", 5, 95),
        X("moerun/L2/shared", 20, 50),
        X("aten::mul", 0, 300, tid=7, cat="cpu_op"),  # an unrelated thread
    ))
    roles = lane_roles(rep)
    assert roles == {f"cpu:{PID}:{MAIN}": "main", f"cpu:{PID}:{MAIN}:gloo": "comm",
                     f"cpu:{PID}:7": "other"}
    assert rep.lanes_with_role("main")[0].busy == ((0, 10), (20, 70))
    # the shared range and the send are on the same thread but different lanes: hidden
    assert rep.hidden_shared_pct == 100.0
    assert rep.comm_us == 95
    assert rep.exposed_comm_us == 0  # the unrelated thread computes the whole time


def test_cpu_worker_recognised_by_events_not_name():
    # a worker named like the main thread; another thread with a nested gloo event is not one
    rep = traces.overlap({"traceEvents": [
        {"ph": "M", "name": "thread_name", "pid": PID, "tid": 5,
         "args": {"name": "thread 5 (python)"}},
        X("moerun/L0/experts", 0, 50),
        X("gloo:all_gather", 10, 60, tid=5),
        X("aten::view", 11, 1, tid=5, cat="cpu_op"),
        X("c10d::recv_", 0, 100, tid=6, cat="cpu_op"),
        X("gloo:recv", 1, 80, tid=6),
    ]})
    assert lane_roles(rep) == {f"cpu:{PID}:{MAIN}": "main", f"cpu:{PID}:5": "comm",
                               f"cpu:{PID}:6": "other", f"cpu:{PID}:6:gloo": "comm"}
    assert rep.hidden_shared_pct is None and rep.shared_us == 0
    assert rep.comm_us == 80  # 1..81 ∪ 10..70
    assert rep.exposed_comm_us == 0  # thread 6 is busy 0..100


# ----------------------------------------------------------------------------------------------
# GPU: kernels on three streams, tied to host ranges through correlation ids


def _gpu_trace():
    #   host   |shared 0..50 (launch c1)|experts 50..100 (c2, c3)|combine 100..110 (c4)|
    #   s7  (experts)            |k2 150..250|k3 250..280|
    #   s20 (shared)                  |k1 200..300|
    #   s30 (nccl)                                  |k4 290..400|
    #   s40 (no launch)                                                  |k9 500..510|
    return trace(
        X("moerun/L0/chunk0", 0, 110),
        X("moerun/L0/shared", 0, 50), launch(10, 1),
        X("moerun/L0/experts", 50, 50), launch(60, 2), launch(70, 3),
        X("moerun/L0/combine", 100, 10), launch(105, 4),
        kernel("shared_mlp", 200, 100, stream=20, corr=1),
        kernel("fused_moe_kernel", 150, 100, stream=7, corr=2),
        kernel("fused_moe_kernel", 250, 30, stream=7, corr=3),
        kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 290, 110, stream=30, corr=4),
        kernel("elementwise", 500, 10, stream=40, corr=99),
    )


def test_gpu_roles_and_hidden_shared_exact():
    rep = traces.overlap(_gpu_trace())
    assert rep.device == "gpu"
    roles = {ln.id: ln.role for ln in rep.lanes if ln.device == "gpu"}
    assert roles == {"gpu:0:7": "main", "gpu:0:20": "aux", "gpu:0:30": "comm",
                     "gpu:0:40": "other"}
    assert [ln.device for ln in rep.lanes] == ["gpu"] * 4 + ["cpu"]  # host kept for the plot
    assert rep.lanes_with_role("main")[0].busy == ((150, 280),)
    # shared 200..300 on s20: hidden by experts (200..280) and NCCL (290..300) = 90 of 100
    assert rep.shared_us == 100 and rep.hidden_shared_us == 90
    assert rep.hidden_shared_pct == 90.0
    # NCCL 290..400 vs compute 150..300 ∪ 500..510: exposed 300..400
    assert rep.comm_us == 110 and rep.exposed_comm_us == 100
    assert {k.phase: (t.host_us, t.device_us, t.device_events) for k, t in rep.phases.items()} \
        == {"shared": (50, 100, 1), "experts": (50, 130, 2), "combine": (10, 110, 1)}
    assert all(k.chunk == 0 and k.layer == 0 and k.ub is None for k in rep.phases)
    k1 = [s for s in rep.lanes[1].spans if s.name == "shared_mlp"]
    assert k1 and k1[0].phase == "shared" and k1[0].kind == "kernel"


def test_gpu_during_combine_shared_on_main_stream_overlaps_nccl():
    # DURING_COMBINE: combine issued (NCCL on s30), shared kernels on the main stream s7
    rep = traces.overlap(trace(
        X("moerun/L1/experts", 0, 10), launch(2, 1),
        X("moerun/L1/combine", 10, 10), launch(12, 2),
        X("moerun/L1/shared", 20, 10), launch(22, 3),
        X("moerun/L1/combine.wait", 30, 5),
        kernel("grouped_gemm", 100, 50, stream=7, corr=1),
        kernel("ncclDevKernel_AllReduce", 150, 60, stream=30, corr=2),
        kernel("shared_up", 150, 40, stream=7, corr=3),
    ))
    roles = {ln.id: ln.role for ln in rep.lanes if ln.device == "gpu"}
    assert roles == {"gpu:0:7": "main", "gpu:0:30": "comm"}
    assert rep.hidden_shared_pct == 100.0 and rep.shared_us == 40
    assert rep.comm_us == 60 and rep.exposed_comm_us == 20  # 190..210


def test_gpu_main_without_experts_kernels_and_minor_nccl_is_not_comm():
    # no experts range: main = most device time attributed to moerun phases; a stream with a
    # small NCCL kernel among compute stays a compute stream
    rep = traces.overlap(trace(
        X("moerun/L-/route", 0, 10), launch(1, 1), launch(2, 2),
        X("moerun/L-/dispatch", 10, 10), launch(11, 3),
        kernel("topk", 100, 30, stream=7, corr=1),
        kernel("nccl_small", 130, 10, stream=7, corr=3),
        kernel("copy", 100, 5, stream=9, corr=2, cat="gpu_memcpy"),
    ))
    roles = {ln.id: ln.role for ln in rep.lanes if ln.device == "gpu"}
    assert roles == {"gpu:0:7": "main", "gpu:0:9": "aux"}
    assert rep.comm_us == 0 and rep.hidden_shared_pct is None
    assert rep.phases[PhaseKey(layer=None, ub=None, chunk=None, phase="route")].device_us == 35


def test_gpu_shared_range_without_kernels_gives_none_and_a_note():
    rep = traces.overlap(trace(X("moerun/L0/shared", 0, 10),
                               kernel("k", 0, 5, stream=7, corr=1)))
    assert rep.hidden_shared_pct is None
    assert any("no device work is attributed" in n for n in rep.notes)
    assert any("correlation" in n for n in rep.notes)


# ----------------------------------------------------------------------------------------------
# DBO: two micro-batches interleaved on one thread, their ranges overlapping in time


class _FakeClockDbo:
    """Writes the Chrome events of a DBO forward driven like DESIGN 7, with a fake µs clock,
    and remembers the true (layer, ub, chunk, phase) of every phase range."""

    def __init__(self, layer: int, seed: int, *, marks: bool = True) -> None:
        self.events: list[dict] = []
        self.truth: dict[PhaseKey, float] = {}
        self.now = 0
        self.layer = layer
        self.marks = marks
        self.rng = random.Random(seed)

    @contextlib.contextmanager
    def rng_range(self, suffix):
        start = self.now
        self.now += 1
        yield
        self.now += 1
        self.events.append(X(f"moerun/L{self.layer}/{suffix}", start, self.now - start))

    def phase(self, ub, chunk, name):
        dur = self.rng.randint(1, 40)
        self.events.append(X(f"moerun/L{self.layer}/{name}", self.now, dur))
        key = PhaseKey(layer=self.layer, ub=ub, chunk=chunk, phase=name)
        self.truth[key] = self.truth.get(key, 0) + dur
        self.now += dur + 1

    def mark(self):
        if self.marks:
            self.events.append(X(f"moerun/L{self.layer}/dbo/yield", self.now, 0))
        self.now += 1

    def micro_batch(self, u, chunks):
        with self.rng_range(f"dbo/ub{u}"):
            for c in range(chunks):
                with self.rng_range(f"chunk{c}"):
                    self.phase(u, c, "route")
                    self.phase(u, c, "dispatch")
                    self.mark()
                    yield
                    self.phase(u, c, "dispatch.wait")
                    self.phase(u, c, "experts")
                    self.phase(u, c, "combine")
                    self.mark()
                    yield
                    self.phase(u, c, "combine.wait")
            self.phase(u, None, "shared")

    def run(self, chunks):
        live = [self.micro_batch(u, n) for u, n in enumerate(chunks)]
        while live:
            for g in list(live):
                try:
                    next(g)
                except StopIteration:
                    live.remove(g)
        return {"traceEvents": self.events}


@pytest.mark.parametrize("chunks", [(1, 1), (2, 2), (3, 1), (1, 3)])
def test_dbo_phase_times_per_micro_batch_exact(chunks):
    sim = _FakeClockDbo(layer=4, seed=sum(chunks))
    rep = traces.overlap(sim.run(chunks))
    assert dict(host_times(rep)) == sim.truth
    assert all(t.count == 1 for t in rep.phases.values())
    assert any("dbo/yield-mark segments" in n for n in rep.notes)
    assert not any("may be wrong" in n for n in rep.notes)
    # the ub ranges really overlap (the case the segment rule exists for)
    ubs = [s for s in rep.lanes[0].spans if s.kind == "ub"]
    assert len(ubs) == 2 and ubs[1].start_us < ubs[0].end_us


def test_dbo_two_layers_on_one_thread_are_separate():
    a = _FakeClockDbo(layer=0, seed=1).run((2, 2))
    sim = _FakeClockDbo(layer=1, seed=2)
    sim.now = 10_000
    b = sim.run((1, 1))
    rep = traces.overlap({"traceEvents": a["traceEvents"] + b["traceEvents"]})
    assert {k for k in rep.phases if k.layer == 1} == set(sim.truth)
    assert len([k for k in rep.phases if k.layer == 0]) == 2 * 2 * 6 + 2


def test_dbo_without_yield_marks_is_reported_ambiguous():
    sim = _FakeClockDbo(layer=0, seed=3, marks=False)
    rep = traces.overlap(sim.run((1, 1)))
    assert any("no dbo/yield marks" in n and "may be wrong" in n for n in rep.notes)
    # phases outside the overlap are still exact: ub0's route/dispatch precede ub1's range
    for ph in ("route", "dispatch"):
        k = PhaseKey(layer=0, ub=0, chunk=0, phase=ph)
        assert rep.phases[k].host_us == sim.truth[k]


def test_dbo_real_profiler_trace_matches_schedule_recorder(tmp_path):
    rec = traces.ScheduleRecorder()

    def micro_batch(t, u):
        with t.ub(u):
            for c in range(2):
                with t.chunk(c):
                    with t.phase("route"):
                        torch.ones(8).sum()
                    with t.phase("dispatch", stream="comm"):
                        pass
                    t.mark()
                    yield
                    for p in ("dispatch.wait", "experts", "combine"):
                        with t.phase(p):
                            torch.ones(8).sum()
                    t.mark()
                    yield
                    with t.phase("combine.wait"):
                        pass

    def run():
        live = [micro_batch(traces.Tracer(layer_idx=6, recorder=rec, ub=u), u) for u in (0, 1)]
        while live:
            for g in list(live):
                try:
                    next(g)
                except StopIteration:
                    live.remove(g)

    res = traces.capture(run, tmp_path, name="dbo")
    rep = traces.overlap(res.path)
    want: dict[PhaseKey, int] = {}
    for e in rec.events:
        if e.kind == "range" and e.phase not in ("ub", "chunk"):
            k = PhaseKey(layer=e.layer_idx, ub=e.ub, chunk=e.chunk, phase=e.phase)
            want[k] = want.get(k, 0) + 1
    assert {k: t.count for k, t in rep.phases.items()} == want
    assert len(want) == 2 * 2 * 6


# ----------------------------------------------------------------------------------------------
# empty and foreign traces, bad input


@pytest.mark.parametrize("empty", [{"traceEvents": []}, [], {"traceEvents": [
    {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
    {"ph": "i", "name": "Record Window End", "pid": "", "tid": "", "ts": 5}]}])
def test_empty_trace(empty):
    rep = traces.overlap(empty)
    assert rep.lanes == () and dict(rep.phases) == {} and rep.notes == ()
    assert rep.hidden_shared_pct is None and rep.shared_us == 0
    assert rep.comm_us == 0 and rep.exposed_comm_us == 0 and rep.window_us == (0.0, 0.0)
    assert "0 lanes" in str(rep)


def test_trace_without_moerun_ranges():
    rep = traces.overlap(trace(
        X("aten::mm", 0, 50, cat="cpu_op"),
        X("gloo:all_reduce", 30, 40, tid=WORKER),
    ))
    assert lane_roles(rep) == {f"cpu:{PID}:{MAIN}": "other", f"cpu:{PID}:{WORKER}": "comm"}
    assert rep.lanes_with_role("main") == () and dict(rep.phases) == {}
    assert rep.hidden_shared_pct is None
    assert rep.comm_us == 40 and rep.exposed_comm_us == 20


def test_report_is_frozen_and_picklable():
    import dataclasses
    import pickle

    rep = traces.overlap(_gpu_trace())
    back = pickle.loads(pickle.dumps(rep))
    assert back == rep and list(back.phases) == list(rep.phases)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rep.comm_us = 0.0
    with pytest.raises(TypeError):
        rep.phases[PhaseKey(layer=0, ub=None, chunk=0, phase="x")] = None
    with pytest.raises(ValueError, match=r"role='gpu' is invalid: use one of"):
        rep.lanes_with_role("gpu")


def test_summary_lists_lanes_figures_and_phases():
    text = str(traces.overlap(_gpu_trace()))
    for piece in ("gpu trace", "GPU 0 stream 7", "main", "aux", "comm", "hidden 90.0 %",
                  "exposed 100.0 µs", "experts", "130.0", "(not in figures)"):
        assert piece in text, piece


def test_bad_trace_input(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"trace=.*missing\.json.*no such file"):
        traces.overlap(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"bad\.json.* not a Chrome trace: it is not valid JSON"):
        traces.overlap(str(bad))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"foo": 1}))
    with pytest.raises(ValueError, match=r"not a Chrome trace: no 'traceEvents' key"):
        traces.overlap(other)
    with pytest.raises(ValueError, match=r"'traceEvents' must be a list of event objects"):
        traces.overlap({"traceEvents": {"a": 1}})
    with pytest.raises(ValueError, match=r"the JSON is a int"):
        other.write_text("3")
        traces.overlap(other)
    with pytest.raises(ValueError, match=r"is not a file"):
        traces.overlap(tmp_path)
    with pytest.raises(TypeError, match=r"trace=42 is a int; pass a Chrome trace JSON path"):
        traces.overlap(42)


def test_gzipped_trace_is_read(tmp_path):
    import gzip

    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(trace(X("moerun/L0/shared", 0, 100), X("gloo:all_reduce", 40, 100, tid=2)), f)
    assert traces.overlap(path).hidden_shared_pct == 60.0


def test_capture_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match=r"fn=3 is not callable"):
        traces.capture(3, tmp_path)
    with pytest.raises(ValueError, match=r"name='a/b' is invalid"):
        traces.capture(lambda: None, tmp_path, name="a/b")
    with pytest.raises(ValueError, match=r"activities=\[\] is invalid"):
        traces.capture(lambda: None, tmp_path, activities=[])
    with pytest.raises(ValueError, match=r"activities=\['cpu'\] is invalid"):
        traces.capture(lambda: None, tmp_path, activities=["cpu"])
    with pytest.raises(TypeError, match=r"out_dir=None is invalid"):
        traces.capture(lambda: None, None)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match=r"exists and is not a folder"):
        traces.capture(lambda: None, f)


def test_capture_propagates_errors_and_writes_nothing(tmp_path):
    def boom():
        raise RuntimeError("fn failed")

    with pytest.raises(RuntimeError, match="fn failed"):
        traces.capture(boom, tmp_path / "out")
    assert not (tmp_path / "out" / "trace.json").exists()


def test_timeline_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match=r"png=.*x\.jpg.* must end in \.png"):
        traces.timeline(_gpu_trace(), tmp_path / "x.jpg")
    with pytest.raises(TypeError, match=r"png=None is invalid"):
        traces.timeline(_gpu_trace(), None)
    with pytest.raises(FileNotFoundError, match=r"no such file"):
        traces.timeline(tmp_path / "nope.json", tmp_path / "x.png")


# ----------------------------------------------------------------------------------------------
# real traces


def _layer_forward():
    from moerun import ConfigurableMoE, MoEConfig

    e, h, i, si, t = 8, 32, 16, 16, 24
    cfg = MoEConfig(num_experts=e, top_k=2, hidden_size=h, intermediate_size=i,
                    shared_intermediate_size=si, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    rec = traces.ScheduleRecorder()
    layer = ConfigurableMoE(cfg, device="cpu", layer_idx=2, recorder=rec)
    layer.load_weights(torch.randn(e, 2 * i, h, generator=g) * 0.1,
                       torch.randn(e, h, i, generator=g) * 0.1,
                       {"w13": torch.randn(2 * si, h, generator=g) * 0.1,
                        "w2": torch.randn(h, si, generator=g) * 0.1})
    x, logits = torch.randn(t, h, generator=g), torch.randn(t, e, generator=g)
    layer(x, logits)  # warm-up outside the trace
    rec.clear()
    return layer, x, logits, rec


def test_real_single_rank_forward(tmp_path):
    layer, x, logits, rec = _layer_forward()
    with layer:
        res = traces.capture(lambda: layer(x, logits), tmp_path, name="layer")
    assert res.path == tmp_path / "layer.json" and res.activities == ("CPU",)
    assert tuple(res.value.shape) == (x.shape[0], x.shape[1])
    rep = traces.overlap(res.path)
    assert rep.device == "cpu"
    (main,) = rep.lanes_with_role("main")
    assert main.busy_us > 0
    phases = rep.by_phase()
    for p in ("route", "dispatch", "dispatch.wait", "experts", "combine", "combine.wait",
              "shared"):
        assert phases[p].count == 1 and phases[p].host_us > 0, p
    assert PhaseKey(layer=2, ub=None, chunk=0, phase="route") in rep.phases
    assert PhaseKey(layer=2, ub=None, chunk=None, phase="shared") in rep.phases
    # every range the recorder saw is in the trace, once, with the same chunk
    want = {(e.chunk, e.phase) for e in rec.events if e.phase not in ("ub", "chunk")}
    assert {(k.chunk, k.phase) for k in rep.phases} == want
    # one rank, sequential shared expert: nothing hides it, no communication lane
    assert rep.hidden_shared_pct == 0.0 and rep.comm_us == 0
    png = traces.timeline(res.path, tmp_path / "layer.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# Bounds for the 2-rank test. The all-reduce of 8M fp32 values (32 MB) takes 25-45 ms over
# loopback gloo in the pool on the 2-core machine, the shared range 20 ms; the worker
# picks the collective up 0.1-4 ms after the issue (measured hidden: 83-100 %). If the analysis
# ignored the comm lane, hidden would be 0 %.
NUMEL = 8_000_000
SHARED_MS = 20.0
MIN_HIDDEN_PCT = 25.0
# The worker's event ended 0.1-0.2 ms *before* wait() returned in every measured run; the
# slack only absorbs clock reads of two threads.
CLOCK_SLACK_US = 200.0


def test_real_two_rank_gloo_allreduce_hides_shared(pools, tmp_path):
    from tests.trace_tasks import shared_during_allreduce_task

    results = pools(2).run(shared_during_allreduce_task, numel=NUMEL,
                           shared_ms=SHARED_MS, out_dir=str(tmp_path))
    for r in results:
        assert r["value"] == 2 * (1.0 + 2.0)  # every element summed over both ranks
        assert r["device"] == "cpu"
        # the investigation: the collective runs on a gloo worker thread as gloo:all_reduce,
        # between its issue and the end of wait()
        assert r["roles"].count("main") == 1 and r["roles"].count("comm") >= 1, r["summary"]
        assert r["comm_tids"] and r["main_tid"][0] not in r["comm_tids"]
        assert r["comm_span_names"] == ["gloo:all_reduce"], r["summary"]
        (gloo,) = r["gloo"]
        assert r["combine"][0] <= gloo[0] <= r["wait"][1]
        assert gloo[1] <= r["wait"][1] + CLOCK_SLACK_US
        # the figures
        assert r["shared_us"] >= SHARED_MS * 1000 * 0.99
        assert r["comm_us"] == pytest.approx(gloo[1] - gloo[0])
        assert r["hidden_shared_pct"] >= MIN_HIDDEN_PCT, r["summary"]
        overlap_us = max(0.0, min(gloo[1], r["shared"][1]) - max(gloo[0], r["shared"][0]))
        assert r["hidden_shared_us"] == pytest.approx(overlap_us)
        # the shared range is compute: what it hides is not exposed; the wait is not compute:
        # the comm between the end of the shared range and the end of wait() is exposed
        assert r["exposed_comm_us"] <= r["comm_us"] - r["hidden_shared_us"] + 1e-6
        after = max(0.0, min(gloo[1], r["wait"][1]) - max(gloo[0], r["shared"][1]))
        assert r["exposed_comm_us"] >= after - 1e-6
    png = traces.timeline(results[0]["path"], tmp_path / "rank0.png")
    assert png.stat().st_size > 5_000


def test_timeline_png_synthetic(tmp_path):
    sim = _FakeClockDbo(layer=0, seed=7)
    for name, tr in (("gpu", _gpu_trace()), ("dbo", sim.run((2, 2))),
                     ("empty", {"traceEvents": []})):
        png = traces.timeline(tr, tmp_path / "sub" / f"{name}.png", title=f"synthetic {name}")
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 3_000, name
    rep = traces.overlap(_gpu_trace())
    assert traces.timeline(rep, tmp_path / "rep.png").stat().st_size > 3_000


def test_import_traces_does_not_import_matplotlib():
    code = ("import sys, traces\n"
            "assert 'matplotlib' not in sys.modules\n"
            "traces.overlap({'traceEvents': []})\n"
            "assert 'matplotlib' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
