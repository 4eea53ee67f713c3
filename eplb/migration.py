"""One layer's rebalance at a due step (DESIGN 8): step check, window all-reduce, policy,
weight migration. Called from ``LayerBalancer.done_set_cpu`` on the forward thread, so every
EPLB collective is issued in the same order on every rank. This module imports nothing from
``eplb.balancer`` (the handle is duck-typed), so the two never import each other.

Migration plan (pure function of the old and new ``phy2log`` rows, identical on every rank):
for each slot ``s`` whose expert changes to ``e``, the source is a slot on ``s``'s own rank
that held ``e`` before (a local copy) if there is one, else the lowest slot holding ``e``
(a point-to-point send). Sends read the old weights before any slot is overwritten; weights
and maps are then written in place with ``copy_`` (tensor identities never change). A slot
travels as the bytes of all its tensors: ``w13``, ``w2`` and, for an FP8 layer, their block
scales ``w13_scale`` / ``w2_scale`` (so weights and scales always move together).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from eplb.policy import rebalance
from moerun.errors import EPLBStepMismatch

__all__ = ["MigrationPlan", "MigrationStats", "plan_migration", "rebalance_layer"]


@dataclass(frozen=True, kw_only=True)
class MigrationStats:
    """One layer's migration: ``layer``, ``step``, ``slots_changed`` (all ranks),
    ``bytes_moved`` (all ranks, point-to-point + local copies), ``full_reload_bytes``,
    ``seconds`` (this rank's host time, the stall)."""

    layer: int
    step: int
    slots_changed: int
    bytes_moved: int
    full_reload_bytes: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class MigrationPlan:
    """``moves``: ``(dest_slot, src_slot)`` for every slot whose expert changes, ascending
    dest slot. ``slots_per_rank``: contiguous slots per rank."""

    moves: tuple[tuple[int, int], ...]
    slots_per_rank: int

    def rank_of(self, slot: int) -> int:
        """The rank holding physical slot ``slot``. Pure; host only."""
        return slot // self.slots_per_rank


def plan_migration(old: list[int], new: list[int], slots_per_rank: int) -> MigrationPlan:
    """Sources for every changed slot (pure; see the module docstring)."""
    holders: dict[int, list[int]] = {}
    for s, e in enumerate(old):
        holders.setdefault(e, []).append(s)
    moves = []
    for s, e in enumerate(new):
        if old[s] == e:
            continue
        rank = s // slots_per_rank
        srcs = holders[e]  # every expert has >= 1 replica in the old placement
        local = [x for x in srcs if x // slots_per_rank == rank]
        moves.append((s, local[0] if local else srcs[0]))
    return MigrationPlan(moves=tuple(moves), slots_per_rank=slots_per_rank)


def _check_steps(handle: Any, layer: Any, cursor: Any) -> None:
    owner = handle.owner
    counts = [owner.step_idx] + [
        owner._layers[i]._layer.step if i in owner._layers and owner._layers[i]._layer
        is not None else -1 for i in range(owner.config.num_layers)]
    gathered = layer.communicator.all_gather_object_ints(counts, phase="eplb.step_check",
                                                         cursor=cursor)
    if any(g != gathered[0] for g in gathered):
        bad = [r for r, g in enumerate(gathered) if g != gathered[0]]
        detail = "; ".join(f"rank {r}: step {g[0]}, layer forwards {g[1:]}"
                           for r, g in enumerate(gathered))
        raise EPLBStepMismatch(
            f"EPLB step mismatch at the rebalance of layer {handle.layer_idx}: ranks {bad} "
            f"disagree with rank 0 ({detail}); every rank must call balancer.step() after "
            "every forward, dummy ones included", ranks=bad)


def rebalance_layer(handle: Any, layer: Any, ctx: Any) -> MigrationStats | None:
    """Rebalance ``handle.layer_idx`` now, on the forward's main stream (``ctx.streams[0]``)
    after it waited on ``ctx.experts_done`` (events ``start_set_cpu`` recorded on every stream
    the forward used). Collectives (on ``ctx.cursor``): step check (all-gather), window
    all-reduce, point-to-point weight sends. Host syncs: yes (rebalance steps only). Returns
    :class:`MigrationStats`, or None when the window is empty."""
    if not ctx.streams:
        return _rebalance_layer(handle, layer, ctx.cursor)
    main = ctx.streams[0]
    with torch.cuda.stream(main):
        for ev in ctx.experts_done:
            main.wait_event(ev)
        return _rebalance_layer(handle, layer, ctx.cursor)


def _rebalance_layer(handle: Any, layer: Any, cursor: Any) -> MigrationStats | None:
    owner, cfg, lid = handle.owner, handle.owner.config, handle.layer_idx
    t0 = time.perf_counter()
    comm = layer.communicator
    distributed = layer.mapping.world_size > 1
    if distributed:
        _check_steps(handle, layer, cursor)
    load = (owner.window[lid].sum(dim=0) + owner.current[lid]).clone()
    if distributed:
        comm.all_reduce(load, phase="eplb.window", cursor=cursor).wait()
    owner.last_global_load[lid] = load.cpu()
    if int(load.sum()) == 0:  # NOTE: host sync; empty window: keep the placement
        return None
    old = owner.phy2log[lid].cpu()
    placement = rebalance(load.cpu()[None], cfg.num_slots, cfg.num_groups, cfg.num_nodes,
                          cfg.num_ranks, old_phy2log=old[None])
    new = placement.phy2log[0]
    plan = plan_migration(old.tolist(), new.tolist(), cfg.slots_per_rank)
    rank = layer.mapping.rank
    lo = layer.slot_start
    w13 = layer.w13
    # every per-slot tensor moves together: weights, and an FP8 layer's block scales
    tensors = [t for t in (layer.w13, layer.w2, getattr(layer, "w13_scale", None),
                           getattr(layer, "w2_scale", None)) if t is not None]
    sizes = [t[0].numel() * t.element_size() for t in tensors]  # bytes of one slot

    def packed(slot: int) -> torch.Tensor:
        """One slot's tensors as one ``uint8`` vector (dtype-agnostic: fp8 and fp32 too)."""
        return torch.cat([t[slot - lo].reshape(-1).view(torch.uint8) for t in tensors])

    sends, recvs, local = [], [], []
    for dest, src in plan.moves:
        d_rank, s_rank = plan.rank_of(dest), plan.rank_of(src)
        if d_rank == s_rank == rank:
            local.append((dest, packed(src).clone()))
        elif s_rank == rank:
            sends.append((packed(src).contiguous(), d_rank, dest))
        elif d_rank == rank:
            buf = torch.empty(sum(sizes), dtype=torch.uint8, device=w13.device)
            recvs.append((buf, s_rank, dest))
    if distributed:
        comm.batch_p2p(sends, recvs, phase="eplb.migrate", cursor=cursor).wait()
    with torch.no_grad():
        for dest, buf in local + [(dest, buf) for buf, _, dest in recvs]:
            off = 0
            for t, size in zip(tensors, sizes):
                t[dest - lo].copy_(buf[off:off + size].view(t.dtype).view_as(t[0]))
                off += size
        owner.phy2log[lid].copy_(placement.phy2log[0])
        width = owner.log2phy.shape[2]
        owner.log2phy[lid].fill_(-1)
        owner.log2phy[lid, :, : placement.log2phy.shape[2]].copy_(
            placement.log2phy[0][:, :width])
        owner.logcnt[lid].copy_(placement.logcnt[0])
    if w13.is_cuda:
        event = torch.cuda.Event()
        event.record()
        handle.set_migration_event(event)
    per_slot = sum(sizes)
    return MigrationStats(layer=lid, step=handle.model_step(), slots_changed=len(plan.moves),
                          bytes_moved=len(plan.moves) * per_slot,
                          full_reload_bytes=cfg.num_slots * per_slot,
                          seconds=time.perf_counter() - t0)
