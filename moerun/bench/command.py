"""``moerun bench`` (the expert-compute matrix): ``add_arguments(parser)`` and ``run(args)``.

For each cell (shape x T): one routing set shared by all backends, the floor from ceilings
measured in the same run, each backend timed eager and as CUDA-graph replay, a correctness
check on a subsample, the comparison with a peer file scaled to this run's ceilings, and the
source of each backend's kernel configuration. Prints one stable line per cell on stdout as
it goes, then the full table and the geomeans per cell group; progress on stderr; optionally
JSON (``--out``) and a markdown section (``--write-results``). ``--from-json`` re-analyses a
saved run instead.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys

import torch

from moerun._precision import exact_fp32
from moerun.bench.device import device_of, device_text

__all__ = ["add_arguments", "run", "main"]

_DTYPES = ("float32", "float16", "bfloat16", "fp8")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the expert-compute benchmark's flags to ``parser`` (no ``--overhead``/``--n``).

    Host only; mutates ``parser``."""
    g = parser.add_argument_group("expert-compute matrix")
    g.add_argument("--shapes", default=None,
                   help="comma list of shapes: mixtral8x7b, qwen3-30b-a3b, qwen3-235b-a22b, "
                        "deepseek-v3 (T 1,16,128,1024,8192), deepseek-v3-ep8-local (E=32, "
                        "k=4, H=7168, I=2048), qwen3-235b-ep8-local (E=16, k=4, H=4096, "
                        "I=1536; EP-local: T 256,2048,8192,32768, eager only), tiny (E=8, k=2, "
                        "H=64, I=32), or E:K:H:I; default: the 20 model cells and the 8 "
                        "EP-local cells on CUDA, tiny on a CPU (the model shapes need up to "
                        "22.5 GB: name them to run them there)")
    g.add_argument("--tokens", default=None,
                   help="comma list of token counts T for every shape (default: each shape's "
                        "own list, see --shapes)")
    g.add_argument("--backends", default=None,
                   help="comma list of reference, grouped_mm, triton (default: every available "
                        "one; reference only where T <= --reference-max-tokens)")
    g.add_argument("--reference-max-tokens", type=int, default=16,
                   help="with the default --backends, time the reference backend up to this T "
                        "(default 16)")
    g.add_argument("--dtype", choices=_DTYPES, default="bfloat16",
                   help="activation/weight dtype (default bfloat16); fp8: the FP8 block-scaled "
                        "expert path (e4m3 weights, 128x128 fp32 block scales, bf16 "
                        "activations quantized per 128 columns) against an fp8 floor and "
                        "moerun's own bf16 path on the same weights (moerun.bench.fp8)")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="device (default: cuda if available)")
    g.add_argument("--repeats", type=int, default=20,
                   help="timed samples per backend and mode; the median is reported "
                        "(default 20)")
    g.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    g.add_argument("--no-graph", action="store_true",
                   help="skip CUDA-graph replay timing (default: timed on CUDA up to "
                        "--graph-max-tokens)")
    g.add_argument("--graph-max-tokens", type=int, default=1024,
                   help="largest T timed as graph replay; also the serving-regime split "
                        "(default 1024)")
    g.add_argument("--calls-per-graph", type=int, default=10,
                   help="routings drawn per cell = calls captured per graph (default 10)")
    g.add_argument("--check-tokens", type=int, default=64,
                   help="rows checked against the fp32 reference per cell (default 64)")
    g.add_argument("--seed", type=int, default=0,
                   help="seed of weights, inputs, routings (default 0)")
    g.add_argument("--peers", default=None,
                   help="peer timings JSON, or 'none' to turn the comparison off (default: "
                        "the newest ../shared/peers/h200-*.json next to the project root, the "
                        "folder holding pyproject.toml, else its own shared/peers/h200-*.json; "
                        "fp8-* files are never used; without one the run prints where it "
                        "looked and has no peer column)")
    g.add_argument("--ceilings", default=None, metavar="READ_BW,COPY_BW,FLOPS",
                   help="use these ceilings (B/s, B/s read+write, FLOP/s) instead of measuring "
                        "(default: measured in this run)")
    g.add_argument("--ceiling-bytes", type=int, default=None,
                   help="bytes of the read-bandwidth buffer (default 2 GiB on CUDA, 64 MiB on "
                        "CPU)")
    g.add_argument("--matmul-size", type=int, default=None,
                   help="square matmul size for the FLOP/s ceiling (default 8192 on CUDA, 512 "
                        "on CPU)")
    g.add_argument("--out", default=None,
                   help="write the results as JSON to this path (default: not written)")
    g.add_argument("--write-results", default=None, metavar="PATH",
                   help="write the markdown table into this file (e.g. benchmarks/RESULTS.md), "
                        "replacing only its expert-compute section (default: not written)")
    g.add_argument("--from-json", default=None, metavar="PATH",
                   help="re-analyse a saved --out file (peers, lines, markdown) without running "
                        "(default: run the matrix)")
    g.add_argument("--no-progress", action="store_true",
                   help="no progress on stderr (default: a progress bar, one line per step "
                        "when stderr is not a terminal)")
    g.add_argument("--write-selection", default=None, metavar="PATH",
                   help="with --from-json or --out: write the backend selection table that "
                        "resolve reads (moerun/backends/bench_table.json; default: not "
                        "written)")


def _command_line(args: argparse.Namespace) -> str:
    """The canonical command that reproduces this run (every matrix flag spelled out)."""
    words = ["moerun", "bench"]
    for flag, value in (("--shapes", args.shapes), ("--tokens", args.tokens),
                        ("--backends", args.backends), ("--dtype", args.dtype),
                        ("--device", args.device), ("--repeats", args.repeats),
                        ("--warmup", args.warmup), ("--graph-max-tokens", args.graph_max_tokens),
                        ("--calls-per-graph", args.calls_per_graph),
                        ("--check-tokens", args.check_tokens), ("--seed", args.seed),
                        ("--ceilings", args.ceilings)):
        if value is not None:
            words += [flag, str(value)]
    if args.backends is None:
        words += ["--reference-max-tokens", str(args.reference_max_tokens)]
    if args.no_graph:
        words.append("--no-graph")
    return shlex.join(words)


def _resolve_peers(arg: str | None, err):
    from moerun.bench.peers import describe_search, find_peer_file, load_peers

    if arg is not None and arg.lower() == "none":
        return None
    path = arg if arg is not None else find_peer_file()
    if path is None:
        print(f"peers: no peer file found ({describe_search()}); pass --peers PATH; "
              "comparison skipped (no peer column)", file=err)
        return None
    if not os.path.exists(path):
        print(f"peers: {path} missing; comparison skipped", file=err)
        return None
    try:
        return load_peers(path)
    except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        print(f"peers: {path}: {exc}; comparison skipped", file=err)
        return None


def _emit(info, ceilings, peers, cells, args, out, err) -> int:
    from moerun.bench.analysis import analyze_cell, summarize
    from moerun.bench.report import (render_markdown, render_table, summary_line, to_json,
                                     write_results_section)

    views = [analyze_cell(c, ceilings, peers, info.graph_max_tokens) for c in cells]
    summaries = summarize(cells, views)
    print("", file=out)
    print(render_table(cells, views, summaries, peers), file=out)
    for s in summaries:
        print(summary_line(s), file=out)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(to_json(info, ceilings, peers, cells, views, summaries), f, indent=1)
        print(f"wrote {args.out}", file=out)
    if args.write_results:
        os.makedirs(os.path.dirname(os.path.abspath(args.write_results)), exist_ok=True)
        write_results_section(args.write_results,
                              render_markdown(info, ceilings, peers, cells, views, summaries))
        print(f"wrote {args.write_results}", file=out)
    failed = [f"{c.shape} T={c.tokens} {r.name}" for c in cells for r in c.results if not r.ok]
    if failed:
        print(f"FAILED correctness: {', '.join(failed)}", file=err)
        return 1
    return 0


def _read_saved(path: str):
    """The :class:`~moerun.bench.report.SavedRun` of a saved ``--out`` file; a ValueError
    naming ``--from-json`` when it cannot be read or is not one. Host only."""
    from moerun.bench.report import from_json

    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"--from-json {path}: cannot read it ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError) as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"--from-json {path}: not a JSON file ({exc})") from None
    what = f"a JSON {type(data).__name__}, not an object"
    if isinstance(data, dict):
        try:
            return from_json(data)
        except (KeyError, TypeError, ValueError) as exc:
            what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
    raise ValueError(f"--from-json {path}: not a moerun bench --out file ({what})")


def _from_json(args, saved, out, err) -> int:
    from moerun.bench.analysis import analyze_cell
    from moerun.bench.report import cell_line

    info, ceilings, cells = saved.info, saved.ceilings, saved.cells
    peers = _resolve_peers(args.peers, err)
    print(f"# from {args.from_json}: {info.command} ({info.date}, {info.device})", file=out)
    print(f"ceilings: {ceilings.describe()}", file=out)
    if peers is not None:
        print(f"peers: {peers.describe()}", file=out)
    for cell in cells:
        print(cell_line(cell, analyze_cell(cell, ceilings, peers, info.graph_max_tokens)),
              file=out)
    return _emit(info, ceilings, peers, cells, args, out, err)


def run(args: argparse.Namespace, *, out=None, err=None) -> int:
    """Run the benchmark described by ``args`` (from :func:`add_arguments`).

    Returns 0, 1 when a backend failed its correctness check (or raised), 2 on a usage
    error (``--from-json`` unreadable, ``--write-selection`` without a source: checked before
    any work). Without ``--shapes`` a CPU run uses the ``tiny`` shape (``args.shapes`` is set
    to it, so the printed command reproduces the run). Side effects: allocates each shape's
    weights on the device (deepseek-v3 bf16: 22.5 GB), writes ``--out`` / ``--write-results``
    files. Host syncs: many.
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    write_selection = getattr(args, "write_selection", None)
    try:
        if write_selection and not (args.from_json or args.out):
            raise ValueError("--write-selection needs --from-json or --out")
        saved = _read_saved(args.from_json) if args.from_json else None
    except ValueError as exc:
        print(f"moerun bench: {exc}", file=err)
        return 2
    if args.dtype == "fp8" and not args.from_json:
        from moerun.bench.fp8 import run as run_fp8

        return run_fp8(args, out, err)
    status = (_from_json(args, saved, out, err) if saved is not None
              else _run_matrix(args, out, err))
    if write_selection and status != 2:
        from moerun.backends.selection import selection_table

        with open(args.from_json or args.out) as f:
            table = selection_table(json.load(f))
        with open(write_selection, "w") as f:
            json.dump(table, f, indent=1)
            f.write("\n")
        print(f"wrote {write_selection}", file=out)
    return status


@exact_fp32()
def _run_matrix(args: argparse.Namespace, out, err) -> int:
    from moerun.bench.analysis import analyze_cell
    from moerun.bench.ceilings import measure_run_ceilings, parse_ceilings
    from moerun.bench.matrix import BenchSettings, backend_names_for, plan_cells, run_matrix
    from moerun.bench.registry import BENCH_BACKENDS
    from moerun.bench.report import Progress, RunInfo, cell_line
    from moerun.bench.shapes import parse_shapes, parse_tokens
    from moerun.env import get_env

    try:
        device_name = device_of(args.device)
        if args.shapes is None and device_name == "cpu":
            # NOTE: the model shapes' weights (deepseek-v3 bf16: 22.5 GB) exhaust a CPU host
            args.shapes = "tiny"
            print("# cpu: --shapes defaults to tiny; name model shapes with --shapes to run "
                  "them here", file=err)
        shapes = parse_shapes(args.shapes)
        tokens = parse_tokens(args.tokens)
        backends = None
        if args.backends is not None:
            backends = tuple(n.strip() for n in args.backends.split(",") if n.strip())
            unknown = [n for n in backends if n not in BENCH_BACKENDS]
            if unknown or not backends:
                raise ValueError(f"--backends {args.backends!r}: unknown {unknown}; valid: "
                                 f"{', '.join(BENCH_BACKENDS)}")
        for flag, value, low in (("--repeats", args.repeats, 1), ("--warmup", args.warmup, 0),
                                 ("--calls-per-graph", args.calls_per_graph, 1),
                                 ("--check-tokens", args.check_tokens, 1)):
            if value < low:
                raise ValueError(f"{flag}={value}: must be >= {low}")
        given = parse_ceilings(args.ceilings) if args.ceilings else None
    except ValueError as exc:
        print(f"moerun bench: {exc}", file=err)
        return 2
    device = torch.device(device_name)
    dtype = getattr(torch, args.dtype)
    settings = BenchSettings(device=device, dtype=dtype, repeats=args.repeats,
                             warmup=args.warmup, graph=not args.no_graph,
                             graph_max_tokens=args.graph_max_tokens,
                             calls_per_graph=args.calls_per_graph,
                             check_tokens=args.check_tokens, backends=backends,
                             reference_max_tokens=args.reference_max_tokens, seed=args.seed)
    peers = _resolve_peers(args.peers, err)
    if given is not None:
        ceilings = given
    else:
        ceilings = measure_run_ceilings(device, dtype, read_bytes=args.ceiling_bytes,
                                        matmul_size=args.matmul_size, seed=args.seed)
    info = RunInfo(command=_command_line(args),
                   date=datetime.datetime.now(datetime.timezone.utc).strftime(
                       "%Y-%m-%d %H:%M UTC"),
                   device=device_text(device), dtype=args.dtype,
                   timer="cuda events" if device.type == "cuda" else "host clock",
                   repeats=args.repeats, warmup=args.warmup,
                   graph=settings.graph and device.type == "cuda",
                   graph_max_tokens=args.graph_max_tokens, calls_per_graph=args.calls_per_graph,
                   check_tokens=args.check_tokens, seed=args.seed)
    print(f"# {info.command}", file=out)
    print(f"# {info.date}  {info.device}  dtype {info.dtype}  timer {info.timer}", file=out)
    print(f"ceilings: {ceilings.describe()}", file=out)
    if peers is not None:
        print(f"peers: {peers.describe()}", file=out)
    out.flush()
    total = sum(len(backend_names_for(settings, t)) for _, t in plan_cells(shapes, tokens))
    progress = Progress(total, stream=err, enabled=not args.no_progress)

    def on_cell(cell) -> None:
        line = cell_line(cell, analyze_cell(cell, ceilings, peers, info.graph_max_tokens))
        if progress.interactive:
            err.write("\n")
        print(line, file=out)
        for r in cell.results:
            if r.note:
                print(f"  note {cell.shape} T={cell.tokens} {r.name}: {r.note}", file=out)
        for name, why in cell.skipped.items():
            print(f"  skip {cell.shape} T={cell.tokens} {name}: {why}", file=out)
        out.flush()

    cells = run_matrix(shapes, tokens, settings, ceilings, get_env(), progress=progress,
                       on_cell=on_cell)
    progress.close()
    return _emit(info, ceilings, peers, cells, args, out, err)


def main(argv: list[str] | None = None) -> int:
    """``python -m moerun.bench [flags]``: the matrix without the ``moerun`` CLI.

    Side effects: those of :func:`run`: prints, TF32 off
    while it runs (restored after), runs and times device work
    with host syncs, writes the files its flags name."""
    parser = argparse.ArgumentParser(prog="python -m moerun.bench",
                                     description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
