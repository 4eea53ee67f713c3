"""Device benchmark of ``TritonExperts``: checks and times the 20-cell matrix in one call.

    python3 -m moerun.backends.triton.devbench [--shapes a,b] [--T 1,16,...] [--out DIR]
                                               [--no-variants] [--no-breakdown]

Per cell (shape x T, bf16, uniform random routing): the config the backend picks (tuned JSON
or heuristic) is checked against an fp64 reference on a poisoned allocator, then timed under
CUDA-graph replay (T <= 1024, several calls per graph on different routings) and eagerly;
``alt`` flips the combine (atomic <-> reduce); the breakdown times each launch alone. The
ceilings are measured first; ``floor/time`` uses them. Prints a short table last and writes
``devbench.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import torch

from moerun.backends.triton import _bench as B

# best peer per cell (us): graph replay for T <= 1024, eager at 8192; and the best eager peer
PEER = {
    "mixtral8x7b": ((249, 715, 771, 1758, 11007), (673, 1391, 1314, 2192, 11007)),
    "qwen3-30b-a3b": ((93, 247, 399, 521, 2562), (537, 492, 781, 952, 2562)),
    "qwen3-235b-a22b": ((148, 860, 1267, 2105, 8594), (645, 1383, 1976, 2396, 8594)),
    "deepseek-v3": ((262, 2156, 5363, 7858, 19159), (528, 2759, 5928, 8223, 19159)),
}


def _alt(cfg):
    if cfg.combine == "atomic":
        return dataclasses.replace(cfg, combine="reduce",
                                   down=dataclasses.replace(cfg.down, split_k=1))
    return dataclasses.replace(cfg, combine="atomic")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="devbench")
    p.add_argument("--shapes", default=",".join(B.SHAPES))
    p.add_argument("--T", default=",".join(str(t) for t in B.T_LIST))
    p.add_argument("--out", default=".")
    p.add_argument("--no-variants", action="store_true")
    p.add_argument("--no-breakdown", action="store_true")
    p.add_argument("--no-check", action="store_true")
    args = p.parse_args(argv)

    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.combine import moe_sum
    from moerun.backends.triton.configs import ConfigTable, bucket_of
    from moerun.backends.triton.down import down
    from moerun.backends.triton.experts import TritonExperts
    from moerun.backends.triton.gate_up import gate_up

    import triton

    t00 = time.time()
    dev = torch.cuda.get_device_name(0)
    print(f"devbench: {dev}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    ceil = B.measure_ceilings()
    print("ceilings: read {:.3e} B/s, copy {:.3e} B/s, bf16 {:.3e} flop/s".format(
        ceil["read_bw"], ceil["copy_bw"], ceil["bf16_flops"]), flush=True)

    shapes = [B.SHAPES[n] for n in args.shapes.split(",")]
    t_list = [int(t) for t in args.T.split(",")]
    table = ConfigTable(device_name=dev)
    items = []
    for s in shapes:
        for T in t_list:
            cfg = table.lookup(s.E, s.I, s.H, T, s.top_k, torch.bfloat16)
            items.append((s, cfg, torch.bfloat16))
            if not args.no_variants:
                items.append((s, _alt(cfg), torch.bfloat16))
    st = B.precompile(items)
    print(f"precompiled {len(st)} in {time.time() - t00:.0f}s; failures: "
          f"{[x for x in st if not x.startswith('ok')]}", flush=True)

    rows = []
    for s in shapes:
        w13, w2 = B.make_weights(s)
        for ti, T in enumerate(t_list):
            t0 = time.time()
            cfg = table.lookup(s.E, s.I, s.H, T, s.top_k, torch.bfloat16)
            graph = T <= B.GRAPH_MAX_T
            R = 8 if T <= 128 else (4 if T <= 1024 else 2)
            cases = [B.make_case(s, T, seed=1000 * ti + r) for r in range(R)]
            hit = sum(torch.unique(c.topk_ids).numel() for c in cases) / R
            floor = B.floor_us(s, T, round(hit), ceil)
            be = TritonExperts(ConfigTable(overrides={bucket_of(T): cfg}))
            row = {"shape": s.name, "T": T, "hit": hit, "floor_us": floor, "config": cfg.key()}
            if not args.no_check:
                c = cases[0]
                B.poison_allocator(1 << 30)
                out = be.run_experts(c.x, w13, w2, c.topk_weights, c.topk_ids)
                ref = B.reference_out(c.x, w13, w2, c.topk_weights, c.topk_ids)
                row["err"] = B.rel_err(out, ref)
                del out, ref
            fns = [lambda c=c: be.run_experts(c.x, w13, w2, c.topk_weights, c.topk_ids)
                   for c in cases]
            if graph:
                row["graph_us"] = B.time_per_call(fns, True)
            row["eager_us"] = B.time_per_call(fns, False, reps=5 if T >= 8192 else 10)
            if not args.no_variants:
                alt = _alt(cfg)
                be2 = TritonExperts(ConfigTable(overrides={bucket_of(T): alt}))
                fns2 = [lambda c=c: be2.run_experts(c.x, w13, w2, c.topk_weights, c.topk_ids)
                        for c in cases]
                row["alt"] = alt.key()
                row["alt_us"] = B.time_per_call(fns2, graph, reps=5 if T >= 8192 else 10)
            if not args.no_breakdown:
                k = s.top_k
                al = [moe_align(c.topk_ids, s.E, cfg.block_m) for c in cases]
                acts = [gate_up(c.x, w13, a, k, cfg.gate_up) for c, a in zip(cases, al)]
                bd = {"align": B.time_per_call(
                    [lambda c=c: moe_align(c.topk_ids, s.E, cfg.block_m) for c in cases], graph),
                      "align_single": B.time_per_call(
                    [lambda c=c: moe_align(c.topk_ids, s.E, cfg.block_m, programs=1,
                                           grid_kernel=False) for c in cases], graph),
                      "gate_up": B.time_per_call(
                    [lambda c=c, a=a: gate_up(c.x, w13, a, k, cfg.gate_up)
                     for c, a in zip(cases, al)], graph)}
                if cfg.combine == "atomic":
                    accs = [torch.zeros(T, s.H, device="cuda") for _ in cases]
                    bd["down"] = B.time_per_call(
                        [lambda c=c, a=a, x=x, o=o: down(x, w2, a, c.topk_weights, k, cfg.down,
                                                         atomic_out=o)
                         for c, a, x, o in zip(cases, al, acts, accs)], graph)
                    bd["finish"] = B.time_per_call([lambda o=o: o.to(torch.bfloat16)
                                                    for o in accs], graph)
                else:
                    ys = [down(x, w2, a, c.topk_weights, k, cfg.down)
                          for c, a, x in zip(cases, al, acts)]
                    bd["down"] = B.time_per_call(
                        [lambda c=c, a=a, x=x, y=y: down(x, w2, a, c.topk_weights, k, cfg.down,
                                                         out=y)
                         for c, a, x, y in zip(cases, al, acts, ys)], graph)
                    bd["finish"] = B.time_per_call(
                        [lambda c=c, y=y: moe_sum(y, c.topk_ids, s.E) for c, y in zip(cases, ys)],
                        graph)
                # bandwidth of the weight streams alone (bytes of hit experts' weights)
                bd["gate_up_TBs"] = hit * 2 * s.I * s.H * 2 / bd["gate_up"] / 1e6
                bd["down_TBs"] = hit * s.I * s.H * 2 / bd["down"] / 1e6
                row["breakdown"] = {kk: round(v, 2) for kk, v in bd.items()}
                del al, acts
            served = row.get("graph_us", row["eager_us"])
            row["floor_over_time"] = floor / served
            row["floor_over_eager"] = floor / row["eager_us"]
            peer_g, peer_e = PEER.get(s.name, ((None,) * 5, (None,) * 5))
            if T in B.T_LIST:
                row["peer_us"] = peer_g[B.T_LIST.index(T)]
                row["peer_eager_us"] = peer_e[B.T_LIST.index(T)]
            rows.append(row)
            print(json.dumps(row), f"({time.time() - t0:.1f}s)", flush=True)
            del cases, fns
            torch.cuda.empty_cache()
        del w13, w2
        torch.cuda.empty_cache()

    result = {"device": dev, "torch": torch.__version__, "triton": triton.__version__,
              "ceilings": ceil, "rows": rows, "command": " ".join(sys.argv)}
    with open(f"{args.out}/devbench.json", "w") as f:
        json.dump(result, f, indent=1)
    gm = B.geomean([r["floor_over_time"] for r in rows])
    print(f"\n{'shape':16s} {'T':>5s} {'floor':>7s} {'served':>8s} {'f/t':>5s} {'peer':>6s} "
          f"{'t/peer':>6s} {'eager':>7s} {'f/e':>5s} {'alt':>7s} err")
    for r in rows:
        served = r.get("graph_us", r["eager_us"])
        peer = r.get("peer_us")
        print(f"{r['shape'][:16]:16s} {r['T']:5d} {r['floor_us']:7.0f} {served:8.1f} "
              f"{r['floor_over_time']:5.2f} {peer or 0:6.0f} "
              f"{(served / peer) if peer else 0:6.2f} {r['eager_us']:7.0f} "
              f"{r['floor_over_eager']:5.2f} {r.get('alt_us', 0):7.0f} {r.get('err', -1):.1e}")
    print(f"geomean floor/time = {gm:.3f} over {len(rows)} cells; total {time.time() - t00:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
