"""Budgeted collectives for one layer (DESIGN 9).

Every collective is issued with ``async_op=True`` and returned as a :class:`Pending`; its
``wait()`` enforces the layer's budget. On gloo the wait is ``work.wait(timeout=budget)``; a
timeout or a lost peer becomes :class:`moerun.CommTimeoutError` and poisons the layer (a gloo
group is unusable after a timeout). On NCCL the process group's own watchdog detects hangs and
``wait()`` only orders the current stream after the collective, unless ``debug_sync`` asks for a
host-blocking, budgeted wait (not capturable).

The position in the collective sequence is per forward, not per layer: every collective takes
the forward's :class:`CollectiveCursor` (it lives in the scheduler's ``ForwardContext``, one per
DBO micro-batch), so two forwards or micro-batches in flight never share a counter. With a c10d
``Store`` in the Mapping, each rank writes ``moerun/L{l}/s{step}[/u{ub}]/c{seq}/r{rank}``
before issuing, so a timed-out rank can list the peers that never arrived. Costs two store
round trips per collective; off without a store.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from moerun.errors import CommTimeoutError
from moerun.mapping import Mapping

__all__ = ["Communicator", "Pending", "CollectiveCursor"]


@dataclass(eq=False)
class CollectiveCursor:
    """Where one forward (or one DBO micro-batch of it) stands in its layer's collectives.

    Fields:
        step: the layer's forward counter when the forward started (budget: warm-up or not;
            store keys; the step an error names).
        ub: the DBO micro-batch (None when the forward is not split); part of the store key.
        seq: collectives issued so far by this forward (micro-batch); advanced on each issue.

    Per-forward state: created by the scheduler in the ``ForwardContext``, never stored on the
    communicator. Not thread-safe (one forward thread).
    """

    step: int
    ub: int | None = None
    seq: int = 0


class Pending:
    """An issued collective. ``wait()`` blocks (within budget) or orders the current stream.

    Calling ``wait()`` twice is a no-op the second time. ``then`` runs once after completion
    (e.g. an unpack or a local sum) and its result is returned by ``wait()``.
    """

    __slots__ = ("_comm", "_works", "_phase", "_cursor", "_seq", "_then", "_done", "_result")

    def __init__(self, comm: "Communicator", works: list[Any], phase: str,
                 cursor: CollectiveCursor | None, seq: int,
                 then: Callable[[], Any] | None = None) -> None:
        self._comm = comm
        self._works = works
        self._phase = phase
        self._cursor = cursor
        self._seq = seq
        self._then = then
        self._done = False
        self._result: Any = None

    @property
    def phase(self) -> str:
        return self._phase

    def wait(self) -> Any:
        if not self._done:
            for work in self._works:
                self._comm._wait_work(work, self._phase, self._cursor, self._seq)
            if self._works:
                self._comm._arrived(self._cursor, self._seq)
            self._done = True
            self._result = self._then() if self._then is not None else None
            self._then = None
        return self._result


class _AllWorks:
    """Several Works waited as one (``wait(timeout=...)`` forwarded to each)."""

    def __init__(self, works: list[Any]) -> None:
        self.works = works

    def wait(self, timeout: Any = None) -> bool:
        for w in self.works:
            if timeout is None:
                w.wait()
            else:
                w.wait(timeout=timeout)
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)


class Communicator:
    """Issues this layer's collectives over ``mapping.group`` with timeouts and poisoning.

    Owned by one ``ConfigurableMoE``; strategies receive it and call its methods. Its state
    is the layer's for life (group, store, poisoned flag); per-forward positions come in as a
    :class:`CollectiveCursor`. Not thread-safe (all collectives come from the forward thread,
    DESIGN 8).
    """

    def __init__(self, mapping: Mapping, *, layer_idx: int | None) -> None:
        self.mapping = mapping
        self.layer_idx = layer_idx
        self.poisoned = False
        self._is_gloo = mapping.backend_name == "gloo"

    def budget_s(self, cursor: CollectiveCursor) -> float:
        """Seconds one collective of the forward at ``cursor`` may take (warm-up or not)."""
        m = self.mapping
        return m.warmup_timeout_s if cursor.step < m.warmup_forwards else m.timeout_s

    # -- collectives (all async; the returned Pending enforces the budget) ---------------------
    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor, *, phase: str,
                               cursor: CollectiveCursor,
                               then: Callable[[], Any] | None = None) -> Pending:
        """``out[r*n:(r+1)*n] = inp`` of rank r. Collective; async."""
        import torch.distributed as dist

        return self._issue(
            phase, cursor, lambda: dist.all_gather_into_tensor(
                out, inp, group=self.mapping.group, async_op=True), then)

    def all_to_all_single(self, out: torch.Tensor, inp: torch.Tensor,
                          out_splits: list[int], in_splits: list[int], *, phase: str,
                          cursor: CollectiveCursor,
                          then: Callable[[], Any] | None = None) -> Pending:
        """Variable-split all-to-all along dim 0 (zero-row splits still participate)."""
        import torch.distributed as dist

        return self._issue(
            phase, cursor, lambda: dist.all_to_all_single(
                out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits,
                group=self.mapping.group, async_op=True), then)

    def reduce_scatter_tensor(self, out: torch.Tensor, inp: torch.Tensor, *, phase: str,
                              cursor: CollectiveCursor,
                              then: Callable[[], Any] | None = None) -> Pending:
        """``out = sum_r inp_r[rank*n:(rank+1)*n]``. Collective; async."""
        import torch.distributed as dist

        return self._issue(
            phase, cursor, lambda: dist.reduce_scatter_tensor(
                out, inp, group=self.mapping.group, async_op=True), then)

    def all_reduce(self, t: torch.Tensor, *, phase: str, cursor: CollectiveCursor,
                   op: Any = None, then: Callable[[], Any] | None = None) -> Pending:
        """In-place all-reduce (sum by default). Collective; async."""
        import torch.distributed as dist

        op = dist.ReduceOp.SUM if op is None else op
        return self._issue(
            phase, cursor,
            lambda: dist.all_reduce(t, op=op, group=self.mapping.group, async_op=True), then)

    def batch_p2p(self, sends: list[tuple[torch.Tensor, int, int]],
                  recvs: list[tuple[torch.Tensor, int, int]], *, phase: str,
                  cursor: CollectiveCursor) -> Pending:
        """Point-to-point sends ``(tensor, group_rank, tag)`` and receives ``(tensor,
        group_rank, tag)``, issued together (``batch_isend_irecv``). A send and its receive
        carry the same tag and appear in the same relative order on both ranks (NCCL ignores
        tags). Async; an empty batch returns a completed Pending."""
        import torch.distributed as dist

        group = self.mapping.group
        ops = [dist.P2POp(dist.isend, t, dist.get_global_rank(group, r), group=group, tag=tag)
               for t, r, tag in sends]
        ops += [dist.P2POp(dist.irecv, t, dist.get_global_rank(group, r), group=group, tag=tag)
                for t, r, tag in recvs]
        if not ops:
            return Pending(self, [], phase, cursor, -1)

        def launch() -> Any:
            return _AllWorks(dist.batch_isend_irecv(ops))

        return self._issue(phase, cursor, launch, None)

    def all_gather_object_ints(self, values: list[int], *, phase: str,
                               cursor: CollectiveCursor) -> list[list[int]]:
        """All-gather a short int list from every rank. Collective; host sync."""
        inp = torch.tensor(values, dtype=torch.int64, device=self._device())
        out = torch.empty(self.mapping.world_size * len(values), dtype=torch.int64,
                          device=inp.device)
        self.all_gather_into_tensor(out, inp, phase=phase, cursor=cursor).wait()
        flat = out.tolist()  # NOTE: device->host sync
        n = len(values)
        return [flat[r * n:(r + 1) * n] for r in range(self.mapping.world_size)]

    # -- internals -----------------------------------------------------------------------
    def _device(self) -> torch.device:
        if self.mapping.backend_name == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _key(self, cursor: CollectiveCursor, seq: int, rank: int) -> str:
        layer = "-" if self.layer_idx is None else self.layer_idx
        ub = "" if cursor.ub is None else f"/u{cursor.ub}"
        return f"moerun/L{layer}/s{cursor.step}{ub}/c{seq}/r{rank}"

    def _issue(self, phase: str, cursor: CollectiveCursor, launch: Callable[[], Any],
               then: Callable[[], Any] | None) -> Pending:
        if self.poisoned:
            raise CommTimeoutError(layer=self.layer_idx, step=cursor.step, phase=phase,
                                   rank=self.mapping.rank, missing_ranks=None,
                                   detail="layer already poisoned")
        seq = cursor.seq
        cursor.seq += 1
        store = self.mapping.store
        if store is not None:
            try:
                store.set(self._key(cursor, seq, self.mapping.rank), phase)
            except Exception as exc:  # the store's host is gone: a peer was lost
                self._fail(phase, cursor, seq, f"store unreachable: {exc}")
        try:
            work = launch()
        except Exception as exc:  # gloo raises at issue when a peer already closed
            self._fail(phase, cursor, seq, f"{type(exc).__name__}: {exc}")
        return Pending(self, [work], phase, cursor, seq, then)

    def _wait_work(self, work: Any, phase: str, cursor: CollectiveCursor, seq: int) -> None:
        budget = self.budget_s(cursor)
        try:
            if self._is_gloo:
                work.wait(timeout=datetime.timedelta(seconds=budget))
            elif self.mapping.debug_sync:
                deadline = time.monotonic() + budget
                while not work.is_completed():  # NOTE: host-blocking poll (debug_sync only)
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"no completion within {budget:.1f}s")
                    time.sleep(1e-4)
                work.wait()
            else:
                work.wait()  # NCCL: orders the current stream; the watchdog owns timeouts
        except CommTimeoutError:
            raise
        except Exception as exc:
            self._fail(phase, cursor, seq, f"{type(exc).__name__}: {str(exc)[:200]}")

    def _arrived(self, cursor: CollectiveCursor, seq: int) -> None:
        store = self.mapping.store
        if store is not None:
            try:
                store.delete_key(self._key(cursor, seq, self.mapping.rank))
            except Exception:
                pass  # cleanup only; a lost store shows up at the next collective

    def _missing_ranks(self, cursor: CollectiveCursor, seq: int) -> list[int] | None:
        store = self.mapping.store
        if store is None:
            return None
        try:
            return [r for r in range(self.mapping.world_size)
                    if not store.check([self._key(cursor, seq, r)])]
        except Exception:
            return None  # the store itself is gone (its host rank exited): unknown

    def _fail(self, phase: str, cursor: CollectiveCursor, seq: int, detail: str) -> None:
        self.poisoned = True
        raise CommTimeoutError(layer=self.layer_idx, step=cursor.step, phase=phase,
                               rank=self.mapping.rank,
                               missing_ranks=self._missing_ranks(cursor, seq), detail=detail)
