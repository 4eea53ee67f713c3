"""The communication-strategy interface and the objects handed from dispatch to combine.

Legend: ``n`` this rank's rows in the chunk, ``M`` rows received by this rank, ``H`` hidden,
``K`` top-k, ``R`` ranks, ``S_local`` slots on this rank.

Strategies hold no per-chunk state: everything combine needs travels in the frozen
:class:`DispatchResult`, so any number of dispatches may be in flight (chunk overlap, DBO).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch

from moerun.capability import Deployment, Eligibility, Problem, RejectReason
from moerun.comm.communicator import CollectiveCursor, Communicator, Pending
from moerun.env import Env
from moerun.mapping import SlotPartition
from moerun.quant import QuantizedRows

__all__ = [
    "ChunkCounts",
    "PreparedDispatch",
    "DispatchResult",
    "CombineHandle",
    "CommStrategy",
    "to_local_slot_ids",
    "multi_rank_only",
]


@dataclass(frozen=True, kw_only=True)
class ChunkCounts:
    """Rows every rank contributes to one chunk (rank-identical).

    Fields: ``counts`` per rank (padded rows included), ``rank`` this rank.
    """

    counts: tuple[int, ...]
    rank: int

    @property
    def local(self) -> int:
        return self.counts[self.rank]

    @property
    def max(self) -> int:
        return max(self.counts)


@dataclass(frozen=True, kw_only=True)
class PreparedDispatch:
    """Output of ``prepare_dispatch``: routing-derived layout, computed before data moves.

    Fields: ``chunk`` the rank-identical counts; ``cursor`` the forward's (micro-batch's)
    collective cursor, which dispatch and then combine issue on; ``layout`` strategy-specific
    (opaque).
    """

    chunk: ChunkCounts
    cursor: CollectiveCursor
    layout: Any = None


@dataclass(frozen=True, kw_only=True)
class DispatchResult:
    """What a rank received for one chunk.

    Fields (valid after ``wait()``):
        x: ``[M, H]`` received rows (x.dtype); under post-quant dispatch a
            :class:`~moerun.quant.QuantizedRows` (e4m3 rows, bit for bit the sender's, and
            their fp32 scales).
        topk_ids: ``[M, K]`` int32 local slot ids in ``[0, S_local)``, ``-1`` elsewhere.
        topk_weights: ``[M, K]`` fp32.
        counts_per_source: rows received from each rank (host ints).
        cursor: the collective cursor the combine issues on (from ``prepared``).
        meta: opaque combine metadata (strategy-specific).
    """

    x: torch.Tensor | QuantizedRows
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    counts_per_source: tuple[int, ...]
    cursor: CollectiveCursor | None = None
    meta: Any = None
    pending: tuple[Pending, ...] = field(default=(), repr=False)

    def wait(self) -> "DispatchResult":
        """Wait for the collectives that fill this result (no-op when complete)."""
        for p in self.pending:
            p.wait()
        return self


class CombineHandle:
    """An in-flight combine. ``wait()`` returns the ``[n, H]`` output (x.dtype)."""

    __slots__ = ("_pending", "_finish", "_out")

    def __init__(self, pending: tuple[Pending, ...], finish: Callable[[], torch.Tensor]) -> None:
        self._pending = pending
        self._finish: Callable[[], torch.Tensor] | None = finish
        self._out: torch.Tensor | None = None

    def wait(self) -> torch.Tensor:
        """The ``[n, H]`` combined output, finished once; later calls return it again.

        Waits as :meth:`Pending.wait` does (host-blocking on gloo or with ``debug_sync``, else
        orders the current stream), then runs the finish step on the current stream; no
        collective issued."""
        if self._finish is not None:
            for p in self._pending:
                p.wait()
            self._out = self._finish()
            self._finish = None
        assert self._out is not None
        return self._out


def multi_rank_only(deployment: Deployment) -> Eligibility:
    """``can_implement`` of the strategies that need a group: >= 2 ranks (NoComm covers one).

    Pure; host only."""
    if deployment.world_size < 2:
        return Eligibility.no(RejectReason.TOPOLOGY, "needs >= 2 ranks (NoComm covers one)")
    return Eligibility.yes()


def to_local_slot_ids(slot_ids: torch.Tensor, start: int, num_local: int) -> torch.Tensor:
    """Map global slot ids to ``[0, num_local)``; other ranks' slots and ``-1`` become ``-1``.

    ``slot_ids`` any int dtype; returns int32, same shape. Device-only, graph-safe.
    """
    local = slot_ids.to(torch.int32) - start
    keep = (slot_ids >= 0) & (local >= 0) & (local < num_local)
    return torch.where(keep, local, torch.full_like(local, -1))


class CommStrategy(abc.ABC):
    """Moves tokens between ranks. Built once per layer; holds no per-chunk state.

    Declarations (data): ``name``; ``supports_non_divisible_ep``; ``capturable`` (no host
    sync in dispatch/combine with fixed counts); ``supports_fused_shared`` (every row of this
    rank is in the dispatched rows at a known place, so the ``FUSED`` shared expert can be
    applied to exactly this rank's rows).
    """

    name: ClassVar[str]
    supports_non_divisible_ep: ClassVar[bool] = False
    capturable: ClassVar[bool] = False
    supports_fused_shared: ClassVar[bool] = False

    def __init__(self, comm: Communicator, partition: SlotPartition) -> None:
        self.comm = comm
        self.partition = partition
        self.rank = comm.mapping.rank
        self.world_size = comm.mapping.world_size
        self.slot_start, self.slot_end = partition.local_range(self.rank)

    @property
    def num_local_slots(self) -> int:
        return self.slot_end - self.slot_start

    @classmethod
    @abc.abstractmethod
    def can_implement(cls, problem: Problem, deployment: Deployment, env: Env) -> Eligibility:
        """Static limits (library, hidden size, dtype, top-k, group size). Pure."""

    def is_workload_feasible(self, all_rank_num_tokens: tuple[int, ...], num_chunks: int) -> bool:
        """Per-forward limits. Must be a pure function of rank-identical inputs."""
        return True

    def own_rows(self, dispatch: DispatchResult) -> tuple[int, int]:
        """``[start, end)`` of this rank's own rows among ``dispatch.x`` (padded rows
        included), for strategies that declare ``supports_fused_shared``. Pure; host only."""
        raise NotImplementedError(f"{self.name} does not keep this rank's rows identifiable")

    def supports_post_quant_dispatch(self) -> bool:
        """Whether :meth:`dispatch` moves :class:`~moerun.quant.QuantizedRows` (DESIGN 4.1
        step 5): a quantized layer then quantizes once before dispatch and fp8 rows plus
        scales travel; otherwise it dispatches activation-dtype rows and quantizes after.
        Pure; rank-identical (a class declaration)."""
        return False

    def prepare_dispatch(self, topk_ids: torch.Tensor, chunk: ChunkCounts,
                         cursor: CollectiveCursor) -> PreparedDispatch:
        """Routing-derived layout for one chunk. ``topk_ids``: ``[n, K]`` global slot ids;
        ``cursor``: the forward's collective cursor (``ForwardContext.cursor``)."""
        return PreparedDispatch(chunk=chunk, cursor=cursor)

    @abc.abstractmethod
    def dispatch(self, x: torch.Tensor | QuantizedRows, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor, *, prepared: PreparedDispatch,
                 async_op: bool = False) -> DispatchResult:
        """Send this rank's ``[n, H]`` rows (ids ``[n, K]`` global slots, weights fp32) to the
        ranks holding their slots. Collective (except NoComm). With ``async_op`` the result's
        tensors are valid only after ``wait()``. ``x`` may be
        :class:`~moerun.quant.QuantizedRows` only where :meth:`supports_post_quant_dispatch`;
        the received rows are then ``QuantizedRows`` too."""

    @abc.abstractmethod
    def combine(self, expert_out: torch.Tensor, dispatch: DispatchResult, *,
                async_op: bool = False) -> torch.Tensor | CombineHandle:
        """Return each source rank's partial sums and add them: ``[n, H]`` in x.dtype
        (fp32 accumulation for bf16/fp16; for quantized rows, in ``expert_out.dtype``, the
        layer's activation dtype). Collective (except NoComm)."""

    def destroy(self) -> None:
        """Release resources (none for the torch.distributed strategies).

        No collective, no device work."""
