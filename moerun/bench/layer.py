"""``moerun bench --layer``: the whole ``ConfigurableMoE.forward`` against its own kernels.

Per cell (layer shape x T), in one run and with ceilings measured in that run:

* ``host_us``: host time to issue one forward with an idle device queue (sync, then a host
  clock around the call; median of a round of ``host_samples`` forwards) with
  ``check_inputs=False``, and ``host_checked_us`` with ``check_inputs=True`` (its NaN scan is
  a documented host sync, so that figure includes waiting for the device work queued before
  the scan). Three rounds, taken before, between and after the device timings; the figure
  is the lowest round, ``host_rounds_us`` / ``host_checked_rounds_us`` keep all three (the
  device machine's host shares its CPUs: the same code's round medians differ by up to 2x
  within one process, so the least-disturbed round is the code's cost). With
  ``host_core="fastest"`` each round runs on the core a survey just before it found fastest
  (``host_round_cores`` / ``host_round_loop_us``: :mod:`moerun.bench.host_core`);
* ``scan_us``: the documented sync of ``check_inputs=True`` alone -- the NaN/Inf scan of the
  logits and its device->host read, timed like the forwards. A round interleaves the three
  calls sample by sample (unchecked forward, checked forward, scan), so they meet the same
  host speed, and :meth:`LayerCell.check_extra_us` (``host_checked - host - scan`` of the
  round with the lowest ``host``) is what the checks cost beyond their sync, within one
  round;
* ``eager_us``: device-event time per forward, forwards issued back to back (host gaps
  included: when the host is slower than the device, this is host-bound);
* ``graph_us``: per-forward time of a CUDA graph holding ``calls`` forwards (CUDA only);
* ``kernels_eager_us`` / ``kernels_graph_us``: the backend's ``run_experts`` alone on the same
  routings (what the layer adds is the difference);
* the combined floor (routed experts + shared expert flops and bytes, plus the logits read)
  and each time's ratio to it; a correctness check on sampled rows against an fp32 reference.

Inputs are fresh random tensors (never zeros); ``calls`` input sets rotate through the eager
samples and fill the graph. Legend: ``E`` experts, ``K`` top-k, ``H`` hidden, ``I`` expert
intermediate, ``Is`` shared intermediate, ``T`` tokens.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from moerun.bench import host_core
from moerun.bench.ceilings import Ceilings
from moerun.bench.matrix import reference_rows
from moerun.bench.shapes import BenchShape
from moerun.bench.timing import (GraphCaptureError, HostCall, interleaved_host_samples,
                                 time_graph_replay, time_samples)
from moerun.config import MoEConfig, RoutingConfig, RoutingMethod

__all__ = ["LayerShape", "LAYER_SHAPES", "DEFAULT_LAYER_SHAPES", "CPU_LAYER_SHAPES",
           "LayerCell", "LayerSettings", "run_layer_cell", "combined_floor_us"]


@dataclass(frozen=True, kw_only=True)
class LayerShape:
    """A whole MoE layer: ``name``, ``experts`` E, ``top_k`` K, ``hidden`` H,
    ``intermediate`` I, ``shared`` Is (0 = none), ``routing``."""

    name: str
    experts: int
    top_k: int
    hidden: int
    intermediate: int
    shared: int
    routing: RoutingConfig

    def expert_shape(self) -> BenchShape:
        """The routed experts of this layer shape as a :class:`BenchShape`. Pure; host only."""
        return BenchShape(name=self.name, num_experts=self.experts, top_k=self.top_k,
                          hidden=self.hidden, intermediate=self.intermediate)


_DSV3_ROUTING = RoutingConfig(method=RoutingMethod.NOAUX_TC, renormalize=True,
                              num_expert_group=8, topk_group=4, routed_scaling_factor=2.5)
LAYER_SHAPES: dict[str, LayerShape] = {s.name: s for s in (
    LayerShape(name="qwen3-30b-a3b", experts=128, top_k=8, hidden=2048, intermediate=768,
               shared=0, routing=RoutingConfig(method=RoutingMethod.SOFTMAX_TOPK,
                                               renormalize=True)),
    LayerShape(name="deepseek-v3", experts=256, top_k=8, hidden=7168, intermediate=2048,
               shared=2048, routing=_DSV3_ROUTING),
    # CPU smoke shape (the default without CUDA): DeepSeek-like routing, a shared expert
    LayerShape(name="tiny", experts=16, top_k=4, hidden=64, intermediate=32, shared=32,
               routing=RoutingConfig(method=RoutingMethod.NOAUX_TC, renormalize=True,
                                     num_expert_group=4, topk_group=2,
                                     routed_scaling_factor=2.5)),
)}
DEFAULT_LAYER_SHAPES = ("qwen3-30b-a3b", "deepseek-v3")
CPU_LAYER_SHAPES = ("tiny",)


@dataclass(frozen=True, kw_only=True)
class LayerSettings:
    """``device``, ``dtype``, ``backend`` (a ``backend=`` name), ``repeats`` (timed samples;
    the median is reported), ``host_samples`` (forwards per round of each host figure),
    ``warmup``, ``calls`` (input sets; forwards per graph), ``graph``, ``check_rows``,
    ``seed``, ``host_core`` (where each round of host figures runs: ``"none"``,
    ``"fastest"`` or a core number, :func:`moerun.bench.host_core.placed`)."""

    device: torch.device
    dtype: torch.dtype
    backend: str = "auto"
    repeats: int = 20
    host_samples: int = 100
    warmup: int = 3
    calls: int = 10
    graph: bool = True
    check_rows: int = 32
    seed: int = 0
    host_core: str | int = "none"


@dataclass(frozen=True, kw_only=True)
class LayerCell:
    """One cell's figures (µs; None where not measured) and its floor."""

    shape: str
    tokens: int
    backend: str
    router: str
    floor_us: float
    bound: str
    host_us: float
    host_checked_us: float
    eager_us: float
    graph_us: float | None
    kernels_eager_us: float
    kernels_graph_us: float | None
    err: float
    note: str = ""
    host_rounds_us: tuple[float, ...] = ()
    host_checked_rounds_us: tuple[float, ...] = ()
    scan_us: float = float("nan")
    scan_rounds_us: tuple[float, ...] = ()
    host_round_cores: tuple[int | None, ...] = ()
    host_round_loop_us: tuple[float, ...] = ()

    def ratio(self, us: float | None) -> float | None:
        """``floor_us / us`` (floor/time); None when ``us`` is missing or not positive.

        Pure; host only."""
        return None if us is None or us <= 0 else self.floor_us / us

    def check_extra_us(self) -> float:
        """What ``check_inputs=True`` adds to a forward's host time beyond its documented
        sync: ``host_checked - host - scan`` within the round with the lowest unchecked host
        time (the three figures of a round are interleaved; the lowest figures of different
        rounds need not come from one round); from the lowest figures where the rounds are
        not kept; NaN where not measured. Pure; host only."""
        rounds = (self.host_rounds_us, self.host_checked_rounds_us, self.scan_rounds_us)
        if all(rounds) and len({len(r) for r in rounds}) == 1:
            r = min(range(len(self.host_rounds_us)), key=self.host_rounds_us.__getitem__)
            return (self.host_checked_rounds_us[r] - self.host_rounds_us[r]
                    - self.scan_rounds_us[r])
        return self.host_checked_us - self.host_us - self.scan_us

    def line(self) -> str:
        """The cell's figures as one printed line (``-`` where not measured). Pure; host only."""
        def f(v: float | None, fmt: str = "{:9.1f}") -> str:
            return fmt.format(v) if v is not None else "        -"

        g_over_k = (None if self.graph_us is None or not self.kernels_graph_us
                    else self.graph_us / self.kernels_graph_us)
        return (f"{self.shape:14s} T={self.tokens:<5d} host {f(self.host_us)} "
                f"host+chk {f(self.host_checked_us)} scan {f(self.scan_us)} "
                f"chk-extra {f(self.check_extra_us())} eager {f(self.eager_us)} "
                f"graph {f(self.graph_us)} kern.graph {f(self.kernels_graph_us)} "
                f"kern.eager {f(self.kernels_eager_us)} graph/kern {f(g_over_k, '{:5.3f}')} "
                f"floor {self.floor_us:8.1f} ({self.bound}) floor/graph "
                f"{f(self.ratio(self.graph_us), '{:5.3f}')} floor/eager "
                f"{f(self.ratio(self.eager_us), '{:5.3f}')} err {self.err:.2e}")

    def to_json(self) -> dict[str, Any]:
        """Every field of the cell as a JSON-ready dict. Pure; host only."""
        return dataclasses.asdict(self)


def combined_floor_us(shape: LayerShape, tokens: int, experts_hit: float, elt: int,
                      ceilings: Ceilings) -> tuple[float, str]:
    """Floor of one forward: routed + shared flops over the matmul rate, or routed + shared
    weight bytes, ``x`` read, output written and the fp32 logits read over the bandwidth
    ceiling, whichever is larger; and which one it is. Pure arithmetic."""
    h, i, k, s = shape.hidden, shape.intermediate, shape.top_k, shape.shared
    flops = 2.0 * tokens * (k * 3 * h * i + 3 * h * s)
    nbytes = (experts_hit * 3 * h * i + 3 * h * s) * elt + 2.0 * tokens * h * elt \
        + tokens * shape.experts * 4
    compute = flops / ceilings.flops * 1e6
    memory = nbytes / ceilings.bandwidth * 1e6
    return (memory, "memory") if memory >= compute else (compute, "compute")


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def _host_round_us(calls: list[HostCall], device: torch.device, samples: int) -> list[float]:
    """Median host time of each call, issued with an idle device queue, the calls
    interleaved sample by sample (:func:`interleaved_host_samples`), after 5 untimed rounds."""
    return [_median_us(t) for t in interleaved_host_samples(calls, device, samples, warmup=5)]


@dataclass(frozen=True, eq=False)
class LayerWeights:
    """Random global weights of one layer shape (on the bench device), loadable into any
    number of layers: ``w13 [E, 2I, H]``, ``w2 [E, H, I]``, ``shared`` dict, ``bias [E]``."""

    w13: torch.Tensor
    w2: torch.Tensor
    shared: dict | None
    bias: torch.Tensor | None


def make_weights(shape: LayerShape, settings: LayerSettings, seed: int) -> LayerWeights:
    """Fresh random weights (``N(0, 1/fan_in)``; the bias ``0.1 N``), never zeros."""
    dev, dtype = settings.device, settings.dtype
    gen = torch.Generator(device=dev).manual_seed(seed)
    e, h, i, s = shape.experts, shape.hidden, shape.intermediate, shape.shared

    def rnd(*size: int, scale: float) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=dev, dtype=dtype).mul_(scale)

    shared = ({"w13": rnd(2 * s, h, scale=h ** -0.5), "w2": rnd(h, s, scale=s ** -0.5)}
              if s else None)
    bias = (torch.randn(e, generator=gen, device=dev) * 0.1
            if shape.routing.uses_correction_bias else None)
    return LayerWeights(w13=rnd(e, 2 * i, h, scale=h ** -0.5), w2=rnd(e, h, i, scale=i ** -0.5),
                        shared=shared, bias=bias)


def build_layer(shape: LayerShape, settings: LayerSettings, weights: LayerWeights,
                **layer_kwargs: Any):
    """A loaded single-rank ``ConfigurableMoE`` of ``shape`` (``check_inputs=False``);
    ``layer_kwargs`` go to the constructor (e.g. ``shared_expert_order``)."""
    from moerun.layer import ConfigurableMoE

    cfg = MoEConfig(num_experts=shape.experts, top_k=shape.top_k, hidden_size=shape.hidden,
                    intermediate_size=shape.intermediate, routing=shape.routing,
                    dtype=settings.dtype, shared_intermediate_size=shape.shared,
                    check_inputs=False)
    layer = ConfigurableMoE(cfg, backend=settings.backend, device=settings.device,
                            layer_idx=0, **layer_kwargs)
    with torch.no_grad():
        layer.load_weights(weights.w13, weights.w2, weights.shared,
                           e_score_correction_bias=weights.bias)
    return layer


def measure_layer(layer: Any, shape: LayerShape, tokens: int, settings: LayerSettings,
                  ceilings: Ceilings, *, host: bool = True, kernels: bool = True) -> LayerCell:
    """Check ``layer`` on sampled rows and time it at ``tokens`` (see the module docstring).
    ``host`` / ``kernels``: also measure the host figures / the expert kernels alone."""
    dev, dtype = settings.device, settings.dtype
    gen = torch.Generator(device=dev).manual_seed(settings.seed * 7919 + tokens)
    e, h, s = shape.experts, shape.hidden, shape.shared
    cfg = layer.config
    with torch.no_grad():
        calls = max(1, settings.calls)
        xs = [torch.randn(tokens, h, generator=gen, device=dev, dtype=dtype)
              for _ in range(calls)]
        logits = [torch.randn(tokens, e, generator=gen, device=dev) for _ in range(calls)]
        routed = [layer.router(lg, valid_rows=tokens) for lg in logits]
        hits = [int(torch.unique(r.topk_ids).numel()) for r in routed]  # NOTE: host sync
        elt = torch.empty((), dtype=dtype).element_size()
        floor, bound = combined_floor_us(shape, tokens, sum(hits) / len(hits), elt, ceilings)

        # correctness on sampled rows: routed (fp32 reference) + shared (fp32)
        out = layer(xs[0], logits[0])
        rows = torch.randperm(tokens, generator=gen, device=dev)[: settings.check_rows]
        w0, ids0 = routed[0].topk_weights, routed[0].topk_ids
        ref = reference_rows(xs[0][rows], layer.w13, layer.w2, w0[rows], ids0[rows])
        if layer.shared_expert is not None:
            se = layer.shared_expert
            xr = xs[0][rows].float()
            gu = F.linear(xr, se.w13.float())
            ref = ref + F.linear(F.silu(gu[:, :s]) * gu[:, s:], se.w2.float())
        got = out[rows].float()
        err = float((got - ref).norm() / ref.norm().clamp_min(1e-30))

        def forward(j: int) -> torch.Tensor:
            return layer(xs[j % calls], logits[j % calls])

        def kernel_call(j: int) -> torch.Tensor:
            r = routed[j % calls]
            return layer.backend.run_experts(xs[j % calls], layer.w13, layer.w2,
                                             r.topk_weights, r.topk_ids)

        rounds: list[float] = []
        rounds_checked: list[float] = []
        rounds_scan: list[float] = []

        def scan(j: int) -> bool:  # what check_inputs=True syncs on (schedulers/validation.py)
            return bool(torch.isfinite(logits[j % calls]).all())  # NOTE: host sync

        checked = cfg.replace(check_inputs=True)  # bench only: the same layer and weights

        def unchecked_config() -> None:
            layer.config = cfg

        def checked_config() -> None:
            layer.config = checked

        host_calls = [HostCall(fn=forward, setup=unchecked_config),
                      HostCall(fn=forward, setup=checked_config),
                      HostCall(fn=scan, setup=unchecked_config)]

        placements = []

        def host_round() -> None:  # one round of each host figure (see the module docstring)
            if host:
                with host_core.placed(settings.host_core) as where:
                    plain, with_checks, alone = _host_round_us(host_calls, dev,
                                                               settings.host_samples)
                placements.append(where)
                layer.config = cfg
                rounds.append(plain)
                rounds_checked.append(with_checks)
                rounds_scan.append(alone)

        host_round()
        eager = _median_us(time_samples(forward, dev, settings.repeats, warmup=settings.warmup))
        host_round()
        k_eager = float("nan")
        if kernels:
            k_eager = _median_us(time_samples(kernel_call, dev, settings.repeats,
                                              warmup=settings.warmup))
        graph = k_graph = None
        notes = []
        if settings.graph and dev.type == "cuda":
            try:
                graph = _median_us(time_graph_replay(forward, calls, settings.repeats,
                                                     warmup=settings.warmup))
            except GraphCaptureError as exc:
                notes.append(f"graph capture failed: {exc}")
            if kernels:
                k_graph = _median_us(time_graph_replay(kernel_call, calls, settings.repeats,
                                                       warmup=settings.warmup))
        host_round()
        nan = float("nan")
        cell = LayerCell(shape=shape.name, tokens=tokens, backend=layer.report.backend,
                         router=layer.report.router, floor_us=floor, bound=bound,
                         host_us=min(rounds) if rounds else nan,
                         host_checked_us=min(rounds_checked) if rounds_checked else nan,
                         host_rounds_us=tuple(rounds),
                         host_checked_rounds_us=tuple(rounds_checked),
                         scan_us=min(rounds_scan) if rounds_scan else nan,
                         scan_rounds_us=tuple(rounds_scan),
                         host_round_cores=tuple(p.core for p in placements),
                         host_round_loop_us=tuple(p.loop_us for p in placements),
                         eager_us=eager,
                         graph_us=graph, kernels_eager_us=k_eager, kernels_graph_us=k_graph,
                         err=err, note="; ".join(notes))
        del xs, logits, routed, out
    return cell


def run_layer_cell(shape: LayerShape, tokens: int, settings: LayerSettings,
                   ceilings: Ceilings) -> LayerCell:
    """Build the layer, check it, time it. Allocates the layer's weights on the device
    (deepseek-v3 bf16: 22.5 GB routed + 88 MB shared); frees them before returning.

    Runs and times device work with host syncs (not capturable); empties the CUDA cache after."""
    weights = make_weights(shape, settings, settings.seed * 7919 + tokens)
    layer = build_layer(shape, settings, weights)
    try:
        return measure_layer(layer, shape, tokens, settings, ceilings)
    finally:
        layer.close()
        del layer, weights
        if settings.device.type == "cuda":
            torch.cuda.empty_cache()
