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
   on another: [`plan_rest`][tabloader.plan.plan_rest] deals the rows no old worker
   delivered to the new ranks and workers as a fresh epoch's rows are dealt, each chunk
   keeping its permutation, and each new worker reading only the chunks holding its rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "EpochPlan",
    "Leg",
    "Planner",
    "chunk_offsets",
    "chunk_permutation",
    "counter_permutation",
    "count_batches",
    "deal_into_batches",
    "inverse_permutation",
    "fixed_share",
    "partition_order",
    "plan_cached_epoch",
    "plan_epoch",
    "plan_rest",
    "rank_rows",
    "round_robin",
    "worker_row_range",
]

DEFAULT_CHUNK_BYTES = 128 * 2**20
"""Decoded bytes per chunk when neither ``parts_per_chunk`` nor ``chunk_rows`` is given
(and per window of a cache's chunk served on a GPU)."""

_ORDER_STREAM = 0
_CHUNK_STREAM = 1


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


def chunk_permutation(
    num_rows: int, *, seed: int, epoch: int, rank: int, worker: int, chunk: int, xp: Any = np
) -> Any:
    """A random order of one chunk's rows: identical on every machine, and with numpy or
    cupy (``xp``), for the same key (see
    [`counter_permutation`][tabloader.plan.counter_permutation]).

    Examples:
        >>> order = chunk_permutation(10, seed=0, epoch=0, rank=0, worker=0, chunk=0)
        >>> sorted(order.tolist()) == list(range(10)), order.dtype
        (True, dtype('int64'))
    """
    keys = chunk_keys(seed=seed, epoch=epoch, rank=rank, worker=worker, chunk=chunk)
    return counter_permutation(num_rows, keys, xp=xp)


def chunk_keys(*, seed: int, epoch: int, rank: int, worker: int, chunk: int) -> list[int]:
    """The round keys of one chunk's permutation (see
    [`chunk_permutation`][tabloader.plan.chunk_permutation])."""
    key = [seed, epoch, _CHUNK_STREAM, rank, worker, chunk]
    keys = np.random.SeedSequence(key).generate_state(FEISTEL_ROUNDS, dtype=np.uint64)
    return [int(k) for k in keys]


FEISTEL_ROUNDS = 4
"""Rounds of the Feistel network of
[`counter_permutation`][tabloader.plan.counter_permutation]."""
_MUL_32 = (0x9E3779B1, 0x85EBCA6B)  # odd 32-bit multipliers (golden ratio; murmur3's fmix32)
_MUL_64 = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9)  # their 64-bit counterparts (splitmix64)
_HOST_BLOCK = 1 << 16  # positions numpy maps at a time: 256 KiB temporaries, in cache
_DEVICE_BLOCK = 1 << 24  # positions a GPU maps at a time: one pass for a chunk
_GROUP_POSITIONS = 1 << 22  # positions of chunks a GPU permutes in one pass, at most: about
# 36 bytes each while drawn (150 MiB), as much as one chunk of 4M rows takes alone


def counter_permutation(
    num_rows: int,
    keys: Sequence[int],
    *,
    xp: Any = np,
    block: int | None = None,
    compact: Literal["mask", "scatter"] | None = None,
) -> Any:
    """A keyed pseudo-random permutation of ``range(num_rows)``, computed the same by
    numpy on a CPU and cupy on a GPU.

    The positions of the smallest domain of an even number of bits that holds
    ``num_rows`` go through a balanced Feistel network (a bijection of that domain; one
    round per key, a multiply-xorshift hash of the right half and the round's key as its
    round function); the images below ``num_rows``, in the order of the positions that
    gave them, are the permutation. The domain is at most four times ``num_rows`` and is
    mapped ``block`` positions at a time, so a GPU draws a chunk's order in a handful of
    kernels (the network one fused kernel) with no loop whose length depends on the
    data (walking each position's cycle until it lands inside took a round of kernels
    and a wait per step, about ``log2(num_rows)`` of them). By default numpy maps
    `_HOST_BLOCK` positions at a time, whose temporaries stay in the CPU's cache (about
    twice as fast as one pass), and any other ``xp`` up to `_DEVICE_BLOCK` in one pass.

    ``compact`` says how the images kept are gathered: ``"mask"`` selects them with a
    boolean mask (``numpy.compress``), for which the host learns each block's count (the
    fastest on a CPU);
    ``"scatter"`` writes each to its place, found by a prefix sum on the device, so the
    host never waits for the device. By default numpy masks and any other ``xp``
    scatters; the permutation is the same.

    Examples:
        >>> order = counter_permutation(10, [1, 2, 3, 4])
        >>> sorted(order.tolist()) == list(range(10)), order.tolist() != list(range(10))
        (True, True)
        >>> counter_permutation(10, [1, 2, 3, 4], block=3).tolist() == order.tolist()
        True
        >>> again = counter_permutation(10, [1, 2, 3, 4], block=3, compact="scatter")
        >>> again.tolist() == order.tolist()
        True
    """
    if compact not in (None, "mask", "scatter"):
        raise ValueError(f"compact must be 'mask' or 'scatter', got {compact!r}")
    n = int(num_rows)
    if n <= 1:
        return xp.arange(n, dtype=np.int64)
    if block is None:
        block = _HOST_BLOCK if xp is np else _DEVICE_BLOCK
    if block < 1:
        raise ValueError(f"block must be at least 1, got {block}")
    bits = _domain_bits(n)
    kind = np.uint64 if bits > 32 else np.uint32
    round_keys = [kind(int(k) & ((1 << (8 * kind().itemsize)) - 1)) for k in keys]
    domain = 1 << bits
    scatter = (xp is not np) if compact is None else compact == "scatter"
    out = xp.empty(n + 1 if scatter else n, dtype=np.int64)  # n + 1: the slot for the rest
    filled: Any = 0  # images kept so far (a device scalar when scattering)
    for start in range(0, domain, block):
        stop = min(start + block, domain)
        positions = xp.arange(start, stop, dtype=kind)
        images = _network(positions, bits // 2, round_keys, xp)
        inside = images <= _last_row(n, kind)
        if scatter:
            places = xp.cumsum(inside, dtype=np.int64)
            if stop < domain:  # the count so far, for the next block's places
                later = filled + places[-1]
            xp.add(places, filled - 1, out=places)
            out[xp.where(inside, places, n)] = images
            if stop < domain:
                filled = later
        else:
            # compress, not images[inside]: numpy's boolean indexing branches on every
            # element, and took half of the permutation's time (docs/performance.md)
            kept = np.compress(inside, images)
            out[filled : filled + len(kept)] = kept
            filled += len(kept)
    if scatter:
        return out[:n]
    return out


def counter_permutations(
    sizes: Sequence[int],
    keys: Sequence[Sequence[int]],
    *,
    xp: Any = np,
    positions: int = _GROUP_POSITIONS,
) -> Iterator[Any]:
    """``counter_permutation(sizes[i], keys[i], xp=xp)`` for each ``i`` in turn, the same
    permutations; on a GPU, drawn for several chunks in one pass.

    Consecutive chunks whose domains have the same number of bits (every chunk of an
    epoch but perhaps its last), ``positions`` positions of them at most, go through the
    network together: each position's chunk is its high bits, its round keys and its
    chunk's size are looked up by it, and one prefix sum places the images kept of all
    of them, chunk after chunk. A chunk's order then costs a share of a dozen kernels
    rather than a handful of its own (each kernel launch a call that lets the GIL go and
    waits to take it back, while the loader's other threads run). The orders of a group
    are views of one array; a group is drawn when its first order is asked for. numpy
    draws each on its own (its temporaries stay in the CPU's cache that way).

    Examples:
        >>> orders = list(counter_permutations([5, 6, 3], [[1, 2], [3, 4], [5, 6]]))
        >>> [o.tolist() == counter_permutation(n, k).tolist()
        ...  for o, n, k in zip(orders, [5, 6, 3], [[1, 2], [3, 4], [5, 6]])]
        [True, True, True]
    """
    if len(sizes) != len(keys):
        raise ValueError(f"{len(sizes)} sizes but {len(keys)} key lists")
    if xp is np:
        for n, k in zip(sizes, keys, strict=True):
            yield counter_permutation(n, k)
        return
    i = 0
    while i < len(sizes):
        bits = _domain_bits(sizes[i])
        group = 1
        while (
            i + group < len(sizes)
            and sizes[i] > 1
            and sizes[i + group] > 1
            and bits <= 32
            and _domain_bits(sizes[i + group]) == bits
            and len(keys[i + group]) == len(keys[i])
            and (group + 1) << bits <= positions
        ):
            group += 1
        if group == 1:
            yield counter_permutation(sizes[i], keys[i], xp=xp)
        else:
            yield from _grouped_permutations(sizes[i : i + group], keys[i : i + group], bits, xp)
        i += group


def _last_row(num_rows: int, kind: Any) -> Any:
    """The last row of a permutation of ``num_rows`` rows, in the positions' type: images up
    to it are kept. (``num_rows`` itself may not fit: a chunk of 2**32 rows has 32-bit
    positions.)

    Examples:
        >>> int(_last_row(2**32, np.uint32)), int(_last_row(10, np.uint32))
        (4294967295, 9)
    """
    return kind(int(num_rows) - 1)


def _domain_bits(num_rows: int) -> int:
    """Bits of the smallest domain of an even number of bits holding ``num_rows``."""
    bits = max(2, (int(num_rows) - 1).bit_length())
    return bits + (bits & 1)


def _network(x: Any, half: int, keys: Sequence[Any], xp: Any) -> Any:
    """The balanced Feistel network's images of the positions ``x`` (their halves of
    ``half`` bits), one round per key in ``keys``: each a scalar of ``x``'s dtype, or an
    array of one key per position. The round function is a multiply-xorshift hash of the
    right half and the key: murmur3's fmix32 constants for 32-bit positions, splitmix64's
    for 64-bit ones.

    Elementwise arithmetic only (`_feistel`), so a GPU runs the whole network as one
    fused kernel (``cupy.fuse``): one launch and one pass over the positions instead of
    six of each a round, the launches being what costs (each lets the GIL go and waits
    to take it back while the loader's other threads run). numpy runs the same
    function, operation by operation.
    """
    kind = x.dtype.type
    width = 8 * x.dtype.itemsize
    mul1, mul2 = _MUL_64 if width == 64 else _MUL_32
    constants = (kind(half), kind((1 << half) - 1), kind(mul1), kind(mul2))
    shifts = (kind(width // 2), kind(width // 2 - 3))
    network = _feistel if xp is np else _fused(xp)
    with np.errstate(over="ignore"):  # the multiplications wrap around, by design
        return network(x, *constants, *shifts, *keys)


def _feistel(
    x: Any, half: Any, mask: Any, mul1: Any, mul2: Any, shift1: Any, shift2: Any, *keys: Any
) -> Any:
    """`_network`'s arithmetic, every operand of ``x``'s dtype (see `_network`)."""
    left, right = x >> half, x & mask  # new arrays: the operations below write into them
    for key in keys:
        t = right ^ key
        t *= mul1
        t ^= t >> shift1
        t *= mul2
        t ^= t >> shift2
        t &= mask
        left ^= t
        left, right = right, left
    left <<= half
    left |= right
    return left


_FUSED: dict[Any, Callable[..., Any]] = {}
"""`_feistel` fused by each array module that fuses (``cupy``), made once per module
object: the fused function caches its kernels by its arguments' types."""


def _fused(xp: Any) -> Callable[..., Any]:
    fused = _FUSED.get(xp)
    if fused is None:
        fused = _FUSED[xp] = xp.fuse(kernel_name="tabloader_feistel")(_feistel)
    return fused


def _grouped_permutations(
    sizes: Sequence[int], keys: Sequence[Sequence[int]], bits: int, xp: Any
) -> list[Any]:
    """The permutations of chunks whose domains have ``bits`` bits (at most 32), in one
    pass over all their positions (see `counter_permutations`)."""
    kind = np.uint32
    table = xp.asarray(  # each round's key of each chunk, [round, chunk], copied in once
        np.array([[int(k) & 0xFFFFFFFF for k in ks] for ks in keys], dtype=kind).T.copy()
    )
    x = xp.arange(len(sizes) << bits, dtype=kind)
    chunk = xp.right_shift(x, kind(bits))  # each position's chunk
    xp.bitwise_and(x, kind((1 << bits) - 1), out=x)  # its position in its chunk's domain

    # each position's key of each round, looked up before the network (a fused kernel
    # gathers nothing)
    by_position = xp.take(table, chunk, axis=1)  # [round, position], one gather
    images = _network(x, bits // 2, [by_position[r] for r in range(len(keys[0]))], xp)
    del x, by_position
    last = np.array([_last_row(n, kind) for n in sizes], dtype=kind)
    inside = images <= xp.take(xp.asarray(last), chunk)
    places = xp.cumsum(inside, dtype=np.int64)
    total = int(sum(sizes))
    xp.add(places, -1, out=places)
    out = xp.empty(total + 1, dtype=np.int64)  # total + 1: the slot for the rest
    out[xp.where(inside, places, total)] = images
    bounds = np.cumsum([0, *sizes]).tolist()
    return [out[a:b] for a, b in pairwise(bounds)]


def inverse_permutation(permutation: NDArray[np.int64]) -> NDArray[np.int64]:
    """The permutation that undoes ``permutation``.

    Examples:
        >>> inverse_permutation(np.array([2, 0, 1])).tolist()
        [1, 2, 0]
    """
    inverse = np.empty_like(permutation)
    inverse[permutation] = np.arange(len(permutation))
    return inverse


def deal_into_batches(
    places: NDArray[np.int64], *, batch_size: int, rows_before: int
) -> NDArray[np.int64]:
    """Delivery order of a chunk whose row ``i`` has place ``places[i]`` in its stream.

    Batches are cut every ``batch_size`` rows of the worker's whole stream, which has
    ``rows_before`` rows before this chunk. Each batch gets the rows whose places fall
    in it, in stored order. Returns the chunk's row indices in delivery order.

    Examples:
        >>> places = np.array([3, 0, 2, 1])  # row 0 goes to place 3, row 1 to place 0, ...
        >>> deal_into_batches(places, batch_size=2, rows_before=0).tolist()  # [1 3] [0 2]
        [1, 3, 0, 2]
        >>> deal_into_batches(places, batch_size=2, rows_before=1).tolist()  # [1] [2 3] [0]
        [1, 2, 3, 0]
    """
    batch = (places + rows_before % batch_size) // batch_size
    if len(batch) and batch.max() <= np.iinfo(np.uint16).max:
        batch = batch.astype(np.uint16)  # numpy sorts 16-bit keys by radix, in linear time
    return np.argsort(batch, kind="stable").astype(np.int64)


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
        [`deal_into_batches`][tabloader.plan.deal_into_batches]), computed on the host.
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
        rest = _skip_rows(_plan_runs(self), rows)
        return _plan_of_runs(
            rest,
            self,
            num_rows=self.num_rows - rows,
            num_batches=self.num_batches - rows // self.batch_size,
            rows_skipped=self.rows_skipped + rows,
        )


@dataclass(frozen=True, eq=False)
class _Run:
    """Rows ``[lo, hi)`` of chunk ``chunk`` of ``plan``: positions in its full delivery
    order when shuffled, in its pieces' rows when not. A stream of a resumed epoch is a
    list of runs of the epoch's own plans."""

    plan: EpochPlan
    chunk: int
    lo: int
    hi: int


def _plan_runs(plan: EpochPlan) -> list[_Run]:
    """The stream ``plan`` delivers, as runs of its chunks."""
    runs = []
    for chunk in range(plan.num_chunks):
        for lo, hi in plan.windows.get(chunk, ((0, plan.stored_rows(chunk)),)):
            if hi > lo:
                runs.append(_Run(plan, chunk, lo, hi))
    return runs


def _skip_rows(runs: Sequence[_Run], rows: int) -> list[_Run]:
    """``runs`` without their first ``rows`` rows."""
    out = []
    for run in runs:
        if rows >= run.hi - run.lo:
            rows -= run.hi - run.lo
            continue
        out.append(replace(run, lo=run.lo + rows) if rows else run)
        rows = 0
    return out


def _first_rows(runs: Sequence[_Run], rows: int) -> list[_Run]:
    """The first ``rows`` rows of ``runs``."""
    out = []
    for run in runs:
        if rows <= 0:
            break
        out.append(run if run.hi - run.lo <= rows else replace(run, hi=run.lo + rows))
        rows -= run.hi - run.lo
    return out


def _plan_of_runs(
    runs: Sequence[_Run], like: EpochPlan, *, num_rows: int, num_batches: int, rows_skipped: int
) -> EpochPlan:
    """The plan that delivers ``runs`` in turn, its options ``like``'s.

    Consecutive runs of one chunk make one chunk of the plan, read once: a shuffled one
    with its pieces and permutation key, delivering the runs' ranges of its order (its
    `EpochPlan.windows`); an unshuffled one with its pieces cut to the runs' rows.
    """
    groups: list[tuple[_Run, list[tuple[int, int]]]] = []
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
            chunk_pieces = _cut_pieces(chunk_pieces, ranges)
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


def _cut_pieces(
    pieces: Sequence[tuple[int, int, int]], ranges: Sequence[tuple[int, int]]
) -> list[tuple[int, int, int]]:
    """The parts of ``pieces`` (rows laid end to end) holding rows ``ranges``, in order.

    Examples:
        >>> _cut_pieces([(4, 0, 5), (2, 10, 13)], [(3, 6), (7, 8)])
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
    `_plan_of_runs`); its batches are cut from its own new stream.

    Raises ``ValueError`` when a leg says a worker delivered more batches than it had.

    Examples:
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

    streams: dict[tuple[int, int, int], list[_Run]] = {}

    def stream(level: int, rank: int, w: int) -> list[_Run]:
        """Worker ``w`` of rank ``rank``'s stream in leg ``level``, as runs."""
        if level == 0:
            return _plan_runs(first_plan(rank, w))
        if (level, rank, w) in streams:
            return streams[level, rank, w]
        # the sequence dealt: every old rank's streams, worker by worker, less the rows
        # they delivered
        gone, (lo, hi) = left[level - 1], shares[level][w]
        at, end = rank * rank_rows_of[level] + lo, rank * rank_rows_of[level] + hi
        runs: list[_Run] = []
        while at < end:
            old_rank, offset = divmod(at, sum(gone))
            old_worker = 0
            while offset >= gone[old_worker]:
                offset -= gone[old_worker]
                old_worker += 1
            take = min(end - at, gone[old_worker] - offset)
            old_lo, old_hi = shares[level - 1][old_worker]
            done = old_hi - old_lo - gone[old_worker]
            runs += _first_rows(
                _skip_rows(stream(level - 1, old_rank, old_worker), done + offset), take
            )
            at += take
        streams[level, rank, w] = runs
        return runs

    lo, hi = shares[-1][worker]
    return _plan_of_runs(
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
