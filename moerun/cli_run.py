"""``moerun run`` and ``moerun trace``: one layer end to end on ``--ranks`` processes.

``run`` checks every rank's output against a single-process fp64 reference and prints the
resolution report, the chunk count, the errors and the time per phase; ``run --trace DIR`` and
``trace --out DIR`` also write, per rank, the Chrome/Perfetto trace of one forward
(``trace-rank{r}.json``), the reports (``report-rank{r}.txt`` / ``.json``: the resolution
report and :func:`traces.overlap`'s figures) and a PNG timeline (``timeline-rank{r}.png``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections import defaultdict
from typing import Any

from moerun._precision import exact_fp32

__all__ = ["add_run_arguments", "align_ranks_for_capture", "check_out_dir", "cmd_run",
           "write_trace_bundle", "RUN_DESCRIPTION"]

_DTYPES = ("float32", "float16", "bfloat16")
_ORDERS = ("auto", "sequential", "aux_stream", "during_combine", "fused")

RUN_DESCRIPTION = ("Build a small DeepSeek-like MoE layer (grouped noaux_tc routing with a "
                   "correction bias, a shared expert), run it on --ranks processes and check "
                   "every rank's output against a single-process fp64 reference of the same "
                   "global batch. Prints the resolution report, the chunk count (and, with "
                   "--scheduler dbo, the split decision and its rule), each rank's "
                   "relative error and the time per phase (rank 0: the CPU time of the NVTX "
                   "ranges of one forward after a warm-up forward). Exits 1 if an error "
                   "exceeds the DESIGN bound, 2 on a usage error (an unknown or unavailable "
                   "--backend, --comm, --scheduler or --shared-expert-order included).")


def _tokens(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tokens {text!r}: expected an int or a comma-"
                                         "separated list of ints, one per rank") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"--tokens {text!r}: counts must be >= 0")
    return values



def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``moerun run`` (and ``moerun trace``), each with its default.

    Host only; mutates ``parser``."""
    parser.add_argument("--dtype", choices=_DTYPES, default="float32",
                     help="activation/weight dtype (default float32; TF32 is turned off)")
    parser.add_argument("--tokens", type=_tokens, default=None,
                     help="tokens per rank: one int (every rank) or a comma list with one entry "
                          "per rank (default: 37 on one rank; with --ranks N a demo list that "
                          "includes a zero-token rank)")
    parser.add_argument("--experts", type=int, default=24, help="routed experts E (default 24)")
    parser.add_argument("--top-k", type=int, default=6, help="experts per token (default 6)")
    parser.add_argument("--hidden", type=int, default=None,
                     help="hidden size H (default 64; 128 with --quant fp8)")
    parser.add_argument("--intermediate", type=int, default=None,
                     help="expert intermediate size I (default 96; 128 with --quant fp8)")
    parser.add_argument("--quant", choices=("none", "fp8"), default="none",
                        help="routed experts: none (the --dtype weights) or fp8 (e4m3 weights "
                             "with fp32 128x128 block scales, activations quantized per token "
                             "and 128 columns; H and I multiples of 128); the output is checked "
                             "against DESIGN 11a's reference and against the unquantized fp64 "
                             "layer (default none)")
    parser.add_argument("--shared-intermediate", type=int, default=96,
                     help="shared-expert intermediate size; 0 = no shared expert (default 96)")
    parser.add_argument("--groups", type=int, default=4,
                     help="expert groups for noaux_tc routing (default 4; must divide E)")
    parser.add_argument("--topk-groups", type=int, default=2,
                     help="groups kept per token (default 2)")
    parser.add_argument("--max-num-tokens", type=int, default=None,
                     help="rows per chunk (with --ranks > 1: rows one chunk gathers across "
                          "the ranks); default: one chunk")
    parser.add_argument("--ranks", type=int, default=1,
                     help="processes to spawn (gloo on CPU, NCCL when that many GPUs exist; "
                          "default 1)")
    parser.add_argument("--comm", default="auto",
                     help="communication strategy: auto, none (one rank only), allgather, "
                          "alltoall (default auto: none on one rank, allgather on several)")
    parser.add_argument("--backend", default="auto",
                     help="expert backend: auto, reference, triton, grouped_mm (default auto)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                     help="device (default: cuda if available, else cpu)")
    parser.add_argument("--seed", type=int, default=0,
                     help="seed of the global weights and inputs (default 0)")
    parser.add_argument("--scheduler", default="auto",
                        help="forward scheduler: auto, external, dbo (dual-batch overlap; its "
                             "split rule decides per forward) (default auto: external)")
    parser.add_argument("--shared-expert-order", choices=_ORDERS, default="auto",
                        help="where the shared expert runs: sequential, aux_stream, "
                             "during_combine, fused (default auto: the measured table, else "
                             "sequential on one rank, during_combine on several)")
    parser.add_argument("--shared-partition-sms", type=int, default=None,
                        help="with aux_stream / during_combine on CUDA: run the shared expert "
                             "on a green context of this many SMs (default: none)")


# -- run ------------------------------------------------------------------------------------
def _demo_tokens(ranks: int) -> list[int]:
    if ranks == 1:
        return [37]
    demo = [0, 7, 33, 12, 1, 20, 5, 9]
    return [demo[r % len(demo)] for r in range(ranks)]


def _config(args: argparse.Namespace):
    import torch

    from moerun.config import MoEConfig, RoutingConfig, RoutingMethod

    from moerun.quant import QuantConfig

    fp8 = getattr(args, "quant", "none") == "fp8"
    hidden = args.hidden if args.hidden is not None else (128 if fp8 else 64)
    inter = args.intermediate if args.intermediate is not None else (128 if fp8 else 96)
    try:
        return MoEConfig(
            num_experts=args.experts, top_k=args.top_k, hidden_size=hidden,
            intermediate_size=inter, quant=QuantConfig() if fp8 else None,
            routing=RoutingConfig(method=RoutingMethod.NOAUX_TC, renormalize=True,
                                  num_expert_group=args.groups, topk_group=args.topk_groups,
                                  routed_scaling_factor=2.5),
            dtype=getattr(torch, args.dtype),
            shared_intermediate_size=args.shared_intermediate,
            max_num_tokens=args.max_num_tokens)
    except ValueError as exc:  # name the flag the user typed, not the config field
        message = str(exc)
        for field, flag in _CONFIG_FLAGS:
            message = message.replace(field + "=", flag + "=")
        raise ValueError(message) from None


#: Config fields as ``moerun run`` spells them (its errors name the flag).
_CONFIG_FLAGS = (
    ("MoEConfig.num_experts", "--experts"), ("MoEConfig.top_k", "--top-k"),
    ("MoEConfig.hidden_size", "--hidden"), ("MoEConfig.intermediate_size", "--intermediate"),
    ("MoEConfig.shared_intermediate_size", "--shared-intermediate"),
    ("MoEConfig.max_num_tokens", "--max-num-tokens"),
    ("RoutingConfig.num_expert_group", "--groups"), ("RoutingConfig.topk_group", "--topk-groups"),
    ("num_expert_group", "--groups"), ("num_experts", "--experts"), ("top_k", "--top-k"),
)


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


@exact_fp32()
def _run_rank(rank: int, world_size: int, group: Any, store: Any, *, args: argparse.Namespace,
              counts: list[int], device: str) -> dict:
    """Three forwards of the same batch: a warm-up (cold caches, first allocations), one timed
    by the host clock, one under ``torch.profiler`` on rank 0 for the phase times. Every rank
    runs all three (each is collective with ``--ranks > 1``)."""
    import time

    import torch

    from moerun.layer import ConfigurableMoE
    from moerun.mapping import Mapping
    from moerun.testing import make_case, reference_output, rel_err, unquantized_reference

    cfg = _config(args)
    mapping = (Mapping(rank=rank, world_size=world_size, group=group, store=store)
               if world_size > 1 else Mapping())
    case = make_case(cfg, sum(counts), args.seed)
    lo = sum(counts[:rank])
    hi = lo + counts[rank]
    dev = torch.device(device)
    try:
        layer = ConfigurableMoE(cfg, mapping, backend=args.backend, comm=args.comm, layer_idx=0,
                                device=dev, scheduler=args.scheduler,
                                shared_expert_order=args.shared_expert_order,
                                shared_partition_sms=args.shared_partition_sms)
    except ValueError as exc:  # an unavailable backend or comm: the same on every rank
        return {"rank": rank, "usage_error": str(exc)}
    with layer:
        scales = {} if cfg.quant is None else dict(w13_scale=case.w13_scale.to(dev),
                                                   w2_scale=case.w2_scale.to(dev))
        layer.load_weights(case.w13.to(dev), case.w2.to(dev),
                           None if case.shared is None else
                           {k: v.to(dev) for k, v in case.shared.items()},
                           e_score_correction_bias=case.bias.to(dev), **scales)
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
        dbo = _dbo_line(layer, counts)
        trace_dir = getattr(args, "trace", None)
        if trace_dir is not None:  # every rank writes its own trace, reports and timeline
            if world_size > 1:
                align_ranks_for_capture(group)
            files = write_trace_bundle(forward, layer, trace_dir, tag=f"rank{rank}",
                                       dbo=dbo)
            phases = files.pop("phases")
        elif rank == 0:
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
        res = {"rank": rank, "tokens": counts[rank], "err": rel_err(out.cpu(), ref),
               "report": str(layer.report), "phases": phases, "wall_us": wall_us,
               "dbo": dbo}
        if cfg.quant is not None:  # the second FP8 bar: the unquantized fp64 layer
            res["err_unquantized"] = rel_err(out.cpu(), unquantized_reference(cfg, case)[lo:hi])
        if trace_dir is not None:
            res["trace_files"] = files
        return res


def _report_json(layer: Any, rep: Any) -> dict:
    """The resolution report and the overlap figures of one rank as plain JSON."""
    r = layer.report
    return {
        "resolution": {"backend": r.backend, "communication": r.strategy, "routing": r.router,
                       "scheduler": r.scheduler, "shared_expert_order": r.shared_expert_order,
                       "notes": list(r.notes), "text": str(r)},
        "overlap": {"device": rep.device, "shared_us": rep.shared_us,
                    "hidden_shared_us": rep.hidden_shared_us,
                    "hidden_shared_pct": rep.hidden_shared_pct, "comm_us": rep.comm_us,
                    "exposed_comm_us": rep.exposed_comm_us, "notes": list(rep.notes),
                    "lanes": [{"label": ln.label, "role": ln.role, "busy_us": ln.busy_us}
                              for ln in rep.lanes],
                    "phases": [{"layer": k.layer, "ub": k.ub, "chunk": k.chunk,
                                "phase": k.phase, "count": t.count, "host_us": t.host_us,
                                "device_us": t.device_us} for k, t in rep.phases.items()]}}


def align_ranks_for_capture(group: Any) -> None:
    """Call on every rank of ``group`` just before each rank captures a trace of the same
    collective forward: the ranks then start their profiled windows together.

    Without it a rank that starts its profiler first waits in the forward's first collective
    for the others, and its trace shows that wait as exposed communication (hundreds of ms:
    the first profiler start of a process initializes Kineto, 1-2 s on a CPU, unevenly across
    ranks). So: one empty profiled window (the same activities as :func:`traces.capture`)
    pays that cost, then a barrier on ``group``; both outside the captured window. Host syncs:
    the barrier; with CUDA the profiler's own synchronize."""
    import torch
    import torch.distributed as dist

    from traces.capture import default_activities

    with _quiet_stderr(), torch.profiler.profile(activities=default_activities()):
        pass
    dist.barrier(group=group)


def write_trace_bundle(forward: Any, layer: Any, out_dir: str, *, tag: str,
                       title: str | None = None, dbo: str | None = None) -> dict:
    """Capture ``forward()`` (one layer forward) and write ``trace-{tag}.json``,
    ``report-{tag}.txt`` / ``.json`` (resolution report + :func:`traces.overlap`) and
    ``timeline-{tag}.png`` into ``out_dir``. ``dbo``: the DBO split decision's line
    (:func:`_dbo_line`), written into both reports when given. Returns the paths, the
    per-phase host times and the overlap figures. Host syncs: the profiler's."""
    import traces

    os.makedirs(out_dir, exist_ok=True)
    with _quiet_stderr():
        cap = traces.capture(forward, out_dir, name=f"trace-{tag}")
    rep = traces.overlap(cap.path)
    txt = os.path.join(out_dir, f"report-{tag}.txt")
    with open(txt, "w") as f:
        f.write(f"{layer.report}\n")
        if dbo is not None:
            f.write(f"dual-batch overlap: {dbo}\n")
        f.write(f"\n{rep}\n")
    js = os.path.join(out_dir, f"report-{tag}.json")
    data = _report_json(layer, rep)
    if dbo is not None:
        data["dual_batch_overlap"] = dbo
    with open(js, "w") as f:
        json.dump(data, f, indent=1)
    png = os.path.join(out_dir, f"timeline-{tag}.png")
    traces.timeline(rep, png, title=title or f"moerun {tag}: {layer.report.scheduler}, shared "
                                             f"{layer.report.shared_expert_order}")
    phases = {name: t.host_us for name, t in rep.by_phase().items()
              if not (name.startswith("chunk") or name.startswith("dbo") or name == "ub")}
    return {"trace": str(cap.path), "report": txt, "json": js, "png": png, "phases": phases,
            "hidden_shared_pct": rep.hidden_shared_pct, "exposed_comm_us": rep.exposed_comm_us}


def _dbo_line(layer: Any, counts: list[int]) -> str | None:
    """What the DBO scheduler decided for these counts (the decision its forwards took:
    the same pure rule on the same rank-identical counts), or None for another scheduler.
    Host only."""
    from schedulers import DualBatchOverlapScheduler

    if not isinstance(layer.scheduler, DualBatchOverlapScheduler):
        return None
    decision = layer.scheduler.decide(layer, tuple(counts))
    return f"{'2 micro-batches' if decision.split else 'unsplit'}  ({decision.rule})"


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


def check_out_dir(flag: str, path: str) -> str | None:
    """Make sure ``path`` is a folder this process can write (created with its parents when
    missing): None when it is, else a one-line reason that names ``flag``. Host only."""
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{flag} {path}: exists and is not a folder"
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return f"{flag} {path}: cannot create the folder ({exc.strerror or exc})"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{flag} {path}: the folder is not writable"
    return None


def cmd_run(args: argparse.Namespace) -> int:
    """``moerun run`` / ``moerun trace``: 0, 1 when an error exceeds its bound, 2 on a
    usage error (reported before any rank starts).

    Side effects: prints to stdout/stderr; runs the forwards in this process on one rank
    (TF32 off for matmul and cuDNN while it runs, restored after) or spawns ``--ranks``
    processes (collectives over gloo/NCCL); host syncs; ``--trace`` writes trace files."""
    import torch

    from moerun.bench.device import device_of
    from moerun.testing import TOL, TOL_FP8, TOL_FP8_UNQUANTIZED, TOL_MULTIRANK_BF16

    command = getattr(args, "command", None) or "run"
    prog = f"moerun {command}"
    if args.ranks < 1:
        print(f"{prog}: --ranks must be >= 1 (got {args.ranks})", file=sys.stderr)
        return 2
    counts = args.tokens if args.tokens is not None else _demo_tokens(args.ranks)
    if len(counts) == 1 and args.ranks > 1:
        counts = counts * args.ranks
    if len(counts) != args.ranks:
        print(f"{prog}: --tokens has {len(counts)} entries but --ranks={args.ranks}",
              file=sys.stderr)
        return 2
    try:
        cfg = _config(args)
        _check_names(args)
        device = device_of(args.device)  # --device cuda without a GPU: a usage error
    except (ValueError, TypeError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    trace_dir = getattr(args, "trace", None)
    if trace_dir is not None:  # a bad folder fails here, not after every rank ran
        problem = check_out_dir("--out" if command == "trace" else "--trace", trace_dir)
        if problem is not None:
            print(f"{prog}: {problem}", file=sys.stderr)
            return 2
    if args.ranks == 1:
        results = [_run_rank(0, 1, None, None, args=args, counts=counts, device=device)]
    else:
        from moerun.launch import launch

        use_nccl = device == "cuda" and torch.cuda.device_count() >= args.ranks
        if device == "cuda" and not use_nccl:
            print(f"{prog}: --ranks {args.ranks} needs {args.ranks} CUDA devices, "
                  f"{torch.cuda.device_count()} found: running on the CPU (gloo) instead",
                  file=sys.stderr)
            device = "cpu"
        results = launch(_run_rank, args.ranks, use_nccl=use_nccl, args=args, counts=counts,
                         device="cuda" if use_nccl else device)
    if "usage_error" in results[0]:
        print(f"{prog}: {results[0]['usage_error']}", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    bound = TOL_MULTIRANK_BF16 if (dtype == torch.bfloat16 and args.ranks > 1) else TOL[dtype]
    fp8 = cfg.quant is not None
    if fp8:
        bound = TOL_FP8
    print(results[0]["report"])
    print(f"tokens per rank: {counts}  dtype: {args.dtype}  device: {device}"
          + ("  experts: fp8 (e4m3, 128x128 block scales)" if fp8 else ""))
    limit = "one chunk" if cfg.max_num_tokens is None else f"max_num_tokens={cfg.max_num_tokens}"
    print(f"chunks: {_num_chunks(counts, cfg.max_num_tokens)}  ({limit})")
    if results[0]["dbo"] is not None:
        print(f"dual-batch overlap: {results[0]['dbo']}")
    worst = 0.0
    worst_unquantized = 0.0
    for res in results:
        prefix = f"rank {res['rank']}: " if args.ranks > 1 else ""
        label = "relative error vs DESIGN 11a reference" if fp8 else "relative error"
        print(f"{prefix}{label}: {res['err']:.3e}  (tokens {res['tokens']}, bound {bound:g})")
        worst = max(worst, res["err"])
        if fp8:
            print(f"{prefix}relative error vs unquantized fp64 layer: "
                  f"{res['err_unquantized']:.3e}  (bound {TOL_FP8_UNQUANTIZED:g})")
            worst_unquantized = max(worst_unquantized, res["err_unquantized"])
    print(f"forward wall time (rank 0, after one warm-up forward): "
          f"{results[0]['wall_us']:.0f} µs")
    print("time per phase (rank 0, a third forward under torch.profiler; CPU time of the "
          "NVTX ranges, µs):")
    for phase, us in sorted(results[0]["phases"].items(), key=lambda kv: -kv[1]):
        print(f"  {phase:<24}{us:10.1f}")
    for res in results:
        files = res.get("trace_files")
        if files:
            pct = files["hidden_shared_pct"]
            print(f"rank {res['rank']} trace: {files['trace']}  report {files['report']} "
                  f"(+ .json)  timeline {files['png']}  hidden shared "
                  f"{'-' if pct is None else f'{pct:.1f} %'}, exposed comm "
                  f"{files['exposed_comm_us']:.0f} µs")
    if worst >= bound:
        print(f"FAILED: relative error {worst:.3e} >= {bound:g}", file=sys.stderr)
        return 1
    if worst_unquantized >= TOL_FP8_UNQUANTIZED:
        print(f"FAILED: relative error vs the unquantized layer {worst_unquantized:.3e} >= "
              f"{TOL_FP8_UNQUANTIZED:g}", file=sys.stderr)
        return 1
    return 0


