"""CPU backend: pyarrow decodes, numpy lays out, shuffles and slices."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabloader.errors import NullValuesError

if TYPE_CHECKING:
    from numpy.typing import DTypeLike, NDArray

    from tabloader.backends import Piece
    from tabloader.batches import Block, Segment
    from tabloader.dataset import Dataset
    from tabloader.stats import StatsRecorder

__all__ = ["BufferPool", "CPUBackend", "PooledNumpy", "column_to_numpy", "null_message"]

# Rows per step when interleaving columns into a row-major block: the rows being
# written stay in cache while each of the columns is copied in.
_BLOCK_ROWS = 4096
_ALIGN = 64


class BufferPool:
    """Large host arrays whose memory is reused once no array refers to it any more.

    A chunk's blocks are hundreds of megabytes. Fresh memory from the allocator is
    mapped in page by page on first touch, which costs as much as the shuffle itself;
    reusing the memory of blocks already consumed avoids that. A buffer is lent out as
    a numpy array over a memoryview that only that array (and its views, and tensors
    made from them) keep alive, so a weak reference to the memoryview says exactly when
    the buffer is free again. Arrays are 64-byte aligned.

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

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffers: list[tuple[NDArray[np.uint8], int]] = []  # (memory, aligned offset)
        self._leases: list[weakref.ref[memoryview] | None] = []

    def _idle(self, i: int) -> bool:
        lease = self._leases[i]
        return lease is None or lease() is None

    def idle_bytes(self) -> int:
        with self._lock:
            return sum(len(b) for i, (b, _) in enumerate(self._buffers) if self._idle(i))

    def empty(self, shape: tuple[int, ...], dtype: DTypeLike) -> NDArray[Any]:
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        nbytes = count * dtype.itemsize
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype)
        with self._lock:
            # The smallest idle buffer that fits without wasting more than half of it.
            fits = [
                (len(memory) - offset, i)
                for i, (memory, offset) in enumerate(self._buffers)
                if nbytes <= len(memory) - offset <= 2 * nbytes and self._idle(i)
            ]
            best = min(fits)[1] if fits else -1
            if best < 0:
                self._release_idle(keep=self.max_buffers - 1)
                memory = np.empty(nbytes + _ALIGN, dtype=np.uint8)
                offset = -memory.ctypes.data % _ALIGN
                self._buffers.append((memory, offset))
                self._leases.append(None)
                best = len(self._buffers) - 1
            memory, offset = self._buffers[best]
            view = memoryview(memory)[offset : offset + nbytes]  # type: ignore[arg-type]
            flat = np.frombuffer(view, dtype=dtype)
            self._leases[best] = weakref.ref(flat.base)  # type: ignore[arg-type]
        return flat.reshape(shape)

    def _release_idle(self, keep: int) -> None:
        idle = [i for i in range(len(self._buffers)) if self._idle(i)]
        excess = len(self._buffers) - keep
        for i in sorted(idle[: max(excess, 0)], reverse=True):
            del self._buffers[i]
            del self._leases[i]


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

    def take(self, array: NDArray[Any], indices: NDArray[np.int64], axis: int = 0) -> NDArray[Any]:
        shape = list(array.shape)
        shape[axis] = len(indices)
        out = self.empty(tuple(shape), array.dtype)
        # Indices come from a permutation of the rows, so they are in range: "clip" skips
        # the bounds-checking copy numpy makes in its default mode.
        np.take(array, indices, axis=axis, out=out, mode="clip")
        return out

    def concatenate(self, arrays: Sequence[NDArray[Any]], axis: int = 0) -> NDArray[Any]:
        shape = list(arrays[0].shape)
        shape[axis] = sum(a.shape[axis] for a in arrays)
        out = self.empty(tuple(shape), np.result_type(*arrays))
        np.concatenate(arrays, axis=axis, out=out)
        return out


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
    return np.asarray(column.to_numpy(zero_copy_only=False))


def interleave(arrays: Sequence[NDArray[Any]], out: NDArray[Any], offset: int) -> None:
    """Copy ``arrays`` in as the columns of ``out[offset:offset + n]``, casting on the fly."""
    n = len(arrays[0])
    if len(arrays) == 1:
        out[offset : offset + n, 0] = arrays[0]
        return
    for start in range(0, n, _BLOCK_ROWS):
        stop = min(start + _BLOCK_ROWS, n)
        rows = out[offset + start : offset + stop]
        for j, array in enumerate(arrays):
            rows[:, j] = array[start:stop]


class CPUBackend:
    """Chunks in host memory as numpy arrays."""

    name = "cpu"

    def __init__(self) -> None:
        self.xp = PooledNumpy(BufferPool())

    def load_chunk(
        self,
        dataset: Dataset,
        pieces: Sequence[Piece],
        blocks: Sequence[Block],
        fill_null: Mapping[str, float],
        *,
        concatenate: bool,
        stats: StatsRecorder,
    ) -> list[Segment]:
        columns = [c for b in blocks for c in b.columns]
        rows = sum(stop - start for _, start, stop in pieces)
        # Concatenating: every piece is copied into its rows of the chunk's blocks as soon
        # as it is decoded, so at most one file's run of decoded row groups is held
        # besides the chunk itself.
        chunk = (
            {b.name: self.xp.empty((rows, len(b.columns)), b.dtype) for b in blocks}
            if concatenate
            else None
        )
        segments: list[Segment] = []
        offset = 0
        tables = dataset.iter_pieces(pieces, columns)
        for partition, start, stop in pieces:
            started = time.perf_counter()
            table = next(tables)
            decoded = time.perf_counter()
            stats.read_seconds += decoded - started
            stats.bytes_read += table.nbytes
            where = dataset.describe_partition(partition)
            arrays = {
                c: column_to_numpy(table.column(c), c, fill_null.get(c), where) for c in columns
            }
            del table
            if chunk is None:
                segments.append(self._piece_segment(arrays, blocks))
            else:
                for b in blocks:
                    interleave([arrays[c] for c in b.columns], chunk[b.name], offset)
            offset += stop - start
            stats.assemble_seconds += time.perf_counter() - decoded
        return segments if chunk is None else [chunk]

    def _piece_segment(self, piece: dict[str, NDArray[Any]], blocks: Sequence[Block]) -> Segment:
        segment: Segment = {}
        for b in blocks:
            cols = [piece[c] for c in b.columns]
            if len(cols) == 1 and cols[0].dtype == b.dtype:
                segment[b.name] = cols[0].reshape(-1, 1)  # zero-copy view of the decoded data
                continue
            out = self.xp.empty((len(cols[0]), len(cols)), b.dtype)
            interleave(cols, out, 0)
            segment[b.name] = out
        return segment

    def as_index(self, permutation: NDArray[np.int64]) -> NDArray[np.int64]:
        return permutation
