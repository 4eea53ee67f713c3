"""The one multi-rank launcher of the test suite (DESIGN 11).

A session-scoped :class:`WorkerPool` per world size: ranks are spawned once, then configs are
sent over per-rank queues. Each task gets a fresh gloo group (and a prefixed c10d store), so a
task that poisons its group leaves the pool usable; the group is freed on every rank when the
next task arrives (a task's reference cycles are collected when it ends; a group it leaves
referenced is a ``GroupLeak`` failure). A task that exceeds its hard limit kills the pool; the
next ``run`` respawns it.

Task functions are module-level functions ``fn(ctx: RankContext, **kwargs) -> picklable``;
they build the unsharded reference from the same seeded global inputs inside the worker and
return plain Python values (floats, lists), never shared-memory tensors.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import multiprocessing as mp
import queue
import sys
import time
import traceback
from typing import Any, Callable

FIRST_COLLECTIVE_BUDGET_S = 60.0
COLLECTIVE_BUDGET_S = 10.0
HARD_KILL_S = 120.0


@dataclasses.dataclass
class RankContext:
    """What a task sees on one rank: ``rank``, ``world_size``, ``group`` (fresh gloo group),
    ``store`` (a c10d store prefixed for this task), ``task_id``."""

    rank: int
    world_size: int
    group: Any
    store: Any
    task_id: int

    def mapping(self, **kwargs: Any):
        from moerun import Mapping

        kwargs.setdefault("timeout_s", COLLECTIVE_BUDGET_S)
        kwargs.setdefault("warmup_timeout_s", FIRST_COLLECTIVE_BUDGET_S)
        return Mapping(rank=self.rank, world_size=self.world_size, group=self.group, **kwargs)


@dataclasses.dataclass
class TaskFailure:
    rank: int
    exc_type: str
    message: str
    traceback: str


def _worker(rank: int, world_size: int, host: str, port: int, tasks: Any, results: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore(host, port, world_size + 1, is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore("default", store), rank=rank,
                            world_size=world_size)
    group = None
    while True:
        item = tasks.get()
        # NOTE: the previous task's group goes here, once every rank has reported that task
        # (the parent sent the next item), at the same point on every rank; not at the end of
        # the task, where a rank that closed its layer must keep its group open while its
        # peers still wait in the forward (they read its marker in the store).
        group = None
        if item is None:
            break
        task_id, fn, kwargs = item
        group = dist.new_group(backend="gloo",
                               timeout=datetime.timedelta(seconds=HARD_KILL_S))
        ctx = RankContext(rank=rank, world_size=world_size, group=group,
                          store=dist.PrefixStore(f"task{task_id}", store), task_id=task_id)
        try:
            out: Any = ("ok", fn(ctx, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = ("err", TaskFailure(rank=rank, exc_type=type(exc).__name__, message=str(exc),
                                      traceback=traceback.format_exc()))
        try:
            dist.destroy_process_group(group)
        except Exception:
            pass
        del ctx
        # NOTE: destroy_process_group only unregisters a gloo group; it closes its
        # connections when its last reference goes, and its destructor blocks until its
        # pending collective ends: after a fault, until the peers have freed theirs or
        # gloo's own timeout (HARD_KILL_S). A group the task left in a reference cycle
        # was freed by whichever later garbage collection found it, inside another task,
        # while the peers' groups were still alive: that task stalled for up to
        # HARD_KILL_S (the fault-path hang, docs/DECISIONS.md). So collect the cycles now
        # (`group` keeps the group itself alive until the next item), and refuse a
        # group something else still holds.
        if sys.getrefcount(group) > 2:  # `group` and the argument: nothing else
            gc.collect()
        if sys.getrefcount(group) > 2:
            out = ("err", TaskFailure(
                rank=rank, exc_type="GroupLeak", traceback="",
                message=f"{fn.__name__} left its process group referenced after it "
                        "returned (a global, a thread or its result holds it); its peers' "
                        "pending collectives would wait on it: drop the reference"))
        results.put((task_id, rank, out))
    dist.destroy_process_group()


class WorkerPool:
    """``world_size`` spawned ranks that run tasks until closed."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._procs: list[Any] = []
        self._next_id = 0

    def _start(self) -> None:
        import datetime as _dt

        import torch.distributed as dist

        ctx = mp.get_context("spawn")
        self._store = dist.TCPStore("127.0.0.1", 0, self.world_size + 1, is_master=True,
                                    wait_for_workers=False, timeout=_dt.timedelta(seconds=60))
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        self._results = ctx.Queue()
        self._procs = [ctx.Process(target=_worker, daemon=True,
                                   args=(r, self.world_size, "127.0.0.1", self._store.port,
                                         self._tasks[r], self._results))
                       for r in range(self.world_size)]
        for p in self._procs:
            p.start()

    def kill(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(timeout=5)
        self._procs = []

    def close(self) -> None:
        if self._procs and all(p.is_alive() for p in self._procs):
            for q in self._tasks:
                q.put(None)
            for p in self._procs:
                p.join(timeout=10)
        self.kill()

    def run(self, fn: Callable[..., Any], *, timeout: float = HARD_KILL_S,
            per_rank: list[dict] | None = None, allow_errors: bool = False,
            respawn_after: bool = False, **kwargs: Any) -> list[Any]:
        """Run ``fn(ctx, **kwargs)`` on every rank; returns per-rank results.

        ``per_rank``: extra kwargs for each rank. A rank's exception is re-raised here as
        ``RuntimeError`` with its traceback unless ``allow_errors`` (then ``TaskFailure``
        objects are returned in its place). ``respawn_after``: kill the pool afterwards (a
        task that hung or killed a rank on purpose).
        """
        if not self._procs or not all(p.is_alive() for p in self._procs):
            self.kill()
            self._start()
        task_id = self._next_id
        self._next_id += 1
        for r in range(self.world_size):
            kw = dict(kwargs)
            if per_rank is not None:
                kw.update(per_rank[r])
            self._tasks[r].put((task_id, fn, kw))
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(results) < self.world_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"task {fn.__name__} did not finish on ranks "
                                       f"{sorted(set(range(self.world_size)) - set(results))} "
                                       f"within {timeout:.0f}s; the pool was killed")
                try:
                    tid, rank, out = self._results.get(timeout=min(remaining, 1.0))
                except queue.Empty:
                    dead = [r for r, p in enumerate(self._procs)
                            if not p.is_alive() and r not in results]
                    if dead and not allow_errors:
                        raise RuntimeError(f"ranks {dead} died during {fn.__name__}")
                    for r in dead:
                        results[r] = TaskFailure(rank=r, exc_type="ProcessExit",
                                                 message="worker exited", traceback="")
                    continue
                if tid != task_id:
                    continue  # a late answer of an earlier, killed task
                kind, value = out
                if kind == "err" and not allow_errors:
                    raise RuntimeError(f"rank {rank} failed in {fn.__name__}: "
                                       f"{value.exc_type}: {value.message}\n{value.traceback}")
                results[rank] = value
        except BaseException:
            self.kill()
            raise
        if respawn_after:
            self.kill()
        return [results[r] for r in range(self.world_size)]


_POOLS: dict[int, WorkerPool] = {}


def get_pool(world_size: int) -> WorkerPool:
    pool = _POOLS.get(world_size)
    if pool is None:
        pool = _POOLS[world_size] = WorkerPool(world_size)
    return pool


def close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()




