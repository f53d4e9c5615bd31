"""CPU backend: pyarrow decodes, numpy lays out, shuffles and slices.

A decoded column is a 1-D numpy array, a list column a `Ragged`, and a vector column (a
fixed-size list) a ``[rows, k]`` array taking ``k`` places of its block.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import mmap
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabloader.batches import Ragged, empty_segment
from tabloader.casting import check_block
from tabloader.errors import NullValuesError
from tabloader.plan import inverse_permutation
from tabloader.stages import SplitWork, decode_ahead, drawn_ahead

if TYPE_CHECKING:
    from numpy.typing import DTypeLike, NDArray

    from tabloader.backends import Piece, ReadRequest
    from tabloader.batches import Block, Part, Segment
    from tabloader.plan import EpochPlan
    from tabloader.stats import StatsRecorder

__all__ = [
    "BufferPool",
    "CPUBackend",
    "PooledNumpy",
    "column_to_numpy",
    "list_column_to_ragged",
    "map_in",
    "null_message",
    "populated_empty",
    "vector_to_numpy",
]

T = TypeVar("T")

# How often a reader waiting for an older chunk to be let go looks again.
_ROOM_POLL_SECONDS = 0.002
# Rows per step when interleaving columns into a row-major block: the rows being
# written stay in the CPU's cache while each of the columns is copied in (the step was
# measured: docs/performance.md, "Measured choices inside the loader").
_BLOCK_ROWS = 16384


def _size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to one of four sizes per doubling (at most 25% more).

    Chunks and carried rows vary in size from one chunk to the next; rounding makes
    buffers of nearly equal requests interchangeable.

    Examples:
        >>> [_size_class(n) >> 20 for n in (128 << 20, 129 << 20, 159 << 20, 161 << 20)]
        [128, 160, 160, 192]
    """
    step = 1 << max(nbytes.bit_length() - 3, 12)
    return -(-nbytes // step) * step


# madvise(2) advice that maps pages in for writing (Linux 5.14 and later).
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise``, called through ctypes, which lets the GIL go for the call
    (``mmap.madvise`` holds it: mapping in a gigabyte stopped every other thread of the
    loader for a quarter of a second); None where there is none to call."""
    if sys.platform != "linux":
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def _populate(address: int, nbytes: int) -> bool:
    """Map in the pages of ``nbytes`` bytes from ``address`` for writing, at once and
    without the GIL; returns whether they were. Where the advice is unknown (older
    kernels, other systems), they are mapped in on first touch instead."""
    madvise = _madvise()
    if madvise is None or nbytes <= 0:
        return False
    first = address - address % mmap.PAGESIZE
    stop = -(-(address + nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE
    return madvise(first, stop - first, _MADV_POPULATE_WRITE) == 0


def _map_memory(nbytes: int, used: int | None = None) -> mmap.mmap:
    """Fresh, page-aligned, private anonymous memory of ``nbytes``, its first ``used``
    bytes (all by default) mapped in at once.

    Mapping the pages in with one system call is several times faster than one page
    fault per page on first touch; the rest of a buffer rounded up to its size class is
    left unmapped, so it takes no memory until a larger request reuses the buffer. The
    memory is not marked for transparent huge pages (numpy marks its large arrays), so
    the kernel never stalls compacting memory to find them: both were the cost of a
    loader's first epoch. The other threads run meanwhile (see `_madvise`).

    Examples:
        >>> memory = _map_memory(1 << 20, used=4096)
        >>> len(memory)
        1048576
    """
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    used = nbytes if used is None else min(used, nbytes)
    if used:
        _populate(ctypes.addressof(ctypes.c_char.from_buffer(memory)), used)
    return memory


def populated_empty(shape: tuple[int, ...], dtype: Any, *, populate: bool = True) -> NDArray[Any]:
    """An empty array in fresh memory mapped in at once (see `_map_memory`), for a
    large array filled right away, such as a decoded cache; freed with the array.

    With ``populate=False`` no page is mapped in yet: `map_in` maps in each part just
    before it is written, by the thread writing it (a cache filled piece by piece maps
    its gigabytes in on the threads that write them, alongside the decoder, instead of
    all at once before the first piece).

    Examples:
        >>> a = populated_empty((3, 2), "float32")
        >>> a.shape, a.dtype, a.flags.writeable, a.ctypes.data % 4096
        ((3, 2), dtype('float32'), True, 0)
    """
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    memory = _map_memory(nbytes, used=None if populate else 0)
    return np.frombuffer(memory, dtype, count=math.prod(shape)).reshape(shape)


def map_in(array: NDArray[Any]) -> bool:
    """Map in the pages of a contiguous ``array`` for writing, at once and without the
    GIL (the pages of a `populated_empty` array made with ``populate=False``: see there);
    returns whether they were (else first touch maps them in).

    Examples:
        >>> a = populated_empty((1024, 2), "int64", populate=False)
        >>> _ = map_in(a[10:20])
        >>> a[10:20] = 7
        >>> int(a[10:20].sum())
        140
    """
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        raise ValueError("map_in maps in a contiguous array's memory")
    return _populate(array.ctypes.data, array.nbytes)


class BufferPool:
    """Large host arrays whose memory is reused once no array refers to it any more.

    A chunk's blocks are hundreds of megabytes. Fresh memory costs as much to map in
    as the shuffle itself; reusing the memory of blocks already consumed avoids that.
    A buffer is lent out as a numpy array over a memoryview that only that array (and
    its views, and tensors made from them) keep alive, so a weak reference to the
    memoryview says exactly when the buffer is free again.

    What the pool keeps is bounded by what the loader holds at once, not by the data:
    requests are rounded up to size classes (so buffers are interchangeable), and idle
    buffers, smallest first, are released whenever keeping them would take the pool
    beyond ``slack`` times the most it ever had lent out at once. It keeps what the
    loader keeps using, not all that a rare moment needed: an idle buffer not lent again
    while the pool lent ``stale_after`` times that most is released. Arrays are 64-byte
    aligned (page aligned, in fact).

    Examples:
        >>> pool = BufferPool()
        >>> a = pool.empty((1 << 18,), "int64")
        >>> a.ctypes.data % 64, pool.idle_bytes()
        (0, 0)
        >>> del a
        >>> pool.idle_bytes() > 0
        True
    """

    min_bytes = 1 << 20
    """Smaller arrays come from numpy directly."""
    max_buffers = 16
    """Buffers kept at most; idle ones beyond this are released."""
    slack = 1.25
    """Pooled bytes kept at most, as a multiple of the most bytes ever lent at once."""
    stale_after = 4.0
    """An idle buffer is released once the pool has lent this multiple of the most bytes
    ever lent at once without lending that buffer. In a steady stream a chunk's buffer is
    lent again after about two chunks' worth of blocks and batches, well within that; a
    buffer mapped for a rare moment (a third chunk in flight, an extra batch queued)
    would otherwise stay resident for good, and memory crept up from epoch to epoch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffers: list[mmap.mmap] = []
        self._leases: list[weakref.ref[memoryview] | None] = []
        self._used: list[int] = []  # when each buffer was last lent (the clock then)
        self._clock = 0  # bytes lent so far
        self._peak_lent = 0

    def _idle(self, i: int) -> bool:
        lease = self._leases[i]
        return lease is None or lease() is None

    def idle_bytes(self) -> int:
        with self._lock:
            return sum(len(b) for i, b in enumerate(self._buffers) if self._idle(i))

    @property
    def peak_lent_bytes(self) -> int:
        """The most bytes (of whole buffers) lent out at once so far."""
        return self._peak_lent

    def pooled_bytes(self) -> int:
        """Bytes the pool holds, lent or idle."""
        with self._lock:
            return sum(len(b) for b in self._buffers)

    def empty(self, shape: tuple[int, ...], dtype: DTypeLike) -> NDArray[Any]:
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        nbytes = count * dtype.itemsize
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype)
        size = _size_class(nbytes)
        with self._lock:
            idle = [self._idle(i) for i in range(len(self._buffers))]
            # The smallest idle buffer that fits without wasting more than half of it.
            fits = [
                (len(memory), i)
                for i, memory in enumerate(self._buffers)
                if size <= len(memory) <= 2 * size and idle[i]
            ]
            best = min(fits)[1] if fits else -1
            if best < 0:
                lent = sum(len(b) for b, free in zip(self._buffers, idle, strict=True) if not free)
                self._peak_lent = max(self._peak_lent, lent + size)
                self._release_idle(idle, room=size)
                self._buffers.append(_map_memory(size, used=nbytes))
                self._leases.append(None)
                self._used.append(0)
                best = len(self._buffers) - 1
            self._clock += len(self._buffers[best])
            self._used[best] = self._clock
            view = memoryview(self._buffers[best])[:nbytes]
            flat = np.frombuffer(view, dtype=dtype)
            self._leases[best] = weakref.ref(flat.base)  # type: ignore[arg-type]
            self._release_stale()
        return flat.reshape(shape)

    def _release_idle(self, idle: list[bool], room: int) -> None:
        """Release idle buffers, smallest first, to make ``room`` bytes."""
        budget = self.slack * self._peak_lent - room
        total = sum(len(b) for b in self._buffers)
        count = len(self._buffers)
        drop = set()
        # Smallest first: they are the cheapest to map in again, and the big ones (whole
        # chunks) are the ones every chunk asks for.
        free = [i for i, f in enumerate(idle) if f]
        for i in sorted(free, key=lambda i: (len(self._buffers[i]), self._used[i])):
            if total <= budget and count < self.max_buffers:
                break
            total -= len(self._buffers[i])
            count -= 1
            drop.add(i)
        self._keep([i for i in range(len(self._buffers)) if i not in drop])

    def _release_stale(self) -> None:
        """Release the idle buffers not lent for a long while (see ``stale_after``)."""
        horizon = self.stale_after * self._peak_lent
        stale = {
            i
            for i in range(len(self._buffers))
            if self._clock - self._used[i] > horizon and self._idle(i)
        }
        if stale:
            self._keep([i for i in range(len(self._buffers)) if i not in stale])

    def _keep(self, keep: list[int]) -> None:
        """Keep only buffers ``keep`` (indices, in order); the others are released."""
        self._buffers = [self._buffers[i] for i in keep]
        self._leases = [self._leases[i] for i in keep]
        self._used = [self._used[i] for i in keep]


class PooledNumpy:
    """The array namespace the batching code runs with on the CPU: numpy, pooled memory.

    Examples:
        >>> import numpy as np
        >>> xp = PooledNumpy(BufferPool())
        >>> xp.take(np.array([[1, 2], [3, 4]]), np.array([1, 0]), axis=0).tolist()
        [[3, 4], [1, 2]]
    """

    def __init__(self, pool: BufferPool) -> None:
        self.pool = pool

    def empty(self, shape: tuple[int, ...], dtype: DTypeLike) -> NDArray[Any]:
        return self.pool.empty(shape, dtype)

    def take(
        self,
        array: NDArray[Any],
        indices: NDArray[np.int64],
        axis: int = 0,
        out: NDArray[Any] | None = None,
    ) -> NDArray[Any]:
        if out is None:
            shape = list(array.shape)
            shape[axis] = len(indices)
            out = self.empty(tuple(shape), array.dtype)
        # Indices come from a permutation of the rows, so they are in range: "clip" skips
        # the bounds-checking copy numpy makes in its default mode.
        np.take(array, indices, axis=axis, out=out, mode="clip")
        return out

    def concatenate(
        self, arrays: Sequence[NDArray[Any]], axis: int = 0, out: NDArray[Any] | None = None
    ) -> NDArray[Any]:
        if out is None:
            shape = list(arrays[0].shape)
            shape[axis] = sum(a.shape[axis] for a in arrays)
            out = self.empty(tuple(shape), np.result_type(*arrays))
        np.concatenate(arrays, axis=axis, out=out)
        return out

    def hand_over(self, batch: Any = None) -> None:
        """Nothing to order: numpy's work is done when its calls return."""

    def chunk_ready(self) -> None:
        """Nothing to wait for: a chunk is complete when it is read (see ``hand_over``)."""

    def wait_for(self, ready: None) -> None:
        """Nothing to wait for (see ``hand_over``)."""


def null_message(column: str, count: int, where: str) -> str:
    return (
        f"column {column!r} has {count} null value(s) in {where}. Fill them in the data, "
        f"or pass fill_null={{{column!r}: 0}} (any number) to the loader"
    )


def column_to_numpy(
    column: pa.ChunkedArray[Any] | pa.Array[Any], name: str, fill: float | None, where: str
) -> NDArray[Any]:
    """One Arrow column as a numpy array: zero-copy when it has one chunk and no nulls."""
    if column.null_count:
        if fill is None:
            raise NullValuesError(null_message(name, column.null_count, where))
        column = pc.fill_null(column, pa.scalar(fill).cast(column.type))
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks == 1:
            column = column.chunk(0)
        elif column.num_chunks == 0:
            return np.empty(0, dtype=column.type.to_pandas_dtype())
    return array_to_numpy(column)


def array_to_numpy(array: pa.Array[Any] | pa.ChunkedArray[Any]) -> NDArray[Any]:
    """An Arrow array without nulls as numpy: a zero-copy view of its values buffer for
    numbers in one chunk, else ``to_numpy``.

    The view keeps Arrow's buffer alive and is read-only, as ``to_numpy``'s would be;
    unlike ``to_numpy`` it does not import pandas (tens of MiB and a noticeable pause).

    Examples:
        >>> array_to_numpy(pa.array([1.5, 2.5], pa.float32()).slice(1)).tolist()
        [2.5]
        >>> array_to_numpy(pa.array([True, False])).tolist()
        [True, False]
    """
    kind = array.type
    if isinstance(array, pa.Array) and (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        dtype = np.dtype(kind.to_pandas_dtype())
        buffer: Any = array.buffers()[1]  # Arrow's buffer protocol, not typed as such
        values: NDArray[Any] = np.frombuffer(
            buffer, dtype, len(array), array.offset * dtype.itemsize
        )
        values.flags.writeable = False
        return values
    return np.asarray(array.to_numpy(zero_copy_only=False))


def list_column_to_ragged(column: Any, name: str, fill: float | None, where: str) -> Ragged:
    """One Arrow list column as values and offsets (numpy): null lists are empty lists;
    nulls inside lists take ``fill``, or raise without it. A fixed-size list column read
    as lists (named in ``sparse_names``) is a list column of rows of equal length."""
    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if pa.types.is_fixed_size_list(column.type) or pa.types.is_list_view(column.type):
        column = column.cast(pa.list_(column.type.value_type))
    elif pa.types.is_large_list_view(column.type):
        column = column.cast(pa.large_list(column.type.value_type))
    lengths = np.diff(np.asarray(column.offsets))  # the slice's own, whatever its offset
    if column.null_count:
        # A null slot may still span values; flatten() leaves them out, so do the offsets.
        lengths[column.is_null().to_numpy(zero_copy_only=False)] = 0
    offsets = np.zeros(len(column) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values: Any = column.flatten()  # the values of the non-null lists, slice offset applied
    if values.null_count:
        if fill is None:
            raise NullValuesError(null_message(name, values.null_count, where + " (inside lists)"))
        values = pc.fill_null(values, pa.scalar(fill).cast(values.type))
    return Ragged(array_to_numpy(values), offsets)


def vector_to_numpy(column: Any, name: str, fill: float | None, where: str) -> NDArray[Any]:
    """One Arrow fixed-size list column (``k`` values a row) as a ``[rows, k]`` numpy
    array: a view of its values where none is null. A null row (every value of it) and
    a null inside a row take ``fill``, or raise without it.

    Examples:
        >>> column = pa.array([[1, 2], None, [5, 6]], pa.list_(pa.int64(), 2))
        >>> vector_to_numpy(column.slice(1), "v", -1, "a.parquet").tolist()
        [[-1, -1], [5, 6]]
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    width = column.type.list_size
    rows = len(column)
    # (values ignores the array's offset; null rows keep their k values in it)
    values = column.values.slice(column.offset * width, rows * width)
    null_rows = column.is_null().to_numpy(zero_copy_only=False) if column.null_count else None
    if values.null_count:
        inside = values.is_null().to_numpy(zero_copy_only=False).reshape(rows, width)
        if null_rows is not None:
            inside &= ~null_rows[:, None]
        if inside.any() and fill is None:
            raise NullValuesError(null_message(name, int(inside.sum()), where + " (inside lists)"))
        values = pc.fill_null(values, pa.scalar(0 if fill is None else fill).cast(values.type))
    dense = array_to_numpy(values).reshape(rows, width)
    if null_rows is not None:
        if fill is None:
            raise NullValuesError(null_message(name, int(null_rows.sum()), where))
        dense = dense.copy()
        dense[null_rows] = fill
    return dense


def _decoder(column: Any, *, ragged: bool) -> Callable[..., Any]:
    """How a column of this Arrow type is decoded: lists and list views (and fixed-size
    lists read as lists, ``ragged``) to `Ragged`, fixed-size lists to ``[rows, k]``,
    others to 1-D."""
    kind = column.type
    if (
        pa.types.is_list(kind)
        or pa.types.is_large_list(kind)
        or pa.types.is_list_view(kind)
        or pa.types.is_large_list_view(kind)
    ):
        return list_column_to_ragged
    if pa.types.is_fixed_size_list(kind):
        return list_column_to_ragged if ragged else vector_to_numpy
    return column_to_numpy


def interleave(arrays: Sequence[NDArray[Any]], out: NDArray[Any]) -> None:
    """Copy ``arrays`` in as the columns of ``out``, casting on the fly (a vector
    column's ``[rows, k]`` as ``k`` of them).

    Examples:
        >>> out = np.empty((2, 3), np.float32)
        >>> interleave([np.array([1, 2]), np.array([[3, 4], [5, 6]])], out)
        >>> out.tolist()
        [[1.0, 3.0, 4.0], [2.0, 5.0, 6.0]]
    """
    n = len(arrays[0])
    if len(arrays) == 1:
        out[...] = arrays[0].reshape(n, -1)
        return
    for start in range(0, n, _BLOCK_ROWS):
        stop = min(start + _BLOCK_ROWS, n)
        rows = out[start:stop]
        j = 0
        for array in arrays:
            j = _put(rows, j, array[start:stop])


def _put(rows: NDArray[Any], j: int, column: NDArray[Any]) -> int:
    """Write ``column`` (1-D, or a vector column's 2-D) into ``rows`` from place ``j``;
    the place after it."""
    if column.ndim == 1:
        rows[:, j] = column
        return j + 1
    stop = j + int(column.shape[1])
    rows[:, j:stop] = column
    return stop


class CPUBackend:
    """Chunks in host memory as numpy arrays."""

    name = "cpu"
    groups_columns = False
    """Each column is a block of its own: unshuffled batches are views of decoded data."""

    def __init__(self) -> None:
        self.xp = PooledNumpy(BufferPool())

    def scope(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to set up in a thread that works on host arrays."""
        return contextlib.nullcontext()

    def read_chunks(self, request: ReadRequest) -> Iterator[list[Part]]:
        plan, blocks, stats = request.plan, request.blocks, request.stats
        columns = [c for b in blocks for c in b.columns]
        decoded = decode_ahead(plan, partial(decode_pieces, request, columns=columns))
        places = drawn_ahead(plan, partial(_chunk_places, plan))
        held: deque[weakref.ref[Any]] = deque()  # the memory of the chunks laid out
        work = SplitWork(request.threads.layout, name="tabloader-layout")
        try:
            for chunk, chunk_places in zip(range(plan.num_chunks), places, strict=True):
                s = plan.chunk_pieces(chunk)
                arrays = islice(decoded, s.stop - s.start)
                if chunk_places is None:
                    yield [(self._piece_segment(a, blocks, stats, work), None) for a in arrays]
                    continue
                _wait_for_room(held, request)
                segment = self._ordered_segment(arrays, *chunk_places, blocks, stats, work)
                held.append(weakref.ref(_owner(next(iter(segment.values())))))
                yield [(segment, None)]
                del segment
        finally:
            work.close()
            places.close()
            decoded.close()

    def _ordered_segment(
        self,
        pieces: Iterable[dict[str, NDArray[Any]]],
        order: NDArray[np.int64],
        places: NDArray[np.int64],
        blocks: Sequence[Block],
        stats: StatsRecorder,
        work: SplitWork,
    ) -> Segment:
        """A chunk with row ``i`` written at ``places[i]``: the rows of ``order`` (all of
        the chunk's, or those a resumed plan delivers) in that order, so that every batch
        is a slice of it; a row left out is written to a spare row after them.

        Every decoded value is written once, straight to its place: one scatter per
        column, into a column of a few MiB that stays in the CPU's cache (rows dealt
        into batches in stored order, ``shuffle_within_batch=False``, are written in
        one sequential run per batch). Columns of a stacked block are interleaved a few
        thousand rows at a time and written out a whole row at a time. List columns
        stay where they are and are reordered lazily, as each batch is cut.
        """
        spare = int(len(order) < len(places))
        segment = empty_segment(
            len(order) + spare,
            [(b.name, b.width, b.dtype) for b in blocks if not b.ragged],
            self.xp,
        )
        lists: dict[str, list[Ragged]] = {b.name: [] for b in blocks if b.ragged}
        offset = 0
        for arrays in pieces:
            started = time.perf_counter()
            n = len(next(iter(arrays.values())))
            rows = places[offset : offset + n]
            jobs: list[tuple[int, Callable[[], None]]] = []
            for b in blocks:
                if b.ragged:
                    ragged: Any = arrays[b.columns[0]]
                    lists[b.name].append(ragged)
                    continue
                out = segment[b.name]
                if len(b.columns) == 1 and arrays[b.columns[0]].ndim == 1:
                    # scatter and cast in one pass
                    jobs.append((n, partial(out[:, 0].__setitem__, rows, arrays[b.columns[0]])))
                    continue
                for share in work.shares(n):
                    cols = [arrays[c][share] for c in b.columns]
                    job = partial(self._scatter_rows, cols, rows[share], out)
                    jobs.append((len(cols[0]) * b.width, job))
            work.run(jobs)
            offset += n
            stats.assemble_seconds += time.perf_counter() - started
        if spare:
            segment = {name: array[: len(order)] for name, array in segment.items()}
        if lists:
            # Lists stay where they are, reordered lazily: each batch gathers its rows'
            # values once, when it is cut.
            started = time.perf_counter()
            for b in blocks:
                if b.ragged:
                    whole = Ragged.concatenate(lists[b.name])
                    values = whole.values.astype(b.dtype, copy=False)
                    segment[b.name] = Ragged(values, whole.offsets, rows=order)
            stats.assemble_seconds += time.perf_counter() - started
        return segment

    def _scatter_rows(
        self, arrays: Sequence[NDArray[Any]], rows: NDArray[np.int64], out: NDArray[Any]
    ) -> None:
        """``out[rows[i], j] = arrays[j][i]``: columns interleaved, rows scattered.

        Some thousands of rows at a time are interleaved in a scratch block, then
        written out row by row: every row of ``out`` is written once, whole, where a
        column-by-column scatter would sweep all of ``out`` once per column. Each row
        moves as one opaque item of its width (faster than numpy's copy of a row of
        items, which sets up a strided copy per row; see docs/performance.md); the whole
        stacked layout then costs what the column layout's scatters cost.
        """
        step = _BLOCK_ROWS
        scratch = np.empty((min(step, len(rows)), out.shape[1]), out.dtype)
        row = np.dtype((np.void, scratch.strides[0]))
        whole_rows = out.view(row)[:, 0]
        for start in range(0, len(rows), step):
            stop = min(start + step, len(rows))
            block = scratch[: stop - start]
            j = 0
            for array in arrays:
                j = _put(block, j, array[start:stop])
            whole_rows[rows[start:stop]] = block.view(row)[:, 0]

    def _piece_segment(
        self,
        piece: dict[str, NDArray[Any]],
        blocks: Sequence[Block],
        stats: StatsRecorder,
        work: SplitWork,
    ) -> Segment:
        """One piece as a segment: zero-copy where a block is one column of its dtype;
        stacked blocks are interleaved by ``work``'s threads, a share of the rows each."""
        started = time.perf_counter()
        segment: Segment = {}
        jobs: list[tuple[int, Callable[[], None]]] = []
        for b in blocks:
            cols = [piece[c] for c in b.columns]
            if b.ragged:
                decoded: Any = cols[0]
                values = decoded.values.astype(b.dtype, copy=False)
                segment[b.name] = Ragged(values, decoded.offsets)
                continue
            n = len(cols[0])
            if len(cols) == 1 and cols[0].dtype == b.dtype:
                segment[b.name] = cols[0].reshape(n, -1)  # zero-copy view of the decoded data
                continue
            out = self.xp.empty((n, b.width), b.dtype)
            for share in work.shares(n):
                part = [c[share] for c in cols]
                jobs.append((len(part[0]) * b.width, partial(interleave, part, out[share])))
            segment[b.name] = out
        work.run(jobs)
        stats.assemble_seconds += time.perf_counter() - started
        return segment


def _owner(array: Any) -> Any:
    """The object that owns ``array``'s memory (a pooled buffer's memoryview)."""
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array


def _wait_for_room(held: deque[weakref.ref[Any]], request: ReadRequest) -> None:
    """Wait until at most ``request.chunks_ahead`` of the chunks laid out before are
    still held downstream (their batches are views), or the consumer runs out of chunks.

    Without it a new chunk's memory was mapped while the one before the last was still
    held by its last few batches, and the pool kept three chunks instead of two.
    """
    waiting = request.consumer_waiting
    while waiting is not None:
        for ref in [r for r in held if r() is None]:
            held.remove(ref)
        if len(held) <= request.chunks_ahead or waiting.wait(_ROOM_POLL_SECONDS):
            return  # room, or the consumer keeps batches: lay out the next chunk anyway


def _chunk_places(
    plan: EpochPlan, chunk: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]] | None:
    """The chunk's delivery order and each of its rows' place in it (a row the plan does
    not deliver: the place after the last); None without shuffling."""
    order = plan.batch_order(chunk)
    if order is None:
        return None
    rows = plan.stored_rows(chunk)
    if len(order) == rows:
        return order, inverse_permutation(order)
    places = np.full(rows, len(order), dtype=np.int64)
    places[order] = np.arange(len(order), dtype=np.int64)
    return order, places


def decode_pieces(
    request: ReadRequest, pieces: Sequence[Piece], columns: Sequence[str]
) -> Iterator[dict[str, NDArray[Any]]]:
    """Each piece's columns as numpy arrays (zero-copy where there are no nulls)."""
    dataset, fill_null, stats = request.dataset, request.fill_null, request.stats
    ragged = {c for b in request.blocks if b.ragged for c in b.columns}
    tables = dataset.iter_pieces(pieces, columns)
    for partition, _, _ in pieces:
        started = time.perf_counter()
        table = next(tables)
        stats.read_seconds += time.perf_counter() - started
        stats.bytes_read += table.nbytes
        where = dataset.describe_partition(partition)
        arrays: dict[str, Any] = {
            c: _decoder(table.column(c), ragged=c in ragged)(
                table.column(c), c, fill_null.get(c), where
            )
            for c in columns
        }
        del table
        for block in request.blocks:  # values that would not fit their dtype: an error
            check_block(arrays, block, where=where)
        yield arrays
