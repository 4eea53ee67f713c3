"""Run the benchmark matrix: per shape, per token count, every chosen backend.

Each shape runs its own T list (:attr:`BenchShape.tokens`) unless one is given for all.
Per cell: one fresh input ``x [T, H]`` and ``calls_per_graph`` fresh uniform routings
(``ids [T, K]`` int32: K distinct experts per token, uniformly; ``weights [T, K]`` fp32, a
softmax of random logits), shared by every backend. Routing 0 is the one checked for
correctness; timing rotates through all of them (eager: sample ``i`` uses routing
``i % R``; graph: one graph holds one call per routing). The floor uses the mean number of
distinct experts hit over the routings. EP-local shapes (``eager_only``) are never timed as
graph replay. Each backend result records where its kernel configuration came from
(``"tuned (<file>)"`` / ``"heuristic"``, empty for a backend without configs).
"""

from __future__ import annotations

import gc
import statistics
import zlib
from dataclasses import dataclass, field
from typing import Callable

import torch

from moerun.bench.ceilings import Ceilings, Floor, floor_for
from moerun.bench.inputs import draw_routing, make_weights, reference_rows
from moerun.bench.registry import BENCH_BACKENDS, BenchBackend, problem_for, select_backends
from moerun.bench.shapes import BenchShape
from moerun.bench.timing import GraphCaptureError, time_graph_replay, time_samples
from moerun.env import Env
from moerun.testing import TOL, rel_err

__all__ = ["BenchSettings", "BackendResult", "CellResult", "run_matrix", "draw_routing",
           "reference_rows", "backend_names_for", "tokens_for", "plan_cells"]


@dataclass(frozen=True, kw_only=True)
class BenchSettings:
    """How to run the matrix.

    Fields: ``device``; ``dtype`` of x and weights; ``repeats`` timed samples (median);
    ``warmup`` untimed calls; ``graph`` allow CUDA-graph replay (CUDA only);
    ``graph_max_tokens`` largest T timed as a graph; ``calls_per_graph`` routings drawn per
    cell (= calls captured per graph); ``check_tokens`` rows in the correctness subsample;
    ``backends`` names, or None for auto (every registered backend, ``reference`` only when
    ``T <= reference_max_tokens``); ``seed``.
    """

    device: torch.device
    dtype: torch.dtype
    repeats: int = 20
    warmup: int = 3
    graph: bool = True
    graph_max_tokens: int = 1024
    calls_per_graph: int = 10
    check_tokens: int = 64
    backends: tuple[str, ...] | None = None
    reference_max_tokens: int = 16
    seed: int = 0


@dataclass(frozen=True, kw_only=True)
class BackendResult:
    """One backend in one cell: ``eager_us`` / ``graph_us`` (median per call, None when not
    timed), ``err`` (relative error on the subsample vs the fp32 reference; None when the run
    failed), ``err_bound``, ``note`` (why something was skipped or failed), ``config``
    (where the kernel configuration came from: ``"tuned (<file>)"``, ``"heuristic"``; ""
    for a backend without configs)."""

    name: str
    eager_us: float | None = None
    graph_us: float | None = None
    err: float | None = None
    err_bound: float = 0.0
    note: str = ""
    config: str = ""

    @property
    def ok(self) -> bool:
        """Correct: ran, and ``err < err_bound`` (NaN fails)."""
        return self.err is not None and self.err < self.err_bound


@dataclass(frozen=True, kw_only=True)
class CellResult:
    """One cell: shape and ``tokens``, ``experts_hit`` per routing, the ``floor``, each
    backend's result, ``skipped`` (backend name -> reason it did not run here), ``group``
    (the shape's summary group) and ``eager_only`` (never timed as graph replay)."""

    shape: str
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int
    tokens: int
    experts_hit: tuple[int, ...]
    floor: Floor
    results: tuple[BackendResult, ...]
    skipped: dict[str, str] = field(default_factory=dict)
    group: str = "model"
    eager_only: bool = False

    @property
    def label(self) -> str:
        return f"{self.shape} T={self.tokens}"

    @property
    def experts_hit_mean(self) -> float:
        return sum(self.experts_hit) / len(self.experts_hit)


def backend_names_for(settings: BenchSettings, tokens: int) -> list[str]:
    """Backend names planned for a cell with ``tokens`` tokens. Pure; host only."""
    if settings.backends is not None:
        return list(settings.backends)
    return [n for n in BENCH_BACKENDS
            if n != "reference" or tokens <= settings.reference_max_tokens]


def tokens_for(shape: BenchShape, tokens: list[int] | None) -> list[int]:
    """The T list of ``shape``: ``tokens`` when given, else the shape's own. Pure; host only."""
    return list(shape.tokens) if tokens is None else list(tokens)


def plan_cells(shapes: list[BenchShape], tokens: list[int] | None) -> list[tuple[BenchShape, int]]:
    """Every ``(shape, T)`` cell in run order. Pure; host only."""
    return [(shape, t) for shape in shapes for t in tokens_for(shape, tokens)]


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}"


def _run_backend(bench: BenchBackend, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                 routings: list[tuple[torch.Tensor, torch.Tensor]], rows: torch.Tensor,
                 ref: torch.Tensor, settings: BenchSettings, use_graph: bool) -> BackendResult:
    bound = TOL[settings.dtype]
    notes: list[str] = []
    weights0, ids0 = routings[0]
    try:
        out = bench.backend.run_experts(x, w13, w2, weights0, ids0)
        if out.shape != x.shape or out.dtype != x.dtype:
            return BackendResult(name=bench.name, err_bound=bound,
                                 note=f"wrong output {tuple(out.shape)} {out.dtype}")
        err = rel_err(out[rows], ref)
        del out
    except Exception as exc:  # noqa: BLE001 - one broken backend must not stop the matrix
        return BackendResult(name=bench.name, err_bound=bound, note=f"run: {_short(exc)}")

    num = len(routings)

    def call(i: int):
        w, ids = routings[i % num]
        return bench.backend.run_experts(x, w13, w2, w, ids)

    eager_us = graph_us = None
    try:
        eager_us = statistics.median(time_samples(call, settings.device, settings.repeats,
                                                  warmup=settings.warmup)) * 1e6
    except Exception as exc:  # noqa: BLE001
        notes.append(f"eager: {_short(exc)}")
    if use_graph and bench.graph_skip:
        notes.append(f"graph: skipped ({bench.graph_skip})")
    elif use_graph:
        try:
            graph_us = statistics.median(time_graph_replay(
                call, num, settings.repeats, warmup=settings.warmup)) * 1e6
        except GraphCaptureError as exc:
            notes.append(f"graph: capture failed ({exc})")
        except Exception as exc:  # noqa: BLE001
            notes.append(f"graph: {_short(exc)}")
    return BackendResult(name=bench.name, eager_us=eager_us, graph_us=graph_us, err=err,
                         err_bound=bound, note="; ".join(notes), config=_config_source(
                             bench, x, w13, ids0))


def _config_source(bench: BenchBackend, x: torch.Tensor, w13: torch.Tensor,
                   ids: torch.Tensor) -> str:
    """The backend's own account of the configuration a call of this shape runs."""
    try:
        return bench.backend.kernel_config(num_slots=w13.shape[0], hidden=x.shape[1],
                                           intermediate=w13.shape[1] // 2,
                                           num_tokens=x.shape[0], top_k=ids.shape[1],
                                           dtype=x.dtype)
    except Exception as exc:  # noqa: BLE001 - a report, never a reason to stop the matrix
        return f"unknown ({_short(exc)})"


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_matrix(shapes: list[BenchShape], tokens: list[int] | None, settings: BenchSettings,
               ceilings: Ceilings, env: Env,
               progress: Callable[[str], None] = lambda _: None,
               on_cell: Callable[[CellResult], None] = lambda _: None) -> list[CellResult]:
    """Run every (shape, T) cell (``tokens`` None: each shape's own T list); return their
    results in order.

    Weights (``w13 [E, 2I, H]``, ``w2 [E, H, I]``, random, scaled by ``H^-0.5`` / ``I^-0.5``)
    are allocated once per shape and freed before the next. ``progress(label)`` is called
    once per (cell, planned backend); ``on_cell(result)`` after each cell. Host syncs: many
    (outside timed regions).
    """
    device, dtype = settings.device, settings.dtype
    elt = torch.empty((), dtype=dtype).element_size()
    use_graph_ok = settings.graph and device.type == "cuda"
    results: list[CellResult] = []
    for shape in shapes:
        shape_tokens = tokens_for(shape, tokens)
        gen = torch.Generator(device=device).manual_seed(settings.seed)
        problem = problem_for(shape.num_experts, shape.top_k, shape.hidden, shape.intermediate,
                              dtype, device.type)
        all_names = list(dict.fromkeys(n for t in shape_tokens
                                       for n in backend_names_for(settings, t)))
        selection = select_backends(all_names, problem, env)
        chosen, skipped_all = selection.chosen, selection.skipped
        by_name = {b.name: b for b in chosen}
        h = shape.hidden
        weights = make_weights(shape, dtype, device, generator=gen)
        w13, w2 = weights.w13, weights.w2
        del weights
        with torch.no_grad():
            for t_idx, num_tokens in enumerate(shape_tokens):
                cell_gen = torch.Generator(device=device).manual_seed(
                    settings.seed * 1_000_003 + 7919 * t_idx + zlib.crc32(shape.name.encode()))
                x = torch.randn(num_tokens, h, generator=cell_gen, device=device, dtype=dtype)
                routings = [draw_routing(num_tokens, shape.num_experts, shape.top_k, cell_gen,
                                         device) for _ in range(max(1, settings.calls_per_graph))]
                hits = tuple(int(torch.unique(ids).numel()) for _, ids in routings)  # NOTE: sync
                floor = floor_for(shape, num_tokens, sum(hits) / len(hits), elt, ceilings)
                rows = torch.randperm(num_tokens, generator=cell_gen, device=device)[
                    : settings.check_tokens].sort().values
                weights0, ids0 = routings[0]
                ref = reference_rows(x[rows], w13, w2, weights0[rows], ids0[rows])
                use_graph = (use_graph_ok and not shape.eager_only
                             and num_tokens <= settings.graph_max_tokens)
                cell_results = []
                skipped = {}
                for name in backend_names_for(settings, num_tokens):
                    progress(f"{shape.name} T={num_tokens} {name}")
                    if name not in by_name:
                        skipped[name] = skipped_all.get(name, "not selected")
                        continue
                    cell_results.append(_run_backend(by_name[name], x, w13, w2, routings, rows,
                                                     ref, settings, use_graph))
                cell = CellResult(shape=shape.name, num_experts=shape.num_experts,
                                  top_k=shape.top_k, hidden=h, intermediate=shape.intermediate,
                                  tokens=num_tokens, experts_hit=hits, floor=floor,
                                  results=tuple(cell_results), skipped=skipped,
                                  group=shape.group, eager_only=shape.eager_only)
                results.append(cell)
                on_cell(cell)
                del x, routings, rows, ref
        del w13, w2
        _free(device)
    return results
