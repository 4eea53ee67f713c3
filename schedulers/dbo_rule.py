"""The dual-batch-overlap split rule (DESIGN 7): a pure function of rank-identical inputs.

Split iff all of:

1. every rank has ``T_r == 0`` or ``T_r >= 2`` rows (a rank with one row cannot give both
   micro-batches a real row);
2. ``max(T) >= threshold``, the DESIGN default being 32 when ``max(T) <= 256``, else 512;
3. the weight re-read guard: each micro-batch reads the weights of every expert it hits, so
   where the experts are memory-bound a split can double the weight bytes. The split is
   refused when a micro-batch would give the average local expert fewer than
   ``min_rows_per_expert`` rows (uniform-routing estimate ``ceil(max T / 2) * K / S_local``).
   The default is 1024 on one rank (no communication to hide, so a split must cost little:
   ``moerun bench --dbo`` on the H200, 2026-12-01, measured the forced split 17-18 % slower
   at 256 rows per expert per micro-batch and 3.8 % slower at 1024) and 0 on several ranks
   (the DESIGN threshold alone, until a measured multi-GPU table replaces it);
4. not under CUDA-graph capture (DBO under graphs is out of scope, DESIGN 13: the forward
   runs unsplit).

The counts are the rank-identical ``all_rank_num_tokens`` (after agreed validation), so
every rank takes the same decision and issues the same collectives; micro-batch 0 takes
``ceil(T_r / 2)`` of each rank's rows and each micro-batch then follows the external
scheduler's rules (its own zero-token fix and chunking).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DBOConfig", "SplitDecision", "decide_split", "micro_batch_counts"]


@dataclass(frozen=True, kw_only=True)
class DBOConfig:
    """Split-rule settings (see the module docstring).

    Fields: ``small_threshold`` (32) applies while ``max(T) <= small_max`` (256), else
    ``large_threshold`` (512); ``min_rows_per_expert_one_rank`` (128.0) and
    ``min_rows_per_expert_multi_rank`` (0.0): the re-read guard.
    """

    small_threshold: int = 32
    large_threshold: int = 512
    small_max: int = 256
    min_rows_per_expert_one_rank: float = 1024.0
    min_rows_per_expert_multi_rank: float = 0.0

    def __post_init__(self) -> None:
        for name in ("small_threshold", "large_threshold", "small_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 2:
                raise ValueError(f"DBOConfig.{name}={v!r} must be an int >= 2")
        for name in ("min_rows_per_expert_one_rank", "min_rows_per_expert_multi_rank"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 0):
                raise ValueError(f"DBOConfig.{name}={v!r} must be a number >= 0")

    def describe(self) -> str:
        """The split rule and its thresholds, in one line. Pure; host only."""
        return (f"DESIGN 7 threshold ({self.small_threshold} while max T <= {self.small_max}, "
                f"else {self.large_threshold}), every rank 0 or >= 2 rows, weight re-read "
                f"guard >= {self.min_rows_per_expert_one_rank:g} rows per local expert per "
                f"micro-batch on one rank, >= {self.min_rows_per_expert_multi_rank:g} on "
                "several; never under CUDA-graph capture")


@dataclass(frozen=True, kw_only=True)
class SplitDecision:
    """``split`` or not, and the ``rule`` that decided (for logs, tests and traces)."""

    split: bool
    rule: str


def decide_split(counts: tuple[int, ...], *, config: DBOConfig, top_k: int,
                 slots_per_rank: float, capturing: bool) -> SplitDecision:
    """The split decision for rank-identical ``counts`` (one entry per rank). Pure.

    ``slots_per_rank``: ``num_slots / ep_size``, the weight re-read guard's experts per rank.
    It must be the same on every rank (DESIGN 9): a rank's own slot count is not, where the
    slots do not divide over the ranks, and the guard would split on some ranks only."""
    biggest = max(counts)
    if capturing:
        return SplitDecision(split=False, rule="CUDA-graph capture: DBO is not captured")
    if any(c == 1 for c in counts):
        return SplitDecision(split=False, rule="a rank has exactly one row")
    threshold = config.small_threshold if biggest <= config.small_max else \
        config.large_threshold
    if biggest < threshold:
        return SplitDecision(split=False, rule=f"max T {biggest} < threshold {threshold}")
    guard = (config.min_rows_per_expert_one_rank if len(counts) == 1
             else config.min_rows_per_expert_multi_rank)
    rows = -(-biggest // 2) * top_k / max(1.0, slots_per_rank)
    if rows < guard:
        return SplitDecision(split=False, rule=f"weight re-read guard: {rows:.1f} rows per "
                             f"local expert per micro-batch < {guard:g}")
    return SplitDecision(split=True, rule=f"max T {biggest} >= threshold {threshold}, "
                         f"{rows:.1f} rows per local expert per micro-batch")


def micro_batch_counts(counts: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(ub0, ub1)`` per-rank rows: micro-batch 0 takes ``ceil(T_r / 2)``. Pure."""
    first = tuple(-(-c // 2) for c in counts)
    return first, tuple(c - f for c, f in zip(counts, first))
