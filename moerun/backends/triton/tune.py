"""``moerun tune``: measure kernel configs on this GPU and merge the winners into the JSON
files of ``configs/``, one file per local shape ``S{S}_N{I}_K{H}_{dtype}_{device}.json`` (the
key ``ConfigTable.lookup`` uses), one entry per T bucket.

Usage (``main(argv)``; the CLI's ``tune`` subcommand forwards its arguments here)::

    moerun tune [--shapes deepseek-v3-ep8-local,qwen3-235b-ep8-local | E:K:H:I,...]
                [--T 256,2048] [--budget-s 480] [--dtype bfloat16|float16|fp8]
                [--out-dir DIR] [--dry-run | --plan] [--ceilings READ,COPY,FLOPS]

Shapes are those of ``moerun bench`` (``moerun.bench.shapes``: the four model layers, the
EP-local shapes -- the slots one rank holds under EP8 --, ``tiny``, or ``E:K:H:I``), each with
its own T list. Inputs, timing, ceilings and the floor are ``moerun.bench``'s: uniform random
routings (``moerun.bench.inputs``), device events, CUDA-graph replay per call where the bench
serves the cell by graph (T <= ``--graph-max-tokens``, not EP-local), eager otherwise; the
ceilings are measured once per run and each winner's floor/time is printed and stored.

``--dtype fp8`` tunes the fp8 block-scaled kernels (``fp8.py``) into the
``..._float8_e4m3fn_<device>.json`` files: the timed call is the layer's (``quantize_rows``,
its own launch, then ``run_experts(..., quant=)``; ``tune_calls.Fp8Calls``) with bf16
activations on e4m3 weights and fp32 block scales; the candidates are
``tune_plan.fp8_candidates``; the floor is ``moerun.bench.fp8``'s, with the fp8 GEMM rate
measured in the same run (``torch._scaled_mm``).

Per point (shape, T) at most :data:`~moerun.backends.triton.tune_plan.MAX_CONFIGS` configs
(fp8: :data:`~moerun.backends.triton.tune_plan.FP8_MAX_CONFIGS`) are timed:

1. for each candidate set (a ``block_m``, at most two, from rows per expert; fp8: a prefill
   ``block_m`` has one set per intermediate form): the gate/up tiles alone, on that
   ``block_m``'s alignments;
2. with the best gate/up tile: whole calls for each down tile x combine candidate;
3. the file's current entry for the point (the incumbent), timed the same way;
4. on CUDA, the finalists -- the whole calls within :data:`FINAL_WITHIN` of the fastest, at
   most :data:`FINAL_MAX`, plus the incumbent wherever it was timed -- timed again
   :data:`FINAL_ROUNDS` times, interleaved (A B C A B C ...), each finalist's time the median
   of its rounds. One config timed twice in one run read 1.4-3.3 % apart at eager
   prefill points (H200, 2026-12-02), as far apart as most configs there, so a single
   timing picks a winner partly by noise. The incumbent is re-timed even when it is not
   close: otherwise a challenger that reads far ahead once replaces a measured entry on that
   one timing (an EP-local ws point read 385 µs once against 438-794 for its siblings and
   519 for the incumbent, H200, 2026-12-05).

The fastest whole call (the fastest finalist where there are two or more) wins and replaces
the entry, except that an incumbent among the finalists is kept unless a challenger's median
beats its median by more than :data:`KEEP_MARGIN` (:func:`pick_winner`): a 0.4 % "win" at a
point where one config reads 1-3 % apart between timings is a flip on noise, and it would
rewrite a measured entry for nothing. Other entries in the file are kept, so tuning
accumulates across sessions. All candidates are compiled up front in parallel worker
processes (Triton's disk cache), since compiling dominates otherwise. The run stops starting
new points once ``--budget-s`` is spent and writes what it has. ``--plan`` prints the
points, candidate counts and target files without a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

from moerun._precision import exact_fp32

__all__ = ["main", "build_parser", "run_points", "write_winners", "finalists", "pick_winner",
           "FINAL_WITHIN", "FINAL_MAX", "FINAL_ROUNDS", "KEEP_MARGIN"]

_SAMPLES = {"graph": 10, "eager": 6}


#: Whole calls within this fraction of a point's fastest are finalists (step 4).
FINAL_WITHIN = 0.04
#: Finalists per point at most (the fastest first).
FINAL_MAX = 4
#: Interleaved re-timings of each finalist (each one a normal timing: ``_SAMPLES``).
FINAL_ROUNDS = 3
#: A finalist replaces the incumbent only when its median is faster by more than this.
KEEP_MARGIN = 0.01


def finalists(timed: list[tuple[float, object]], *, within: float = FINAL_WITHIN,
              most: int = FINAL_MAX, keep=None) -> list:
    """The configs of ``timed`` (``(µs, config)`` whole-call timings; NaN for a failed one)
    within ``within`` of the fastest, fastest first, each config once (its best timing),
    at most ``most``; then ``keep`` (the incumbent), if it was timed (not NaN) and is not
    among them yet. Empty when nothing was timed. Pure host code."""
    best: dict = {}
    for us, cfg in timed:
        if not math.isnan(us) and (cfg not in best or us < best[cfg]):
            best[cfg] = us
    if not best:
        return []
    ranked = sorted(best.items(), key=lambda kv: kv[1])
    bar = ranked[0][1] * (1.0 + within)
    out = [cfg for cfg, us in ranked if us <= bar][:most]
    if keep is not None and keep in best and keep not in out:
        out.append(keep)
    return out


def pick_winner(final_us: dict, incumbent, *, margin: float = KEEP_MARGIN):
    """The winning config of step 4's medians ``final_us`` (``{config: µs}``, not empty):
    the fastest, unless ``incumbent`` is among them and the fastest is not faster than it by
    more than ``margin`` (a fraction of the incumbent's µs), in which case the incumbent is
    kept. Pure host code."""
    win = min(final_us, key=final_us.__getitem__)
    if incumbent in final_us and final_us[win] >= final_us[incumbent] * (1.0 - margin):
        return incumbent
    return win


def _routings_for(tokens: int) -> int:
    return 8 if tokens <= 128 else (4 if tokens <= 1024 else 2)


def build_parser(prog: str = "moerun tune") -> argparse.ArgumentParser:
    """The flags of ``moerun tune`` (every help names its default). Pure; host only."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=None,
                   help="comma list of bench shapes to tune: mixtral8x7b, qwen3-30b-a3b, "
                        "qwen3-235b-a22b, deepseek-v3, deepseek-v3-ep8-local, "
                        "qwen3-235b-ep8-local, tiny, or E:K:H:I (slots, top-k, hidden, "
                        "intermediate); each is tuned at its local slot count; with --dtype "
                        "fp8 H and I must be multiples of 128 (tiny is refused); default: the "
                        "bench's GPU matrix (the four model shapes and the two EP-local ones, "
                        "for every --dtype)")
    p.add_argument("--T", "--tokens", dest="T", default=None,
                   help="comma list of token counts T to tune; each T is timed and its winner "
                        "stored for the T bucket it falls in (default: each shape's own list, "
                        "1,16,128,1024,8192 for the model shapes, 256,2048,8192,32768 for the "
                        "EP-local ones)")
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="wall-clock budget in seconds, compilation included: once spent, no "
                        "new (shape, T) point is started and the points tuned so far are "
                        "written (default 480)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "fp8"],
                   help="activation/weight dtype the kernels are compiled and timed in; part "
                        "of the file's key (default bfloat16); fp8: the FP8 block-scaled "
                        "kernels (e4m3 weights with 128x128 fp32 block scales, bf16 "
                        "activations quantized per 128 columns by their own launch), files "
                        "..._float8_e4m3fn_<device>.json")
    p.add_argument("--out-dir", default=None,
                   help="folder of the config JSON files to merge into (default: the "
                        "package's moerun/backends/triton/configs)")
    p.add_argument("--dry-run", action="store_true",
                   help="time and print the winners, write nothing (default: merge them "
                        "into the JSON files)")
    p.add_argument("--plan", action="store_true",
                   help="print the points, their serving mode, incumbents, candidate counts "
                        "and target files, then exit; no GPU needed, nothing timed or written; "
                        "with --dtype fp8 a block_m marked f8 is the set after whose gate/up "
                        "tiles the down GEMM reads the intermediate in fp8 (written so by the "
                        "gate/up epilogue, or quantized by its own launch after a paired tile) "
                        "(default: tune)")
    p.add_argument("--device-name", default=None,
                   help="device name of the target files for --plan on a machine without a "
                        "GPU (default: GPU 0's name; a real run always uses GPU 0's)")
    p.add_argument("--graph-max-tokens", type=int, default=1024,
                   help="largest T timed as CUDA-graph replay, as in moerun bench (EP-local "
                        "shapes are always eager; default 1024)")
    p.add_argument("--ceilings", default=None, metavar="READ_BW,COPY_BW,FLOPS",
                   help="use these ceilings (B/s, B/s read+write, FLOP/s) for the floor/time "
                        "of the winners instead of measuring; with --dtype fp8 FLOPS is the "
                        "fp8 GEMM rate of the fp8 floor (default: measured once per run, as "
                        "moerun bench does; with --dtype fp8 the fp8 rate too, as moerun "
                        "bench --dtype fp8 measures it)")
    p.add_argument("--workers", type=int, default=0,
                   help="parallel compile processes, >= 0 (default 0: CPU cores - 2)")
    return p


def _print_plan(points, out_dir: Path, out) -> None:
    total = 0
    for pt in points:
        total += pt.num_configs
        print(f"point {pt.shape.name} T={pt.tokens} bucket={pt.bucket} mode={pt.mode} "
              f"S={pt.shape.num_experts} configs={pt.num_configs} "
              f"block_m={','.join(c.label for c in pt.candidate_sets)} "
              f"persistent={len(pt.persistent)} direct={len(pt.direct)} "
              f"swap={pt.swap_configs} "
              f"incumbent=\"{pt.incumbent_source}\" file={out_dir / pt.file_name}", file=out)
    print(f"plan: {len(points)} points, {total} configs to time", file=out)


@exact_fp32()
def main(argv=None, prog: str = "moerun tune") -> int:
    """Entry point of ``moerun tune``; returns the exit status (0 ok, 2 usage error or no
    GPU for a real run).

    Side effects: prints to stdout/stderr; a real run turns TF32
    off while it runs (:func:`moerun._precision.exact_fp32`), times kernels on CUDA
    device 0 (host syncs) and, unless ``--dry-run``, writes config JSON files under
    ``--out-dir``."""
    args = build_parser(prog).parse_args(argv)

    import torch

    from moerun.backends.triton.configs import CONFIG_DIR
    from moerun.backends.triton.tune_plan import FP8, check_fp8_shape, plan_points
    from moerun.bench.ceilings import measure_run_ceilings, parse_ceilings
    from moerun.bench.shapes import parse_shapes, parse_tokens

    try:
        shapes = parse_shapes(args.shapes)
        tokens = parse_tokens(args.T)
        given = parse_ceilings(args.ceilings) if args.ceilings else None
        if args.plan and args.dry_run:
            raise ValueError("--plan and --dry-run: pick one")
        if args.workers < 0:
            raise ValueError(f"--workers must be >= 0 (got {args.workers})")
        if not args.budget_s > 0:  # NaN included
            raise ValueError(f"--budget-s must be > 0 (got {args.budget_s:g})")
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    fp8 = args.dtype == "fp8"
    dtype = FP8 if fp8 else getattr(torch, args.dtype)
    act = torch.bfloat16 if fp8 else dtype  # the activations the kernels are timed with
    out_dir = Path(args.out_dir) if args.out_dir else CONFIG_DIR
    cuda = torch.cuda.is_available()
    if fp8:
        try:
            for s in shapes:
                check_fp8_shape(s)
        except ValueError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
    if args.plan:
        device = args.device_name or (torch.cuda.get_device_name(0) if cuda else None)
        if device is None:
            print(f"{prog}: --plan without a GPU needs --device-name (e.g. 'NVIDIA H200')",
                  file=sys.stderr)
            return 2
        _print_plan(plan_points(shapes, tokens, dtype, device, out_dir,
                                args.graph_max_tokens), out_dir, sys.stdout)
        return 0
    if not cuda:
        print(f"{prog}: needs a CUDA GPU (--plan prints the plan without one)",
              file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name(0)
    if args.device_name and args.device_name != device:
        print(f"{prog}: --device-name {args.device_name!r} is not this GPU ({device!r}); "
              "it only names the files of --plan", file=sys.stderr)
        return 2
    command = " ".join([prog] + [shlex.quote(a) for a in (argv if argv is not None
                                                          else sys.argv[1:])])
    points = plan_points(shapes, tokens, dtype, device, out_dir, args.graph_max_tokens)
    cuda_dev = torch.device("cuda")
    t_start = time.time()
    ceilings = given if given is not None else measure_run_ceilings(cuda_dev, act)
    fp8_rate = None
    if fp8:
        from moerun.bench.fp8 import measure_fp8_rate

        fp8_rate = given.flops if given is not None else max(measure_fp8_rate(cuda_dev).values())
    print(f"tune: {device}; ceilings {ceilings.describe()}"
          + (f"; fp8 GEMM rate {fp8_rate / 1e12:.1f} TFLOP/s" if fp8 else ""), flush=True)
    winners = run_points(points, device=cuda_dev, dtype=dtype, ceilings=ceilings,
                         budget_s=args.budget_s - (time.time() - t_start),
                         workers=args.workers or None, fp8_rate=fp8_rate,
                         activation_dtype=act)
    if args.dry_run:
        print("tune: --dry-run, nothing written")
        return 0
    write_winners(winners, points, out_dir, dtype=dtype, device_name=device, command=command,
                  activation_dtype=act if fp8 else None)
    print(f"tune: done in {time.time() - t_start:.0f}s")
    return 0


def run_points(points, *, device, dtype, ceilings, budget_s: float,
               workers: int | None = None, out=None, fp8_rate: float | None = None,
               activation_dtype=None) -> dict[str, dict]:
    """Time every point's candidates on ``device`` and return the winners,
    ``{file name: {bucket: TunedEntry}}``.

    ``dtype`` the kernels' dtype (``torch.float8_e4m3fn``: the fp8 block-scaled kernels,
    timed with ``activation_dtype`` rows, default bf16; ``fp8_rate`` the fp8 GEMM FLOP/s of
    their floor, required then). CUDA: all configs are compiled first in parallel processes,
    then each point is timed in its mode (graph replay or eager). Other devices (the Triton
    interpreter on a CPU, for tests): no pre-compilation and eager timing only. Points not
    started once ``budget_s`` seconds have passed are skipped (printed). Allocates each
    shape's weights in turn. Host syncs: many (outside timed regions).
    """
    import torch

    from moerun.backends.triton.configs import ExpertsConfig, fit_to_dtype
    from moerun.backends.triton.tune_calls import FloatCalls, Fp8Calls, make_weights_for
    from moerun.backends.triton.tune_plan import FP8, TunedEntry, compile_configs
    from moerun.bench.inputs import make_case
    from moerun.bench.timing import time_graph_replay, time_samples

    out = out if out is not None else sys.stdout
    t_start = time.time()
    cuda = device.type == "cuda"
    fp8 = dtype == FP8
    if fp8 and fp8_rate is None:
        raise ValueError("run_points: the fp8 kernels need fp8_rate (the fp8 GEMM FLOP/s of "
                         "their floor)")
    act = (activation_dtype or torch.bfloat16) if fp8 else dtype
    if cuda:
        from moerun.backends.triton.precompile import precompile

        status = precompile([(pt.shape, cfg, dtype) for pt in points
                             for cfg in compile_configs(pt)], workers=workers,
                            activation_dtype=act)
        fails = [s for s in status if not s.startswith("ok")]
        print(f"tune: compiled {len(status)} configs in {time.time() - t_start:.0f}s, "
              f"{len(fails)} failed", file=out, flush=True)
        for f in fails:
            print("  " + f, file=out)

    winners: dict[str, dict] = {}
    weights_key, weights = None, None
    for pt in points:
        if time.time() - t_start > budget_s:
            print(f"tune: budget spent, skipping {pt.shape.name} T={pt.tokens}", file=out)
            continue
        t0 = time.time()
        shape, tokens = pt.shape, pt.tokens
        mode = pt.mode if cuda else "eager"
        if weights_key != shape:
            weights = None
            if cuda:
                torch.cuda.empty_cache()
            weights, weights_key = make_weights_for(shape, dtype, act, device), shape
        cases = [make_case(shape, tokens, act, device, seed=100 + r)
                 for r in range(_routings_for(tokens))]
        calls = Fp8Calls(shape, weights, cases, act) if fp8 else \
            FloatCalls(shape, weights, cases, dtype)
        hit = sum(int(torch.unique(c.topk_ids).numel()) for c in cases) / len(cases)  # sync
        floor = calls.floor(hit, ceilings, fp8_rate)

        def per_call_us(fns) -> float:
            """Median µs per call of ``fns`` (one per routing) in the point's mode."""
            n = len(fns)
            if mode == "graph":
                return statistics.median(time_graph_replay(
                    lambda i: fns[i](), n, _SAMPLES["graph"], warmup=2)) * 1e6
            return statistics.median(time_samples(
                lambda i: fns[i % n](), device, max(_SAMPLES["eager"], n), warmup=n)) * 1e6

        rows = []
        best: list = [float("inf"), None]  # µs, config
        wholes: list = []  # (µs, config) of every whole call timed

        def time_whole(cfg, note: str, fail: str = "", calls=calls, pt=pt,
                       wholes=wholes) -> None:
            """Time ``cfg`` as whole calls: a row either way, and the fastest kept."""
            try:
                us = per_call_us(calls.whole_fns(pt.bucket, cfg))
            except Exception as e:  # noqa: BLE001 -- a failing candidate is skipped
                rows.append((cfg.key(), float("nan"), fail + repr(e)[:80]))
                return
            rows.append((cfg.key(), us, note))
            wholes.append((us, cfg))
            if us < best[0]:
                best[:] = [us, cfg]

        def time_gate_ups(cs, tiles, swap: bool, calls=calls):
            """Time each gate/up tile of ``tiles`` alone (``swap``: its ``W x^T`` form): a
            row each; returns the fastest, or None where every one failed."""
            best_us, best_g = float("inf"), None
            for g in tiles:
                tag = f"gate_up m{cs.label}{' swap' if swap else ''}"
                try:
                    us = per_call_us(calls.gate_up_fns(cs.block_m, g, swap_ab=swap))
                except Exception as e:  # noqa: BLE001 -- a failing candidate is skipped
                    rows.append((f"{tag} {g}", float("nan"), repr(e)[:80]))
                    continue
                rows.append((f"{tag} n{g.block_n}k{g.block_k}g{g.group_m}w{g.num_warps}"
                             f"s{g.num_stages}", us, ""))
                if us < best_us:
                    best_us, best_g = us, g
            return best_g

        for cs in pt.candidate_sets:
            best_gu = time_gate_ups(cs, cs.gate_ups, False)
            if best_gu is not None:
                for d in cs.downs:
                    time_whole(ExpertsConfig(block_m=cs.block_m, gate_up=best_gu, down=d.down,
                                             combine=d.combine), "full")
            # swap_ab (W x^T; tune_direct.swap_eligible): the qualifying gate/up tiles in that
            # form alone, then the best with each qualifying down tile as whole calls
            swap_gu = time_gate_ups(cs, cs.swap_gate_ups, True) if cs.swap_downs else None
            for d in cs.swap_downs if swap_gu is not None else ():
                time_whole(ExpertsConfig(block_m=cs.block_m, gate_up=swap_gu, down=d.down,
                                         combine=d.combine, swap_ab=True), "full, swap")
        for cfg in pt.persistent:  # whole calls: their gate/up is not the grouped kernel
            time_whole(cfg, f"full, {cfg.kernel}")
        for cfg in pt.direct:  # whole calls: no alignment, their own two kernels
            time_whole(cfg, "full, direct")
        time_whole(pt.incumbent, f"incumbent, {pt.incumbent_source}", "incumbent ")
        finals = finalists(wholes, keep=pt.incumbent) if cuda else []
        if len(finals) > 1:  # step 4: the close ones again, interleaved
            again: dict = {cfg: [] for cfg in finals}
            for _ in range(FINAL_ROUNDS):
                for cfg in list(again):
                    try:
                        again[cfg].append(per_call_us(calls.whole_fns(pt.bucket, cfg)))
                    except Exception as e:  # noqa: BLE001 -- dropped, as in time_whole
                        rows.append((cfg.key(), float("nan"), "final: " + repr(e)[:80]))
                        del again[cfg]
            final_us = {cfg: statistics.median(v) for cfg, v in again.items()}
            for cfg, us in final_us.items():
                rows.append((cfg.key(), us, "final: median of "
                             + " / ".join(f"{u:.1f}" for u in again[cfg])))
            if final_us:  # else every re-timing failed: steps 1-3's fastest stands
                win = pick_winner(final_us, pt.incumbent)
                best[:] = [final_us[win], win]
        best_us, best_cfg = best
        eff = floor.us / best_us if best_cfg is not None else float("nan")
        print(f"== {shape.name} T={tokens} ({mode}{', fp8' if fp8 else ''}): {len(rows)} "
              f"timed in {time.time() - t0:.1f}s; floor {floor.us:.1f} us ({floor.bound}); "
              f"{len(finals) if len(finals) > 1 else 'no'} finalists; "
              f"best {best_us:.1f} us, floor/time {eff:.3f}, "
              f"{best_cfg.key() if best_cfg else None}", file=out, flush=True)
        for name, us, note in rows:
            print(f"   {us:10.1f}  {name}  {note}", file=out)
        if best_cfg is not None:  # store what ran: the lookup fits configs to shared memory
            winners.setdefault(pt.file_name, {})[pt.bucket] = TunedEntry(
                config=fit_to_dtype(best_cfg, dtype), us=best_us, timing=mode,
                tokens=tokens, floor_us=floor.us)
        del cases, calls
        if cuda:
            torch.cuda.empty_cache()
    return winners


def write_winners(winners: dict[str, dict], points, out_dir: Path, *, dtype, device_name: str,
                  command: str, out=None, activation_dtype=None) -> list[Path]:
    """Merge ``winners`` (from :func:`run_points`) into their files under ``out_dir`` (other
    entries kept; ``dtype`` ``float8_e4m3fn`` for the fp8 kernels' files, whose meta also
    names ``activation_dtype``); returns the paths written.

    Host only: creates ``out_dir``, writes the JSON files and prints one line per file to ``out``
    (default stdout)."""
    import torch

    from moerun.backends.triton.tune_plan import merge_entries, read_config_data

    out = out if out is not None else sys.stdout
    shape_of = {pt.file_name: pt.shape for pt in points}
    today = datetime.date.today().isoformat()
    versions = {"torch": torch.__version__, "triton": _triton_version()}
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, mine in winners.items():
        path = out_dir / name
        data = merge_entries(read_config_data(path), shape=shape_of[name], dtype=dtype,
                             device_name=device_name, command=command, date=today,
                             versions=versions, winners=mine,
                             activation_dtype=activation_dtype)
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"tune: wrote {path} ({len(mine)} entries)", file=out)
        written.append(path)
    return written


def _triton_version() -> str:
    import triton

    return triton.__version__


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="python3 -m moerun.backends.triton.tune"))
