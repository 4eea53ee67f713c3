"""Chunk overlap on the aux stream (DESIGN 4.1 step 6), on a CUDA device."""

from __future__ import annotations

import pytest
import torch

from moerun import ConfigurableMoE, MoEConfig
from moerun.testing import TOL, make_case, reference_output, rel_err
from traces import ScheduleRecorder

pytestmark = pytest.mark.gpu


def _layer(cfg, case, **kw):
    layer = ConfigurableMoE(cfg, device="cuda", layer_idx=0, **kw)
    layer.load_weights(case.w13.cuda(), case.w2.cuda(),
                       None if case.shared is None else {k: v.cuda() for k, v in case.shared.items()})
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", ["auto", "reference", "grouped_mm"])
def test_overlap_matches_in_order_and_reference(dtype, backend):
    if backend == "grouped_mm" and dtype == torch.float32:
        pytest.skip("grouped_mm on CUDA is bf16-only")
    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = MoEConfig(num_experts=16, top_k=4, hidden_size=256, intermediate_size=128,
                    shared_intermediate_size=64, max_num_tokens=48, dtype=dtype)
    case = make_case(cfg, 200, 3)
    rec = ScheduleRecorder()
    on = _layer(cfg, case, backend=backend, recorder=rec)
    off = _layer(cfg, case, backend=backend, chunk_overlap=False)
    x, logits = case.x.cuda(), case.logits.cuda()
    out_on, out_off = on(x, logits), off(x, logits)
    torch.cuda.synchronize()
    ref = reference_output(cfg, case)
    assert rel_err(out_on.cpu(), ref) < TOL[dtype]
    assert rel_err(out_on.cpu(), out_off.double().cpu()) < TOL[dtype]
    roles = {(e.chunk, e.stream) for e in rec.events if e.phase == "experts"}
    assert roles == {(0, "aux"), (1, "main"), (2, "aux"), (3, "main"), (4, "aux")}


def test_overlap_waits_for_input_written_on_another_stream():
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64,
                    max_num_tokens=32, dtype=torch.bfloat16)
    case = make_case(cfg, 100, 4)
    layer = _layer(cfg, case)
    producer = torch.cuda.Stream()
    x_src = case.x.cuda()
    x = torch.empty_like(x_src)
    with torch.cuda.stream(producer):
        torch.cuda._sleep(20_000_000)  # x is written late, on another stream
        x.copy_(x_src)
        ready = torch.cuda.Event()
        ready.record()
    out = layer(x, case.logits.cuda(), input_ready_event=ready)
    torch.cuda.synchronize()
    assert rel_err(out.cpu(), reference_output(cfg, case)) < TOL[torch.bfloat16]


def test_overlapped_forward_captures_and_replays_in_a_cuda_graph():
    cfg = MoEConfig(num_experts=16, top_k=2, hidden_size=128, intermediate_size=64,
                    max_num_tokens=24, dtype=torch.bfloat16)
    case = make_case(cfg, 3 * 64, 5)
    layer = _layer(cfg, case)
    x = case.x[:64].cuda().clone()
    logits = case.logits[:64].cuda().clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, allocate) off the capture
        layer(x, logits)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(x, logits)
    for step in (1, 2):
        x.copy_(case.x[64 * step:64 * (step + 1)].cuda())
        logits.copy_(case.logits[64 * step:64 * (step + 1)].cuda())
        graph.replay()
        torch.cuda.synchronize()
        glob = type(case)(x=case.x[64 * step:64 * (step + 1)],
                          logits=case.logits[64 * step:64 * (step + 1)], w13=case.w13,
                          w2=case.w2, shared=None, bias=None)
        assert rel_err(out.cpu(), reference_output(cfg, glob)) < TOL[torch.bfloat16]
