"""DeepEP: static limits and pure layout converters, no runnable strategy yet (DESIGN 5).

DeepEP (github.com/deepseek-ai/DeepEP) is built from source. Until ``deep_ep`` imports,
:func:`deepep_limits` answers ``PACKAGE_MISSING`` and the resolution report says so. The
runnable adapter (buffers, dispatch, combine) belongs to the multi-GPU work; there is
deliberately no strategy class here.

Legend: ``N`` tokens (rows) on this rank, ``K`` top-k, ``L`` local experts (slots) on this
rank, ``C`` capacity (rows per expert in the expert-major buffer), ``H`` hidden.

Layouts, for N=3, K=2, L=2 and local ids ``[[0, 1], [1, -1], [-1, 0]]`` (``-1``: not here)::

    token-major  x [N, H]     t0 t1 t2
    expert-major x [L, C, H]  e0: t0 t2 .     (slot order: ascending token row)
                              e1: t0 t1 .     (``.`` = empty slot, zeros)

The limits are those of DeepEP's V1 ``deep_ep.Buffer`` kernels ("normal" = high-throughput
intranode/internode, "low_latency" = IBGDA). Current DeepEP keeps them under
``csrc/kernels/legacy/`` and ``csrc/legacy/buffer.hpp``; before its V2 refactor the same code
lived in ``csrc/kernels/*.cu`` and ``csrc/deep_ep.cpp``. Older V1 builds are narrower (noted
per constant); the runnable adapter must re-check against the installed build.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moerun.capability import Deployment, Eligibility, Problem, RejectReason
from moerun.env import Env

__all__ = [
    "DEEPEP_MODES",
    "LL_HIDDEN_SIZES",
    "ExpertMajor",
    "deepep_limits",
    "expert_major_to_token_major",
    "token_major_to_expert_major",
]

DEEPEP_MODES = ("normal", "low_latency")

_INSTALL = ("DeepEP is built from source: see github.com/deepseek-ai/DeepEP (needs NVSHMEM "
            "for internode and low-latency kernels); `pip install deep_ep` is not it")
# Ranks of one NVLink domain; larger groups run internode in blocks of 8 (configs.cuh
# NUM_MAX_NVL_PEERS; the Buffer constructor requires ranks < 8 or a multiple of 8).
_NVL_PEERS = 8
# Normal intranode kernels are compiled per rank count (launch.cuh SWITCH_RANKS).
_NORMAL_INTRANODE_RANKS = (2, 4, 8)
# Normal internode kernels are compiled per ranks / 8 (launch.cuh SWITCH_RDMA_RANKS; also the
# keys of Buffer.get_dispatch_config in deep_ep/buffer.py). Older V1 builds: 2, 4, 8, 16.
_NORMAL_RDMA_GROUPS = (2, 3, 4, 6, 8, 12, 16, 18, 20)
# Both normal dispatch kernels assert num_topk <= 32 (intranode.cu and internode.cu `dispatch`).
_NORMAL_MAX_TOPK = 32
# Intranode notify_dispatch gives each local expert one of its 128 threads (intranode.cu,
# host launcher of notify_dispatch); Buffer::intranode_dispatch / internode_dispatch cap local
# experts at NUM_MAX_LOCAL_EXPERTS = 1024 (configs.cuh), the size of the host counter array.
_NORMAL_INTRANODE_MAX_LOCAL = 128
_NORMAL_MAX_LOCAL = 1024
#: Hidden sizes the low-latency kernels are compiled for (launch.cuh SWITCH_HIDDEN, used by
#: internode_ll.cu `dispatch` and `combine`). Early V1 builds had only 2560/4096/5120/7168;
#: 2048/6144/8192, then 3072 and 3584 were added later.
LL_HIDDEN_SIZES = (2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192)
# internode_ll.cu: the dispatch launcher's kNumMaxTopK and the combine launcher's kNumMaxTopk
# bound num_topk. 16 in the current source; older V1 builds had 9 (then 11 for dispatch only).
_LL_MAX_TOPK = 16


def deepep_limits(problem: Problem, deployment: Deployment, env: Env, *,
                  mode: str) -> Eligibility:
    """Static DeepEP limits for ``mode`` in :data:`DEEPEP_MODES`: the first failing reason.

    Pure (reads only its arguments; no import, no device query). Checked in order: package,
    device, process-group backend, dtype, hidden size, top-k, divisibility, group size, local
    experts. DeepEP's ``num_experts`` is moerun's slot count S (ids handed to dispatch are global
    slot ids). Not checkable here (the runnable adapter's job): NVSHMEM/IBGDA and NIC presence,
    SM count (low-latency kernels need S < 15 * SMs), QPs per rank >= local experts, buffer
    sizes, ``num_ranks * max_tokens_per_rank % 4 == 0`` for low-latency dispatch.

    Raises ValueError for an unknown ``mode``.
    """
    if mode not in DEEPEP_MODES:
        raise ValueError(f"mode={mode!r} is unknown; valid: {', '.join(map(repr, DEEPEP_MODES))}")
    ll = mode == "low_latency"
    no = Eligibility.no
    # 1. the library
    if env.deep_ep_version is None:
        return no(RejectReason.PACKAGE_MISSING, f"deep_ep is not importable. {_INSTALL}")
    # 2. device: CUDA only; sm80 builds need DISABLE_SM90_FEATURES, which also disables NVSHMEM
    # and with it the low-latency and internode kernels (setup.py)
    if problem.device_type != "cuda" or not env.cuda_available or env.device_capability is None:
        return no(RejectReason.DEVICE, f"needs CUDA GPUs (device_type={problem.device_type!r}, "
                                       f"cuda_available={env.cuda_available})")
    cap = env.device_capability
    min_cap = (9, 0) if ll else (8, 0)
    if cap < min_cap:
        return no(RejectReason.DEVICE, f"{mode} kernels need sm{min_cap[0]}{min_cap[1]}+, "
                                       f"this GPU is sm{cap[0]}{cap[1]}")
    if deployment.comm_backend != "nccl":
        return no(RejectReason.TOPOLOGY, f"needs an NCCL process group (CUDA tensors), got "
                                         f"comm_backend={deployment.comm_backend!r}")
    # 3. dtype. Normal dispatch takes bf16 or an (fp8 e4m3, fp32 scales [N, H/128]) tuple, but
    # normal combine is bf16-only (SWITCH_TYPES in intranode.cu / internode.cu `combine`); the
    # low-latency dispatch asserts a bf16 input (fp8 is an in-kernel cast) and its combine is
    # bf16 (Buffer::low_latency_dispatch / low_latency_combine). moerun has no quantizing
    # backend, so the data path is bf16 only.
    if problem.dtype != torch.bfloat16:
        return no(RejectReason.DTYPE,
                  f"{mode} dispatch/combine move bf16 only, got {problem.dtype}")
    # 4. hidden size
    h = problem.hidden_size
    if ll and h not in LL_HIDDEN_SIZES:
        return no(RejectReason.SHAPE, f"low-latency kernels are compiled for hidden sizes "
                                      f"{LL_HIDDEN_SIZES}, got hidden_size={h}")
    if not ll and (h * 2) % 16:  # Buffer::intranode_dispatch: row bytes multiple of int4
        return no(RejectReason.SHAPE, f"normal kernels move rows in 16-byte vectors: "
                                      f"hidden_size={h} bf16 must be a multiple of 8")
    # 5. top-k
    max_k = _LL_MAX_TOPK if ll else _NORMAL_MAX_TOPK
    if problem.top_k > max_k:
        return no(RejectReason.SHAPE, f"{mode} kernels support top_k <= {max_k}, "
                                      f"got top_k={problem.top_k}")
    # 6. divisibility: DeepEP finds the owner rank as id // (S / R) (intranode.cu
    # notify_dispatch launcher and Buffer::low_latency_dispatch assert S % R == 0)
    r, s = deployment.world_size, problem.num_slots
    if not deployment.divisible or s % r:
        return no(RejectReason.NON_DIVISIBLE_EP, f"DeepEP needs num_slots % world_size == 0, "
                                                 f"got {s} % {r}")
    # 7. group size
    if r < 2:
        return no(RejectReason.TOPOLOGY, "needs >= 2 ranks (NoComm covers one)")
    if r > _NVL_PEERS and r % _NVL_PEERS:
        return no(RejectReason.TOPOLOGY, f"more than {_NVL_PEERS} ranks must come in whole "
                                         f"nodes of {_NVL_PEERS}, got world_size={r}")
    if not ll and r <= _NVL_PEERS and r not in _NORMAL_INTRANODE_RANKS:
        return no(RejectReason.TOPOLOGY, f"normal intranode kernels are compiled for "
                                         f"{_NORMAL_INTRANODE_RANKS} ranks, got {r}")
    if not ll and r > _NVL_PEERS:
        if r // _NVL_PEERS not in _NORMAL_RDMA_GROUPS:
            return no(RejectReason.TOPOLOGY, f"normal internode kernels are compiled for "
                                             f"{_NORMAL_RDMA_GROUPS} nodes of 8, got {r} ranks")
        if cap < (9, 0):
            return no(RejectReason.DEVICE, f"internode kernels need NVSHMEM, which DeepEP "
                                           f"builds only for sm90+; this GPU is sm{cap[0]}{cap[1]}")
    # 8. local experts (normal mode; low-latency needs QPs >= local experts, set at build time)
    local = s // r
    max_local = _NORMAL_INTRANODE_MAX_LOCAL if r <= _NVL_PEERS else _NORMAL_MAX_LOCAL
    if not ll and local > max_local:
        return no(RejectReason.SHAPE, f"normal kernels support <= {max_local} slots per rank "
                                      f"here, got {local}")
    return Eligibility.yes()


@dataclass(frozen=True, kw_only=True)
class ExpertMajor:
    """Rows grouped per local expert, as DeepEP's low-latency dispatch hands them to the experts.

    Fields:
        x: ``[L, C, H]`` (x.dtype) rows; slot ``s < counts[e]`` of expert ``e`` holds a token's
            row, empty slots are zeros.
        counts: ``[L]`` int32 filled slots per expert.
        src_index: ``[L, C]`` int64 token row of each filled slot, ``-1`` for empty slots.
        src_k: ``[L, C]`` int64 top-k column of each filled slot, ``-1`` for empty slots.

    Inside an expert, slots follow ascending token row (stable; a token routed twice to the
    same expert appears once per column, ascending column).
    """

    x: torch.Tensor
    counts: torch.Tensor
    src_index: torch.Tensor
    src_k: torch.Tensor


def token_major_to_expert_major(x: torch.Tensor, local_ids: torch.Tensor, num_local_experts: int,
                                capacity: int) -> ExpertMajor:
    """Group token rows by local expert (the receiving side of a low-latency dispatch).

    Args:
        x: ``[N, H]`` rows, any dtype.
        local_ids: ``[N, K]`` integer (int32 expected) local expert ids in ``[0, L)``; ``-1``
            marks an entry whose expert is not on this rank (skipped).
        num_local_experts: ``L``.
        capacity: ``C``, slots per expert.

    Returns:
        :class:`ExpertMajor` on ``x.device``.

    Raises:
        ValueError: an expert would receive more than ``capacity`` rows, an id outside
            ``[-1, L)``, or mismatched shapes. TypeError: non-integer ``local_ids``.

    Side effects: one host sync (validation of ids and capacity), otherwise device-only work
    (stable sort, scatter, gather); no collective. Not CUDA-graph capturable because of the sync.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be [N, H], got shape {tuple(x.shape)}")
    if local_ids.dim() != 2 or local_ids.shape[0] != x.shape[0]:
        raise ValueError(f"local_ids must be [N, K] with N={x.shape[0]} (rows of x), got shape "
                         f"{tuple(local_ids.shape)}")
    dt = local_ids.dtype
    if dt.is_floating_point or dt.is_complex or dt == torch.bool:
        raise TypeError(f"local_ids must be an integer tensor (int32), got {local_ids.dtype}")
    if num_local_experts < 0 or capacity < 0:
        raise ValueError(f"num_local_experts={num_local_experts} and capacity={capacity} "
                         "must be >= 0")
    n, k = local_ids.shape
    h, L, C, dev = x.shape[1], num_local_experts, capacity, x.device
    ids = local_ids.reshape(-1).to(device=dev, dtype=torch.int64)  # [N*K], flat f = t*K + j
    in_range = (ids >= 0) & (ids < L)
    key = torch.where(in_range, ids, torch.full_like(ids, L))  # skipped entries: bucket L
    counts = torch.zeros(L + 1, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, key, torch.ones_like(key))  # [L + 1]
    if ids.numel():
        most = counts[:L].max() if L else counts.new_zeros(())
        # NOTE: host sync (validation: ids in range, no expert over capacity)
        lo, hi, most = torch.stack([ids.min(), ids.max(), most]).tolist()
        if lo < -1 or hi >= L:
            raise ValueError(f"local_ids must be in [-1, {L}) (num_local_experts={L}), got "
                             f"values in [{lo}, {hi}]")
        if most > C:
            raise ValueError(f"capacity={C} is too small: a local expert receives {most} rows; "
                             f"pass capacity >= {most}")
    # stable sort keeps flat order (t-major) inside each expert: ascending token row
    order = torch.argsort(key, stable=True)  # [N*K]
    sorted_key = key[order]
    starts = torch.cumsum(counts, 0) - counts  # [L + 1] exclusive prefix
    pos = torch.arange(order.numel(), device=dev) - starts[sorted_key]
    dump = L * C  # one extra slot swallows the skipped entries
    dest = torch.where(sorted_key < L, sorted_key * C + pos, torch.full_like(pos, dump))
    src_index = torch.full((dump + 1,), -1, dtype=torch.int64, device=dev)
    src_index.scatter_(0, dest, torch.div(order, max(k, 1), rounding_mode="floor"))
    src_k = torch.full((dump + 1,), -1, dtype=torch.int64, device=dev)
    src_k.scatter_(0, dest, order % max(k, 1))
    src_index, src_k = src_index[:dump].view(L, C), src_k[:dump].view(L, C)
    if n == 0:
        x_e = x.new_zeros((L, C, h))
    else:
        rows = x.index_select(0, src_index.clamp(min=0).reshape(-1)).view(L, C, h)
        x_e = torch.where((src_index >= 0)[..., None], rows, x.new_zeros(()))
    return ExpertMajor(x=x_e, counts=counts[:L].to(torch.int32), src_index=src_index, src_k=src_k)


def expert_major_to_token_major(y: torch.Tensor, layout: ExpertMajor, weights: torch.Tensor,
                                num_tokens: int) -> torch.Tensor:
    """Weighted sum of expert outputs back per token (the local part of a low-latency combine).

    ``out[t] = sum over filled slots (e, s) with src_index[e, s] == t of
    weights[t, src_k[e, s]] * y[e, s]``; tokens with no filled slot are zero.

    Args:
        y: ``[L, C, H]`` expert outputs (fp32/fp16/bf16/fp64). Empty slots are never read, so
            they may hold garbage (DeepEP leaves them uninitialised).
        layout: the :class:`ExpertMajor` that produced the rows (``src_index``, ``src_k``).
        weights: ``[N, K]`` top-k weights (fp32 expected; converted to the accumulation dtype).
        num_tokens: ``N``.

    Returns:
        ``[N, H]`` in ``y.dtype``, accumulated in fp32 (fp64 for fp64 ``y``).

    Side effects: none; no host sync, no collective, capturable. On CUDA the ``index_add_``
    accumulation order is not deterministic (fp32 rounding may differ run to run).
    """
    L, C = layout.src_index.shape
    if y.dim() != 3 or tuple(y.shape[:2]) != (L, C):
        raise ValueError(f"y must be [L, C, H] = [{L}, {C}, H] like layout.src_index, got "
                         f"shape {tuple(y.shape)}")
    if weights.dim() != 2 or weights.shape[0] != num_tokens:
        raise ValueError(f"weights must be [N, K] with N=num_tokens={num_tokens}, got shape "
                         f"{tuple(weights.shape)}")
    h = y.shape[2]
    acc = torch.promote_types(y.dtype, torch.float32)
    out = torch.zeros((num_tokens, h), dtype=acc, device=y.device)
    if num_tokens == 0 or L * C == 0:
        return out.to(y.dtype)
    filled = (layout.src_index >= 0)[..., None]  # [L, C, 1]
    t = layout.src_index.clamp(min=0)
    w = weights.to(device=y.device, dtype=acc)[t, layout.src_k.clamp(min=0)]  # [L, C]
    # where (not multiply-by-mask): 0 * garbage in an empty slot could be NaN
    contrib = torch.where(filled, y.to(acc) * w[..., None], out.new_zeros(()))
    out.index_add_(0, t.reshape(-1), contrib.reshape(-1, h))
    return out.to(y.dtype)
