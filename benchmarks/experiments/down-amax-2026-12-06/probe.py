"""The fp8 direct down with each row's group amax given (``down.down_direct(amax=)``)
against the shipped form that reduces it in registers every K step (2026-12-06; README here).

At qwen3-30b T=1 the fp8 per-pair down reads its 12.6 MB at about 0.43 of the bandwidth on
an H100, the bf16 one at 0.67 (RESULTS, 2026-12-05): with half the bytes and the same steps
and programs, each step's cross-thread amax of the quantized row sits in the dependency
chain. This probe times the down launch alone, per cell at T=1 with the card's shipped fp8
direct entry: the shipped form, and the same launch reading a precomputed ``[P, I/C]`` amax
(``C`` = the entry's gate/up ``block_n``, as the gate/up launch would write it). Graph
replay of ``--calls`` launches, each on its own routing and intermediate (drawn first),
interleaved rounds, median; outputs compared bit for bit.

    PYTHONPATH=. python3 benchmarks/experiments/down-amax-2026-12-06/probe.py --out p.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _cell(name: str, calls: int, replays: int, rounds: int, dev) -> dict:
    from moerun.backends.triton import TritonExperts
    from moerun.backends.triton.down import down_direct
    from moerun.bench.inputs import draw_routing
    from moerun.bench.shapes import parse_shapes
    from moerun.bench.timing import time_graph_replay

    shape = parse_shapes(name)[0]
    e, h, i, k = shape.num_experts, shape.hidden, shape.intermediate, shape.top_k
    gen = torch.Generator(device=dev).manual_seed(0)
    c = torch.randint(0, 254, (e, h, i), generator=gen, device=dev, dtype=torch.uint8)
    w2 = torch.where(c >= 127, c + 1, c).view(torch.float8_e4m3fn)
    del c
    s2 = (torch.rand(e, h // 128, i // 128, generator=gen, device=dev) + 0.5) * i ** -0.5 / 100
    cfg = TritonExperts().fp8_config_for(e, i, h, 1, k)
    rec = {"cell": name, "config": cfg.key()}
    if cfg.kernel != "direct":
        rec["note"] = "shipped fp8 T=1 entry is not direct: skipped"
        return rec
    chunk = cfg.gate_up.block_n
    cases = []
    for _ in range(calls):
        w, ids = draw_routing(1, e, k, gen, dev)
        act = (torch.randn(k, i, generator=gen, device=dev) * 0.5).to(torch.bfloat16)
        amax = act.float().abs().view(k, i // chunk, chunk).amax(-1).contiguous()
        cases.append((w, ids, act, amax))
    atomic = cfg.combine == "atomic"
    n_tiles = -(-h // cfg.down.block_n)

    def call(j, with_amax):
        w, ids, act, amax = cases[j]
        cnt = torch.zeros(n_tiles, dtype=torch.int32, device=dev) if atomic else None
        return down_direct(act, w2, ids, cfg.down, counters=cnt, w2_scale=s2,
                           topk_weights=w, swap_ab=cfg.swap_ab,
                           amax=amax if with_amax else None)

    samples = {"shipped": [], "amax": []}
    for r in range(rounds):
        for v in (("shipped", "amax") if r % 2 == 0 else ("amax", "shipped")):
            us = time_graph_replay(lambda j, v=v: call(j, v == "amax"), calls, replays, warmup=3)
            samples[v].append(statistics.median(us) * 1e6)
    a, b = call(0, False), call(0, True)
    torch.cuda.synchronize()
    rec.update({v: {"us": round(statistics.median(x), 2), "rounds": [round(u, 2) for u in x]}
                for v, x in samples.items()})
    rec["bit_equal"] = bool(torch.equal(a, b))
    rec["bytes_us"] = round(e and (k * h * i) / 3.16e12 * 1e6, 2)  # at the H100's read rate
    print(name, cfg.key(), json.dumps({v: rec[v]["us"] for v in samples}), "equal",
          rec["bit_equal"], flush=True)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cells", default="qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cells": []}
    for name in args.cells.split(","):
        res["cells"].append(_cell(name, args.calls, args.replays, args.rounds, dev))
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
