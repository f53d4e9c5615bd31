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
   holding that row on, each with its original permutation key, and names the rows of that chunk's
   delivery order to drop; earlier chunks are never read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "EpochPlan",
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
    "rank_rows",
    "resume_point",
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
        inside = images < kind(n)
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
    inside = images < xp.take(xp.asarray(np.array(sizes, dtype=kind)), chunk)
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


def resume_point(
    chunk_rows: NDArray[np.int64], *, batches_done: int, batch_size: int
) -> tuple[int, int]:
    """Where a stream of chunks continues after ``batches_done`` whole batches.

    Returns ``(chunk, rows)``: the chunk holding the first row not yet delivered, and
    how many rows of that chunk's delivery order were delivered already. When every
    row was delivered, ``chunk`` is the number of chunks and ``rows`` is 0.

    Examples:
        >>> rows = np.array([5, 5, 5])  # three chunks of 5 rows, batches of 4
        >>> [resume_point(rows, batches_done=k, batch_size=4) for k in range(5)]
        [(0, 0), (0, 4), (1, 3), (2, 2), (3, 0)]
    """
    ends = np.cumsum(np.asarray(chunk_rows, dtype=np.int64))
    total = int(ends[-1]) if len(ends) else 0
    row = min(batches_done * batch_size, total)
    chunk = int(np.searchsorted(ends, row, side="right"))
    if chunk == len(ends):
        return chunk, 0
    return chunk, row - (int(ends[chunk - 1]) if chunk else 0)


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
        shuffle, seed, epoch, rank, worker: The key of the chunk permutations.
        first_chunk: Index in the whole epoch of this plan's first chunk (non-zero
            for a resumed plan, see [`resume`][tabloader.plan.EpochPlan.resume]); part of the
            permutation key.
        rows_skipped: Rows of the worker's stream before this plan's first chunk.
        drop_rows: Rows at the start of the first chunk's delivery order that were
            delivered before a resume: the loader drops them before cutting batches.
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
    rank: int
    worker: int
    first_chunk: int = 0
    rows_skipped: int = 0
    drop_rows: int = 0

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

    def chunk_rows(self, chunk: int) -> int:
        s = self.chunk_pieces(chunk)
        return int((self.stops[s] - self.starts[s]).sum())

    def rows_before(self, chunk: int) -> int:
        """Rows this worker delivers before chunk ``chunk``."""
        first = int(self.chunk_bounds[chunk])
        return self.rows_skipped + int((self.stops[:first] - self.starts[:first]).sum())

    def batch_bounds(self, chunk: int) -> NDArray[np.int64]:
        """Where batches start and end within chunk ``chunk``'s rows.

        The first and last windows may be parts of batches shared with the chunks around.
        """
        rows = self.chunk_rows(chunk)
        first = -self.rows_before(chunk) % self.batch_size
        inner = np.arange(first, rows, self.batch_size, dtype=np.int64)
        return np.unique(np.concatenate([[0], inner, [rows]]))

    def batch_order(self, chunk: int, *, xp: Any = np) -> Any:
        """Order to deliver chunk ``chunk``'s rows in, or None without shuffling.

        A random permutation, computed with ``xp`` (numpy, or cupy on a GPU: the same
        order); with ``shuffle_within_batch=False``, rows dealt into batches at random
        but kept in stored order within each (see
        [`deal_into_batches`][tabloader.plan.deal_into_batches]), computed on the host.
        """
        if not self.shuffle:
            return None
        key = {
            "seed": self.seed,
            "epoch": self.epoch,
            "rank": self.rank,
            "worker": self.worker,
            "chunk": self.first_chunk + chunk,
        }
        if self.shuffle_within_batch:
            return chunk_permutation(self.chunk_rows(chunk), **key, xp=xp)
        dealt = self.deal(chunk, chunk_permutation(self.chunk_rows(chunk), **key))
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
        keys = [
            chunk_keys(seed=self.seed, epoch=self.epoch, rank=self.rank, worker=self.worker,
                       chunk=self.first_chunk + c)
            for c in chunks
        ]  # fmt: skip
        yield from counter_permutations([self.chunk_rows(c) for c in chunks], keys, xp=xp)

    def deal(self, chunk: int, order: NDArray[np.int64]) -> NDArray[np.int64]:
        """Chunk ``chunk``'s delivery ``order`` with each batch's rows in stored order.

        Every batch holds the same rows as in ``order`` (see
        [`deal_into_batches`][tabloader.plan.deal_into_batches]).
        """
        return deal_into_batches(
            inverse_permutation(order),
            batch_size=self.batch_size,
            rows_before=self.rows_before(chunk),
        )

    def resume(self, batches_done: int) -> EpochPlan:
        """The rest of this plan once ``batches_done`` of its batches were delivered.

        Chunks wholly before the resume point are left out (never read); the chunk
        holding it keeps its permutation, and `drop_rows` says how many rows of
        its delivery order to drop. The batches the resumed plan yields are exactly
        this plan's batches from ``batches_done`` on.

        Examples:
            >>> plan = plan_epoch(np.array([5, 5, 5]), batch_size=4, shuffle=True, seed=0,
            ...                   epoch=0, parts_per_chunk=1)
            >>> rest = plan.resume(2)
            >>> rest.num_chunks, rest.first_chunk, rest.drop_rows, rest.num_batches
            (2, 1, 3, 2)
        """
        if not 0 <= batches_done <= self.num_batches:
            raise ValueError(f"batches_done must be in [0, {self.num_batches}], got {batches_done}")
        if batches_done == 0:
            return self
        chunk_rows = np.array([self.chunk_rows(c) for c in range(self.num_chunks)], np.int64)
        chunk, drop = resume_point(
            chunk_rows, batches_done=batches_done, batch_size=self.batch_size
        )
        first_piece = int(self.chunk_bounds[chunk])
        return replace(
            self,
            partitions=self.partitions[first_piece:],
            starts=self.starts[first_piece:],
            stops=self.stops[first_piece:],
            chunk_bounds=self.chunk_bounds[chunk:] - first_piece,
            num_rows=max(self.num_rows - batches_done * self.batch_size, 0),
            num_batches=self.num_batches - batches_done,
            first_chunk=self.first_chunk + chunk,
            rows_skipped=self.rows_before(chunk),
            drop_rows=drop,
        )


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
        rank=global_rank,
        worker=worker,
    )


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
    return replace(
        sub,
        partitions=parts[pieces],
        starts=starts[pieces] + sub.starts,
        stops=starts[pieces] + sub.stops,
        rank=global_rank,
    )
