"""The dense shared-expert kernels (``moerun/backends/triton/dense.py``) against an fp64
SwiGLU MLP written out below: under the Triton interpreter on CPU (this file run as a script
is the ``TRITON_INTERPRET=1`` worker) and on CUDA (``gpu``), plus the layer that uses them.

The kernels round the intermediate and the shared output to x.dtype (as the torch form
does), so the bound is the dtype's rounding, not the summation order.
"""

from __future__ import annotations


import pytest
import torch

from tests.interp_worker import emit, rel, rows_of, run_worker, value_errors


def _mlp_add_fp64(x, w13, w2, routed):
    """fp64 ``(silu(x Wg^T) * (x Wu^T)) W2^T + routed``."""
    xd = x.double()
    inter = w13.shape[0] // 2
    gu = xd @ w13.double().t()
    return (torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]) @ w2.double().t() \
        + routed.double()



def _problem(t, h, i, dtype, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(2 * i, h, generator=g) * h ** -0.5
    w2 = torch.randn(h, i, generator=g) * i ** -0.5
    routed = torch.randn(t, h, generator=g)
    return [v.to(dtype).to(device) for v in (x, w13, w2, routed)]


# ---------------------------------------------------------------- the interpreter worker
def _worker() -> None:
    from moerun import ConfigurableMoE, MoEConfig
    from moerun.backends.triton.dense import DenseConfig, shared_mlp_add, shared_mlp_add_torch
    from moerun.backends.triton.experts import TritonExperts
    from moerun.shared_expert import SharedExpert
    from moerun.testing import make_case, reference_output, rel_err
    from traces import ScheduleRecorder

    configs = {"default": None,
               "gemv": DenseConfig(block_m=1, gate_up_n=8, down_n=16, block_k=64),
               "dot": DenseConfig(block_m=16, gate_up_n=16, down_n=32, block_k=64)}
    seed = 0
    for dtype in (torch.float32, torch.float16):
        for t in (0, 1, 3, 37):
            for h, i in ((128, 64), (96, 80)):  # (96, 80): K not a multiple of block_k
                for name, cfg in configs.items():
                    seed += 1
                    x, w13, w2, routed = _problem(t, h, i, dtype, seed)
                    routed_before = routed.clone()
                    y = shared_mlp_add(x, w13, w2, routed, cfg)
                    emit(kind="dense", dtype=str(dtype), t=t, h=h, i=i, cfg=name,
                         shape=list(y.shape), out_dtype=str(y.dtype),
                         err_fp64=rel(y, _mlp_add_fp64(x, w13, w2, routed)),
                         err_twin=rel(y, shared_mlp_add_torch(x, w13, w2, routed)),
                         routed_untouched=bool(torch.equal(routed, routed_before)))

    # silu * up as one launch, and the cuBLAS form around it (rows above MAX_DENSE_ROWS)
    from moerun.backends.triton.dense import shared_mlp_add_gemm, silu_mul, silu_mul_torch

    for dtype in (torch.float32, torch.float16):
        for t, i in ((0, 64), (1, 80), (37, 64), (3, 1500)):  # 1500: two programs per row
            seed += 1
            g = torch.Generator().manual_seed(seed)
            hh = (torch.randn(t, 2 * i, generator=g) * 3).to(dtype)
            got = silu_mul(hh)
            want = silu_mul_torch(hh.clone())
            hd = hh.double()
            emit(kind="silu", dtype=str(dtype), t=t, i=i, shape=list(got.shape),
                 out_dtype=str(got.dtype), err_twin=rel(got, want),
                 err_fp64=rel(got, torch.nn.functional.silu(hd[:, :i]) * hd[:, i:]))
        x, w13, w2, routed = _problem(21, 128, 64, dtype, seed)
        routed_before = routed.clone()
        y = shared_mlp_add_gemm(x, w13, w2, routed)
        se = SharedExpert(128, 64, gated=False, dtype=dtype)
        se.load(w13, w2, None)
        emit(kind="gemm_form", dtype=str(dtype), err_add_to=rel(y, se.add_to(routed, x)),
             err_fp64=rel(y, _mlp_add_fp64(x, w13, w2, routed)),
             routed_untouched=bool(torch.equal(routed, routed_before)),
             backend_err=rel(TritonExperts().shared_mlp_add(se, x, routed), y))
    emit(kind="errors_silu", msgs=value_errors(lambda: silu_mul(torch.randn(2, 5)),
                                               lambda: silu_mul(torch.randn(4, 6).t())))

    # the backend method: the kernels for an ungated expert, the torch form for a gated one
    backend = TritonExperts()
    for gated in (False, True):
        x, w13, w2, routed = _problem(5, 128, 64, torch.float32, 99)
        se = SharedExpert(128, 64, gated=gated, dtype=torch.float32)
        se.load(w13, w2, torch.randn(1, 128) if gated else None)
        y = backend.shared_mlp_add(se, x, routed)
        emit(kind="backend", gated=gated, err_add_to=rel(y, se.add_to(routed, x)),
             equal_add_to=bool(torch.equal(y, se.add_to(routed, x))))

    # errors name the argument
    x, w13, w2, routed = _problem(2, 128, 64, torch.float32, 5)
    emit(kind="errors", msgs=value_errors(
        lambda: shared_mlp_add(x, w13[:, :64], w2, routed),
        lambda: shared_mlp_add(x, w13, w2, routed[:, :64]),
        lambda: shared_mlp_add(x, w13.half(), w2, routed)))

    # the layer (TritonExperts + Triton router, a SEQUENTIAL shared expert): the one-rank path
    # and the general path (a recorder attached) against the fp64 reference
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=128, intermediate_size=64,
                    shared_intermediate_size=128, dtype=torch.float32)
    for t in (1, 6):
        case = make_case(cfg, t, seed=40 + t)
        outs = []
        for recorder in (None, ScheduleRecorder()):
            with ConfigurableMoE(cfg, recorder=recorder) as layer:
                layer.load_weights(case.w13, case.w2, case.shared)
                outs.append(layer(case.x, case.logits))
                backend_name = layer.report.backend
        emit(kind="layer", t=t, backend=backend_name,
             err=rel_err(outs[0], reference_output(cfg, case)),
             paths_equal=bool(torch.equal(outs[0], outs[1])))


@pytest.fixture(scope="module")
def report():
    return run_worker(__file__, timeout=240)


def test_dense_kernels_match_fp64(report):
    rows = rows_of(report, "dense")
    assert len(rows) == 2 * 4 * 2 * 3
    for r in rows:
        assert r["shape"] == [r["t"], r["h"]] and r["out_dtype"] == r["dtype"], r
        assert r["routed_untouched"], r
        fp32 = r["dtype"] == "torch.float32"
        # fp32: summation order only; fp16: the rounding of act and of the shared output
        assert r["err_fp64"] <= (1e-5 if fp32 else 2e-3), r
        assert r["err_twin"] <= (1e-5 if fp32 else 2e-3), r


def test_silu_mul_rounds_as_the_torch_form(report):
    rows = rows_of(report, "silu")
    assert len(rows) == 8
    for r in rows:
        assert r["shape"] == [r["t"], r["i"]] and r["out_dtype"] == r["dtype"], r
        fp32 = r["dtype"] == "torch.float32"
        # same two roundings as F.silu(gate).mul_(up); exp's last fp32 bit may differ
        assert r["err_twin"] <= (1e-6 if fp32 else 1e-3), r
        assert r["err_fp64"] <= (1e-6 if fp32 else 2e-3), r


def test_gemm_form_matches_the_torch_form(report):
    rows = rows_of(report, "gemm_form")
    assert len(rows) == 2
    for r in rows:
        fp32 = r["dtype"] == "torch.float32"
        assert r["routed_untouched"], r
        assert r["err_add_to"] <= (1e-6 if fp32 else 2e-3), r
        assert r["err_fp64"] <= (1e-5 if fp32 else 2e-3), r
        assert r["backend_err"] == 0.0, r  # 21 rows > MAX_DENSE_ROWS: the backend's form
    (errs,) = rows_of(report, "errors_silu")
    assert len(errs["msgs"]) == 2 and all("h (" in m for m in errs["msgs"]), errs


def test_backend_uses_kernels_only_for_the_ungated_expert(report):
    ungated, gated = sorted(rows_of(report, "backend"), key=lambda r: r["gated"])
    assert ungated["err_add_to"] <= 1e-5, ungated
    assert gated["equal_add_to"], gated  # the torch form itself


def test_dense_errors_name_the_argument(report):
    msgs = rows_of(report, "errors")[0]["msgs"]
    assert msgs[0] is not None and "w13" in msgs[0]
    assert msgs[1] is not None and "routed" in msgs[1]
    assert msgs[2] is not None and "float16" in msgs[2]


def test_layer_with_dense_shared_expert(report):
    rows = rows_of(report, "layer")
    assert len(rows) == 2
    for r in rows:
        assert r["backend"] == "triton", r
        assert r["err"] <= 1e-5 and r["paths_equal"], r


# ---------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [1, 16, 100])
def test_dense_kernels_on_cuda_bf16_and_capture(tokens):
    """bf16 on the GPU against fp64 (bound: bf16 rounding of act and of the shared output),
    and a CUDA-graph replay equal to eager."""
    from moerun.backends.triton.dense import shared_mlp_add

    x, w13, w2, routed = _problem(tokens, 2048, 1024, torch.bfloat16, 7, device="cuda")
    y = shared_mlp_add(x, w13, w2, routed)
    assert rel(y.cpu(), _mlp_add_fp64(x.cpu(), w13.cpu(), w2.cpu(), routed.cpu())) <= 1e-2
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = shared_mlp_add(x, w13, w2, routed)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, y)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [17, 1024])
def test_silu_mul_and_gemm_form_on_cuda_bf16(tokens):
    """bf16 on the GPU: ``silu_mul`` rounds as ``F.silu(gate).mul_(up)`` (equal but for
    exp's last fp32 bit: at most one bf16 ulp, rarely), and the cuBLAS form equals the torch
    form ``SharedExpert.add_to`` to the same rounding."""
    from moerun.backends.triton.dense import shared_mlp_add_gemm, silu_mul, silu_mul_torch
    from moerun.shared_expert import SharedExpert

    g = torch.Generator().manual_seed(tokens)
    hh = (torch.randn(tokens, 4096, generator=g) * 3).to(torch.bfloat16).cuda()
    got, want = silu_mul(hh).float(), silu_mul_torch(hh.clone()).float()
    assert ((got - want).abs() <= want.abs() * 2 ** -7 + 1e-30).all()
    assert (got == want).float().mean() >= 0.99
    x, w13, w2, routed = _problem(tokens, 2048, 1024, torch.bfloat16, 9, device="cuda")
    se = SharedExpert(2048, 1024, gated=False, dtype=torch.bfloat16, device="cuda")
    se.load(w13, w2, None)
    y, ref = shared_mlp_add_gemm(x, w13, w2, routed), se.add_to(routed, x)
    assert (y == ref).float().mean() >= 0.98
    assert rel(y.cpu(), _mlp_add_fp64(x.cpu(), w13.cpu(), w2.cpu(), routed.cpu())) <= 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [1, 64, 300])
def test_layer_shared_expert_on_cuda(tokens):
    """A DeepSeek-like bf16 layer on one GPU (SEQUENTIAL shared expert: the dense kernels up
    to MAX_DENSE_ROWS, cuBLAS above) against fp64, on the one-rank path and the general one."""
    from moerun import ConfigurableMoE, MoEConfig, RoutingConfig, RoutingMethod
    from moerun.testing import make_case, reference_output, rel_err
    from traces import ScheduleRecorder

    cfg = MoEConfig(num_experts=32, top_k=4, hidden_size=1024, intermediate_size=256,
                    shared_intermediate_size=512, dtype=torch.bfloat16,
                    routing=RoutingConfig(method=RoutingMethod.NOAUX_TC, num_expert_group=4,
                                          topk_group=2, routed_scaling_factor=2.5),
                    check_inputs=False)
    case = make_case(cfg, tokens, seed=3)
    ref = reference_output(cfg, case)
    outs = []
    for recorder in (None, ScheduleRecorder()):
        with ConfigurableMoE(cfg, device="cuda", recorder=recorder,
                             shared_expert_order="sequential") as layer:
            layer.load_weights(case.w13, case.w2, case.shared,
                               e_score_correction_bias=case.bias)
            outs.append(layer(case.x.cuda(), case.logits.cuda()).cpu())
    assert rel_err(outs[0], ref) <= 1e-2
    assert torch.equal(outs[0], outs[1])


if __name__ == "__main__":
    _worker()
