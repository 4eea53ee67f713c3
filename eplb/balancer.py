"""``LoadBalancer`` (model-wide) and ``LayerBalancer`` (per-layer hook handle), DESIGN 8.

Timeline of one model step ``s`` for layer ``l`` (hooks called by the scheduler, each with
the forward's context ``ctx`` first):
  start_wait_gpu   current stream waits on the last migration's event (CUDA; no-op on CPU)
  done_wait_gpu    statistics recording on/off for this step (off with a static placement)
  update_statistic device counters += routed logical ids (every chunk of every repeat)
  route            logical id -> physical slot: replica ``(row_offset + row) mod logcnt``
  start_set_cpu    record an event after the last ``run_experts`` on every stream the forward
                   used, into ``ctx.experts_done``
  done_set_cpu     if layer ``l`` is due at step ``s``: step check, all-reduce the window,
                   policy, migration (point-to-point sends + in-place ``copy_``), ordered after
                   ``ctx.experts_done``, collectives on ``ctx.cursor``
The engine calls ``balancer.step()`` after every forward (dummy ones too).

Due steps are a pure function of (layer, step): layer ``l`` rebalances when
``(s - l // layers_per_step) % rebalance_interval == rebalance_interval - 1``, so at most
``layers_per_step`` layers migrate per step. ``s`` is read from the layer's own forward
counter (forwards are collective, so every rank agrees); the step check at each rebalance then
compares every rank's ``balancer.step()`` count and per-layer forward counts.

Legend: ``L`` layers, ``E`` logical experts, ``S`` slots, ``W`` window steps, ``K`` top-k.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eplb.hooks import HookContext
from eplb.migration import MigrationStats, rebalance_layer
from eplb.placement import Placement, placement_from_phy2log
from eplb.policy import default_placement
from moerun.streams import record_events

__all__ = ["EPLBConfig", "LoadBalancer", "LayerBalancer", "MigrationStats"]


@dataclass(frozen=True, kw_only=True)
class EPLBConfig:
    """Load-balancer settings.

    Fields:
        num_layers: MoE layers ``L`` handled by this balancer.
        num_experts: logical experts ``E``.
        num_slots: physical slots ``S >= E``, ``S % num_ranks == 0``.
        num_ranks: EP ranks (the layers' group size).
        num_groups: expert groups (hierarchical policy keeps a group on one node).
        num_nodes: nodes; ``num_ranks % num_nodes == 0``.
        window_size: steps of statistics the policy sees (sliding window).
        rebalance_interval: steps between two rebalances of one layer.
        layers_per_step: most layers migrated in one step.
        static_placement: path of a placement file; then the balancer only routes.
    """

    num_layers: int
    num_experts: int
    num_slots: int
    num_ranks: int = 1
    num_groups: int = 1
    num_nodes: int = 1
    window_size: int = 32
    rebalance_interval: int = 32
    layers_per_step: int = 1
    static_placement: str | None = None

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_experts", "num_slots", "num_ranks", "num_groups",
                     "num_nodes", "window_size", "rebalance_interval", "layers_per_step"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"EPLBConfig.{name}={v!r} must be a positive int")
        if self.num_slots < self.num_experts:
            raise ValueError(f"EPLBConfig.num_slots={self.num_slots} must be >= num_experts="
                             f"{self.num_experts}")
        if self.num_slots % self.num_ranks:
            raise ValueError(f"EPLBConfig.num_slots={self.num_slots} must be divisible by "
                             f"num_ranks={self.num_ranks}")
        if self.num_experts % self.num_groups:
            raise ValueError(f"EPLBConfig.num_groups={self.num_groups} must divide "
                             f"num_experts={self.num_experts}")
        if self.num_ranks % self.num_nodes:
            raise ValueError(f"EPLBConfig.num_nodes={self.num_nodes} must divide "
                             f"num_ranks={self.num_ranks}")
        if self.layers_per_step * self.rebalance_interval < self.num_layers:
            raise ValueError(
                f"EPLBConfig.layers_per_step={self.layers_per_step} * rebalance_interval="
                f"{self.rebalance_interval} < num_layers={self.num_layers}: some layer would "
                "never rebalance; raise either")

    @property
    def slots_per_rank(self) -> int:
        return self.num_slots // self.num_ranks

    def is_due(self, layer: int, step: int) -> bool:
        """Whether ``layer`` rebalances at ``step`` (pure; rank-identical)."""
        shifted = step - layer // self.layers_per_step
        return shifted >= 0 and shifted % self.rebalance_interval == self.rebalance_interval - 1


def load_placement_file(path: str | Path, num_experts: int, max_replicas: int) -> Placement:
    """Read ``{"phy2log": [L, S]}`` from ``.pt`` (tensor or dict) or ``.json``."""
    path = Path(path)
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        phy2log = torch.tensor(data["phy2log"] if isinstance(data, dict) else data)
    elif path.suffix == ".pt":
        data = torch.load(path, map_location="cpu")
        phy2log = data["phy2log"] if isinstance(data, dict) else data
    else:
        raise ValueError(f"static_placement={str(path)!r}: expected a .pt or .json file")
    return placement_from_phy2log(torch.as_tensor(phy2log), num_experts, max_replicas)


class LoadBalancer:
    """Model-wide balancer: statistics windows, placements, due steps, migration log.

    Args:
        config: :class:`EPLBConfig`.
        device: where counters and maps live (the layers' device).

    Build it once, then hand ``balancer.layer(l)`` to layer ``l``'s ``ConfigurableMoE``.
    """

    def __init__(self, config: EPLBConfig, *, device: torch.device | str = "cpu") -> None:
        self.config = config
        self.device = torch.device(device)
        e, s, layers = config.num_experts, config.num_slots, config.num_layers
        self.max_replicas = s - e + 1
        if config.static_placement is not None:
            placement = load_placement_file(config.static_placement, e, self.max_replicas)
            if tuple(placement.phy2log.shape) != (layers, s):
                raise ValueError(f"static_placement phy2log has shape "
                                 f"{tuple(placement.phy2log.shape)}; expected [L={layers}, "
                                 f"S={s}]")
        else:
            start = default_placement(e, s, config.num_groups, config.num_nodes,
                                      config.num_ranks, num_layers=layers)
            placement = placement_from_phy2log(start.phy2log, e, self.max_replicas)
        # NOTE: maps are written in place at migration (identities never change).
        self.phy2log = placement.phy2log.to(self.device)
        self.log2phy = placement.log2phy.to(self.device)
        self.logcnt = placement.logcnt.to(self.device)
        self.window = torch.zeros(layers, config.window_size, e, dtype=torch.int64,
                                  device=self.device)
        self.current = torch.zeros(layers, e, dtype=torch.int64, device=self.device)
        self.step_idx = 0
        self.migrations: list[MigrationStats] = []
        self.last_global_load: list[torch.Tensor | None] = [None] * layers
        self._layers: dict[int, LayerBalancer] = {}

    @property
    def static(self) -> bool:
        return self.config.static_placement is not None

    def layer(self, layer_idx: int) -> "LayerBalancer":
        """The hook handle of layer ``layer_idx`` (one per layer; pass as ``balancer=``).

        Host only; creates the handle on first use."""
        if not 0 <= layer_idx < self.config.num_layers:
            raise ValueError(f"layer_idx={layer_idx} outside [0, num_layers="
                             f"{self.config.num_layers})")
        if layer_idx not in self._layers:
            self._layers[layer_idx] = LayerBalancer(self, layer_idx)
        return self._layers[layer_idx]

    def step(self) -> None:
        """End of one model forward: move this step's counts into the window. Device ops
        only (no host sync); call after every forward, dummy ones included."""
        row = self.step_idx % self.config.window_size
        self.window[:, row].copy_(self.current)
        self.current.zero_()
        self.step_idx += 1

    def placement(self) -> Placement:
        """A CPU copy of the current placement.

        Host sync (device-to-host copies when the maps live on CUDA): not capturable."""
        return Placement(phy2log=self.phy2log.cpu().clone(), log2phy=self.log2phy.cpu().clone(),
                         logcnt=self.logcnt.cpu().clone())

    def window_load(self) -> torch.Tensor:
        """``[L, E]`` this rank's token counts over the window (plus the current step).

        No host sync; current stream."""
        return self.window.sum(dim=1) + self.current

    def metrics(self) -> dict[str, Any]:
        """Per-layer max/mean rank load under the current placement (host sync; no collective).

        ``max_over_mean`` uses this rank's own window (every rank sees its own tokens);
        ``global_max_over_mean`` uses the all-reduced window of each layer's last rebalance
        (None before the first). Also ``max_migration_s`` (the largest stall),
        ``bytes_moved`` and ``migrations`` over the balancer's life.
        """
        glob = [None if g is None else self._max_over_mean(g[None], layer)[0]
                for layer, g in enumerate(self.last_global_load)]
        return {"max_over_mean": self._max_over_mean(self.window_load().cpu()),
                "global_max_over_mean": glob,
                "max_migration_s": max((m.seconds for m in self.migrations), default=0.0),
                "bytes_moved": sum(m.bytes_moved for m in self.migrations),
                "migrations": len(self.migrations)}

    def _max_over_mean(self, load_le: torch.Tensor, layer: int | None = None) -> list[float]:
        """max/mean rank load of ``load_le [L, E]`` (or one layer's ``[1, E]``)."""
        rows = slice(None) if layer is None else slice(layer, layer + 1)
        load = load_le.to(torch.float64)
        phy2log = self.phy2log[rows].cpu()  # NOTE: host sync
        cnt = self.logcnt[rows].cpu().to(torch.float64)
        per_slot = load.gather(1, phy2log) / cnt.gather(1, phy2log)
        per_rank = per_slot.view(load.shape[0], self.config.num_ranks, -1).sum(-1)
        mean = per_rank.mean(dim=1)
        ratio = torch.where(mean > 0, per_rank.max(dim=1).values / mean.clamp_min(1e-30),
                            torch.ones_like(mean))
        return ratio.tolist()

    def dump_stats(self, path: str | Path) -> None:
        """Write the window as a load file: ``[W, L, E]`` token counts, oldest step first
        (``.pt`` tensor or ``.json`` nested list). Host sync."""
        w = self.config.window_size
        order = [(self.step_idx + i) % w for i in range(w)]
        data = self.window[:, order].permute(1, 0, 2).cpu()  # NOTE: host sync
        path = Path(path)
        if path.suffix == ".json":
            path.write_text(json.dumps(data.tolist()))
        elif path.suffix == ".pt":
            torch.save(data, path)
        else:
            raise ValueError(f"dump_stats path={str(path)!r}: use a .pt or .json suffix")


class LayerBalancer:
    """Per-layer hooks (``eplb.hooks.LayerBalancerHooks``). Bound to its layer with
    :meth:`bind`, which ``ConfigurableMoE`` calls at construction.

    State kept across forwards (the layer's, for life): the bound layer (a weak reference),
    whether statistics are recorded this step, the last migration's event. Nothing per
    forward."""

    enabled = True

    def __init__(self, owner: LoadBalancer, layer_idx: int) -> None:
        self.owner = owner
        self.layer_idx = layer_idx
        self.num_slots = owner.config.num_slots
        self._recording = not owner.static
        # NOTE: weak. The layer owns this handle (``layer.balancer``) and the LoadBalancer owns
        # it too, so a strong reference back would put the layer, and through its Mapping the
        # caller's process group, in a reference cycle: freed only by a later cyclic garbage
        # collection, wherever that runs. A poisoned gloo group's destructor blocks until its
        # pending collective ends (its peers free theirs, or gloo's own timeout), so that
        # collection stalled an unrelated forward (docs/DECISIONS.md, the fault-path hang).
        self._layer_ref: weakref.ref | None = None
        self._migration_event: Any = None

    # -- binding -------------------------------------------------------------------------
    def bind(self, layer: Any) -> None:
        """Attach the ``ConfigurableMoE`` whose weights this handle migrates.

        Raises ValueError if this handle is already bound to another layer (one handle per
        layer: a shared handle would migrate one layer's weights by the other's placement).

        Host only; keeps a weak reference to ``layer``."""
        bound = self._layer
        if bound is not None and bound is not layer:
            raise ValueError(
                f"balancer.layer({self.layer_idx}) is already bound to another "
                "ConfigurableMoE; give each layer its own handle (balancer.layer(i) for layer i)")
        cfg = self.owner.config
        if layer.mapping.world_size != cfg.num_ranks:
            raise ValueError(f"EPLBConfig.num_ranks={cfg.num_ranks} but the layer's group has "
                             f"{layer.mapping.world_size} ranks")
        if layer.config.num_experts != cfg.num_experts:
            raise ValueError(f"EPLBConfig.num_experts={cfg.num_experts} but the layer has "
                             f"{layer.config.num_experts}")
        self._layer_ref = weakref.ref(layer)

    @property
    def _layer(self) -> Any:
        """The bound ``ConfigurableMoE``; None before :meth:`bind` or once it was freed."""
        return None if self._layer_ref is None else self._layer_ref()

    def local_experts(self, start: int, end: int) -> list[int]:
        """Logical expert held by each slot in ``[start, end)`` (from ``phy2log``).

        Host sync (``.tolist()`` of the device placement): not capturable; called at load time."""
        return self.owner.phy2log[self.layer_idx, start:end].tolist()

    # -- hooks ---------------------------------------------------------------------------
    def start_wait_gpu(self, ctx: HookContext) -> None:
        """The current stream waits on the last migration's event (CUDA; nothing on CPU)."""
        if self._migration_event is not None:
            torch.cuda.current_stream().wait_event(self._migration_event)
            self._migration_event = None

    def done_wait_gpu(self, ctx: HookContext) -> None:
        """Start recording statistics for this forward (never for a static placement).

        Host only; no device work."""
        self._recording = not self.owner.static

    def update_statistic(self, ctx: HookContext, topk_ids: torch.Tensor) -> None:
        """``counts[e] += #(t, j) with id e``; ``-1`` rows add nothing. Device-only.

        No host sync; current stream; capturable."""
        if not self._recording or topk_ids.numel() == 0:
            return
        ids = topk_ids.reshape(-1).to(torch.int64)
        valid = (ids >= 0).to(torch.int64)
        self.owner.current[self.layer_idx].scatter_add_(0, ids.clamp_min(0), valid)

    def route(self, ctx: HookContext, topk_ids: torch.Tensor, row_offset: int) -> torch.Tensor:
        """Logical ``[n, K]`` -> physical slot ids ``[n, K]`` int32: replica
        ``(row_offset + row) mod logcnt[e]``; ``-1`` stays ``-1``. Device-only, graph-safe."""
        n = topk_ids.shape[0]
        ids = topk_ids.to(torch.int64).clamp_min(0)
        rows = torch.arange(row_offset, row_offset + n, device=ids.device,
                            dtype=torch.int64)[:, None]
        cnt = self.owner.logcnt[self.layer_idx][ids]
        replica = rows % cnt
        slots = self.owner.log2phy[self.layer_idx][ids, replica]
        return torch.where(topk_ids < 0, torch.full_like(slots, -1), slots).to(torch.int32)

    def start_set_cpu(self, ctx: HookContext) -> None:
        """Record an event after the last ``run_experts`` on every stream the forward used
        (into ``ctx.experts_done``; none on CPU). No host sync."""
        ctx.experts_done = record_events(ctx.streams)

    def model_step(self) -> int:
        """The model step of the forward in progress, from the layer's own forward counter.

        Forwards are collective, so this is rank-identical even when an engine forgets
        ``balancer.step()`` on one rank; the step check then catches that mismatch."""
        layer = self._layer
        return layer.step // layer.repeat_count

    def done_set_cpu(self, ctx: HookContext) -> None:
        """If this layer is due now: rebalance (collectives on ``ctx.cursor``, host syncs)."""
        owner, layer = self.owner, self._layer
        if owner.static or layer is None \
                or not owner.config.is_due(self.layer_idx, self.model_step()):
            return
        stats = rebalance_layer(self, layer, ctx)
        if stats is not None:
            owner.migrations.append(stats)

    def set_migration_event(self, event: Any) -> None:
        """Called by the migration: the next ``start_wait_gpu`` waits on ``event``.

        Host only; no device work."""
        self._migration_event = event
