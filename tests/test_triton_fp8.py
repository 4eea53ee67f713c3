"""The fp8 block-scaled Triton kernels (``moerun/backends/triton/fp8.py``) against the torch
definitions of ``moerun.quant``: under the Triton interpreter on CPU (one subprocess started
with ``TRITON_INTERPRET=1``; this file run as a script is that worker) and on CUDA (``gpu``).

References: ``reference_fp8_moe`` (DESIGN 11a: dequantized weights applied to identically
quantized activations, fp32) and, independently, an fp32 MoE written out below with the
dequantized weights and unquantized activations (bound 6e-2: e4m3 rounding of both GEMM
inputs).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.interp_worker import emit, rel, rows_of, run_worker, value_errors

ROOT = Path(__file__).resolve().parents[1]


def _fp32_moe(x, w13, w2, weights, ids):
    """fp64 ``sum_j w * (silu(x Wg^T) * (x Wu^T)) W2^T`` over ids >= 0: the bench's upcast
    reference (``moerun.bench.inputs.reference_rows``), which shares no code with the kernels."""
    from moerun.bench.inputs import reference_rows

    return reference_rows(x, w13, w2, weights, ids, acc=torch.float64)


def _problem(m, k, s, h, i, seed, device="cpu", empty_row=True):
    from moerun.quant import quantize_weight_blocks

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g)
    x[0] *= 30.0  # a row with a much larger range than the rest
    w13, s13 = quantize_weight_blocks(torch.randn(s, 2 * i, h, generator=g) / h ** 0.5)
    w2, s2 = quantize_weight_blocks(torch.randn(s, h, i, generator=g) / i ** 0.5)
    ids = torch.stack([torch.randperm(s, generator=g)[:k] for _ in range(m)]).int()
    if m > 2:
        ids[1, -1] = -1  # one pair on another rank
    if empty_row and m > 3:
        ids[2] = -1  # a padded row: no pair at all
    weights = torch.rand(m, k, generator=g)
    return [t.to(device) for t in (x, w13, s13, w2, s2, weights, ids)]


# ---------------------------------------------------------------- the worker (subprocess)
def _worker() -> None:  # pragma: no cover -- runs in the subprocess
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig
    from moerun.backends.triton.fp8 import quantize_rows_fp8, run_experts_fp8
    from moerun.quant import QuantConfig, dequantize_weight_blocks, quantize_rows, \
        reference_fp8_moe

    # quantize: codes and scales equal the torch definition bit for bit
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 384, generator=g) * torch.tensor([1e-3, 1.0, 50.0, 1.0, 7.0])[:, None]
    x[3] = 0.0
    for dtype in (torch.float32, torch.float16):
        xd = x.to(dtype)
        a, b = quantize_rows_fp8(xd), quantize_rows(xd)
        emit(kind="quant", name=str(dtype),
             codes_equal=bool(torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))),
             scales_equal=bool(torch.equal(a.scale, b.scale)))
    emit(kind="quant_empty", shape=list(quantize_rows_fp8(x[:0]).data.shape))

    # the ws path's gather: token rows of the quantized activations in aligned order
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.fp8_quant import gather_rows_fp8

    qx = quantize_rows(torch.randn(13, 384, generator=g))
    gids = torch.randint(0, 5, (13, 3), generator=g, dtype=torch.int32)
    gids[4, 1] = -1  # an excluded pair
    al = moe_align(gids, 5, 16)
    gathered = gather_rows_fp8(qx, al, 3)
    got, pair_rows = gathered.rows, gathered.pair_rows
    n_post = int(al.num_post[0])
    want_d = torch.zeros(n_post, 384, dtype=torch.uint8)
    want_s = torch.zeros(n_post, 3)
    want_rows = {}
    for row, pair in enumerate(al.sorted_ids[:n_post].tolist()):
        if pair < 39:
            want_d[row] = qx.data[pair // 3].view(torch.uint8)
            want_s[row] = qx.scale[pair // 3]
            want_rows[pair] = row
    emit(kind="gather", rows=n_post, padded=int((al.sorted_ids[:n_post] == 39).sum()),
         codes_equal=bool(torch.equal(got.data[:n_post].view(torch.uint8), want_d)),
         scales_equal=bool(torch.equal(got.scale[:n_post], want_s)),
         mapped=len(want_rows),
         rows_equal=all(int(pair_rows[p]) == r for p, r in want_rows.items()))

    cases = [
        # name, M, K, S, H, I, cfg
        ("atomic-bm16", 9, 2, 4, 256, 256, ExpertsConfig(
            block_m=16, gate_up=GateUpConfig(block_n=64, block_k=128),
            down=DownConfig(block_n=64, block_k=128), combine="atomic")),
        ("atomic-splitk2", 7, 3, 5, 128, 256, ExpertsConfig(
            block_m=16, gate_up=GateUpConfig(block_n=32, block_k=128),
            down=DownConfig(block_n=128, block_k=128, split_k=2), combine="atomic")),
        ("reduce-bm32-groupm2", 21, 2, 3, 256, 128, ExpertsConfig(
            block_m=32, gate_up=GateUpConfig(block_n=128, block_k=128, group_m=2),
            down=DownConfig(block_n=64, block_k=128, group_m=2), combine="reduce")),
        # block_m >= 64: x quantized by its own kernel first; gate/up n=128 writes fp8 act
        ("prefill-fp8-act", 40, 2, 3, 256, 256, ExpertsConfig(
            block_m=64, gate_up=GateUpConfig(block_n=128, block_k=128, group_m=2),
            down=DownConfig(block_n=64, block_k=128), combine="reduce")),
        ("prefill-bf16-act-atomic", 40, 2, 3, 256, 384, ExpertsConfig(
            block_m=64, gate_up=GateUpConfig(block_n=64, block_k=128),
            down=DownConfig(block_n=128, block_k=128, split_k=3), combine="atomic")),
        # paired gate/up tiles: one dot over interleaved gate/up rows; at block_m >= 64 the
        # intermediate is quantized by its own launch, below it in the down kernel's loads
        ("prefill-paired", 40, 2, 3, 256, 256, ExpertsConfig(
            block_m=64, gate_up=GateUpConfig(block_n=128, block_k=128, group_m=2, paired=True),
            down=DownConfig(block_n=64, block_k=128), combine="reduce")),
        ("prefill-paired-n64-atomic", 40, 3, 4, 128, 384, ExpertsConfig(
            block_m=64, gate_up=GateUpConfig(block_n=64, block_k=128, paired=True),
            down=DownConfig(block_n=128, block_k=128, split_k=3), combine="atomic")),
        ("decode-paired", 9, 2, 4, 256, 256, ExpertsConfig(
            block_m=16, gate_up=GateUpConfig(block_n=32, block_k=128, paired=True),
            down=DownConfig(block_n=64, block_k=128), combine="atomic")),
        ("topk1-one-slot", 4, 1, 1, 128, 128, ExpertsConfig(
            block_m=16, gate_up=GateUpConfig(block_n=64, block_k=128),
            down=DownConfig(block_n=64, block_k=128), combine="reduce")),
        # the direct decode path (fp8_direct.py): no alignment; per-token and per-pair down
        ("direct-per-token", 5, 3, 4, 256, 256, ExpertsConfig(
            block_m=16, gate_up=GateUpConfig(block_n=64, block_k=128),
            down=DownConfig(block_n=32, block_k=128), combine="reduce", kernel="direct")),
        ("direct-per-pair", 4, 2, 3, 128, 384, ExpertsConfig(
            block_m=16, gate_up=GateUpConfig(block_n=128, block_k=128),
            down=DownConfig(block_n=64, block_k=128), combine="atomic", kernel="direct")),
        # ExpertsConfig.swap_ab, grouped kernels at 16/32-row tiles: W x^T, one weight block
        # per tile (scalar scale) and tiles of two blocks (a scale per weight row)
        ("swap-bm16-atomic", 9, 2, 4, 256, 256, ExpertsConfig(
            block_m=16, gate_up=GateUpConfig(block_n=64, block_k=128),
            down=DownConfig(block_n=64, block_k=128), combine="atomic", swap_ab=True)),
        ("swap-bm32-n256-splitk2", 21, 2, 3, 256, 256, ExpertsConfig(
            block_m=32, gate_up=GateUpConfig(block_n=256, block_k=128),
            down=DownConfig(block_n=256, block_k=128, split_k=2), combine="atomic",
            swap_ab=True)),
        # ExpertsConfig.swap_ab: both launches as W x^T (the weight rows on the MMA's M side)
        ("direct-swap-per-token", 5, 3, 4, 256, 256, ExpertsConfig(
            block_m=16, gate_up=GateUpConfig(block_n=64, block_k=128),
            down=DownConfig(block_n=64, block_k=128), combine="reduce", kernel="direct",
            swap_ab=True)),
        ("direct-swap-per-pair", 4, 2, 3, 128, 384, ExpertsConfig(
            block_m=16, gate_up=GateUpConfig(block_n=128, block_k=128),
            down=DownConfig(block_n=64, block_k=128), combine="atomic", kernel="direct",
            swap_ab=True)),
    ]
    for name, m, k, s, h, i, cfg in cases:
        x, w13, s13, w2, s2, weights, ids = _problem(m, k, s, h, i, seed=m * 7 + k)
        unq = _fp32_moe(x, dequantize_weight_blocks(w13, s13), dequantize_weight_blocks(w2, s2),
                        weights, ids)
        for out_dtype in (torch.float32, torch.float16):
            for pre in (False, True):
                xin = quantize_rows(x) if pre else x.to(out_dtype)
                ref = reference_fp8_moe(xin, w13, s13, w2, s2, weights, ids, QuantConfig(),
                                        out_dtype=out_dtype)
                out = run_experts_fp8(xin, w13, w2, s13, s2, weights, ids, cfg, out_dtype)
                emit(kind="experts", name=f"{name}/{out_dtype}/{'prequant' if pre else 'fused'}",
                     dtype=str(out_dtype), err_ref=rel(out, ref), err_unq=rel(out, unq),
                     out_dtype=str(out.dtype), shape=list(out.shape),
                     padded_row_zero=bool((out[2] == 0).all()) if m > 3 else True)

    # through the backend API and moerun.fused_experts (what the layer calls)
    import moerun
    from moerun.backends.triton.experts import TritonExperts
    from moerun.quant import ExpertQuant

    x, w13, s13, w2, s2, weights, ids = _problem(13, 2, 4, 256, 256, seed=5)
    eq = ExpertQuant(config=QuantConfig(), w13_scale=s13, w2_scale=s2, out_dtype=torch.float32)
    be = TritonExperts()
    q = be.quantize_rows(x, QuantConfig())
    ref = reference_fp8_moe(q, w13, s13, w2, s2, weights, ids, QuantConfig())
    out_be = be.run_experts(q, w13, w2, weights, ids, quant=eq)
    out_fn = moerun.fused_experts(x, w13, w2, weights, ids, quant=eq, backend="triton")
    emit(kind="api", err_backend=rel(out_be, ref), err_functional=rel(out_fn, ref),
         source=be.fp8_config_source(4, 256, 256, 13, 2),
         empty=list(be.run_experts(quantize_rows(x[:0]), w13, w2, weights[:0], ids[:0],
                                   quant=eq).shape))

    # the whole FP8 layer on one rank: the backend quantizes inside its kernels, so the
    # schedule has no `quantize` range, and the output meets DESIGN 11a's bound
    from moerun import ConfigurableMoE, MoEConfig
    from moerun.testing import make_case, reference_output, rel_err
    from traces import ScheduleRecorder

    for t in (9, 150):  # decode (block_m 16: in-register quantization) and prefill sizes
        lcfg = MoEConfig(num_experts=4, top_k=2, hidden_size=128, intermediate_size=128,
                         quant=QuantConfig())
        case = make_case(lcfg, t, seed=3)
        rec = ScheduleRecorder()
        with ConfigurableMoE(lcfg, backend="triton", recorder=rec) as layer:
            layer.load_weights(case.w13, case.w2, w13_scale=case.w13_scale,
                               w2_scale=case.w2_scale)
            out = layer(case.x, case.logits)
            emit(kind="layer", tokens=t, backend=layer.report.backend,
                 err=rel_err(out, reference_output(lcfg, case)),
                 phases=[e.phase for e in rec.events])

    # errors name the argument
    from moerun.backends.triton.align import moe_align
    from moerun.backends.triton.fp8 import gate_up_fp8

    x, w13, s13, w2, s2, weights, ids = _problem(4, 2, 3, 128, 128, seed=3)
    al = moe_align(ids, 3, 16)
    tile = GateUpConfig(block_n=64, block_k=128)
    from moerun.backends.triton.gate_up import gate_up

    paired = GateUpConfig(block_n=64, block_k=128, paired=True)
    from moerun.backends.triton.down import down_direct
    from moerun.backends.triton.fp8_direct import gate_up_fp8_direct

    act = torch.zeros(8, 128)
    emit(kind="errors", msgs=value_errors(
        lambda: quantize_rows_fp8(torch.randn(2, 100)),
        lambda: gate_up_fp8(x, w13, s13[:, :1], al, 2, tile, torch.float32),
        lambda: gate_up_fp8(x, w13.float(), s13, al, 2, tile, torch.float32),
        lambda: gate_up_fp8(x, w13, s13, al, 2, paired, torch.float32, fp8_out=True),
        lambda: gate_up_fp8(x, w13, s13, al, 2, GateUpConfig(block_n=16, block_k=128,
                                                             paired=True), torch.float32),
        lambda: gate_up(x, torch.randn(3, 256, 128), al, 2, paired),
        lambda: gate_up_fp8_direct(x, w13, s13, ids, GateUpConfig(block_n=256, block_k=128),
                                   torch.float32),
        lambda: down_direct(act, w2, ids, DownConfig(block_n=64, block_k=128), w2_scale=s2),
        lambda: down_direct(act, w2, ids, DownConfig(block_n=64, block_k=64), w2_scale=s2,
                            topk_weights=weights)))


@pytest.fixture(scope="module")
def report():
    return run_worker(__file__, timeout=240)


_rows = rows_of


def test_quantize_kernel_equals_torch_definition(report):
    rows = _rows(report, "quant")
    assert len(rows) == 2
    assert all(r["codes_equal"] and r["scales_equal"] for r in rows), rows
    assert _rows(report, "quant_empty")[0]["shape"] == [0, 384]


def test_gather_kernel_puts_token_rows_in_aligned_order(report):
    """``gather_rows_fp8`` (the ws path's A operand): row r is token ``sorted_ids[r] // K``'s
    codes and scales, padding rows zero, and each placed pair's row is in the map, against a
    loop over the alignment."""
    (row,) = _rows(report, "gather")
    assert row["padded"] > 0 and row["rows"] % 16 == 0
    assert row["codes_equal"] and row["scales_equal"], row
    assert row["mapped"] == 38 and row["rows_equal"], row  # 39 pairs, one excluded


def test_fp8_experts_match_reference(report):
    rows = _rows(report, "experts")
    assert len(rows) == 60
    assert sum(r["name"].startswith("direct") for r in rows) == 16
    assert sum(r["name"].startswith("direct-swap") for r in rows) == 8
    assert sum(r["name"].startswith("swap-") for r in rows) == 8
    for r in rows:
        # the same math as the reference up to summation order (fp16: and the rounding of
        # the fp32 sums to fp16)
        bound = 1e-5 if r["dtype"] == "torch.float32" else 2e-3
        assert r["err_ref"] <= bound, r
        assert r["err_unq"] <= 6e-2, r
        assert r["out_dtype"] == r["dtype"] and r["padded_row_zero"], r


def test_fp8_through_backend_and_fused_experts(report):
    r = _rows(report, "api")[0]
    assert r["err_backend"] <= 1e-5 and r["err_functional"] <= 1e-5, r
    assert r["source"] == "heuristic" and r["empty"] == [0, 256], r


def test_fp8_layer_on_one_rank_quantizes_in_its_own_range(report):
    """TritonExperts does not fuse the activation quantization (measured slower, DECISIONS
    "Who quantizes x"), so its one-rank layer quantizes in a ``quantize`` range right before
    the (empty) dispatch, as a multi-rank layer does."""
    rows = _rows(report, "layer")
    assert [r["tokens"] for r in rows] == [9, 150]
    for r in rows:
        assert r["backend"] == "triton" and r["err"] <= 1e-5, r  # fp32 out: same math
        assert r["phases"] == ["chunk", "route", "quantize", "dispatch", "dispatch.wait",
                               "experts", "combine", "combine.wait"], r


def test_fp8_kernel_errors_name_the_argument(report):
    msgs = _rows(report, "errors")[0]["msgs"]
    assert msgs[0] is not None and "x.shape[1]=100" in msgs[0] and "128" in msgs[0]
    assert msgs[1] is not None and "w13_scale" in msgs[1]
    assert msgs[2] is not None and "w13" in msgs[2] and "float8_e4m3fn" in msgs[2]
    assert msgs[3] is not None and "paired" in msgs[3] and "quantize_rows_fp8" in msgs[3]
    assert msgs[4] is not None and "block_n=16" in msgs[4]
    assert msgs[5] is not None and "paired" in msgs[5] and "fp8" in msgs[5]
    assert msgs[6] is not None and "block_n=256" in msgs[6] and "direct" in msgs[6]
    assert msgs[7] is not None and "topk_weights" in msgs[7]
    assert msgs[8] is not None and "block_k=64" in msgs[8] and "block_k=128" in msgs[8]


# ---------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("bm,gu_n,combine,split,paired,swap", [
    (16, 64, "atomic", 1, False, False), (16, 64, "atomic", 2, False, False),
    (64, 64, "reduce", 1, False, False), (64, 128, "atomic", 1, False, False),
    (128, 128, "reduce", 1, False, False), (128, 128, "reduce", 1, True, False),
    (64, 256, "reduce", 1, True, False), (16, 64, "atomic", 2, True, False),
    # ExpertsConfig.swap_ab at 16/32-row tiles: e4m3 wgmmas, one and two weight blocks a tile
    (16, 64, "atomic", 2, False, True), (32, 256, "reduce", 1, False, True)])
def test_fp8_kernels_on_cuda(bm, gu_n, combine, split, paired, swap):
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig
    from moerun.backends.triton.fp8 import quantize_rows_fp8, run_experts_fp8
    from moerun.quant import QuantConfig, dequantize_weight_blocks, quantize_rows, \
        reference_fp8_moe

    x, w13, s13, w2, s2, weights, ids = _problem(67, 4, 8, 512, 256, seed=11, device="cuda")
    xb = x.bfloat16()
    a, b = quantize_rows_fp8(xb), quantize_rows(xb)
    assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))
    assert torch.equal(a.scale, b.scale)
    cfg = ExpertsConfig(block_m=bm,
                        gate_up=GateUpConfig(block_n=gu_n, block_k=128, num_stages=3,
                                             num_warps=8 if bm > 64 or gu_n > 128 else 4,
                                             paired=paired),
                        # 256 columns: two weight blocks per tile (the per-column scale
                        # path); 64: one block (the scalar scale path)
                        down=DownConfig(block_n=256 if gu_n == 256 else 64, block_k=128,
                                        split_k=split, num_stages=3,
                                        num_warps=8 if gu_n == 256 else 4),
                        combine=combine, swap_ab=swap)
    ref = reference_fp8_moe(xb, w13, s13, w2, s2, weights, ids, QuantConfig(),
                            out_dtype=torch.bfloat16)
    unq = _fp32_moe(x.cpu(), dequantize_weight_blocks(w13, s13).cpu(),
                    dequantize_weight_blocks(w2, s2).cpu(), weights.cpu(), ids.cpu())
    for xin in (xb, a):
        out = run_experts_fp8(xin, w13, w2, s13, s2, weights, ids, cfg, torch.bfloat16)
        assert out.dtype == torch.bfloat16
        assert rel(out, ref) <= 1e-2
        assert rel(out.cpu(), unq) <= 6e-2
        assert (out[2] == 0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("combine, gu_n, dn_n, swap", [
    ("reduce", 64, 32, False), ("atomic", 128, 64, False), ("atomic", 32, 128, False),
    ("reduce", 128, 16, False), ("atomic", 64, 64, True), ("reduce", 128, 64, True),
    ("atomic", 128, 128, True)])
def test_fp8_direct_on_cuda(combine, gu_n, dn_n, swap):
    """The fp8 direct decode path (``fp8_direct.py``) at T = 1..4 on CUDA against DESIGN
    11a's reference (same math: 1e-2 in bf16) and the unquantized fp32 MoE (6e-2), both
    activation forms; then captured in a CUDA graph and replayed with new routings copied
    into the captured buffers (the per-pair form's counters are zeroed in every replay)."""
    from moerun.backends.triton.configs import DownConfig, ExpertsConfig, GateUpConfig
    from moerun.backends.triton.fp8 import quantize_rows_fp8, run_experts_fp8
    from moerun.quant import QuantConfig, dequantize_weight_blocks, reference_fp8_moe

    cfg = ExpertsConfig(block_m=16, gate_up=GateUpConfig(block_n=gu_n, block_k=128),
                        down=DownConfig(block_n=dn_n, block_k=128), combine=combine,
                        kernel="direct", swap_ab=swap)
    for m in (1, 3, 4):
        x, w13, s13, w2, s2, weights, ids = _problem(m, 8, 64, 1024, 512, seed=31 + m,
                                                     device="cuda")
        xb = x.bfloat16()
        ref = reference_fp8_moe(xb, w13, s13, w2, s2, weights, ids, QuantConfig(),
                                out_dtype=torch.bfloat16)
        unq = _fp32_moe(x.cpu(), dequantize_weight_blocks(w13, s13).cpu(),
                        dequantize_weight_blocks(w2, s2).cpu(), weights.cpu(), ids.cpu())
        for xin in (xb, quantize_rows_fp8(xb)):
            out = run_experts_fp8(xin, w13, w2, s13, s2, weights, ids, cfg, torch.bfloat16)
            assert out.dtype == torch.bfloat16 and rel(out, ref) <= 1e-2, (m, rel(out, ref))
            assert rel(out.cpu(), unq) <= 6e-2
            if m > 3:
                assert (out[2] == 0).all()  # a token with no pair
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(2, 1024, generator=g).cuda().bfloat16() for _ in range(3)]
    idss = [torch.stack([torch.randperm(64, generator=g)[:8] for _ in range(2)]).int().cuda()
            for _ in range(3)]
    wss = [torch.rand(2, 8, generator=g).cuda() for _ in range(3)]
    bx, bid, bw = xs[0].clone(), idss[0].clone(), wss[0].clone()
    run_experts_fp8(bx, w13, w2, s13, s2, bw, bid, cfg, torch.bfloat16)  # compile first
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run_experts_fp8(bx, w13, w2, s13, s2, bw, bid, cfg, torch.bfloat16)
    for xr, ir, wr in zip(xs, idss, wss, strict=True):
        bx.copy_(xr)
        bid.copy_(ir)
        bw.copy_(wr)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference_fp8_moe(xr, w13, s13, w2, s2, wr, ir, QuantConfig(),
                                out_dtype=torch.bfloat16)
        assert rel(out, ref) <= 1e-2


if __name__ == "__main__":
    _worker()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [5, 300])
def test_fp8_layer_on_cuda_meets_both_bars_and_captures(tokens):
    """The whole FP8 layer on one GPU picks TritonExperts, meets both issue 12 bars against
    DESIGN 11a's reference and the unquantized fp64 layer, and replays a CUDA graph equal to
    eager (bf16, a shared expert, decode and prefill sizes)."""
    from moerun import ConfigurableMoE, MoEConfig, QuantConfig
    from moerun.testing import make_case, reference_output, rel_err, unquantized_reference

    cfg = MoEConfig(num_experts=16, top_k=4, hidden_size=512, intermediate_size=256,
                    dtype=torch.bfloat16, quant=QuantConfig(), shared_intermediate_size=256,
                    check_inputs=False)
    case = make_case(cfg, tokens, seed=21)
    with ConfigurableMoE(cfg, device="cuda") as layer:
        assert layer.report.backend == "triton", layer.report
        layer.load_weights(case.w13, case.w2, case.shared, w13_scale=case.w13_scale,
                           w2_scale=case.w2_scale)
        x, logits = case.x.cuda(), case.logits.cuda()
        out = layer(x, logits)
        assert rel_err(out.cpu(), reference_output(cfg, case)) <= 3e-2
        assert rel_err(out.cpu(), unquantized_reference(cfg, case)) <= 6e-2
        layer(x, logits)  # warm-up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = layer(x, logits)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static, layer(x, logits))
