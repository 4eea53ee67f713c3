"""Input checks and rank agreement on them (DESIGN 9).

Local checks produce an int code; with ``check_inputs`` and more than one rank, every rank
all-gathers ``(code, T)`` in one collective before any data collective, and all ranks raise
the same ``ValueError`` naming the lowest offending rank and the argument. The same gather
provides ``all_rank_num_tokens`` when the caller passed none (a host sync, not capturable).
With checks off, a local error raises locally and peers end in ``CommTimeoutError``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Sequence

import torch

__all__ = ["InputError", "check_local_inputs", "agree_counts", "AGREED_MESSAGES"]


class InputError(enum.IntEnum):
    OK = 0
    X_TYPE = 1
    X_SHAPE = 2
    X_DTYPE = 3
    X_DEVICE = 4
    LOGITS_TYPE = 5
    LOGITS_SHAPE = 6
    LOGITS_DTYPE = 7
    LOGITS_DEVICE = 8
    LOGITS_NONFINITE = 9
    COUNTS_LENGTH = 10
    COUNTS_OWN_ENTRY = 11
    COUNTS_NEGATIVE = 12


#: The message every rank raises for a code (rank-independent text, so all ranks agree).
AGREED_MESSAGES = {
    InputError.X_TYPE: "x must be a torch.Tensor",
    InputError.X_SHAPE: "x must be [T, hidden_size]",
    InputError.X_DTYPE: "x.dtype must equal MoEConfig.dtype",
    InputError.X_DEVICE: "x must be on the layer's device",
    InputError.LOGITS_TYPE: "router_logits must be a torch.Tensor",
    InputError.LOGITS_SHAPE: "router_logits must be [T, num_experts] with T == x.shape[0]",
    InputError.LOGITS_DTYPE: "router_logits.dtype must be float32 or x.dtype",
    InputError.LOGITS_DEVICE: "router_logits must be on x's device",
    InputError.LOGITS_NONFINITE: "router_logits contains non-finite values (NaN/Inf)",
    InputError.COUNTS_LENGTH: "all_rank_num_tokens must have one entry per DP rank",
    InputError.COUNTS_OWN_ENTRY: "all_rank_num_tokens[rank] must equal x.shape[0]",
    InputError.COUNTS_NEGATIVE: "all_rank_num_tokens entries must be >= 0",
}


@dataclass(frozen=True)
class LocalCheck:
    """``code`` (:class:`InputError`) and a detailed local message (values included)."""

    code: InputError
    detail: str = ""


def check_local_inputs(x: Any, router_logits: Any, *, hidden_size: int, num_experts: int,
                       dtype: torch.dtype, device: torch.device, rank: int, world_size: int,
                       all_rank_num_tokens: Sequence[int] | None,
                       check_values: bool) -> LocalCheck:
    """Check one rank's arguments. ``check_values`` adds the NaN/Inf scan (a host sync).

    Pure apart from that optional sync; no collective.
    """
    E = InputError
    if not isinstance(x, torch.Tensor):
        return LocalCheck(E.X_TYPE, f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.shape[1] != hidden_size:
        return LocalCheck(E.X_SHAPE, f"x has shape {tuple(x.shape)}; expected [T, "
                                     f"hidden_size={hidden_size}]")
    if x.dtype != dtype:
        return LocalCheck(E.X_DTYPE, f"x.dtype={x.dtype} but MoEConfig.dtype={dtype}; cast x "
                                     "or build the layer with that dtype")
    if x.device.type != device.type or (device.index is not None and x.device != device):
        return LocalCheck(E.X_DEVICE, f"x is on {x.device} but the layer's weights are on "
                                      f"{device}; move x or the layer")
    if not isinstance(router_logits, torch.Tensor):
        return LocalCheck(E.LOGITS_TYPE, "router_logits must be a torch.Tensor, got "
                                         f"{type(router_logits).__name__}")
    if router_logits.dim() != 2 or tuple(router_logits.shape) != (x.shape[0], num_experts):
        return LocalCheck(E.LOGITS_SHAPE, f"router_logits has shape {tuple(router_logits.shape)}"
                                          f"; expected [T={x.shape[0]}, num_experts="
                                          f"{num_experts}]")
    if router_logits.dtype not in (torch.float32, x.dtype):
        return LocalCheck(E.LOGITS_DTYPE, f"router_logits.dtype={router_logits.dtype}; expected "
                                          f"torch.float32 or x.dtype={x.dtype}")
    if router_logits.device != x.device:
        return LocalCheck(E.LOGITS_DEVICE, f"router_logits is on {router_logits.device}, x on "
                                           f"{x.device}")
    if all_rank_num_tokens is not None:
        counts = list(all_rank_num_tokens)
        if len(counts) != world_size:
            return LocalCheck(E.COUNTS_LENGTH, f"all_rank_num_tokens has {len(counts)} entries; "
                                               f"expected dp_size={world_size}")
        if any(c < 0 for c in counts):
            return LocalCheck(E.COUNTS_NEGATIVE, f"all_rank_num_tokens={counts} has a negative "
                                                 "entry")
        if counts[rank] != x.shape[0]:
            return LocalCheck(E.COUNTS_OWN_ENTRY, f"all_rank_num_tokens[{rank}]={counts[rank]} "
                                                  f"but x has {x.shape[0]} rows")
    if check_values and router_logits.numel() and not bool(
            torch.isfinite(router_logits).all()):  # NOTE: device->host sync
        return LocalCheck(E.LOGITS_NONFINITE, "router_logits contains non-finite values "
                                              "(NaN/Inf); check the router output")
    return LocalCheck(E.OK)


def agree_counts(check: LocalCheck, *, num_tokens: int, all_rank_num_tokens: Sequence[int] | None,
                 comm: Any, cursor: Any, world_size: int,
                 check_inputs: bool) -> tuple[int, ...]:
    """Raise on bad input (agreed across ranks when ``check_inputs``) and return the counts.

    Collective (on ``comm`` at the forward's ``cursor``): one all-gather of ``(code, T)``
    with ``check_inputs`` and > 1 rank, or one all-gather of ``T`` when counts are missing;
    none otherwise. Host sync when it gathers.
    """
    if world_size == 1:
        if check.code:
            raise ValueError(check.detail)
        return (num_tokens,)
    if check_inputs:
        gathered = comm.all_gather_object_ints([int(check.code), num_tokens], phase="validate",
                                               cursor=cursor)
        bad = [(r, InputError(code)) for r, (code, _) in enumerate(gathered) if code]
        if bad:
            ranks = [r for r, _ in bad]
            r, code = bad[0]
            raise ValueError(f"invalid input on rank {r}: {AGREED_MESSAGES[code]} "
                             f"(ranks with bad input: {ranks}; check_inputs=True)")
        observed = tuple(t for _, t in gathered)
        if all_rank_num_tokens is not None and tuple(all_rank_num_tokens) != observed:
            raise ValueError(f"all_rank_num_tokens={list(all_rank_num_tokens)} disagrees with "
                             f"the row counts of x on the ranks {list(observed)}")
        return observed
    if check.code:
        raise ValueError(check.detail)  # NOTE: peers will end in CommTimeoutError (checks off)
    if all_rank_num_tokens is not None:
        return tuple(int(c) for c in all_rank_num_tokens)
    return tuple(t for (t,) in comm.all_gather_object_ints([num_tokens], phase="counts",
                                                           cursor=cursor))
