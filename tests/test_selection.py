"""Backend choice from the shipped bench table (resolve, DESIGN 6)."""

from __future__ import annotations

import dataclasses
import json

import torch

from moerun.backends.base import Deployment, Problem
from moerun.backends.selection import preferred_order, selection_table
from moerun.config import Activation
from moerun.env import probe_env
from moerun.resolve import resolve

H200 = dataclasses.replace(probe_env(), cuda_available=True, device_capability=(9, 0),
                           device_name="NVIDIA H200", num_gpus=1, triton_version="3.6.0",
                           triton_interpret=False, has_grouped_mm=True)
DEP = Deployment(rank=0, world_size=1, comm_backend="none", num_local_slots=128, divisible=True)


def _problem(e=128, k=8, h=2048, i=768, dtype=torch.bfloat16, device="cuda"):
    return Problem(num_experts=e, num_slots=e, top_k=k, hidden_size=h, intermediate_size=i,
                   dtype=dtype, activation=Activation.SILU_GLU, device_type=device)


def _bench(ratios):
    """A minimal ``moerun bench --out`` document: ratios[backend] = per-cell floor/time."""
    cells = []
    for t, i in enumerate(range(len(next(iter(ratios.values()))))):
        cells.append({"shape": "toy", "E": 4, "k": 2, "H": 64, "I": 32, "T": t,
                      "backends": {b: {"serving_floor_ratio": r[i], "ok": True}
                                   for b, r in ratios.items()}})
    return {"command": "moerun bench --shapes toy", "date": "2026-11-29 10:00 UTC",
            "device": "NVIDIA H200 (sm90), torch 2.11", "dtype": "bfloat16", "cells": cells}


def test_selection_table_orders_by_geomean(tmp_path):
    # geomean: a = sqrt(0.9*0.1) = 0.3, b = sqrt(0.4*0.4) = 0.4 -> b first despite a's best cell
    table = selection_table(_bench({"a": [0.9, 0.1], "b": [0.4, 0.4]}))
    row = table["rows"][0]
    assert row["order"] == ["b", "a"] and row["geomean"] == [0.4, 0.3]
    assert table["device_name"] == "NVIDIA H200"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    pref = preferred_order(_problem(4, 2, 64, 32), H200, path=path)
    assert pref.order == ("b", "a") and "geomean floor/time b 0.400, a 0.300" in pref.detail
    # no row for another shape, dtype, device type or device name
    assert preferred_order(_problem(), H200, path=path) is None
    assert preferred_order(_problem(4, 2, 64, 32, dtype=torch.float16), H200, path=path) is None
    assert preferred_order(_problem(4, 2, 64, 32, device="cpu"), H200, path=path) is None
    other = dataclasses.replace(H200, device_name="NVIDIA A100")
    assert preferred_order(_problem(4, 2, 64, 32), other, path=path) is None


def test_resolve_uses_the_shipped_table_for_benchmarked_shapes():
    report = resolve(_problem(), DEP, H200)
    assert report.backend == "triton"
    assert any("bench table" in n and "qwen3-30b-a3b" in n for n in report.notes)
    assert "note:" in str(report)
    # an unbenchmarked shape falls back to the default priority, and says so
    report = resolve(_problem(e=16, h=256, i=128), DEP, H200)
    assert report.backend == "triton"
    assert any("default priority" in n for n in report.notes)
    # an explicit name is not reordered
    assert resolve(_problem(), DEP, H200, backend="grouped_mm").backend == "grouped_mm"


def test_report_workspace_names_its_chunk_rows():
    # an unbounded chunk (max_num_tokens=None) used to be reported as a 1-row chunk
    cpu = _problem(e=4, k=2, h=64, i=32, dtype=torch.float32, device="cpu")
    dep = Deployment(rank=0, world_size=1, comm_backend="none", num_local_slots=4,
                     divisible=True)
    # gathered rows, gate/up and expert outputs per (t, j) pair in fp32, plus the fp32 sum
    per_row = 2 * (64 + 2 * 32 + 64) * 4 + 64 * 4
    bounded = resolve(cpu, dep, probe_env(), backend="reference", max_chunk_rows=4096)
    assert bounded.workspace_bytes_per_chunk == 4096 * per_row
    assert f"workspace per chunk: {4096 * per_row / 2**20:.2f} MiB (4096 rows)" in str(bounded)
    unbounded = resolve(cpu, dep, probe_env(), backend="reference")
    assert unbounded.workspace_bytes_per_chunk == per_row
    assert "MiB per row (max_num_tokens=None: a chunk is the whole forward" in str(unbounded)


def test_report_says_why_deepep_is_not_used():
    # DESIGN 5: the report names DeepEP and why (it was missing from the rejections)
    cpu = _problem(e=8, k=2, h=64, i=32, dtype=torch.float32, device="cpu")
    two = Deployment(rank=0, world_size=2, comm_backend="gloo", num_local_slots=4,
                     divisible=True)
    env = dataclasses.replace(probe_env(), deep_ep_version=None)
    text = str(resolve(cpu, two, env, backend="reference"))
    for mode in ("normal", "low_latency"):
        assert f"comm deepep-{mode}: package_missing (deep_ep is not importable." in text
    # importable: the first static limit that fails (a CPU layer), never "chosen"
    env = dataclasses.replace(probe_env(), deep_ep_version="1.2.1")
    report = resolve(cpu, two, env, backend="reference")
    assert {(r.name, r.reason.value) for r in report.rejected if "deepep" in r.name} == {
        ("deepep-normal", "device"), ("deepep-low_latency", "device")}
    one = resolve(cpu, DEP, env, backend="reference")  # one rank: nothing to say
    assert not any("deepep" in r.name for r in one.rejected)
