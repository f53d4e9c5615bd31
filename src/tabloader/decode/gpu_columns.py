"""The columns of a frame cudf or pylibcudf read, as the cupy arrays a chunk is laid out from.

A read frame's columns by name, each behind one small interface (`nulls_in`,
`to_device`, `to_ragged`): `CudfColumn` (a cudf Series), `PlcColumn` (a pylibcudf column
seen through cupy views of its buffers) and `ConstantColumn` (a partition key, or a
table column a file predates, made on the device only as delivered).
`complete_columns` renames and completes what files store into the requested columns,
`frame_columns` converts them (nulls filled or refused exactly as on the host, NaN kept),
and `assemble_frames` lays frames out as a chunk's blocks with one cast-and-copy kernel
per column.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tabloader.batches import Ragged, host_int
from tabloader.casting import holding
from tabloader.decode.host import null_message
from tabloader.errors import NullValuesError, ReadError

if TYPE_CHECKING:
    from tabloader.batches import Block, Segment
    from tabloader.partitioned import Partitioned

__all__ = [
    "ConstantColumn",
    "CudfColumn",
    "PlcColumn",
    "Undecodable",
    "as_cudf_lists",
    "assemble_frames",
    "complete_columns",
    "cudf_frame",
    "device_column",
    "device_list_column",
    "frame_columns",
]


def device_list_column(series: Any, name: str, fill: float | None, where: str, cupy: Any) -> Ragged:
    """A cudf list column as a `Ragged` of cupy arrays, as on the CPU: null lists
    are empty lists, nulls inside lists take ``fill`` (or raise)."""
    lengths = series.list.len().fillna(0).values
    offsets = cupy.zeros(len(lengths) + 1, dtype=np.int64)
    cupy.cumsum(lengths, out=offsets[1:])
    leaves = series.list.leaves
    values = device_column(leaves, name, fill, where + " (inside lists)", cupy)
    if len(values) != host_int(offsets[-1]):
        raise ReadError(
            f"the list column {name!r} in {where} has null lists that still span values; "
            "tabloader reads them as empty lists. Rewrite the file with empty lists for "
            "nulls (pyarrow does so), or read it with device='cpu'"
        )
    return Ragged(values, offsets)


def device_column(series: Any, name: str, fill: float | None, where: str, cupy: Any) -> Any:
    """One cudf column as a cupy array, nulls filled or refused exactly as on the CPU.

    The rule on both backends: nulls are filled, NaN and infinities are delivered as
    stored. pyarrow's ``fill_null`` touches nulls only, but cudf's ``fillna`` follows
    pandas and replaces NaN as well, so the NaN of a float column are put back where
    they were. ``series != series`` is true exactly there: a NaN is unequal to itself,
    and a comparison with a null is null, read as false.
    """
    nulls = int(series.null_count)
    if not nulls:
        return series.values
    if fill is None:
        raise NullValuesError(null_message(name, nulls, where))
    wanted = holding(series.dtype, fill)  # a file's narrower type may not hold it
    if wanted != series.dtype:
        series = series.astype(wanted)
    values = series.fillna(series.dtype.type(fill)).values
    if series.dtype.kind == "f":
        is_nan = (series != series).fillna(False).values
        values = cupy.where(is_nan, values.dtype.type("nan"), values)
    return values


class Undecodable(Exception):
    """cudf decoded a column as something else than the numbers it holds (a 16-bit float
    comes back as a list of bytes): the chunk is decoded on the host instead."""


class CudfColumn:
    """A column of a cudf DataFrame, as the reader uses it."""

    def __init__(self, series: Any, *, is_list: bool = False) -> None:
        self.series = series
        if not is_list and getattr(series.dtype, "kind", "") not in "iufb":
            raise Undecodable(f"{series.name!r} decoded as {series.dtype}")
        self.null_count = int(series.null_count)

    def nulls_in(self, start: int, stop: int) -> int:
        return int(self.series.iloc[start:stop].null_count)

    def to_device(self, name: str, fill: float | None, where: str, cupy: Any) -> Any:
        return device_column(self.series, name, fill, where, cupy)

    def to_ragged(self, name: str, fill: float | None, where: str, cupy: Any) -> Ragged:
        return device_list_column(self.series, name, fill, where, cupy)


_TYPE_NAMES = {"bool8": "bool"}  # libcudf's type ids that numpy spells otherwise


class PlcColumn:
    """A fixed-width pylibcudf column as cupy views of its buffers: values, and validity
    from its null mask (one bit a row, least significant first, as in Arrow)."""

    def __init__(self, column: Any, cupy: Any) -> None:
        self.column, self.cupy = column, cupy
        self.null_count = int(column.null_count())
        self.size, self.offset = int(column.size()), int(column.offset())
        type_name = str(column.type().id().name).lower()
        try:
            self.dtype = np.dtype(_TYPE_NAMES.get(type_name, type_name))
        except TypeError:
            raise NotImplementedError(f"no fixed-width reading of {type_name} columns") from None

    def values(self) -> Any:
        if not self.size:
            return self.cupy.empty(0, dtype=self.dtype)
        raw = self.cupy.asarray(self.column.data())  # bytes of the buffer, zero-copy
        nbytes = self.dtype.itemsize
        return raw[self.offset * nbytes : (self.offset + self.size) * nbytes].view(self.dtype)

    def valid(self, start: int, stop: int) -> Any:
        cupy = self.cupy
        bits = cupy.asarray(self.column.null_mask()).view(np.uint8)
        rows = cupy.arange(self.offset + start, self.offset + stop, dtype=np.int64)
        return ((bits[rows >> 3] >> (rows & 7).astype(np.uint8)) & 1).astype(bool)

    def nulls_in(self, start: int, stop: int) -> int:
        if not self.null_count:
            return 0
        return (stop - start) - host_int(self.valid(start, stop).sum())

    def to_device(self, name: str, fill: float | None, where: str, cupy: Any) -> Any:
        """The values, nulls replaced by ``fill`` (NaN left as stored: a NaN is a value)."""
        values = self.values()
        if not self.null_count:
            return values
        if fill is None:
            raise NullValuesError(null_message(name, self.null_count, where))
        values = values.astype(holding(values.dtype, fill), copy=False)
        return cupy.where(self.valid(0, self.size), values, values.dtype.type(fill))

    def to_ragged(self, name: str, fill: float | None, where: str, cupy: Any) -> Ragged:
        raise NotImplementedError("list columns are read through cudf")


def frame_columns(
    frame: Mapping[str, Any],
    columns: Sequence[str],
    lists: set[str],
    fill_null: Mapping[str, float],
    pieces: Sequence[tuple[int, int, int]],
    dataset: Partitioned,
    cupy: Any,
    vectors: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """A read frame's columns (``CudfColumn``/``PlcColumn`` by name) as device arrays,
    list columns as `Ragged`, vector columns (``vectors``: fixed-size lists, which cudf
    reads as lists) as ``[rows, k]``.

    Nulls are filled by ``fill_null``; a column without a fill value may hold nulls only
    in rows no piece delivers (a rank's share ending inside a row group), which are then
    filled with 0 and never delivered. Otherwise
    [`NullValuesError`][tabloader.errors.NullValuesError] names the row group of the first piece
    with nulls (``pieces``: ``(partition, start, stop)`` rows of this frame).
    """
    out: dict[str, Any] = {}
    where = dataset.describe_partition(pieces[0][0]) if pieces else "a chunk"
    if len(pieces) > 1:
        where += f" or one of {len(pieces) - 1} other row group(s)"
    for c in columns:
        column = frame.get(c)
        if column is None:
            raise ReadError(
                f"column {c!r} is missing from {where}: the file changed after the dataset "
                "was created. Create the Dataset again"
            )
        fill = fill_null.get(c)
        if fill is None and c not in lists and column.null_count:
            for partition, start, stop in pieces:
                nulls = column.nulls_in(start, stop)
                if nulls:
                    part = dataset.describe_partition(partition)
                    raise NullValuesError(null_message(c, nulls, part))
            fill = 0  # the nulls are in rows no piece delivers
        if c in lists:
            out[c] = column.to_ragged(c, fill, where, cupy)
        elif vectors and c in vectors:  # a null row is an empty list, made k fills
            ragged = column.to_ragged(c, fill, where, cupy)
            out[c] = ragged.to_dense(vectors[c], 0 if fill is None else fill, c)
        else:
            out[c] = column.to_device(c, fill, where, cupy)
    return out


class ConstantColumn:
    """A column every row of which holds one value (a partition key) or is null (a column
    added to a table after the file was written), made on the device only as delivered."""

    def __init__(self, values: Sequence[Any], rows: Sequence[int], kind: Any) -> None:
        self.values, self.rows, self.kind = list(values), list(rows), kind
        self.null_count = sum(n for v, n in zip(self.values, self.rows, strict=True) if v is None)

    def _runs(self, start: int, stop: int) -> Iterator[tuple[Any, int, int]]:
        at = 0
        for value, n in zip(self.values, self.rows, strict=True):
            lo, hi = max(start, at), min(stop, at + n)
            if lo < hi:
                yield value, lo, hi
            at += n

    def nulls_in(self, start: int, stop: int) -> int:
        return sum(hi - lo for value, lo, hi in self._runs(start, stop) if value is None)

    def to_device(self, name: str, fill: float | None, where: str, cupy: Any) -> Any:
        if self.null_count and fill is None:
            raise NullValuesError(null_message(name, self.null_count, where))
        rows = sum(self.rows)
        out = cupy.empty(rows, dtype=np.dtype(self.kind.to_pandas_dtype()))
        for value, lo, hi in self._runs(0, rows):
            out[lo:hi] = fill if value is None else value
        return out

    def to_ragged(self, name: str, fill: float | None, where: str, cupy: Any) -> Ragged:
        raise ReadError(f"{name!r} is not a list column in {where}")


def complete_columns(
    frame: dict[str, Any],
    how: Sequence[Any],
    file_rows: Sequence[int],
    columns: Sequence[str],
    where: str = "the file read",
) -> dict[str, Any]:
    """The columns read from files (their stored names, file after file; ``how`` holds
    each file's `FileColumns`) as the requested
    ``columns``: renamed, constant ones (partition keys, columns a file predates) added.
    A column neither read nor constant raises [`ReadError`][tabloader.errors.ReadError]
    naming ``where``."""
    first = how[0]
    if all(h.plain for h in how):
        return frame
    stored = {first.rename.get(name, name): name for name in first.read}
    out = {}
    for c in columns:
        if c in first.constants:
            values = [h.constants.get(c) for h in how]
            out[c] = ConstantColumn(values, file_rows, first.types[c])
        elif c in stored and stored[c] in frame:
            out[c] = frame[stored[c]]
        else:
            name = stored.get(c, c)
            also = f" (stored as {name!r})" if name != c else ""
            raise ReadError(
                f"column {c!r}{also} is missing from {where}: the file changed after the "
                "dataset was created, or its table's metadata no longer matches it. Create "
                "the Dataset again"
            )
    return out


def as_cudf_lists(table: Any) -> Any:
    """``table`` (Arrow) with its fixed-size list and list view columns as list columns,
    whose null rows hold no values: what cudf reads from parquet, and what its Arrow
    interop takes (libcudf has neither a fixed-size list type nor list views)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for i, field in enumerate(table.schema):
        kind = field.type
        views = pa.types.is_list_view(kind) or pa.types.is_large_list_view(kind)
        if pa.types.is_fixed_size_list(kind) or views:
            array: Any = table.column(i).combine_chunks()
            lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy()
            offsets = np.zeros(len(array) + 1, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            mask = array.is_null() if array.null_count else None
            starts: Any = pa.array(offsets)
            lists = pa.ListArray.from_arrays(starts, array.flatten(), mask=mask)
            table = table.set_column(i, field.name, lists)
    return table


def cudf_frame(frame: Any, lists: set[str]) -> dict[str, CudfColumn]:
    return {name: CudfColumn(frame[name], is_list=name in lists) for name in frame.columns}


def assemble_frames(
    frames: Sequence[Mapping[str, Any]], blocks: Sequence[Block], xp: Any
) -> Segment:
    """The frames' columns laid out as the blocks, cast to their dtypes, frame after frame.

    Row-major blocks (``[rows, k]``, the stacked layout) and column-major ones (each
    column contiguous, columns of one dtype side by side) take one cast-and-copy kernel
    per column and frame; list columns are joined. The reader has checked that the values
    fit the blocks' dtypes (`tabloader.casting.check_block`). Uses only ``xp.empty`` and slice
    assignment, so numpy runs exactly the code cupy runs.

    Examples:
        >>> from tabloader.batches import Block
        >>> blocks = [Block("<int64>", ("a", "b"), np.dtype("int64"), column_major=True)]
        >>> frames = [{"a": np.arange(2), "b": np.arange(2) * 10}, {"a": np.array([7]),
        ...            "b": np.array([70])}]
        >>> segment = assemble_frames(frames, blocks, np)
        >>> segment["<int64>"].tolist(), segment["<int64>"][:, 1].flags.c_contiguous
        ([[0, 0], [1, 10], [7, 70]], True)
    """
    rows = sum(len(next(iter(f.values()))) for f in frames)
    segment: Segment = {}
    for b in blocks:
        if b.ragged:
            # each frame's values cast first: files that store the column with other
            # types (uint64 and int32) would concatenate to float64 and round
            segment[b.name] = Ragged.concatenate(
                [
                    Ragged(part.values.astype(b.dtype, copy=False), part.offsets)
                    for part in (f[b.columns[0]] for f in frames)
                ]
            )
            continue
        k = b.width
        if b.column_major:
            out = xp.empty((k, rows), dtype=b.dtype).T
        else:
            out = xp.empty((rows, k), dtype=b.dtype)
        offset = 0
        for frame in frames:
            n = len(frame[b.columns[0]])
            for column, j, stop in b.spans():  # (a vector column takes k places)
                place = j if stop == j + 1 and frame[column].ndim == 1 else slice(j, stop)
                out[offset : offset + n, place] = frame[column]  # one cast-and-copy kernel
            offset += n
        segment[b.name] = out
    return segment
