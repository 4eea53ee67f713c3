"""``moerun run`` end to end, as a user runs it (subprocess), including the issue's
acceptance commands for multi-rank execution."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moerun.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def _errors(stdout: str) -> list[float]:
    return [float(v) for v in re.findall(r"relative error: ([0-9.e+-]+)", stdout)]


def test_run_default_single_rank():
    proc = _run("run")
    assert proc.returncode == 0, proc.stderr
    assert "moerun resolution report" in proc.stdout
    errs = _errors(proc.stdout)
    assert len(errs) == 1 and errs[0] < 1e-5
    assert re.search(r"^\s+experts\s+[0-9.]+$", proc.stdout, re.M)
    assert re.search(r"^\s+route\s+[0-9.]+$", proc.stdout, re.M)


@pytest.mark.parametrize("args,ranks", [
    (("--ranks", "3", "--tokens", "0,7,33", "--comm", "allgather"), 3),
    (("--ranks", "3", "--tokens", "0,7,33", "--comm", "alltoall"), 3),
    (("--ranks", "4", "--tokens", "0,0,0,9", "--comm", "alltoall", "--max-num-tokens", "4"), 4),
])
def test_run_multirank_acceptance(args, ranks):
    proc = _run("run", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    errs = _errors(proc.stdout)
    assert len(errs) == ranks and all(e < 1e-5 for e in errs), proc.stdout


def test_run_rejects_mismatched_tokens():
    proc = _run("run", "--ranks", "2", "--tokens", "1,2,3")
    assert proc.returncode == 2
    assert "--tokens has 3 entries but --ranks=2" in proc.stderr


def test_help_documents_flags():
    proc = _run("run", "--help")
    for flag in ("--dtype", "--tokens", "--experts", "--ranks", "--comm", "--max-num-tokens",
                 "--backend", "--top-k", "--shared-intermediate"):
        assert flag in proc.stdout


def test_bench_overhead_prints_ns_per_range():
    proc = _run("bench", "--overhead", "--n", "20000")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"range overhead without profiler: \d+ ns per range", proc.stdout)
