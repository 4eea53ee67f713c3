"""``schedulers.plan``: pure, rank-identical planning of one forward (DESIGN 4.1 steps 1-3).

Hand-worked cases first, then a sweep over counts x ranks x chunk limits checking the
invariants every rank relies on.
"""

from __future__ import annotations

import itertools
import math

import pytest

from moerun.comm.base import ChunkCounts
from schedulers.plan import ForwardPlan, plan_forward, split_rows


def _plans(counts, **kw) -> list[ForwardPlan]:
    """The plan of every rank (they must agree on everything but ``rank``)."""
    return [plan_forward(tuple(counts), rank=r, **kw) for r in range(len(counts))]


# ------------------------------------------------------------------ split_rows


@pytest.mark.parametrize("rows,n,want", [
    (7, 3, (3, 2, 2)),
    (6, 3, (2, 2, 2)),
    (2, 4, (1, 1, 0, 0)),  # empty shares go last
    (0, 3, (0, 0, 0)),
    (5, 1, (5,)),
    (1, 1, (1,)),
])
def test_split_rows_larger_first(rows, n, want):
    assert split_rows(rows, n) == want


@pytest.mark.parametrize("rows,n", list(itertools.product(range(0, 12), range(1, 6))))
def test_split_rows_invariants(rows, n):
    sizes = split_rows(rows, n)
    assert len(sizes) == n and sum(sizes) == rows
    assert max(sizes) - min(sizes) <= 1
    assert list(sizes) == sorted(sizes, reverse=True)


# ------------------------------------------------------------------ zero-token fix / padding


def test_zero_token_fix_pads_all_ranks():
    # counts [3, 0, 2]: rank 1 is empty and max = 3 > 0 -> every rank pads to 3.
    for p in _plans([3, 0, 2], use_dp_padding=False, max_num_tokens=None):
        assert p.padded
        assert p.counts == (3, 0, 2)
        assert p.padded_counts == (3, 3, 3)
        assert p.local_rows == 3
        assert p.num_tokens == (3, 0, 2)[p.rank]
        assert p.num_chunks == 1
        assert p.chunks == (ChunkCounts(counts=(3, 3, 3), rank=p.rank),)


def test_no_zero_token_fix_when_every_rank_has_tokens():
    for p in _plans([3, 1, 2], use_dp_padding=False, max_num_tokens=None):
        assert not p.padded
        assert p.padded_counts == (3, 1, 2)
        assert p.local_rows == p.num_tokens


def test_use_dp_padding_pads_to_max():
    for p in _plans([3, 1, 2], use_dp_padding=True, max_num_tokens=None):
        assert p.padded and p.padded_counts == (3, 3, 3) and p.local_rows == 3


@pytest.mark.parametrize("use_dp_padding", [False, True])
def test_all_ranks_empty_is_one_unpadded_chunk(use_dp_padding):
    for p in _plans([0, 0, 0], use_dp_padding=use_dp_padding, max_num_tokens=4):
        assert not p.padded
        assert p.padded_counts == (0, 0, 0)
        assert p.num_chunks == 1
        assert p.chunks == (ChunkCounts(counts=(0, 0, 0), rank=p.rank),)
        assert p.chunk_bounds(0) == (0, 0)


def test_single_rank_never_needs_zero_token_fix():
    p = plan_forward((0,), rank=0, use_dp_padding=False, max_num_tokens=3)
    assert not p.padded and p.num_chunks == 1 and p.local_rows == 0
    p = plan_forward((5,), rank=0, use_dp_padding=True, max_num_tokens=None)
    assert p.padded_counts == (5,) and p.local_rows == 5 and p.num_chunks == 1


# ------------------------------------------------------------------ chunk count


@pytest.mark.parametrize("counts,mnt,want", [
    ((5, 2, 4), 4, 4),  # ceil(3 * 5 / 4)
    ((5, 2, 4), 15, 1),
    ((5, 2, 4), 14, 2),
    ((5, 2, 4), 3, 5),
    ((1, 1), 2, 1),
    ((1, 1), 1, 2),
    ((3, 0), 2, 3),  # zero-token fix on; rows = 2 * 3
    ((8, 8, 8, 8), 32, 1),
    ((8, 8, 8, 8), 31, 2),
])
def test_num_chunks_dp(counts, mnt, want):
    assert want == math.ceil(len(counts) * max(counts) / mnt)
    for p in _plans(counts, use_dp_padding=False, max_num_tokens=mnt):
        assert p.num_chunks == want and len(p.chunks) == want


@pytest.mark.parametrize("t,mnt,want", [(7, 1, 7), (7, 3, 3), (7, 7, 1), (7, 1000, 1),
                                        (6, 3, 2), (1, 5, 1), (0, 2, 1)])
def test_num_chunks_single_rank_uses_local_t(t, mnt, want):
    p = plan_forward((t,), rank=0, use_dp_padding=False, max_num_tokens=mnt)
    assert p.num_chunks == want
    assert tuple(c.local for c in p.chunks) == split_rows(t, want)


def test_max_num_tokens_none_is_one_chunk():
    for p in _plans([100, 0, 7], use_dp_padding=False, max_num_tokens=None):
        assert p.num_chunks == 1


# ------------------------------------------------------------------ chunks, bounds, offset


def test_chunks_hand_worked():
    # counts [5, 2, 4], max_num_tokens 4 -> 4 chunks; each rank splits its own rows:
    #   rank 0: 5 -> 2 1 1 1;  rank 1: 2 -> 1 1 0 0;  rank 2: 4 -> 1 1 1 1
    plans = _plans([5, 2, 4], use_dp_padding=False, max_num_tokens=4)
    want = [(2, 1, 1), (1, 1, 1), (1, 0, 1), (1, 0, 1)]
    for p in plans:
        assert [c.counts for c in p.chunks] == want
        assert all(c.rank == p.rank for c in p.chunks)
    p0, p1, p2 = plans
    assert [p0.chunk_bounds(c) for c in range(4)] == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert [p1.chunk_bounds(c) for c in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert [p2.chunk_bounds(c) for c in range(4)] == [(0, 1), (1, 2), (2, 3), (3, 4)]


@pytest.mark.parametrize("counts,rank,want", [
    ((3, 0, 2), 0, 0), ((3, 0, 2), 1, 3), ((3, 0, 2), 2, 3),
    ((4, 4, 4, 4), 3, 12), ((7,), 0, 0),
])
def test_rank_offset_is_exclusive_prefix_of_unpadded_counts(counts, rank, want):
    # Padding never shifts the offset: it is over the real tokens (EPLB replica routing).
    for pad in (False, True):
        p = plan_forward(counts, rank=rank, use_dp_padding=pad, max_num_tokens=2)
        assert p.rank_offset == want


COUNT_SETS = [(0,), (1,), (9,), (3, 0), (0, 0), (5, 2, 4), (1, 0, 0, 6), (2, 2, 2, 2), (0, 7, 0)]


@pytest.mark.parametrize("counts", COUNT_SETS)
@pytest.mark.parametrize("mnt", [None, 1, 2, 3, 5, 100])
@pytest.mark.parametrize("use_dp_padding", [False, True])
def test_plan_invariants(counts, mnt, use_dp_padding):
    plans = _plans(counts, use_dp_padding=use_dp_padding, max_num_tokens=mnt)
    dp, biggest = len(counts), max(counts)
    for p in plans:
        # rank-identical decisions (DESIGN 9)
        ref = plans[0]
        assert (p.counts, p.padded_counts, p.padded, p.num_chunks) == \
            (ref.counts, ref.padded_counts, ref.padded, ref.num_chunks)
        assert [c.counts for c in p.chunks] == [c.counts for c in ref.chunks]
        # padding rule
        want_pad = biggest > 0 and (use_dp_padding or (dp > 1 and min(counts) == 0))
        assert p.padded == want_pad
        assert p.padded_counts == ((biggest,) * dp if want_pad else counts)
        # chunk count
        rows = dp * biggest if dp > 1 else counts[p.rank]
        want_chunks = 1 if mnt is None or rows == 0 else math.ceil(rows / mnt)
        assert p.num_chunks == want_chunks == len(p.chunks)
        # per-rank chunk sizes sum to the padded count, larger first, differ by <= 1
        for r in range(dp):
            sizes = [c.counts[r] for c in p.chunks]
            assert sum(sizes) == p.padded_counts[r]
            assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1
        # bounds tile [0, local_rows) contiguously, in order
        lo = 0
        for c in range(p.num_chunks):
            a, b = p.chunk_bounds(c)
            assert a == lo and b - a == p.chunks[c].local
            lo = b
        assert lo == p.local_rows
        assert p.num_tokens == counts[p.rank] <= p.local_rows
        assert p.rank_offset == sum(counts[: p.rank])


def test_plan_is_pure():
    counts = [5, 0, 2]
    a = plan_forward(tuple(counts), rank=2, use_dp_padding=False, max_num_tokens=4)
    b = plan_forward(tuple(counts), rank=2, use_dp_padding=False, max_num_tokens=4)
    assert a == b and counts == [5, 0, 2]
    with pytest.raises(AttributeError):
        a.num_chunks = 3  # type: ignore[misc]  (frozen)
