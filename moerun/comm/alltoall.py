"""``AllToAll``: send each token once to each rank holding one of its slots (DESIGN 5).

Dispatch first exchanges per-destination row counts (a host-synchronising all-to-all, so
this strategy is not capturable), then the rows and their (ids, weights) with variable splits.
The receiver applies the weights and sums its local top-k entries; combine returns the fp32
partial sums to the source rank, which adds them with ``index_add_``. Ranks with zero rows
still take part in every all-to-all.

Example, R=2, slots {0,1} on rank 0 and {2,3} on rank 1, token t0 -> slots (0, 2), t1 -> (1, 0):
    rank 0 sends t0, t1 to itself (ids (0,-1), (1,0)) and t0 to rank 1 (ids (-1, 0)).

Post-quant dispatch (:class:`~moerun.quant.QuantizedRows`, DESIGN 11a): the e4m3 rows travel
as their ``uint8`` bytes and the fp32 scales bit-cast in the int32 metadata beside ids and
weights: still two data all-to-alls, ``H + 8K + 4H/g`` bytes per sent row (bf16: ``2H + 8K``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from moerun.capability import Deployment, Eligibility, Problem
from moerun.comm.base import (
    ChunkCounts,
    CombineHandle,
    CommStrategy,
    DispatchResult,
    PreparedDispatch,
    multi_rank_only,
)
from moerun.comm.communicator import CollectiveCursor
from moerun.env import Env
from moerun.quant import FP8_DTYPE, QuantizedRows

__all__ = ["AllToAll"]


@dataclass(frozen=True, kw_only=True)
class _A2ALayout:
    """Rows this rank sends, grouped by destination.

    Fields: ``send_rows`` ``[N]`` int64 source row of each sent row; ``send_dest`` ``[N]``
    destination rank; ``send_counts`` rows per destination (host ints).
    """

    send_rows: torch.Tensor
    send_dest: torch.Tensor
    send_counts: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class _A2AMeta:
    layout: _A2ALayout
    recv_counts: tuple[int, ...]
    num_rows: int


class AllToAll(CommStrategy):
    """Variable-split ``all_to_all_single`` dispatch and combine. Host-synchronising."""

    name: ClassVar[str] = "AllToAll"
    supports_non_divisible_ep: ClassVar[bool] = True
    capturable: ClassVar[bool] = False

    @classmethod
    def can_implement(cls, problem: Problem, deployment: Deployment, env: Env) -> Eligibility:
        """Eligible on two ranks or more (:func:`multi_rank_only`). Pure; host only."""
        return multi_rank_only(deployment)

    def prepare_dispatch(self, topk_ids: torch.Tensor, chunk: ChunkCounts,
                         cursor: CollectiveCursor) -> PreparedDispatch:
        """The rows this rank sends to each rank, destination-major, and their counts.

        Host sync (``nonzero``, ``.tolist()``): not capturable. No collective."""
        owner = self.partition.owner_of(topk_ids)  # [n, K], -1 for padded/-1 ids
        ranks = torch.arange(self.world_size, device=topk_ids.device)
        send_mask = (owner[:, :, None] == ranks[None, None, :]).any(dim=1)  # [n, R]
        # destination-major order: all rows for rank 0, then rank 1, ...
        dest, rows = send_mask.t().nonzero(as_tuple=True)  # NOTE: host sync (nonzero)
        counts = send_mask.sum(dim=0).tolist()  # NOTE: host sync
        layout = _A2ALayout(send_rows=rows, send_dest=dest, send_counts=tuple(counts))
        return PreparedDispatch(chunk=chunk, cursor=cursor, layout=layout)

    def supports_post_quant_dispatch(self) -> bool:
        """True: e4m3 bytes plus fp32 scales are exchanged (module docstring). Pure; host only."""
        return True

    def _recv_counts(self, layout: _A2ALayout, cur: CollectiveCursor,
                     device: torch.device) -> tuple[int, ...]:
        """Rows this rank receives from each rank: an all-to-all of the send counts, waited.
        NOTE: host sync (receive sizes are needed to allocate)."""
        send_counts_t = torch.tensor(layout.send_counts, dtype=torch.int64, device=device)
        recv_counts_t = torch.empty_like(send_counts_t)
        ones = [1] * self.world_size
        self.comm.all_to_all_single(recv_counts_t, send_counts_t, ones, ones,
                                    phase="dispatch", cursor=cur).wait()
        return tuple(recv_counts_t.tolist())  # NOTE: host sync

    def _send_ids(self, topk_ids: torch.Tensor, layout: _A2ALayout) -> torch.Tensor:
        """``[N, K]`` int32 ids of the sent rows relative to their destination rank (-1 for
        another rank's slot)."""
        ids = topk_ids[layout.send_rows].to(torch.int64)  # [N, K]
        owner = self.partition.owner_of(ids)
        starts = torch.tensor(self.partition.starts[:-1], dtype=torch.int64,
                              device=topk_ids.device)
        dest = layout.send_dest[:, None]
        return torch.where(owner == dest, ids - starts[layout.send_dest][:, None],
                           torch.full_like(ids, -1)).to(torch.int32)

    def dispatch(self, x, topk_ids, topk_weights, *, prepared: PreparedDispatch,
                 async_op: bool = False) -> DispatchResult:
        """Send each row once to each rank holding one of its slots (:meth:`CommStrategy.dispatch`).

        Collective over the layer's group (three all-to-alls: counts, rows, metadata); host sync
        (the received counts, ``.tolist()``): not capturable."""
        if isinstance(x, QuantizedRows):
            return self._dispatch_quantized(x, topk_ids, topk_weights, prepared=prepared,
                                            async_op=async_op)
        layout: _A2ALayout = prepared.layout
        cur = prepared.cursor
        k = topk_ids.shape[1]
        device = x.device
        # 1. exchange row counts (host sync: receive sizes are needed to allocate)
        recv_counts = self._recv_counts(layout, cur, device)
        num_recv = sum(recv_counts)
        # 2. rows with ids relative to their destination rank
        meta = torch.cat([self._send_ids(topk_ids, layout),
                          topk_weights[layout.send_rows].to(torch.float32).view(torch.int32)],
                         dim=1).contiguous()
        send_x = x[layout.send_rows].contiguous()
        recv_x = x.new_empty((num_recv, x.shape[1]))
        recv_meta = meta.new_empty((num_recv, 2 * k))
        ids_out = torch.empty((num_recv, k), dtype=torch.int32, device=device)
        w_out = torch.empty((num_recv, k), dtype=torch.float32, device=device)

        def unpack() -> None:
            ids_out.copy_(recv_meta[:, :k])
            w_out.copy_(recv_meta[:, k:].view(torch.float32))

        out_splits, in_splits = list(recv_counts), list(layout.send_counts)
        p_x = self.comm.all_to_all_single(recv_x, send_x, out_splits, in_splits,
                                          phase="dispatch", cursor=cur)
        p_meta = self.comm.all_to_all_single(recv_meta, meta, out_splits, in_splits,
                                             phase="dispatch", cursor=cur, then=unpack)
        result = DispatchResult(
            x=recv_x, topk_ids=ids_out, topk_weights=w_out, counts_per_source=recv_counts,
            cursor=cur, meta=_A2AMeta(layout=layout, recv_counts=recv_counts, num_rows=x.shape[0]),
            pending=(p_x, p_meta))
        return result if async_op else result.wait()

    def _dispatch_quantized(self, q: QuantizedRows, topk_ids: torch.Tensor,
                            topk_weights: torch.Tensor, *, prepared: PreparedDispatch,
                            async_op: bool) -> DispatchResult:
        """:meth:`dispatch` of quantized rows: the count exchange (host sync), then ``[N, H]``
        e4m3 bytes and ``[N, 2K + G]`` int32 (ids, bit-cast weights, bit-cast scales)."""
        layout: _A2ALayout = prepared.layout
        cur = prepared.cursor
        k, h, groups = topk_ids.shape[1], q.shape[1], q.scale.shape[1]
        device = q.device
        recv_counts = self._recv_counts(layout, cur, device)
        num_recv = sum(recv_counts)
        rows = layout.send_rows
        meta = torch.cat([self._send_ids(topk_ids, layout),
                          topk_weights[rows].to(torch.float32).view(torch.int32),
                          q.scale[rows].view(torch.int32)], dim=1).contiguous()
        send_data = q.data.view(torch.uint8)[rows].contiguous()
        recv_data = torch.empty((num_recv, h), dtype=torch.uint8, device=device)
        recv_meta = meta.new_empty((num_recv, 2 * k + groups))
        ids_out = torch.empty((num_recv, k), dtype=torch.int32, device=device)
        w_out = torch.empty((num_recv, k), dtype=torch.float32, device=device)
        scale_out = torch.empty((num_recv, groups), dtype=torch.float32, device=device)

        def unpack() -> None:
            ids_out.copy_(recv_meta[:, :k])
            w_out.copy_(recv_meta[:, k:2 * k].view(torch.float32))
            scale_out.copy_(recv_meta[:, 2 * k:].view(torch.float32))

        out_splits, in_splits = list(recv_counts), list(layout.send_counts)
        p_x = self.comm.all_to_all_single(recv_data, send_data, out_splits, in_splits,
                                          phase="dispatch", cursor=cur)
        p_meta = self.comm.all_to_all_single(recv_meta, meta, out_splits, in_splits,
                                             phase="dispatch", cursor=cur, then=unpack)
        received = QuantizedRows(data=recv_data.view(FP8_DTYPE), scale=scale_out,
                                 group=q.group)
        result = DispatchResult(
            x=received, topk_ids=ids_out, topk_weights=w_out, counts_per_source=recv_counts,
            cursor=cur, meta=_A2AMeta(layout=layout, recv_counts=recv_counts,
                                      num_rows=q.shape[0]),
            pending=(p_x, p_meta))
        return result if async_op else result.wait()

    def combine(self, expert_out, dispatch: DispatchResult, *, async_op: bool = False):
        """Return the fp32 partial sums to their source ranks and add them there
        (:meth:`CommStrategy.combine`).

        Collective over the layer's group (one all-to-all); no host sync of its own (the counts
        came from dispatch); ``index_add_`` on the current stream at ``wait()``."""
        meta: _A2AMeta = dispatch.meta
        layout = meta.layout
        x = dispatch.x  # quantized rows: the experts' output dtype (the activation dtype)
        out_dtype = x.dtype if isinstance(x, torch.Tensor) else expert_out.dtype
        partial = expert_out.to(torch.float32).contiguous()
        back = partial.new_empty((layout.send_rows.shape[0], partial.shape[1]))
        pending = self.comm.all_to_all_single(back, partial, list(layout.send_counts),
                                              list(meta.recv_counts), phase="combine",
                                              cursor=dispatch.cursor)

        def finish() -> torch.Tensor:
            out = back.new_zeros((meta.num_rows, back.shape[1]))
            out.index_add_(0, layout.send_rows, back)
            return out.to(out_dtype)

        handle = CombineHandle((pending,), finish)
        return handle if async_op else handle.wait()
