"""Streams a layer uses (DESIGN 4.1 step 6, DESIGN 8). Inert on CPU.

The main stream is whatever stream is current when ``forward`` starts; the aux stream is
created once per layer, lazily, on CUDA. ``used`` lists the streams the last forward issued
work on, so EPLB can record an event on each before migrating.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["LayerStreams"]


class LayerStreams:
    """Owner of one layer's aux stream and of the per-forward stream bookkeeping.

    Not thread-safe; all calls come from the forward thread.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._aux: Any = None
        self.main: Any = None
        self.used: tuple[Any, ...] = ()

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def aux(self) -> Any:
        """The layer's aux ``torch.cuda.Stream`` (created on first use)."""
        if self._aux is None:
            self._aux = torch.cuda.Stream(device=self.device)
        return self._aux

    def begin_forward(self, overlap: bool) -> None:
        """Remember the main stream; with ``overlap`` the aux stream first waits on main
        (every input written before the forward is visible to it). No host sync."""
        if not self.is_cuda:
            self.main, self.used = None, ()
            return
        self.main = torch.cuda.current_stream(self.device)
        if overlap:
            self.aux.wait_stream(self.main)
            self.used = (self.main, self.aux)
        else:
            self.used = (self.main,)

    def record_events(self) -> list[Any]:
        """An event recorded now on every stream used by this forward (CUDA; [] on CPU)."""
        events = []
        for stream in self.used:
            ev = torch.cuda.Event()
            ev.record(stream)
            events.append(ev)
        return events
