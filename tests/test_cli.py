"""``moerun run`` end to end, as a user runs it (subprocess), including the issue's
acceptance commands for multi-rank execution."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import pytest


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "moerun.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def _errors(stdout: str) -> list[float]:
    return [float(v) for v in re.findall(r"relative error: ([0-9.e+-]+)", stdout)]


def test_run_default_single_rank():
    proc = _run("run")
    assert proc.returncode == 0, proc.stderr
    assert "moerun resolution report" in proc.stdout
    errs = _errors(proc.stdout)
    assert len(errs) == 1 and errs[0] < 1e-5
    assert re.search(r"^chunks: 1  \(one chunk\)$", proc.stdout, re.M)
    assert re.search(r"^forward wall time \(rank 0, after one warm-up forward\): \d+ µs$",
                     proc.stdout, re.M)
    assert "time per phase (rank 0, a third forward under torch.profiler;" in proc.stdout
    assert re.search(r"^\s+experts\s+[0-9.]+$", proc.stdout, re.M)
    assert re.search(r"^\s+route\s+[0-9.]+$", proc.stdout, re.M)
    # no profiler lines (Kineto writes "profiler_start" / "profiler_stop" to fd 2)
    assert proc.stderr == ""


def test_run_reports_the_chunk_count():
    # 10 tokens, 4 rows per chunk: 3 chunks on one rank; with the zero-token fix on 2 ranks
    # (counts 0 and 5) both pad to 5: 10 rows / 4 -> 3 chunks.
    proc = _run("run", "--tokens", "10", "--max-num-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^chunks: 3  \(max_num_tokens=4\)$", proc.stdout, re.M)
    proc = _run("run", "--ranks", "2", "--tokens", "0,5", "--max-num-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^chunks: 3  \(max_num_tokens=4\)$", proc.stdout, re.M)


@pytest.mark.parametrize("ranks,tokens,split,rule", [
    ("1", "64", False, r"weight re-read guard: 8\.0 rows per local expert per micro-batch "
                       r"< 1024"),
    ("2", "40,24", True, r"max T 40 >= threshold 32, 10\.0 rows per local expert per "
                         r"micro-batch"),
])
def test_run_says_what_dbo_decided(tmp_path, ranks, tokens, split, rule):
    # the printed decision agrees with what the traced forward did (its dbo/ub ranges)
    import json

    proc = _run("run", "--scheduler", "dbo", "--ranks", ranks, "--tokens", tokens,
                "--trace", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    word = "2 micro-batches" if split else "unsplit"
    assert re.search(rf"^dual-batch overlap: {word}  \({rule}\)$", proc.stdout, re.M), \
        proc.stdout
    with open(tmp_path / "report-rank0.json") as f:
        data = json.load(f)
    ubs = {p["ub"] for p in data["overlap"]["phases"]}
    assert ubs == ({0, 1} if split else {None})
    assert re.fullmatch(rf"{word}  \({rule}\)", data["dual_batch_overlap"])
    assert f"dual-batch overlap: {word}  (" in (tmp_path / "report-rank0.txt").read_text()
    assert "dual-batch overlap" not in _run("run", "--tokens", "64").stdout


@pytest.mark.parametrize("args,message", [
    (("--backend", "triton"), r"^moerun run: backend='triton' cannot run here: interpreter: "
                              r"CPU needs TRITON_INTERPRET=1 set before triton is imported$"),
    (("--backend", "cuda"), r"^moerun run: backend='cuda' is unknown; valid: 'auto', "
                            r"'reference', 'triton', 'grouped_mm'"),
    (("--comm", "nccl"), r"^moerun run: comm='nccl' is unknown; valid: 'auto', 'none', "
                         r"'allgather', 'alltoall'$"),
    (("--comm", "alltoall"), r"^moerun run: comm='alltoall' cannot run here: topology: needs "
                             r">= 2 ranks"),
    (("--ranks", "2", "--backend", "triton"), r"^moerun run: backend='triton' cannot run here"),
])
def test_run_unavailable_backend_or_comm_is_one_line(args, message):
    proc = _run("run", *args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert re.search(message, proc.stderr.strip())


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


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[-1]: a for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)}


def _subparser(name: str) -> argparse.ArgumentParser:
    from moerun.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("command", ["run", "bench"])
def test_every_option_says_what_it_does_and_its_default(command):
    options = _options(_subparser(command))
    assert len(options) >= 10
    undocumented = [flag for flag, a in options.items()
                    if not a.help or "default" not in a.help.lower()]
    assert undocumented == []


def test_tune_help_explains_every_option():
    proc = _run("tune", "--help")
    assert proc.returncode == 0, proc.stderr
    # one block per option: its line and the indented continuation lines
    blocks = re.findall(r"^  (--[\w-]+)(.*?)(?=^  -|\Z)", proc.stdout, re.M | re.S)
    flags = {flag: " ".join(text.split()) for flag, text in blocks}
    assert set(flags) == {"--shapes", "--T", "--budget-s", "--dtype", "--out-dir", "--dry-run",
                          "--plan", "--device-name", "--graph-max-tokens", "--ceilings",
                          "--workers"}
    assert all("default" in text for text in flags.values()), flags
    assert "deepseek-v3-ep8-local" in flags["--shapes"] and "local slot count" in flags["--shapes"]
    assert "256,2048,8192,32768 for the EP-" in flags["--T"]
    assert "no GPU needed" in flags["--plan"]
    assert "winner stored for the T bucket" in flags["--T"]
    assert "no new (shape, T) point is started" in flags["--budget-s"]
    assert "dtype the kernels are compiled and timed in" in flags["--dtype"]
    # the fp8 choice: what it tunes, the files it writes, where fp8 changes a flag
    assert "{bfloat16,float16,fp8}" in flags["--dtype"]
    assert "fp8: the FP8 block-scaled kernels" in flags["--dtype"]
    assert "_float8_e4m3fn_<device>.json" in flags["--dtype"]
    assert "with --dtype fp8 FLOPS is the fp8 GEMM rate" in flags["--ceilings"]
    assert "with --dtype fp8 H and I must be multiples of 128" in flags["--shapes"]
    assert "marked f8" in flags["--plan"]


def test_eplb_sim_help_states_defaults():
    from eplb.sim_cli import build_parser

    options = _options(build_parser())
    assert all(a.help for a in options.values())
    missing = [f for f, a in options.items()
               if a.default not in (None, False) and "default" not in a.help]
    assert missing == []


def test_peers_help_names_no_machine_path():
    peers = _options(_subparser("bench"))["--peers"].help
    assert "/work" not in peers and "shared/peers/h200-*.json" in peers


def test_bench_on_cpu_defaults_to_tiny_shapes():
    proc = _run("bench", "--device", "cpu", "--tokens", "1,16", "--repeats", "1", "--warmup",
                "0", "--no-progress", "--ceilings", "1e10,1e10,1e11", "--peers", "none")
    assert proc.returncode == 0, proc.stderr
    assert "# cpu: --shapes defaults to tiny" in proc.stderr
    cells = re.findall(r"^cell shape=(\S+) T=(\d+)", proc.stdout, re.M)
    assert cells == [("tiny", "1"), ("tiny", "16")]
    # the printed command reproduces the run, shape included
    assert re.search(r"^# moerun bench --shapes tiny --tokens 1,16 ", proc.stdout, re.M)


def test_bench_overhead_prints_ns_per_range():
    proc = _run("bench", "--overhead", "--n", "20000")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"range overhead without profiler: \d+ ns per range", proc.stdout)


def test_commands_restore_tf32(capsys):
    # bench / tune / run turn TF32 off while they run and give the caller's setting back,
    # also when the command raises
    import torch

    from moerun._precision import exact_fp32
    from moerun.cli import main

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        seen = []

        @exact_fp32()
        def probe():
            seen.append((torch.backends.cuda.matmul.allow_tf32,
                         torch.backends.cudnn.allow_tf32))
            raise KeyError("x")

        with pytest.raises(KeyError):
            probe()
        assert seen == [(False, False)]
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == \
            (True, True)
        assert main(["run", "--tokens", "8"]) == 0  # in this process, one rank
        assert "relative error" in capsys.readouterr().out
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == \
            (True, True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
