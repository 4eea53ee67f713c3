"""The streams a layer owns (DESIGN 4.1 step 6, DESIGN 8). Inert on CPU.

A layer owns one aux stream, created lazily on CUDA. Which streams one forward issued work
on is per-forward state: it lives in the scheduler's ``ForwardContext`` (``ctx.streams``), so
EPLB can record an event on each before migrating, and two forwards (DBO micro-batches) in
flight never overwrite each other's list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

__all__ = ["ChunkStreams", "LayerStreams", "record_events"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkStreams:
    """The two streams one forward's chunks alternate on under chunk overlap (CUDA): ``main``
    (the caller's current stream) and ``aux`` (the layer's aux stream); both None when the
    forward runs on the current stream alone."""

    main: Any = None
    aux: Any = None


_NO_OVERLAP = ChunkStreams()


#: Every green context a layer made, held until the process exits: torch 2.11 aborts the
#: process when one is destroyed before a stream made from it, and a layer collected as part
#: of a reference cycle releases its objects in no set order (seen 2026-12-01 on the H200:
#: a garbage collection in the middle of a later test aborted). A few per process at most:
#: SM partitions are for measurements (``shared_partition_sms``).
_GREEN_CONTEXTS: list[Any] = []


class LayerStreams:
    """Owner of one layer's side streams: the aux stream of chunk overlap, and the shared
    expert's side stream (plain, or one per SM-partition size in a green context). Holds no
    per-forward state.

    Not thread-safe; all calls come from the forward thread.
    """

    __slots__ = ("device", "_aux", "_shared")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._aux: Any = None
        # partition size -> (green context or None, stream). NOTE: a green context must
        # outlive its stream (torch 2.11 aborts the process when a green context goes before
        # the stream made from it): every green context is also held by _GREEN_CONTEXTS, so
        # however the layer is freed (reference counts, or the garbage collector clearing a
        # cycle in any order) its streams go first.
        self._shared: dict[int | None, tuple[Any, Any]] = {}

    def release(self) -> None:
        """Drop the side streams, each before the green context it belongs to (the layer's
        ``close()`` calls this). No host sync beyond the driver's stream destruction."""
        while self._shared:
            _, (green, stream) = self._shared.popitem()
            del stream
            del green

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def aux(self) -> Any:
        """The layer's aux ``torch.cuda.Stream`` (created on first use; CUDA only)."""
        if self._aux is None:
            self._aux = torch.cuda.Stream(device=self.device)
        return self._aux

    def shared(self, partition_sms: int | None) -> Any:
        """The shared expert's side stream (CUDA): a plain stream for ``None``, else a stream
        of a ``torch.cuda.GreenContext`` holding ``partition_sms`` SMs (created once per size;
        kernels issued there run on those SMs only, the rest stay with the routed experts).
        Raises RuntimeError (naming the cause) when this torch cannot make one."""
        entry = self._shared.get(partition_sms)
        if entry is not None:
            return entry[1]
        green = None
        if partition_sms is None:
            stream = torch.cuda.Stream(device=self.device)
        else:
            green_cls = getattr(torch.cuda, "GreenContext", None)
            if green_cls is None:
                raise RuntimeError("torch.cuda.GreenContext is missing from this torch; SM "
                                   "partitions need torch >= 2.11 built with green contexts")
            idx = self.device.index if self.device.index is not None \
                else torch.cuda.current_device()
            green = green_cls.create(num_sms=partition_sms, device_id=idx)
            _GREEN_CONTEXTS.append(green)  # NOTE: kept for the process's life (see there)
            if hasattr(green, "Stream"):
                stream = green.Stream()
            else:  # older API: a stream created while the green context is current
                green.set_context()
                try:
                    stream = torch.cuda.Stream(device=self.device)
                finally:
                    green.pop_context()
        self._shared[partition_sms] = (green, stream)
        return stream

    def begin(self, overlap: bool) -> ChunkStreams:
        """The :class:`ChunkStreams` of a forward starting now: with ``overlap`` (CUDA only)
        the current stream and the aux stream, which first waits on main (every input written
        before the forward is visible to it); otherwise both None -- the forward runs
        on the current stream, which callers ask for only if they need it (creating a
        ``torch.cuda.Stream`` object costs several µs of host time). No host sync;
        graph-safe (the wait is a captured event edge)."""
        if not overlap:
            return _NO_OVERLAP
        main = torch.cuda.current_stream(self.device)
        aux = self.aux
        aux.wait_stream(main)
        return ChunkStreams(main=main, aux=aux)


def record_events(streams: Sequence[Any]) -> list[Any]:
    """A ``torch.cuda.Event`` recorded now on each of ``streams`` ([] for an empty list, CPU).

    No host sync; graph-safe."""
    events = []
    for stream in streams:
        ev = torch.cuda.Event()
        ev.record(stream)
        events.append(ev)
    return events
