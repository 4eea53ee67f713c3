"""Kernel-level diagnostics of ``TritonExperts`` on a GPU: per cell, the time of each launch
alone and of the alternate combine, next to the whole call. A thin user of ``moerun.bench``
(shapes, inputs, ceilings, floor, timing, peers); the benchmark of record is ``moerun bench``.

    python3 -m moerun.backends.triton.devbench [--shapes a,b] [--tokens 1,16,...] [--out DIR]
                                               [--no-variants] [--peers PATH|none]

Per cell (a ``moerun bench`` shape x T, bf16, uniform random routing; each shape's own T list
by default): the config the backend picks and its source (tuned file or heuristic), the whole
call in the bench's serving mode (graph replay for T <= 1024 unless EP-local, else eager),
``alt`` = the other combine (atomic <-> reduce), and the breakdown: alignment (grid and
single-program kernels), gate/up, down, finish (cast or top-k sum), each timed alone in the
same mode, plus the effective weight bandwidth of the two GEMMs. Writes ``devbench.json``
under ``--out``; one JSON line per cell on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch

__all__ = ["main"]


def _alt(cfg):
    if cfg.combine == "atomic":
        return dataclasses.replace(cfg, combine="reduce",
                                   down=dataclasses.replace(cfg.down, split_k=1))
    return dataclasses.replace(cfg, combine="atomic")


def main(argv=None) -> int:
    """Entry point of ``devbench``: times the Triton backend and its stages on every bench cell;
    returns 0.

    Side effects: prints to stdout, writes ``<--out>/devbench.json``, allocates and times work on
    CUDA device 0 with host syncs (``torch.unique(...).numel()``, timers); not capturable."""
    p = argparse.ArgumentParser(prog="devbench", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default=None, help="bench shapes (default: the bench's GPU "
                   "matrix)")
    p.add_argument("--tokens", default=None, help="T list (default: each shape's own)")
    p.add_argument("--out", default=".", help="folder of devbench.json (default .)")
    p.add_argument("--no-variants", action="store_true", help="skip the alternate combine")
    p.add_argument("--peers", default=None, help="peer file, or 'none' (default: the newest "
                   "../shared/peers/h200-*.json next to the project root)")
    args = p.parse_args(argv)

    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum
    from moerun.backends.triton.configs import ConfigTable
    from moerun.backends.triton.down import down
    from moerun.backends.triton.experts import TritonExperts
    from moerun.backends.triton.gate_up import gate_up
    from moerun.backends.triton.tune_plan import point_mode
    from moerun.bench.ceilings import floor_for, measure_run_ceilings
    from moerun.bench.inputs import make_case, make_weights, reference_rows
    from moerun.bench.matrix import plan_cells
    from moerun.bench.peers import find_peer_file, load_peers
    from moerun.bench.shapes import parse_shapes, parse_tokens
    from moerun.bench.timing import time_graph_replay, time_samples
    from moerun.testing import rel_err

    t00 = time.time()
    cuda, dtype = torch.device("cuda"), torch.bfloat16
    dev = torch.cuda.get_device_name(0)
    ceilings = measure_run_ceilings(cuda, dtype)
    print(f"devbench: {dev}; ceilings {ceilings.describe()}", flush=True)
    path = None if args.peers == "none" else (args.peers or find_peer_file())
    peers = load_peers(path) if path else None
    print(f"peers: {peers.describe() if peers else 'none'}", flush=True)
    table = ConfigTable(device_name=dev)
    elt = 2

    def timed(fns, mode) -> float:
        n = len(fns)
        if mode == "graph":
            return statistics.median(time_graph_replay(lambda i: fns[i](), n, 10, warmup=2)) * 1e6
        return statistics.median(time_samples(lambda i: fns[i % n](), cuda, max(6, n),
                                              warmup=n)) * 1e6

    rows, weights_of = [], None
    for shape, t in plan_cells(parse_shapes(args.shapes), parse_tokens(args.tokens)):
        t0 = time.time()
        if weights_of is None or weights_of[0] != shape:
            weights_of = None
            torch.cuda.empty_cache()
            weights_of = (shape, make_weights(shape, dtype, cuda, seed=0))
        w13, w2 = weights_of[1].w13, weights_of[1].w2
        mode = point_mode(shape, t, 1024)
        choice = table.lookup(shape.num_experts, shape.intermediate, shape.hidden, t,
                              shape.top_k, dtype)
        cfg, k, s = choice.config, shape.top_k, shape.num_experts
        cases = [make_case(shape, t, dtype, cuda, seed=1000 + r)
                 for r in range(8 if t <= 128 else (4 if t <= 1024 else 2))]
        hit = sum(int(torch.unique(c.topk_ids).numel()) for c in cases) / len(cases)  # sync
        floor = floor_for(shape, t, hit, elt, ceilings)
        be = TritonExperts(ConfigTable(overrides={choice.bucket: cfg}))
        c0 = cases[0]
        check = torch.arange(min(t, 64), device=cuda)
        out = be.run_experts(c0.x, w13, w2, c0.topk_weights, c0.topk_ids)
        ref = reference_rows(c0.x[check], w13, w2, c0.topk_weights[check], c0.topk_ids[check])
        row = {"shape": shape.name, "T": t, "group": shape.group, "mode": mode, "hit": hit,
               "floor_us": floor.us, "bound": floor.bound, "config": cfg.key(),
               "config_source": choice.describe(), "err": rel_err(out[check], ref)}
        del out, ref
        row["us"] = timed([lambda c=c: be.run_experts(c.x, w13, w2, c.topk_weights,
                                                      c.topk_ids) for c in cases], mode)
        row["floor_over_time"] = floor.us / row["us"]
        best = peers.best(shape=shape.name, tokens=t, dims=(s, k, shape.hidden,
                                                            shape.intermediate),
                          mode=mode, bound=floor.bound, ceilings=ceilings) if peers else None
        if best is not None:
            row["peer"] = {"name": best.name, "scaled_us": best.scaled_us}
            row["peer_over_ours"] = best.scaled_us / row["us"]
        if not args.no_variants:
            be2 = TritonExperts(ConfigTable(overrides={choice.bucket: _alt(cfg)}))
            row["alt"] = _alt(cfg).key()
            row["alt_us"] = timed([lambda c=c: be2.run_experts(c.x, w13, w2, c.topk_weights,
                                                               c.topk_ids) for c in cases], mode)
        al = [moe_align(c.topk_ids, s, cfg.block_m) for c in cases]
        acts = [gate_up(c.x, w13, a, k, cfg.gate_up) for c, a in zip(cases, al)]
        bd = {"align": timed([lambda c=c: moe_align(c.topk_ids, s, cfg.block_m)
                              for c in cases], mode),
              "align_single": timed([lambda c=c: moe_align(c.topk_ids, s, cfg.block_m,
                                                           programs=1, grid_kernel=False)
                                     for c in cases], mode),
              "gate_up": timed([lambda c=c, a=a: gate_up(c.x, w13, a, k, cfg.gate_up)
                                for c, a in zip(cases, al)], mode)}
        if cfg.combine == "atomic":
            accs = [torch.zeros(t, shape.hidden, device=cuda) for _ in cases]
            bd["down"] = timed([lambda c=c, a=a, x=x, o=o: down(x, w2, a, c.topk_weights, k,
                                                                cfg.down, atomic_out=o)
                                for c, a, x, o in zip(cases, al, acts, accs)], mode)
            bd["finish"] = timed([lambda o=o: o.to(dtype) for o in accs], mode)
        else:
            ys = [down(x, w2, a, c.topk_weights, k, cfg.down) for c, a, x in zip(cases, al, acts)]
            bd["down"] = timed([lambda c=c, a=a, x=x, y=y: down(x, w2, a, c.topk_weights, k,
                                                                cfg.down, out=y)
                                for c, a, x, y in zip(cases, al, acts, ys)], mode)
            bd["finish"] = timed([lambda c=c, y=y: moe_sum(y, c.topk_ids, s)
                                  for c, y in zip(cases, ys)], mode)
        # bandwidth of the weight streams alone (bytes of the hit experts' weights), TB/s
        bd["gate_up_TBs"] = hit * 2 * shape.intermediate * shape.hidden * elt / bd["gate_up"] / 1e6
        bd["down_TBs"] = hit * shape.intermediate * shape.hidden * elt / bd["down"] / 1e6
        row["breakdown"] = {kk: round(v, 2) for kk, v in bd.items()}
        rows.append(row)
        print(json.dumps(row), f"({time.time() - t0:.1f}s)", flush=True)
        del cases, al, acts
        torch.cuda.empty_cache()

    result = {"device": dev, "torch": torch.__version__, "ceilings": dataclasses.asdict(ceilings),
              "peers": peers.path if peers else None, "rows": rows,
              "command": " ".join(sys.argv)}
    with open(f"{args.out}/devbench.json", "w") as f:
        json.dump(result, f, indent=1)
    print(f"devbench: {len(rows)} cells in {time.time() - t00:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
