"""A chunk's random order: a counter-based permutation, the same on numpy and cupy.

The order of a chunk's rows is a pure function of its key ``(seed, epoch, rank, worker,
chunk)``: a Feistel network over the row positions, cycle-walked to the chunk's size, so
any machine, and a GPU drawing it on the device, gets the same order from the same key
without a generator's state. `deal_into_batches` turns such an order into the delivery
order of a chunk whose rows keep stored order inside each batch.

Examples:
    >>> order = chunk_permutation(6, seed=0, epoch=0, rank=0, worker=0, chunk=0)
    >>> sorted(order.tolist())
    [0, 1, 2, 3, 4, 5]
    >>> inverse_permutation(order)[order].tolist()
    [0, 1, 2, 3, 4, 5]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "FEISTEL_ROUNDS",
    "chunk_keys",
    "chunk_permutation",
    "counter_permutation",
    "counter_permutations",
    "deal_into_batches",
    "inverse_permutation",
]

_CHUNK_STREAM = 1


def chunk_permutation(
    num_rows: int, *, seed: int, epoch: int, rank: int, worker: int, chunk: int, xp: Any = np
) -> Any:
    """A random order of one chunk's rows: identical on every machine, and with numpy or
    cupy (``xp``), for the same key (see
    [`counter_permutation`][tabloader.permutation.counter_permutation]).

    Examples:
        >>> order = chunk_permutation(10, seed=0, epoch=0, rank=0, worker=0, chunk=0)
        >>> sorted(order.tolist()) == list(range(10)), order.dtype
        (True, dtype('int64'))
    """
    keys = chunk_keys(seed=seed, epoch=epoch, rank=rank, worker=worker, chunk=chunk)
    return counter_permutation(num_rows, keys, xp=xp)


def chunk_keys(*, seed: int, epoch: int, rank: int, worker: int, chunk: int) -> list[int]:
    """The round keys of one chunk's permutation (see
    [`chunk_permutation`][tabloader.permutation.chunk_permutation])."""
    key = [seed, epoch, _CHUNK_STREAM, rank, worker, chunk]
    keys = np.random.SeedSequence(key).generate_state(FEISTEL_ROUNDS, dtype=np.uint64)
    return [int(k) for k in keys]


FEISTEL_ROUNDS = 4
"""Rounds of the Feistel network of
[`counter_permutation`][tabloader.permutation.counter_permutation]."""
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
