"""The ``moerun`` command line.

``run`` checks a layer end to end; ``bench`` times expert compute (or ``--overhead``, the NVTX
range cost); ``tune`` fills the Triton config files; ``eplb-sim`` simulates the load balancer.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections import defaultdict
from typing import Any, Sequence

__all__ = ["main", "build_parser"]

_DTYPES = ("float32", "float16", "bfloat16")


def _tokens(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tokens {text!r}: expected an int or a comma-"
                                         "separated list of ints, one per rank") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"--tokens {text!r}: counts must be >= 0")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moerun", description="moerun: a scheduler-centric MoE runtime for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run", help="run one MoE layer forward and check it against ReferenceExperts",
        description="Build a small DeepSeek-like MoE layer (grouped noaux_tc routing with a "
                    "correction bias, a shared expert), run it on --ranks processes and check "
                    "every rank's output against a single-process fp64 reference of the same "
                    "global batch. Prints the resolution report, the chunk count, each rank's "
                    "relative error and the time per phase (rank 0: the CPU time of the NVTX "
                    "ranges of one forward after a warm-up forward). Exits 1 if an error "
                    "exceeds the DESIGN bound, 2 on a usage error (an unknown or unavailable "
                    "--backend or --comm included).")
    run.add_argument("--dtype", choices=_DTYPES, default="float32",
                     help="activation/weight dtype (default float32; TF32 is turned off)")
    run.add_argument("--tokens", type=_tokens, default=None,
                     help="tokens per rank: one int (every rank) or a comma list with one entry "
                          "per rank (default: 37 on one rank; with --ranks N a demo list that "
                          "includes a zero-token rank)")
    run.add_argument("--experts", type=int, default=24, help="routed experts E (default 24)")
    run.add_argument("--top-k", type=int, default=6, help="experts per token (default 6)")
    run.add_argument("--hidden", type=int, default=64, help="hidden size H (default 64)")
    run.add_argument("--intermediate", type=int, default=96,
                     help="expert intermediate size I (default 96)")
    run.add_argument("--shared-intermediate", type=int, default=96,
                     help="shared-expert intermediate size; 0 = no shared expert (default 96)")
    run.add_argument("--groups", type=int, default=4,
                     help="expert groups for noaux_tc routing (default 4; must divide E)")
    run.add_argument("--topk-groups", type=int, default=2,
                     help="groups kept per token (default 2)")
    run.add_argument("--max-num-tokens", type=int, default=None,
                     help="rows per chunk (with --ranks > 1: rows one chunk gathers across "
                          "the ranks); default: one chunk")
    run.add_argument("--ranks", type=int, default=1,
                     help="processes to spawn (gloo on CPU, NCCL when that many GPUs exist; "
                          "default 1)")
    run.add_argument("--comm", default="auto",
                     help="communication strategy: auto, allgather, alltoall (default auto: "
                          "none on one rank, allgather on several)")
    run.add_argument("--backend", default="auto",
                     help="expert backend: auto, reference, triton, grouped_mm (default auto)")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                     help="device (default: cuda if available, else cpu)")
    run.add_argument("--seed", type=int, default=0,
                     help="seed of the global weights and inputs (default 0)")
    bench = sub.add_parser(
        "bench", help="benchmarks: the expert-compute matrix, or --overhead",
        description="Time every expert backend on the benchmark matrix against the roofline "
                    "floor (ceilings measured in the same run) and the peer figures; or, with "
                    "--overhead, the host cost of one NVTX range without a profiler.")
    bench.add_argument("--overhead", action="store_true",
                       help="measure the cost of one moerun range (enter+exit) in ns instead "
                            "(default: the expert-compute matrix)")
    bench.add_argument("--layer", action="store_true",
                       help="time the whole layer instead (routing + scheduler + experts + "
                            "shared expert): host issue time, eager and graph-replay time, the "
                            "expert kernels alone, against the combined floor; --shapes takes "
                            "layer shapes (qwen3-30b-a3b, deepseek-v3; default on CPU: tiny)")
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
                       help="with --dbo on CPU: gloo ranks to spawn (default 2)")
    bench.add_argument("--trace", default=None, metavar="DIR",
                       help="with --dbo on CPU: also capture a trace per rank and variant into "
                            "DIR and report the exposed communication (default: none)")
    bench.add_argument("--min-gain", type=float, default=0.01,
                       help="with --shared: an order must beat sequential by this fraction "
                            "to be picked (default 0.01)")
    bench.add_argument("--n", type=int, default=200_000,
                       help="ranges timed with --overhead (default 200000)")
    from moerun.bench.command import add_arguments

    add_arguments(bench)
    sub.add_parser("tune", add_help=False, help="tune the Triton expert kernels (GPU)",
                   description="Search Triton configs per (E, N, K, T bucket) and merge them "
                               "into the package's JSON files. `moerun tune --help` lists flags.")
    sub.add_parser("eplb-sim", add_help=False, help="simulate the EPLB policy on loads",
                   description="max/mean rank load before and after rebalancing, vs DeepSeek's "
                               "algorithm; `moerun eplb-sim --help` lists flags.")
    return parser


# -- run ------------------------------------------------------------------------------------
def _demo_tokens(ranks: int) -> list[int]:
    if ranks == 1:
        return [37]
    demo = [0, 7, 33, 12, 1, 20, 5, 9]
    return [demo[r % len(demo)] for r in range(ranks)]


def _config(args: argparse.Namespace):
    import torch

    from moerun.config import MoEConfig, RoutingConfig, RoutingMethod

    return MoEConfig(
        num_experts=args.experts, top_k=args.top_k, hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        routing=RoutingConfig(method=RoutingMethod.NOAUX_TC, renormalize=True,
                              num_expert_group=args.groups, topk_group=args.topk_groups,
                              routed_scaling_factor=2.5),
        dtype=getattr(torch, args.dtype), shared_intermediate_size=args.shared_intermediate,
        max_num_tokens=args.max_num_tokens)


def _phase_times(prof: Any) -> dict[str, float]:
    """Sum of CPU time (µs) per phase over ``moerun/L.../{phase}`` ranges of a profile."""
    totals: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        name = ev.name
        if not name.startswith("moerun/"):
            continue
        phase = name.split("/", 2)[2]
        if phase.startswith("chunk") or phase.startswith("dbo"):
            continue
        totals[phase] += ev.cpu_time_total
    return dict(totals)


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (C-level writes included) inside the block.

    NOTE: the profiler's Kineto backend prints ``profiler_start`` / ``profiler_stop`` lines
    straight to fd 2 on every start and stop; Python's ``sys.stderr`` cannot catch them.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _run_rank(rank: int, world_size: int, group: Any, store: Any, *, args: argparse.Namespace,
              counts: list[int], device: str) -> dict:
    """Three forwards of the same batch: a warm-up (cold caches, first allocations), one timed
    by the host clock, one under ``torch.profiler`` on rank 0 for the phase times. Every rank
    runs all three (each is collective with ``--ranks > 1``)."""
    import time

    import torch

    from moerun.layer import ConfigurableMoE
    from moerun.mapping import Mapping
    from moerun.testing import make_case, reference_output, rel_err

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = _config(args)
    mapping = (Mapping(rank=rank, world_size=world_size, group=group, store=store)
               if world_size > 1 else Mapping())
    case = make_case(cfg, sum(counts), args.seed)
    lo = sum(counts[:rank])
    hi = lo + counts[rank]
    dev = torch.device(device)
    try:
        layer = ConfigurableMoE(cfg, mapping, backend=args.backend, comm=args.comm, layer_idx=0,
                                device=dev)
    except ValueError as exc:  # an unavailable backend or comm: the same on every rank
        return {"rank": rank, "usage_error": str(exc)}
    with layer:
        layer.load_weights(case.w13.to(dev), case.w2.to(dev),
                           None if case.shared is None else
                           {k: v.to(dev) for k, v in case.shared.items()},
                           e_score_correction_bias=case.bias.to(dev))
        x, logits = case.x[lo:hi].to(dev), case.logits[lo:hi].to(dev)
        counts_arg = counts if world_size > 1 else None

        def forward():
            out = layer(x, logits, all_rank_num_tokens=counts_arg)
            if dev.type == "cuda":
                torch.cuda.synchronize()  # NOTE: host sync for the wall time
            return out

        forward()  # warm-up
        t0 = time.perf_counter()
        out = forward()
        wall_us = (time.perf_counter() - t0) * 1e6
        phases = {}
        if rank == 0:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            with _quiet_stderr():
                prof.start()
            try:
                forward()
            finally:
                with _quiet_stderr():
                    prof.stop()
            phases = _phase_times(prof)
        else:
            forward()
        ref = reference_output(cfg, case)[lo:hi]
        return {"rank": rank, "tokens": counts[rank], "err": rel_err(out.cpu(), ref),
                "report": str(layer.report), "phases": phases, "wall_us": wall_us}


def _num_chunks(counts: list[int], max_num_tokens: int | None) -> int:
    """The scheduler's chunk count for these counts (``schedulers.plan``, rank-identical)."""
    from schedulers.plan import plan_forward

    return plan_forward(tuple(counts), rank=0, use_dp_padding=False,
                        max_num_tokens=max_num_tokens).num_chunks


def _check_names(args: argparse.Namespace) -> None:
    """ValueError (listing the valid names) for an unknown --backend or --comm."""
    from moerun.backends import backend_class
    from moerun.comm import strategy_class

    if args.backend != "auto":
        backend_class(args.backend)
    if args.comm != "auto":
        strategy_class(args.comm)


def _cmd_run(args: argparse.Namespace) -> int:
    import torch

    from moerun.testing import TOL, TOL_MULTIRANK_BF16

    if args.ranks < 1:
        print("moerun run: --ranks must be >= 1", file=sys.stderr)
        return 2
    counts = args.tokens if args.tokens is not None else _demo_tokens(args.ranks)
    if len(counts) == 1 and args.ranks > 1:
        counts = counts * args.ranks
    if len(counts) != args.ranks:
        print(f"moerun run: --tokens has {len(counts)} entries but --ranks={args.ranks}",
              file=sys.stderr)
        return 2
    try:
        cfg = _config(args)
        _check_names(args)
    except (ValueError, TypeError) as exc:
        print(f"moerun run: {exc}", file=sys.stderr)
        return 2
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.ranks == 1:
        results = [_run_rank(0, 1, None, None, args=args, counts=counts, device=device)]
    else:
        from moerun.launch import launch

        use_nccl = device == "cuda" and torch.cuda.device_count() >= args.ranks
        if device == "cuda" and not use_nccl:
            device = "cpu"
        results = launch(_run_rank, args.ranks, use_nccl=use_nccl, args=args, counts=counts,
                         device="cuda" if use_nccl else device)
    if "usage_error" in results[0]:
        print(f"moerun run: {results[0]['usage_error']}", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    bound = TOL_MULTIRANK_BF16 if (dtype == torch.bfloat16 and args.ranks > 1) else TOL[dtype]
    print(results[0]["report"])
    print(f"tokens per rank: {counts}  dtype: {args.dtype}  device: {device}")
    limit = "one chunk" if cfg.max_num_tokens is None else f"max_num_tokens={cfg.max_num_tokens}"
    print(f"chunks: {_num_chunks(counts, cfg.max_num_tokens)}  ({limit})")
    worst = 0.0
    for res in results:
        prefix = f"rank {res['rank']}: " if args.ranks > 1 else ""
        print(f"{prefix}relative error: {res['err']:.3e}  (tokens {res['tokens']}, "
              f"bound {bound:g})")
        worst = max(worst, res["err"])
    print(f"forward wall time (rank 0, after one warm-up forward): "
          f"{results[0]['wall_us']:.0f} µs")
    print("time per phase (rank 0, a third forward under torch.profiler; CPU time of the "
          "NVTX ranges, µs):")
    for phase, us in sorted(results[0]["phases"].items(), key=lambda kv: -kv[1]):
        print(f"  {phase:<24}{us:10.1f}")
    if worst >= bound:
        print(f"FAILED: relative error {worst:.3e} >= {bound:g}", file=sys.stderr)
        return 1
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "tune":  # its own parser (flags documented by `moerun tune --help`)
        from moerun.backends.triton.tune import main as tune_main

        return tune_main(argv[1:])
    if argv and argv[0] == "eplb-sim":
        from eplb.sim import main as sim_main

        return sim_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return _cmd_run(args)
    return _cmd_bench(args)


if __name__ == "__main__":
    sys.exit(main())
