"""The rest of an epoch dealt to another world: more or fewer ranks or workers.

An epoch interrupted on one number of ranks or workers goes on on another:
[`plan_rest`][tabloader.elastic.plan_rest] deals the rows no old worker delivered to the
new ranks and workers as a fresh epoch's rows are dealt (`tabloader.plan`), each chunk
keeping its permutation, and each new worker reading only the chunks holding its rows.
Like the plan, everything here is a pure function of integers.

Examples:
    >>> round_robin([3, 1, 2], 5)  # workers 0, 1, 2, 0, 2
    [2, 1, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from tabloader.plan import (
    EpochPlan,
    Run,
    count_batches,
    first_rows,
    plan_of_runs,
    skip_rows,
    stream_runs,
    worker_row_range,
)

__all__ = ["Leg", "Planner", "plan_rest", "round_robin"]


@dataclass(frozen=True)
class Leg:
    """The part of an epoch one world served before it changed: ``global_size`` ranks,
    each with ``num_workers`` worker shares, worker share ``w`` of every rank having
    delivered ``batches[w]`` batches (ranks of one job are in step)."""

    global_size: int
    num_workers: int
    batches: tuple[int, ...]


Planner = Callable[[int, int, int, int], EpochPlan]
"""``(global_rank, global_size, worker, num_workers)`` -> that worker's plan of the epoch."""


def plan_rest(
    planner: Planner,
    legs: Sequence[Leg],
    *,
    global_rank: int,
    global_size: int,
    worker: int,
    num_workers: int,
    batch_size: int,
    drop_last: bool,
) -> EpochPlan:
    """One worker's plan of the rest of an epoch that ``legs`` served on other worlds.

    ``planner`` plans the epoch for a worker of any world (the first leg's plans). After
    each leg, the rows its ranks had not delivered (every worker stream from its
    ``batches[w] * batch_size``-th row on, in the order of ranks, then workers, then
    their streams) form one sequence, dealt to the next world exactly as a fresh epoch's
    rows are (see [`rank_rows`][tabloader.plan.rank_rows] and
    [`worker_row_range`][tabloader.plan.worker_row_range]): every rank the same number
    of rows, at most ``global_size - 1`` of them sitting out, workers in runs of whole
    batches. So the rows delivered across all the legs are each delivered once. A worker
    reads only the chunks holding its rows, each with the permutation it had (see
    `plan_of_runs`); its batches are cut from its own new stream.

    Raises ``ValueError`` when a leg says a worker delivered more batches than it had.

    Examples:
        >>> import numpy as np
        >>> from tabloader.plan import plan_epoch
        >>> planner = lambda rank, size, worker, workers: plan_epoch(
        ...     np.array([10, 10]), batch_size=3, shuffle=False, seed=0, epoch=0,
        ...     global_rank=rank, global_size=size, worker=worker, num_workers=workers)
        >>> gone = [Leg(global_size=2, num_workers=1, batches=(2,))]  # rows 0-5, 10-15
        >>> [plan_rest(planner, gone, global_rank=0, global_size=1, worker=0, num_workers=1,
        ...            batch_size=3, drop_last=False).pieces(c) for c in range(2)]
        [[(0, 6, 10)], [(1, 6, 10)]]
    """
    worlds = [(leg.global_size, leg.num_workers) for leg in legs] + [(global_size, num_workers)]
    plans: dict[tuple[int, int], EpochPlan] = {}

    def first_plan(rank: int, w: int) -> EpochPlan:
        if (rank, w) not in plans:
            plans[rank, w] = planner(rank, worlds[0][0], w, worlds[0][1])
        return plans[rank, w]

    # shares[level][w]: rows [lo, hi) of a rank's rows (the same on every rank) worker w
    # streams in that leg; left[level][w]: how many of them it did not deliver
    shares = [[(0, first_plan(0, w).num_rows) for w in range(worlds[0][1])]]
    rank_rows_of = [0]  # rows of a rank in each leg but the first (where the plans tell)
    left: list[list[int]] = []
    for level, leg in enumerate(legs):
        if len(leg.batches) != leg.num_workers:
            raise ValueError(f"{len(leg.batches)} batch counts for {leg.num_workers} workers")
        left.append([])
        for w, ((lo, hi), done) in enumerate(zip(shares[level], leg.batches, strict=True)):
            have = count_batches(hi - lo, batch_size, drop_last=drop_last)
            if not 0 <= done <= have:
                raise ValueError(
                    f"worker {w} of {leg.num_workers} on {leg.global_size} ranks delivered "
                    f"{done} batches, but had {have}"
                )
            left[level].append(hi - lo - min(done * batch_size, hi - lo))
        size, workers = worlds[level + 1]
        per_rank = leg.global_size * sum(left[level]) // size
        rank_rows_of.append(per_rank)
        share = partial(
            worker_row_range, per_rank, batch_size=batch_size, drop_last=drop_last,
            num_workers=workers,
        )  # fmt: skip
        shares.append([share(worker=w) for w in range(workers)])

    streams: dict[tuple[int, int, int], list[Run]] = {}

    def stream(level: int, rank: int, w: int) -> list[Run]:
        """Worker ``w`` of rank ``rank``'s stream in leg ``level``, as runs."""
        if level == 0:
            return stream_runs(first_plan(rank, w))
        if (level, rank, w) in streams:
            return streams[level, rank, w]
        # the sequence dealt: every old rank's streams, worker by worker, less the rows
        # they delivered
        gone, (lo, hi) = left[level - 1], shares[level][w]
        at, end = rank * rank_rows_of[level] + lo, rank * rank_rows_of[level] + hi
        runs: list[Run] = []
        while at < end:
            old_rank, offset = divmod(at, sum(gone))
            old_worker = 0
            while offset >= gone[old_worker]:
                offset -= gone[old_worker]
                old_worker += 1
            take = min(end - at, gone[old_worker] - offset)
            old_lo, old_hi = shares[level - 1][old_worker]
            done = old_hi - old_lo - gone[old_worker]
            runs += first_rows(
                skip_rows(stream(level - 1, old_rank, old_worker), done + offset), take
            )
            at += take
        streams[level, rank, w] = runs
        return runs

    lo, hi = shares[-1][worker]
    return plan_of_runs(
        stream(len(legs), global_rank, worker),
        first_plan(0, 0),
        num_rows=hi - lo,
        num_batches=count_batches(hi - lo, batch_size, drop_last=drop_last),
        rows_skipped=0,
    )


def round_robin(batches: Sequence[int], taken: int) -> list[int]:
    """How many of each worker's ``batches`` are among the first ``taken`` of a loader
    that takes them from the workers in turn, passing over those with none left (as
    PyTorch's ``DataLoader`` does with worker processes, in order).

    Examples:
        >>> round_robin([3, 1, 2], 5)  # workers 0, 1, 2, 0, 2
        [2, 1, 2]
    """
    if not 0 <= taken <= sum(batches):
        raise ValueError(f"taken must be in [0, {sum(batches)}], got {taken}")
    got = [0] * len(batches)
    while taken:
        active = [w for w, n in enumerate(batches) if n > got[w]]
        rounds = min(min(batches[w] - got[w] for w in active), taken // len(active))
        if rounds == 0:  # a last, partial round, in the workers' order
            for w in active[:taken]:
                got[w] += 1
            break
        for w in active:
            got[w] += rounds
        taken -= rounds * len(active)
    return got
