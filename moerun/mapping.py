"""Deployment topology: one process group with ``dp_size == ep_size == group size`` (DESIGN 2).

Also the slot partition: physical slot ``s`` lives on the rank whose contiguous range holds
it; with ``S % ep_size != 0`` the first ``S % ep_size`` ranks hold one slot more (ceil/floor).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Mapping", "SlotPartition", "slot_partition"]


@dataclass(frozen=True, kw_only=True)
class Mapping:
    """Where this layer runs.

    Fields:
        rank: this process's rank in ``group`` (0 for a single rank).
        world_size: group size; ``dp_size`` and ``ep_size`` must equal it.
        group: a ``torch.distributed`` ProcessGroup passed in by the caller (None on one rank).
            moerun never reads global process-group state.
        store: optional c10d ``Store``; each rank writes (layer, step, phase) before each
            collective so a timeout names the ranks that never arrived.
        dp_size / ep_size: default to ``world_size``; anything else is a ValueError (tensor-
            parallel-sharded experts are out of scope).
        timeout_s: budget for one collective after warm-up (gloo; NCCL uses its own watchdog
            unless ``debug_sync``).
        warmup_timeout_s: budget for the first ``warmup_forwards`` forwards of a layer.
        debug_sync: on NCCL, block the host on each collective with moerun's budget
            (not capturable).
    """

    rank: int = 0
    world_size: int = 1
    group: Any = None
    store: Any = None
    dp_size: int | None = None
    ep_size: int | None = None
    timeout_s: float = 30.0
    warmup_timeout_s: float = 120.0
    warmup_forwards: int = 2
    debug_sync: bool = False

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"Mapping.world_size={self.world_size} must be >= 1")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"Mapping.rank={self.rank} must be in [0, world_size={self.world_size})"
            )
        dp = self.world_size if self.dp_size is None else self.dp_size
        ep = self.world_size if self.ep_size is None else self.ep_size
        if dp != self.world_size or ep != self.world_size:
            raise ValueError(
                f"Mapping(dp_size={self.dp_size}, ep_size={self.ep_size}, "
                f"world_size={self.world_size}) is unsupported: moerun runs attention data "
                "parallel + expert parallel over one group, so dp_size == ep_size == "
                "world_size (tensor-parallel-sharded experts are out of scope)"
            )
        object.__setattr__(self, "dp_size", dp)
        object.__setattr__(self, "ep_size", ep)
        if self.world_size > 1 and self.group is None:
            raise ValueError(
                f"Mapping.group is None with world_size={self.world_size}: pass the "
                "torch.distributed process group moerun should communicate over"
            )
        if self.group is not None and callable(getattr(self.group, "size", None)) \
                and callable(getattr(self.group, "rank", None)):
            # NOTE: a mismatch used to pass, and the first forward failed with a
            # CommTimeoutError of phase 'validate' that named no field
            size, rank = self.group.size(), self.group.rank()
            if (size, rank) != (self.world_size, self.rank):
                raise ValueError(
                    f"Mapping(rank={self.rank}, world_size={self.world_size}) does not match "
                    f"its group (rank {rank} of {size}): pass the group's own rank and size, "
                    "e.g. Mapping.from_group(group)"
                )
        for name in ("timeout_s", "warmup_timeout_s"):
            value = getattr(self, name)
            # NOTE: inf/NaN/negative used to pass, and the first forward then failed inside
            # the wait (issue 14); a budget must be a finite number of seconds.
            if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                    or not math.isfinite(value) or value <= 0:
                raise ValueError(
                    f"Mapping.{name}={value!r} must be a finite number of seconds > 0 (the "
                    "budget of one collective); pass e.g. 30.0"
                )
        if isinstance(self.warmup_forwards, bool) or not isinstance(self.warmup_forwards, int) \
                or self.warmup_forwards < 0:
            raise ValueError(f"Mapping.warmup_forwards={self.warmup_forwards!r} must be an int "
                             ">= 0")

    @classmethod
    def from_group(cls, group: Any, *, store: Any = None, **kwargs: Any) -> "Mapping":
        """Mapping over ``group`` (rank and size read from the group object itself).

        Host only; reads the group's rank and size (no collective)."""
        import torch.distributed as dist

        return cls(
            rank=dist.get_rank(group),
            world_size=dist.get_world_size(group),
            group=group,
            store=store,
            **kwargs,
        )

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def backend_name(self) -> str:
        """``"gloo"``, ``"nccl"``, ... or ``"none"`` on one rank."""
        if self.group is None:
            return "none"
        import torch.distributed as dist

        return str(dist.get_backend(self.group)).lower()


@dataclass(frozen=True, kw_only=True)
class SlotPartition:
    """Contiguous slot ranges per rank.

    Fields:
        num_slots: ``S``.
        ep_size: ranks.
        starts: ``[ep_size + 1]`` boundaries; rank r holds ``[starts[r], starts[r+1])``.
    """

    num_slots: int
    ep_size: int
    starts: tuple[int, ...]

    @property
    def divisible(self) -> bool:
        return self.num_slots % self.ep_size == 0

    def local_range(self, rank: int) -> tuple[int, int]:
        """``[start, end)`` of the slots ``rank`` holds. Pure; host only."""
        return self.starts[rank], self.starts[rank + 1]

    def num_local(self, rank: int) -> int:
        """How many slots ``rank`` holds. Pure; host only."""
        return self.starts[rank + 1] - self.starts[rank]

    def owner_of(self, slots: torch.Tensor) -> torch.Tensor:
        """Rank owning each slot id (same shape, int64). ``-1`` ids map to ``-1``.

        No device-to-host sync; but the rank bounds are copied host-to-device on each call
        (``torch.tensor`` of a list), so it is not capturable (its caller, ``AllToAll``, is
        not either).
        """
        bounds = torch.tensor(self.starts[1:-1], device=slots.device, dtype=torch.int64)
        owner = torch.searchsorted(bounds, slots.to(torch.int64), right=True)
        return torch.where(slots < 0, torch.full_like(owner, -1), owner)


def slot_partition(num_slots: int, ep_size: int) -> SlotPartition:
    """Split ``num_slots`` over ``ep_size`` ranks, ceil sizes first.

    Raises ValueError when ``num_slots < ep_size`` (a rank would hold no expert).

    Pure; host only.
    """
    if num_slots < ep_size:
        raise ValueError(
            f"num_experts (slots)={num_slots} < ep_size={ep_size}: every rank needs at least "
            "one expert slot; use fewer ranks or more experts"
        )
    q, r = divmod(num_slots, ep_size)
    starts = [0]
    for i in range(ep_size):
        starts.append(starts[-1] + q + (1 if i < r else 0))
    return SlotPartition(num_slots=num_slots, ep_size=ep_size, starts=tuple(starts))
