"""The shared expert: a dense ``silu(gate) * up`` MLP every token visits (DESIGN 4.3), the
orders it can run in, and the per-T schedule of orders a layer follows.

Legend: ``T`` tokens, ``H`` hidden, ``Is`` shared intermediate size, ``I`` routed expert
intermediate size.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SharedExpertOrder", "SharedExpert", "SharedRegime", "SharedSchedule"]


class SharedExpertOrder(str, enum.Enum):
    """Where the shared MLP runs relative to the routed experts. All give the ``SEQUENTIAL``
    result (the stream orders bit for bit; ``FUSED`` up to the rounding of its fp32 sum).

    * ``SEQUENTIAL``: after the routed output is assembled, on the current stream.
    * ``AUX_STREAM``: issued first, on a side stream that waits on an event recorded before
      routing, so it runs beside routing, dispatch, experts and combine; joined before the
      final add. On CPU it runs in order.
    * ``DURING_COMBINE``: issued while the last chunk's combine is in flight (issued with
      ``async_op=True``), then the combine is waited (on gloo the collective really runs on
      gloo's threads meanwhile; on NCCL on its stream).
    * ``FUSED``: the shared expert as ``Is / I`` extra expert slots that every local row
      visits with weight 1 (or its shared-gate value), inside the routed expert kernels: no
      launches of its own. Only where ``Is`` is a multiple of ``I``, the backend declares
      ``supports_fused_shared`` and the strategy keeps every own row identifiable after
      dispatch (``NoComm``, ``AllGatherReduceScatter``).
    """

    SEQUENTIAL = "sequential"
    AUX_STREAM = "aux_stream"
    DURING_COMBINE = "during_combine"
    FUSED = "fused"


#: Orders whose side work may run on an SM partition (a ``torch.cuda.GreenContext``).
PARTITIONABLE = (SharedExpertOrder.AUX_STREAM, SharedExpertOrder.DURING_COMBINE)


@dataclass(frozen=True, kw_only=True)
class SharedRegime:
    """One T regime of a :class:`SharedSchedule`.

    Fields:
        max_tokens: the regime covers forwards whose rows (the largest rank's ``T``) are
            ``<= max_tokens``; None = every larger forward (the last regime).
        order: the :class:`SharedExpertOrder` run there.
        partition_sms: SMs of the green context the side work runs in (``AUX_STREAM`` /
            ``DURING_COMBINE`` on CUDA), None = a plain side stream / the current stream.
    """

    max_tokens: int | None
    order: SharedExpertOrder
    partition_sms: int | None = None

    def describe(self) -> str:
        """One line: the token range, the order, and the SM partition if any. Pure; host only."""
        part = "" if self.partition_sms is None else f" on {self.partition_sms} SMs"
        scope = "any T" if self.max_tokens is None else f"T <= {self.max_tokens}"
        return f"{scope}: {self.order.value}{part}"


@dataclass(frozen=True, kw_only=True)
class SharedSchedule:
    """Which order a layer runs at which T, and why (from ``resolve``).

    Fields: ``regimes`` ascending by ``max_tokens``, the last one open (None); ``why`` the
    rule that chose them (a table row, the default, or the caller's request);
    ``eager_regimes``: the same for forwards outside CUDA-graph capture, where they differ
    (a measured table picks ``regimes`` by graph-replay time and ``eager_regimes`` by eager
    time: a side stream that hides the shared MLP in a replayed graph can cost more host
    time than it hides when every forward is issued from Python); None = ``regimes``.
    """

    regimes: tuple[SharedRegime, ...]
    why: str
    eager_regimes: tuple[SharedRegime, ...] | None = None

    def __post_init__(self) -> None:
        for regimes in (self.regimes, self.eager_regimes):
            if regimes is not None and (not regimes or regimes[-1].max_tokens is not None):
                raise ValueError("SharedSchedule.regimes must end with an open regime "
                                 "(max_tokens=None)")

    @classmethod
    def single(cls, order: SharedExpertOrder, why: str,
               partition_sms: int | None = None) -> "SharedSchedule":
        """A schedule of one regime, ``order`` at any T (``why``: the reason it was chosen).

        Pure; host only."""
        return cls(regimes=(SharedRegime(max_tokens=None, order=order,
                                         partition_sms=partition_sms),), why=why)

    def pick(self, rows: int, *, capturing: bool = True) -> SharedRegime:
        """The regime of a forward whose largest rank has ``rows`` tokens; ``capturing``:
        the forward is being captured into a CUDA graph (else ``eager_regimes`` apply where
        given). Pure."""
        regimes = self.regimes if capturing or self.eager_regimes is None \
            else self.eager_regimes
        for regime in regimes:
            if regime.max_tokens is None or rows <= regime.max_tokens:
                return regime
        raise AssertionError("unreachable: the last regime is open")

    @property
    def all_regimes(self) -> tuple[SharedRegime, ...]:
        """Every regime either mode may run."""
        return self.regimes + (self.eager_regimes or ())

    @property
    def orders(self) -> tuple[SharedExpertOrder, ...]:
        return tuple(dict.fromkeys(r.order for r in self.all_regimes))

    def describe(self) -> str:
        """The regimes in one line, the eager ones after when they differ. Pure; host only."""
        text = "; ".join(r.describe() for r in self.regimes)
        if self.eager_regimes is None or self.eager_regimes == self.regimes:
            return text
        return (f"{text} (eager: " + "; ".join(r.describe() for r in self.eager_regimes)
                + ")")


class SharedExpert(nn.Module):
    """``y = (silu(x Wg^T) * (x Wu^T)) W2^T``, times ``sigmoid(x g^T)`` when gated.

    Parameters: ``w13 [2*Is, H]`` (gate rows then up rows), ``w2 [H, Is]``, optional
    ``gate [1, H]``. Computes in x.dtype; no host sync; graph-safe.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, *, gated: bool,
                 dtype: torch.dtype, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        kw = dict(dtype=dtype, device=device)
        self.w13 = nn.Parameter(torch.empty(2 * intermediate_size, hidden_size, **kw),
                                requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(hidden_size, intermediate_size, **kw),
                               requires_grad=False)
        self.gate = (nn.Parameter(torch.empty(1, hidden_size, **kw), requires_grad=False)
                     if gated else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, H]`` -> ``[T, H]``. Launches on the current stream; no host sync; capturable."""
        return self._mlp(x)

    def add_to(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``self(x) + out`` for ``out [T, H]`` in x.dtype, in few ops (each torch op costs
        host time; a decode step is host-bound): in-place where the tensors are this call's
        own. The sum is rounded as Hugging Face's blocks round it (the shared output in
        x.dtype, then one add), so patched models generate the same tokens. Returns a new
        tensor; ``out`` is not modified.

        Launches on the current stream; no host sync; capturable."""
        return self._mlp(x).add_(out)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.w13).chunk(2, dim=-1)
        y = F.linear(F.silu(gate).mul_(up), self.w2)
        if self.gate is not None:
            y.mul_(torch.sigmoid(F.linear(x, self.gate)))
        return y

    def check(self, w13: torch.Tensor, w2: torch.Tensor, gate: torch.Tensor | None) -> None:
        """Raise ValueError unless :meth:`load` would accept these weights. No side effects."""
        if tuple(w13.shape) != tuple(self.w13.shape):
            raise ValueError(f"shared['w13'] has shape {tuple(w13.shape)}, expected "
                             f"{tuple(self.w13.shape)} = [2*shared_intermediate_size, H]")
        if tuple(w2.shape) != tuple(self.w2.shape):
            raise ValueError(f"shared['w2'] has shape {tuple(w2.shape)}, expected "
                             f"{tuple(self.w2.shape)} = [H, shared_intermediate_size]")
        if self.gate is not None and gate is None:
            raise ValueError("shared['gate'] is missing: config.shared_expert_gate=True "
                             "needs a [1, H] gate weight")
        if self.gate is None and gate is not None:
            raise ValueError("shared['gate'] given but config.shared_expert_gate=False")
        if gate is not None and gate.numel() != self.gate.numel():
            raise ValueError(f"shared['gate'] has {gate.numel()} elements; expected [1, H]")

    @torch.no_grad()
    def load(self, w13: torch.Tensor, w2: torch.Tensor, gate: torch.Tensor | None) -> None:
        """Copy weights in place (checked first with :meth:`check`; ``gate`` iff gated).

        Copies on the current stream (a CPU source is a host-to-device copy); no device-to-host
        sync."""
        self.check(w13, w2, gate)
        self.w13.copy_(w13)
        self.w2.copy_(w2)
        if self.gate is not None:
            self.gate.copy_(gate.reshape(1, -1))
