"""The epoch plan's arithmetic, checked as properties over many shapes of data."""

from __future__ import annotations

import itertools
from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabloader.elastic import Leg, plan_rest, round_robin
from tabloader.permutation import (
    chunk_keys,
    chunk_permutation,
    counter_permutation,
    deal_into_batches,
    inverse_permutation,
)
from tabloader.plan import (
    chunk_offsets,
    count_batches,
    partition_order,
    plan_cached_epoch,
    plan_epoch,
    rank_rows,
    worker_row_range,
)

partition_sizes = st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=25)


def global_rows(rows: np.ndarray, plan) -> np.ndarray:
    """Global row ids (partition offset + row) covered by a plan's pieces, in read order."""
    offsets = np.concatenate([[0], np.cumsum(rows)[:-1]])
    parts = [
        offsets[p] + np.arange(a, b)
        for p, a, b in zip(plan.partitions, plan.starts, plan.stops, strict=True)
    ]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(
    rows=partition_sizes,
    batch_size=st.integers(1, 97),
    world=st.integers(1, 9),
    workers=st.integers(1, 4),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 5),
    per_chunk=st.one_of(
        st.tuples(st.just("parts"), st.integers(1, 5)),
        st.tuples(st.just("rows"), st.integers(1, 400)),
    ),
)
def test_shards_are_disjoint_cover_the_data_and_agree_on_batch_counts(
    rows, batch_size, world, workers, drop_last, shuffle, seed, epoch, per_chunk
):
    rows = np.asarray(rows, dtype=np.int64)
    total = int(rows.sum())
    chunking = (
        {"parts_per_chunk": per_chunk[1]}
        if per_chunk[0] == "parts"
        else {"chunk_rows": per_chunk[1]}
    )
    seen = []
    rank_batches = []
    for rank in range(world):
        rank_ids = []
        batches = 0
        for worker in range(workers):
            plan = plan_epoch(
                rows,
                batch_size=batch_size,
                shuffle=shuffle,
                seed=seed,
                epoch=epoch,
                global_rank=rank,
                global_size=world,
                worker=worker,
                num_workers=workers,
                drop_last=drop_last,
                **chunking,
            )
            ids = global_rows(rows, plan)
            assert len(ids) == plan.num_rows
            assert plan.num_batches == count_batches(plan.num_rows, batch_size, drop_last=drop_last)
            # drop_last is planned: the stream holds whole batches, none for the batcher to drop
            assert not drop_last or plan.num_rows == plan.num_batches * batch_size
            # Only the last worker of a rank may hold a short batch.
            if worker < workers - 1:
                assert plan.num_rows % batch_size == 0
            assert np.all(plan.stops > plan.starts)
            assert plan.chunk_bounds[0] == 0 and plan.chunk_bounds[-1] == len(plan.partitions)
            assert sum(plan.chunk_rows(c) for c in range(plan.num_chunks)) == plan.num_rows
            rank_ids.append(ids)
            batches += plan.num_batches
        rank_ids = np.concatenate(rank_ids)
        per_rank = total // world
        expected_rows = per_rank - (per_rank % batch_size if drop_last else 0)
        assert len(rank_ids) == expected_rows
        assert batches == count_batches(per_rank, batch_size, drop_last=drop_last)
        rank_batches.append(batches)
        seen.append(rank_ids)
    # Every rank the same number of batches; rows disjoint; at most world-1 rows left
    # out (plus the dropped short batches).
    assert len(set(rank_batches)) == 1
    union = np.concatenate(seen)
    assert len(np.unique(union)) == len(union)
    assert np.all((union >= 0) & (union < total))
    if not drop_last:
        assert total - len(union) == total % world


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 200), seed=st.integers(0, 2**63), epoch=st.integers(0, 100))
def test_partition_order_is_a_permutation_fixed_by_seed_and_epoch(n, seed, epoch):
    order = partition_order(n, shuffle=True, seed=seed, epoch=epoch)
    assert sorted(order.tolist()) == list(range(n))
    again = partition_order(n, shuffle=True, seed=seed, epoch=epoch)
    np.testing.assert_array_equal(order, again)


def test_partition_order_changes_with_epoch_and_seed():
    base = partition_order(50, shuffle=True, seed=1, epoch=0)
    assert not np.array_equal(base, partition_order(50, shuffle=True, seed=1, epoch=1))
    assert not np.array_equal(base, partition_order(50, shuffle=True, seed=2, epoch=0))
    np.testing.assert_array_equal(partition_order(5, shuffle=False, seed=1, epoch=3), range(5))


def test_plan_is_the_same_on_every_machine():
    # Pinned values: numpy's PCG64 streams are stable across platforms and releases, so a
    # change here means the plan changed and old runs are no longer reproducible.
    np.testing.assert_array_equal(
        partition_order(8, shuffle=True, seed=0, epoch=0),
        np.random.default_rng(np.random.SeedSequence([0, 0, 0])).permutation(8),
    )
    plan = plan_epoch(np.array([10, 10]), batch_size=4, shuffle=True, seed=5, epoch=2)
    again = plan_epoch(np.array([10, 10]), batch_size=4, shuffle=True, seed=5, epoch=2)
    np.testing.assert_array_equal(plan.batch_order(0), again.batch_order(0))


def test_rank_rows_split_evenly_and_leave_the_remainder_out():
    assert [rank_rows(11, global_rank=r, global_size=4) for r in range(4)] == [
        (0, 2),
        (2, 4),
        (4, 6),
        (6, 8),
    ]
    assert rank_rows(3, global_rank=4, global_size=5) == (0, 0)


def test_fewer_partitions_than_ranks_split_a_partition():
    plans = [
        plan_epoch(
            np.array([100]),
            batch_size=10,
            shuffle=False,
            seed=0,
            epoch=0,
            global_rank=r,
            global_size=4,
        )
        for r in range(4)
    ]
    assert [(p.starts.tolist(), p.stops.tolist()) for p in plans] == [
        ([0], [25]),
        ([25], [50]),
        ([50], [75]),
        ([75], [100]),
    ]
    assert {p.num_batches for p in plans} == {3}


def test_worker_ranges_are_batch_aligned():
    ranges = [
        worker_row_range(103, batch_size=10, drop_last=False, worker=w, num_workers=3)
        for w in range(3)
    ]
    assert ranges == [(0, 30), (30, 70), (70, 103)]
    ranges = [
        worker_row_range(103, batch_size=10, drop_last=True, worker=w, num_workers=3)
        for w in range(3)
    ]
    assert ranges == [(0, 30), (30, 60), (60, 100)]
    # More workers than batches: some get nothing, the rows are still all served.
    ranges = [
        worker_row_range(15, batch_size=10, drop_last=False, worker=w, num_workers=3)
        for w in range(3)
    ]
    assert ranges == [(0, 0), (0, 10), (10, 15)]


def test_chunk_offsets_by_parts_and_by_rows():
    assert chunk_offsets(np.array([5, 5, 5, 5, 5]), parts_per_chunk=2).tolist() == [0, 2, 4, 5]
    # At most chunk_rows rows a chunk; a bigger piece is a chunk of its own.
    assert chunk_offsets(np.array([1, 9, 1, 1, 1]), chunk_rows=3).tolist() == [0, 1, 2, 5]
    assert chunk_offsets(np.array([], dtype=np.int64), chunk_rows=3).tolist() == [0]
    with pytest.raises(ValueError, match="exactly one"):
        chunk_offsets(np.array([1]), parts_per_chunk=1, chunk_rows=1)


@given(
    rows=st.lists(st.integers(0, 50), max_size=30),
    chunk_rows=st.integers(1, 120),
)
def test_chunks_by_rows_are_the_largest_that_stay_within_chunk_rows(rows, chunk_rows):
    pieces = np.array(rows, dtype=np.int64)
    bounds = chunk_offsets(pieces, chunk_rows=chunk_rows).tolist()
    assert bounds[0] == 0 and bounds[-1] == len(rows) and bounds == sorted(set(bounds))
    for lo, hi in itertools.pairwise(bounds):
        held = int(pieces[lo:hi].sum())
        # Within the bound (memory), unless one piece is bigger on its own ...
        assert held <= chunk_rows or np.count_nonzero(pieces[lo:hi]) == 1
        # ... and as full as it can be: the next piece would not have fitted.
        if hi < len(rows):
            assert held + rows[hi] > chunk_rows


def test_shuffled_chunks_are_read_in_dataset_order():
    plan = plan_epoch(
        np.full(12, 10), batch_size=7, shuffle=True, seed=3, epoch=0, parts_per_chunk=4
    )
    for c in range(plan.num_chunks):
        parts = plan.partitions[plan.chunk_pieces(c)]
        assert np.all(np.diff(parts) > 0)
    # ...but chunks hold different partitions than the unshuffled order would.
    assert plan.partitions[plan.chunk_pieces(0)].tolist() != [0, 1, 2, 3]


@given(
    rows=st.integers(0, 400),
    batch_size=st.integers(1, 70),
    rows_before=st.integers(0, 500),
    seed=st.integers(0, 2**32 - 1),
)
def test_dealing_keeps_each_batch_of_the_permutation_in_stored_order(
    rows, batch_size, rows_before, seed
):
    order = np.random.default_rng(seed).permutation(rows)
    dealt = deal_into_batches(
        inverse_permutation(order), batch_size=batch_size, rows_before=rows_before
    )
    # Batches are cut every batch_size rows of the whole stream, which has rows_before
    # rows ahead of this chunk: the first window only completes the pending batch.
    first = -rows_before % batch_size
    bounds = sorted({0, rows, *range(first, rows, batch_size)})
    for lo, hi in itertools.pairwise(bounds):
        # The same rows as the permutation's window, now in stored order.
        np.testing.assert_array_equal(dealt[lo:hi], np.sort(order[lo:hi]))
    np.testing.assert_array_equal(np.sort(dealt), np.arange(rows))


@settings(deadline=None)
@given(
    rows=partition_sizes,
    batch_size=st.integers(1, 64),
    chunk_rows=st.integers(1, 200),
    within=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_batch_bounds_split_each_chunk_where_the_stream_is_cut(
    rows, batch_size, chunk_rows, within, seed
):
    plan = plan_epoch(
        np.array(rows),
        batch_size=batch_size,
        shuffle=True,
        shuffle_within_batch=within,
        seed=seed,
        epoch=0,
        chunk_rows=chunk_rows,
    )
    cuts = []
    for c in range(plan.num_chunks):
        bounds = plan.batch_bounds(c)
        assert bounds[0] == 0 and bounds[-1] == plan.chunk_rows(c)
        assert np.all(np.diff(bounds) > 0) and np.all(np.diff(bounds) <= batch_size)
        cuts.extend((plan.rows_before(c) + bounds[:-1]).tolist())
        order = plan.batch_order(c)
        np.testing.assert_array_equal(np.sort(order), np.arange(plan.chunk_rows(c)))
        if not within:  # dealt: every window in stored order
            for lo, hi in itertools.pairwise(bounds):
                assert np.all(np.diff(order[lo:hi]) > 0)
    # Every batch of the stream starts at a window boundary.
    assert set(range(0, plan.num_rows, batch_size)) <= set(cuts)


def test_dealt_batches_hold_the_same_rows_as_shuffled_ones():
    kwargs = dict(batch_size=7, shuffle=True, seed=4, epoch=1, chunk_rows=30)
    full = plan_epoch(np.full(9, 11), **kwargs)
    dealt = plan_epoch(np.full(9, 11), shuffle_within_batch=False, **kwargs)
    for c in range(full.num_chunks):
        a, b = full.batch_order(c), dealt.batch_order(c)
        assert not np.array_equal(a, b)
        bounds = full.batch_bounds(c)
        for lo, hi in itertools.pairwise(bounds):
            np.testing.assert_array_equal(np.sort(a[lo:hi]), b[lo:hi])


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 5000),
    keys=st.lists(st.integers(0, 2**64 - 1), min_size=4, max_size=4),
    block=st.integers(1, 20000),
)
def test_counter_permutation_is_a_bijection_whatever_the_block(n, keys, block):
    order = counter_permutation(n, keys, block=block)
    assert order.dtype == np.int64
    np.testing.assert_array_equal(np.sort(order), np.arange(n))
    np.testing.assert_array_equal(order, counter_permutation(n, keys))
    # gathered without the host learning any count (as on a GPU): the same permutation
    scattered = counter_permutation(n, keys, block=block, compact="scatter")
    assert scattered.dtype == np.int64 and scattered.shape == (n,)
    np.testing.assert_array_equal(scattered, order)


@pytest.mark.parametrize("n", [2**16 + 1, 2**19, 3 * 2**20 + 7])  # 32- and 64-bit halves
def test_counter_permutation_of_wide_domains_is_a_bijection(n):
    order = counter_permutation(n, [11, 12, 13, 14])
    np.testing.assert_array_equal(np.sort(order), np.arange(n))
    np.testing.assert_array_equal(order, counter_permutation(n, [11, 12, 13, 14], block=n // 3))
    scattered = counter_permutation(n, [11, 12, 13, 14], block=n // 3, compact="scatter")
    np.testing.assert_array_equal(scattered, order)


def test_chunk_permutations_drawn_together_are_each_chunks_own_on_the_host():
    from tabloader.permutation import counter_permutations

    sizes = [1000, 1000, 7, 0, 1, 1000]
    keys = [chunk_keys(seed=3, epoch=2, rank=1, worker=0, chunk=c) for c in range(6)]
    orders = list(counter_permutations(sizes, keys))
    for order, n, k in zip(orders, sizes, keys, strict=True):
        np.testing.assert_array_equal(order, counter_permutation(n, k))
    with pytest.raises(ValueError, match="2 sizes but 1 key lists"):
        list(counter_permutations([3, 4], keys[:1]))


@pytest.mark.parametrize(
    ("n", "chunk", "digest"),
    [
        (2, 0, "4cbbd8ca5215b8d1"),
        (3, 1, "ab25350e3e65efeb"),
        (1000, 2, "df6727df9a664cb1"),
        (131072, 3, "a6ae3bf14b688540"),
        (393216, 4, "0799a04b3d0a25bd"),
        (524288, 5, "fdfe8e4794a7a557"),
        (1_000_003, 6, "cfb9d307803abcdd"),
    ],
)
def test_chunk_orders_are_the_ones_every_release_drew(n, chunk, digest):
    """A seed's batches are the same from one release to the next: the orders of
    chunks of every shape of domain (odd and even bit counts, whole blocks and not) are
    pinned by the digest of their bytes, as first drawn."""
    import hashlib

    keys = chunk_keys(seed=7, epoch=2, rank=1, worker=0, chunk=chunk)
    order = counter_permutation(n, keys)
    assert hashlib.sha256(order.astype("<i8").tobytes()).hexdigest()[:16] == digest
    scattered = counter_permutation(n, keys, compact="scatter")
    assert hashlib.sha256(scattered.astype("<i8").tobytes()).hexdigest()[:16] == digest


def test_counter_permutation_refuses_an_unknown_compaction():
    with pytest.raises(ValueError, match="compact must be"):
        counter_permutation(10, [1, 2, 3, 4], compact="sort")  # type: ignore[arg-type]


def test_chunk_permutations_differ_by_every_part_of_their_key():
    base = dict(seed=1, epoch=2, rank=0, worker=0, chunk=3)
    first = chunk_permutation(1000, **base)
    np.testing.assert_array_equal(first, chunk_permutation(1000, **base))
    for part in base:
        other = chunk_permutation(1000, **{**base, part: base[part] + 1})
        assert not np.array_equal(first, other), part
    # Not close to the identity: fewer than 1% of rows stay in place.
    assert np.count_nonzero(first == np.arange(1000)) < 10


# -- resuming on another world: the rows no old worker delivered, each once ---------------


def stream_ids(plan, begins: np.ndarray) -> np.ndarray:
    """Global row ids (partition offset + row) a plan delivers, in delivery order."""
    out = [np.arange(0, dtype=np.int64)]
    for chunk in range(plan.num_chunks):
        pieces = plan.pieces(chunk)
        ids = np.concatenate(
            [np.arange(a, b) + begins[p] for p, a, b in pieces] or [np.arange(0)]
        ).astype(np.int64)
        order = plan.batch_order(chunk)
        out.append(ids if order is None else ids[order])
    return np.concatenate(out)


WORLDS = st.tuples(st.integers(1, 5), st.integers(1, 3))  # (ranks, workers per rank)


@settings(max_examples=400, deadline=None)
@given(
    rows=st.lists(st.integers(0, 60), min_size=1, max_size=10),
    batch_size=st.integers(1, 13),
    worlds=st.lists(WORLDS, min_size=2, max_size=4),
    shuffle=st.booleans(),
    within=st.booleans(),
    drop_last=st.booleans(),
    cached=st.sampled_from([False, True, "global"]),
    chunking=st.one_of(
        st.integers(1, 3).map(lambda n: {"parts_per_chunk": n}),
        st.integers(1, 80).map(lambda n: {"chunk_rows": n}),
    ),
    data=st.data(),
)
def test_an_epoch_resumed_on_other_worlds_delivers_every_row_left_exactly_once(
    rows, batch_size, worlds, shuffle, within, drop_last, cached, chunking, data
):
    """Pre-empted on one world, resumed on another (and again): every row the epoch's
    first world would have delivered comes at most once; on each new world the ranks get
    the same number of rows and batches, at most ``ranks - 1`` of the rows left sitting
    out (and the short batches of ``drop_last``); each worker reads each chunk at most
    once, and only chunks holding its rows."""
    partition_rows = np.array(rows, dtype=np.int64)
    begins = np.concatenate([[0], np.cumsum(partition_rows)[:-1]])
    options = dict(batch_size=batch_size, seed=5, epoch=2, shuffle_within_batch=within)
    options.update(drop_last=drop_last, **chunking)

    def planner(rank, size, worker, workers):
        how = (
            plan_epoch
            if cached is False
            else partial(plan_cached_epoch, shuffle="global" if cached == "global" else shuffle)
        )
        keywords = {} if cached is not False else {"shuffle": shuffle}
        return how(
            partition_rows, global_rank=rank, global_size=size, worker=worker,
            num_workers=workers, **keywords, **options,
        )  # fmt: skip

    first_size, first_workers = worlds[0]
    epoch_rows = np.concatenate(
        [
            stream_ids(planner(r, first_size, w, first_workers), begins)
            for r in range(first_size)
            for w in range(first_workers)
        ]
    )
    delivered: list[np.ndarray] = []
    legs: list[Leg] = []
    left = len(epoch_rows)  # rows of the epoch not delivered yet
    for level, (size, workers) in enumerate(worlds):
        rest = partial(plan_rest, planner, legs, batch_size=batch_size, drop_last=drop_last)
        plans = {
            (r, w): planner(r, size, w, workers)
            if level == 0
            else rest(global_rank=r, global_size=size, worker=w, num_workers=workers)
            for r in range(size)
            for w in range(workers)
        }
        per_rank = [sum(plans[r, w].num_rows for w in range(workers)) for r in range(size)]
        batches = [sum(plans[r, w].num_batches for w in range(workers)) for r in range(size)]
        assert len(set(per_rank)) == 1 and len(set(batches)) == 1  # ranks in step
        if level:
            sitting_out = left - size * per_rank[0]
            assert 0 <= sitting_out <= size - 1 + (size * (batch_size - 1) if drop_last else 0)
            if not drop_last:
                assert sitting_out == left % size
        last = level == len(worlds) - 1
        done = tuple(
            plans[0, w].num_batches if last else data.draw(st.integers(0, plans[0, w].num_batches))
            for w in range(workers)
        )  # in step: every rank's worker w delivered as many batches
        for (_, w), plan in plans.items():
            ids = stream_ids(plan, begins)
            assert len(ids) == plan.num_rows
            assert plan.num_batches == count_batches(plan.num_rows, batch_size, drop_last=drop_last)
            # drop_last is planned: the stream holds whole batches, none for the batcher to drop
            assert not drop_last or plan.num_rows == plan.num_batches * batch_size
            delivered.append(ids[: done[w] * batch_size])
            # only chunks holding its rows, each read once
            assert all(plan.chunk_rows(c) > 0 for c in range(plan.num_chunks))
            assert len({tuple(o) for o in plan.origins.tolist()}) == plan.num_chunks
        legs.append(Leg(size, workers, done))
        left = (
            size * per_rank[0]
            - sum(min(d * batch_size, plans[0, w].num_rows) for w, d in enumerate(done)) * size
        )
    union = np.concatenate(delivered)
    assert len(np.unique(union)) == len(union)  # none twice
    assert set(union.tolist()) <= set(epoch_rows.tolist())  # none from outside the epoch


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.integers(0, 60), min_size=1, max_size=10),
    batch_size=st.integers(1, 13),
    worlds=st.lists(WORLDS, min_size=1, max_size=3),
    shuffle=st.booleans(),
    data=st.data(),
)
def test_rows_sit_out_only_where_a_world_cannot_share_them_evenly(
    rows, batch_size, worlds, shuffle, data
):
    """Without drop_last the rows that never come are exactly the remainders of the
    deals: the epoch's first ``N % W`` and, at each change of world, ``left % W``."""
    partition_rows = np.array(rows, dtype=np.int64)
    total = int(partition_rows.sum())

    def planner(rank, size, worker, workers):
        return plan_epoch(
            partition_rows, batch_size=batch_size, shuffle=shuffle, seed=1, epoch=0,
            global_rank=rank, global_size=size, worker=worker, num_workers=workers,
            parts_per_chunk=2,
        )  # fmt: skip

    legs: list[Leg] = []
    delivered = 0
    expected_out = total % worlds[0][0]
    left = total - expected_out
    for level, (size, workers) in enumerate([*worlds, (data.draw(st.integers(1, 6)), 1)]):
        rest = partial(plan_rest, planner, legs, batch_size=batch_size, drop_last=False)
        plans = [
            planner(0, size, w, workers)
            if level == 0
            else rest(global_rank=0, global_size=size, worker=w, num_workers=workers)
            for w in range(workers)
        ]
        if level:
            expected_out += left % size
        if level == len(worlds):  # the last world finishes the epoch
            delivered += size * sum(p.num_rows for p in plans)
            break
        done = tuple(data.draw(st.integers(0, p.num_batches)) for p in plans)
        got = size * sum(min(d * batch_size, p.num_rows) for d, p in zip(done, plans, strict=True))
        delivered += got
        left = size * sum(p.num_rows for p in plans) - got
        legs.append(Leg(size, workers, done))
    assert delivered == total - expected_out


def test_a_resumed_world_refuses_more_batches_than_a_worker_had():
    def planner(rank, size, worker, workers):
        return plan_epoch(
            np.array([10, 10]), batch_size=4, shuffle=False, seed=0, epoch=0,
            global_rank=rank, global_size=size, worker=worker, num_workers=workers,
        )  # fmt: skip

    with pytest.raises(ValueError, match="worker 0 of 2 on 2 ranks delivered 2 batches, but had 1"):
        plan_rest(
            planner, [Leg(2, 2, (2, 1))], global_rank=0, global_size=1, worker=0,
            num_workers=1, batch_size=4, drop_last=False,
        )  # fmt: skip


@given(batches=st.lists(st.integers(0, 9), min_size=1, max_size=5), data=st.data())
def test_round_robin_counts_what_workers_taken_in_turn_delivered(batches, data):
    taken = data.draw(st.integers(0, sum(batches)))
    # the reference: one batch at a time from each worker that has one left, in turn
    left, order = list(batches), []
    while any(left):
        for w in range(len(left)):
            if left[w]:
                order.append(w)
                left[w] -= 1
    expected = [order[:taken].count(w) for w in range(len(batches))]
    assert round_robin(batches, taken) == expected
