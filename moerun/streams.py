"""The streams a layer owns (DESIGN 4.1 step 6, DESIGN 8). Inert on CPU.

A layer owns one aux stream, created lazily on CUDA. Which streams one forward issued work
on is per-forward state: it lives in the scheduler's ``ForwardContext`` (``ctx.streams``), so
EPLB can record an event on each before migrating, and two forwards (DBO micro-batches) in
flight never overwrite each other's list.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

__all__ = ["LayerStreams", "record_events"]


class LayerStreams:
    """Owner of one layer's aux stream. Holds no per-forward state.

    Not thread-safe; all calls come from the forward thread.
    """

    __slots__ = ("device", "_aux")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._aux: Any = None

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def aux(self) -> Any:
        """The layer's aux ``torch.cuda.Stream`` (created on first use; CUDA only)."""
        if self._aux is None:
            self._aux = torch.cuda.Stream(device=self.device)
        return self._aux

    def begin(self, overlap: bool) -> tuple[Any, Any]:
        """``(main, aux)`` for a forward starting now: with ``overlap`` (CUDA only) the
        current stream and the aux stream, which first waits on main (every input written
        before the forward is visible to it); otherwise ``(None, None)`` -- the forward runs
        on the current stream, which callers ask for only if they need it (creating a
        ``torch.cuda.Stream`` object costs several µs of host time). No host sync;
        graph-safe (the wait is a captured event edge)."""
        if not overlap:
            return None, None
        main = torch.cuda.current_stream(self.device)
        aux = self.aux
        aux.wait_stream(main)
        return main, aux


def record_events(streams: Sequence[Any]) -> list[Any]:
    """A ``torch.cuda.Event`` recorded now on each of ``streams`` ([] for an empty list, CPU).

    No host sync; graph-safe."""
    events = []
    for stream in streams:
        ev = torch.cuda.Event()
        ev.record(stream)
        events.append(ev)
    return events
