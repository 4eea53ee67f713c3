"""The warp-specialized Gluon fp8 kernels (``ExpertsConfig.kernel == "ws"``, ``fp8_ws.py``):
the config rule on the CPU; the kernels against DESIGN 11a's reference and the unquantized
fp32 block, the fallback, and graph capture on an sm90 GPU (``gpu``)."""

from __future__ import annotations

import pytest
import torch

from tests.interp_worker import rel
from tests.test_triton_fp8 import _fp32_moe, _problem


def _ws_config(**kw):
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig

    args = dict(block_m=128, gate_up=GateUpConfig(block_n=64, block_k=128, num_stages=4,
                                                  num_warps=4),
                down=DownConfig(block_n=128, block_k=128, num_stages=4, num_warps=4),
                combine="reduce", kernel="ws")
    args.update(kw)
    return ExpertsConfig(**args)


def test_ws_config_rule_and_json_round_trip():
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig

    cfg = _ws_config()
    assert cfg.key().endswith("|ws")
    assert cfg.to_json()["kernel"] == "ws"
    assert ExpertsConfig.from_json(cfg.to_json()) == cfg
    bad = [dict(block_m=64), dict(combine="atomic"),
           dict(gate_up=GateUpConfig(block_n=128, block_k=128)),
           dict(down=DownConfig(block_n=64, block_k=128)),
           dict(gate_up=GateUpConfig(block_n=64, block_k=128, paired=True))]
    for kw in bad:
        with pytest.raises(ValueError, match="kernel='ws' needs block_m=128"):
            _ws_config(**kw)


def test_shipped_ws_entries_are_the_compute_bound_fp8_buckets():
    """Only T=8192 entries of H200 fp8 files use the ws kernels (measured there, RESULTS)."""
    from moerun.backends.triton.configs import CONFIG_DIR, load_config_file

    seen = []
    for f in sorted(CONFIG_DIR.glob("*.json")):
        meta, entries = load_config_file(f)
        for bucket, cfg in entries.items():
            if cfg.kernel == "ws":
                assert meta["dtype"] == "float8_e4m3fn" and meta["device"] == "NVIDIA H200", f
                assert bucket == 8192, (f, bucket)
                seen.append(meta["shape"]["name"])
    assert sorted(seen) == ["deepseek-v3", "mixtral8x7b", "qwen3-235b-a22b"]


def test_ws_falls_back_to_the_grouped_kernels_off_sm90():
    """On a device the Gluon kernels do not run on (here: the CPU), a ws config is the grouped
    fp8 path's tiles: ``_ws_supported`` says no without touching CUDA."""
    from moerun.backends.triton.fp8 import _ws_supported

    assert not _ws_supported(torch.device("cpu"))


def _sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU")
@pytest.mark.parametrize("m,k,s,h,i", [(333, 2, 8, 512, 384), (20, 4, 64, 256, 256),
                                       (1500, 8, 16, 384, 256)])
def test_ws_kernels_meet_both_bars(m, k, s, h, i):
    from moerun.backends.triton.fp8 import quantize_rows_fp8, run_experts_fp8
    from moerun.quant import QuantConfig, dequantize_weight_blocks, reference_fp8_moe

    x, w13, s13, w2, s2, weights, ids = _problem(m, k, s, h, i, seed=5, device="cuda")
    xb = x.bfloat16()
    ref = reference_fp8_moe(xb, w13, s13, w2, s2, weights, ids, QuantConfig(),
                            out_dtype=torch.bfloat16)
    unq = _fp32_moe(x.cpu(), dequantize_weight_blocks(w13, s13).cpu(),
                    dequantize_weight_blocks(w2, s2).cpu(), weights.cpu(), ids.cpu())
    cfg = _ws_config()
    outs = []
    for xin in (xb, quantize_rows_fp8(xb)):
        out = run_experts_fp8(xin, w13, w2, s13, s2, weights, ids, cfg, torch.bfloat16)
        assert out.dtype == torch.bfloat16 and out.shape == (m, h)
        assert rel(out, ref) <= 1e-2
        assert rel(out.cpu(), unq) <= 6e-2
        if m > 3:
            assert (out[2] == 0).all()  # the row with no local pair
        outs.append(out)
    assert torch.equal(outs[0], outs[1])  # same quantization in the kernel and before it
    # the grouped kernels with the same tiles (the fallback) agree within the bar too
    grouped = run_experts_fp8(xb, w13, w2, s13, s2, weights, ids,
                              _ws_config(kernel="grouped"), torch.bfloat16)
    assert rel(grouped, ref) <= 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU")
def test_ws_kernels_capture_and_replay():
    from moerun.backends.triton.fp8 import run_experts_fp8

    x, w13, s13, w2, s2, weights, ids = _problem(300, 4, 16, 512, 256, seed=8, device="cuda")
    xb = x.bfloat16()
    cfg = _ws_config()
    run_experts_fp8(xb, w13, w2, s13, s2, weights, ids, cfg, torch.bfloat16)  # compile
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = run_experts_fp8(xb, w13, w2, s13, s2, weights, ids, cfg, torch.bfloat16)
    x2, *_, w_2, ids2 = _problem(300, 4, 16, 512, 256, seed=9, device="cuda")
    xb.copy_(x2.bfloat16())
    weights.copy_(w_2)
    ids.copy_(ids2)
    g.replay()
    want = run_experts_fp8(xb, w13, w2, s13, s2, weights, ids, cfg, torch.bfloat16)
    torch.cuda.synchronize()
    assert torch.equal(out, want)


def test_tune_plans_ws_candidates_at_prefill_fp8_points(tmp_path):
    """``moerun tune --dtype fp8`` times the ws configs as whole calls where an expert gets
    128 rows or more on average (mixtral T=1024: 256; qwen3-235b T=1024: 64), compiles them,
    and plans none for bf16."""
    from moerun.backends.triton.tune_plan import FP8, compile_configs, plan_points
    from moerun.bench.shapes import parse_shapes

    mix, qwen = parse_shapes("mixtral8x7b,qwen3-235b-a22b")
    pts = {(p.shape.name, p.tokens): p
           for p in plan_points([mix, qwen], [16, 1024, 8192], FP8, "NVIDIA H200", tmp_path)}
    for key, want in {("mixtral8x7b", 16): 0, ("mixtral8x7b", 1024): 4,
                      ("mixtral8x7b", 8192): 4, ("qwen3-235b-a22b", 1024): 0,
                      ("qwen3-235b-a22b", 8192): 4}.items():
        ws = [c for c in pts[key].persistent if c.kernel == "ws"]
        assert len(ws) == want == len(pts[key].persistent), key
        assert all(c in compile_configs(pts[key]) for c in ws)
    stages = {(c.gate_up.num_stages, c.down.num_stages, c.gate_up.group_m)
              for c in pts[("mixtral8x7b", 8192)].persistent}
    assert (4, 4, 8) in stages  # the shipped entries' form is among them
    bf16 = plan_points([mix], [8192], torch.bfloat16, "NVIDIA H200", tmp_path)
    assert not any(c.kernel == "ws" for c in bf16[0].persistent)


def test_ws_call_checks_its_operands_before_any_launch():
    """Bad scales or weights are a ValueError naming the argument, raised on the host before
    anything runs (so on a CPU too)."""
    from moerun.backends.triton.fp8_ws import run_experts_fp8_ws

    x, w13, s13, w2, s2, weights, ids = _problem(8, 2, 4, 256, 128, seed=1)
    kw = dict(gate_up_stages=4, down_stages=4, group_m=8, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="w13_scale"):
        run_experts_fp8_ws(x, w13, w2, s13[:, :1], s2, weights, ids, **kw)
    with pytest.raises(ValueError, match="w2_scale"):
        run_experts_fp8_ws(x, w13, w2, s13, s2[:, :, :0], weights, ids, **kw)
    with pytest.raises(ValueError, match="w2 "):
        run_experts_fp8_ws(x, w13, w2.float(), s13, s2, weights, ids, **kw)
    with pytest.raises(ValueError, match="out_dtype"):
        run_experts_fp8_ws(x, w13, w2, s13, s2, weights, ids,
                           **(kw | dict(out_dtype=torch.float32)))
