"""``moerun bench --layer``: command-line driver of :mod:`moerun.bench.layer`.

Reuses the matrix flags (``--shapes`` names layer shapes here: ``qwen3-30b-a3b``,
``deepseek-v3``, ``tiny``; ``--tokens``, ``--dtype``, ``--device``, ``--repeats``,
``--warmup``, ``--no-graph``, ``--calls-per-graph``, ``--seed``, ``--ceilings``, ``--out``)
plus ``--backends`` (one backend name for the layer) and ``--host-core`` (the CPU core the
host figures run on, :mod:`moerun.bench.host_core`). Prints one line per cell.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch

from moerun._precision import exact_fp32

__all__ = ["run_layer_bench"]

_GIB = 2 ** 30
_DEFAULT_TOKENS = (1, 16, 128, 1024, 8192)
_CPU_TOKENS = (1, 16, 128)


def _parse(args: argparse.Namespace):
    from moerun.bench.device import device_of
    from moerun.bench.layer import CPU_LAYER_SHAPES, DEFAULT_LAYER_SHAPES, LAYER_SHAPES
    from moerun.bench.shapes import parse_tokens

    device_name = device_of(args.device)
    cuda = device_name == "cuda"
    names = (args.shapes.split(",") if args.shapes else
             list(DEFAULT_LAYER_SHAPES if cuda else CPU_LAYER_SHAPES))
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in LAYER_SHAPES]
    if unknown or not names:
        raise ValueError(f"--shapes {args.shapes!r}: unknown layer shape(s) {unknown}; "
                         f"valid with --layer: {', '.join(LAYER_SHAPES)}")
    if args.tokens:
        tokens = parse_tokens(args.tokens)
    else:
        tokens = list(_DEFAULT_TOKENS if cuda else _CPU_TOKENS)
    backend = "auto"
    if args.backends:
        names_b = [b.strip() for b in args.backends.split(",") if b.strip()]
        if len(names_b) != 1:
            raise ValueError(f"--backends {args.backends!r}: --layer takes one backend")
        backend = names_b[0]
    return torch.device(device_name), [LAYER_SHAPES[n] for n in names], tokens, backend


@exact_fp32()
def run_layer_bench(args: argparse.Namespace, *, out=None, err=None) -> int:
    """Run ``moerun bench --layer``. Returns 0, 1 if a cell failed its correctness bound,
    2 on a usage error. Host syncs: many (outside timed regions)."""
    from moerun.bench import host_core
    from moerun.bench.ceilings import measure_ceilings, parse_ceilings
    from moerun.bench.device import device_text
    from moerun.bench.layer import LayerSettings, run_layer_cell
    from moerun.testing import TOL

    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        device, shapes, tokens, backend = _parse(args)
        core = host_core.parse_host_core(getattr(args, "host_core", "none"))
        given = parse_ceilings(args.ceilings) if args.ceilings else None
        if args.repeats < 1 or args.warmup < 0 or args.calls_per_graph < 1:
            raise ValueError("--repeats and --calls-per-graph must be >= 1, --warmup >= 0")
    except ValueError as exc:
        print(f"moerun bench: {exc}", file=err)
        return 2
    dtype = getattr(torch, args.dtype)
    cuda = device.type == "cuda"
    ceilings = given or measure_ceilings(
        device, read_bytes=args.ceiling_bytes or (2 * _GIB if cuda else 64 * 2 ** 20),
        matmul_size=args.matmul_size or (8192 if cuda else 512), matmul_dtype=dtype,
        seed=args.seed)
    settings = LayerSettings(device=device, dtype=dtype, backend=backend, repeats=args.repeats,
                             warmup=args.warmup, calls=args.calls_per_graph,
                             graph=not args.no_graph, seed=args.seed, host_core=core)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = " ".join(["moerun", "bench", "--layer"] + [
        f"{flag} {value}" for flag, value in (
            ("--shapes", ",".join(s.name for s in shapes)),
            ("--tokens", ",".join(map(str, tokens))), ("--dtype", args.dtype),
            ("--repeats", args.repeats), ("--calls-per-graph", args.calls_per_graph))]
        + ([f"--host-core {core}"] if core != "none" else []))
    print(f"# {command}", file=out)
    print(f"# {date}  {device_text(device)}  timer "
          f"{'cuda events' if cuda else 'host clock'}", file=out)
    print(f"ceilings: {ceilings.describe()}", file=out)
    if core != "none":
        where = "the fastest core of a fresh survey" if core == "fastest" else f"core {core}"
        print(f"host core: {host_core.survey().describe()} at start; each round of host "
              f"figures runs on {where}", file=out)
    out.flush()
    cells, failed = [], []
    for shape in shapes:
        for t in tokens:
            cell = run_layer_cell(shape, t, settings, ceilings)
            cells.append(cell)
            print(cell.line(), file=out)
            if cell.note:
                print(f"  note: {cell.note}", file=out)
            out.flush()
            if not cell.err < TOL[dtype]:
                failed.append(f"{shape.name} T={t} err {cell.err:.2e}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"command": command, "date": date, "device": device_text(device),
                       "ceilings": ceilings.describe(),
                       "host_core": str(core),
                       "cells": [c.to_json() for c in cells]},
                      f, indent=1)
        print(f"wrote {args.out}", file=out)
    if failed:
        print(f"FAILED correctness: {', '.join(failed)}", file=err)
        return 1
    return 0
