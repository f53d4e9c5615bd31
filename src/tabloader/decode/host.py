"""Decoding on the host: Arrow columns as numpy arrays, the way both backends deliver them.

`decode_pieces` reads a dataset's pieces and decodes each column: zero-copy where there
are no nulls (`column_to_numpy`), nulls filled or refused (`null_message` says how to
fill them, on every backend), a list column as values and offsets (`list_column_to_ragged`:
a null list is an empty one) and a fixed-size list as a ``[rows, k]`` array
(`vector_to_numpy`). Values that would not fit their delivered dtype are refused as they
are decoded. `interleave` writes decoded columns into a row-major block, as the CPU
backend and the decoded cache lay them out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabloader.batches import Ragged
from tabloader.casting import check_block, holding
from tabloader.errors import NullValuesError

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from tabloader.batches import Block
    from tabloader.sources.base import Piece
    from tabloader.stats import StatsRecorder

__all__ = [
    "INTERLEAVE_ROWS",
    "PieceReader",
    "array_to_numpy",
    "column_to_numpy",
    "decode_pieces",
    "interleave",
    "list_column_to_ragged",
    "null_message",
    "put_column",
    "vector_to_numpy",
]

INTERLEAVE_ROWS = 16384
"""Rows per step when interleaving columns into a row-major block: the rows being written
stay in the CPU's cache while each of the columns is copied in (the step was measured:
docs/performance.md, "Measured choices inside the loader")."""


class PieceReader(Protocol):
    """What decoding reads a dataset by ([`Dataset`][tabloader.Dataset] is one)."""

    def iter_pieces(
        self, pieces: Sequence[tuple[int, int, int]], columns: Sequence[str]
    ) -> Iterator[pa.Table]: ...

    def describe_partition(self, index: int) -> str: ...


def decode_pieces(
    dataset: PieceReader,
    pieces: Sequence[Piece],
    columns: Sequence[str],
    *,
    blocks: Sequence[Block],
    fill_null: Mapping[str, float],
    stats: StatsRecorder,
) -> Iterator[dict[str, NDArray[Any]]]:
    """Each piece's columns as numpy arrays (zero-copy where there are no nulls), checked
    to fit the dtypes of ``blocks``; nulls take ``fill_null`` (or raise)."""
    ragged = {c for b in blocks if b.ragged for c in b.columns}
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
        for block in blocks:  # values that would not fit their dtype: an error
            check_block(arrays, block, where=where)
        yield arrays


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
        column = _filled(column, fill)
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks == 1:
            column = column.chunk(0)
        elif column.num_chunks == 0:
            return np.empty(0, dtype=column.type.to_pandas_dtype())
    return array_to_numpy(column)


def _filled(values: Any, fill: float) -> Any:
    """Arrow ``values`` with their nulls taken by ``fill``, in their own type, or in one
    that holds it (`tabloader.casting.holding`)."""
    kind = values.type
    wanted = holding(np.dtype(kind.to_pandas_dtype()), fill)
    if wanted != np.dtype(kind.to_pandas_dtype()):
        kind = pa.from_numpy_dtype(wanted)
        values = values.cast(kind)
    return pc.fill_null(values, pa.scalar(wanted.type(fill), type=kind))


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
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        lengths = np.diff(np.asarray(column.offsets))  # the slice's own, whatever its offset
        if column.null_count:
            # A null slot may still span values; flatten() leaves them out, so do the offsets.
            lengths[column.is_null().to_numpy(zero_copy_only=False)] = 0
        values: Any = column.flatten()  # the values of the non-null lists, offset applied
    else:  # fixed-size lists and list views, by their lengths (pyarrow's cast of a list
        # view to a list can make an invalid array): what the GPU's reader does too
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy()
        values = pc.list_flatten(column)
    offsets = np.zeros(len(column) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if values.null_count:
        if fill is None:
            raise NullValuesError(null_message(name, values.null_count, where + " (inside lists)"))
        values = _filled(values, fill)
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
        values = _filled(values, 0 if fill is None else fill)
    dense = array_to_numpy(values).reshape(rows, width)
    if null_rows is not None:
        if fill is None:
            raise NullValuesError(null_message(name, int(null_rows.sum()), where))
        dense = dense.astype(holding(dense.dtype, fill))  # a copy
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
    for start in range(0, n, INTERLEAVE_ROWS):
        stop = min(start + INTERLEAVE_ROWS, n)
        rows = out[start:stop]
        j = 0
        for array in arrays:
            j = put_column(rows, j, array[start:stop])


def put_column(rows: NDArray[Any], j: int, column: NDArray[Any]) -> int:
    """Write ``column`` (1-D, or a vector column's 2-D) into ``rows`` from place ``j``;
    the place after it."""
    if column.ndim == 1:
        rows[:, j] = column
        return j + 1
    stop = j + int(column.shape[1])
    rows[:, j:stop] = column
    return stop
