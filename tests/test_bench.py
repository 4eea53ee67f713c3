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
    chosen, skipped = select_backends(["reference", "grouped_mm", "triton"], problem, get_env())
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
