"""EPLB on the GPU: migration at every forward, two chunks, outputs equal the reference.

Two chunks run overlapped (chunk 0 on the layer's aux stream, chunk 1 on main, DESIGN 4.1 step
6), so migration must wait on both streams' events before rewriting the weights.
"""

from __future__ import annotations

import pytest
import torch

from eplb import EPLBConfig, LoadBalancer
from moerun import ConfigurableMoE, MoEConfig
from moerun.testing import make_case, reference_output, rel_err
from traces import ScheduleRecorder


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,bound", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_migration_every_forward_matches_reference(dtype, bound):
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=64, intermediate_size=32,
                    max_num_tokens=24, dtype=dtype)
    bal = LoadBalancer(EPLBConfig(num_layers=1, num_experts=8, num_slots=12, num_ranks=1,
                                  window_size=1, rebalance_interval=1), device=dev)
    steps, tokens = 8, 40
    case = make_case(cfg, steps * tokens, 7)
    rec = ScheduleRecorder()
    with ConfigurableMoE(cfg, balancer=bal.layer(0), layer_idx=0, device=dev,
                         recorder=rec) as layer:
        layer.load_weights(case.w13.to(dev), case.w2.to(dev))
        placements = set()
        for step in range(steps):
            sl = slice(step * tokens, (step + 1) * tokens)
            logits = case.logits[sl].clone()
            logits[:, step % 8] += 4.0  # a different hot expert every step
            out = layer(case.x[sl].to(dev), logits.to(dev))
            bal.step()
            glob = type(case)(x=case.x[sl], logits=logits, w13=case.w13, w2=case.w2,
                              shared=None, bias=None)
            assert rel_err(out.cpu(), reference_output(cfg, glob)) < bound
            placements.add(tuple(bal.placement().phy2log[0].tolist()))
        assert len(bal.migrations) >= steps - 1
        assert len(placements) > 1
    assert {e.stream for e in rec.events if e.phase == "experts"} == {"aux", "main"}
