"""Pure, rank-identical planning of one forward (DESIGN 4.1 steps 1-3).

Every function here is a pure function of rank-identical inputs (the token counts, the
config), so every rank derives the same padding decision and chunk count (DESIGN 9).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from moerun.comm.base import ChunkCounts

__all__ = ["ForwardPlan", "plan_forward", "split_rows"]


def split_rows(rows: int, num_chunks: int) -> tuple[int, ...]:
    """Split ``rows`` into ``num_chunks`` sizes differing by at most one, larger first.

    Pure; host only."""
    q, r = divmod(rows, num_chunks)
    return tuple(q + 1 if i < r else q for i in range(num_chunks))


@dataclass(frozen=True, kw_only=True)
class ForwardPlan:
    """The rank-identical shape of one forward.

    Fields:
        counts: every rank's token count as given (``all_rank_num_tokens``).
        padded_counts: counts after DP padding (all equal to the max when ``padded``).
        padded: DP padding is on (``use_dp_padding`` or the zero-token fix).
        num_chunks: chunks every rank runs.
        chunks: per chunk, the rows of every rank (:class:`ChunkCounts`).
        bounds: per chunk, ``(lo, hi)`` of this rank's rows.
        rank: this rank.
    """

    counts: tuple[int, ...]
    padded_counts: tuple[int, ...]
    padded: bool
    num_chunks: int
    chunks: tuple[ChunkCounts, ...]
    bounds: tuple[tuple[int, int], ...]
    rank: int

    @property
    def num_tokens(self) -> int:
        """This rank's real tokens."""
        return self.counts[self.rank]

    @property
    def local_rows(self) -> int:
        """Rows this rank routes (padding included)."""
        return self.padded_counts[self.rank]

    def chunk_bounds(self, c: int) -> tuple[int, int]:
        """``[lo, hi)`` of this rank's rows in chunk ``c``. Pure; host only."""
        return self.bounds[c]

    @property
    def rank_offset(self) -> int:
        """Exclusive prefix sum of the (unpadded) counts at this rank (EPLB replica routing)."""
        return sum(self.counts[: self.rank])


@functools.lru_cache(maxsize=512)
def _plan(counts: tuple[int, ...], rank: int, use_dp_padding: bool,
          max_num_tokens: int | None) -> ForwardPlan:
    dp = len(counts)
    biggest = max(counts)
    zero_fix = dp > 1 and biggest > 0 and min(counts) == 0
    padded = (use_dp_padding or zero_fix) and biggest > 0
    padded_counts = tuple([biggest] * dp) if padded else tuple(counts)
    rows = dp * biggest if dp > 1 else counts[rank]
    if max_num_tokens is None or rows == 0:
        num_chunks = 1
    else:
        num_chunks = max(1, math.ceil(rows / max_num_tokens))
    per_rank = [split_rows(n, num_chunks) for n in padded_counts]
    chunks = tuple(
        ChunkCounts(counts=tuple(per_rank[r][c] for r in range(dp)), rank=rank)
        for c in range(num_chunks)
    )
    bounds, lo = [], 0
    for ch in chunks:
        bounds.append((lo, lo + ch.local))
        lo += ch.local
    return ForwardPlan(counts=tuple(counts), padded_counts=padded_counts, padded=padded,
                       num_chunks=num_chunks, chunks=chunks, bounds=tuple(bounds), rank=rank)


def plan_forward(counts: tuple[int, ...], *, rank: int, use_dp_padding: bool,
                 max_num_tokens: int | None) -> ForwardPlan:
    """Decide padding and chunking.

    Args:
        counts: rank-identical ``all_rank_num_tokens`` (length = DP size).
        rank: this rank.
        use_dp_padding: the caller asks for DP padding (every entry becomes the max).
        max_num_tokens: under a DP strategy (``len(counts) > 1``), the most rows one chunk
            gathers across the group; otherwise the most local rows per chunk; None = 1 chunk.

    Zero-token fix: with more than one rank, if some rank has 0 tokens and the max is > 0,
    padding turns on for all ranks. ``num_chunks = ceil(rows / max_num_tokens)`` with
    ``rows = dp * max(counts)`` (DP) or the local count; 1 when every rank is empty.
    Each rank splits its rows into ``num_chunks`` chunks, larger chunks first.

    Pure; no host sync; no collective. Results are memoised (the plan is an immutable value
    of its arguments), so a steady-state forward does not rebuild it.
    """
    return _plan(tuple(int(c) for c in counts), int(rank), bool(use_dp_padding),
                 max_num_tokens)
