"""``moerun tune``: measure kernel configs on this GPU and merge the winners into the JSON
files of ``configs/`` (one file per ``(E, N=I, K=H, device)``, one entry per T bucket).

Usage (``main(argv)``; the CLI's ``tune`` subcommand forwards its arguments here)::

    moerun tune [--shapes mixtral8x7b,deepseek-v3 | E:K:H:I,...] [--T 1,16,128,1024,8192]
                [--budget-s 480] [--dtype bfloat16] [--out-dir DIR] [--dry-run]

Per point (shape, T) at most :data:`MAX_CONFIGS` configs are timed, on uniform random
routings (``_bench``: CUDA-graph replay for T <= 1024, eager above):

1. for each candidate ``block_m`` (at most two, from tokens per expert): the gate/up tiles
   alone, on that ``block_m``'s alignments;
2. with the best gate/up tile: whole calls for each down tile x combine candidate;
3. the file's current entry for the point (the incumbent), timed the same way.

The fastest whole call wins and replaces the entry; other entries in the file are kept, so
tuning accumulates across sessions. All candidates are compiled up front in parallel worker
processes (Triton's disk cache), since compiling dominates otherwise. The run stops starting
new points once ``--budget-s`` is spent and writes what it has.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from pathlib import Path

__all__ = ["main", "candidates", "MAX_CONFIGS"]

MAX_CONFIGS = 24
NUM_SMS = 132


def _routings_for(T: int) -> int:
    return 8 if T <= 128 else (4 if T <= 1024 else 2)


def candidates(E: int, top_k: int, H: int, I: int, T: int, elt: int = 2):
    """Pruned search space for one point: ``[(block_m, [GateUpConfig], [(DownConfig, combine)])]``.

    Decode-like points (<= 32 rows per hit expert) get narrow, deep-pipelined tiles and
    split-K/atomic down candidates; prefill points get 64/128-row wgmma-sized tiles and both
    combines.
    """
    from moerun.backends.triton.configs import SMEM_LIMIT
    from moerun.backends.triton.configs import DownConfig as D
    from moerun.backends.triton.configs import GateUpConfig as G

    pairs = T * top_k
    hit = min(E, pairs)
    tpe = pairs / hit
    if tpe <= 12:
        bms = [16]
    elif tpe <= 24:
        bms = [16, 32]
    elif tpe <= 48:
        bms = [32, 64]
    elif tpe <= 160:
        bms = [64, 128]
    else:
        bms = [128, 64]
    out = []
    for bm in bms:
        blocks = max(1, round(hit * max(1.0, tpe / bm)))
        if bm <= 32:  # memory-bound: weights streamed once; tiles differ little (call 1)
            # (the 3-stage n128k128 / n64k256 tiles exceed the 200 KiB the lookup allows:
            # listed with the stage count that actually runs)
            gus = [G(block_n=64, block_k=128, num_stages=4), G(block_n=64, block_k=128, num_stages=5),
                   G(block_n=64, block_k=256, num_stages=2),
                   G(block_n=128, block_k=128, num_warps=8, num_stages=2),
                   G(block_n=32, block_k=256, num_stages=3), G(block_n=32, block_k=128, num_stages=4)]
            if blocks * I // 64 < 2 * NUM_SMS:  # too few programs: narrower tiles first
                gus = [G(block_n=16, block_k=256, num_stages=4), G(block_n=32, block_k=256, num_stages=3),
                       G(block_n=32, block_k=128, num_stages=5), G(block_n=16, block_k=128, num_stages=6),
                       G(block_n=64, block_k=128, num_stages=4)]
            dns = [(D(block_n=64, block_k=256, num_stages=3), "atomic"),
                   (D(block_n=128, block_k=128), "atomic"), (D(block_n=64, block_k=128), "atomic"),
                   (D(block_n=32, block_k=256), "atomic"),
                   (D(block_n=64, block_k=256, num_stages=3), "reduce")]
            for split in (2, 4):
                bk = 256 if I % (256 * split) == 0 else 128
                if blocks * (H // 64) * split <= 4 * NUM_SMS and I % (bk * split) == 0:
                    dns.append((D(block_n=64, block_k=bk, split_k=split, num_stages=3), "atomic"))
            dns = dns[:7]
        elif bm == 64:
            gus = [G(block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=3),
                   G(block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=3),
                   G(block_n=128, block_k=64, group_m=4, num_warps=8, num_stages=3),
                   G(block_n=64, block_k=64, group_m=4, num_warps=4, num_stages=4),
                   G(block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4)]
            dns = [(D(block_n=64, block_k=256, num_stages=3), "atomic"),
                   (D(block_n=128, block_k=64, group_m=4), "reduce"),
                   (D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3), "reduce"),
                   (D(block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=3), "atomic"),
                   (D(block_n=128, block_k=64, group_m=4), "atomic")]
        else:  # 128-row wgmma tiles (T = 8192: n128k64 w8 s3 was best by 10-30 % in call 1)
            gus = [G(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3),
                   G(block_n=128, block_k=64, group_m=4, num_warps=8, num_stages=3),
                   G(block_n=128, block_k=32, group_m=8, num_warps=8, num_stages=5),
                   G(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=4),
                   G(block_n=128, block_k=64, group_m=16, num_warps=8, num_stages=3)]
            dns = [(D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3), "reduce"),
                   (D(block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=3), "reduce"),
                   (D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=4), "reduce"),
                   (D(block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3), "reduce"),
                   (D(block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3), "atomic")]
        gus = [g for g in gus if g.smem_bytes(bm, elt) <= SMEM_LIMIT]
        dns = [(d, c) for d, c in dns if d.smem_bytes(bm, elt) <= SMEM_LIMIT]
        out.append((bm, gus, dns))
    # keep the total within MAX_CONFIGS (one slot is the incumbent's)
    budget = MAX_CONFIGS - 1
    while sum(len(g) + len(d) for _, g, d in out) > budget:
        bm, g, d = max(out, key=lambda t: len(t[1]) + len(t[2]))
        i = out.index((bm, g, d))
        out[i] = (bm, g[:-1], d) if len(g) >= len(d) else (bm, g, d[:-1])
    return out


def _parse_shapes(spec: str | None):
    from moerun.backends.triton._bench import SHAPES, Shape

    if not spec:
        return list(SHAPES.values())
    shapes = []
    for name in spec.split(","):
        name = name.strip()
        if name in SHAPES:
            shapes.append(SHAPES[name])
        elif name.count(":") == 3:
            e, k, h, i = (int(v) for v in name.split(":"))
            shapes.append(Shape(name, e, k, h, i))
        else:
            raise ValueError(f"--shapes: unknown shape {name!r}; use one of "
                             f"{', '.join(SHAPES)} or E:K:H:I")
    return shapes


def _file_for(out_dir: Path, shape, device: str) -> Path:
    from moerun.backends.triton.configs import config_file_name

    return out_dir / config_file_name(shape.E, shape.I, shape.H, device)


def _read(path: Path) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    return {"meta": {}, "entries": {}}


def main(argv=None, prog: str = "moerun tune") -> int:
    """Entry point of ``moerun tune``; returns the exit status (0 ok, 2 no GPU)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=None,
                   help="comma list of shapes to tune: names (mixtral8x7b, qwen3-30b-a3b, "
                        "qwen3-235b-a22b, deepseek-v3) or E:K:H:I (experts, top-k, hidden, "
                        "intermediate); default: the four named shapes")
    p.add_argument("--T", default="1,16,128,1024,8192",
                   help="comma list of token counts T to tune; each T is timed and its winner "
                        "stored for the T bucket it falls in (default 1,16,128,1024,8192)")
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="wall-clock budget in seconds, compilation included: once spent, no "
                        "new (shape, T) point is started and the points tuned so far are "
                        "written (default 480)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"],
                   help="activation/weight dtype the kernels are compiled and timed in "
                        "(default bfloat16)")
    p.add_argument("--out-dir", default=None,
                   help="folder of the config JSON files to merge into (default: the "
                        "package's moerun/backends/triton/configs)")
    p.add_argument("--dry-run", action="store_true",
                   help="time and print the winners, write nothing (default: merge them "
                        "into the JSON files)")
    p.add_argument("--workers", type=int, default=0,
                   help="parallel compile processes (default 0: CPU cores - 2)")
    args = p.parse_args(argv)

    import torch

    from moerun.backends.triton import _bench as B
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.configs import (CONFIG_DIR, ConfigTable, ExpertsConfig,
                                                bucket_of, default_config, fit_to_dtype)
    from moerun.backends.triton.experts import TritonExperts
    from moerun.backends.triton.gate_up import gate_up

    if not torch.cuda.is_available():
        print("moerun tune: needs a CUDA GPU", file=sys.stderr)
        return 2
    t_start = time.time()
    shapes = _parse_shapes(args.shapes)
    t_list = [int(t) for t in args.T.split(",")]
    dtype = getattr(torch, args.dtype)
    out_dir = Path(args.out_dir) if args.out_dir else CONFIG_DIR
    device = torch.cuda.get_device_name(0)
    command = " ".join([prog] + [shlex.quote(a) for a in (argv if argv is not None
                                                          else sys.argv[1:])])

    # 0. incumbents and every candidate, compiled in parallel
    plan = []
    compile_items = []
    for shape in shapes:
        data = _read(_file_for(out_dir, shape, device))
        for T in t_list:
            inc = data["entries"].get(str(bucket_of(T)))
            inc = ExpertsConfig.from_json(inc["config"]) if inc else default_config(
                shape.E, shape.I, shape.H, bucket_of(T), shape.top_k)
            cands = candidates(shape.E, shape.top_k, shape.H, shape.I, T)
            plan.append((shape, T, inc, cands))
            compile_items.append((shape, inc, dtype))
            for bm, gus, dns in cands:
                for g in gus:
                    compile_items.append((shape, ExpertsConfig(block_m=bm, gate_up=g, down=dns[0][0],
                                                               combine=dns[0][1]), dtype))
                for d, c in dns:
                    compile_items.append((shape, ExpertsConfig(block_m=bm, gate_up=gus[0], down=d,
                                                               combine=c), dtype))
    status = B.precompile(compile_items, workers=args.workers or None)
    fails = [s for s in status if not s.startswith("ok")]
    print(f"tune: compiled {len(status)} configs in {time.time() - t_start:.0f}s, "
          f"{len(fails)} failed", flush=True)
    for f in fails:
        print("  " + f)

    results = {}  # (shape name, T) -> (cfg, us, timing)
    for shape, T, inc, cands in plan:
        if time.time() - t_start > args.budget_s:
            print(f"tune: budget spent, skipping {shape.name} T={T}")
            continue
        t0 = time.time()
        w13, w2 = _weights(B, shape, dtype)
        graph = T <= B.GRAPH_MAX_T
        cases = [B.make_case(shape, T, dtype, seed=100 + r) for r in range(_routings_for(T))]
        reps = 10 if graph else 3

        def time_full(cfg):
            be = TritonExperts(ConfigTable(overrides={bucket_of(T): cfg}))
            fns = [lambda c=c: be.run_experts(c.x, w13, w2, c.topk_weights, c.topk_ids)
                   for c in cases]
            return B.time_per_call(fns, graph, reps=reps)

        rows = []
        best = (float("inf"), None)
        for bm, gus, dns in cands:
            aligns = [moe_align(c.topk_ids, shape.E, bm) for c in cases]
            best_gu = (float("inf"), None)
            for g in gus:
                try:
                    fns = [lambda c=c, a=a: gate_up(c.x, w13, a, shape.top_k, g)
                           for c, a in zip(cases, aligns)]
                    us = B.time_per_call(fns, graph, reps=reps)
                except Exception as e:  # noqa: BLE001 -- a failing candidate is skipped
                    rows.append((f"gu m{bm} {g}", float("nan"), repr(e)[:80]))
                    continue
                rows.append((f"gate_up m{bm} n{g.block_n}k{g.block_k}g{g.group_m}w{g.num_warps}s{g.num_stages}", us, ""))
                best_gu = min(best_gu, (us, g), key=lambda t: t[0])
            if best_gu[1] is None:
                continue
            for d, comb in dns:
                cfg = ExpertsConfig(block_m=bm, gate_up=best_gu[1], down=d, combine=comb)
                try:
                    us = time_full(cfg)
                except Exception as e:  # noqa: BLE001
                    rows.append((cfg.key(), float("nan"), repr(e)[:80]))
                    continue
                rows.append((cfg.key(), us, "full"))
                best = min(best, (us, cfg), key=lambda t: t[0])
        try:
            us = time_full(inc)
            rows.append((inc.key(), us, "incumbent"))
            best = min(best, (us, inc), key=lambda t: t[0])
        except Exception as e:  # noqa: BLE001
            rows.append((inc.key(), float("nan"), "incumbent " + repr(e)[:80]))
        print(f"== {shape.name} T={T}: {len(rows)} timed in {time.time() - t0:.1f}s; best "
              f"{best[0]:.1f} us {best[1].key() if best[1] else None}", flush=True)
        for name, us, note in rows:
            print(f"   {us:10.1f}  {name}  {note}")
        if best[1] is not None:  # store what ran: the lookup fits configs to shared memory
            results[(shape.name, T)] = (fit_to_dtype(best[1], dtype), best[0],
                                        "graph" if graph else "eager")
        del cases
        torch.cuda.empty_cache()

    if args.dry_run:
        print("tune: --dry-run, nothing written")
        return 0
    today = datetime.date.today().isoformat()
    meta_env = {"torch": torch.__version__, "triton": _triton_version()}
    for shape in shapes:
        mine = {T: v for (n, T), v in results.items() if n == shape.name}
        if not mine:
            continue
        path = _file_for(out_dir, shape, device)
        data = _read(path)
        meta = data.get("meta", {})
        hist = meta.get("history", [])
        hist.append({"command": command, "date": today, "device": device,
                     "T": sorted(mine), **meta_env})
        data["meta"] = {"written_by": "moerun tune (moerun/backends/triton/tune.py)",
                        "command": command, "date": today, "device": device, **meta_env,
                        "shape": {"E": shape.E, "top_k": shape.top_k, "H": shape.H,
                                  "I": shape.I, "name": shape.name},
                        "dtype": args.dtype, "history": hist[-20:]}
        for T, (cfg, us, timing) in mine.items():
            data["entries"][str(bucket_of(T))] = {"config": cfg.to_json(), "us": round(us, 2),
                                                  "timing": timing, "T": T, "date": today}
        data["entries"] = dict(sorted(data["entries"].items(), key=lambda kv: int(kv[0])))
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"tune: wrote {path} ({len(mine)} entries)")
    print(f"tune: done in {time.time() - t_start:.0f}s")
    return 0


_W = {}


def _weights(B, shape, dtype):
    key = (shape, dtype)
    if key not in _W:
        _W.clear()
        import torch

        torch.cuda.empty_cache()
        _W[key] = B.make_weights(shape, dtype)
    return _W[key]


def _triton_version() -> str:
    import triton

    return triton.__version__


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="python3 -m moerun.backends.triton.tune"))
