"""``NoComm``: the single-rank strategy. Dispatch and combine move nothing."""

from __future__ import annotations

from typing import ClassVar

import torch

from moerun.capability import Deployment, Eligibility, Problem, RejectReason
from moerun.comm.base import CombineHandle, CommStrategy, DispatchResult, PreparedDispatch
from moerun.env import Env

__all__ = ["NoComm"]


class NoComm(CommStrategy):
    """One rank: global slot ids are local slot ids. Capturable, no host sync."""

    name: ClassVar[str] = "NoComm"
    supports_non_divisible_ep: ClassVar[bool] = True
    capturable: ClassVar[bool] = True
    supports_fused_shared: ClassVar[bool] = True

    @classmethod
    def can_implement(cls, problem: Problem, deployment: Deployment, env: Env) -> Eligibility:
        """Eligible on exactly one rank. Pure; host only."""
        if deployment.world_size != 1:
            return Eligibility.no(RejectReason.TOPOLOGY,
                                  f"NoComm needs one rank, group has {deployment.world_size}")
        return Eligibility.yes()

    def supports_post_quant_dispatch(self) -> bool:
        """True: "dispatch" moves nothing, so quantizing before it is the same work, and the
        ``quantize`` range sits where it does on several ranks. Pure; host only."""
        return True

    def dispatch(self, x, topk_ids, topk_weights, *, prepared: PreparedDispatch,
                 async_op: bool = False) -> DispatchResult:
        """The chunk's own rows as the received rows (ids cast to int32 when needed).

        No collective; no host sync; at most one cast on the current stream; capturable."""
        if topk_ids.dtype != torch.int32:
            topk_ids = topk_ids.to(torch.int32)
        return DispatchResult(x=x, topk_ids=topk_ids, topk_weights=topk_weights,
                              counts_per_source=(x.shape[0],), cursor=prepared.cursor)

    def own_rows(self, dispatch: DispatchResult) -> tuple[int, int]:
        """``(0, rows)``: every dispatched row is this rank's. Pure; host only."""
        return 0, dispatch.x.shape[0]

    def combine(self, expert_out, dispatch, *, async_op: bool = False):
        """``expert_out`` itself (in a completed :class:`CombineHandle` with ``async_op``).

        No collective, no device work; capturable."""
        if async_op:
            return CombineHandle((), lambda: expert_out)
        return expert_out
