"""Kernel configs by the shape that runs (issue 11), on a CPU, in-process (nothing here
imports triton): the lookup key is (local slots, N, K, dtype, device); every lookup says
"tuned (<file>)" or "heuristic"; the resolution report lists it per T bucket; ``moerun tune``
plans the EP-local shapes and its files round-trip into the lookup.

Shipped files (``moerun/backends/triton/configs/``) were tuned on one rank, so their slot
count is the model's E: ``S256_N2048_K7168_bfloat16_NVIDIA_H200.json`` serves DeepSeek-V3 on
one GPU, not its EP8 rank (32 local slots), which needs ``S32_...`` of its own.
"""

from __future__ import annotations

import io
import json
import logging

import pytest
import torch

from moerun.backends.triton.configs import (FP8_GROUP, FP8_PREQUANT_BLOCK_M, ConfigTable,
                                            DownConfig, ExpertsConfig, GateUpConfig,
                                            default_config, fit_to_dtype, fp8_default_config,
                                            fp8_intermediate, fp8_tile_fits, load_config_file)
from moerun.backends.triton.tune import main as tune_main
from moerun.backends.triton.tune_plan import (FP8_MAX_CONFIGS, MAX_CONFIGS, TunedEntry,
                                              compile_configs, fp8_candidates, merge_entries,
                                              persistent_candidates, plan_points,
                                              read_config_data)
from moerun.bench.shapes import SHAPES
from moerun.capability import Deployment, Problem
from moerun.config import Activation
from moerun.env import Env
from moerun.resolve import resolve

H200 = "NVIDIA H200"
DSV3_FILE = "S256_N2048_K7168_bfloat16_NVIDIA_H200.json"
EP8_FILE = "S32_N2048_K7168_bfloat16_NVIDIA_H200.json"
EP16_FILE = "S16_N2048_K7168_bfloat16_NVIDIA_H200.json"  # DeepSeek-V3 under EP16: not shipped
BF16 = torch.bfloat16
# Two configs unlike the heuristic's for the EP-local shape, small enough that fitting to
# shared memory leaves them unchanged (bf16: 4 * (64*64 + 2*64*64) * 2 B = 96 KiB).
CFG_A = ExpertsConfig(block_m=64, gate_up=GateUpConfig(block_n=64, block_k=64, group_m=4),
                      down=DownConfig(block_n=64, block_k=64, group_m=4), combine="reduce")
CFG_B = ExpertsConfig(block_m=128, gate_up=GateUpConfig(block_n=64, block_k=32, num_warps=8),
                      down=DownConfig(block_n=128, block_k=32, num_warps=8), combine="reduce")


def _env(device_name=H200) -> Env:
    return Env(torch_version="2.x", cuda_available=True, device_capability=(9, 0),
               device_name=device_name, num_gpus=8, triton_version="3.6.0", nvtx_version=None,
               deep_ep_version=None, transformers_version=None, triton_interpret=False,
               has_grouped_mm=True)


def _dsv3_problem() -> Problem:
    return Problem(num_experts=256, num_slots=256, top_k=8, hidden_size=7168,
                   intermediate_size=2048, dtype=BF16, activation=Activation.SILU_GLU,
                   device_type="cuda")


def _write_ep8_file(folder, winners, command="moerun tune --shapes deepseek-v3-ep8-local"):
    path = folder / EP8_FILE
    data = merge_entries(read_config_data(path), shape=SHAPES["deepseek-v3-ep8-local"],
                         dtype=BF16, device_name=H200, command=command, date="2026-12-02",
                         versions={"torch": "2.x", "triton": "3.6.0"}, winners=winners)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


# ---------------------------------------------------------------- the lookup and its source

def test_single_rank_and_ep8_shapes_are_tuned_and_an_untuned_ep16_shape_is_heuristic():
    table = ConfigTable(device_name=H200)
    one_rank = table.lookup(256, 2048, 7168, 16, 8, BF16)
    assert one_rank.source == f"tuned ({DSV3_FILE})" and one_rank.tuned
    assert one_rank.entry_bucket == 16
    entries = load_config_file(table.config_dir + "/" + DSV3_FILE).entries
    assert one_rank.config == fit_to_dtype(entries[16], BF16)
    # DeepSeek-V3 under EP8: the kernels run 32 local slots, the shipped EP8 file applies
    ep8 = table.lookup(32, 2048, 7168, 2048, 4, BF16)
    assert ep8.source == f"tuned ({EP8_FILE})" and ep8.tuned
    # under EP16 (16 local slots) no file exists: neither the 256- nor the 32-slot file applies
    ep16 = table.lookup(16, 2048, 7168, 16, 8, BF16)
    assert ep16.source == "heuristic" and not ep16.tuned and ep16.entry_bucket is None
    assert ep16.config == fit_to_dtype(default_config(16, 2048, 7168, 16, 8), BF16)
    assert EP16_FILE in ep16.detail and "moerun tune" in ep16.detail


@pytest.mark.parametrize("dtype, device", [(torch.float16, H200), (BF16, "NVIDIA H100"),
                                           (BF16, "")])
def test_no_fallback_to_another_dtype_or_device(dtype, device):
    choice = ConfigTable(device_name=device).lookup(256, 2048, 7168, 16, 8, dtype)
    assert choice.source == "heuristic"
    assert choice.config == fit_to_dtype(default_config(256, 2048, 7168, 16, 8), dtype)


def test_overrides_say_so():
    choice = ConfigTable(overrides={16: CFG_A}).lookup(256, 2048, 7168, 9, 8, BF16)
    assert (choice.source, choice.bucket, choice.config) == ("override", 16, CFG_A)


def test_heuristic_is_logged_once_per_key(caplog):
    table = ConfigTable(device_name=H200)
    with caplog.at_level(logging.INFO, logger="moerun"):
        for t in (1, 16, 1024, 8192):
            table.lookup(16, 2048, 7168, t, 8, BF16)
        table.lookup(256, 2048, 7168, 16, 8, BF16)  # tuned: nothing to log
    msgs = [r.getMessage() for r in caplog.records if "heuristic" in r.getMessage()]
    assert len(msgs) == 1 and "S=16 N=2048 K=7168 bfloat16" in msgs[0]


def test_report_lines_per_bucket():
    # entries at T = 1, 16, 128, 1024, 8192; each bucket takes the nearest in log2, ties to
    # the larger: 2 -> 1; 4 (2 from 1 and from 16) -> 16; 64 -> 128; 512 -> 1024; 4096 -> 8192
    lines = ConfigTable(device_name=H200).report_lines(256, 2048, 7168, 8, BF16)
    src = f"tuned ({DSV3_FILE})"
    assert lines == (
        "S_local=256 N=I=2048 K=H=7168 bfloat16 on NVIDIA H200:",
        f"T 1-2: {src}, entry T=1", f"T 4-32: {src}, entry T=16",
        f"T 64-256: {src}, entry T=128", f"T 512-2048: {src}, entry T=1024",
        f"T 4096-16384: {src}, entry T=8192")


# ---------------------------------------------------------------- the resolution report

def test_resolution_report_states_the_source_of_the_local_shape():
    env = _env()
    ep16 = resolve(_dsv3_problem(), Deployment(rank=3, world_size=16, comm_backend="nccl",
                                               num_local_slots=16, divisible=True),
                   env, backend="triton", comm="allgather")
    text = str(ep16)
    assert ("  kernel configs:      S_local=16 N=I=2048 K=H=7168 bfloat16 on NVIDIA H200:\n"
            f"    T 1-16384: heuristic (no {EP16_FILE}") in text
    one = resolve(_dsv3_problem(), Deployment(rank=0, world_size=1, comm_backend="none",
                                              num_local_slots=256, divisible=True),
                  env, backend="triton")
    assert one.kernel_configs[0] == "S_local=256 N=I=2048 K=H=7168 bfloat16 on NVIDIA H200:"
    assert f"    T 4-32: tuned ({DSV3_FILE}), entry T=16" in str(one)


def test_backend_without_configs_has_no_config_lines():
    problem = Problem(num_experts=8, num_slots=8, top_k=2, hidden_size=64,
                      intermediate_size=32, dtype=torch.float32,
                      activation=Activation.SILU_GLU, device_type="cpu")
    report = resolve(problem, Deployment(rank=0, world_size=1, comm_backend="none",
                                         num_local_slots=8, divisible=True),
                     _env("cpu"), backend="grouped_mm")
    assert report.kernel_configs == () and "kernel configs" not in str(report)


# ---------------------------------------------------------------- tune: files and plan

def test_tuned_file_of_the_local_shape_round_trips(tmp_path):
    path = _write_ep8_file(tmp_path, {256: TunedEntry(config=CFG_A, us=700.0, timing="eager",
                                                      tokens=256, floor_us=650.0),
                                      16384: TunedEntry(config=CFG_B, us=21000.0,
                                                        timing="eager", tokens=32768)})
    assert path.name == EP8_FILE
    loaded = load_config_file(path)
    meta, entries = loaded.meta, loaded.entries
    assert entries == {256: CFG_A, 16384: CFG_B}
    assert meta["shape"] == {"name": "deepseek-v3-ep8-local", "S": 32, "top_k": 4, "H": 7168,
                             "I": 2048}
    assert meta["dtype"] == "bfloat16" and meta["device"] == H200
    raw = json.loads(path.read_text())["entries"]["256"]
    assert raw["floor_over_time"] == round(650.0 / 700.0, 4) and raw["T"] == 256

    table = ConfigTable(device_name=H200, config_dir=tmp_path)
    got = table.lookup(32, 2048, 7168, 256, 4, BF16)
    assert (got.config, got.source, got.entry_bucket) == (CFG_A, f"tuned ({EP8_FILE})", 256)
    got = table.lookup(32, 2048, 7168, 32768, 4, BF16)  # bucket 16384
    assert (got.config, got.entry_bucket) == (CFG_B, 16384)
    # T=1: log2 distance 8 to 256, 14 to 16384
    assert table.lookup(32, 2048, 7168, 1, 4, BF16).config == CFG_A
    # the single-rank shape has no file in this folder
    assert table.lookup(256, 2048, 7168, 256, 8, BF16).source == "heuristic"

    # a second run adds a bucket and keeps the others; history has both runs
    _write_ep8_file(tmp_path, {2048: TunedEntry(config=CFG_B, us=2000.0, timing="eager",
                                                tokens=2048)}, command="moerun tune --T 2048")
    data = json.loads(path.read_text())
    assert list(data["entries"]) == ["256", "2048", "16384"]
    assert [h["command"] for h in data["meta"]["history"]] == [
        "moerun tune --shapes deepseek-v3-ep8-local", "moerun tune --T 2048"]
    assert [h["T"] for h in data["meta"]["history"]] == [[256, 32768], [2048]]


def test_plan_covers_the_ep_local_shapes(tmp_path, capsys):
    _write_ep8_file(tmp_path, {256: TunedEntry(config=CFG_A, us=700.0, timing="eager",
                                               tokens=256)})
    rc = tune_main(["--shapes", "deepseek-v3-ep8-local,qwen3-235b-ep8-local", "--plan",
                    "--device-name", H200, "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    points = [ln for ln in out.splitlines() if ln.startswith("point ")]
    assert len(points) == 8
    want = [(name, t, b) for name in ("deepseek-v3-ep8-local", "qwen3-235b-ep8-local")
            for t, b in ((256, 256), (2048, 2048), (8192, 8192), (32768, 16384))]
    got = [(ln.split()[1], int(ln.split()[2][2:]), int(ln.split()[3][7:])) for ln in points]
    assert got == want
    assert all(" mode=eager " in ln for ln in points)
    assert all(ln.endswith(str(tmp_path / EP8_FILE)) for ln in points[:4])
    assert all(ln.endswith(str(tmp_path / "S16_N1536_K4096_bfloat16_NVIDIA_H200.json"))
               for ln in points[4:])
    assert f'incumbent="tuned ({EP8_FILE})"' in points[0]
    assert all('incumbent="heuristic"' in ln for ln in points[1:])
    assert " S=32 " in points[0] and " S=16 " in points[4]
    assert out.splitlines()[-1].startswith("plan: 8 points, ")


def test_plan_modes_follow_the_bench_serving_regime(tmp_path):
    points = plan_points([SHAPES["mixtral8x7b"]], None, BF16, H200, tmp_path)
    assert [(p.tokens, p.mode) for p in points] == [(1, "graph"), (16, "graph"),
                                                    (128, "graph"), (1024, "graph"),
                                                    (8192, "eager")]
    for p in points:
        assert len(compile_configs(p)) == p.num_configs  # every timed config is compiled
        assert p.file_name == "S8_N14336_K4096_bfloat16_NVIDIA_H200.json"


def test_prefill_points_time_the_persistent_kernels_too(tmp_path):
    """bf16 points with more than 160 rows per hit expert time 9 persistent configs as whole
    calls (compiled too, within MAX_CONFIGS), three of them with the tail split; decode
    points, fp32 and fp8 time none."""
    shapes = [SHAPES[n] for n in ("mixtral8x7b", "qwen3-30b-a3b", "deepseek-v3",
                                  "deepseek-v3-ep8-local", "qwen3-235b-ep8-local")]
    with_p = []
    for p in plan_points(shapes, None, BF16, H200, tmp_path):
        rows = p.tokens * p.shape.top_k / min(p.shape.num_experts, p.tokens * p.shape.top_k)
        assert len(p.persistent) == (9 if rows > 160 else 0), (p.shape.name, p.tokens)
        assert sum(c.tail_split for c in p.persistent) == (3 if rows > 160 else 0)
        assert all(c.kernel == "persistent" and c.combine == "reduce" for c in p.persistent)
        # the direct configs and the swap_ab forms come on top
        assert p.num_configs - len(p.direct) - p.swap_configs <= MAX_CONFIGS
        assert len(compile_configs(p)) == p.num_configs
        assert set(p.persistent) <= set(compile_configs(p))
        if p.persistent:
            with_p.append((p.shape.name, p.tokens))
    assert ("mixtral8x7b", 1024) in with_p and ("qwen3-30b-a3b", 1024) not in with_p
    assert ("deepseek-v3", 1024) not in with_p and ("deepseek-v3", 8192) in with_p
    assert ("deepseek-v3-ep8-local", 2048) in with_p
    assert not any(p.persistent for p in plan_points([SHAPES["mixtral8x7b"]], None,
                                                     torch.float32, H200, tmp_path))
    # fp8 points time the ws Gluon kernels there instead (tests/test_fp8_ws.py)
    assert all(c.kernel == "ws" for p in plan_points([SHAPES["mixtral8x7b"]], None,
                                                     torch.float8_e4m3fn, H200, tmp_path)
               for c in p.persistent)


def test_every_shipped_persistent_entry_is_in_the_tuners_space():
    """A persistent entry of a shipped bf16 file (they came from the probe) is one of the
    configs ``moerun tune`` times for that point, so a re-tune can reproduce it."""
    from moerun.backends.triton.configs import CONFIG_DIR

    seen = 0
    for f in sorted(CONFIG_DIR.glob("*_bfloat16_*.json")):
        data = json.loads(f.read_text())
        slots = int(f.name.split("_")[0][1:])  # the file is keyed by the local slots
        top_k = data["meta"]["shape"]["top_k"]
        for bucket, entry in data["entries"].items():
            cfg = ExpertsConfig.from_json(entry["config"])
            if cfg.kernel != "persistent":
                continue
            seen += 1
            t = entry.get("T", int(bucket))
            assert cfg in persistent_candidates(slots, top_k, t), (f.name, t)
    assert seen >= 8


def test_tune_finalists_are_the_close_ones_fastest_first():
    """Step 4 of ``moerun tune``: the whole calls within 4 % of the fastest (each config once,
    at its best timing; failed timings out), at most 4, fastest first; then the incumbent,
    wherever it was timed."""
    from moerun.backends.triton.tune import FINAL_MAX, FINAL_WITHIN, finalists

    cfgs = [ExpertsConfig(block_m=16, gate_up=GateUpConfig(block_n=n, block_k=128),
                          down=DownConfig(block_n=64, block_k=128)) for n in (16, 32, 64, 128,
                                                                               256)]
    a, b, c, d, e = cfgs
    timed = [(100.0, a), (103.9, b), (104.1, c), (float("nan"), d), (101.0, e), (99.5, b)]
    assert (FINAL_WITHIN, FINAL_MAX) == (0.04, 4)
    # b's best timing is 99.5 (the fastest): the bar is 99.5 * 1.04 = 103.48
    assert finalists(timed) == [b, a, e]
    assert finalists(timed, within=0.05) == [b, a, e, c]  # c at 104.1 <= 104.475 now
    assert finalists(timed, within=0.05, most=2) == [b, a]
    assert finalists([(float("nan"), a)]) == [] and finalists([]) == []
    assert finalists([(50.0, a)]) == [a]  # one finalist: nothing to re-time
    # the incumbent is re-timed however far behind, once, and only if it was timed
    assert finalists(timed, keep=c) == [b, a, e, c]
    assert finalists(timed, keep=a) == [b, a, e]
    assert finalists(timed, within=0.05, most=2, keep=c) == [b, a, c]
    assert finalists(timed, keep=d) == [b, a, e]  # its timing failed
    assert finalists([(50.0, a), (80.0, b)], keep=b) == [a, b]  # a far-ahead one re-timed


def test_tune_keeps_the_incumbent_unless_a_finalist_beats_it_by_the_margin():
    """Step 4's winner: the fastest median, but an incumbent among the finalists stays
    unless beaten by more than 1 % of its own median."""
    from moerun.backends.triton.tune import KEEP_MARGIN, pick_winner

    a, b, c = (ExpertsConfig(block_m=16, gate_up=GateUpConfig(block_n=n, block_k=128),
                             down=DownConfig(block_n=64, block_k=128)) for n in (16, 32, 64))
    assert KEEP_MARGIN == 0.01
    assert pick_winner({a: 100.0, b: 99.5}, a) == a  # 0.5 % faster: noise, kept
    assert pick_winner({a: 100.0, b: 99.0}, a) == a  # exactly 1 %: kept
    assert pick_winner({a: 100.0, b: 98.9, c: 99.5}, a) == b  # 1.1 %: replaced
    assert pick_winner({a: 100.0, b: 99.5}, c) == b  # incumbent not a finalist
    assert pick_winner({a: 100.0, b: 99.5}, a, margin=0.0) == b
    assert pick_winner({b: 99.5}, b) == b


def test_tune_needs_a_gpu_or_plan(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert tune_main(["--shapes", "tiny"]) == 2
    assert "needs a CUDA GPU (--plan prints the plan without one)" in capsys.readouterr().err
    assert tune_main(["--shapes", "tiny", "--plan"]) == 2
    assert "--plan without a GPU needs --device-name" in capsys.readouterr().err


_TUNE_ON_CPU = r'''
import json, sys, torch
from pathlib import Path
from moerun.backends.triton.configs import (ConfigTable, DownConfig, GateUpConfig,
                                            config_file_name, default_config)
from moerun.backends.triton.tune import run_points, write_winners
from moerun.backends.triton.tune_plan import CandidateSet, DownChoice, TunePoint
from moerun.bench.ceilings import Ceilings
from moerun.bench.shapes import SHAPES

out_dir = Path(sys.argv[1])
gu = GateUpConfig(block_n=32, block_k=32, num_stages=2)
dn = DownConfig(block_n=32, block_k=32, num_stages=2)
from moerun.backends.triton.configs import ExpertsConfig
persistent = ExpertsConfig(block_m=16, gate_up=gu, down=dn, combine="reduce",
                           kernel="persistent", programs=2)
pt = TunePoint(shape=SHAPES["tiny"], tokens=3, bucket=4, mode="graph",
               incumbent=default_config(8, 32, 64, 4, 2), incumbent_source="heuristic",
               candidate_sets=(CandidateSet(block_m=16, gate_ups=(gu,), downs=(
                   DownChoice(down=dn, combine="reduce"), DownChoice(down=dn, combine="atomic"))),),
               file_name=config_file_name(8, 32, 64, "float16", "cpu"), persistent=(persistent,))
ceilings = Ceilings(read_bw=1e10, copy_bw=1e10, flops=1e11)
import io
log = io.StringIO()
winners = run_points([pt], device=torch.device("cpu"), dtype=torch.float16, ceilings=ceilings,
                     budget_s=600, out=log)
sys.stderr.write(log.getvalue())
paths = write_winners(winners, [pt], out_dir, dtype=torch.float16, device_name="cpu",
                      command="test", out=sys.stderr)
entry = winners[pt.file_name][4]
choice = ConfigTable(device_name="cpu", config_dir=out_dir).lookup(8, 32, 64, 3, 2, torch.float16)
timed = [pt.incumbent.key(), persistent.key()] + [c.key() for c in (
    ExpertsConfig(block_m=16, gate_up=gu, down=dn, combine=k) for k in ("reduce", "atomic"))]
assert persistent.key() in log.getvalue() and "full, persistent" in log.getvalue(), log.getvalue()
print(json.dumps({"files": [p.name for p in paths], "timing": entry.timing, "us": entry.us,
                  "floor_us": entry.floor_us, "config": entry.config.key(), "timed": timed,
                  "looked_up": choice.config.key(), "source": choice.source}))
'''


def test_tune_loop_runs_under_the_interpreter_and_its_file_is_used(tmp_path):
    """The timing loop on a CPU (Triton interpreter, fp16, eager): a winner among the timed
    configs, its floor from moerun.bench, the file written and then looked up as tuned."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _TUNE_ON_CPU, str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env=env,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["files"] == ["S8_N32_K64_float16_cpu.json"]
    assert got["timing"] == "eager" and got["us"] > 0
    assert got["config"] in got["timed"]
    assert got["looked_up"] == got["config"]
    assert got["source"] == "tuned (S8_N32_K64_float16_cpu.json)"
    # tiny T=3 (k=2): 2..6 experts hit; bytes (hit*3*64*32 + 2*3*64)*2 = 25,344..74,496
    # over 1e10 B/s = 2.5344..7.4496 µs, above the 0.737 µs of compute (2*3*2*3*64*32 / 1e11)
    hit = (got["floor_us"] * 1e-6 * 1e10 / 2 - 2 * 3 * 64) / (3 * 64 * 32)
    assert 2 <= hit <= 6
    assert 2.5344 - 1e-9 <= got["floor_us"] <= 7.4496 + 1e-9


# ---------------------------------------------------------------- tune --dtype fp8

FP8 = torch.float8_e4m3fn
MIXTRAL_FP8 = "S8_N14336_K4096_float8_e4m3fn_NVIDIA_H200.json"
EP8_FP8 = "S32_N2048_K7168_float8_e4m3fn_NVIDIA_H200.json"


def test_fp8_plan_points_counts_and_files(tmp_path, capsys):
    """``--plan --dtype fp8`` without a GPU: the fp8 files of the local shapes, the sweep's
    space per point (worked out below) and the incumbent of an existing fp8 file."""
    fp8_cfg = fp8_default_config(32, 2048, 7168, 256, 4)
    (tmp_path / EP8_FP8).write_text(json.dumps(merge_entries(
        {}, shape=SHAPES["deepseek-v3-ep8-local"], dtype=FP8, device_name=H200, command="t",
        date="2026-12-02", versions={}, activation_dtype=BF16,
        winners={256: TunedEntry(config=fp8_cfg, us=1.0, timing="eager", tokens=256)})))
    rc = tune_main(["--dtype", "fp8", "--shapes", "mixtral8x7b,deepseek-v3-ep8-local", "--plan",
                    "--device-name", H200, "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    points = [ln.split() for ln in out.splitlines() if ln.startswith("point ")]
    got = [(p[1], p[2], p[4], p[6], p[7]) for p in points]
    # mixtral T=1/16: 2 and 4 rows per hit expert -> block_m 16: 6 gate/up (32/64/128 columns
    # x 3/4 stages) + 6 down (64/128 columns x split 1/2/4, all dividing I/128 = 112) + the
    # incumbent = 13, and the swap_ab forms of its tiles of at least 64 weight rows (4 gate/up
    # n64/n128 x 3/4 stages alone, the 6 downs as whole calls) = 23; T=1 also times the 21
    # fp8 direct configs (fp8_direct_candidates: 15 and 6 swap_ab copies) = 44.
    # T=128 (32 rows/expert): 32 (12, and its 10 swap_ab forms) + 64 with the fp8
    # intermediate (2 gate/up n128 w8 x 2 stages and 6 paired: n128 w4/w8 and n256 w8 x 3/4
    # stages; 6 down) + 64 in
    # bf16 (4 gate/up n64 w4/w8 x 2 stages, 6 down) + 1 = 47. T >= 1024 (every one at >= 256
    # rows per hit expert, FP8_WIDE_GROUP_TPE): 64f8 (14, plus the group_m=16 paired n256 w8
    # s3 / n128 w4 s4 and downs n256 w8 / n128 w4: 18) + 64 (10 + the 2 downs: 12) + 128f8
    # (2 paired n128 w8 x 3/4 stages; 6 down: n64 w4/w8, n128 w8 x 2/3 stages; the group_m=16
    # tiles do not fit 128 rows) + 1 = 39, plus the 10 ws configs at >= 64 rows per hit
    # expert (fp8_ws_candidates) = 49
    assert got == [
        ("mixtral8x7b", "T=1", "mode=graph", "configs=44", "block_m=16"),
        ("mixtral8x7b", "T=16", "mode=graph", "configs=23", "block_m=16"),
        ("mixtral8x7b", "T=128", "mode=graph", "configs=47", "block_m=32,64f8,64"),
        ("mixtral8x7b", "T=1024", "mode=graph", "configs=49", "block_m=64f8,64,128f8"),
        ("mixtral8x7b", "T=8192", "mode=eager", "configs=49", "block_m=64f8,64,128f8"),
        ("deepseek-v3-ep8-local", "T=256", "mode=eager", "configs=47", "block_m=32,64f8,64"),
        ("deepseek-v3-ep8-local", "T=2048", "mode=eager", "configs=49",
         "block_m=64f8,64,128f8"),
        ("deepseek-v3-ep8-local", "T=8192", "mode=eager", "configs=49",
         "block_m=64f8,64,128f8"),
        ("deepseek-v3-ep8-local", "T=32768", "mode=eager", "configs=49",
         "block_m=64f8,64,128f8")]
    files = [ln.rsplit("file=", 1)[1] for ln in out.splitlines() if ln.startswith("point ")]
    assert files == [str(tmp_path / MIXTRAL_FP8)] * 5 + [str(tmp_path / EP8_FP8)] * 4
    assert f'incumbent="tuned ({EP8_FP8})"' in out.splitlines()[5]
    # the swap_ab timings of each point's 16/32-row sets (4 gate/up tiles alone, 6 downs)
    assert [ln.split()[10] for ln in out.splitlines()[:9]] == ["swap=10", "swap=10", "swap=10"] \
        + ["swap=0"] * 2 + ["swap=10"] + ["swap=0"] * 3
    assert all('incumbent="heuristic"' in ln for ln in out.splitlines()[:5])
    assert out.splitlines()[-1] == f"plan: 9 points, {44 + 23 + 2 * 47 + 5 * 49} configs to time"
    # the points carry the fp8 heuristic as the incumbent where no file has the bucket
    pts = plan_points([SHAPES["mixtral8x7b"]], [1], FP8, H200, tmp_path)
    assert pts[0].incumbent == fp8_default_config(8, 14336, 4096, 1, 2)
    assert len(compile_configs(pts[0])) == pts[0].num_configs == 44  # 13 + 10 swap + 21 direct


def test_fp8_plan_refuses_shapes_the_fp8_blocks_cannot_cover(capsys):
    assert tune_main(["--dtype", "fp8", "--shapes", "tiny", "--plan", "--device-name",
                      H200]) == 2
    err = capsys.readouterr().err
    assert "--shapes tiny: H=64 and I=32 must be multiples of 128" in err
    with pytest.raises(ValueError, match="multiples of 128 for the fp8 kernels"):
        plan_points([SHAPES["tiny"]], None, FP8, H200, ".")


def test_fp8_register_rule():
    # accumulators * 2 * BM * BN / (32 * warps) <= 128: worked out by hand
    assert fp8_tile_fits(64, 128, 8, 2)            # 2*2*64*128/256 = 128
    assert not fp8_tile_fits(64, 128, 4, 2)        # 256
    assert not fp8_tile_fits(128, 128, 8, 2)       # 256: the tile that spilled in sweep run 1
    assert fp8_tile_fits(128, 64, 4, 1)            # 1*2*128*64/128 = 128
    assert not fp8_tile_fits(128, 256, 8, 1)       # 256


@pytest.mark.parametrize("name", ["mixtral8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b",
                                  "deepseek-v3", "deepseek-v3-ep8-local",
                                  "qwen3-235b-ep8-local"])
def test_fp8_candidates_obey_the_register_and_intermediate_rules(name):
    s = SHAPES[name]
    seen_f8 = False
    for t in (1, 4, 16, 64, 128, 256, 1024, 2048, 8192, 32768):
        sets = fp8_candidates(s.num_experts, s.top_k, s.hidden, s.intermediate, t)
        assert sets and sum(c.size for c in sets) <= FP8_MAX_CONFIGS - 1
        for cs in sets:
            for g in cs.gate_ups:
                assert g.block_k == FP8_GROUP
                acc = 1 if g.paired else 2
                assert fp8_tile_fits(cs.block_m, g.block_n, g.num_warps, acc), (t, cs.block_m, g)
                assert not g.paired or cs.block_m >= FP8_PREQUANT_BLOCK_M, (t, cs.block_m, g)
                # the fp8 intermediate needs 128-column gate/up tiles from PREQUANT_BLOCK_M on,
                # and the set says which form its down tiles are timed on
                assert fp8_intermediate(cs.block_m, g) == cs.fp8_intermediate, (t, cs, g)
            for d in cs.downs:
                assert d.down.block_k == FP8_GROUP
                assert fp8_tile_fits(cs.block_m, d.down.block_n, d.down.num_warps, 1)
                assert (s.intermediate // FP8_GROUP) % d.down.split_k == 0
                assert d.combine == ("atomic" if cs.block_m < FP8_PREQUANT_BLOCK_M
                                     else "reduce")
                ExpertsConfig(block_m=cs.block_m, gate_up=cs.gate_ups[0], down=d.down,
                              combine=d.combine)  # a valid config
            seen_f8 |= cs.fp8_intermediate
            if cs.fp8_intermediate:
                assert cs.block_m >= FP8_PREQUANT_BLOCK_M
                assert all(g.paired or g.block_n == FP8_GROUP for g in cs.gate_ups)
        # the heuristic the lookup falls back on obeys the same rules
        h = fp8_default_config(s.num_experts, s.intermediate, s.hidden, t, s.top_k)
        assert fp8_tile_fits(h.block_m, h.gate_up.block_n, h.gate_up.num_warps, 2)
        assert fp8_tile_fits(h.block_m, h.down.block_n, h.down.num_warps, 1)
    assert seen_f8


def test_fp8_candidates_of_one_prefill_block_m_by_hand():
    # qwen3-235b T=1024: 64 rows per hit expert -> block_m 64 and 128
    sets = fp8_candidates(128, 8, 4096, 1536, 1024)
    assert [c.label for c in sets] == ["64f8", "64", "128f8"]
    tile = [(g.block_n, g.num_warps, g.num_stages, g.paired) for g in sets[0].gate_ups]
    assert tile == [(128, 8, 2, False), (128, 8, 3, False),
                    (128, 4, 3, True), (128, 4, 4, True), (128, 8, 3, True), (128, 8, 4, True),
                    (256, 8, 3, True), (256, 8, 4, True)]
    tile = [(g.block_n, g.num_warps, g.num_stages) for g in sets[1].gate_ups]
    assert tile == [(64, 4, 2), (64, 4, 3), (64, 8, 2), (64, 8, 3)]
    downs = [(d.down.block_n, d.down.num_warps, d.down.num_stages) for d in sets[0].downs]
    assert downs == [(128, 4, 2), (128, 4, 3), (128, 8, 2), (128, 8, 3), (256, 8, 2),
                     (256, 8, 3)]
    assert sets[1].downs == sets[0].downs
    # block_m 128: only the paired tile fits the registers (one accumulator: 2*128*128/256)
    tile = [(g.block_n, g.num_warps, g.num_stages, g.paired) for g in sets[2].gate_ups]
    assert tile == [(128, 8, 3, True), (128, 8, 4, True)]
    downs = [(d.down.block_n, d.down.num_warps) for d in sets[2].downs]
    assert downs == [(64, 4), (64, 4), (64, 8), (64, 8), (128, 8), (128, 8)]
    # qwen3-30b decode: I/128 = 6, so split-K 4 is not a candidate
    dec = fp8_candidates(128, 8, 2048, 768, 1)
    assert [c.label for c in dec] == ["16"]
    assert sorted({d.down.split_k for d in dec[0].downs}) == [1, 2]


def test_fp8_winners_are_written_and_looked_up_as_tuned(tmp_path):
    """write_winners of the fp8 kernels: the float8_e4m3fn file of the local shape, read back
    by ConfigTable as tuned; merging into a file of the removed fp8 sweep keeps its entries
    and starts the history with its writer."""
    from moerun.backends.triton.tune import write_winners

    shape = SHAPES["deepseek-v3-ep8-local"]
    pts = plan_points([shape], [256, 2048], FP8, H200, tmp_path)
    cfg = fp8_candidates(32, 4, 7168, 2048, 256)[0]
    win = ExpertsConfig(block_m=cfg.block_m, gate_up=cfg.gate_ups[1], down=cfg.downs[2].down,
                        combine=cfg.downs[2].combine)
    old = fp8_default_config(32, 2048, 7168, 8192, 4)
    (tmp_path / EP8_FP8).write_text(json.dumps({
        "meta": {"written_by": "benchmarks/fp8_sweep.py", "command": "python3 "
                 "benchmarks/fp8_sweep.py --out $OUT", "date": "2026-12-01", "device": H200,
                 "dtype": "float8_e4m3fn"},
        "entries": {"8192": {"config": old.to_json(), "us": 9.0, "T": 8192}}}))
    paths = write_winners({EP8_FP8: {256: TunedEntry(config=win, us=700.0, timing="eager",
                                                     tokens=256, floor_us=350.0)}},
                          pts, tmp_path, dtype=FP8, device_name=H200, command="moerun tune "
                          "--dtype fp8", out=io.StringIO(), activation_dtype=BF16)
    assert [p.name for p in paths] == [EP8_FP8]
    loaded = load_config_file(paths[0])
    meta, entries = loaded.meta, loaded.entries
    assert entries == {256: win, 8192: old}
    assert meta["dtype"] == "float8_e4m3fn" and meta["activations"] == "bfloat16"
    assert meta["shape"]["S"] == 32 and meta["command"] == "moerun tune --dtype fp8"
    assert [h["command"] for h in meta["history"]] == [
        "python3 benchmarks/fp8_sweep.py --out $OUT", "moerun tune --dtype fp8"]
    assert meta["history"][0]["T"] == [8192] and meta["history"][1]["T"] == [256]
    raw = json.loads(paths[0].read_text())["entries"]["256"]
    assert raw["floor_over_time"] == 0.5 and raw["timing"] == "eager"

    table = ConfigTable(device_name=H200, config_dir=tmp_path)
    got = table.lookup(32, 2048, 7168, 200, 4, FP8)
    assert (got.config, got.source, got.entry_bucket) == (win, f"tuned ({EP8_FP8})", 256)
    assert table.lookup(32, 2048, 7168, 9000, 4, FP8).config == old
    # the bf16 key of the same shape is another file: not there, so the heuristic
    assert table.lookup(32, 2048, 7168, 200, 4, BF16).source == "heuristic"


_TUNE_FP8_ON_CPU = r'''
import json, sys, torch
from pathlib import Path
from moerun.backends.triton.configs import (ConfigTable, DownConfig, ExpertsConfig,
                                            GateUpConfig, config_file_name, fp8_default_config)
from moerun.backends.triton.tune import run_points, write_winners
from moerun.backends.triton.tune_plan import FP8, CandidateSet, DownChoice, TunePoint
from moerun.bench.ceilings import Ceilings
from moerun.bench.shapes import parse_shape_spec

out_dir = Path(sys.argv[1])
shape = parse_shape_spec("4:2:128:128")
# a decode set (activation-dtype intermediate) and a prefill set with the fp8 intermediate
g16 = GateUpConfig(block_n=32, block_k=128, num_stages=3)
d16 = DownConfig(block_n=64, block_k=128, num_stages=3)
g64 = GateUpConfig(block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=2)
d64 = DownConfig(block_n=128, block_k=128, group_m=8, num_stages=2)
sets = (CandidateSet(block_m=16, gate_ups=(g16,), downs=(DownChoice(down=d16, combine="atomic"),)),
        CandidateSet(block_m=64, gate_ups=(g64,), downs=(DownChoice(down=d64, combine="reduce"),),
                     fp8_intermediate=True))
pt = TunePoint(shape=shape, tokens=3, bucket=4, mode="graph",
               incumbent=fp8_default_config(4, 128, 128, 4, 2), incumbent_source="heuristic",
               candidate_sets=sets, file_name=config_file_name(4, 128, 128, FP8, "cpu"))
ceilings = Ceilings(read_bw=1e10, copy_bw=1e10, flops=1e11)
winners = run_points([pt], device=torch.device("cpu"), dtype=FP8, ceilings=ceilings,
                     budget_s=600, out=sys.stderr, fp8_rate=2e11,
                     activation_dtype=torch.float16)
paths = write_winners(winners, [pt], out_dir, dtype=FP8, device_name="cpu", command="test",
                      out=sys.stderr, activation_dtype=torch.float16)
entry = winners[pt.file_name][4]
choice = ConfigTable(device_name="cpu", config_dir=out_dir).lookup(4, 128, 128, 3, 2, FP8)
timed = [pt.incumbent.key()] + [ExpertsConfig(block_m=cs.block_m, gate_up=cs.gate_ups[0],
                                              down=cs.downs[0].down,
                                              combine=cs.downs[0].combine).key() for cs in sets]
print(json.dumps({"files": [p.name for p in paths], "timing": entry.timing, "us": entry.us,
                  "floor_us": entry.floor_us, "config": entry.config.key(), "timed": timed,
                  "looked_up": choice.config.key(), "source": choice.source,
                  "meta": json.loads(paths[0].read_text())["meta"]}))
'''


def test_fp8_tune_loop_runs_under_the_interpreter_and_its_file_is_used(tmp_path):
    """The fp8 timing loop on a CPU (Triton interpreter, fp16 activations, eager): every
    candidate set and the incumbent time the layer's call, a winner among them is written
    to the float8_e4m3fn file with the fp8 floor, and the lookup then uses it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", _TUNE_FP8_ON_CPU, str(tmp_path)],
                          check=False, capture_output=True, text=True, timeout=300, env=env,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    name = "S4_N128_K128_float8_e4m3fn_cpu.json"
    assert got["files"] == [name]
    assert got["timing"] == "eager" and got["us"] > 0
    assert got["config"] in got["timed"]
    assert got["looked_up"] == got["config"] and got["source"] == f"tuned ({name})"
    assert got["meta"]["dtype"] == "float8_e4m3fn" and got["meta"]["activations"] == "float16"
    # every timed config shows in the log: both sets' gate/up tiles and whole calls
    log = proc.stderr
    assert "gate_up m16 n32k128" in log and "gate_up m64f8 n128k128" in log
    assert all(k in log for k in got["timed"])
    # fp8 floor, T=3 k=2, H=I=128: 2..6 experts hit; bytes hit*3*128*128 (1 B/element) plus
    # the fp32 scales hit*3*4 plus 4*3*128 over 1e10 B/s = 5.1 .. 14.9 µs, above the
    # 2*3*2*3*128*128 / 2e11 = 2.9 µs of compute
    lo = (2 * (3 * 128 * 128 + 12) + 4 * 3 * 128) / 1e10 * 1e6
    hi = (6 * (3 * 128 * 128 + 12) + 4 * 3 * 128) / 1e10 * 1e6
    assert lo - 1e-9 <= got["floor_us"] <= hi + 1e-9


def test_an_empty_config_dir_variable_means_the_shipped_files(monkeypatch):
    """``MOERUN_TRITON_CONFIG_DIR=`` (empty, as ``VAR= cmd`` leaves it in a shell script) reads
    the shipped files; before, it was taken as the current directory, where no file was
    found, and every call ran heuristic configs."""
    from moerun.backends.triton.configs import CONFIG_DIR, ConfigTable

    monkeypatch.setenv("MOERUN_TRITON_CONFIG_DIR", "")
    table = ConfigTable("NVIDIA H200")
    assert table.config_dir == str(CONFIG_DIR)
    assert table.lookup(8, 14336, 4096, 1024, 2, torch.bfloat16).source.startswith("tuned (")
    monkeypatch.setenv("MOERUN_TRITON_CONFIG_DIR", "/nonexistent")
    assert ConfigTable("NVIDIA H200").lookup(8, 14336, 4096, 1024, 2,
                                             torch.bfloat16).source == "heuristic"
