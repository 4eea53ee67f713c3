"""Input checks and rank agreement on them (DESIGN 9, issue 14).

Local checks produce an int code; with ``check_inputs`` and more than one rank, every rank
all-gathers one payload in one collective before any data collective (:data:`PAYLOAD`):

    code, T, counts digest, flags, layer state, layer step, layer digest

so every rank sees every rank's inputs *and* state and raises the same error naming the
offending rank(s): a layer built differently (``ValueError``), weights not loaded
(``LayerClosedError``), a forward counter that differs (``LayerStepMismatch``), a bad local
input (``ValueError``, the lowest offending rank and the argument), ``use_dp_padding`` that
differs (``ValueError``), or an ``all_rank_num_tokens`` list that differs from the ranks' row
counts (``ValueError``), in that order. The same gather provides ``all_rank_num_tokens``
when the caller passed none (a host sync, not capturable). A closed or poisoned layer never
reaches the gather: it refuses locally and peers learn it from the store (``moerun.comm``).
With checks off, a local error raises locally and peers end in ``CommTimeoutError``.
"""

from __future__ import annotations

import collections
import enum
import hashlib
import operator
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from moerun.errors import LayerClosedError, LayerStepMismatch

__all__ = ["InputError", "LayerState", "RankState", "check_local_inputs", "agree_counts",
           "counts_digest", "layer_digest", "not_loaded_message", "AGREED_MESSAGES", "PAYLOAD"]


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
    COUNTS_TYPE = 13


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
    InputError.COUNTS_TYPE: "all_rank_num_tokens must be a sequence of ints",
}

#: The agreed payload, one int64 per field, in this order.
PAYLOAD = ("code", "rows", "counts_digest", "flags", "state", "step", "layer_digest")
_FLAG_DP_PADDING = 1
_P61 = (1 << 61) - 1  # a Mersenne prime: digests are polynomial hashes modulo it


class LayerState(enum.IntEnum):
    """What a rank's layer contributes to the agreed payload (a closed or poisoned layer
    refuses before the gather, so it never contributes)."""

    READY = 0
    NOT_LOADED = 1


@dataclass(frozen=True, kw_only=True)
class RankState:
    """A rank's layer state for the agreed payload.

    Fields: ``state`` (:class:`LayerState`); ``step`` the layer's forward counter;
    ``layer_digest`` the layer's build digest (:func:`layer_digest`); ``layer_idx`` for
    messages."""

    state: LayerState
    step: int
    layer_digest: int
    layer_idx: int | None


def counts_digest(counts: Sequence[int] | None) -> int:
    """A rank-independent 61-bit digest of an ``all_rank_num_tokens`` list, >= 1; 0 for
    None (not passed). Pure."""
    if counts is None:
        return 0
    h = len(counts) + 1
    for c in counts:
        h = (h * 1_000_003 + int(c) + 1) % _P61
    return h + 1


def layer_digest(*parts: object) -> int:
    """A 62-bit digest of ``repr(parts)`` (blake2b), identical in every process for values
    whose ``repr`` is (ints, strings, enums, dtypes, frozen dataclasses of them). Pure."""
    raw = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little") >> 2


def not_loaded_message(layer_idx: int | None, ranks: list[int]) -> str:
    """The message every rank raises when ``ranks`` have no weights loaded. Pure; host only."""
    return (f"layer {layer_idx}: weights are not loaded on rank(s) {ranks}: call "
            "load_weights(w13, w2) (or load_expert_weights) on every rank first")


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
        try:
            counts = [operator.index(c) for c in all_rank_num_tokens]
        except TypeError:
            return LocalCheck(E.COUNTS_TYPE, f"all_rank_num_tokens={all_rank_num_tokens!r} must "
                                             "be a sequence of ints (one row count per DP rank)")
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
                 comm: Any, cursor: Any, world_size: int, check_inputs: bool,
                 use_dp_padding: bool = False,
                 state: RankState | None = None) -> tuple[int, ...]:
    """Raise on bad input or state (agreed across ranks when ``check_inputs``) and return the
    counts.

    Collective (on ``comm`` at the forward's ``cursor``): one all-gather of the
    :data:`PAYLOAD` with ``check_inputs`` and > 1 rank (``state`` required then), or one
    all-gather of ``T`` when counts are missing; none otherwise. Host sync when it gathers.
    """
    if world_size == 1:
        if check.code:
            raise ValueError(check.detail)
        return (num_tokens,)
    if check_inputs:
        assert state is not None, "agreed validation needs the layer's RankState"
        digest = counts_digest(all_rank_num_tokens) if check.code == InputError.OK else 0
        payload = [int(check.code), num_tokens, digest,
                   _FLAG_DP_PADDING if use_dp_padding else 0, int(state.state), state.step,
                   state.layer_digest]
        gathered = comm.all_gather_object_ints(payload, phase="validate", cursor=cursor)
        raise_on_disagreement(gathered, layer_idx=state.layer_idx)
        return tuple(row[1] for row in gathered)
    if check.code:
        raise ValueError(check.detail)  # NOTE: peers will end in CommTimeoutError (checks off)
    if all_rank_num_tokens is not None:
        return tuple(int(c) for c in all_rank_num_tokens)
    return tuple(t for (t,) in comm.all_gather_object_ints([num_tokens], phase="counts",
                                                           cursor=cursor))


def _odd_ranks(values: list[int]) -> list[int]:
    """Ranks whose value differs from the most common one (a tie: the lowest rank's)."""
    common = collections.Counter(values).most_common()
    top = max(n for _, n in common)
    majority = next(v for v in values if dict(common)[v] == top)
    return [r for r, v in enumerate(values) if v != majority]


def raise_on_disagreement(gathered: list[list[int]], *, layer_idx: int | None) -> None:
    """Raise the agreed error for a gathered payload (one row of :data:`PAYLOAD` per rank),
    or return when every rank may enter the collectives. Pure: every rank computes the same
    error from the same rows, with a rank-independent message."""
    col = {name: [row[i] for row in gathered] for i, name in enumerate(PAYLOAD)}
    if len(set(col["layer_digest"])) > 1:
        odd = _odd_ranks(col["layer_digest"])
        raise ValueError(
            f"layer {layer_idx} was built differently on rank(s) {odd} than on the others "
            "(MoEConfig, comm strategy, scheduler and its config, balancer, repeat_count or "
            "the number of layers built with this layer_idx on the Mapping's store differ); "
            "build every rank's layer with the same arguments")
    not_loaded = [r for r, s in enumerate(col["state"]) if s == LayerState.NOT_LOADED]
    if not_loaded:
        raise LayerClosedError(not_loaded_message(layer_idx, not_loaded), ranks=not_loaded)
    steps = col["step"]
    if len(set(steps)) > 1:
        odd = _odd_ranks(steps)
        raise LayerStepMismatch(
            f"layer {layer_idx}'s forward counter differs across ranks (by rank: {steps}; "
            f"rank(s) {odd} differ): every rank must run every forward of the layer, dummy "
            "ones included", ranks=odd, steps=steps)
    bad = [(r, InputError(code)) for r, code in enumerate(col["code"]) if code]
    if bad:
        ranks = [r for r, _ in bad]
        r, code = bad[0]
        raise ValueError(f"invalid input on rank {r}: {AGREED_MESSAGES[code]} "
                         f"(ranks with bad input: {ranks}; check_inputs=True)")
    flags = col["flags"]
    if len(set(f & _FLAG_DP_PADDING for f in flags)) > 1:
        on = [r for r, f in enumerate(flags) if f & _FLAG_DP_PADDING]
        off = [r for r, f in enumerate(flags) if not f & _FLAG_DP_PADDING]
        raise ValueError(f"use_dp_padding differs across ranks (True on rank(s) {on}, False on "
                         f"rank(s) {off}): pass the same value on every rank")
    observed = col["rows"]
    expect = counts_digest(observed)
    differ = [r for r, d in enumerate(col["counts_digest"]) if d and d != expect]
    if differ:
        raise ValueError(f"all_rank_num_tokens passed on rank(s) {differ} differs from the row "
                         f"counts of x on the ranks, {observed}: pass the same list on every "
                         "rank (or None to have moerun gather it)")
