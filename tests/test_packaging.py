"""Packaging: import order, lazy public names, dependency direction (DESIGN 1, 12), and the
functional entry ``moerun.fused_experts``.

Import-order and dependency checks run in a fresh interpreter each (``sys.modules`` of this
test process already holds everything).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from moerun import fused_experts
from moerun.backends import ReferenceExperts, reference_moe

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("moerun", "schedulers", "eplb", "traces")


def _fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter at the repo root; it prints one JSON line last."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"fresh interpreter failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("first", PACKAGES)
def test_each_package_imports_first(first):
    others = [p for p in PACKAGES if p != first]
    res = _fresh(f"""
        import importlib, json, sys
        importlib.import_module({first!r})
        for name in {others!r}:
            importlib.import_module(name)
        import moerun, schedulers, eplb, traces
        cls = moerun.ConfigurableMoE
        # the whole stack is usable: build a layer and run one forward
        import torch
        cfg = moerun.MoEConfig(num_experts=2, top_k=1, hidden_size=4, intermediate_size=2)
        with cls(cfg, device="cpu") as layer:
            layer.load_weights(torch.randn(2, 4, 4), torch.randn(2, 4, 2))
            out = layer(torch.randn(3, 4), torch.randn(3, 2))
        print(json.dumps(dict(
            module=cls.__module__, shape=list(out.shape),
            scheduler=schedulers.ExternalCommScheduler.__module__,
            balancer=eplb.NullLayerBalancer.__module__, tracer=traces.Tracer.__module__)))
    """)
    assert res == dict(module="moerun.layer", shape=[3, 4],
                       scheduler="schedulers.external_comm", balancer="eplb.hooks",
                       tracer="traces.nvtx")


def test_moerun_import_is_lazy_and_every_public_name_resolves():
    # `import moerun` alone loads none of the heavy layers (DESIGN 12: lazy __getattr__) ...
    res = _fresh("""
        import json, sys
        import moerun
        loaded = sorted(m for m in sys.modules
                        if m.split('.')[0] in ('moerun', 'schedulers', 'eplb', 'traces'))
        # ... and `from moerun import *` / dir(moerun) never name a module that does not exist
        bad = {}
        for name in moerun.__all__:
            try:
                getattr(moerun, name)
            except Exception as exc:
                bad[name] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(dict(loaded=loaded, bad=bad)))
    """)
    assert res["loaded"] == ["moerun"]
    assert res["bad"] == {}, f"moerun.__all__ names that fail to resolve: {res['bad']}"


def test_traces_imports_nothing_from_above():
    res = _fresh("""
        import json, sys
        import traces
        from traces import Tracer, ScheduleRecorder
        t = Tracer(layer_idx=0, recorder=ScheduleRecorder())
        with t.chunk(0), t.phase("route"):  # emitting a range imports nothing from above either
            pass
        print(json.dumps(sorted(m for m in sys.modules
                                if m.split('.')[0] in ('moerun', 'schedulers', 'eplb'))))
    """)
    assert res == []


BOTTOM = ("moerun.errors", "moerun.env", "moerun.config", "moerun.mapping")
# DESIGN 12 levels above moerun.config / moerun.mapping (exact module or a submodule of it).
ABOVE_CONFIG = ("schedulers", "eplb", "moerun.cli", "moerun.hf", "moerun.launch", "moerun.layer",
                "moerun.functional", "moerun.resolve", "moerun.routing", "moerun.backends",
                "moerun.comm", "moerun.shared_expert", "moerun.testing")
# The very bottom (errors, env) may import only other bottom modules.
BOTTOM_LEVEL = ("moerun", "moerun.errors", "moerun.env", "moerun.streams")


def _under(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def test_bottom_modules_import_nothing_from_above():
    # Each module imported in turn; a module's "new" set is what its import added.
    res = _fresh(f"""
        import importlib, json, sys
        import torch  # not ours; keep it out of the per-module sets
        out = {{}}
        for name in {BOTTOM!r}:
            before = set(sys.modules)
            importlib.import_module(name)
            out[name] = sorted(m for m in set(sys.modules) - before
                               if m.split('.')[0] in ('moerun', 'schedulers', 'eplb', 'traces'))
        print(json.dumps(out))
    """)
    for name, new in res.items():
        above = [m for m in new if _under(m, ABOVE_CONFIG)]
        assert not above, f"{name} imports {above} (DESIGN 12: imports point down only)"
    for name in ("moerun.errors", "moerun.env"):
        above = [m for m in res[name] if m not in BOTTOM_LEVEL]
        assert not above, f"{name} imports {above} (DESIGN 12: bottom imports nothing above)"


def test_unknown_attribute_is_attribute_error():
    import moerun

    with pytest.raises(AttributeError, match="module 'moerun' has no attribute 'nope'"):
        moerun.nope  # noqa: B018
    assert not hasattr(moerun, "nope")


# ------------------------------------------------------------------ fused_experts


def _inputs(dtype=torch.float32, t=9, e=5, k=2, h=16, i=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(dtype)
    w13 = (torch.randn(e, 2 * i, h, generator=g) * h ** -0.5).to(dtype)
    w2 = (torch.randn(e, h, i, generator=g) * i ** -0.5).to(dtype)
    w = torch.rand(t, k, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32) \
        if t else torch.empty(0, k, dtype=torch.int32)
    return x, w13, w2, w, ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_experts_reference_equals_reference_moe(dtype):
    x, w13, w2, w, ids = _inputs(dtype)
    out = fused_experts(x, w13, w2, w, ids, backend="reference")
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out, reference_moe(x, w13, w2, w, ids))


def test_fused_experts_auto_and_instance():
    x, w13, w2, w, ids = _inputs()
    ref = reference_moe(x, w13, w2, w, ids)
    assert torch.equal(fused_experts(x, w13, w2, w, ids), ref)  # backend="auto" default
    assert torch.equal(fused_experts(x, w13, w2, w, ids, backend="auto"), ref)
    assert torch.equal(fused_experts(x, w13, w2, w, ids, backend=ReferenceExperts()), ref)
    # int64 ids and fp64 ref agree with the fp64 oracle
    out64 = fused_experts(x.double(), w13.double(), w2.double(), w, ids.long(),
                          backend="reference")
    torch.testing.assert_close(out64.float(), ref, rtol=1e-5, atol=1e-6)


def test_fused_experts_zero_tokens():
    x, w13, w2, w, ids = _inputs(t=0)
    out = fused_experts(x, w13, w2, w, ids, backend="auto")
    assert out.shape == (0, x.shape[1]) and out.dtype == x.dtype


# ------------------------------------------------------------------ no import cycles
def _import_graph() -> dict[str, set[str]]:
    """``{module: modules of ours it imports}`` from the source (module-level and function-
    level imports alike; ``if TYPE_CHECKING:`` blocks excluded). ``from pkg import name``
    counts as an edge to ``pkg.name`` when that is a module, else to ``pkg``."""
    import ast

    mods = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in mods:
                return ".".join(parts[:i])
        return None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        typing_only = set()
        for node in ast.walk(tree):
            test = getattr(node, "test", None)
            if isinstance(node, ast.If) and (getattr(test, "id", None) == "TYPE_CHECKING"
                                             or getattr(test, "attr", None) == "TYPE_CHECKING"):
                typing_only.update(id(sub) for sub in ast.walk(node))
        deps = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                deps.update(r for a in node.names if (r := resolve(a.name)))
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                base = resolve(node.module)
                for a in node.names if base else ():
                    sub = resolve(f"{node.module}.{a.name}")
                    deps.add(sub if sub and sub.startswith(node.module + ".") else base)
        deps.discard(mod)
        graph[mod] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_any_two_modules():
    graph = _import_graph()
    assert len(graph) > 60 and "eplb.migration" in graph["eplb.balancer"]
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    # the detector itself: a -> b -> c -> a, and d alone
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
