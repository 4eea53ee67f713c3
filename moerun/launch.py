"""Spawn N local ranks for ``moerun run --ranks N`` (gloo on CPU, NCCL when N GPUs exist).

Each rank runs ``fn(rank, world_size, group, store, **kwargs)`` and returns a picklable value;
the parent collects them in rank order. A rank that fails or exceeds ``timeout_s`` makes the
whole launch fail with the rank named.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import queue
import time
import traceback
from typing import Any, Callable

__all__ = ["launch"]


def _rank_main(rank: int, world_size: int, port: int, use_nccl: bool, fn: Callable[..., Any],
               kwargs: dict, results: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        store = dist.TCPStore("127.0.0.1", port, world_size + 1, is_master=False,
                              timeout=datetime.timedelta(seconds=60))
        if use_nccl:
            torch.cuda.set_device(rank)
        backend = "nccl" if use_nccl else "gloo"
        dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank,
                                world_size=world_size)
        group = dist.new_group(backend=backend)
        out = ("ok", fn(rank, world_size, group, dist.PrefixStore("moerun", store), **kwargs))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        out = ("err", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    results.put((rank, out))


def launch(fn: Callable[..., Any], world_size: int, *, use_nccl: bool = False,
           timeout_s: float = 300.0, **kwargs: Any) -> list[Any]:
    """Run ``fn`` on ``world_size`` spawned ranks; return their results in rank order.

    Raises RuntimeError naming the first failing rank (with its traceback) or the ranks that
    did not answer within ``timeout_s``.

    Side effects: starts a TCPStore on 127.0.0.1 and ``world_size`` spawned processes (each runs
    ``fn`` with its own collectives); blocks until they finish; kills ranks still alive 10 s after.
    """
    import torch.distributed as dist

    ctx = mp.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True,
                          wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(r, world_size, store.port, use_nccl, fn, kwargs, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < world_size:
            try:
                rank, out = results.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if not p.is_alive() and r not in got]
                if dead or time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(got))
                    raise RuntimeError(f"ranks {missing} did not finish (exited or timed out "
                                       f"after {timeout_s:.0f}s)") from None
                continue
            if out[0] == "err":
                raise RuntimeError(f"rank {rank} failed: {out[1]}")
            got[rank] = out[1]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [got[r] for r in range(world_size)]
