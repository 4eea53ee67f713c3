"""``moerun bench --shared [--write-table [PATH]]``: every shared-expert order on a
DeepSeek-V3-like layer, and the table ``resolve`` reads.

Cells (GPU default): one shared expert of 2048, E in {32 (the experts one rank holds under
EP8), 256}, top-8, H=7168, I=2048, T in {1, 16, 128, 1024, 4096}; variants: ``sequential``,
``aux_stream`` (plain side stream and SM partitions of 16 and 32 SMs), ``during_combine``
and ``fused``. Each variant is a real ``ConfigurableMoE`` built with that order, checked on
sampled rows and timed with :func:`moerun.bench.layer.measure_layer` (ceilings measured in
the same run). The served time is the CUDA-graph replay time up to ``--graph-max-tokens``
(1024) and the eager time above it, as in the expert matrix; a variant whose capture fails
is served eagerly and says so.

Choice per cell: the fastest served variant, unless it beats ``sequential`` by less than
``--min-gain`` (default 3 %: repeated runs of one order spread by several percent), which
keeps noise from picking an order; where the graph time is served, a variant that cannot be
captured (an SM partition) is not a candidate. A second choice per cell, by eager time
alone (``eager_order``), is what forwards issued from Python run: at decode sizes a side
stream can hide the shared MLP in a replayed graph yet cost more host time than it hides
eagerly. ``--write-table``
writes the choices (with every variant's time, the command, date and device) into
``moerun/shared_table.json`` (or PATH), replacing rows of the same key.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from pathlib import Path

import torch

from moerun._precision import exact_fp32

__all__ = ["run_shared_bench", "VARIANTS", "shared_shapes"]

_GIB = 2 ** 30
#: (order, partition SMs) timed on CUDA; on a CPU only the first of each order.
VARIANTS = (("sequential", None), ("aux_stream", None), ("aux_stream", 16),
            ("aux_stream", 32), ("during_combine", None), ("fused", None))
_GPU_TOKENS = (1, 16, 128, 1024, 4096)
_CPU_TOKENS = (4, 16)


def shared_shapes(cuda: bool):
    """The layer shapes of the benchmark: DeepSeek-V3-like at E=32 and E=256 (CUDA), or the
    tiny CPU shape. Pure; host only."""
    from moerun.bench.layer import LAYER_SHAPES, LayerShape
    from moerun.config import RoutingConfig, RoutingMethod

    if not cuda:
        return [LAYER_SHAPES["tiny"]]
    dsv3 = LAYER_SHAPES["deepseek-v3"]
    e32 = LayerShape(name="deepseek-v3-e32", experts=32, top_k=8, hidden=7168,
                     intermediate=2048, shared=2048,
                     routing=RoutingConfig(method=RoutingMethod.NOAUX_TC, renormalize=True,
                                           num_expert_group=8, topk_group=4,
                                           routed_scaling_factor=2.5))
    return [e32, dsv3]


def _label(order: str, sms: int | None) -> str:
    return order if sms is None else f"{order}@{sms}"


def _pick(times: dict[str, float], min_gain: float) -> str:
    """The fastest variant, unless it beats ``sequential`` by less than ``min_gain``."""
    best = min(times, key=times.get)
    return "sequential" if times[best] > times["sequential"] * (1 - min_gain) else best


@exact_fp32()
def run_shared_bench(args: argparse.Namespace, *, out=None, err=None) -> int:
    """Run ``moerun bench --shared``. Returns 0, 1 if a variant failed its correctness
    bound, 2 on a usage error. Writes the table with ``--write-table``.

    Side effects: prints to ``out``/``err``; TF32 off
    while it runs (restored after); builds and times layers on
    the device with host syncs; ``--write-table`` rewrites the table file."""
    from moerun.bench.ceilings import measure_ceilings, parse_ceilings
    from moerun.bench.device import device_of, device_text
    from moerun.bench.layer import LayerSettings, build_layer, make_weights, measure_layer
    from moerun.bench.shapes import parse_tokens
    from moerun.env import get_env
    from moerun.shared_table import SHARED_TABLE_PATH, row_key
    from moerun.testing import TOL

    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        device = torch.device(device_of(args.device))
        cuda = device.type == "cuda"
        tokens = (parse_tokens(args.tokens) if args.tokens
                  else list(_GPU_TOKENS if cuda else _CPU_TOKENS))
        given = parse_ceilings(args.ceilings) if args.ceilings else None
        if args.write_table == "default" and not cuda:
            # NOTE: a CPU run on a shared 2-core machine timed the orders 200x apart from
            # one run to the next (2026-12-05 review), and resolve reads the packaged table
            raise ValueError("--write-table without a path writes the packaged table that "
                             "resolve reads; a CPU run's timings do not belong there: give "
                             "a path (--write-table PATH)")
    except ValueError as exc:
        print(f"moerun bench: {exc}", file=err)
        return 2
    dtype = getattr(torch, args.dtype)
    ceilings = given or measure_ceilings(
        device, read_bytes=args.ceiling_bytes or (2 * _GIB if cuda else 64 * 2 ** 20),
        matmul_size=args.matmul_size or (8192 if cuda else 512), matmul_dtype=dtype,
        seed=args.seed)
    settings = LayerSettings(device=device, dtype=dtype, repeats=args.repeats,
                             warmup=args.warmup, calls=args.calls_per_graph,
                             graph=not args.no_graph, seed=args.seed)
    variants = [v for v in VARIANTS if cuda or v[1] is None]
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = (f"moerun bench --shared --tokens {','.join(map(str, tokens))} --dtype "
               f"{args.dtype} --repeats {args.repeats} --calls-per-graph {args.calls_per_graph}")
    dev_text = device_text(device)
    print(f"# {command}\n# {date}  {dev_text}", file=out)
    print(f"ceilings: {ceilings.describe()}", file=out)
    rows: dict[str, dict] = {}
    failed: list[str] = []
    picked_ratio: list[float] = []
    for shape in shared_shapes(cuda):
        weights = make_weights(shape, settings, args.seed + shape.experts)
        served: dict[int, dict[str, float]] = {t: {} for t in tokens}
        eager: dict[int, dict[str, float]] = {t: {} for t in tokens}
        floors: dict[int, float] = {}
        notes: dict[tuple[int, str], str] = {}
        for order, sms in variants:
            label = _label(order, sms)
            try:
                layer = build_layer(shape, settings, weights, shared_expert_order=order,
                                    shared_partition_sms=sms)
            except (ValueError, RuntimeError) as exc:
                print(f"  skip {shape.name} {label}: {exc}", file=out)
                continue
            try:
                for t in tokens:
                    cell = measure_layer(layer, shape, t, settings, ceilings, host=False,
                                         kernels=False)
                    graph_served = cuda and t <= args.graph_max_tokens
                    if graph_served and cell.graph_us is None:
                        # not capturable (an SM partition): it cannot serve a graph regime
                        notes[(t, label)] = f"not capturable, not a candidate: {cell.note}"
                        continue
                    served[t][label] = cell.graph_us if graph_served else cell.eager_us
                    eager[t][label] = cell.eager_us
                    floors[t] = cell.floor_us
                    if cell.note:
                        notes[(t, label)] = cell.note
                    if not cell.err < TOL[dtype]:
                        failed.append(f"{shape.name} T={t} {label} err {cell.err:.2e}")
            except RuntimeError as exc:  # e.g. a green context this torch cannot make
                print(f"  skip {shape.name} {label}: {exc}", file=out)
            finally:
                layer.close()
                del layer
                if cuda:
                    torch.cuda.empty_cache()
        cells = []
        for t in tokens:
            times = served[t]
            if "sequential" not in times:
                continue
            best = _pick(times, args.min_gain)
            e_times = {k: v for k, v in eager[t].items() if v is not None}
            e_best = _pick(e_times, args.min_gain) if "sequential" in e_times else best
            e_order, _, e_sms = e_best.partition("@")
            order, _, sms = best.partition("@")
            ratio = floors[t] / times[best]
            picked_ratio.append(ratio)
            cells.append({"tokens": t, "order": order,
                          "partition_sms": int(sms) if sms else None,
                          "eager_order": e_order,
                          "eager_partition_sms": int(e_sms) if e_sms else None,
                          "us": round(times[best], 2), "floor_us": round(floors[t], 2),
                          "variants_us": {k: round(v, 2) for k, v in times.items()},
                          "eager_variants_us": {k: round(v, 2) for k, v in e_times.items()}})
            line = "  ".join(f"{k} {v:9.1f}" for k, v in times.items())
            print(f"{shape.name:16s} T={t:<5d} floor {floors[t]:8.1f}  {line}  -> {best} "
                  f"(floor/time {ratio:.3f}, vs sequential {times['sequential'] / times[best]:.3f}x)"
                  f"; eager -> {e_best}", file=out)
            for (tt, label), note in notes.items():
                if tt == t:
                    print(f"  note {label}: {note}", file=out)
        key = row_key(device=get_env().device_name, world_size=1, num_experts=shape.experts,
                      top_k=shape.top_k, hidden=shape.hidden, intermediate=shape.intermediate,
                      shared=shape.shared, dtype=args.dtype)
        if cells:
            rows[key] = {"cells": cells}
        del weights
    if picked_ratio:
        geo = math.exp(sum(math.log(r) for r in picked_ratio) / len(picked_ratio))
        print(f"geomean floor/time of the picked orders: {geo:.3f} over {len(picked_ratio)} "
              "cells", file=out)
    if args.write_table:
        path = Path(SHARED_TABLE_PATH if args.write_table == "default" else args.write_table)
        table = json.loads(path.read_text()) if path.exists() else {"rows": {}}
        table["meta"] = {"command": command, "date": date, "device": dev_text,
                         "ceilings": ceilings.describe(), "min_gain": args.min_gain}
        table.setdefault("rows", {}).update(rows)
        os.makedirs(path.parent, exist_ok=True)
        path.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {path}", file=out)
    if failed:
        print(f"FAILED correctness: {', '.join(failed)}", file=err)
        return 1
    return 0
