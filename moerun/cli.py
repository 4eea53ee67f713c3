"""The ``moerun`` command line.

``run`` checks a layer end to end (``trace`` does too and writes its trace, report and
timeline; see :mod:`moerun.cli_run`); ``bench`` times expert compute (``--dtype fp8`` too;
or, one mode at a time, the whole layer ``--layer``, the shared-expert orders ``--shared``,
DBO ``--dbo``, the NVTX range cost ``--overhead``); ``tune`` fills the Triton config files;
``eplb-sim`` simulates the load balancer.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

__all__ = ["main", "build_parser"]

_DTYPES = ("float32", "float16", "bfloat16")


def build_parser() -> argparse.ArgumentParser:
    """The ``moerun`` parser: subcommands ``run``, ``trace``, ``bench``, ``tune``, ``eplb-sim``.

    Pure; host only."""
    parser = argparse.ArgumentParser(
        prog="moerun", description="moerun: a scheduler-centric MoE runtime for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)
    from moerun.cli_run import RUN_DESCRIPTION, add_run_arguments

    run = sub.add_parser("run", help="run one MoE layer forward and check it against "
                         "ReferenceExperts", description=RUN_DESCRIPTION)
    add_run_arguments(run)
    run.add_argument("--trace", default=None, metavar="DIR",
                     help="also write, per rank, the trace of one forward, its report (text "
                          "and JSON, overlap figures included) and a PNG timeline into DIR "
                          "(default: none)")
    trace = sub.add_parser("trace", help="moerun run with a trace: Chrome trace JSON, report "
                           "and PNG timeline per rank",
                           description="Run `moerun run` with the given flags and write, per "
                                       "rank, trace-rank{r}.json (open it in Perfetto or "
                                       "chrome://tracing), report-rank{r}.txt/.json (the "
                                       "resolution report and traces.overlap's figures: "
                                       "hidden shared-expert time, exposed communication, "
                                       "per-phase times) and timeline-rank{r}.png into --out.")
    add_run_arguments(trace)
    trace.add_argument("--out", required=True, metavar="DIR",
                       help="directory for the trace files (required; no default)")
    bench = sub.add_parser(
        "bench", help="benchmarks: the expert-compute matrix (--dtype fp8 included), or one "
                      "mode: --layer, --shared, --dbo, --overhead",
        description="Time every expert backend on the benchmark matrix against the roofline "
                    "floor (ceilings measured in the same run) and the peer figures (--dtype "
                    "fp8: the FP8 block-scaled expert path against an fp8 floor); or, with one "
                    "mode flag instead: --layer, the whole layer (host issue, eager, graph "
                    "replay, expert kernels); --shared, every shared-expert order and the table "
                    "resolve reads; --dbo, the layer with and without dual-batch overlap; "
                    "--overhead, the host cost of one NVTX range without a profiler. The modes "
                    "exclude each other.")
    bench.add_argument("--overhead", action="store_true",
                       help="measure the cost of one moerun range (enter+exit) in ns instead "
                            "(default: the expert-compute matrix)")
    bench.add_argument("--layer", action="store_true",
                       help="time the whole layer instead (routing + scheduler + experts + "
                            "shared expert): host issue time, eager and graph-replay time, the "
                            "expert kernels alone, against the combined floor; --shapes takes "
                            "layer shapes (qwen3-30b-a3b, deepseek-v3; default on CPU: tiny)")
    bench.add_argument("--host-core", default="none", metavar="none|fastest|N",
                       help="with --layer: run each round of host figures on one CPU core: "
                            "'fastest' times a Python loop on every allowed core just before "
                            "the round and takes the fastest, N a given core; each round's "
                            "core and loop time go into the JSON (default none: the OS places "
                            "the thread)")
    bench.add_argument("--shared", action="store_true",
                       help="time every shared-expert order (and SM partition size) on a "
                            "DeepSeek-V3-like layer (E 32 and 256; tiny on CPU) against the "
                            "combined floor, and pick one per T (default: off)")
    bench.add_argument("--write-table", nargs="?", const="default", default=None,
                       metavar="PATH",
                       help="with --shared: write the picks into the table resolve reads "
                            "(default path: moerun/shared_table.json)")
    bench.add_argument("--dbo", action="store_true",
                       help="time the layer with and without dual-batch overlap: one GPU "
                            "(NoComm, what a split costs, what the split rule decides), or "
                            "CPU gloo ranks (a structure check) (default: off)")
    bench.add_argument("--ranks", type=int, default=None,
                       help="with --dbo on CPU: gloo ranks to spawn, >= 2 (default 2)")
    bench.add_argument("--trace", default=None, metavar="DIR",
                       help="with --dbo on CPU: also capture a trace per rank and variant into "
                            "DIR and report the exposed communication (default: none)")
    bench.add_argument("--min-gain", type=float, default=0.03,
                       help="with --shared: an order must beat sequential by this fraction "
                            "to be picked (default 0.03)")
    bench.add_argument("--n", type=int, default=200_000,
                       help="ranges timed with --overhead, >= 1 (default 200000)")
    from moerun.bench.command import add_arguments

    add_arguments(bench)
    sub.add_parser("tune", add_help=False, help="tune the Triton expert kernels (GPU)",
                   description="Search Triton configs per local shape (S local slots, N, K, "
                               "dtype, device) and T bucket for the bench shapes (EP-local "
                               "ones included) and merge them into the package's JSON files. "
                               "`moerun tune --help` lists flags.")
    sub.add_parser("eplb-sim", add_help=False, help="simulate the EPLB policy on loads",
                   description="max/mean rank load before and after rebalancing, vs DeepSeek's "
                               "algorithm; `moerun eplb-sim --help` lists flags.")
    return parser


_BENCH_MODES = ("overhead", "layer", "shared", "dbo")


def _bench_usage_error(args: argparse.Namespace) -> str | None:
    """The one-line usage error of a ``moerun bench`` command line (mode flags that exclude
    each other, a mode's own bad value), or None. Checked before any work."""
    modes = [f"--{m}" for m in _BENCH_MODES if getattr(args, m)]
    if len(modes) > 1:
        return f"{', '.join(modes)}: pick one mode"
    if args.dtype == "fp8" and modes and modes[0] != "--overhead":
        return f"--dtype fp8 is the expert-compute matrix's; {modes[0]} takes float32, " \
               "float16 or bfloat16"
    if args.overhead and args.n < 1:
        return f"--n must be >= 1 (got {args.n})"
    return None


def _cmd_bench(args: argparse.Namespace) -> int:
    problem = _bench_usage_error(args)
    if problem is not None:
        print(f"moerun bench: {problem}", file=sys.stderr)
        return 2
    if args.dbo:
        from moerun.bench.dbo_command import run_dbo_bench

        return run_dbo_bench(args)
    if args.shared:
        from moerun.bench.shared_command import run_shared_bench

        return run_shared_bench(args)
    if args.layer:
        from moerun.bench.layer_command import run_layer_bench

        return run_layer_bench(args)
    if not args.overhead:
        from moerun.bench.command import run

        return run(args)
    from traces import measure_range_overhead

    res = measure_range_overhead(n=args.n)
    print(f"range overhead without profiler: {res['noop_ns']:.0f} ns per range "
          f"(backend {res['backend']}: {res['backend_ns']:.0f} ns; with recorder "
          f"{res['recorder_ns']:.0f} ns; empty loop {res['loop_ns']:.0f} ns; n={res['n']})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``moerun``: runs the subcommand of ``argv`` (default ``sys.argv[1:]``) and
    returns its exit status.

    Side effects: the subcommand's (prints; device work with host syncs; may spawn ranks, set
    TF32 off, write files)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "tune":  # its own parser (flags documented by `moerun tune --help`)
        from moerun.backends.triton.tune import main as tune_main

        return tune_main(argv[1:])
    if argv and argv[0] == "eplb-sim":
        from eplb.sim_cli import main as sim_main

        return sim_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command in ("run", "trace"):
        from moerun.cli_run import cmd_run

        if args.command == "trace":
            args.trace = args.out
        return cmd_run(args)
    return _cmd_bench(args)


if __name__ == "__main__":
    sys.exit(main())
