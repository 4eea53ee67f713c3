"""Steady-state latency of small gloo collectives through moerun's Communicator, and of a
small two-rank layer forward (a CPU probe for the wait path; not a GPU performance claim).

Two spawned ranks, ``torch.set_num_threads(1)``, one gloo group; per item the median, mean
and 99th percentile of ``--iters`` timed calls after a warm-up. Usage (CPU):

    python benchmarks/gloo_latency.py [--iters 4000]

To compare two trees, run it with ``PYTHONPATH=<tree>`` for each (the first line printed is
the ``moerun`` package that was imported) and alternate the runs: this 2-core VM drifts.
"""

from __future__ import annotations

import argparse
import datetime
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _timed(fn, iters: int, warmup: int) -> tuple[float, float, float]:
    """(median, mean, p99) of ``iters`` calls of ``fn`` in µs."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    samples.sort()
    return samples[len(samples) // 2], statistics.fmean(samples), samples[int(len(samples) * 0.99)]


def _worker(rank: int, port: int, iters: int, queue) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0,
                          timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    group = dist.new_group(backend="gloo")

    import moerun
    from moerun import ConfigurableMoE, Mapping, MoEConfig
    from moerun.comm import CollectiveCursor, Communicator

    mapping = Mapping(rank=rank, world_size=2, group=group, timeout_s=10, warmup_timeout_s=10)
    comm = Communicator(mapping, layer_idx=0)
    cursor = CollectiveCursor(step=10)  # past the warm-up budget
    gen = torch.Generator().manual_seed(rank)
    gather_in, gather_out = torch.randint(0, 9, (2,), generator=gen), torch.empty(4, dtype=torch.int64)
    reduce_t = torch.randn(16, generator=gen)
    rs_in, rs_out = torch.randn(8, 16, generator=gen), torch.empty(4, 16)
    rows: dict[str, tuple[float, float, float]] = {
        "all_gather int64[2]": _timed(lambda: comm.all_gather_into_tensor(
            gather_out, gather_in, phase="v", cursor=cursor).wait(), iters, 200),
        "all_reduce f32[16]": _timed(lambda: comm.all_reduce(
            reduce_t, phase="v", cursor=cursor).wait(), iters, 200),
        "reduce_scatter f32[8,16]": _timed(lambda: comm.reduce_scatter_tensor(
            rs_out, rs_in, phase="c", cursor=cursor).wait(), iters, 200),
    }
    cfg = MoEConfig(num_experts=8, top_k=2, hidden_size=64, intermediate_size=64)
    wgen = torch.Generator().manual_seed(0)  # the same weights on both ranks
    x, logits = torch.randn(4, 64, generator=gen), torch.randn(4, 8, generator=gen)
    for idx, strategy in enumerate(("allgather", "alltoall"), start=1):
        layer = ConfigurableMoE(cfg, mapping, layer_idx=idx, device="cpu", comm=strategy)
        layer.load_weights(torch.randn(8, 128, 64, generator=wgen) * 0.1,
                           torch.randn(8, 64, 64, generator=wgen) * 0.1)
        rows[f"layer forward T=4 {strategy}"] = _timed(
            lambda: layer(x, logits, all_rank_num_tokens=[4, 4]), iters // 4, 50)
        layer.close()
    if rank == 0:
        queue.put((moerun.__file__, rows))
    dist.barrier(group=group)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=4000,
                        help="timed calls per collective (a quarter of it per layer forward)")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, port, args.iters, queue)) for r in range(2)]
    for p in procs:
        p.start()
    where, rows = queue.get(timeout=600)
    for p in procs:
        p.join()
    print("moerun from", where)
    for name, (med, mean, p99) in rows.items():
        print(f"{name:28s} median {med:7.1f} us  mean {mean:7.1f} us  p99 {p99:8.1f} us")


if __name__ == "__main__":
    main()
