"""Communication strategies (DESIGN 5): move tokens between ranks, hold no per-chunk state."""

from __future__ import annotations

from moerun.comm.allgather import AllGatherReduceScatter
from moerun.comm.alltoall import AllToAll
from moerun.comm.base import (
    ChunkCounts,
    CombineHandle,
    CommStrategy,
    DispatchResult,
    PreparedDispatch,
    to_local_slot_ids,
)
from moerun.comm.communicator import CollectiveCursor, Communicator, Pending
from moerun.comm.nocomm import NoComm

__all__ = [
    "AllGatherReduceScatter",
    "AllToAll",
    "NoComm",
    "ChunkCounts",
    "CollectiveCursor",
    "CombineHandle",
    "CommStrategy",
    "Communicator",
    "DispatchResult",
    "Pending",
    "PreparedDispatch",
    "to_local_slot_ids",
    "COMM_NAMES",
    "strategy_class",
    "strategy_candidates",
]

#: Names ``comm=`` accepts besides ``"auto"``.
COMM_NAMES = {"none": NoComm, "allgather": AllGatherReduceScatter, "alltoall": AllToAll}


def strategy_class(name: str) -> type[CommStrategy]:
    """The strategy registered as ``name``; ValueError listing valid names otherwise.

    Pure; host only."""
    try:
        return COMM_NAMES[name]
    except KeyError:
        raise ValueError(f"comm={name!r} is unknown; valid: 'auto', "
                         f"{', '.join(repr(n) for n in COMM_NAMES)}") from None


def strategy_candidates() -> list[type[CommStrategy]]:
    """Strategies in ``"auto"`` priority order.

    NoComm for one rank; otherwise AllGatherReduceScatter: capturable, equal collective
    shapes, no host sync. AllToAll (fewer bytes for large top-k spread, host-synchronising)
    is chosen by name. DeepEP joins the front of this list once its runnable adapter exists.
    """
    return [NoComm, AllGatherReduceScatter, AllToAll]
