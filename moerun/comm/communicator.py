"""Budgeted collectives for one layer (DESIGN 9, issue 14).

Every collective is issued with ``async_op=True`` and returned as a :class:`Pending`; its
``wait()`` enforces the layer's budget. A timeout or a lost peer becomes
:class:`moerun.CommTimeoutError` and poisons the layer (a gloo group is unusable after a
timeout). On NCCL the process group's own watchdog detects hangs and ``wait()`` only orders the
current stream after the collective, unless ``debug_sync`` asks for a host-blocking, budgeted
wait (not capturable).

**The budget holds whatever torch's ``wait(timeout)`` does.** On gloo a wait never calls
``work.wait(timeout=...)`` on an unfinished Work: it polls ``work.is_completed()`` against a
deadline (checks with a ``sched_yield`` between them for 0.5 ms, then naps that double up to
1 ms, so a long wait costs no core), and calls ``work.wait()`` only once the Work is
complete, to surface the error gloo recorded.
NOTE: on torch 2.13's gloo, ``reduce_scatter_single`` (and ``reduce_scatter`` /
``_reduce_scatter_base``) and ``batch_isend_irecv`` return Works whose ``is_completed()`` stays
False and whose ``wait(timeout)`` of the reduce-scatter ignores the timeout (issue 14 item 3).
So on gloo :meth:`Communicator.reduce_scatter_tensor` runs as an ``all_to_all_single`` of the
partial sums plus a local sum (the same bytes on the wire), and :meth:`Communicator.batch_p2p`
as one ``all_to_all_single`` of the packed bytes; every Work moerun waits on is then an
ordinary collective whose ``is_completed()`` is truthful.

The position in the collective sequence is per forward, not per layer: every collective takes
the forward's :class:`CollectiveCursor` (it lives in the scheduler's ``ForwardContext``, one per
DBO micro-batch), so two forwards or micro-batches in flight never share a counter.

**Store keys.** With a c10d ``Store`` in the Mapping, each rank writes
``moerun/L{l}/g{gen}/s{step}[/u{ub}]/c{seq}/r{rank}`` before issuing, so a timed-out rank can
list the peers that never arrived (two store round trips per collective; off without a store).
``gen`` counts the Communicators built for layer ``l`` on this rank (one ``store.add`` at
build), so a layer rebuilt on the same store never reads its predecessor's keys. A rank whose
layer is closed or poisoned posts ``moerun/L{l}/g{gen}/down/r{rank}``; a wait that has run
for 20 ms looks for such markers every 50 ms and, when a peer went down before reaching this
collective, raises :class:`moerun.LayerClosedError` naming it at once instead of timing out.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from moerun.errors import CommTimeoutError, LayerClosedError, MoERunError
from moerun.mapping import Mapping

__all__ = ["Communicator", "Pending", "CollectiveCursor"]

#: Poll of an unfinished Work (gloo, or NCCL with ``debug_sync``): for _YIELD_S check
#: ``is_completed()`` with a ``sched_yield`` between checks (the core goes to any runnable
#: thread, gloo's own first), then sleep between checks, the nap doubling from _NAP_MIN_S up to
#: _NAP_MAX_S, so a long wait costs no core. A plain busy spin, or naps from the start, cost
#: ~100 us of median latency per small collective on 2 gloo ranks of a 2-core host; this
#: matches ``work.wait(timeout)`` (figures in docs/DECISIONS.md, issue 14).
_YIELD_S = 500e-6
_NAP_MIN_S = 50e-6
_NAP_MAX_S = 1e-3
_sched_yield = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))
#: With a store: a wait first looks for closed/poisoned peers after this long, then this often.
_PEER_CHECK_AFTER_S = 0.02
_PEER_CHECK_EVERY_S = 0.05


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
    (e.g. an unpack or a local sum) and its result is returned by ``wait()``. The budget runs
    from the first ``wait()`` call and covers every Work of the Pending together.
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
        """Wait for the collective once and return ``then()``'s result (None without ``then``).

        Gloo, or NCCL with ``debug_sync``: host-blocking poll within the budget (not capturable);
        NCCL otherwise: orders the current stream after the collective (no host sync). Raises
        :class:`moerun.CommTimeoutError` / :class:`moerun.LayerClosedError`."""
        if not self._done:
            if self._works:
                comm, cursor = self._comm, self._cursor
                deadline = time.monotonic() + comm.budget_s(cursor)
                for work in self._works:
                    comm._wait_work(work, self._phase, cursor, self._seq, deadline)
                comm._arrived(cursor, self._seq)
            self._done = True
            self._result = self._then() if self._then is not None else None
            self._then = None
        return self._result


class _AllWorks:
    """Several Works (NCCL point-to-point) waited as one."""

    def __init__(self, works: list[Any]) -> None:
        self.works = works

    def wait(self, timeout: Any = None) -> bool:
        for w in self.works:
            w.wait() if timeout is None else w.wait(timeout=timeout)
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)


class Communicator:
    """Issues this layer's collectives over ``mapping.group`` with timeouts and poisoning.

    Owned by one ``ConfigurableMoE``; strategies receive it and call its methods. Its state
    is the layer's for life (group, store, store generation, poisoned flag); per-forward
    positions come in as a :class:`CollectiveCursor`. Not thread-safe (all collectives come
    from the forward thread, DESIGN 8).

    Construction: one ``store.add`` when the Mapping carries a store (the generation).
    """

    def __init__(self, mapping: Mapping, *, layer_idx: int | None) -> None:
        self.mapping = mapping
        self.layer_idx = layer_idx
        self.poisoned = False
        self._is_gloo = mapping.backend_name == "gloo"
        self._poll_waits = self._is_gloo or mapping.debug_sync
        layer = "-" if layer_idx is None else layer_idx
        store = mapping.store
        #: Communicators built for this layer index on this rank before this one (store only;
        #: 0 without a store). Rank-identical when every rank builds its layers in one order.
        self.generation = 0
        if store is not None:
            self.generation = int(store.add(f"moerun/L{layer}/gen/r{mapping.rank}", 1))
        self._prefix = f"moerun/L{layer}/g{self.generation}"
        self._store_ok = store is not None
        self._down_posted = False

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
        """Variable-split all-to-all along dim 0 (zero-row splits still participate).

        Collective over ``mapping.group``; async (returns a :class:`Pending`); one store write
        first when the Mapping has a store."""
        import torch.distributed as dist

        return self._issue(
            phase, cursor, lambda: dist.all_to_all_single(
                out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits,
                group=self.mapping.group, async_op=True), then)

    def reduce_scatter_tensor(self, out: torch.Tensor, inp: torch.Tensor, *, phase: str,
                              cursor: CollectiveCursor,
                              then: Callable[[], Any] | None = None) -> Pending:
        """``out = sum_r inp_r[rank*n:(rank+1)*n]``. Collective; async.

        ``inp`` ``[R*n, ...]`` contiguous, ``out`` ``[n, ...]`` of its dtype. On gloo: an
        ``all_to_all_single`` of the ``R`` row blocks, then ``out = sum`` over the received
        blocks in rank order, run by ``wait()`` (module docstring: gloo's reduce-scatter Work
        cannot be waited within a budget). Elsewhere the backend's reduce-scatter.
        """
        import torch.distributed as dist

        if not self._is_gloo:
            return self._issue(
                phase, cursor, lambda: dist.reduce_scatter_tensor(
                    out, inp, group=self.mapping.group, async_op=True), then)
        world, rows = self.mapping.world_size, out.shape[0]
        recv = torch.empty_like(inp)

        def reduce() -> Any:
            torch.sum(recv.view(world, *out.shape), dim=0, out=out)
            return then() if then is not None else None

        splits = [rows] * world
        return self.all_to_all_single(recv, inp, splits, splits, phase=phase, cursor=cursor,
                                      then=reduce)

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
        group_rank, tag)``, issued together. A send and its receive carry the same tag and
        appear in the same relative order on both ranks. Async.

        On gloo: one ``all_to_all_single`` of the packed bytes (per peer, in list order), so
        it is a **collective**: every rank of the group calls it, with empty lists when it has
        nothing to move; receive tensors must be contiguous (written in place by ``wait()``).
        Elsewhere ``batch_isend_irecv`` (NCCL ignores tags); an empty batch is then a
        completed Pending.
        """
        import torch.distributed as dist

        if self._is_gloo:
            return self._p2p_as_all_to_all(sends, recvs, phase=phase, cursor=cursor)
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

    # -- lifecycle markers -----------------------------------------------------------------
    def poison(self, cursor: CollectiveCursor, seq: int) -> None:
        """Mark the layer unusable (its group has a collective that will not complete).

        Posts this rank's ``down`` marker (``poisoned step ub seq``) when the Mapping has a
        store, so peers waiting in a collective this rank will never issue raise at once.
        Store round trips: two, errors ignored. No collective."""
        self.poisoned = True
        ub = "-" if cursor.ub is None else cursor.ub
        self._post_down(f"poisoned {cursor.step} {ub} {seq}")

    def announce_closed(self, step: int) -> None:
        """The layer was closed after ``step`` forwards: post ``closed step`` (store only; a
        poisoned layer keeps its ``poisoned`` marker). Store round trips: two, errors
        ignored. No collective."""
        self._post_down(f"closed {step}")

    def _post_down(self, value: str) -> None:
        store = self.mapping.store
        if store is None or self._down_posted:
            return
        self._down_posted = True
        try:
            store.set(f"{self._prefix}/down/r{self.mapping.rank}", value)
            store.add(f"{self._prefix}/down/n", 1)
        except Exception:
            self._store_ok = False  # the store's host is gone: peers learn it from gloo

    def _peers_down(self, cursor: CollectiveCursor, seq: int) -> tuple[str, list[int]] | None:
        """``("closed" | "poisoned", ranks)`` of the peers that went down before issuing the
        collective ``seq`` of the forward at ``cursor`` (closed ranks first), or None. One
        store round trip while no rank is down."""
        store = self.mapping.store
        try:
            if store.add(f"{self._prefix}/down/n", 0) == 0:
                return None
            closed, poisoned = [], []
            for r in range(self.mapping.world_size):
                key = f"{self._prefix}/down/r{r}"
                if r == self.mapping.rank or not store.check([key]):
                    continue
                kind, step, *rest = store.get(key).decode().split()
                if kind == "closed" and int(step) <= cursor.step:
                    closed.append(r)  # closed before running this forward
                elif kind == "poisoned":
                    p_ub = None if rest[0] == "-" else int(rest[0])
                    if int(step) < cursor.step or (int(step) == cursor.step
                                                   and p_ub == cursor.ub
                                                   and int(rest[1]) < seq):
                        poisoned.append(r)  # gave up before issuing this collective
        except Exception:
            self._store_ok = False  # the store's host is gone: rely on the deadline
            return None
        if closed:
            return "closed", closed
        if poisoned:
            return "poisoned", poisoned
        return None

    # -- internals -----------------------------------------------------------------------
    def _device(self) -> torch.device:
        if self.mapping.backend_name == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _key(self, cursor: CollectiveCursor, seq: int, rank: int) -> str:
        ub = "" if cursor.ub is None else f"/u{cursor.ub}"
        return f"{self._prefix}/s{cursor.step}{ub}/c{seq}/r{rank}"

    def _p2p_as_all_to_all(self, sends: list[tuple[torch.Tensor, int, int]],
                           recvs: list[tuple[torch.Tensor, int, int]], *, phase: str,
                           cursor: CollectiveCursor) -> Pending:
        """:meth:`batch_p2p` on gloo: the bytes of every send, grouped by destination rank in
        list order, through one ``all_to_all_single``; ``wait()`` copies each received block
        into its receive tensor."""
        world = self.mapping.world_size
        out_by_rank: list[list[torch.Tensor]] = [[] for _ in range(world)]
        for t, r, _ in sends:
            out_by_rank[r].append(t.contiguous().reshape(-1).view(torch.uint8))
        in_by_rank: list[list[torch.Tensor]] = [[] for _ in range(world)]
        for t, r, tag in recvs:
            if not t.is_contiguous():
                raise ValueError(f"batch_p2p: the receive tensor from rank {r} (tag {tag}) "
                                 f"has strides {t.stride()}; receive into a contiguous tensor")
            in_by_rank[r].append(t.view(-1).view(torch.uint8))
        in_splits = [sum(b.numel() for b in bs) for bs in out_by_rank]
        out_splits = [sum(b.numel() for b in bs) for bs in in_by_rank]
        device = self._device()
        flat = [b for bs in out_by_rank for b in bs]
        send = torch.cat(flat) if flat else torch.empty(0, dtype=torch.uint8, device=device)
        recv = torch.empty(sum(out_splits), dtype=torch.uint8, device=send.device)

        def unpack() -> None:
            off = 0
            for views in in_by_rank:
                for v in views:
                    v.copy_(recv[off:off + v.numel()])
                    off += v.numel()

        return self.all_to_all_single(recv, send, out_splits, in_splits, phase=phase,
                                      cursor=cursor, then=unpack)

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

    def _wait_work(self, work: Any, phase: str, cursor: CollectiveCursor, seq: int,
                   deadline: float) -> None:
        try:
            if self._poll_waits:
                if not work.is_completed():
                    self._poll(work, phase, cursor, seq, deadline)
                work.wait()  # complete: returns at once, or raises the error gloo recorded
            else:
                work.wait()  # NCCL: orders the current stream; the watchdog owns timeouts
        except MoERunError:
            raise
        except Exception as exc:
            self._fail(phase, cursor, seq, f"{type(exc).__name__}: {str(exc)[:200]}")

    def _poll(self, work: Any, phase: str, cursor: CollectiveCursor, seq: int,
              deadline: float) -> None:
        """Return once ``work.is_completed()``. Raises TimeoutError at ``deadline`` and
        :class:`LayerClosedError` when the store shows a peer that went down before this
        collective. NOTE: host-blocking; never calls ``work.wait`` on an unfinished Work."""
        now = time.monotonic()
        yield_end = min(now + _YIELD_S, deadline)
        while now < yield_end:
            if work.is_completed():
                return
            _sched_yield()
            now = time.monotonic()
        check_at = now + _PEER_CHECK_AFTER_S if self._store_ok else math.inf
        nap = _NAP_MIN_S
        while not work.is_completed():
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(f"not complete within the budget of "
                                   f"{self.budget_s(cursor):g}s")
            if now >= check_at and self._store_ok:
                down = self._peers_down(cursor, seq)
                if down is not None:
                    self._raise_peer_down(phase, cursor, seq, *down)
                check_at = now + _PEER_CHECK_EVERY_S
            time.sleep(min(nap, deadline - now))
            nap = min(2 * nap, _NAP_MAX_S)

    def _raise_peer_down(self, phase: str, cursor: CollectiveCursor, seq: int, kind: str,
                         ranks: list[int]) -> None:
        self.poison(cursor, seq)
        why = "" if kind == "closed" else " (by an earlier CommTimeoutError)"
        raise LayerClosedError(
            f"layer {self.layer_idx} is {kind} on rank(s) {ranks}{why} and will not join this "
            f"forward (seen in the c10d store by rank {self.mapping.rank} "
            f"while waiting in phase {phase!r} at step {cursor.step}); this rank's layer is now "
            "poisoned too (its collective stays pending on the group): close it and build a "
            "new layer on a new process group", ranks=ranks)

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
        self.poison(cursor, seq)
        raise CommTimeoutError(layer=self.layer_idx, step=cursor.step, phase=phase,
                               rank=self.mapping.rank,
                               missing_ranks=self._missing_ranks(cursor, seq), detail=detail)
