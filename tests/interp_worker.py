"""Run a test file as a Triton-interpreter worker and read its JSON lines.

The interpreter must be chosen before triton is imported, so a kernel test file runs itself
as a script in ONE subprocess started with ``TRITON_INTERPRET=1`` (its ``__main__`` prints
one JSON object per line), and its tests read that report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_worker(path: str, *, timeout: float) -> list[dict]:
    """Run ``python path`` with ``TRITON_INTERPRET=1`` (no CUDA, the project on the path) and
    return its JSON lines; asserts a zero exit and at least one line."""
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, path], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert rows, proc.stdout[-2000:]
    return rows


def emit(**row) -> None:
    """Worker side: print one report line (a JSON object) for :func:`run_worker` to read."""
    print(json.dumps(row), flush=True)


def rel(a, b) -> float:
    """``||a - b|| / ||b||`` in fp64; nan when ``a`` has a non-finite value; the plain
    ``||a - b||`` when ``b`` is all zeros (0.0 for empty tensors)."""
    a, b = a.double(), b.double()
    if not bool(a.isfinite().all()):
        return float("nan")
    d = b.norm().item()
    return (a - b).norm().item() / (d if d > 0 else 1.0)


def value_errors(*calls) -> list[str | None]:
    """Worker side: each call's ValueError message, or None where it raised nothing."""
    msgs: list[str | None] = []
    for call in calls:
        try:
            call()
            msgs.append(None)
        except ValueError as e:
            msgs.append(str(e))
    return msgs


def rows_of(report: list[dict], kind: str) -> list[dict]:
    """The report's rows of ``kind`` (at least one)."""
    rows = [r for r in report if r["kind"] == kind]
    assert rows, f"no {kind} rows"
    return rows
