"""Bad command lines fail at once: exit status 2 and one stderr line that names the flag,
before any rank is spawned or any benchmark runs (``moerun.cli.main`` in-process)."""

from __future__ import annotations

import pytest
import torch

from moerun.cli import build_parser, main

_NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
# flags that keep a regressed check cheap (it would run a tiny CPU benchmark, not a big one)
_CHEAP = ("--device", "cpu", "--repeats", "1", "--warmup", "0")
_CHEAP_MATRIX = _CHEAP + ("--shapes", "tiny", "--tokens", "1", "--no-progress", "--peers",
                          "none", "--ceilings", "1e10,1e10,1e11")


def _fails(capsys, argv: list[str], prog: str, *words: str) -> str:
    """Run ``moerun argv``; assert exit 2, nothing on stdout, one stderr line starting with
    ``prog:`` and containing every word; return that line."""
    assert main(argv) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    lines = cap.err.splitlines()
    assert len(lines) == 1, cap.err
    assert lines[0].startswith(f"{prog}: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# -- run / trace ----------------------------------------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["--max-num-tokens", "0"], ["--max-num-tokens=0 is invalid"]),
    (["--top-k", "0"], ["--top-k=0 is invalid"]),
    (["--experts", "3"], ["--top-k=6", "<= --experts=3"]),
    (["--topk-groups", "9"], ["--topk-groups=9", "--groups=4"]),
    (["--quant", "fp8", "--hidden", "100"], ["--hidden=100", "multiple of 128"]),
])
def test_run_config_errors_name_the_flag(capsys, argv, words):
    """A value the layer's config refuses is reported under the flag that set it (not the
    MoEConfig field), before any rank runs."""
    line = _fails(capsys, ["run", "--device", "cpu", *argv], "moerun run", *words)
    assert "MoEConfig" not in line and "RoutingConfig" not in line


@_NO_CUDA
@pytest.mark.parametrize("argv", [["run", "--device", "cuda"],
                                  ["trace", "--device", "cuda", "--out", "unused-dir"]])
def test_run_device_cuda_without_gpu(capsys, argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fails(capsys, argv, f"moerun {argv[0]}", "--device cuda", "no CUDA device")
    assert not (tmp_path / "unused-dir").exists()


@pytest.mark.parametrize("flag", ["--out", "--trace"])
def test_trace_folder_is_checked_before_running(capsys, tmp_path, flag):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    command = "trace" if flag == "--out" else "run"
    _fails(capsys, [command, flag, str(a_file)], f"moerun {command}", flag,
           "is not a folder")
    _fails(capsys, [command, flag, str(a_file / "sub")], f"moerun {command}", flag,
           "cannot create the folder")


def test_run_ranks_without_enough_gpus_says_it_falls_back(capsys, monkeypatch):
    import moerun.launch

    calls = []

    def fake_launch(fn, world_size, **kwargs):  # stops the run: no rank is spawned
        calls.append(kwargs)
        return [{"rank": 0, "usage_error": "stopped by the test"}]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(moerun.launch, "launch", fake_launch)
    assert main(["run", "--device", "cuda", "--ranks", "2"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert err[0].startswith("moerun run: --ranks 2 needs 2 CUDA devices, 1 found")
    assert "CPU (gloo)" in err[0]
    assert calls and calls[0]["use_nccl"] is False and calls[0]["device"] == "cpu"


# -- eplb-sim -------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["--experts", "0"], ["--experts must be >= 1 (got 0)"]),
    (["--experts", "-4"], ["--experts"]),
    (["--experts", "10", "--ranks", "4", "--slots", "12"], ["--experts 10", "--ranks 4"]),
    (["--hot-share", "1.5"], ["--hot-share"]),
    (["--hot-share", "-0.1"], ["--hot-share"]),
    (["--draws", "0"], ["--draws"]),
    (["--layers", "0"], ["--layers"]),
    (["--tokens", "0"], ["--tokens"]),
    (["--sigma", "-0.1"], ["--sigma"]),
    (["--zipf-s", "1.2", "-1"], ["--zipf-s"]),
    (["--draws", "5", "--replans", "6"], ["--replans", "--draws"]),
    (["--slots", "300"], ["--slots 300", "--ranks 8"]),
    (["--load", "file"], ["--load file needs --load-file"]),
    (["--load", "file", "--load-file", "/nonexistent/loads.json"], ["--load-file", "no such"]),
])
def test_eplb_sim_rejects(capsys, argv, words):
    _fails(capsys, ["eplb-sim", *argv], "moerun eplb-sim", *words)


def test_eplb_sim_rejects_a_load_file_that_is_not_json(capsys, tmp_path):
    bad = tmp_path / "loads.json"
    bad.write_text("{not json")
    _fails(capsys, ["eplb-sim", "--load", "file", "--load-file", str(bad)], "moerun eplb-sim",
           "--load-file", "not valid JSON")


def test_eplb_sim_accepts_the_edge_values(capsys, tmp_path):
    # zipf s = 0 (uniform), sigma = 0 (no drift), hot share 0 and 1, replans 0: all meaningful
    loads = tmp_path / "loads.json"
    loads.write_text("[[1, 2, 3, 4]]")
    argv = ["eplb-sim", "--experts", "4", "--ranks", "2", "--slots", "6", "--tokens", "100",
            "--draws", "2", "--replans", "0", "--zipf-s", "0", "--sigma", "0", "--hot-share",
            "1", "--load", "zipf", "drift", "hot", "file", "--load-file", str(loads)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "(0 draws)" in out and "case=file(loads.json)" in out


# -- bench ----------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["--dbo", "--ranks", "0", *_CHEAP, "--tokens", "4"], ["--ranks must be >= 2 (got 0)"]),
    (["--dbo", "--ranks", "-2", *_CHEAP, "--tokens", "4"], ["--ranks must be >= 2"]),
    (["--dbo", "--tokens", "abc", *_CHEAP], ["--tokens 'abc'"]),
    (["--overhead", "--n", "0"], ["--n must be >= 1 (got 0)"]),
    (["--overhead", "--n", "-3"], ["--n must be >= 1"]),
    (["--from-json", "/nonexistent/run.json"], ["--from-json", "cannot read"]),
    (["--write-selection", "sel.json", *_CHEAP_MATRIX], ["--write-selection", "--out"]),
    (["--layer", "--dbo"], ["--layer", "--dbo", "pick one"]),
    (["--overhead", "--shared"], ["--overhead", "--shared", "pick one"]),
    (["--layer", "--dtype", "fp8"], ["--dtype fp8", "--layer"]),
    # a CPU run's order timings would go into the packaged table resolve reads
    (["--shared", "--write-table", *_CHEAP], ["--write-table", "give a path"]),
])
def test_bench_rejects(capsys, tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    _fails(capsys, ["bench", *argv], "moerun bench", *words)
    assert not (tmp_path / "sel.json").exists()


@_NO_CUDA
def test_bench_dbo_device_cuda_without_gpu(capsys):
    _fails(capsys, ["bench", "--dbo", "--device", "cuda"], "moerun bench", "--device cuda")


@pytest.mark.parametrize("text", ["not json at all", "[1, 2]", '{"schema": "other"}'])
def test_bench_from_json_that_is_not_a_saved_run(capsys, tmp_path, text):
    path = tmp_path / "run.json"
    path.write_text(text)
    _fails(capsys, ["bench", "--from-json", str(path)], "moerun bench", "--from-json")


# -- tune -----------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["--workers", "-2"], ["--workers must be >= 0 (got -2)"]),
    (["--budget-s", "-1"], ["--budget-s must be > 0"]),
    (["--budget-s", "0"], ["--budget-s must be > 0"]),
])
def test_tune_rejects(capsys, argv, words):
    _fails(capsys, ["tune", "--plan", "--device-name", "NVIDIA H200", *argv], "moerun tune",
           *words)


# -- help -----------------------------------------------------------------------------------
def _help(*words: str) -> str:
    parser = build_parser()
    if words:
        sub = next(a for a in parser._actions if a.dest == "command")
        parser = sub.choices[words[0]]
    return " ".join(parser.format_help().split())


def test_help_lists_every_bench_mode():
    for text in (_help(), _help("bench")):
        for mode in ("--layer", "--shared", "--dbo", "--overhead", "--dtype fp8"):
            assert mode in text, (mode, text)


def test_run_help_lists_comm_none():
    for command in ("run", "trace"):
        text = _help(command)
        assert "auto, none (one rank only), allgather, alltoall" in text
