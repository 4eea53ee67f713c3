"""``AllGatherReduceScatter``: the universal strategy and fallback (DESIGN 5).

Every rank pads its chunk to the chunk's max row count (rank-identical), all-gathers rows,
slot ids and weights, masks other ranks' slots to ``-1``, computes, and reduce-scatters the
fp32 partial sums. Collective shapes are always equal across ranks; with fixed counts there is
no host sync, so it is capturable on NCCL.

Layout of one chunk with R=2, counts (2, 1) -> max m=2 (``p`` = padding, ids -1):
    gathered rows: [r0t0, r0t1, r1t0, p]  (R*m rows); rank r's output = rows [r*m, r*m+n_r).

Post-quant dispatch (:class:`~moerun.quant.QuantizedRows`, DESIGN 11a): the e4m3 rows travel
as their ``uint8`` bytes (gloo reduces no fp8 type; a gather of bytes is exact) and the fp32
scales ride bit-cast in the int32 metadata next to ids and weights, so a chunk still costs two
all-gathers, of ``H + 8K + 4H/g`` bytes per row instead of ``2H + 8K`` for bf16. Padded
rows carry zero codes and :data:`~moerun.quant.ZERO_ROW_SCALE` (what a zero row quantizes to).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from moerun.capability import Deployment, Eligibility, Problem
from moerun.comm.base import (
    CombineHandle,
    CommStrategy,
    DispatchResult,
    PreparedDispatch,
    multi_rank_only,
    to_local_slot_ids,
)
from moerun.env import Env
from moerun.quant import FP8_DTYPE, ZERO_ROW_SCALE, QuantizedRows

__all__ = ["AllGatherReduceScatter"]


def _pad_rows(t: torch.Tensor, rows: int, value: float | int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t.contiguous()
    out = t.new_full((rows, *t.shape[1:]), value)
    out[: t.shape[0]] = t
    return out


class AllGatherReduceScatter(CommStrategy):
    """All-gather dispatch, reduce-scatter combine. Wire bytes per chunk: ``R*m*(H*elt +
    2K*4)`` gathered, ``R*m*H*4`` reduce-scattered (fp32 accumulation, a documented cost)."""

    name: ClassVar[str] = "AllGatherReduceScatter"
    supports_non_divisible_ep: ClassVar[bool] = True
    capturable: ClassVar[bool] = True
    supports_fused_shared: ClassVar[bool] = True

    @classmethod
    def can_implement(cls, problem: Problem, deployment: Deployment, env: Env) -> Eligibility:
        """Eligible on two ranks or more (:func:`multi_rank_only`). Pure; host only."""
        return multi_rank_only(deployment)

    def supports_post_quant_dispatch(self) -> bool:
        """True: e4m3 bytes plus fp32 scales are gathered (module docstring). Pure; host only."""
        return True

    def dispatch(self, x, topk_ids, topk_weights, *, prepared: PreparedDispatch,
                 async_op: bool = False) -> DispatchResult:
        """All-gather this chunk's rows (padded to the chunk's max) and their packed ids and weights
        from every rank (:meth:`CommStrategy.dispatch`).

        Collective over the layer's group (two all-gathers); current stream; no device-to-host
        sync, capturable on NCCL. Without ``async_op`` it waits at once (host-blocking on gloo)."""
        if isinstance(x, QuantizedRows):
            return self._dispatch_quantized(x, topk_ids, topk_weights, prepared=prepared,
                                            async_op=async_op)
        chunk = prepared.chunk
        n, m, r = x.shape[0], chunk.max, self.world_size
        if n != chunk.local:  # public entry: name the argument, not a bare assert
            raise ValueError(f"AllGatherReduceScatter.dispatch: x has {n} rows but the chunk "
                             f"plan gives this rank {chunk.local} (counts {chunk.counts}); pass "
                             "the rows prepare_dispatch planned")
        k = topk_ids.shape[1]
        # NOTE: ids and fp32 weights travel in one int32 tensor (weights bit-cast).
        meta = torch.cat([topk_ids.to(torch.int32),
                          topk_weights.to(torch.float32).view(torch.int32)], dim=1)
        meta = _pad_rows(meta, m, -1)
        x_pad = _pad_rows(x, m, 0)
        x_all = x.new_empty((r * m, x.shape[1]))
        meta_all = meta.new_empty((r * m, 2 * k))
        ids_local = torch.empty((r * m, k), dtype=torch.int32, device=x.device)
        weights = torch.empty((r * m, k), dtype=torch.float32, device=x.device)

        def unpack() -> None:
            ids_local.copy_(to_local_slot_ids(meta_all[:, :k], self.slot_start,
                                              self.num_local_slots))
            weights.copy_(meta_all[:, k:].view(torch.float32))

        cur = prepared.cursor
        p_x = self.comm.all_gather_into_tensor(x_all, x_pad, phase="dispatch", cursor=cur)
        p_meta = self.comm.all_gather_into_tensor(meta_all, meta, phase="dispatch", cursor=cur,
                                                  then=unpack)
        result = DispatchResult(x=x_all, topk_ids=ids_local, topk_weights=weights,
                                counts_per_source=chunk.counts, cursor=cur, meta=chunk,
                                pending=(p_x, p_meta))
        return result if async_op else result.wait()

    def _dispatch_quantized(self, q: QuantizedRows, topk_ids: torch.Tensor,
                            topk_weights: torch.Tensor, *, prepared: PreparedDispatch,
                            async_op: bool) -> DispatchResult:
        """:meth:`dispatch` of quantized rows: ``[n, H]`` e4m3 as bytes, then ``[n, 2K + G]``
        int32 (ids, bit-cast weights, bit-cast scales). Two all-gathers; no host sync."""
        chunk = prepared.chunk
        n, m, r = q.shape[0], chunk.max, self.world_size
        if n != chunk.local:
            raise ValueError(f"AllGatherReduceScatter.dispatch: x has {n} rows but the chunk "
                             f"plan gives this rank {chunk.local} (counts {chunk.counts}); pass "
                             "the rows prepare_dispatch planned")
        k, h, groups = topk_ids.shape[1], q.shape[1], q.scale.shape[1]
        device = q.device
        ids = _pad_rows(topk_ids.to(torch.int32), m, -1)
        weights_bits = _pad_rows(topk_weights.to(torch.float32), m, 0.0).view(torch.int32)
        scale_bits = _pad_rows(q.scale, m, ZERO_ROW_SCALE).view(torch.int32)
        meta = torch.cat([ids, weights_bits, scale_bits], dim=1)
        data = _pad_rows(q.data.view(torch.uint8), m, 0)  # 0x00 is e4m3 +0
        data_all = torch.empty((r * m, h), dtype=torch.uint8, device=device)
        meta_all = meta.new_empty((r * m, 2 * k + groups))
        ids_local = torch.empty((r * m, k), dtype=torch.int32, device=device)
        weights = torch.empty((r * m, k), dtype=torch.float32, device=device)
        scale = torch.empty((r * m, groups), dtype=torch.float32, device=device)

        def unpack() -> None:
            ids_local.copy_(to_local_slot_ids(meta_all[:, :k], self.slot_start,
                                              self.num_local_slots))
            weights.copy_(meta_all[:, k:2 * k].view(torch.float32))
            scale.copy_(meta_all[:, 2 * k:].view(torch.float32))

        cur = prepared.cursor
        p_x = self.comm.all_gather_into_tensor(data_all, data, phase="dispatch", cursor=cur)
        p_meta = self.comm.all_gather_into_tensor(meta_all, meta, phase="dispatch", cursor=cur,
                                                  then=unpack)
        rows = QuantizedRows(data=data_all.view(FP8_DTYPE), scale=scale, group=q.group)
        result = DispatchResult(x=rows, topk_ids=ids_local, topk_weights=weights,
                                counts_per_source=chunk.counts, cursor=cur, meta=chunk,
                                pending=(p_x, p_meta))
        return result if async_op else result.wait()

    def own_rows(self, dispatch: DispatchResult) -> tuple[int, int]:
        """This rank's rows sit at ``[rank*m, rank*m + n)`` of the gathered rows.

        Pure; host only."""
        chunk = dispatch.meta
        return self.rank * chunk.max, self.rank * chunk.max + chunk.local

    def combine(self, expert_out, dispatch: DispatchResult, *, async_op: bool = False):
        """Reduce-scatter the fp32 partial sums back to their source ranks
        (:meth:`CommStrategy.combine`).

        Collective over the layer's group (one reduce-scatter; on gloo an all-to-all and a local
        sum); current stream; no device-to-host sync, capturable on NCCL. Without ``async_op`` it
        waits at once."""
        chunk = dispatch.meta
        m, n = chunk.max, chunk.local
        x = dispatch.x  # quantized rows: the experts' output dtype (the activation dtype)
        out_dtype = x.dtype if isinstance(x, torch.Tensor) else expert_out.dtype
        partial = expert_out.to(torch.float32).contiguous()
        summed = partial.new_empty((m, partial.shape[1]))
        pending = self.comm.reduce_scatter_tensor(summed, partial, phase="combine",
                                                  cursor=dispatch.cursor)
        handle = CombineHandle((pending,), lambda: summed[:n].to(out_dtype))
        return handle if async_op else handle.wait()
