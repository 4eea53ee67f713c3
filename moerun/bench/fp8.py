"""``moerun bench --dtype fp8``: the expert matrix on the FP8 block-scaled path (issue 12).

Per cell (shape x T), in one run and with one timing method per cell:

* the fp8 call a layer makes (:func:`layer_fp8_call`) on e4m3 weights with fp32 128 x 128
  block scales (random codes and scales, so the dequantized weights have the bf16 matrix's
  scale): for a one-rank shape (group ``model``) ``backend.run_experts(x, ..., quant=)`` on
  the activation-dtype rows when the backend declares ``fuses_activation_quant`` (as
  ``schedulers/one_rank.py`` calls it), else -- and for the rank of an EP deployment
  (group ``ep-local``, rows quantized before dispatch) -- ``backend.quantize_rows(x)`` first;
* moerun's own bf16 call (``TritonExperts`` on CUDA) on the *dequantized* weights, the same
  inputs: the "faster than bf16" comparison of issue 12;
* CUDA-graph replay per call for ``T <= --graph-max-tokens``, eager above (the serving
  regime); device events; medians of ``--repeats`` samples;
* correctness on ``--check-tokens`` sampled rows against ``moerun.quant.reference_fp8_moe``
  (DESIGN 11a; bound 3e-2).

The fp8 floor (as ``shared/peers/fp8-h200-*.json``): ``max(flops / fp8 rate, (hit * 3*H*I +
scale bytes + 4*T*H) / BW)`` -- weights one byte per element, their fp32 block scales, ``x``
read and ``out`` written in bf16 -- with the fp8 rate measured in the same run
(``torch._scaled_mm`` 8192^3 e4m3, with and without fast accumulation, the larger) and BW the
stack's bandwidth ceiling (``moerun.bench.ceilings``). On a CPU the fp8 rate is the fp32
matmul rate (there is no fp8 GEMM to measure), and the floor ratios say nothing.
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from moerun._precision import exact_fp32
from moerun.bench.ceilings import Ceilings, Floor, floor_for
from moerun.bench.inputs import draw_routing
from moerun.bench.shapes import BenchShape
from moerun.bench.timing import time_graph_replay, time_samples

__all__ = ["Fp8Cell", "fp8_floor", "fp8_floor_us", "fp8_weights", "measure_fp8_rate",
           "run_fp8_matrix", "layer_fp8_call", "CPU_SHAPE"]

#: The CPU default (H and I multiples of 128, as the fp8 blocks need).
CPU_SHAPE = "8:2:128:128"
_GROUP = 128


@dataclass(frozen=True, kw_only=True)
class Fp8Cell:
    """One cell: sizes, ``experts_hit`` (mean over routings), the floors (µs), the times (µs,
    per call, ``method`` "graph" or "eager"), the fp8 ``err`` vs DESIGN 11a's reference and
    the config source of the fp8 kernels."""

    shape: str
    tokens: int
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int
    experts_hit: float
    floor_fp8_us: float
    floor_bf16_us: float
    method: str
    fp8_us: float
    bf16_us: float | None
    err: float
    backend: str
    config: str

    @property
    def fp8_floor_ratio(self) -> float:
        return self.floor_fp8_us / self.fp8_us

    @property
    def fp8_over_bf16(self) -> float | None:
        return None if self.bf16_us is None else self.fp8_us / self.bf16_us


def fp8_floor(shape: BenchShape, tokens: int, experts_hit: float, ceilings: Ceilings,
              fp8_rate: float) -> Floor:
    """The fp8 floor of one cell (module docstring): the flops over ``fp8_rate`` (FLOP/s),
    the bytes over ``ceilings.bandwidth``. Pure arithmetic."""
    h, i, k = shape.hidden, shape.intermediate, shape.top_k
    flops = 2.0 * tokens * k * 3 * h * i
    scale_bytes = experts_hit * 3 * h * i / _GROUP ** 2 * 4
    nbytes = experts_hit * 3 * h * i + scale_bytes + 4.0 * tokens * h
    return Floor(flops=flops, bytes=nbytes, compute_us=flops / fp8_rate * 1e6,
                 memory_us=nbytes / ceilings.bandwidth * 1e6)


def fp8_floor_us(shape: BenchShape, tokens: int, experts_hit: float, ceilings: Ceilings,
                 fp8_rate: float) -> float:
    """:func:`fp8_floor` in µs. Pure; host only."""
    return fp8_floor(shape, tokens, experts_hit, ceilings, fp8_rate).us


def measure_fp8_rate(device: torch.device, size: int = 8192, repeats: int = 10) -> dict:
    """FLOP/s of ``torch._scaled_mm`` on random e4m3 ``size``-square operands, without and
    with fast accumulation (``{"plain": .., "fast": ..}``). CUDA only. Host syncs: yes."""
    a = torch.randn(size, size, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(size, size, device=device).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=device)
    out = {}
    for fast in (False, True):
        s = statistics.median(time_samples(
            lambda _: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                       use_fast_accum=fast), device, repeats, warmup=3))
        out["fast" if fast else "plain"] = 2.0 * size ** 3 / s
    del a, b
    torch.cuda.empty_cache()
    return out


def fp8_weights(shape: BenchShape, device: torch.device, gen: torch.Generator,
                 act_dtype: torch.dtype):
    """Random finite e4m3 codes, positive block scales giving the dequantized weights a std
    of about ``H^-0.5`` / ``I^-0.5``, and the dequantized weights in ``act_dtype`` (built one
    expert at a time). Allocates and fills on ``device`` (draws from ``gen``); no host sync."""
    e, h, i = shape.num_experts, shape.hidden, shape.intermediate

    def codes(*size):
        c = torch.randint(0, 254, size, generator=gen, device=device, dtype=torch.uint8)
        return torch.where(c >= 127, c + 1, c).view(torch.float8_e4m3fn)  # no NaN codes

    w13, w2 = codes(e, 2 * i, h), codes(e, h, i)
    s13 = (torch.rand(e, 2 * i // _GROUP, h // _GROUP, generator=gen, device=device) + 0.5) \
        * (h ** -0.5 / 100)
    s2 = (torch.rand(e, h // _GROUP, i // _GROUP, generator=gen, device=device) + 0.5) \
        * (i ** -0.5 / 100)
    d13 = torch.empty(e, 2 * i, h, device=device, dtype=act_dtype)
    d2 = torch.empty(e, h, i, device=device, dtype=act_dtype)
    for x in range(e):
        d13[x] = (w13[x].float() * s13[x].repeat_interleave(_GROUP, 0)
                  .repeat_interleave(_GROUP, 1)).to(act_dtype)
        d2[x] = (w2[x].float() * s2[x].repeat_interleave(_GROUP, 0)
                 .repeat_interleave(_GROUP, 1)).to(act_dtype)
    return w13, w2, s13, s2, d13, d2


def layer_fp8_call(backend, shape: BenchShape, x: torch.Tensor, w13: torch.Tensor,
                   w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                   quant) -> torch.Tensor:
    """The expert call a quantized layer of ``shape``'s deployment makes: a one-rank layer
    (every group but ``ep-local``) hands a backend that declares ``fuses_activation_quant``
    the activation-dtype rows ``x`` with ``quant=`` (``schedulers/one_rank.py``: no
    ``quantize`` step); otherwise, and on an EP rank (``ep-local``: its rows were quantized
    before dispatch), ``backend.quantize_rows(x)`` runs first. Returns ``[T, H]`` in
    ``quant.out_dtype``; the backend's launches, no host sync."""
    if shape.group != "ep-local" and type(backend).fuses_activation_quant:
        return backend.run_experts(x, w13, w2, topk_weights, topk_ids, quant=quant)
    return backend.run_experts(backend.quantize_rows(x, quant.config), w13, w2, topk_weights,
                               topk_ids, quant=quant)


def run_fp8_matrix(shapes: list[BenchShape], tokens: list[int] | None, *, device: torch.device,
                   ceilings: Ceilings, fp8_rate: float, backend, bf16_backend,
                   act_dtype: torch.dtype, repeats: int, warmup: int, graph_max_tokens: int,
                   calls: int, check_tokens: int, seed: int, on_cell=lambda c: None
                   ) -> list[Fp8Cell]:
    """Run every cell (module docstring); ``backend`` must declare ``supports_fp8_block``;
    ``bf16_backend`` may be None (no bf16 column). Host syncs: many (outside timed
    regions)."""
    from moerun.quant import ExpertQuant, QuantConfig, reference_fp8_moe

    qc = QuantConfig()
    use_graph_ok = device.type == "cuda"
    cells = []
    for shape in shapes:
        gen = torch.Generator(device=device).manual_seed(seed)
        w13, w2, s13, s2, d13, d2 = fp8_weights(shape, device, gen, act_dtype)
        eq = ExpertQuant(config=qc, w13_scale=s13, w2_scale=s2, out_dtype=act_dtype)
        e, k, h = shape.num_experts, shape.top_k, shape.hidden
        for t in (tokens or shape.tokens):
            x = torch.randn(t, h, generator=gen, device=device, dtype=act_dtype)
            routings = [draw_routing(t, e, k, gen, device) for _ in range(calls)]
            hit = sum(int(torch.unique(ids).numel()) for _, ids in routings) / calls  # sync
            n = len(routings)

            def fp8_call(j):
                w, ids = routings[j % n]
                return layer_fp8_call(backend, shape, x, w13, w2, w, ids, eq)

            def bf16_call(j):
                w, ids = routings[j % n]
                return bf16_backend.run_experts(x, d13, d2, w, ids)

            graph = use_graph_ok and t <= graph_max_tokens and not shape.eager_only

            def timed(fn):
                if graph:
                    return statistics.median(time_graph_replay(fn, n, repeats,
                                                               warmup=warmup)) * 1e6
                return statistics.median(time_samples(fn, device, repeats,
                                                      warmup=warmup)) * 1e6

            fp8_us = timed(fp8_call)
            bf16_us = timed(bf16_call) if bf16_backend is not None else None
            rows = torch.randperm(t, generator=gen, device=device)[:check_tokens].sort().values
            w0, ids0 = routings[0]
            got = fp8_call(0)[rows]
            ref = reference_fp8_moe(x[rows], w13, s13, w2, s2, w0[rows], ids0[rows], qc,
                                    out_dtype=act_dtype)
            den = ref.double().norm().item()
            err = (got.double() - ref.double()).norm().item() / (den if den > 0 else 1.0)
            source = ""
            if hasattr(backend, "fp8_config_source"):
                source = backend.fp8_config_source(e, shape.intermediate, h, t, k)
            floor16 = floor_for(shape, t, hit, 2, ceilings).us  # the bf16 matrix's floor
            cell = Fp8Cell(shape=shape.name, tokens=t, num_experts=e, top_k=k, hidden=h,
                           intermediate=shape.intermediate, experts_hit=hit,
                           floor_fp8_us=fp8_floor_us(shape, t, hit, ceilings, fp8_rate),
                           floor_bf16_us=floor16, method="graph" if graph else "eager",
                           fp8_us=fp8_us, bf16_us=bf16_us, err=err, backend=backend.name,
                           config=source)
            cells.append(cell)
            on_cell(cell)
            del x, routings
        del w13, w2, s13, s2, d13, d2
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return cells


def cell_line(c: Fp8Cell) -> str:
    """One stable line per cell."""
    vs = "" if c.bf16_us is None else f"  bf16 {c.bf16_us:10.1f} us  fp8/bf16 " \
        f"{c.fp8_over_bf16:.3f}"
    return (f"{c.shape:16s} T={c.tokens:6d} {c.method:5s} fp8 {c.fp8_us:10.1f} us  floor "
            f"{c.floor_fp8_us:9.1f}  floor/time {c.fp8_floor_ratio:.3f}{vs}  err {c.err:.2e}"
            f"  {c.config}")


def summary_lines(cells: list[Fp8Cell]) -> list[str]:
    """Geomean of fp8 floor/time, and the cells at T >= 16 where fp8 is not faster."""
    if not cells:
        return ["no cells"]
    geo = math.exp(sum(math.log(c.fp8_floor_ratio) for c in cells) / len(cells))
    lines = [f"geomean fp8 floor/time over {len(cells)} cells: {geo:.3f}"]
    slower = [c for c in cells if c.tokens >= 16 and c.bf16_us is not None
              and c.fp8_us >= c.bf16_us]
    if any(c.bf16_us is not None for c in cells):
        lines.append("fp8 faster than bf16 in every cell with T >= 16" if not slower else
                     "fp8 NOT faster than bf16 at T >= 16 in: " + ", ".join(
                         f"{c.shape} T={c.tokens} ({c.fp8_over_bf16:.3f})" for c in slower))
    bad = [c for c in cells if not c.err <= 3e-2]
    lines.append("every cell within 3e-2 of the DESIGN 11a reference" if not bad else
                 "OVER 3e-2: " + ", ".join(f"{c.shape} T={c.tokens} ({c.err:.2e})"
                                          for c in bad))
    return lines


@exact_fp32()
def run(args, out, err) -> int:
    """``moerun bench --dtype fp8`` (flags of ``moerun.bench.command``). Returns 0, 1 when a
    cell misses the 3e-2 bound, 2 on a usage error."""
    from moerun.backends.reference import ReferenceExperts
    from moerun.bench.ceilings import measure_run_ceilings, parse_ceilings
    from moerun.bench.shapes import parse_shapes, parse_tokens

    from moerun.bench.device import device_of

    try:
        device = torch.device(device_of(args.device))
        if args.shapes is None:
            args.shapes = ("mixtral8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3"
                           if device.type == "cuda" else CPU_SHAPE)
        shapes = parse_shapes(args.shapes)
        for s in shapes:
            if s.hidden % _GROUP or s.intermediate % _GROUP:
                raise ValueError(f"--shapes {s.name}: H={s.hidden} and I={s.intermediate} must "
                                 f"be multiples of {_GROUP} for the fp8 blocks")
        tokens = parse_tokens(args.tokens)
        given = parse_ceilings(args.ceilings) if args.ceilings else None
        names = ("triton" if device.type == "cuda" else "reference",) \
            if args.backends is None else tuple(b.strip() for b in args.backends.split(","))
        if len(names) != 1 or names[0] not in ("triton", "reference"):
            raise ValueError(f"--backends {args.backends!r}: with --dtype fp8 give one of "
                             "triton, reference")
    except ValueError as exc:
        print(f"moerun bench: {exc}", file=err)
        return 2
    act = torch.bfloat16 if device.type == "cuda" else torch.float32
    if names[0] == "triton":
        from moerun.backends.triton.experts import TritonExperts

        backend = TritonExperts()
    else:
        backend = ReferenceExperts()
    bf16_backend = None
    if device.type == "cuda":
        from moerun.backends.triton.experts import TritonExperts

        bf16_backend = TritonExperts()
    ceilings = given or measure_run_ceilings(device, act, read_bytes=args.ceiling_bytes,
                                             matmul_size=args.matmul_size, seed=args.seed)
    rates = measure_fp8_rate(device) if device.type == "cuda" else \
        {"plain": ceilings.flops, "fast": ceilings.flops}
    fp8_rate = max(rates.values())
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"# moerun bench --dtype fp8 --shapes {args.shapes}"
          + (f" --tokens {args.tokens}" if args.tokens else ""), file=out)
    from moerun.bench.device import device_text

    print(f"# {date}  {device_text(device)}  backend {backend.name}  activations {act}",
          file=out)
    print(f"ceilings: {ceilings.describe()}; fp8 rate plain {rates['plain'] / 1e12:.1f} fast "
          f"{rates['fast'] / 1e12:.1f} TFLOP/s"
          + ("" if device.type == "cuda" else " (cpu: the fp32 matmul rate; no fp8 GEMM to "
                                                 "time, the floor ratios say nothing)"),
          file=out)
    out.flush()

    def on_cell(c):
        print(cell_line(c), file=out)
        out.flush()

    t0 = time.time()
    cells = run_fp8_matrix(shapes, tokens, device=device, ceilings=ceilings, fp8_rate=fp8_rate,
                           backend=backend, bf16_backend=bf16_backend, act_dtype=act,
                           repeats=args.repeats, warmup=args.warmup,
                           graph_max_tokens=args.graph_max_tokens,
                           calls=args.calls_per_graph, check_tokens=args.check_tokens,
                           seed=args.seed, on_cell=on_cell)
    for line in summary_lines(cells):
        print(line, file=out)
    print(f"wall {time.time() - t0:.0f} s", file=out)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date": date, "device": dev, "ceilings": asdict(ceilings),
                       "fp8_rate": rates, "cells": [asdict(c) for c in cells]}, f, indent=1)
    return 0 if all(c.err <= 3e-2 for c in cells) else 1
