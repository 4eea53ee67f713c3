"""``ForwardHandle``: what :meth:`ConfigurableMoE.forward_async` returns (DESIGN 7).

A layer forward stopped where every collective is issued and only waits are left: the last
combine's wait (micro-batch 1's under DBO), the EPLB ``done_set_cpu`` hook, the output's
assembly. Between ``forward_async`` and :meth:`ForwardHandle.wait` the caller's own work
overlaps that combine (and, issued before ``forward_async``, micro-batch 0's dispatch), which
one ``forward`` call cannot hide.
"""

from __future__ import annotations

from typing import Any, Callable, Generator

import torch

from schedulers.external_comm import drive

__all__ = ["ForwardHandle"]


class ForwardHandle:
    """One issued forward of one layer; :meth:`wait` finishes it.

    Made by ``ConfigurableMoE.forward_async`` only. While a handle is not waited, its layer
    refuses another ``forward`` or ``forward_async`` (a layer's forwards are collective and
    run in order on every rank).
    """

    __slots__ = ("_check", "_error", "_finish", "_out", "_steps", "_stream")

    def __init__(self, steps: Generator[str, None, torch.Tensor],
                 finish: Callable[[ForwardHandle, bool], None],
                 check: Callable[[], None], stream: Any = None) -> None:
        self._steps = steps
        self._finish = finish
        self._check = check
        self._stream = stream  # CUDA: the stream current at forward_async; None on CPU
        self._out: torch.Tensor | None = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        """:meth:`wait` has returned (or raised)."""
        return self._out is not None or self._error is not None

    def wait(self) -> torch.Tensor:
        """Finish the forward and return its ``[T, H]`` output (x.dtype).

        Side effects: the rest of the forward on the calling thread, on the stream current
        at ``forward_async``'s call: the last combine's wait (gloo: the host blocks, within
        the Mapping's budget; NCCL: stream order), the EPLB ``done_set_cpu`` hook, the
        output's assembly; then the layer's forward counters advance. Idempotent: a second
        call returns the same tensor, or raises the same error. A closed or poisoned layer
        raises ``LayerClosedError`` before any wait."""
        if self._out is not None:
            return self._out
        if self._error is not None:
            raise self._error
        try:
            self._check()
            if self._stream is None:
                out = drive(self._steps)
            else:  # the rest of the forward on the stream it was issued on
                with torch.cuda.stream(self._stream):
                    out = drive(self._steps)
        except BaseException as exc:
            self._error = exc
            self._steps.close()
            self._finish(self, False)
            raise
        self._out = out
        self._finish(self, True)
        return out

    def __repr__(self) -> str:
        state = "waited" if self._out is not None else "failed" if self._error else "pending"
        return f"ForwardHandle({state})"


def issue(steps: Generator[str, None, torch.Tensor], all_issued: Any) -> None:
    """Step a forward generator up to its ``all_issued`` yield (the scheduler yields it
    once). Raises what the forward raised before it; RuntimeError if it ended first."""
    for what in steps:
        if what == all_issued:
            return
    raise RuntimeError("the scheduler's forward_steps returned before yielding ALL_ISSUED")
