"""``ConfigurableMoE`` on one rank (CPU) against the fp64 unsharded reference.

Order: hand-sized edge cases (T=0, T=1, one expert, top_k == E) -> routing-method x dtype sweep
-> shared expert -> chunking -> input-ready deferral (DESIGN 4.2) -> EPLB hook gating (DESIGN 8)
and the per-chunk phase order of the schedule recorder (DESIGN 4.1 step 5).

Every output is compared with ``reference_output`` (fp64, ``ReferenceExperts`` math on the
same inputs upcast) by ``rel_err`` against the DESIGN 2 bound ``TOL[dtype]``, and checked to be
finite.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from moerun import ConfigurableMoE, MoEConfig, RoutingConfig, RoutingMethod
from schedulers import split_rows
from tests.moe_cases import TOL, make_case, reference_output, rel_err
from traces import ScheduleRecorder

M = RoutingMethod
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
H, I = 32, 16
# Chunked vs unchunked, both fp32 on the same rows: only matmul blocking can differ.
CHUNK_TOL = 1e-6


# ------------------------------------------------------------------ helpers


def _cfg(e: int = 8, k: int = 2, *, dtype=torch.float32, routing: RoutingConfig | None = None,
         **kw) -> MoEConfig:
    return MoEConfig(num_experts=e, top_k=k, hidden_size=H, intermediate_size=I, dtype=dtype,
                     routing=routing or RoutingConfig(), **kw)


def _layer(cfg: MoEConfig, case, **kw) -> ConfigurableMoE:
    layer = ConfigurableMoE(cfg, device="cpu", **kw)
    layer.load_weights(case.w13, case.w2, case.shared, e_score_correction_bias=case.bias)
    return layer


def _check_vs_reference(cfg: MoEConfig, case, out: torch.Tensor) -> float:
    num_tokens = case.x.shape[0]
    assert out.shape == (num_tokens, cfg.hidden_size)
    assert out.dtype == cfg.dtype
    assert bool(torch.isfinite(out).all()), "output has NaN/Inf"
    err = rel_err(out, reference_output(cfg, case))
    assert err < TOL[cfg.dtype], f"rel_err={err:.3g} >= {TOL[cfg.dtype]} ({cfg.dtype})"
    return err


def _run(cfg: MoEConfig, num_tokens: int, seed: int = 0, **layer_kw) -> torch.Tensor:
    case = make_case(cfg, num_tokens, seed)
    with _layer(cfg, case, **layer_kw) as layer:
        out = layer(case.x, case.logits)
    _check_vs_reference(cfg, case, out)
    return out


class RecordingBalancer:
    """A ``eplb.LayerBalancerHooks`` that logs each hook call and what it was given.

    ``log``: hook names in call order. ``in_range``: the recorder's innermost event phase at
    each call (must be the hook's own ``eplb.*`` range). ``stat_rows``/``route_offsets``: the
    rows given to ``update_statistic`` and the ``row_offset`` given to ``route``.
    """

    enabled = True

    def __init__(self, num_experts: int, recorder: ScheduleRecorder) -> None:
        self.num_slots = num_experts
        self.recorder = recorder
        self.log: list[str] = []
        self.in_range: list[tuple[str, str]] = []
        self.stat_rows: list[int] = []
        self.route_offsets: list[int] = []

    def _hit(self, name: str) -> None:
        self.log.append(name)
        self.in_range.append((name, self.recorder.events[-1].phase))

    def local_experts(self, start: int, end: int) -> list[int]:
        return list(range(start, end))

    def start_wait_gpu(self, ctx) -> None:
        self._hit("start_wait_gpu")

    def done_wait_gpu(self, ctx) -> None:
        self._hit("done_wait_gpu")

    def update_statistic(self, ctx, topk_ids: torch.Tensor) -> None:
        self._hit("update_statistic")
        self.stat_rows.append(topk_ids.shape[0])

    def route(self, ctx, topk_ids: torch.Tensor, row_offset: int) -> torch.Tensor:
        self._hit("route")
        self.route_offsets.append(row_offset)
        return topk_ids

    def start_set_cpu(self, ctx) -> None:
        self._hit("start_set_cpu")

    def done_set_cpu(self, ctx) -> None:
        self._hit("done_set_cpu")


def _expected_chunk_phases(first: bool, last: bool) -> list[str]:
    """DESIGN 4.1 step 5 as recorder phases (an unquantized layer: no ``quantize``)."""
    return (["chunk"] + (["eplb.start_wait_gpu"] if first else []) + ["route"]
            + (["eplb.done_wait_gpu"] if first else [])
            + ["eplb.update_statistic", "eplb.route", "dispatch", "dispatch.wait", "experts"]
            + (["eplb.start_set_cpu"] if last else []) + ["combine", "combine.wait"]
            + (["eplb.done_set_cpu"] if last else []))


def _expected_hooks(first: bool, last: bool) -> list[str]:
    return ((["start_wait_gpu", "done_wait_gpu"] if first else []) + ["update_statistic", "route"]
            + (["start_set_cpu", "done_set_cpu"] if last else []))


# ------------------------------------------------------------------ edge cases


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_tokens_gives_empty_output(dtype):
    cfg = _cfg(dtype=dtype)
    case = make_case(cfg, 0, seed=1)
    with _layer(cfg, case) as layer:
        out = layer(case.x, case.logits)
    assert out.shape == (0, H) and out.dtype == dtype
    assert rel_err(out, reference_output(cfg, case)) == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 2, 7, 33])
def test_token_counts(dtype, num_tokens):
    _run(_cfg(dtype=dtype), num_tokens, seed=num_tokens)


@pytest.mark.parametrize("dtype", DTYPES)
def test_single_expert_top1(dtype):
    # E=1, k=1: every token goes to expert 0 with softmax weight 1.
    _run(_cfg(e=1, k=1, dtype=dtype), 5, seed=2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("method", [M.SOFTMAX_TOPK, M.TOPK_SOFTMAX, M.SIGMOID_TOPK])
def test_top_k_equals_num_experts(dtype, method):
    cfg = _cfg(e=4, k=4, dtype=dtype, routing=RoutingConfig(method=method))
    _run(cfg, 9, seed=3)


def test_output_is_new_tensor_inputs_untouched():
    cfg = _cfg()
    case = make_case(cfg, 6, seed=4)
    x0, logits0 = case.x.clone(), case.logits.clone()
    with _layer(cfg, case) as layer:
        out = layer(case.x, case.logits)
    assert out.data_ptr() != case.x.data_ptr()
    assert torch.equal(case.x, x0) and torch.equal(case.logits, logits0)


def test_low_precision_logits_accepted():
    # router_logits may be x.dtype instead of fp32 (DESIGN 2).
    cfg = _cfg(dtype=torch.bfloat16)
    case = make_case(cfg, 7, seed=5)
    case = dataclasses.replace(case, logits=case.logits.to(torch.bfloat16))
    with _layer(cfg, case) as layer:
        out = layer(case.x, case.logits)
    _check_vs_reference(cfg, case, out)


# ------------------------------------------------------------------ routing methods x dtypes

ROUTINGS = {
    "softmax_topk_renorm": (dict(method=M.SOFTMAX_TOPK, renormalize=True), 2, {}),
    "softmax_topk_no_renorm": (dict(method=M.SOFTMAX_TOPK, renormalize=False), 2, {}),
    "topk_softmax": (dict(method=M.TOPK_SOFTMAX), 2, {}),
    "noaux_tc_groups": (dict(method=M.NOAUX_TC, renormalize=True, num_expert_group=4,
                             topk_group=2, routed_scaling_factor=2.5), 3, {}),
    "group_limited_greedy": (dict(method=M.GROUP_LIMITED_GREEDY, renormalize=False,
                                  num_expert_group=4, topk_group=2,
                                  routed_scaling_factor=16.0), 3, {}),
    "sigmoid_topk_renorm": (dict(method=M.SIGMOID_TOPK, renormalize=True), 2, {}),
    "sigmoid_topk_no_renorm": (dict(method=M.SIGMOID_TOPK, renormalize=False), 2, {}),
    "sigmoid_bias_topk": (dict(method=M.SIGMOID_BIAS_TOPK, renormalize=True), 2, {}),
    "llama4_weight_on_input": (dict(method=M.LLAMA4), 1,
                               dict(apply_router_weight_on_input=True)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(ROUTINGS))
def test_routing_methods_vs_reference(name, dtype):
    routing_kw, top_k, cfg_kw = ROUTINGS[name]
    cfg = _cfg(e=8, k=top_k, dtype=dtype, routing=RoutingConfig(**routing_kw), **cfg_kw)
    _run(cfg, 13, seed=10 + len(name))


def test_noaux_tc_bias_changes_selection():
    # The correction bias must reach routing: a large bias on expert 0 puts it in every
    # token's selection, so outputs differ from a zero bias (and both match the reference).
    routing = RoutingConfig(method=M.NOAUX_TC, num_expert_group=4, topk_group=2)
    cfg = _cfg(e=8, k=2, routing=routing)
    case = make_case(cfg, 9, seed=6)
    outs = []
    for bias in (torch.zeros(8), torch.tensor([5.0] + [0.0] * 7)):
        case = dataclasses.replace(case, bias=bias)
        with _layer(cfg, case) as layer:
            outs.append(layer(case.x, case.logits))
        _check_vs_reference(cfg, case, outs[-1])
    assert rel_err(outs[0], outs[1]) > 1e-3


def test_llama4_weight_applied_on_input_not_output():
    # silu-GLU is not linear in x: scaling the input by w differs from scaling the output.
    routing = RoutingConfig(method=M.LLAMA4)
    on_input = _cfg(e=4, k=1, routing=routing, apply_router_weight_on_input=True)
    on_output = _cfg(e=4, k=1, routing=routing)
    case = make_case(on_input, 8, seed=7)
    with _layer(on_input, case) as a, _layer(on_output, case) as b:
        out_in, out_out = a(case.x, case.logits), b(case.x, case.logits)
    _check_vs_reference(on_input, case, out_in)
    _check_vs_reference(on_output, case, out_out)
    assert rel_err(out_in, out_out) > 1e-3


# ------------------------------------------------------------------ shared expert


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("num_tokens", [0, 1, 11])
def test_shared_expert(dtype, gated, num_tokens):
    cfg = _cfg(dtype=dtype, shared_intermediate_size=24, shared_expert_gate=gated)
    rec = ScheduleRecorder()
    _run(cfg, num_tokens, seed=20 + num_tokens, recorder=rec)
    # The shared expert runs once, after the routed chunks, outside any chunk range.
    shared = [e for e in rec.events if e.phase == "shared"]
    assert len(shared) == 1 and shared[0].chunk is None
    assert rec.events[-1].phase == "shared"


def test_shared_expert_gate_is_applied():
    case_cfg = _cfg(shared_intermediate_size=24, shared_expert_gate=True)
    case = make_case(case_cfg, 6, seed=8)
    ungated_cfg = case_cfg.replace(shared_expert_gate=False)
    ungated = dict(case.shared)
    del ungated["gate"]
    with _layer(case_cfg, case) as a:
        out_gated = a(case.x, case.logits)
    layer_b = ConfigurableMoE(ungated_cfg, device="cpu")
    layer_b.load_weights(case.w13, case.w2, ungated)
    with layer_b:
        out_ungated = layer_b(case.x, case.logits)
    assert rel_err(out_gated, out_ungated) > 1e-3


# ------------------------------------------------------------------ chunking


@pytest.mark.parametrize("num_tokens", [7, 10])
@pytest.mark.parametrize("max_num_tokens", [1, 3, "T", 1000])
@pytest.mark.parametrize("shared", [False, True])
def test_chunking_matches_unchunked(num_tokens, max_num_tokens, shared):
    mnt = num_tokens if max_num_tokens == "T" else max_num_tokens
    base = _cfg(e=6, k=2, shared_intermediate_size=8 if shared else 0)
    case = make_case(base, num_tokens, seed=30 + num_tokens)
    with _layer(base, case) as layer:
        unchunked = layer(case.x, case.logits)

    cfg = base.replace(max_num_tokens=mnt)
    rec = ScheduleRecorder()
    bal = RecordingBalancer(cfg.num_experts, rec)
    with _layer(cfg, case, recorder=rec, balancer=bal) as layer:
        chunked = layer(case.x, case.logits)

    assert rel_err(chunked, unchunked) < CHUNK_TOL
    _check_vs_reference(base, case, unchunked)
    _check_vs_reference(cfg, case, chunked)

    num_chunks = math.ceil(num_tokens / mnt)
    chunk_events = [e for e in rec.events if e.phase == "chunk"]
    assert [e.chunk for e in chunk_events] == list(range(num_chunks))
    assert [e.name for e in chunk_events] == [f"moerun/L-/chunk{c}" for c in range(num_chunks)]
    # Rows per chunk: split larger-first, summing to T; route() gets each chunk's first row.
    sizes = split_rows(num_tokens, num_chunks)
    assert tuple(bal.stat_rows) == sizes and sum(sizes) == num_tokens
    assert sizes == tuple(sorted(sizes, reverse=True)) and max(sizes) - min(sizes) <= 1
    assert bal.route_offsets == [sum(sizes[:c]) for c in range(num_chunks)]


def test_chunking_zero_tokens_runs_one_chunk():
    cfg = _cfg(max_num_tokens=3)
    case = make_case(cfg, 0, seed=9)
    rec = ScheduleRecorder()
    with _layer(cfg, case, recorder=rec) as layer:
        out = layer(case.x, case.logits)
    assert out.shape == (0, H)
    assert [e.chunk for e in rec.events if e.phase == "chunk"] == [0]


# ------------------------------------------------------------------ input-ready deferral


class FakeEvent:
    """Stands in for a CUDA event: records where in the recorder's log ``wait()`` happened."""

    def __init__(self, recorder: ScheduleRecorder) -> None:
        self.recorder = recorder
        self.waited_at: list[int] = []

    def wait(self, stream=None) -> None:
        self.waited_at.append(len(self.recorder.events))


@pytest.mark.parametrize("num_tokens,max_num_tokens,shared", [
    (5, None, False), (5, 2, False), (5, 2, True), (0, None, True), (1, 1, False),
])
def test_input_ready_wait_after_routing_before_dispatch(num_tokens, max_num_tokens, shared):
    cfg = _cfg(max_num_tokens=max_num_tokens, shared_intermediate_size=8 if shared else 0)
    case = make_case(cfg, num_tokens, seed=40)
    rec = ScheduleRecorder()
    event = FakeEvent(rec)
    with _layer(cfg, case, recorder=rec) as layer:
        out = layer(case.x, case.logits, input_ready_event=event)
    _check_vs_reference(cfg, case, out)

    assert len(event.waited_at) == 1, f"wait() called {len(event.waited_at)} times"
    at = event.waited_at[0]
    phases = [(e.phase, e.chunk) for e in rec.events]
    route0 = phases.index(("route", 0))
    dispatch0 = phases.index(("dispatch", 0))
    # DESIGN 4.2: routing reads only router_logits, so the wait comes after chunk 0's route;
    # dispatch is the first step that reads x, so the wait comes before it.
    assert route0 < at <= dispatch0, (at, phases)
    # Nothing of a later chunk (nor the shared expert) was issued before the wait.
    assert all(c in (0, None) for _, c in phases[:at])
    assert ("shared", None) not in phases[:at]


def test_input_ready_event_none_is_fine():
    cfg = _cfg()
    case = make_case(cfg, 3, seed=41)
    with _layer(cfg, case) as layer:
        _check_vs_reference(cfg, case, layer(case.x, case.logits, input_ready_event=None))


# ------------------------------------------------------------------ EPLB hooks and phase order


@pytest.mark.parametrize("repeat_count", [1, 3])
@pytest.mark.parametrize("num_tokens,max_num_tokens", [(5, None), (5, 2), (0, 2)])
def test_hook_gating_and_phase_order(repeat_count, num_tokens, max_num_tokens):
    cfg = _cfg(max_num_tokens=max_num_tokens)
    case = make_case(cfg, num_tokens, seed=50)
    rec = ScheduleRecorder()
    bal = RecordingBalancer(cfg.num_experts, rec)
    num_chunks = 1 if max_num_tokens is None or num_tokens == 0 else \
        math.ceil(num_tokens / max_num_tokens)
    ref = reference_output(cfg, case)
    with _layer(cfg, case, recorder=rec, balancer=bal, layer_idx=3,
                repeat_count=repeat_count) as layer:
        # Two model steps: repeat_idx runs 0..repeat_count-1 twice.
        for fwd in range(2 * repeat_count):
            repeat_idx = fwd % repeat_count
            assert layer.repeat_idx == repeat_idx
            rec.clear()
            bal.log.clear()
            out = layer(case.x, case.logits)
            assert bool(torch.isfinite(out).all())
            assert rel_err(out, ref) < TOL[cfg.dtype]

            want_hooks, want_phases = [], []
            for c in range(num_chunks):
                first = c == 0 and repeat_idx == 0
                last = c == num_chunks - 1 and repeat_idx == repeat_count - 1
                want_hooks += _expected_hooks(first, last)
                want_phases += _expected_chunk_phases(first, last)
            assert bal.log == want_hooks, (fwd, bal.log)
            assert rec.phases() == want_phases, (fwd, rec.phases())
            # every event is tagged with its chunk, the layer and rank 0
            for ev in rec.events:
                assert ev.layer_idx == 3 and ev.rank == 0 and ev.ub is None
                assert ev.name == f"moerun/L3/{ev.phase}" or ev.phase == "chunk"
            assert [e.chunk for e in rec.events if e.phase == "chunk"] == \
                list(range(num_chunks))
        assert layer.repeat_idx == 0
    # each hook ran inside its own eplb.* range
    assert all(rng == f"eplb.{hook}" for hook, rng in bal.in_range), bal.in_range


def test_hook_counts_over_one_model_step():
    # DESIGN 8: update_statistic and route on every chunk of every repeat; the wait hooks once
    # per step (first chunk, repeat 0); the set hooks once per step (last chunk, last repeat).
    repeat_count, num_tokens, mnt = 3, 7, 3
    cfg = _cfg(max_num_tokens=mnt)
    case = make_case(cfg, num_tokens, seed=51)
    rec = ScheduleRecorder()
    bal = RecordingBalancer(cfg.num_experts, rec)
    with _layer(cfg, case, recorder=rec, balancer=bal, repeat_count=repeat_count) as layer:
        for _ in range(repeat_count):
            layer(case.x, case.logits)
    chunks = math.ceil(num_tokens / mnt)
    counts = {h: bal.log.count(h) for h in set(bal.log)}
    assert counts == {"start_wait_gpu": 1, "done_wait_gpu": 1, "start_set_cpu": 1,
                      "done_set_cpu": 1, "update_statistic": repeat_count * chunks,
                      "route": repeat_count * chunks}
    assert bal.log[:2] == ["start_wait_gpu", "done_wait_gpu"]
    assert bal.log[-2:] == ["start_set_cpu", "done_set_cpu"]


def test_phase_order_with_shared_expert_and_no_balancer():
    # Without a balancer no eplb.* range is emitted and no hook is called (DESIGN 4.1 step 5:
    # the hooks run "only when enabled"); the other phases keep their order.
    cfg = _cfg(shared_intermediate_size=8)
    case = make_case(cfg, 4, seed=52)
    rec = ScheduleRecorder()
    with _layer(cfg, case, recorder=rec) as layer:
        layer(case.x, case.logits)
    assert rec.phases() == ["chunk", "route", "dispatch", "dispatch.wait", "experts", "combine",
                            "combine.wait", "shared"]
    streams = {e.phase: e.stream for e in rec.events}
    assert streams["dispatch"] == "comm" and streams["combine"] == "comm"
    assert streams["experts"] == "main" and streams["route"] == "main"
