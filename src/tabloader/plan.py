"""The epoch plan: which rows each rank and worker reads, in which chunks, as how many batches.

Everything here is a pure function of integers: partition row counts, seed, epoch, rank
and worker. No I/O, no state. Every process of a distributed job computes the same plan
from the same inputs, so ranks agree without talking to each other.

How an epoch is laid out:

1. **Partition order.** Without shuffling, partitions keep dataset order. With
   shuffling, they are permuted by a generator seeded with ``(seed, epoch)``.
2. **Rank shard.** The partitions' rows, in that order, form one virtual sequence of
   ``N`` rows. Rank ``r`` of ``W`` takes rows ``[r*N//W, (r+1)*N//W)`` after the sequence
   is cut to ``W * (N // W)`` rows: every rank gets exactly ``N // W`` rows and so the
   same number of batches, and at most ``W - 1`` rows (the tail of the sequence, which
   changes every epoch when shuffling) sit out the epoch. A partition may be split
   between ranks, so this works with fewer partitions than ranks.
3. **Drop last.** With ``drop_last`` the rank keeps only whole batches'
   worth of rows (``batch_size * (rows // batch_size)``).
4. **Worker shard.** Worker processes of one rank split its batches into contiguous,
   batch-aligned ranges, so only the last worker can hold the short batch and the
   rank's batch count is unchanged.
5. **Chunks.** The worker's rows, as pieces of partitions, are grouped into chunks of
   ``parts_per_chunk`` pieces or of at most ``chunk_rows`` rows. Batches are cut from
   the stream of chunk rows; a chunk's remainder is carried into the next chunk's first
   batch, so every batch but the epoch's last is full.
6. **Permutation.** When shuffling, a permutation seeded by
   ``(seed, epoch, rank, worker, chunk)`` gives every row of a chunk its place in the
   chunk's stream, and so its batch. With ``shuffle_within_batch=False`` the rows of
   each batch are then delivered in stored order: which rows share a batch is exactly
   as random, only the order inside a batch (which a loss summed over the batch does
   not see) is not, and the CPU backend writes each batch's rows sequentially.
7. **Resume.** A worker that already delivered ``k`` batches of an epoch continues at
   row ``k * batch_size`` of its stream (every delivered batch but the epoch's last is
   full). [`EpochPlan.resume`][tabloader.plan.EpochPlan.resume] keeps the chunks from the one
   holding that row on, each with its original permutation key; that chunk delivers the
   rest of its order (its window); earlier chunks are never read.
8. **Another world.** An epoch interrupted on one number of ranks or workers goes on
   on another: [`plan_rest`][tabloader.elastic.plan_rest] deals the rows no old worker
   delivered to the new ranks and workers as a fresh epoch's rows are dealt, each chunk
   keeping its permutation, and each new worker reading only the chunks holding its rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from tabloader.permutation import (
    chunk_keys,
    counter_permutation,
    counter_permutations,
    deal_into_batches,
    inverse_permutation,
)

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "EpochPlan",
    "Run",
    "chunk_offsets",
    "count_batches",
    "first_rows",
    "fixed_share",
    "partition_order",
    "plan_cached_epoch",
    "plan_epoch",
    "plan_of_runs",
    "rank_rows",
    "skip_rows",
    "stream_runs",
    "worker_row_range",
]

DEFAULT_CHUNK_BYTES = 128 * 2**20
"""Decoded bytes per chunk when neither ``parts_per_chunk`` nor ``chunk_rows`` is given
(and per window of a cache's chunk served on a GPU)."""

_ORDER_STREAM = 0


def count_batches(rows: int, batch_size: int, *, drop_last: bool) -> int:
    """Number of batches ``rows`` rows make: full ones, plus a short one unless ``drop_last``.

    Examples:
        >>> count_batches(10, 4, drop_last=False), count_batches(10, 4, drop_last=True)
        (3, 2)
    """
    full, rest = divmod(rows, batch_size)
    return full + (1 if rest and not drop_last else 0)


def partition_order(
    num_partitions: int, *, shuffle: bool, seed: int, epoch: int
) -> NDArray[np.int64]:
    """The order partitions are visited in this epoch.

    Examples:
        >>> partition_order(4, shuffle=False, seed=0, epoch=0).tolist()
        [0, 1, 2, 3]
        >>> sorted(partition_order(4, shuffle=True, seed=0, epoch=1).tolist())
        [0, 1, 2, 3]
    """
    if not shuffle:
        return np.arange(num_partitions, dtype=np.int64)
    rng = np.random.default_rng(np.random.SeedSequence([seed, epoch, _ORDER_STREAM]))
    return rng.permutation(num_partitions).astype(np.int64)


def rank_rows(total_rows: int, *, global_rank: int, global_size: int) -> tuple[int, int]:
    """Row range ``[lo, hi)`` of the epoch's row sequence owned by one rank.

    Every rank gets ``total_rows // global_size`` rows; the last ``total_rows % global_size``
    rows of the sequence are left out of this epoch.

    Examples:
        >>> [rank_rows(10, global_rank=r, global_size=3) for r in range(3)]
        [(0, 3), (3, 6), (6, 9)]
    """
    per_rank = total_rows // global_size
    return global_rank * per_rank, (global_rank + 1) * per_rank


def worker_row_range(
    rows: int, *, batch_size: int, drop_last: bool, worker: int, num_workers: int
) -> tuple[int, int]:
    """Row range ``[lo, hi)``, relative to the rank's rows, read by one worker.

    Workers receive contiguous runs of whole batches; the rank's short last batch (if
    any, and if kept) belongs to the last worker with batches.

    Examples:
        >>> [worker_row_range(10, batch_size=4, drop_last=False, worker=w, num_workers=2)
        ...  for w in range(2)]
        [(0, 4), (4, 10)]
    """
    batches = count_batches(rows, batch_size, drop_last=drop_last)
    usable = min(rows, batches * batch_size)
    first = worker * batches // num_workers
    last = (worker + 1) * batches // num_workers
    return min(first * batch_size, usable), min(last * batch_size, usable)


def chunk_offsets(
    piece_rows: NDArray[np.int64],
    *,
    parts_per_chunk: int | None = None,
    chunk_rows: int | None = None,
) -> NDArray[np.int64]:
    """Boundaries (indices into the pieces) of the chunks the pieces are grouped into.

    With ``parts_per_chunk`` every chunk holds that many pieces (the last one fewer);
    with ``chunk_rows`` pieces are added to a chunk as long as it holds at most that
    many rows, so that ``chunk_rows`` bounds a chunk's memory (a piece larger than that
    is a chunk of its own). Exactly one of the two must be given.

    Examples:
        >>> chunk_offsets(np.array([5, 5, 5]), parts_per_chunk=2).tolist()
        [0, 2, 3]
        >>> chunk_offsets(np.array([3, 3, 3, 2, 9, 1]), chunk_rows=6).tolist()
        [0, 2, 4, 5, 6]
    """
    n = len(piece_rows)
    if (parts_per_chunk is None) == (chunk_rows is None):
        raise ValueError("give exactly one of parts_per_chunk and chunk_rows")
    if parts_per_chunk is not None:
        return np.append(np.arange(0, n, parts_per_chunk, dtype=np.int64), np.int64(n))
    assert chunk_rows is not None
    bounds = [0]
    filled = 0
    for i, rows in enumerate(piece_rows.tolist()):
        if filled and filled + rows > chunk_rows:
            bounds.append(i)
            filled = 0
        filled += rows
    if bounds[-1] != n:
        bounds.append(n)
    return np.asarray(bounds, dtype=np.int64)


Window = tuple[tuple[int, int], ...]
"""Ranges ``[lo, hi)`` of a chunk's delivery order (see `EpochPlan.windows`)."""


@dataclass(frozen=True)
class EpochPlan:
    """What one rank's worker reads in one epoch.

    Attributes:
        partitions: Partition index of every piece, in read order.
        starts: First row (within its partition) of every piece.
        stops: One past the last row of every piece.
        chunk_bounds: Piece indices where chunks start, plus the number of pieces.
        num_rows: Rows this worker delivers.
        num_batches: Batches this worker delivers.
        batch_size: Rows per batch.
        shuffle_within_batch: Whether a shuffled batch's rows come in random order
            (otherwise in stored order).
        shuffle, seed, epoch: Whether chunks are permuted, and the epoch's part of their
            permutations' keys.
        origins: ``[num_chunks, 4]``: where each chunk comes from: the ``(rank, worker,
            chunk)`` of the worker stream it belongs to, which key its permutation, and
            the rows of that stream before it, where its batches were cut for
            ``shuffle_within_batch=False``. A resumed plan's chunks keep their own.
        windows: For a shuffled chunk whose rows this plan delivers only some of (a
            resume), the ranges of its full delivery order it delivers, by chunk; every
            other chunk is delivered whole. An unshuffled chunk's pieces are cut to its
            rows instead.
        rows_skipped: Rows of the worker's stream delivered before this plan's first row
            (a resumed plan's): batches are cut where the whole stream is cut.
    """

    partitions: NDArray[np.int64]
    starts: NDArray[np.int64]
    stops: NDArray[np.int64]
    chunk_bounds: NDArray[np.int64]
    num_rows: int
    num_batches: int
    batch_size: int
    shuffle_within_batch: bool
    shuffle: bool
    seed: int
    epoch: int
    origins: NDArray[np.int64]
    windows: Mapping[int, Window] = field(default_factory=dict)
    rows_skipped: int = 0

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_bounds) - 1

    def chunk_pieces(self, chunk: int) -> slice:
        """The slice of pieces that make up chunk ``chunk``."""
        return slice(int(self.chunk_bounds[chunk]), int(self.chunk_bounds[chunk + 1]))

    def pieces(self, chunk: int) -> list[tuple[int, int, int]]:
        """``(partition, first row, stop row)`` of every piece of chunk ``chunk``."""
        s = self.chunk_pieces(chunk)
        return list(
            zip(
                self.partitions[s].tolist(),
                self.starts[s].tolist(),
                self.stops[s].tolist(),
                strict=True,
            )
        )

    def stored_rows(self, chunk: int) -> int:
        """Rows of chunk ``chunk``'s pieces: what is read for it."""
        s = self.chunk_pieces(chunk)
        return int((self.stops[s] - self.starts[s]).sum())

    def chunk_rows(self, chunk: int) -> int:
        """Rows chunk ``chunk`` delivers (its `stored_rows`, or those of its window)."""
        window = self.windows.get(chunk)
        if window is None:
            return self.stored_rows(chunk)
        return sum(hi - lo for lo, hi in window)

    def rows_before(self, chunk: int) -> int:
        """Rows of this worker's stream delivered before chunk ``chunk``'s first."""
        return self.rows_skipped + int(self._delivered_ends[chunk])

    @cached_property
    def _delivered_ends(self) -> NDArray[np.int64]:
        """Rows delivered before each chunk, and in all (``num_chunks + 1`` values)."""
        rows = [self.chunk_rows(c) for c in range(self.num_chunks)]
        return np.concatenate([[0], np.cumsum(rows, dtype=np.int64)]).astype(np.int64)

    def batch_bounds(self, chunk: int) -> NDArray[np.int64]:
        """Where batches start and end within the rows chunk ``chunk`` delivers.

        The first and last windows may be parts of batches shared with the chunks around.
        """
        rows = self.chunk_rows(chunk)
        first = -self.rows_before(chunk) % self.batch_size
        inner = np.arange(first, rows, self.batch_size, dtype=np.int64)
        return np.unique(np.concatenate([[0], inner, [rows]]))

    def chunk_key(self, chunk: int) -> list[int]:
        """The round keys of chunk ``chunk``'s permutation."""
        rank, worker, index, _ = (int(k) for k in self.origins[chunk])
        return chunk_keys(seed=self.seed, epoch=self.epoch, rank=rank, worker=worker, chunk=index)

    def batch_order(self, chunk: int, *, xp: Any = np) -> Any:
        """The rows of chunk ``chunk`` in the order it delivers them (indices into its
        `stored_rows`), or None without shuffling.

        A random permutation, computed with ``xp`` (numpy, or cupy on a GPU: the same
        order); with ``shuffle_within_batch=False``, the rows dealt into the batches of
        the chunk's stream (see `origins`) and kept in stored order within each (see
        [`deal_into_batches`][tabloader.permutation.deal_into_batches]), computed on the host.
        A plan that delivers part of the chunk delivers that part of this order (its
        `windows`).
        """
        if not self.shuffle:
            return None
        rows, key = self.stored_rows(chunk), self.chunk_key(chunk)
        if self.shuffle_within_batch:
            return self._window(chunk, counter_permutation(rows, key, xp=xp), xp)
        dealt = deal_into_batches(
            inverse_permutation(counter_permutation(rows, key)),
            batch_size=self.batch_size,
            rows_before=int(self.origins[chunk, 3]),
        )
        dealt = self._window(chunk, dealt, np)
        return dealt if xp is np else xp.asarray(dealt)

    def batch_orders(self, *, xp: Any = np) -> Iterator[Any]:
        """`batch_order` of each chunk in turn, the same orders; on a GPU, the
        permutations of several chunks are drawn in one pass (see ``counter_permutations``
        in this module)."""
        if not (self.shuffle and self.shuffle_within_batch):
            for chunk in range(self.num_chunks):
                yield self.batch_order(chunk, xp=xp)
            return
        chunks = range(self.num_chunks)
        sizes, keys = [self.stored_rows(c) for c in chunks], [self.chunk_key(c) for c in chunks]
        for chunk, order in zip(chunks, counter_permutations(sizes, keys, xp=xp), strict=True):
            yield self._window(chunk, order, xp)

    def _window(self, chunk: int, order: Any, xp: Any) -> Any:
        """The part of chunk ``chunk``'s full delivery ``order`` this plan delivers."""
        window = self.windows.get(chunk)
        if window is None:
            return order
        if len(window) == 1:
            return order[window[0][0] : window[0][1]]
        return xp.concatenate([order[lo:hi] for lo, hi in window])

    def resume(self, batches_done: int) -> EpochPlan:
        """The rest of this plan once ``batches_done`` of its batches were delivered.

        Chunks wholly before the resume point are left out (never read); the chunk
        holding it keeps its permutation and delivers the rest of its order (its
        `windows`, or its pieces cut when unshuffled). The batches the resumed plan
        yields are exactly this plan's batches from ``batches_done`` on.

        Examples:
            >>> plan = plan_epoch(np.array([5, 5, 5]), batch_size=4, shuffle=True, seed=0,
            ...                   epoch=0, parts_per_chunk=1)
            >>> rest = plan.resume(2)
            >>> rest.num_chunks, rest.origins[:, 2].tolist(), dict(rest.windows), rest.num_batches
            (2, [1, 2], {0: ((3, 5),)}, 2)
        """
        if not 0 <= batches_done <= self.num_batches:
            raise ValueError(f"batches_done must be in [0, {self.num_batches}], got {batches_done}")
        if batches_done == 0:
            return self
        rest = self.after_rows(batches_done * self.batch_size)
        return replace(rest, num_batches=self.num_batches - batches_done)

    def after_rows(self, rows: int) -> EpochPlan:
        """The rest of this plan after the first ``rows`` rows it delivers (all of them
        when ``rows`` is larger): the chunks from the one holding the next row on, that
        one cut to the rest of its rows.

        Examples:
            >>> plan = plan_epoch(np.array([5, 5, 5]), batch_size=4, shuffle=False, seed=0,
            ...                   epoch=0, parts_per_chunk=1)
            >>> rest = plan.after_rows(7)
            >>> rest.pieces(0), rest.num_chunks, rest.num_rows, rest.rows_before(0)
            ([(1, 2, 5)], 2, 8, 7)
        """
        rows = min(max(int(rows), 0), self.num_rows)
        rest = skip_rows(stream_runs(self), rows)
        return plan_of_runs(
            rest,
            self,
            num_rows=self.num_rows - rows,
            num_batches=self.num_batches - rows // self.batch_size,
            rows_skipped=self.rows_skipped + rows,
        )


@dataclass(frozen=True, eq=False)
class Run:
    """Rows ``[lo, hi)`` of chunk ``chunk`` of ``plan``: positions in its full delivery
    order when shuffled, in its pieces' rows when not. A stream of a resumed epoch is a
    list of runs of the epoch's own plans."""

    plan: EpochPlan
    chunk: int
    lo: int
    hi: int


def stream_runs(plan: EpochPlan) -> list[Run]:
    """The stream ``plan`` delivers, as runs of its chunks."""
    runs = []
    for chunk in range(plan.num_chunks):
        for lo, hi in plan.windows.get(chunk, ((0, plan.stored_rows(chunk)),)):
            if hi > lo:
                runs.append(Run(plan, chunk, lo, hi))
    return runs


def skip_rows(runs: Sequence[Run], rows: int) -> list[Run]:
    """``runs`` without their first ``rows`` rows."""
    out = []
    for run in runs:
        if rows >= run.hi - run.lo:
            rows -= run.hi - run.lo
            continue
        out.append(replace(run, lo=run.lo + rows) if rows else run)
        rows = 0
    return out


def first_rows(runs: Sequence[Run], rows: int) -> list[Run]:
    """The first ``rows`` rows of ``runs``."""
    out = []
    for run in runs:
        if rows <= 0:
            break
        out.append(run if run.hi - run.lo <= rows else replace(run, hi=run.lo + rows))
        rows -= run.hi - run.lo
    return out


def plan_of_runs(
    runs: Sequence[Run], like: EpochPlan, *, num_rows: int, num_batches: int, rows_skipped: int
) -> EpochPlan:
    """The plan that delivers ``runs`` in turn, its options ``like``'s.

    Consecutive runs of one chunk make one chunk of the plan, read once: a shuffled one
    with its pieces and permutation key, delivering the runs' ranges of its order (its
    `EpochPlan.windows`); an unshuffled one with its pieces cut to the runs' rows.
    """
    groups: list[tuple[Run, list[tuple[int, int]]]] = []
    for run in runs:
        if groups and groups[-1][0].plan is run.plan and groups[-1][0].chunk == run.chunk:
            ranges = groups[-1][1]
            if ranges[-1][1] == run.lo:
                ranges[-1] = (ranges[-1][0], run.hi)
            else:
                ranges.append((run.lo, run.hi))
        else:
            groups.append((run, [(run.lo, run.hi)]))
    pieces: list[tuple[int, int, int]] = []
    bounds, origins, windows = [0], [], {}
    for index, (run, ranges) in enumerate(groups):
        chunk_pieces = run.plan.pieces(run.chunk)
        if not like.shuffle:
            chunk_pieces = cut_pieces(chunk_pieces, ranges)
        elif ranges != [(0, run.plan.stored_rows(run.chunk))]:
            windows[index] = tuple(ranges)
        pieces += chunk_pieces
        bounds.append(len(pieces))
        origins.append(run.plan.origins[run.chunk])
    columns = np.array(pieces, dtype=np.int64).reshape(-1, 3).T
    return replace(
        like,
        partitions=columns[0].copy(),
        starts=columns[1].copy(),
        stops=columns[2].copy(),
        chunk_bounds=np.array(bounds, dtype=np.int64),
        origins=np.array(origins, dtype=np.int64).reshape(-1, 4),
        windows=windows,
        num_rows=num_rows,
        num_batches=num_batches,
        rows_skipped=rows_skipped,
    )


def cut_pieces(
    pieces: Sequence[tuple[int, int, int]], ranges: Sequence[tuple[int, int]]
) -> list[tuple[int, int, int]]:
    """The parts of ``pieces`` (rows laid end to end) holding rows ``ranges``, in order.

    Examples:
        >>> cut_pieces([(4, 0, 5), (2, 10, 13)], [(3, 6), (7, 8)])
        [(4, 3, 5), (2, 10, 11), (2, 12, 13)]
    """
    out = []
    for lo, hi in ranges:
        begin = 0
        for partition, start, stop in pieces:
            a, b = max(lo - begin, 0), min(hi - begin, stop - start)
            if b > a:
                out.append((partition, start + a, start + b))
            begin += stop - start
    return out


def plan_epoch(
    partition_rows: NDArray[np.int64],
    *,
    batch_size: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    global_rank: int = 0,
    global_size: int = 1,
    worker: int = 0,
    num_workers: int = 1,
    parts_per_chunk: int | None = None,
    chunk_rows: int | None = None,
    drop_last: bool = False,
    shuffle_within_batch: bool = True,
) -> EpochPlan:
    """Plan one epoch of one rank's worker (see the module docstring for the policy).

    Examples:
        >>> plan = plan_epoch(np.array([4, 4, 4]), batch_size=5, shuffle=False, seed=0, epoch=0,
        ...                   global_rank=1, global_size=2, parts_per_chunk=1)
        >>> plan.partitions.tolist(), plan.starts.tolist(), plan.stops.tolist(), plan.num_batches
        ([1, 2], [2, 0], [4, 4], 2)
    """
    rows = np.asarray(partition_rows, dtype=np.int64)
    order = partition_order(len(rows), shuffle=shuffle, seed=seed, epoch=epoch)
    ordered_rows = rows[order]
    ends = np.cumsum(ordered_rows)
    begins = ends - ordered_rows
    total = int(ends[-1]) if len(ends) else 0

    rank_lo, rank_hi = rank_rows(total, global_rank=global_rank, global_size=global_size)
    lo, hi = worker_row_range(
        rank_hi - rank_lo,
        batch_size=batch_size,
        drop_last=drop_last,
        worker=worker,
        num_workers=num_workers,
    )
    lo, hi = rank_lo + lo, rank_lo + hi

    partitions, starts, stops = _clip(order, begins, ends, lo, hi)
    piece_rows = stops - starts

    if parts_per_chunk is None and chunk_rows is None:
        parts_per_chunk = 1
    bounds = chunk_offsets(piece_rows, parts_per_chunk=parts_per_chunk, chunk_rows=chunk_rows)
    if shuffle:
        # Rows are permuted inside each chunk anyway: read its pieces in dataset order,
        # which keeps row groups of one file together.
        for c in range(len(bounds) - 1):
            s = slice(int(bounds[c]), int(bounds[c + 1]))
            by_partition = np.argsort(partitions[s], kind="stable")
            partitions[s] = partitions[s][by_partition]
            starts[s] = starts[s][by_partition]
            stops[s] = stops[s][by_partition]

    return EpochPlan(
        partitions=partitions.astype(np.int64),
        starts=starts.astype(np.int64),
        stops=stops.astype(np.int64),
        chunk_bounds=bounds,
        num_rows=hi - lo,
        num_batches=count_batches(hi - lo, batch_size, drop_last=drop_last),
        batch_size=batch_size,
        shuffle_within_batch=shuffle_within_batch,
        shuffle=shuffle,
        seed=seed,
        epoch=epoch,
        origins=_stream_origins(global_rank, worker, piece_rows, bounds),
    )


def _stream_origins(
    rank: int, worker: int, piece_rows: NDArray[np.int64], bounds: NDArray[np.int64]
) -> NDArray[np.int64]:
    """The `EpochPlan.origins` of a worker stream's chunks (``bounds`` into its pieces)."""
    chunks = len(bounds) - 1
    origins = np.empty((chunks, 4), dtype=np.int64)
    origins[:, 0], origins[:, 1], origins[:, 2] = rank, worker, np.arange(chunks)
    origins[:, 3] = np.concatenate([[0], np.cumsum(piece_rows)])[bounds[:-1]]
    return origins


def fixed_share(
    partition_rows: NDArray[np.int64], *, global_rank: int, global_size: int
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """One rank's fixed share of the dataset: ``(partitions, starts, stops)`` in stored order.

    The share is rows ``[r*N//W, (r+1)*N//W)`` of the dataset in stored order (the
    unshuffled epoch's shard), the same every epoch: what a rank's decoded cache holds.

    Examples:
        >>> [p.tolist() for p in fixed_share(np.array([4, 4, 4]), global_rank=1, global_size=2)]
        [[1, 2], [2, 0], [4, 4]]
    """
    rows = np.asarray(partition_rows, dtype=np.int64)
    ends = np.cumsum(rows)
    begins = ends - rows
    lo, hi = rank_rows(
        int(ends[-1]) if len(ends) else 0, global_rank=global_rank, global_size=global_size
    )
    return _clip(np.arange(len(rows), dtype=np.int64), begins, ends, lo, hi)


def _clip(
    order: NDArray[np.int64],
    begins: NDArray[np.int64],
    ends: NDArray[np.int64],
    lo: int,
    hi: int,
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """``(partitions, starts, stops)`` of the pieces of rows ``[lo, hi)``.

    ``order[i]`` is the partition holding rows ``[begins[i], ends[i])`` of the sequence;
    each overlapping partition is clipped to the range, and empty ones are left out.
    """
    first = int(np.searchsorted(ends, lo, side="right"))
    last = int(np.searchsorted(begins, hi, side="left"))
    positions = np.arange(first, last) if hi > lo else np.arange(0)
    starts = np.maximum(begins[positions], lo) - begins[positions]
    stops = np.minimum(ends[positions], hi) - begins[positions]
    keep = stops > starts  # empty partitions contribute nothing
    return order[positions][keep], starts[keep], stops[keep]


def plan_cached_epoch(
    partition_rows: NDArray[np.int64],
    *,
    shuffle: bool | Literal["global"],
    global_rank: int = 0,
    global_size: int = 1,
    parts_per_chunk: int | None = None,
    chunk_rows: int | None = None,
    **options: Any,
) -> EpochPlan:
    """Plan one epoch of a loader with a decoded cache: every rank keeps a fixed share.

    The other keywords (``batch_size``, ``seed``, ``epoch``, ``worker``, ...) are
    [`plan_epoch`][tabloader.plan.plan_epoch]'s.

    A cache holds one rank's rows, so with a cache a rank's rows must not change from
    epoch to epoch. Each rank owns its [`fixed_share`][tabloader.plan.fixed_share] (``N // W`` rows,
    so batch counts stay equal) and shuffling permutes within it: the share's pieces play the
    role of the partitions in [`plan_epoch`][tabloader.plan.plan_epoch] (visited in a new order
    every epoch, grouped into chunks, rows permuted within each chunk). ``shuffle="global"`` makes
    the worker's whole range one chunk, so its rows are permuted all together. With
    one rank (or without shuffling) the plan is exactly [`plan_epoch`][tabloader.plan.plan_epoch]'s.

    The plan names real partitions and rows, so it can be streamed from the files (the
    epoch that fills the cache) or served from the cache.

    Examples:
        >>> rows = np.array([4, 4, 4])
        >>> plan = plan_cached_epoch(rows, batch_size=2, shuffle=True, seed=0, epoch=3,
        ...                          global_rank=1, global_size=2, parts_per_chunk=1)
        >>> sorted((p, a, b) for p, a, b in zip(plan.partitions.tolist(),
        ...        plan.starts.tolist(), plan.stops.tolist()))
        [(1, 2, 4), (2, 0, 4)]
    """
    parts, starts, stops = fixed_share(
        partition_rows, global_rank=global_rank, global_size=global_size
    )
    share_rows = stops - starts
    if shuffle == "global":
        parts_per_chunk, chunk_rows = None, max(int(share_rows.sum()), 1)
    sub = plan_epoch(
        share_rows,
        shuffle=bool(shuffle),
        parts_per_chunk=parts_per_chunk,
        chunk_rows=chunk_rows,
        **options,
    )
    pieces = sub.partitions
    origins = sub.origins.copy()
    origins[:, 0] = global_rank  # each rank's permutations its own, as when streaming
    return replace(
        sub,
        partitions=parts[pieces],
        starts=starts[pieces] + sub.starts,
        stops=starts[pieces] + sub.stops,
        origins=origins,
    )
