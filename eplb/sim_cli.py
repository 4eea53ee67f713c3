"""``moerun eplb-sim``: the command line of the EPLB simulator (:mod:`eplb.sim`).

One line per case: max/mean rank load before (no redundancy, contiguous), after
``eplb.rebalance``, DeepSeek's after, and the slots moved per rebalance. CPU-only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Sequence

import torch

from eplb.policy import _check_sizes
from eplb.sim import (hot_load, simulate_drift, simulate_known, simulate_sequence, uniform_load,
                      zipf_load)

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``moerun eplb-sim`` argument parser (every flag with its default). Pure; host only."""
    p = argparse.ArgumentParser(
        prog="moerun eplb-sim",
        description="Simulate the EPLB policy against DeepSeek's EPLB on synthetic or recorded "
                    "loads. One line per case: max/mean rank load before (no redundancy, "
                    "contiguous), after (eplb.rebalance), DeepSeek's after, and slots moved "
                    "per rebalance as a fraction of a full reload (bytes = slots x expert bytes).")
    p.add_argument("--experts", type=int, default=256, help="logical experts E (default 256)")
    p.add_argument("--ranks", type=int, default=8, help="EP ranks R (default 8)")
    p.add_argument("--slots", type=int, default=288, help="physical slots S (default 288)")
    p.add_argument("--nodes", type=int, default=1, help="nodes N (default 1)")
    p.add_argument("--groups", type=int, default=1, help="expert groups G (default 1)")
    p.add_argument("--layers", type=int, default=1, help="layers for synthetic loads (default 1)")
    p.add_argument("--load", nargs="+", default=["zipf"],
                   choices=("uniform", "zipf", "hot", "drift", "file"),
                   help="cases to run (default zipf); zipf and drift run once per --zipf-s")
    p.add_argument("--zipf-s", type=float, nargs="+", default=[1.2],
                   help="Zipf exponents (default 1.2)")
    p.add_argument("--hot-share", type=float, default=0.3,
                   help="share of tokens on expert 0 for --load hot (default 0.3)")
    p.add_argument("--sigma", type=float, default=0.3,
                   help="log-normal drift sigma for --load drift (default 0.3)")
    p.add_argument("--draws", type=int, default=50, help="drift draws (default 50)")
    p.add_argument("--replans", type=int, default=None,
                   help="drift draws also re-planned for migration, 0 to --draws (default: "
                        "all --draws)")
    p.add_argument("--load-file", type=Path, default=None,
                   help="for --load file: .pt or .json tensor [steps, L, E] or [L, E] "
                        "(default: none)")
    p.add_argument("--tokens", type=int, default=100000,
                   help="tokens per synthetic load (default 100000)")
    p.add_argument("--seed", type=int, default=0, help="seed of every generator (default 0)")
    return p


class _UsageError(ValueError):
    """A bad command line: printed as one ``moerun eplb-sim: ...`` line, exit status 2."""


def _read_load_file(path: Path | None) -> torch.Tensor:
    """``[steps, L, E]`` float64 from ``--load-file``; :class:`_UsageError` naming the flag
    when it is missing, unreadable or not such a tensor."""
    if path is None:
        raise _UsageError("--load file needs --load-file PATH (.pt or .json)")
    if path.suffix not in (".pt", ".json"):
        raise _UsageError(f"--load-file {path}: expected a .pt or .json file")
    if not path.is_file():
        why = "no such file" if not path.exists() else "not a file"
        raise _UsageError(f"--load-file {path}: {why}")
    try:
        if path.suffix == ".pt":
            data = torch.load(path, map_location="cpu", weights_only=True)
            t = data if isinstance(data, torch.Tensor) else torch.tensor(data)
        else:
            t = torch.tensor(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        raise _UsageError(f"--load-file {path}: not valid JSON ({exc})") from None
    except Exception as exc:  # noqa: BLE001 -- unreadable file, bad pickle, ragged lists
        text = " ".join(str(exc).split())[:200]
        raise _UsageError(f"--load-file {path}: cannot read a tensor from it "
                          f"({type(exc).__name__}: {text})") from None
    if t.dim() == 2:
        t = t.unsqueeze(0)
    if t.dim() != 3 or 0 in t.shape:
        raise _UsageError(f"--load-file {path}: expected [steps, L, E] or [L, E] with every "
                          f"size >= 1, got {list(t.shape)}")
    if t.is_complex() or t.dtype == torch.bool:
        raise _UsageError(f"--load-file {path}: expected real token counts, got {t.dtype}")
    t = t.to(torch.float64)
    if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
        raise _UsageError(f"--load-file {path}: token counts must be finite and >= 0")
    return t


def _check_args(args: argparse.Namespace) -> None:
    """:class:`_UsageError` naming the flag for a value the simulator cannot use."""
    E, R = args.experts, args.ranks
    for flag, value in (("--experts", E), ("--layers", args.layers), ("--tokens", args.tokens),
                        ("--draws", args.draws)):
        if value < 1:
            raise _UsageError(f"{flag} must be >= 1 (got {value})")
    try:
        _check_sizes(E, args.slots, args.groups, args.nodes, R)
    except ValueError as err:  # policy's words (num_slots=...) -> the flags (--slots ...)
        text = str(err)
        for name, flag in (("num_experts", "--experts"), ("num_slots", "--slots"),
                           ("num_groups", "--groups"), ("num_nodes", "--nodes"),
                           ("num_ranks", "--ranks")):
            text = text.replace(f"{name}=", f"{flag} ").replace(f"{name} ", f"{flag} ")
        text = text.replace(" (the experts are load.shape[1])", "")
        raise _UsageError(text) from None
    if E % R:
        raise _UsageError(f"--experts {E} must be a multiple of --ranks {R} (the 'before' "
                          "figure is the no-redundancy placement, E / R experts per rank)")
    if not 0.0 <= args.hot_share <= 1.0:
        raise _UsageError(f"--hot-share must be in [0, 1] (got {args.hot_share:g})")
    if not (args.sigma >= 0 and math.isfinite(args.sigma)):
        raise _UsageError(f"--sigma must be finite and >= 0 (got {args.sigma:g})")
    for s in args.zipf_s:  # s = 0 is the uniform load; s < 0 would make "most popular" least
        if not (s >= 0 and math.isfinite(s)):
            raise _UsageError(f"--zipf-s must be finite and >= 0 (got {s:g})")
    if args.replans is not None and not 0 <= args.replans <= args.draws:
        raise _UsageError(f"--replans must be in [0, --draws] = [0, {args.draws}] (got "
                          f"{args.replans}): only drawn loads can be re-planned on")


def _f(x: torch.Tensor) -> str:
    """Mean over layers (and draws) with 4 decimals."""
    return f"{float(x.mean()):.4f}" if x.numel() else "n/a"


def _pct(x: torch.Tensor) -> str:
    return f"{100 * float(x.mean()):.1f}%" if x.numel() else "n/a"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the cases in ``argv`` and print one line per case; returns the exit status.

    Host only: prints to stdout/stderr; reads ``--load-file``."""
    args = build_parser().parse_args(argv)
    sizes = (args.slots, args.groups, args.nodes, args.ranks)
    E, R = args.experts, args.ranks
    try:  # every usage error before any work
        _check_args(args)
        loads = _read_load_file(args.load_file) if "file" in args.load else None
        if loads is not None and loads.shape[-1] != E:
            raise _UsageError(f"--load-file has E={loads.shape[-1]}, --experts {E}")
    except _UsageError as err:
        print(f"moerun eplb-sim: {err}", file=sys.stderr)
        return 2
    mode = "hierarchical" if args.groups % args.nodes == 0 and args.nodes > 1 else "global"
    print(f"# E={E} S={args.slots} R={R} N={args.nodes} G={args.groups} policy={mode} "
          f"layers={args.layers} tokens={args.tokens} seed={args.seed}; figures are means "
          "over layers (and draws); moved = slots rewritten / S")
    cases: list[tuple[str, torch.Tensor]] = []
    for kind in args.load:
        if kind == "uniform":
            cases.append(("uniform", uniform_load(E, args.tokens, args.seed, args.layers)))
        elif kind == "zipf":
            cases += [(f"zipf(s={s})", zipf_load(E, s, args.tokens, args.seed, args.layers))
                      for s in args.zipf_s]
        elif kind == "hot":
            cases.append((f"hot(share={args.hot_share})",
                          hot_load(E, args.tokens, args.seed, args.hot_share, args.layers)))
        elif kind == "drift":
            for s in args.zipf_s:
                _print_drift(f"drift(zipf s={s},sigma={args.sigma},draws={args.draws})",
                             zipf_load(E, s, args.tokens, args.seed, args.layers), sizes, args)
        else:
            if loads.shape[0] == 1:
                cases.append((f"file({args.load_file.name})", loads[0]))
            else:
                seq = simulate_sequence(loads, *sizes)
                print(f"case=file({args.load_file.name}) windows={loads.shape[0]} "
                      f"plan_on=t measure_on=t+1 before={_f(seq['before'])} "
                      f"after={_f(seq['after'])} deepseek={_f(seq['deepseek'])} "
                      f"moved={_pct(seq['moved'])} deepseek_moved={_pct(seq['deepseek_moved'])}")
    for name, load in cases:
        res = simulate_known(load, *sizes)
        line = (f"case={name} before={_f(res.before)} after={_f(res.after)} "
                f"deepseek={_f(res.deepseek)} moved={_pct(res.moved)} "
                f"deepseek_moved={_pct(res.deepseek_moved)} (first rebalance from the default "
                "placement)")
        if res.bound is not None:
            line += (f" bound={_f(res.bound)} gap={_pct(res.after / res.bound - 1)} "
                     f"deepseek_gap={_pct(res.deepseek / res.bound - 1)}")
        print(line)
    return 0


def _print_drift(name: str, load: torch.Tensor, sizes: tuple[int, int, int, int],
                 args: argparse.Namespace) -> None:
    replans = args.draws if args.replans is None else args.replans
    res = simulate_drift(load, *sizes, sigma=args.sigma, draws=args.draws, seed=args.seed + 1,
                         replans=replans)
    print(f"case={name} before={_f(res.before)} after={_f(res.after)} "
          f"deepseek={_f(res.deepseek)} | replan on the drifted load ({replans} draws): "
          f"after={_f(res.replan_after)} moved={_pct(res.replan_moved)} "
          f"deepseek_after={_f(res.deepseek_replan_after)} "
          f"deepseek_moved={_pct(res.deepseek_replan_moved)}")


if __name__ == "__main__":
    raise SystemExit(main())
