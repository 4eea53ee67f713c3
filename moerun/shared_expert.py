"""The shared expert: a dense ``silu(gate) * up`` MLP every token visits (DESIGN 4.3).

Legend: ``T`` tokens, ``H`` hidden, ``Is`` shared intermediate size.
"""

from __future__ import annotations

import enum

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SharedExpertOrder", "SharedExpert"]


class SharedExpertOrder(str, enum.Enum):
    """Where the shared MLP runs relative to the routed experts. All give the same result.

    Only ``SEQUENTIAL`` is implemented today; the overlapped orders arrive with the multi-stream
    scheduler work and ``resolve`` rejects them until then.
    """

    SEQUENTIAL = "sequential"
    AUX_STREAM = "aux_stream"
    DURING_COMBINE = "during_combine"
    FUSED = "fused"


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
        """``x [T, H]`` -> ``[T, H]``."""
        return self._mlp(x)

    def add_to(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``self(x) + out`` for ``out [T, H]`` in x.dtype, in few ops (each torch op costs
        host time; a decode step is host-bound): in-place where the tensors are this call's
        own. The sum is rounded as Hugging Face's blocks round it (the shared output in
        x.dtype, then one add), so patched models generate the same tokens. Returns a new
        tensor; ``out`` is not modified."""
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
        """Copy weights in place (checked first with :meth:`check`; ``gate`` iff gated)."""
        self.check(w13, w2, gate)
        self.w13.copy_(w13)
        self.w2.copy_(w2)
        if self.gate is not None:
            self.gate.copy_(gate.reshape(1, -1))
