"""Tests of moerun.comm.deepep: the expert-major <-> token-major converters and the static limits.

Order: a hand-worked layout -> inputs that encode their source, checked slot by slot -> edge
cases (all ``-1``, an empty expert, zero tokens, no local experts) -> the weighted combine
against an independent per-(token, k) loop -> every error message -> ``deepep_limits``, one
case per reject reason (fake ``Env`` objects: no GPU or deep_ep needed).
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from moerun.backends.base import Deployment, Problem, RejectReason
from moerun.comm.deepep import (
    DEEPEP_MODES,
    LL_HIDDEN_SIZES,
    ExpertMajor,
    deepep_limits,
    expert_major_to_token_major,
    token_major_to_expert_major,
)
from moerun.config import Activation
from moerun.env import Env, get_env

# fp32 combine vs an fp64 loop: K <= 8 products of O(1) values, summed in another order.
FP32_ATOL = 1e-5
# bf16 output: one bf16 rounding of the fp32 sum (8 mantissa bits) -> relative 2**-8.
BF16_RTOL = 2.0**-8


def _expert_major_reference(local_ids: torch.Tensor,
                            num_local: int) -> list[list[tuple[int, int]]]:
    """Per expert, the (token, k) pairs in the documented order: ascending token, then k."""
    n, k = local_ids.shape
    slots: list[list[tuple[int, int]]] = [[] for _ in range(num_local)]
    for t in range(n):
        for j in range(k):
            e = int(local_ids[t, j])
            if e >= 0:
                slots[e].append((t, j))
    return slots


def _random_ids(gen: torch.Generator, n: int, k: int, num_local: int,
                p_here: float) -> torch.Tensor:
    """[n, k] int32 ids: each entry local with probability p_here, else -1; duplicates allowed."""
    ids = torch.randint(0, num_local, (n, k), generator=gen, dtype=torch.int32)
    here = torch.rand((n, k), generator=gen) < p_here
    return torch.where(here, ids, torch.full_like(ids, -1))


# --- hand-worked case -------------------------------------------------------------------------

# N=3 tokens, K=2, L=2 local experts, capacity 3, H=2:
#
#   local_ids   k=0  k=1          expert-major (slot order: ascending token row)
#   t0           0    1           e0: (t0,k0) (t2,k1)  .
#   t1           1   -1           e1: (t0,k1) (t1,k0)  .
#   t2          -1    0
#
#   x = [[1, 2], [3, 4], [5, 6]]
HAND_IDS = torch.tensor([[0, 1], [1, -1], [-1, 0]], dtype=torch.int32)
HAND_X = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])


def test_hand_worked_expert_major():
    em = token_major_to_expert_major(HAND_X, HAND_IDS, 2, 3)
    assert isinstance(em, ExpertMajor)
    assert torch.equal(em.counts, torch.tensor([2, 2], dtype=torch.int32))
    assert torch.equal(em.src_index, torch.tensor([[0, 2, -1], [0, 1, -1]]))
    assert torch.equal(em.src_k, torch.tensor([[0, 1, -1], [1, 0, -1]]))
    expected_x = torch.tensor([[[1.0, 2.0], [5.0, 6.0], [0.0, 0.0]],
                               [[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]]])
    assert torch.equal(em.x, expected_x)
    assert em.src_index.dtype == em.src_k.dtype == torch.int64
    with pytest.raises(dataclasses.FrozenInstanceError):
        em.counts = em.counts  # type: ignore[misc]


def test_hand_worked_combine():
    # weights of the -1 entries (t1,k1) and (t2,k0) are large so any leak would show
    weights = torch.tensor([[0.5, 0.25], [1.0, 7.0], [9.0, 2.0]])
    em = token_major_to_expert_major(HAND_X, HAND_IDS, 2, 3)
    y = em.x * 10  # y[e0] = [[10,20],[50,60],[0,0]], y[e1] = [[10,20],[30,40],[0,0]]
    y[:, 2] = float("nan")  # empty slots are never read
    out = expert_major_to_token_major(y, em, weights, 3)
    # t0 = .5*y[e0,s0] + .25*y[e1,s0]; t1 = 1*y[e1,s1]; t2 = 2*y[e0,s1]
    expected = torch.tensor([[7.5, 15.0], [30.0, 40.0], [100.0, 120.0]])
    assert torch.equal(out, expected)


# --- inputs encoding their source ---------------------------------------------------------------

@pytest.mark.parametrize("n,k,num_local,p_here,seed", [
    (37, 4, 5, 0.6, 0), (64, 8, 3, 0.3, 1), (1, 1, 1, 1.0, 2), (50, 2, 16, 0.9, 3),
])
def test_round_trip_encoded_rows(n, k, num_local, p_here, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = _random_ids(gen, n, k, num_local, p_here)
    h = 3
    # row t encodes its token: x[t, c] = t + 1000 * c (exact in fp32)
    x = torch.arange(n, dtype=torch.float32)[:, None] + 1000.0 * torch.arange(h)[None, :]
    ref = _expert_major_reference(ids, num_local)
    capacity = max(len(s) for s in ref) + 2
    em = token_major_to_expert_major(x, ids, num_local, capacity)
    assert em.x.shape == (num_local, capacity, h)
    for e in range(num_local):
        assert int(em.counts[e]) == len(ref[e])
        for s in range(capacity):
            t, j = int(em.src_index[e, s]), int(em.src_k[e, s])
            if s < len(ref[e]):
                assert (t, j) == ref[e][s]
                assert int(ids[t, j]) == e
                assert torch.equal(em.x[e, s], t + 1000.0 * torch.arange(h, dtype=torch.float32))
            else:
                assert (t, j) == (-1, -1)
                assert torch.equal(em.x[e, s], torch.zeros(h))
    # unit weights on the local entries: each token comes back times its number of local entries
    ones = torch.ones((n, k))
    back = expert_major_to_token_major(em.x, em, ones, n)
    assert torch.equal(back, x * (ids >= 0).sum(dim=1, keepdim=True).float())


def test_all_ids_elsewhere():
    x = torch.randn(4, 8)
    ids = torch.full((4, 2), -1, dtype=torch.int32)
    em = token_major_to_expert_major(x, ids, 3, 2)
    assert torch.equal(em.counts, torch.zeros(3, dtype=torch.int32))
    assert torch.equal(em.src_index, torch.full((3, 2), -1))
    assert torch.equal(em.x, torch.zeros(3, 2, 8))
    out = expert_major_to_token_major(torch.randn(3, 2, 8), em, torch.ones(4, 2), 4)
    assert torch.equal(out, torch.zeros(4, 8))


def test_expert_with_zero_tokens():
    # expert 1 of 3 receives nothing
    ids = torch.tensor([[0, 2], [2, 0], [0, -1]], dtype=torch.int32)
    x = torch.arange(6.0).view(3, 2)
    em = token_major_to_expert_major(x, ids, 3, 4)
    assert torch.equal(em.counts, torch.tensor([3, 0, 2], dtype=torch.int32))
    assert torch.equal(em.src_index[1], torch.full((4,), -1))
    assert torch.equal(em.x[1], torch.zeros(4, 2))
    assert torch.equal(em.src_index[0], torch.tensor([0, 1, 2, -1]))
    assert torch.equal(em.src_k[0], torch.tensor([0, 1, 0, -1]))
    assert torch.equal(em.src_index[2], torch.tensor([0, 1, -1, -1]))


def test_zero_tokens_and_zero_experts():
    no_ids = torch.empty(0, 2, dtype=torch.int32)
    em = token_major_to_expert_major(torch.empty(0, 5), no_ids, 2, 3)
    assert torch.equal(em.counts, torch.zeros(2, dtype=torch.int32))
    assert em.x.shape == (2, 3, 5) and not em.x.any()
    assert expert_major_to_token_major(em.x, em, torch.empty(0, 2), 0).shape == (0, 5)
    elsewhere = torch.full((2, 1), -1, dtype=torch.int32)
    em0 = token_major_to_expert_major(torch.randn(2, 5), elsewhere, 0, 3)
    assert em0.x.shape == (0, 3, 5) and em0.counts.shape == (0,)
    out0 = expert_major_to_token_major(em0.x, em0, torch.ones(2, 1), 2)
    assert torch.equal(out0, torch.zeros(2, 5))


def test_exact_capacity_fits():
    ids = torch.tensor([[0], [0], [0]], dtype=torch.int32)
    em = token_major_to_expert_major(torch.randn(3, 2), ids, 1, 3)
    assert torch.equal(em.src_index, torch.tensor([[0, 1, 2]]))


# --- weighted combine against an independent loop ----------------------------------------------

def _combine_reference(y, ids, weights, num_local):
    """fp64 loop: slot of (t, k) found by counting earlier local entries of the same expert."""
    n, k = ids.shape
    out = torch.zeros(n, y.shape[2], dtype=torch.float64)
    seen = [0] * num_local
    for t in range(n):
        for j in range(k):
            e = int(ids[t, j])
            if e >= 0:
                out[t] += float(weights[t, j]) * y[e, seen[e]].double()
                seen[e] += 1
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k,num_local,seed", [(33, 8, 4, 0), (128, 2, 7, 1), (5, 6, 2, 2)])
def test_combine_matches_dense_loop(dtype, n, k, num_local, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = _random_ids(gen, n, k, num_local, 0.7)
    x = torch.randn(n, 16, generator=gen).to(dtype)
    capacity = max(len(s) for s in _expert_major_reference(ids, num_local)) + 1
    em = token_major_to_expert_major(x, ids, num_local, capacity)
    y = torch.randn(num_local, capacity, 16, generator=gen).to(dtype)
    weights = torch.rand(n, k, generator=gen)
    out = expert_major_to_token_major(y, em, weights, n)
    assert out.dtype == dtype and out.shape == (n, 16)
    ref = _combine_reference(y, ids, weights, num_local)
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), ref, atol=FP32_ATOL, rtol=0)
    else:
        torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=BF16_RTOL)


# --- errors -------------------------------------------------------------------------------------

def test_capacity_overflow():
    ids = torch.tensor([[0, 1], [0, -1], [0, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"capacity=2 is too small.*receives 3 rows"):
        token_major_to_expert_major(torch.randn(3, 4), ids, 2, 2)


@pytest.mark.parametrize("bad", [2, -2])
def test_ids_out_of_range(bad):
    ids = torch.tensor([[0, bad]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"local_ids must be in \[-1, 2\)"):
        token_major_to_expert_major(torch.randn(1, 4), ids, 2, 4)


def test_converter_argument_errors():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="x must be"):
        token_major_to_expert_major(torch.randn(3), HAND_IDS, 2, 3)
    with pytest.raises(ValueError, match="local_ids must be"):
        token_major_to_expert_major(x, HAND_IDS[:2], 2, 3)
    with pytest.raises(TypeError, match="local_ids must be an integer"):
        token_major_to_expert_major(x, HAND_IDS.float(), 2, 3)
    with pytest.raises(ValueError, match="capacity=-1"):
        token_major_to_expert_major(x, HAND_IDS, 2, -1)
    em = token_major_to_expert_major(x, HAND_IDS, 2, 3)
    with pytest.raises(ValueError, match="y must be"):
        expert_major_to_token_major(torch.randn(2, 4, 4), em, torch.ones(3, 2), 3)
    with pytest.raises(ValueError, match="weights must be"):
        expert_major_to_token_major(em.x, em, torch.ones(2, 2), 3)


# --- deepep_limits ------------------------------------------------------------------------------

def _env(**kw) -> Env:
    base = dict(torch_version="2.13.0", cuda_available=True, device_capability=(9, 0),
                device_name="NVIDIA H200", num_gpus=8, triton_version=None, nvtx_version=None,
                deep_ep_version="1.2.1", transformers_version=None, triton_interpret=False,
                has_grouped_mm=True)
    base.update(kw)
    return Env(**base)


def _problem(**kw) -> Problem:
    base = dict(num_experts=64, num_slots=64, top_k=8, hidden_size=7168, intermediate_size=2048,
                dtype=torch.bfloat16, activation=Activation.SILU_GLU, device_type="cuda")
    base.update(kw)
    return Problem(**base)


def _deployment(world_size=8, **kw) -> Deployment:
    base = dict(rank=0, world_size=world_size, comm_backend="nccl",
                num_local_slots=64 // world_size, divisible=64 % world_size == 0)
    base.update(kw)
    return Deployment(**base)


@pytest.mark.parametrize("mode", DEEPEP_MODES)
def test_limits_accept_deepseek_like_layer(mode):
    assert deepep_limits(_problem(), _deployment(), _env(), mode=mode).ok
    # internode: 4 nodes of 8
    prob = _problem(num_experts=256, num_slots=256)
    dep = _deployment(32, num_local_slots=8, divisible=True)
    assert deepep_limits(prob, dep, _env(), mode=mode).ok


@pytest.mark.parametrize("mode", DEEPEP_MODES)
def test_limits_package_missing_on_this_machine(mode):
    env = get_env()
    if env.deep_ep_version is not None:
        pytest.skip("deep_ep is installed here")
    got = deepep_limits(_problem(device_type="cpu"), _deployment(), env, mode=mode)
    assert not got.ok and got.reason is RejectReason.PACKAGE_MISSING
    assert "deep_ep" in got.detail and "github.com/deepseek-ai/DeepEP" in got.detail
    assert "source" in got.detail


R = RejectReason
LIMIT_CASES = [
    # (mode, env overrides, problem overrides, deployment kwargs, reason, detail regex)
    ("normal", dict(deep_ep_version=None), {}, {}, R.PACKAGE_MISSING, "built from source"),
    ("normal", {}, dict(device_type="cpu"), {}, R.DEVICE, "needs CUDA"),
    ("low_latency", dict(cuda_available=False, device_capability=None), {}, {}, R.DEVICE,
     "cuda_available=False"),
    ("normal", dict(device_capability=(7, 5)), {}, {}, R.DEVICE, "sm80\\+, this GPU is sm75"),
    ("low_latency", dict(device_capability=(8, 0)), {}, {}, R.DEVICE, "sm90\\+"),
    ("normal", {}, {}, dict(comm_backend="gloo"), R.TOPOLOGY, "NCCL"),
    ("normal", {}, dict(dtype=torch.float16), {}, R.DTYPE, "bf16 only"),
    ("low_latency", {}, dict(dtype=torch.float32), {}, R.DTYPE, "bf16 only"),
    ("low_latency", {}, dict(hidden_size=1024), {}, R.SHAPE, "hidden_size=1024"),
    ("normal", {}, dict(hidden_size=7164), {}, R.SHAPE, "multiple of 8"),
    ("low_latency", {}, dict(top_k=17), {}, R.SHAPE, "top_k <= 16"),
    ("normal", {}, dict(top_k=33), {}, R.SHAPE, "top_k <= 32"),
    ("normal", {}, dict(num_experts=60, num_slots=60), dict(divisible=False), R.NON_DIVISIBLE_EP,
     "60 % 8"),
    ("low_latency", {}, dict(num_experts=60, num_slots=60), dict(divisible=False),
     R.NON_DIVISIBLE_EP, "60 % 8"),
    ("normal", {}, {}, dict(world_size=1, num_local_slots=64, divisible=True), R.TOPOLOGY,
     ">= 2 ranks"),
    ("normal", {}, dict(num_experts=66, num_slots=66), dict(world_size=6, divisible=True),
     R.TOPOLOGY, "compiled for \\(2, 4, 8\\) ranks, got 6"),
    ("low_latency", {}, dict(num_experts=120, num_slots=120), dict(world_size=12, divisible=True),
     R.TOPOLOGY, "whole nodes of 8"),
    ("normal", {}, dict(num_experts=80, num_slots=80), dict(world_size=40, divisible=True),
     R.TOPOLOGY, "nodes of 8, got 40 ranks"),
    ("normal", dict(device_capability=(8, 0)), {}, dict(world_size=16, divisible=True), R.DEVICE,
     "NVSHMEM"),
    ("normal", {}, dict(num_experts=258, num_slots=258), dict(world_size=2, divisible=True),
     R.SHAPE, "<= 128 slots per rank here, got 129"),
    ("normal", {}, dict(num_experts=16400, num_slots=16400), dict(world_size=16, divisible=True),
     R.SHAPE, "<= 1024 slots per rank here, got 1025"),
]


@pytest.mark.parametrize("mode,env_kw,prob_kw,dep_kw,reason,detail", LIMIT_CASES)
def test_limits_reject(mode, env_kw, prob_kw, dep_kw, reason, detail):
    got = deepep_limits(_problem(**prob_kw), _deployment(**dep_kw), _env(**env_kw), mode=mode)
    assert not got.ok
    assert got.reason is reason
    assert got.detail
    assert re.search(detail, got.detail), got.detail


@pytest.mark.parametrize("hidden", LL_HIDDEN_SIZES)
def test_limits_low_latency_hidden_sizes(hidden):
    assert deepep_limits(_problem(hidden_size=hidden), _deployment(), _env(), mode="low_latency").ok


def test_limits_low_latency_allows_what_normal_rejects():
    # 6 ranks: no normal intranode kernel, but low-latency kernels take any count below 8
    prob = _problem(num_experts=66, num_slots=66)
    dep = _deployment(6, num_local_slots=11, divisible=True)
    assert deepep_limits(prob, dep, _env(), mode="low_latency").ok
    assert deepep_limits(prob, dep, _env(), mode="normal").reason is RejectReason.TOPOLOGY


def test_limits_unknown_mode():
    with pytest.raises(ValueError, match="mode='fast' is unknown"):
        deepep_limits(_problem(), _deployment(), _env(), mode="fast")


# --- the same converters on a GPU ---------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_converters_on_cuda_match_cpu():
    gen = torch.Generator().manual_seed(7)
    ids = _random_ids(gen, 300, 8, 6, 0.5)
    x = torch.randn(300, 64, generator=gen)
    weights = torch.rand(300, 8, generator=gen)
    cap = max(len(s) for s in _expert_major_reference(ids, 6))
    cpu = token_major_to_expert_major(x, ids, 6, cap)
    gpu = token_major_to_expert_major(x.cuda(), ids.cuda(), 6, cap)
    for f in ("x", "counts", "src_index", "src_k"):
        assert torch.equal(getattr(gpu, f).cpu(), getattr(cpu, f)), f
    out_cpu = expert_major_to_token_major(cpu.x, cpu, weights, 300)
    out_gpu = expert_major_to_token_major(gpu.x, gpu, weights.cuda(), 300)
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, atol=FP32_ATOL, rtol=0)
