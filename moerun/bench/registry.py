"""Which expert backends ``moerun bench`` can time, found by name and imported lazily.

A backend that is not importable (``moerun.backends.triton`` not there yet, triton missing)
or whose ``can_implement`` says no for a shape is skipped with its reason, never an error.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from moerun.backends.base import Backend
from moerun.capability import Deployment, Problem
from moerun.config import Activation
from moerun.env import Env

__all__ = ["BENCH_BACKENDS", "BenchBackend", "Selection", "load_backend", "select_backends",
           "problem_for"]

#: name -> (module, class). Order = column order of the report.
BENCH_BACKENDS: dict[str, tuple[str, str]] = {
    "reference": ("moerun.backends.reference", "ReferenceExperts"),
    "grouped_mm": ("moerun.backends.grouped_mm", "GroupedMMExperts"),
    "triton": ("moerun.backends.triton", "TritonExperts"),
}
# Known not capturable: graph replay is skipped with this reason instead of attempted.
_NOT_CAPTURABLE = {"reference": "host-synchronising oracle (nonzero per slot)"}


@dataclass(frozen=True, kw_only=True)
class BenchBackend:
    """A backend instance to time: ``name``, ``backend``, and ``graph_skip`` (a reason not to
    try CUDA-graph capture, or "")."""

    name: str
    backend: Backend
    graph_skip: str = ""


def load_backend(name: str) -> type[Backend]:
    """Import the class registered as ``name``. Raises ValueError (unknown name) or
    ImportError carrying the reason it is unavailable. Host only; imports the backend's module."""
    if name not in BENCH_BACKENDS:
        raise ValueError(f"--backends: unknown backend {name!r}; valid: "
                         f"{', '.join(BENCH_BACKENDS)}")
    module, cls_name = BENCH_BACKENDS[name]
    try:
        cls = getattr(importlib.import_module(module), cls_name)
    except Exception as exc:  # noqa: BLE001 - a half-built module must not stop the bench
        raise ImportError(f"{module}.{cls_name} unavailable: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
    return cls


def problem_for(num_experts: int, top_k: int, hidden: int, intermediate: int,
                dtype: torch.dtype, device_type: str) -> Problem:
    """The single-rank :class:`Problem` of one benchmark shape. Pure; host only."""
    return Problem(num_experts=num_experts, num_slots=num_experts, top_k=top_k,
                   hidden_size=hidden, intermediate_size=intermediate, dtype=dtype,
                   activation=Activation.SILU_GLU, device_type=device_type)


@dataclass(frozen=True, kw_only=True)
class Selection:
    """The backends a cell runs (``chosen``) and why the others do not (``skipped``: name ->
    import failure, ``can_implement`` reason and detail, or constructor failure)."""

    chosen: list[BenchBackend]
    skipped: dict[str, str]


def select_backends(names: list[str], problem: Problem, env: Env) -> Selection:
    """Instantiate every named backend that imports and accepts ``problem`` on one rank.

    Host only: imports and constructs the backends (no device work).
    """
    deployment = Deployment(rank=0, world_size=1, comm_backend="none",
                            num_local_slots=problem.num_slots, divisible=True)
    chosen: list[BenchBackend] = []
    skipped: dict[str, str] = {}
    for name in names:
        try:
            cls = load_backend(name)
        except ImportError as exc:
            skipped[name] = str(exc)
            continue
        try:
            elig = cls.can_implement(problem, deployment, env)
        except Exception as exc:  # noqa: BLE001
            skipped[name] = f"can_implement raised {type(exc).__name__}: {exc}"
            continue
        if not elig.ok:
            reason = getattr(elig.reason, "value", elig.reason)
            skipped[name] = f"can_implement: {reason}: {elig.detail}"
            continue
        try:
            backend = cls()
        except Exception as exc:  # noqa: BLE001
            skipped[name] = f"{cls.__name__}() raised {type(exc).__name__}: {exc}"
            continue
        chosen.append(BenchBackend(name=name, backend=backend,
                                   graph_skip=_NOT_CAPTURABLE.get(name, "")))
    return Selection(chosen=chosen, skipped=skipped)
