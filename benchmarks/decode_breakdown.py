"""Where the time of a decode call goes: the kernels of one ``TritonExperts.run_experts`` call
at a small T, each timed alone, against the whole call and the bandwidth floor.

Runs on a CUDA GPU (issue 11: qwen3-30b T=1 sits at 0.60 of the floor). For each shape and T
it captures, in CUDA graphs of ``--calls`` copies each: the whole call with the shipped
(tuned) config; then each launch of that call alone (alignment, gate/up, down, combine/cast),
on the buffers the whole call made. Times are the median over ``--repeats`` replays
(events), divided by ``--calls``. The read bandwidth ceiling is measured in the same run
(``moerun.bench``'s run ceilings). Output: one line per kernel, and
``--out`` JSON.

    python3 benchmarks/decode_breakdown.py --shapes qwen3-30b-a3b,deepseek-v3 --T 1 --out x.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def _graph_us(fn, calls: int, repeats: int) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def main() -> None:
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum
    from moerun.backends.triton.down import down
    from moerun.backends.triton.experts import TritonExperts
    from moerun.backends.triton.gate_up import gate_up
    from moerun.bench.ceilings import measure_run_ceilings
    from moerun.bench.inputs import make_case, make_weights
    from moerun.bench.shapes import parse_shapes

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="qwen3-30b-a3b,qwen3-235b-a22b")
    p.add_argument("--T", default="1")
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    dev = torch.device("cuda")
    ceil = measure_run_ceilings(dev, torch.bfloat16)
    print(f"ceilings: {ceil}")
    rows = []
    for shape in parse_shapes(a.shapes):
        w = make_weights(shape, torch.bfloat16, dev, seed=0)
        for t in (int(v) for v in a.T.split(",")):
            c = make_case(shape, t, torch.bfloat16, dev, seed=1)
            be = TritonExperts()
            s, two_i, h = w.w13.shape
            cfg = be.config_for(s, two_i // 2, h, t, shape.top_k, torch.bfloat16)
            ids = c.topk_ids.to(torch.int32).contiguous()
            tw = c.topk_weights.float().contiguous()
            hit = int(torch.unique(ids).numel())
            read = hit * 3 * two_i // 2 * h * 2
            floor = read / ceil.bandwidth * 1e6
            res = {"shape": shape.name, "T": t, "config": cfg.key(), "hit": hit,
                   "floor_us": floor}
            res["whole"] = _graph_us(lambda: be._run_plain(c.x, w.w13, w.w2, tw, ids, None,
                                                           None), a.calls, a.repeats)
            if cfg.kernel == "grouped":
                atomic = cfg.combine == "atomic"
                acc = torch.zeros(t, h, device=dev) if atomic else None
                al = moe_align(ids, s, cfg.block_m, zero=acc)
                act = gate_up(c.x, w.w13, al, shape.top_k, cfg.gate_up)
                res["align"] = _graph_us(lambda: moe_align(ids, s, cfg.block_m, zero=acc),
                                         a.calls, a.repeats)
                res["gate_up"] = _graph_us(lambda: gate_up(c.x, w.w13, al, shape.top_k,
                                                           cfg.gate_up, out=act),
                                           a.calls, a.repeats)
                if atomic:
                    res["down"] = _graph_us(lambda: down(act, w.w2, al, tw, shape.top_k,
                                                         cfg.down, atomic_out=acc),
                                            a.calls, a.repeats)
                    res["combine"] = _graph_us(lambda: acc.to(torch.bfloat16), a.calls,
                                               a.repeats)
                else:
                    y = down(act, w.w2, al, tw, shape.top_k, cfg.down)
                    res["down"] = _graph_us(lambda: down(act, w.w2, al, tw, shape.top_k,
                                                         cfg.down, out=y), a.calls, a.repeats)
                    res["combine"] = _graph_us(lambda: moe_sum(y, ids, s), a.calls, a.repeats)
                gu_bytes = hit * two_i * h * 2
                res["gate_up_floor_us"] = gu_bytes / ceil.bandwidth * 1e6
                res["down_floor_us"] = (read - gu_bytes) / ceil.bandwidth * 1e6
            rows.append(res)
            print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v)
                              for k, v in res.items()}), flush=True)
        w = None  # free the weights before the next shape
        torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"ceilings": str(ceil), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
