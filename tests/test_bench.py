"""``moerun bench`` (expert-compute matrix) on CPU with the built-in ``tiny`` shape.

Order: pure pieces first (shape/token parsing, routing draw, floor formula by hand, peer
scaling by hand, progress text) -> whole runs through ``run(args)``: line format and JSON
fields, floor vs a hand computation from the JSON, peer scaling with a fake peer file (memory-
and compute-bound), markdown, ``--from-json`` round trip, backend registry skips and a failing
backend, usage errors. Ceilings are given (``--ceilings``) except in one run, so numbers are
checkable and the suite stays fast.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re

import pytest
import torch

from moerun.backends import Backend, Eligibility
from moerun.bench import add_arguments, run
from moerun.bench.analysis import geomean
from moerun.bench.ceilings import Ceilings, floor_for, parse_ceilings
from moerun.bench.matrix import BenchSettings, backend_names_for, draw_routing
from moerun.bench.peers import load_peers
from moerun.bench.registry import BENCH_BACKENDS, problem_for, select_backends
from moerun.bench.report import SECTION_BEGIN, SECTION_END, Progress, write_results_section
from moerun.bench.shapes import SHAPES, parse_shapes, parse_tokens
from moerun.env import get_env

TINY = SHAPES["tiny"]  # E=8, k=2, H=64, I=32
FAST = ["--shapes", "tiny", "--dtype", "float32", "--repeats", "3", "--warmup", "1",
        "--no-progress", "--calls-per-graph", "4"]
# Relative slack for numbers that went through JSON and float formatting.
REL = 1e-9


def _bench(argv: list[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    rc = run(parser.parse_args(argv), out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def _hand_floor_us(t: int, hit: float, elt: int, bw: float, flops: float) -> tuple[float, str]:
    h, i, k = 64, 32, 2
    compute = 2 * t * k * 3 * h * i / flops
    memory = (hit * 3 * h * i * elt + 2 * t * h * elt) / bw
    return max(compute, memory) * 1e6, ("memory" if memory >= compute else "compute")


def _fake_peers(tmp_path) -> str:
    """Rows for tiny T=1 and T=64; the T=16 row has other dims (must not match)."""
    rows = [
        {"shape": "tiny", "T": 1, "E": 8, "k": 2, "H": 64, "I": 32, "floor_us": 1.0,
         "grouped_mm_us": 300.0, "vllm_us": 200.0, "grouped_mm_graph_us": 50.0,
         "vllm_graph_us": 60.0},
        {"shape": "tiny", "T": 16, "E": 9, "k": 2, "H": 64, "I": 32, "grouped_mm_us": 1.0},
        {"shape": "tiny", "T": 64, "E": 8, "k": 2, "H": 64, "I": 32,
         "grouped_mm_us": 400.0, "vllm_us": 500.0},
    ]
    data = {"what": "fake", "date": "2026-01-01", "device": "fake GPU",
            "ceilings": {"copy_bw": 3e9, "read_bw": 4e9, "bf16_peak": 1e14}, "rows": rows}
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(data))
    return str(path)


# ------------------------------------------------------------------ pure pieces


def test_parse_shapes_and_tokens():
    assert [s.name for s in parse_shapes(None)] == [
        "mixtral8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3",
        "deepseek-v3-ep8-local", "qwen3-235b-ep8-local"]
    assert parse_shapes("tiny,deepseek-v3")[1].num_experts == 256
    with pytest.raises(ValueError, match="unknown shape 'nope'"):
        parse_shapes("tiny,nope")
    custom = parse_shapes("6:3:32:16")[0]
    assert (custom.name, custom.num_experts, custom.top_k, custom.hidden,
            custom.intermediate, custom.group) == ("E6k3H32I16", 6, 3, 32, 16, "custom")
    with pytest.raises(ValueError, match="top_k=7 > num_experts=6"):
        parse_shapes("6:7:32:16")
    assert parse_tokens(None) is None  # each shape's own list
    assert parse_tokens("3,5") == [3, 5]
    with pytest.raises(ValueError, match=">= 1"):
        parse_tokens("0")
    with pytest.raises(ValueError, match="comma-separated"):
        parse_tokens("a")
    with pytest.raises(ValueError, match="READ_BW,COPY_BW,FLOPS"):
        parse_ceilings("1,2")


def test_deepseek_weights_are_22_5_gb():
    assert SHAPES["deepseek-v3"].weight_bytes(2) == 256 * 3 * 7168 * 2048 * 2


def test_draw_routing_is_k_distinct_experts():
    g = torch.Generator().manual_seed(0)
    weights, ids = draw_routing(50, 8, 3, g, torch.device("cpu"))
    assert ids.dtype == torch.int32 and ids.shape == (50, 3)
    assert all(len(set(row)) == 3 for row in ids.tolist())
    assert int(ids.min()) >= 0 and int(ids.max()) < 8
    assert weights.dtype == torch.float32
    torch.testing.assert_close(weights.sum(dim=1), torch.ones(50))


def test_floor_formula_by_hand():
    # mixtral8x7b, T=1, 2 experts hit, the peer table's own ceilings (its floor: 171.05 µs
    # with bandwidth read_bw = 4.1196e12, the larger of read_bw and copy_bw/2 there).
    c = Ceilings(read_bw=4119635678375.486, copy_bw=0.0, flops=773850531538676.9)
    f = floor_for(SHAPES["mixtral8x7b"], 1, 2, 2, c)
    assert f.bound == "memory"
    assert math.isclose(f.us, 171.0489739903096, rel_tol=1e-9)
    # compute-bound: deepseek-v3 T=8192 (the table's 7459.37 µs)
    f = floor_for(SHAPES["deepseek-v3"], 8192, 256, 2, c)
    assert f.bound == "compute"
    assert math.isclose(f.us, 7459.36819911003, rel_tol=1e-9)
    assert f.flops == 2 * 8192 * 8 * 3 * 7168 * 2048


def test_peer_scaling_by_hand(tmp_path):
    peers = load_peers(_fake_peers(tmp_path))
    assert peers.peers == ("grouped_mm", "vllm")
    ours = Ceilings(read_bw=1e9, copy_bw=2e9, flops=1e12)
    dims = (8, 2, 64, 32)
    # memory-bound: table bandwidth max(4e9, 3e9) / ours max(1e9, 2e9) = 2
    best = peers.best(shape="tiny", tokens=1, dims=dims, mode="eager", bound="memory",
                      ceilings=ours)
    assert (best.name, best.raw_us, best.scale, best.scaled_us) == ("vllm", 200.0, 2.0, 400.0)
    best = peers.best(shape="tiny", tokens=1, dims=dims, mode="graph", bound="memory",
                      ceilings=ours)
    assert (best.name, best.scaled_us) == ("grouped_mm", 100.0)
    # compute-bound: 1e14 / 1e12 = 100
    best = peers.best(shape="tiny", tokens=64, dims=dims, mode="eager", bound="compute",
                      ceilings=ours)
    assert (best.name, best.scaled_us) == ("grouped_mm", 40000.0)
    assert peers.best(shape="tiny", tokens=64, dims=dims, mode="graph", bound="compute",
                      ceilings=ours) is None  # no graph column at that T
    assert peers.best(shape="tiny", tokens=16, dims=dims, mode="eager", bound="memory",
                      ceilings=ours) is None  # dims differ


def test_geomean():
    assert geomean([]) is None
    assert math.isclose(geomean([1.0, 4.0]), 2.0)


def test_progress_plain_text():
    buf = io.StringIO()
    p = Progress(4, stream=buf, width=8)
    p("a")
    p("b")
    assert buf.getvalue().splitlines() == ["[##......] 1/4 a", "[####....] 2/4 b"]


def test_default_backends_keep_reference_to_small_t():
    s = BenchSettings(device=torch.device("cpu"), dtype=torch.float32)
    assert backend_names_for(s, 16) == ["reference", "grouped_mm", "triton"]
    assert backend_names_for(s, 17) == ["grouped_mm", "triton"]
    s = BenchSettings(device=torch.device("cpu"), dtype=torch.float32,
                      backends=("reference",))
    assert backend_names_for(s, 8192) == ["reference"]


def test_registry_skips_with_reasons(monkeypatch):
    monkeypatch.setitem(BENCH_BACKENDS, "triton", ("moerun.backends._absent_for_test",
                                                   "TritonExperts"))
    problem = problem_for(8, 2, 64, 32, torch.float64, "cpu")
    selection = select_backends(["reference", "grouped_mm", "triton"], problem, get_env())
    chosen, skipped = selection.chosen, selection.skipped
    assert [b.name for b in chosen] == ["reference"]
    assert chosen[0].graph_skip  # the oracle is known not to be capturable
    assert skipped["grouped_mm"].startswith("can_implement: dtype:")
    assert "unavailable: ModuleNotFoundError" in skipped["triton"]


def test_results_section_keeps_the_rest_of_the_file(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# results\n\n## NVTX range overhead\n\n| a | b |\n")
    write_results_section(str(path), "## Expert-compute benchmark\n\nfirst\n")
    write_results_section(str(path), "## Expert-compute benchmark\n\nsecond\n")
    text = path.read_text()
    assert text.startswith("# results\n\n## NVTX range overhead\n\n| a | b |\n")
    assert "second" in text and "first" not in text
    assert text.count(SECTION_BEGIN) == 1 and text.count(SECTION_END) == 1
    new = tmp_path / "new.md"
    write_results_section(str(new), "x")
    assert new.read_text().startswith("# moerun benchmark results\n")


# ------------------------------------------------------------------ whole runs

_LINE = re.compile(
    r"^cell shape=tiny T=(\d+) hit=[\d.]+ bound=(memory|compute) floor_us=[\d.]+"
    r"( \| (reference|grouped_mm) eager_us=[\d.]+ eager_eff=[\d.]+ graph_us=- graph_eff=- "
    r"vs_peer=(-|[\d.]+) vs_peer_eager=(-|[\d.]+) err=\S+ ok config=\"-\"){2}$")


@pytest.mark.parametrize("ceilings,bound,scale", [
    ("1e9,2e9,1e15", "memory", 4e9 / 2e9),  # table BW 4e9 over ours 2e9
    ("1e15,1e15,1e9", "compute", 1e14 / 1e9),  # table FLOP/s over ours
])
def test_run_lines_json_floor_and_peer_scaling(tmp_path, ceilings, bound, scale):
    out_json = tmp_path / "r.json"
    rc, out, err = _bench(FAST + ["--tokens", "1,16,64", "--backends", "reference,grouped_mm",
                                  "--ceilings", ceilings, "--peers", _fake_peers(tmp_path),
                                  "--out", str(out_json)])
    assert rc == 0, err
    cell_lines = [ln for ln in out.splitlines() if ln.startswith("cell ")]
    assert len(cell_lines) == 3
    for line in cell_lines:
        assert _LINE.match(line), line
    assert [ln.split()[1:3] for ln in out.splitlines() if ln.startswith("summary ")] == \
        [["backend=reference", "group=tiny"], ["backend=grouped_mm", "group=tiny"]]

    data = json.loads(out_json.read_text())
    for key in ("schema", "command", "date", "device", "dtype", "timer", "settings", "ceilings",
                "peers", "cells", "summary"):
        assert key in data
    assert data["command"].startswith("moerun bench --shapes tiny --tokens 1,16,64")
    read_bw, copy_bw, flops = (float(v) for v in ceilings.split(","))
    assert data["ceilings"]["bandwidth"] == max(read_bw, copy_bw)
    assert [c["T"] for c in data["cells"]] == [1, 16, 64]
    for cell in data["cells"]:
        hits = cell["experts_hit"]
        assert len(hits) == 4 and all(1 <= h <= 8 for h in hits)
        floor_us, hand_bound = _hand_floor_us(cell["T"], sum(hits) / len(hits), 4,
                                              max(read_bw, copy_bw), flops)
        assert math.isclose(cell["floor_us"], floor_us, rel_tol=REL)
        assert cell["bound"] == hand_bound == bound
        for name in ("reference", "grouped_mm"):
            b = cell["backends"][name]
            assert b["ok"] and b["err"] < 1e-5 and b["err_bound"] == 1e-5
            assert b["graph_us"] is None and b["serving_mode"] == "eager"
            assert math.isclose(b["eager_floor_ratio"], floor_us / b["eager_us"], rel_tol=REL)
        gm = cell["backends"]["grouped_mm"]
        if cell["T"] == 16:  # the peer row's dims differ
            assert gm["peer"] is None and gm["vs_peer"] is None
            continue
        best_raw = {1: 200.0, 64: 400.0}[cell["T"]]  # fastest eager peer in the fake file
        assert gm["peer_eager"]["raw_us"] == best_raw
        assert math.isclose(gm["peer_eager"]["scaled_us"], best_raw * scale, rel_tol=REL)
        assert math.isclose(gm["vs_peer_eager"], best_raw * scale / gm["eager_us"],
                            rel_tol=REL)
        assert math.isclose(gm["vs_peer"], gm["vs_peer_eager"], rel_tol=REL)  # eager on CPU
    summary = next(s for s in data["summary"] if s["backend"] == "grouped_mm")
    assert summary["group"] == "tiny" and summary["cells"] == 3
    effs = [c["backends"]["grouped_mm"]["serving_floor_ratio"] for c in data["cells"]]
    assert math.isclose(summary["geomean_floor_ratio"], geomean(effs), rel_tol=REL)
    assert math.isclose(summary["worst_floor_ratio"], min(effs), rel_tol=REL)
    assert summary["peer_cells"] == 2 and summary["failures"] == 0


def test_measured_ceilings_markdown_and_from_json(tmp_path):
    out_json, md = tmp_path / "r.json", tmp_path / "bench" / "RESULTS.md"
    rc, out, err = _bench(FAST + ["--tokens", "2,9", "--backends", "grouped_mm",
                                  "--ceiling-bytes", str(8 * 2 ** 20), "--matmul-size", "128",
                                  "--peers", "none", "--out", str(out_json),
                                  "--write-results", str(md)])
    assert rc == 0, err
    data = json.loads(out_json.read_text())
    c = data["ceilings"]
    assert c["read_bytes"] == 8 * 2 ** 20 and c["matmul_size"] == 128
    assert c["read_bw"] > 0 and c["copy_bw"] > 0 and c["flops"] > 0
    assert data["peers"] is None
    text = md.read_text()
    for needle in ("Command: `moerun bench --shapes tiny", "Date: ", "Device: cpu",
                   "Ceilings (this run): read ", "geomean floor/time", "worst cell",
                   "| tiny | 2 |", "| tiny | 9 |"):
        assert needle in text, needle

    # Re-analysis of the saved run, now against a peer file, without re-running.
    rc, out2, err2 = _bench(["--from-json", str(out_json), "--peers", _fake_peers(tmp_path),
                             "--out", str(tmp_path / "again.json")])
    assert rc == 0, err2
    assert sum(ln.startswith("cell shape=tiny") for ln in out2.splitlines()) == 2
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["peers"]["date"] == "2026-01-01"
    assert [c["floor_us"] for c in again["cells"]] == [c["floor_us"] for c in data["cells"]]


class _WrongExperts(Backend):
    """A backend that computes the wrong thing (for the failure path)."""

    name = "wrong"

    @classmethod
    def can_implement(cls, problem, deployment, env):
        return Eligibility.yes()

    def run_experts(self, x, w13, w2, topk_weights, topk_ids):
        return torch.ones_like(x)


def test_missing_and_failing_backends(monkeypatch, tmp_path):
    monkeypatch.setitem(BENCH_BACKENDS, "triton", ("moerun.backends._absent_for_test",
                                                   "TritonExperts"))
    monkeypatch.setitem(BENCH_BACKENDS, "wrong", ("tests.test_bench", "_WrongExperts"))
    rc, out, err = _bench(FAST + ["--tokens", "3", "--backends", "grouped_mm,triton,wrong",
                                  "--ceilings", "1e9,1e9,1e12", "--peers", "none"])
    assert rc == 1
    line = next(ln for ln in out.splitlines() if ln.startswith("cell "))
    assert "| grouped_mm eager_us=" in line and line.endswith("| triton skipped")
    assert re.search(r"\| wrong eager_us=[\d.]+ .* err=\S+ FAIL", line)
    assert "skip tiny T=3 triton: moerun.backends._absent_for_test.TritonExperts unavailable" \
        in out
    assert "FAILED correctness: tiny T=3 wrong" in err


def test_missing_peer_file_is_skipped(tmp_path):
    rc, out, err = _bench(FAST + ["--tokens", "1", "--backends", "grouped_mm", "--ceilings",
                                  "1e9,1e9,1e12", "--peers", str(tmp_path / "nope.json")])
    assert rc == 0
    assert "missing; comparison skipped" in err and "peers:" not in out


@pytest.mark.parametrize("argv,message", [
    (["--shapes", "huge"], "unknown shape 'huge'"),
    (["--backends", "cutlass"], "unknown ['cutlass']"),
    (["--tokens", "0"], "must be >= 1"),
    (["--repeats", "0"], "--repeats=0: must be >= 1"),
    (["--ceilings", "1,2,x"], "READ_BW,COPY_BW,FLOPS"),
])
def test_usage_errors(argv, message):
    rc, out, err = _bench(["--shapes", "tiny", "--no-progress"] + argv)
    assert rc == 2 and message in err


# ------------------------------------------------------------------ issue 11: one stack


def test_floor_uses_max_of_read_and_copy_counted_read_plus_write():
    # deepseek-v3-ep8-local T=256, 32 experts hit, bf16, by hand:
    #   FLOP  = 2*256*4*3*7168*2048            = 90,194,313,216   -> / 8e14 = 112.743 µs
    #   bytes = 32*3*7168*2048*2 + 2*256*7168*2 = 2,825,912,320    -> / BW
    shape = SHAPES["deepseek-v3-ep8-local"]
    c = Ceilings(read_bw=4.0e12, copy_bw=4.2e12, flops=8e14)  # BW = copy (r+w) = 4.2e12
    f = floor_for(shape, 256, 32, 2, c)
    assert (f.flops, f.bytes) == (90_194_313_216, 2_825_912_320)
    assert math.isclose(f.memory_us, 672.8362666666667, rel_tol=1e-12)
    assert math.isclose(f.compute_us, 112.74289152, rel_tol=1e-12)
    assert f.bound == "memory" and f.us == f.memory_us
    # the read rate wins when it is the larger; copy is never halved (copy/2 = 3e12 < read
    # would give 4e12 here, r+w gives 6e12)
    assert Ceilings(read_bw=4e12, copy_bw=3e12, flops=1).bandwidth == 4e12
    assert Ceilings(read_bw=4e12, copy_bw=6e12, flops=1).bandwidth == 6e12
    # T=32768: 11,544,872,091,648 FLOP / 8e14 = 14431.09 µs > 894.78 µs of bytes
    f = floor_for(shape, 32768, 32, 2, c)
    assert f.bound == "compute" and math.isclose(f.us, 14431.09011456, rel_tol=1e-12)


def test_ep_local_cells_are_registered_as_the_peer_file_names_them():
    from moerun.bench.matrix import plan_cells

    ds, qw = SHAPES["deepseek-v3-ep8-local"], SHAPES["qwen3-235b-ep8-local"]
    assert (ds.num_experts, ds.top_k, ds.hidden, ds.intermediate) == (32, 4, 7168, 2048)
    assert (qw.num_experts, qw.top_k, qw.hidden, qw.intermediate) == (16, 4, 4096, 1536)
    for s in (ds, qw):
        assert s.tokens == (256, 2048, 8192, 32768) and s.eager_only and s.group == "ep-local"
    cells = plan_cells(parse_shapes(None), None)
    assert sum(s.group == "model" for s, _ in cells) == 20
    assert [(s.name, t) for s, t in cells if s.group == "ep-local"] == [
        (n, t) for n in ("deepseek-v3-ep8-local", "qwen3-235b-ep8-local")
        for t in (256, 2048, 8192, 32768)]
    assert plan_cells([TINY], [3, 5]) == [(TINY, 3), (TINY, 5)]


@pytest.mark.parametrize("name", ["deepseek-v3-ep8-local", "qwen3-235b-ep8-local"])
def test_ep_local_routing_is_uniform_over_the_local_experts(name):
    shape = SHAPES[name]
    g = torch.Generator().manual_seed(11)
    weights, ids = draw_routing(8192, shape.num_experts, shape.top_k, g, torch.device("cpu"))
    assert ids.shape == (8192, 4) and ids.dtype == torch.int32
    assert int(ids.min()) >= 0 and int(ids.max()) < shape.num_experts
    assert bool((ids.sort(dim=1).values.diff(dim=1) > 0).all())  # k distinct ids per token
    counts = torch.bincount(ids.flatten().long(), minlength=shape.num_experts)
    mean = 8192 * 4 / shape.num_experts  # 1024 (32 experts) / 2048 (16 experts)
    assert counts.numel() == shape.num_experts
    assert float((counts - mean).abs().max()) < 0.1 * mean  # > 3 sigma of a uniform draw
    torch.testing.assert_close(weights.sum(dim=1), torch.ones(8192))


def test_make_case_drops_ids_to_minus_one():
    from moerun.bench.inputs import make_case

    c = make_case(TINY, 4000, torch.float32, "cpu", seed=1, drop=0.25)
    dropped = float((c.topk_ids == -1).float().mean())
    assert 0.22 < dropped < 0.28 and c.x.shape == (4000, 64)
    kept = c.topk_ids[c.topk_ids >= 0]
    assert int(kept.max()) < 8
    with pytest.raises(ValueError, match="drop=1.0"):
        make_case(TINY, 4, torch.float32, "cpu", drop=1.0)


def test_peer_file_discovery(tmp_path, monkeypatch):
    from moerun.bench.peers import describe_search, find_peer_file, project_root

    from pathlib import Path
    # this checkout: the folder of pyproject.toml above the package
    assert project_root() == Path(__file__).resolve().parents[1]
    proj = tmp_path / "proj"
    (proj / "pkg" / "sub").mkdir(parents=True)
    (proj / "pyproject.toml").write_text("[project]\n")
    assert project_root(proj / "pkg" / "sub" / "mod.py") == proj
    assert project_root(tmp_path) is None
    peers = tmp_path / "shared" / "peers"
    peers.mkdir(parents=True)
    assert find_peer_file(peers) is None
    assert describe_search(peers) == f"no h200-*.json in {peers}"
    for name in ("h200-2026-11-29.json", "h200-2026-12-01.json", "fp8-h200-2026-12-09.json",
                 "h200-notes.txt"):
        (peers / name).write_text("{}")
    assert find_peer_file(peers) == str(peers / "h200-2026-12-01.json")  # fp8-* never
    # the default search: <root>/../shared/peers first, then <root>/shared/peers
    from moerun.bench.peers import default_peer_dirs

    inner = proj / "shared" / "peers"
    assert default_peer_dirs(proj) == (peers, inner)
    inner.mkdir(parents=True)
    (inner / "h200-2027-01-01.json").write_text("{}")
    assert find_peer_file(inner) == str(inner / "h200-2027-01-01.json")
    import moerun.bench.peers as peers_mod

    monkeypatch.setattr(peers_mod, "project_root", lambda start=None: proj)
    assert find_peer_file() == str(peers / "h200-2026-12-01.json")  # ../shared first
    for f in peers.glob("h200-*.json"):
        f.unlink()
    assert find_peer_file() == str(inner / "h200-2027-01-01.json")  # then ./shared


def test_no_peer_file_found_says_where_and_drops_the_peer_column(tmp_path, monkeypatch):
    import moerun.bench.peers as peers_mod

    (tmp_path / "proj").mkdir()
    monkeypatch.setattr(peers_mod, "project_root", lambda start=None: tmp_path / "proj")
    rc, out, err = _bench(FAST + ["--tokens", "2", "--backends", "grouped_mm",
                                  "--ceilings", "1e9,1e9,1e12"])
    assert rc == 0
    assert (f"peers: no peer file found (no h200-*.json in {tmp_path / 'shared' / 'peers'} or "
            f"{tmp_path / 'proj' / 'shared' / 'peers'}); pass --peers PATH; comparison skipped "
            "(no peer column)") in err
    header = next(ln for ln in out.splitlines() if ln.startswith("shape "))
    assert "peer" not in header and "config" in header and "floor/t" in header


def test_peers_override_wins_over_discovery(tmp_path, monkeypatch):
    import moerun.bench.peers as peers_mod

    monkeypatch.setattr(peers_mod, "find_peer_file", lambda folder=None: "/nonexistent.json")
    rc, out, err = _bench(FAST + ["--tokens", "1", "--backends", "grouped_mm", "--ceilings",
                                  "1e9,2e9,1e15", "--peers", _fake_peers(tmp_path)])
    assert rc == 0 and "nonexistent" not in out + err
    assert f"peers: {tmp_path / 'peers.json'} (2026-01-01, fake GPU" in out


def _cell(shape, tokens, group, eager_only, results, floor_us=100.0):
    from moerun.bench.ceilings import Floor
    from moerun.bench.matrix import CellResult

    return CellResult(shape=shape.name, num_experts=shape.num_experts, top_k=shape.top_k,
                      hidden=shape.hidden, intermediate=shape.intermediate, tokens=tokens,
                      experts_hit=(shape.num_experts,),
                      floor=Floor(flops=1.0, bytes=1.0, compute_us=1.0, memory_us=floor_us),
                      results=tuple(results), group=group, eager_only=eager_only)


def test_graph_cells_meet_graph_peers_ep_local_cells_eager_peers(tmp_path):
    from moerun.bench.analysis import analyze_cell, summarize
    from moerun.bench.matrix import BackendResult

    ds, qw = SHAPES["deepseek-v3"], SHAPES["deepseek-v3-ep8-local"]
    rows = [{"shape": ds.name, "T": 16, "E": 256, "k": 8, "H": 7168, "I": 2048,
             "vllm_us": 3000.0, "vllm_graph_us": 2000.0, "grouped_mm_graph_us": 2500.0},
            {"shape": qw.name, "T": 256, "E": 32, "k": 4, "H": 7168, "I": 2048,
             "grouped_mm_us": 1200.0, "vllm_us": 1500.0}]
    path = tmp_path / "h200-x.json"
    path.write_text(json.dumps({"ceilings": {"read_bw": 4e12, "copy_bw": 4e12,
                                             "bf16_peak": 8e14}, "rows": rows}))
    peers = load_peers(str(path))
    ours = Ceilings(read_bw=2e12, copy_bw=2e12, flops=8e14)  # memory scale 4e12/2e12 = 2
    model = _cell(ds, 16, "model", False, [BackendResult(
        name="triton", eager_us=2500.0, graph_us=2000.0, err=0.0, err_bound=1e-2,
        config="tuned (S256.json)")])
    local = _cell(qw, 256, "ep-local", True, [BackendResult(
        name="triton", eager_us=1000.0, err=0.0, err_bound=1e-2, config="heuristic")])
    (vm,), (vl,) = (analyze_cell(c, ours, peers, 1024) for c in (model, local))
    assert (vm.serving_mode, vm.peer.name, vm.peer.raw_us, vm.peer.scaled_us) == \
        ("graph", "vllm", 2000.0, 4000.0)
    assert vm.vs_peer == 4000.0 / 2000.0 and vm.serving_eff == 100.0 / 2000.0
    assert (vl.serving_mode, vl.peer.name, vl.peer.scaled_us) == ("eager", "grouped_mm", 2400.0)
    assert vl.vs_peer == 2400.0 / 1000.0
    cells = [model, local, _cell(qw, 2048, "ep-local", True, [BackendResult(
        name="triton", eager_us=400.0, err=0.0, err_bound=1e-2, config="heuristic")])]
    views = [analyze_cell(c, ours, peers, 1024) for c in cells]
    sm = {s.group: s for s in summarize(cells, views)}
    assert list(sm) == ["model", "ep-local"]
    assert sm["model"].cells == 1 and sm["model"].heuristic_cells == 0
    loc = sm["ep-local"]
    assert loc.cells == 2 and loc.heuristic_cells == 2 and loc.peer_cells == 1
    assert math.isclose(loc.geomean_eff, math.sqrt((100 / 1000) * (100 / 400)))
    assert loc.worst == "deepseek-v3-ep8-local T=256 (eager)"


class _TunedExperts(Backend):
    """The reference math, reporting a config source (for the output columns)."""

    name = "tuned_fake"

    @classmethod
    def can_implement(cls, problem, deployment, env):
        return Eligibility.yes()

    def run_experts(self, x, w13, w2, topk_weights, topk_ids):
        from moerun.backends.reference import reference_moe

        return reference_moe(x, w13, w2, topk_weights, topk_ids)

    def kernel_config(self, *, num_slots, hidden, intermediate, num_tokens, top_k, dtype):
        return "tuned (S8_fake.json)" if num_tokens <= 4 else "heuristic"


def test_bench_output_has_the_full_table(monkeypatch, tmp_path):
    monkeypatch.setitem(BENCH_BACKENDS, "tuned_fake", ("tests.test_bench", "_TunedExperts"))
    out_json = tmp_path / "r.json"
    rc, out, err = _bench(FAST + ["--tokens", "1,16", "--backends", "grouped_mm,tuned_fake",
                                  "--ceilings", "1e9,2e9,1e15", "--peers",
                                  _fake_peers(tmp_path), "--out", str(out_json)])
    assert rc == 0, err
    lines = out.splitlines()
    cell1 = next(ln for ln in lines if ln.startswith("cell shape=tiny T=1 "))
    assert 'tuned_fake eager_us=' in cell1 and cell1.endswith('ok config="tuned (S8_fake.json)"')
    header = next(ln for ln in lines if ln.startswith("shape "))
    assert header.split() == ["shape", "T", "group", "backend", "mode", "µs", "floor", "µs",
                              "floor/t", "best", "peer", "µs", "(scaled)", "peer/ours",
                              "config", "rel", "err"]
    start = lines.index(header) + 1
    rows = [ln.split() for ln in lines[start:lines.index("", start)]]
    assert [(r[1], r[3]) for r in rows] == [("1", "grouped_mm"), ("1", "tuned_fake"),
                                            ("16", "grouped_mm"), ("16", "tuned_fake")]
    assert "tuned (S8_fake.json)" in " ".join(rows[1]) and "heuristic" in rows[3]
    # T=1 best eager peer: vllm 200 µs x (table BW max(4e9, 3e9) / ours max(1e9, 2e9)) = 400
    assert "400.0 (vllm)" in " ".join(rows[0])
    assert any(ln.startswith("== geomeans per cell group") for ln in lines)
    summary = [ln for ln in lines if ln.startswith("summary backend=tuned_fake")]
    assert len(summary) == 1 and "group=tiny cells=2" in summary[0]
    assert summary[0].endswith("heuristic_cells=1")
    data = json.loads(out_json.read_text())
    assert [c["backends"]["tuned_fake"]["config"] for c in data["cells"]] == [
        "tuned (S8_fake.json)", "heuristic"]
    assert data["cells"][0]["group"] == "tiny" and data["cells"][0]["eager_only"] is False


# ------------------------------------------------------------------ --dtype fp8
def test_fp8_bench_floor_json_and_errors_by_hand(tmp_path):
    """``--dtype fp8`` on a CPU (the reference backend): every cell's fp8 floor equals the
    hand formula (weights 1 byte/element + fp32 scales per 128x128 block + 4*T*H activation
    bytes, over BW; flops over the given rate), errors against DESIGN 11a's reference are
    within 3e-2, and a shape whose H is not a multiple of 128 is a usage error."""
    bw, flops = 2e10, 1e11  # read, copy, flops
    path = tmp_path / "f8.json"
    rc, out, err = _bench(["--dtype", "fp8", "--shapes", "8:2:128:256", "--tokens", "1,9",
                           "--ceilings", f"{bw},{bw / 2},{flops}", "--repeats", "2",
                           "--warmup", "0", "--calls-per-graph", "3", "--out", str(path)])
    assert rc == 0, err
    data = json.loads(path.read_text())
    assert [c["tokens"] for c in data["cells"]] == [1, 9]
    for c in data["cells"]:
        t, hit, h, i, k = c["tokens"], c["experts_hit"], 128, 256, 2
        assert 1 <= hit <= min(8, t * k)
        nbytes = hit * 3 * h * i + hit * 3 * h * i / 128 ** 2 * 4 + 4 * t * h
        want = max(2 * t * k * 3 * h * i / flops, nbytes / bw) * 1e6
        assert abs(c["floor_fp8_us"] - want) <= 1e-9 * want, (c, want)
        assert c["err"] <= 3e-2 and c["fp8_us"] > 0 and c["method"] == "eager"
    assert "geomean fp8 floor/time over 2 cells" in out
    assert "every cell within 3e-2 of the DESIGN 11a reference" in out
    rc, _, err = _bench(["--dtype", "fp8", "--shapes", "tiny"])
    assert rc == 2 and "multiples of 128" in err


def test_layer_bench_reports_what_the_checks_add_beyond_their_sync(tmp_path):
    """``moerun bench --layer`` on the CPU smoke layer: three rounds of every host figure,
    the NaN scan's own cost, and the check extra = host+chk - host - scan of the round with
    the lowest host figure, in the line and the JSON."""
    from moerun.bench.layer_command import run_layer_bench

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out_json = tmp_path / "layer.json"
    args = parser.parse_args(FAST + ["--tokens", "1,5", "--ceilings", "1e9,1e9,1e12",
                                     "--out", str(out_json)])
    out, err = io.StringIO(), io.StringIO()
    assert run_layer_bench(args, out=out, err=err) == 0, err.getvalue()
    data = json.loads(out_json.read_text())
    assert [c["tokens"] for c in data["cells"]] == [1, 5]
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("tiny")]
    assert len(lines) == 2
    for cell, line in zip(data["cells"], lines, strict=True):
        for fig in ("host", "host_checked", "scan"):
            rounds = cell[f"{fig}_rounds_us"]
            assert len(rounds) == 3 and all(v > 0 for v in rounds)
            assert cell[f"{fig}_us"] == min(rounds)
        r = cell["host_rounds_us"].index(min(cell["host_rounds_us"]))  # the fastest round
        extra = (cell["host_checked_rounds_us"][r] - cell["host_rounds_us"][r]
                 - cell["scan_rounds_us"][r])
        printed = float(re.search(r"chk-extra +(-?[\d.]+)", line).group(1))
        assert abs(printed - extra) < 0.06, (line, extra)
        assert f"scan {cell['scan_us']:9.1f}" in line


def test_interleaved_host_samples_order_setup_and_timing():
    """Sample i of every call before sample i + 1 of any, setups untimed: a 20 ms setup
    does not show in the samples of a call that costs nothing, and a 5 ms call shows."""
    import time as _time

    from moerun.bench.timing import HostCall, interleaved_host_samples

    log = []

    def slow_setup():
        log.append("setup")
        _time.sleep(0.02)

    calls = [HostCall(fn=lambda i: log.append(("a", i)), setup=slow_setup),
             HostCall(fn=lambda i: (log.append(("b", i)), _time.sleep(0.005)))]
    a, b = interleaved_host_samples(calls, torch.device("cpu"), 2, warmup=1)
    assert log == ["setup", ("a", 0), ("b", 0), "setup", ("a", 1), ("b", 1),
                   "setup", ("a", 2), ("b", 2)]
    assert len(a) == len(b) == 2
    assert max(a) < 0.004 and min(b) >= 0.005


def test_layer_bench_host_core_runs_each_round_on_one_core(tmp_path):
    """``--host-core fastest`` runs each round of host figures on one allowed core (the
    survey's fastest) and gives the thread its cores and torch its threads back; the cores
    and loop speeds go into the JSON; a bad value is a usage error."""
    import os

    from moerun.bench import host_core
    from moerun.bench.layer_command import run_layer_bench

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.add_argument("--host-core", default="none")
    out_json = tmp_path / "layer.json"
    allowed, threads = os.sched_getaffinity(0), torch.get_num_threads()
    args = parser.parse_args(FAST + ["--tokens", "1", "--ceilings", "1e9,1e9,1e12",
                                     "--host-core", "fastest", "--out", str(out_json)])
    out, err = io.StringIO(), io.StringIO()
    assert run_layer_bench(args, out=out, err=err) == 0, err.getvalue()
    assert os.sched_getaffinity(0) == allowed and torch.get_num_threads() == threads
    data = json.loads(out_json.read_text())
    cell = data["cells"][0]
    assert len(cell["host_round_cores"]) == 3 and set(cell["host_round_cores"]) <= allowed
    assert all(v > 0 for v in cell["host_round_loop_us"])
    assert "--host-core fastest" in data["command"] and data["host_core"] == "fastest"
    core = min(allowed)
    with host_core.placed(core) as where:  # a given core: the block runs there, on 1 thread
        assert os.sched_getaffinity(0) == {core} and torch.get_num_threads() == 1
        assert where.core == core and where.loop_us > 0
    assert os.sched_getaffinity(0) == allowed and torch.get_num_threads() == threads
    found = host_core.survey(repeats=1)
    assert set(found.speeds) == allowed
    assert found.speeds[found.fastest] == min(found.speeds.values())
    for bad, message in (("fast", "expected none, fastest or a core number"),
                         ("-1", "a core number is >= 0"),
                         ("4096", "not one of this process's cores")):
        args = parser.parse_args(FAST + ["--tokens", "1", "--ceilings", "1e9,1e9,1e12",
                                         "--host-core", bad])
        err = io.StringIO()
        assert run_layer_bench(args, out=io.StringIO(), err=err) == 2
        assert f"--host-core {bad}" in err.getvalue() and message in err.getvalue()
    assert os.sched_getaffinity(0) == allowed


def test_fp8_bench_times_the_call_the_layer_makes():
    """``layer_fp8_call`` makes the call ``schedulers/one_rank.py`` makes: a one-rank shape
    hands a backend that fuses the activation quantization the activation-dtype rows (no
    ``quantize_rows`` launch), an EP-local shape and a backend that does not fuse get
    ``quantize_rows`` first; the numbers are the same either way (against DESIGN 11a's
    reference, on the CPU reference backend)."""
    from moerun.backends.reference import ReferenceExperts
    from moerun.bench.fp8 import layer_fp8_call
    from moerun.bench.shapes import BenchShape
    from moerun.quant import ExpertQuant, QuantConfig, QuantizedRows, quantize_weight_blocks
    from moerun.quant import reference_fp8_moe

    class Recording(ReferenceExperts):
        def __init__(self):
            super().__init__()
            self.seen = []

        def quantize_rows(self, x, config):
            self.seen.append("quantize_rows")
            return super().quantize_rows(x, config)

        def run_experts(self, x, *a, **kw):
            self.seen.append(type(x).__name__)
            if not isinstance(x, QuantizedRows):  # what a fusing backend does inside
                x = super().quantize_rows(x, kw["quant"].config)
            return super().run_experts(x, *a, **kw)

    class Fusing(Recording):
        fuses_activation_quant = True

    g = torch.Generator().manual_seed(0)
    e, k, h, i, t = 4, 2, 128, 256, 5
    qc = QuantConfig()
    w13, s13 = quantize_weight_blocks(torch.randn(e, 2 * i, h, generator=g) * h ** -0.5)
    w2, s2 = quantize_weight_blocks(torch.randn(e, h, i, generator=g) * i ** -0.5)
    eq = ExpertQuant(config=qc, w13_scale=s13, w2_scale=s2, out_dtype=torch.float32)
    x = torch.randn(t, h, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    w = torch.rand(t, k, generator=g)
    ref = reference_fp8_moe(x, w13, s13, w2, s2, w, ids, qc, out_dtype=torch.float32)
    model = BenchShape(name="m", num_experts=e, top_k=k, hidden=h, intermediate=i)
    ep = BenchShape(name="m", num_experts=e, top_k=k, hidden=h, intermediate=i,
                    eager_only=True, group="ep-local")
    for backend, shape, calls in ((Fusing(), model, ["Tensor"]),
                                  (Fusing(), ep, ["quantize_rows", "QuantizedRows"]),
                                  (Recording(), model, ["quantize_rows",
                                                             "QuantizedRows"])):
        out = layer_fp8_call(backend, shape, x, w13, w2, w, ids, eq)
        assert backend.seen == calls, (shape.group, calls)
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-6)
