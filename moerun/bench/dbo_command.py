"""``moerun bench --dbo``: the layer with and without dual-batch overlap, same run, same timer.

* GPU (one device, ``NoComm``): per layer shape and T, the unsplit layer
  (``scheduler="external"``) against the layer forced to split (``scheduler="dbo"`` with the
  rule's thresholds off), both eager with device events (DBO under CUDA graphs is out of
  scope), and what the default split rule decides at that T. The claim checked: where the
  rule splits, the split costs at most 5 %; where the split would cost more, the rule does
  not split (memory-bound decode re-reads the weights).
* CPU (``--ranks N``, default 2, gloo): a layer whose communication and compute are
  comparable, wall time per forward (median over ``--repeats``) unsplit and split, as a
  ratio -- a structure check of the overlap on this machine's cores, not a performance
  claim -- and, with the ``traces`` package, the exposed communication of each.

Prints one line per cell. Host syncs: many (outside timed regions).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import statistics
import sys
import time

import torch

__all__ = ["run_dbo_bench"]

_GPU_TOKENS = (32, 128, 512, 2048, 8192)
_MAX_LOSS = 0.05


def _gpu(args: argparse.Namespace, out) -> int:
    from moerun.bench.layer import LAYER_SHAPES, LayerSettings, build_layer, make_weights
    from moerun.bench.shapes import parse_tokens
    from moerun.bench.shared_command import shared_shapes
    from moerun.bench.timing import time_samples
    from schedulers import DBOConfig, decide_split

    device = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    settings = LayerSettings(device=device, dtype=dtype, repeats=args.repeats,
                             warmup=args.warmup)
    tokens = parse_tokens(args.tokens) or list(_GPU_TOKENS)
    forced = DBOConfig(small_threshold=2, large_threshold=2,
                       min_rows_per_expert_one_rank=0.0)
    default = DBOConfig()
    bad = []
    for shape in (shared_shapes(True)[0], LAYER_SHAPES["qwen3-30b-a3b"]):
        weights = make_weights(shape, settings, args.seed + shape.experts)
        whole = build_layer(shape, settings, weights, scheduler="external")
        split = build_layer(shape, settings, weights, scheduler="dbo", dbo_config=forced)
        gen = torch.Generator(device=device).manual_seed(args.seed)
        for t in tokens:
            xs = [torch.randn(t, shape.hidden, generator=gen, device=device, dtype=dtype)
                  for _ in range(4)]
            ls = [torch.randn(t, shape.experts, generator=gen, device=device)
                  for _ in range(4)]
            with torch.no_grad():
                a = statistics.median(time_samples(lambda j: whole(xs[j % 4], ls[j % 4]),
                                                   device, args.repeats, warmup=args.warmup))
                b = statistics.median(time_samples(lambda j: split(xs[j % 4], ls[j % 4]),
                                                   device, args.repeats, warmup=args.warmup))
            rule = decide_split((t,), config=default, top_k=shape.top_k,
                                num_local_slots=shape.experts, capturing=False)
            loss = b / a - 1
            ok = (loss <= _MAX_LOSS) if rule.split else True
            wrongly_unsplit = (not rule.split) and loss < -_MAX_LOSS  # a split would win
            if not ok:
                bad.append(f"{shape.name} T={t}: the rule splits, the split loses {loss:.1%}")
            print(f"{shape.name:16s} T={t:<5d} unsplit {a * 1e6:9.1f} us  split {b * 1e6:9.1f} "
                  f"us  split/unsplit {b / a:.3f}  rule: {'split' if rule.split else 'unsplit'}"
                  f" ({rule.rule}){'  [a split would win here]' if wrongly_unsplit else ''}",
                  file=out)
        whole.close()
        split.close()
        del weights, whole, split
        torch.cuda.empty_cache()
    if bad:
        print("MISSED: " + "; ".join(bad), file=out)
    return 0


def _rank(rank: int, world_size: int, group, store, *, tokens: int, repeats: int,
          trace_dir: str | None) -> dict:
    from moerun import ConfigurableMoE, Mapping, MoEConfig
    from moerun.testing import make_case
    from schedulers import DBOConfig

    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=1024, intermediate_size=256,
                    check_inputs=False)
    case = make_case(cfg, tokens * world_size, 0)
    lo = rank * tokens
    x, logits = case.x[lo:lo + tokens], case.logits[lo:lo + tokens]
    mapping = Mapping(rank=rank, world_size=world_size, group=group)
    res = {}
    for name, kw in (("unsplit", dict(scheduler="external")),
                     ("dbo", dict(scheduler="dbo", dbo_config=DBOConfig(small_threshold=2)))):
        with ConfigurableMoE(cfg, mapping, comm="allgather", layer_idx=0, backend="reference",
                             **kw) as layer:
            layer.load_weights(case.w13, case.w2)
            counts = [tokens] * world_size
            for _ in range(3):
                layer(x, logits, all_rank_num_tokens=counts)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                layer(x, logits, all_rank_num_tokens=counts)
                times.append(time.perf_counter() - t0)
            res[name] = statistics.median(times)
            if trace_dir is not None:
                import traces
                from moerun.cli_run import align_ranks_for_capture

                align_ranks_for_capture(group)  # else the first rank to start waits, "exposed"
                cap = traces.capture(lambda: layer(x, logits, all_rank_num_tokens=counts),
                                     trace_dir, name=f"{name}-rank{rank}")
                rep = traces.overlap(cap.path)
                res[f"{name}_exposed_comm_us"] = rep.exposed_comm_us
                res[f"{name}_comm_us"] = rep.comm_us
    return res


def _cpu(args: argparse.Namespace, out) -> int:
    from moerun.bench.shapes import parse_tokens
    from moerun.launch import launch

    ranks = args.ranks or 2
    tokens = parse_tokens(args.tokens)[0] if args.tokens else 512
    trace_dir = args.trace
    results = launch(_rank, ranks, tokens=tokens, repeats=args.repeats, trace_dir=trace_dir)
    for r, res in enumerate(results):
        line = (f"rank {r}: unsplit {res['unsplit'] * 1e3:8.2f} ms  dbo {res['dbo'] * 1e3:8.2f} "
                f"ms  dbo/unsplit {res['dbo'] / res['unsplit']:.3f}")
        if "dbo_exposed_comm_us" in res:
            line += (f"  exposed comm unsplit {res['unsplit_exposed_comm_us']:.0f} us of "
                     f"{res['unsplit_comm_us']:.0f}, dbo {res['dbo_exposed_comm_us']:.0f} us "
                     f"of {res['dbo_comm_us']:.0f}")
        print(line, file=out)
    return 0


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _CheckedArgs:
    """``--dbo``'s flags after the pre-run check: ``problem`` is the one-line usage error
    (None when the flags are fine), ``device`` the device the run uses."""

    problem: str | None
    device: str


def _check_args(args: argparse.Namespace) -> _CheckedArgs:
    """Check ``--dbo``'s flags before any work. Pure apart from the device probe."""
    from moerun.bench.device import device_of
    from moerun.bench.shapes import parse_tokens
    from moerun.cli_run import check_out_dir

    try:
        device = device_of(args.device)
        tokens = parse_tokens(args.tokens)
    except ValueError as exc:
        return _CheckedArgs(problem=str(exc), device=args.device)
    problem = None
    if args.ranks is not None and args.ranks < 2:
        problem = f"--ranks must be >= 2 (got {args.ranks})"
    elif args.repeats < 1:
        problem = f"--repeats must be >= 1 (got {args.repeats})"
    elif args.warmup < 0:
        problem = f"--warmup must be >= 0 (got {args.warmup})"
    elif device == "cpu" and tokens is not None and len(tokens) != 1:
        problem = (f"--tokens {args.tokens!r}: --dbo on CPU takes one count (tokens per "
                   "rank)")
    elif device == "cpu" and args.trace is not None:
        problem = check_out_dir("--trace", args.trace)
    return _CheckedArgs(problem=problem, device=device)


def run_dbo_bench(args: argparse.Namespace, *, out=None, err=None) -> int:
    """Run ``moerun bench --dbo``. Returns 0, or 2 on a usage error (reported before any
    rank starts).

    Side effects: prints to ``out``/``err``; on CUDA builds and times layers on the current
    device (host syncs); on CPU spawns gloo ranks (collectives) and, with ``--trace``, writes
    trace files."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    checked = _check_args(args)
    if checked.problem is not None:
        print(f"moerun bench: {checked.problem}", file=err)
        return 2
    device = checked.device
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    where = (torch.cuda.get_device_name() if device == "cuda" else
             f"cpu ({os.cpu_count()} cores), gloo, {args.ranks or 2} ranks")
    print(f"# moerun bench --dbo --device {device} --repeats {args.repeats}"
          f"{' --tokens ' + args.tokens if args.tokens else ''}\n# {date}  {where}  "
          f"torch {torch.__version__}", file=out)
    try:
        return _gpu(args, out) if device == "cuda" else _cpu(args, out)
    except ValueError as exc:
        print(f"moerun bench: {exc}", file=err)
        return 2
