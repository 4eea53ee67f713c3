"""Does the grouped fp8 call at qwen3-235b-ep8-local T=2048 (8192 pairs: the grid alignment)
record a launch program, and what does its call cost on the host with programs on and off?
Device script (follows eager_ws_probe.py).

    PYTHONPATH=. python3 benchmarks/experiments/session-2026-12-06c/program_check.py
"""

from __future__ import annotations

import statistics

import torch

from moerun._triton import program
from moerun.backends.triton import TritonExperts
from moerun.backends.triton.configs import ConfigTable, bucket_of
from moerun.bench.fp8 import fp8_weights
from moerun.bench.inputs import draw_routing
from moerun.bench.shapes import parse_shapes
from moerun.bench.timing import host_issue_samples
from moerun.env import get_env
from moerun.quant import ExpertQuant, QuantConfig, quantize_rows

from eager_ws_probe import GROUPED  # noqa: E402  (run from this folder's path)


def main() -> None:
    dev = torch.device("cuda")
    for name, t in (("qwen3-235b-ep8-local", 256), ("qwen3-235b-ep8-local", 2048)):
        shape = parse_shapes(name)[0]
        gen = torch.Generator(device=dev).manual_seed(0)
        w13, w2, s13, s2, _, _ = fp8_weights(shape, dev, gen, torch.bfloat16)
        eq = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2,
                         out_dtype=torch.bfloat16)
        q = quantize_rows(torch.randn(t, shape.hidden, generator=gen, device=dev,
                                      dtype=torch.bfloat16))
        w, ids = draw_routing(t, shape.num_experts, shape.top_k, gen, dev)
        be = TritonExperts(configs=ConfigTable(device_name=get_env().device_name,
                                               overrides={bucket_of(t): GROUPED}))
        for _ in range(3):
            be.run_experts(q, w13, w2, w, ids, quant=eq)
        torch.cuda.synchronize()
        entries = list(be._programs._entries.values())
        res = {}
        for mode in ("on", "off", "on", "off"):
            program.ENABLED = mode == "on"
            s = host_issue_samples(lambda i: be.run_experts(q, w13, w2, w, ids, quant=eq),
                                   dev, 30, warmup=2)
            res.setdefault(mode, []).append(round(statistics.median(s) * 1e6, 1))
        program.ENABLED = True
        print(f"{name} T={t}: program entries {[getattr(e, 'num_launches', e) for e in entries]}"
              f" | host us (idle device) on {res['on']} off {res['off']}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
