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
