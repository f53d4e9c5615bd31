"""Emulated cudf: parquet decoded on the host by pyarrow, columns moved to the device.

Columns are arrays of whichever ``cupy`` imports (the emulated one, or the real one on a
GPU host without cudf), created with ``cupy.asarray`` from the decoded host arrays, in
memory from rmm's current device resource on the legacy default stream, whatever
allocator cupy's calling thread uses: libcudf allocates its columns from rmm
(``rmm::mr::get_current_device_resource``), never through cupy. Reading a file waits on
the host for its stream, as libcudf's reader does. Only the API subset tabloader uses
is here; each rule that decides correctness cites the real library.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import cupy
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from rmm.allocators.cupy import rmm_cupy_allocator

__emulated__ = True
__version__ = "26.10-emulated"

__all__ = ["DataFrame", "Series", "from_pandas", "read_parquet"]

# Importing cudf routes every cupy allocation through rmm: cudf's __init__ ends with
# cupy.cuda.set_allocator(rmm_cupy_allocator) (rapidsai/cudf python/cudf/cudf/__init__.py).
# With rmm's default CudaMemoryResource, every array is then one cudaMalloc and cudaFree.
cupy.cuda.set_allocator(rmm_cupy_allocator)

_emulation_stats = {"remote_reads": 0, "remote_bytes": 0}  # whole objects read via fsspec

F = TypeVar("F", bound=Callable[..., Any])


def _on_default_stream(func: F) -> F:
    """Run ``func``'s device work on the legacy default stream, its memory from rmm's
    current resource, whatever cupy's current stream and allocator are: cudf issues
    libcudf's kernels on ``cudf.get_default_stream()`` (the legacy default stream unless
    libcudf was built for per-thread streams), never on cupy's, and libcudf allocates
    from rmm directly, not through cupy's allocator."""

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        with cupy.cuda.Stream.null, cupy.cuda.using_allocator(rmm_cupy_allocator):
            return func(*args, **kwargs)

    return run  # type: ignore[return-value]


class _ListMethods:
    """``Series.list``: the public accessors of a list column (cudf ListMethods)."""

    def __init__(self, series: Series) -> None:
        if series._offsets is None:
            raise AttributeError("Can only use .list accessor with a 'list' dtype")
        self._s = series

    @property
    @_on_default_stream
    def leaves(self) -> Series:
        """The flat values of all lists, in order (cudf ``Series.list.leaves``)."""
        child = self._s._child
        assert child is not None
        offsets = self._s._offsets
        first, last = offsets[0:1].get()[0], offsets[-1:].get()[0]
        return child.iloc[int(first) : int(last)]

    @_on_default_stream
    def len(self) -> Series:
        """The length of each list, int32 (cudf ``Series.list.len``)."""
        offsets = self._s._offsets
        return Series(offsets[1:] - offsets[:-1], name=self._s.name)


class _ILoc:
    def __init__(self, owner: Any) -> None:
        self._owner = owner

    def __getitem__(self, key: slice) -> Any:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("the emulated cudf supports only iloc[start:stop]")
        start, stop, _ = key.indices(len(self._owner))
        return self._owner._slice(start, max(start, stop))


class Series:
    """One column: device values (``_data``), a validity mask (``_valid``, None: no nulls).

    A list column keeps int32 ``_offsets`` and a child Series instead of values; a
    column of another type (strings, the categories of hive partitions) keeps its Arrow
    array on the host, since tabloader never delivers them.
    """

    def __init__(
        self, data: Any = None, dtype: Any = None, name: Any = None, nan_as_null: bool = True
    ) -> None:
        self.name = name
        self._data: Any = None
        self._valid: Any = None
        self._offsets: Any = None
        self._child: Series | None = None
        self._arrow: pa.Array | None = None
        if isinstance(data, cupy.ndarray):
            self._data = data if dtype is None else data.astype(dtype)
            return
        # Host data: NaN becomes null unless nan_as_null=False, as in cudf.Series
        # (https://docs.rapids.ai/api/cudf/stable/user_guide/missing-data/).
        array = pa.array(np.asarray(data) if data is not None else [], from_pandas=nan_as_null)
        if dtype is not None:
            array = array.cast(pa.from_numpy_dtype(np.dtype(dtype)))
        self._init_arrow(array)

    @classmethod
    @_on_default_stream
    def _from_arrow(cls, array: pa.Array | pa.ChunkedArray, name: Any) -> Series:
        out = cls.__new__(cls)
        out.name = name
        out._init_arrow(array)
        return out

    def _init_arrow(self, array: pa.Array | pa.ChunkedArray) -> None:
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        kind = array.type
        self._data = self._valid = self._offsets = self._child = self._arrow = None
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            # Arrow keeps NaN and null apart, and so does cudf when it reads parquet.
            self._offsets = cupy.asarray(array.offsets.to_numpy().astype(np.int32))
            self._child = Series._from_arrow(array.values, None)
            if array.null_count:
                self._valid = cupy.asarray(array.is_valid().to_numpy(zero_copy_only=False))
        elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
            values = array.fill_null(pa.scalar(False if pa.types.is_boolean(kind) else 0, kind))
            self._data = cupy.asarray(values.to_numpy(zero_copy_only=False))
            if array.null_count:
                self._valid = cupy.asarray(array.is_valid().to_numpy(zero_copy_only=False))
        else:
            self._arrow = array

    # -- shape, type and nulls ---------------------------------------------------------------
    ndim = 1

    def __iter__(self) -> Any:
        # cudf refuses to iterate a Series (frame.py, Frame.__iter__): "... object is not
        # iterable. Consider using `.to_arrow()`, `.to_pandas()` or `.values_host`"
        raise TypeError(
            f"{type(self).__name__} object is not iterable. Consider using `.to_arrow()`, "
            "`.to_pandas()` or `.values_host` if you wish to iterate over the values."
        )

    def __len__(self) -> int:
        if self._arrow is not None:
            return len(self._arrow)
        if self._offsets is not None:
            return len(self._offsets) - 1
        return len(self._data)

    @property
    def dtype(self) -> Any:
        if self._data is not None:
            return self._data.dtype
        if self._offsets is not None:
            return pd.ArrowDtype(pa.list_(pa.from_numpy_dtype(self._child.dtype)))
        if pa.types.is_dictionary(self._arrow.type):
            return pd.CategoricalDtype()
        return np.dtype(object)

    @property
    @_on_default_stream
    def null_count(self) -> int:
        """Nulls only: a NaN is a value, not a null (cudf ColumnBase.null_count)."""
        if self._arrow is not None:
            return int(self._arrow.null_count)
        if self._valid is None:
            return 0
        return len(self) - int(self._valid.sum().get())

    @property
    def has_nulls(self) -> bool:
        return self.null_count > 0

    def _nan(self) -> Any:
        """Where the values are NaN (floats only), or None."""
        if self._data is not None and self._data.dtype.kind == "f":
            return cupy.isnan(self._data)
        return None

    @_on_default_stream
    def isnull(self) -> Series:
        """Nulls, and NaN in a float column (cudf ColumnBase.isnull: "Need to consider
        `np.nan` values in case of a float column", python/cudf/cudf/core/column/column.py)."""
        if self._data is None:
            raise NotImplementedError("the emulated cudf has isnull() for numeric columns")
        missing = cupy.zeros(len(self), dtype=bool) if self._valid is None else ~self._valid
        nan = self._nan()
        return Series(missing if nan is None else (missing | nan), name=self.name)

    isna = isnull

    def notnull(self) -> Series:
        return Series(~self.isnull()._data, name=self.name)

    notna = notnull

    @_on_default_stream
    @_on_default_stream
    def astype(self, dtype: Any) -> Series:
        """A copy cast to ``dtype``, nulls kept (cudf.Series.astype,
        https://docs.rapids.ai/api/cudf/stable/user_guide/api_docs/api/cudf.series.astype;
        numeric columns only here)."""
        if self._data is None:
            raise NotImplementedError("the emulated cudf has astype() for numeric columns")
        out = Series(self._data.astype(dtype), name=self.name)
        out._valid = self._valid
        return out

    def fillna(self, value: Any) -> Series:
        """A copy with nulls, and NaN of a float column, replaced by ``value``.

        cudf's ColumnBase.fillna returns early only if there are neither nulls nor NaN
        (``has_nulls(include_nan=True)``), then turns NaN into nulls (``nans_to_nulls``)
        before replacing the nulls (python/cudf/cudf/core/column/column.py), so fillna
        replaces NaN too, although its documentation speaks of nulls only
        (https://docs.rapids.ai/api/cudf/stable/user_guide/api_docs/api/cudf.series.fillna).
        """
        if self._data is None:
            raise NotImplementedError("the emulated cudf has fillna() for numeric columns")
        fill = self.isnull()._data
        data = cupy.where(fill, self._data.dtype.type(value), self._data)
        return Series(data, name=self.name)

    # -- comparisons ---------------------------------------------------------------------------
    @_on_default_stream
    def _compare(self, other: Any, op: Any) -> Series:
        """Element-wise comparison with nulls propagated: a null operand gives a null
        result, and NaN compares as IEEE 754 says (unequal to everything, itself
        included), as libcudf's binary operations do (cudf "Working with missing data":
        "null values propagate through arithmetic and comparison operations")."""
        if self._data is None:
            raise NotImplementedError("the emulated cudf compares numeric columns only")
        if isinstance(other, Series):
            values, valid = other._data, other._valid
        else:
            values, valid = other, None
        out = Series(op(self._data, values), name=self.name)
        masks = [m for m in (self._valid, valid) if m is not None]
        if masks:
            out._valid = masks[0] if len(masks) == 1 else masks[0] & masks[1]
        return out

    def __eq__(self, other: object) -> Series:  # type: ignore[override]
        return self._compare(other, lambda a, b: a == b)

    def __ne__(self, other: object) -> Series:  # type: ignore[override]
        return self._compare(other, lambda a, b: a != b)

    __hash__ = None  # type: ignore[assignment]

    # -- device and host views ------------------------------------------------------------------
    @property
    def values(self) -> Any:
        """The column as a cupy array, zero-copy; refused with nulls (cudf ColumnBase.values
        raises ValueError "Column must have no nulls."; NaN is not a null)."""
        if self._offsets is not None:  # cudf: ColumnBase.values of a list column
            raise NotImplementedError(f"CuPy does not support {self.dtype}")
        if self._data is None:
            raise NotImplementedError("the emulated cudf has .values for numeric columns")
        if self.has_nulls:
            raise ValueError("Column must have no nulls.")
        return self._data

    @property
    def values_host(self) -> np.ndarray:
        return self.values.get()

    @_on_default_stream
    def to_cupy(self, dtype: Any = None, copy: bool = True, na_value: Any = None) -> Any:
        """A cupy array; nulls need ``na_value`` (cudf raises "Column must have no nulls.")."""
        series = self if na_value is None or not self.has_nulls else self._fill_nulls(na_value)
        out = series.values
        if dtype is not None and np.dtype(dtype) != out.dtype:
            return out.astype(dtype)
        return out.copy() if copy else out

    def _fill_nulls(self, value: Any) -> Series:
        return Series(cupy.where(self._valid, self._data, self._data.dtype.type(value)))

    def to_numpy(self, dtype: Any = None, copy: bool = True, na_value: Any = None) -> np.ndarray:
        return self.to_cupy(dtype=dtype, copy=False, na_value=na_value).get()

    def to_arrow(self) -> pa.Array:
        if self._arrow is not None:
            return self._arrow
        if self._offsets is not None:
            mask = None if self._valid is None else ~self._valid.get()
            return pa.ListArray.from_arrays(
                self._offsets.get(),
                self._child.to_arrow(),
                mask=pa.array(mask) if mask is not None else None,
            )
        mask = None if self._valid is None else ~self._valid.get()
        return pa.array(self._data.get(), mask=mask)

    def to_pandas(self) -> pd.Series:
        return pd.Series(self.to_arrow().to_pandas(), name=self.name)

    def __repr__(self) -> str:
        return f"emulated cudf {self.to_pandas()!r}"

    # -- slicing -------------------------------------------------------------------------------
    @property
    def iloc(self) -> _ILoc:
        return _ILoc(self)

    def _slice(self, start: int, stop: int) -> Series:
        out = Series.__new__(Series)
        out.name, out._arrow, out._child = self.name, None, self._child
        out._data = None if self._data is None else self._data[start:stop]
        out._valid = None if self._valid is None else self._valid[start:stop]
        out._offsets = None if self._offsets is None else self._offsets[start : stop + 1]
        if self._arrow is not None:
            out._arrow = self._arrow.slice(start, stop - start)
        return out

    @property
    def list(self) -> _ListMethods:
        return _ListMethods(self)


class DataFrame:
    """Named columns of equal length, in order."""

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self._columns: dict[str, Series] = {}
        for name, column in (data or {}).items():
            series = column if isinstance(column, Series) else Series(column)
            series.name = name
            self._columns[name] = series

    @classmethod
    @_on_default_stream
    def from_arrow(cls, table: pa.Table) -> DataFrame:
        """Columns copied to the device; NaN and null stay distinct, as in Arrow.

        An Arrow ``FixedSizeList`` is refused: libcudf has no fixed-size list type, and
        its Arrow interop had no path for one (rapidsai/cudf issue 23545, "Support Arrow
        FixedSizeList in libcudf interop"); nor has it list views. Callers convert such
        columns to lists.
        """
        for field in table.schema:
            if pa.types.is_fixed_size_list(field.type) or _is_view(field.type):
                raise TypeError(
                    f"Unsupported type_id conversion to cudf: column {field.name!r} is {field.type}"
                )
        out = cls()
        for name, column in zip(table.column_names, table.columns, strict=True):
            out._columns[name] = Series._from_arrow(column, name)
        return out

    @property
    def columns(self) -> pd.Index:
        return pd.Index(list(self._columns))

    @property
    def dtypes(self) -> pd.Series:
        return pd.Series({name: s.dtype for name, s in self._columns.items()}, dtype=object)

    def __len__(self) -> int:
        return len(next(iter(self._columns.values()))) if self._columns else 0

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, list):
            return DataFrame({name: self._columns[name] for name in key})
        return self._columns[key]

    def __contains__(self, name: object) -> bool:
        return name in self._columns

    def __iter__(self) -> Any:
        return iter(self._columns)  # the column names, as pandas and cudf do

    @property
    def iloc(self) -> _ILoc:
        return _ILoc(self)

    def _slice(self, start: int, stop: int) -> DataFrame:
        return DataFrame({n: s._slice(start, stop) for n, s in self._columns.items()})

    ndim = 2

    @property
    def shape(self) -> tuple[int, int]:
        return len(self), len(self._columns)

    @property
    def index(self) -> pd.RangeIndex:
        # cudf: a cudf.RangeIndex, 0..len-1 for a frame read from parquet; the emulation
        # keeps no index of its own, so it is that range, as a pandas one.
        return pd.RangeIndex(len(self))

    def head(self, n: int = 5) -> DataFrame:
        return self._slice(0, min(n, len(self)))

    # What makes dask take a frame for a DataFrame (dask/utils.py is_dataframe_like: the
    # class has groupby, head, merge and mean). cudf has them; the emulation computes none.
    def groupby(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("emulated cudf: DataFrame.groupby is not emulated")

    def merge(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("emulated cudf: DataFrame.merge is not emulated")

    def mean(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("emulated cudf: DataFrame.mean is not emulated")

    def to_arrow(self) -> pa.Table:
        return pa.table({name: s.to_arrow() for name, s in self._columns.items()})

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame({name: s.to_pandas() for name, s in self._columns.items()})

    def __repr__(self) -> str:
        return f"emulated cudf {self.to_pandas()!r}"


def concat(objs: Sequence[Any], axis: int = 0, ignore_index: bool = False) -> Any:
    """Frames one after the other (axis 0), as new device memory."""
    objs = list(objs)
    if axis != 0 or not objs:
        raise NotImplementedError("emulated cudf: concat along axis 0 of at least one frame")
    if isinstance(objs[0], Series):
        return Series._from_arrow(pa.chunked_array([o.to_arrow() for o in objs]), objs[0].name)
    return DataFrame.from_arrow(pa.concat_tables([o.to_arrow() for o in objs]))


def from_pandas(frame: pd.DataFrame | pd.Series, nan_as_null: bool = True) -> Any:
    """A device copy of a pandas frame; NaN of float columns becomes null by default."""
    if isinstance(frame, pd.Series):
        return Series._from_arrow(pa.array(frame, from_pandas=nan_as_null), frame.name)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if not nan_as_null:
        table = pa.table({c: pa.array(frame[c].to_numpy()) for c in frame.columns})
    return DataFrame.from_arrow(table)


# -- reading parquet -------------------------------------------------------------------------------

_HIVE = re.compile(r"^([^=/]+)=([^/]*)$")


def _is_local(filesystem: Any) -> bool:
    try:
        from fsspec.implementations.local import LocalFileSystem
    except ImportError:
        return False
    return isinstance(filesystem, LocalFileSystem)


_BYTES_PER_THREAD = 256 * 2**20  # cudf/utils/ioutils.py _BYTES_PER_THREAD_DEFAULT


def _file_like(source: Any, bytes_per_thread: int | None) -> Any:
    """A file-like source goes through cudf's ``_fsspec_data_transfer``
    (cudf/utils/ioutils.py), which compares ``bytes_per_thread >= path_or_fob.size``:
    ``size`` must be a number (a method raises TypeError there). Up to that size the
    object is read whole with ``read()``; beyond it, cudf reads byte ranges from several
    threads seeking the one handle, which this emulation refuses (it corrupts bytes of a
    handle that is not safe to share)."""
    per_thread = _BYTES_PER_THREAD if bytes_per_thread is None else int(bytes_per_thread)
    size = source.size
    if per_thread >= size:
        source.seek(0)
        data = source.read()
        _emulation_stats["remote_reads"] += 1
        _emulation_stats["remote_bytes"] += len(data)
        return pa.BufferReader(data)
    raise RuntimeError(
        "emulated cudf: a file-like object larger than bytes_per_thread would be read by "
        "several threads seeking one handle"
    )


def _open(source: Any, filesystem: Any, bytes_per_thread: int | None = None) -> Any:
    if isinstance(source, bytes):
        return pa.BufferReader(source)
    if not isinstance(source, (str, os.PathLike)):
        return _file_like(source, bytes_per_thread)
    if filesystem is None or _is_local(filesystem):
        # a local fsspec filesystem is read by path (cudf/utils/ioutils.py
        # _is_local_filesystem: isinstance(fs, LocalFileSystem))
        return os.fspath(source)
    # A remote file is transferred whole into host memory before decoding
    # (cudf/utils/ioutils.py _fsspec_data_transfer: fs.open(path).read() when the file
    # fits the per-thread transfer size, else every byte range of it).
    with filesystem.open(os.fspath(source), "rb") as f:
        data = f.read()
    _emulation_stats["remote_reads"] += 1
    _emulation_stats["remote_bytes"] += len(data)
    return pa.BufferReader(data)


def _hive_keys(source: Any) -> list[tuple[str, str]]:
    if not isinstance(source, (str, os.PathLike)):
        return []
    parts = os.fspath(source).replace("\\", "/").split("/")[:-1]
    return [m.groups() for p in parts if (m := _HIVE.match(p))]  # type: ignore[misc]


@_on_default_stream
def _is_view(kind: pa.DataType) -> bool:
    return bool(pa.types.is_list_view(kind) or pa.types.is_large_list_view(kind))


def _as_list(column: pa.ChunkedArray) -> pa.Array:
    """A fixed-size list (or list view) column as a list column whose null rows hold no
    values."""
    array = column.combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy()
    offsets = np.zeros(len(array) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    mask = array.is_null() if array.null_count else None
    return pa.ListArray.from_arrays(pa.array(offsets), array.flatten(), mask=mask)


def read_parquet(
    filepath_or_buffer: Any,
    columns: Sequence[str] | None = None,
    row_groups: Sequence[Sequence[int]] | None = None,
    filesystem: Any = None,
    use_pandas_metadata: bool = True,
    categorical_partitions: bool = True,
    bytes_per_thread: int | None = None,
    dataset_kwargs: dict[str, Any] | None = None,
    ignore_missing_columns: bool = True,
    **kwargs: Any,
) -> DataFrame:
    """Read parquet files (paths, or file-like objects) into one DataFrame.

    ``row_groups`` holds one list of row-group indices per file. NaN stays NaN and null
    stays null: parquet keeps them apart, and cudf reads both as they are. Directories
    named ``key=value`` in a file's path add those keys as columns after the read ones,
    categorical by default (``categorical_partitions=True``; cudf reads hive partitions:
    https://docs.rapids.ai/api/cudf/stable/user_guide/api_docs/api/cudf.read_parquet).
    Requested columns missing from a file are left out without a word
    (``ignore_missing_columns=True``, the default of cudf 26.10's read_parquet); with
    False they raise. ``dataset_kwargs`` (pyarrow dataset options, e.g. partitioning) is
    accepted; hive keys are added unless ``dataset_kwargs={"partitioning": None}``.
    """
    sources = (
        list(filepath_or_buffer)
        if isinstance(filepath_or_buffer, (list, tuple))
        else [filepath_or_buffer]
    )
    if row_groups is not None and len(row_groups) != len(sources):
        raise ValueError("row_groups must hold one list of row groups per file")
    tables = []
    for i, source in enumerate(sources):
        file = pq.ParquetFile(_open(source, filesystem, bytes_per_thread))
        stored = file.schema_arrow.names
        names = (
            list(columns)
            if columns is not None
            else [n for n in stored if not n.startswith("__index_level_")]
        )
        missing = [n for n in names if n not in stored]
        if missing and not ignore_missing_columns:
            raise ValueError(f"column(s) {missing} not found in the parquet file")
        names = [n for n in names if n in stored]
        if row_groups is None:
            table = file.read(columns=names, use_pandas_metadata=False)
        else:
            table = file.read_row_groups(
                list(row_groups[i]), columns=names, use_pandas_metadata=False
            )
        hive = dataset_kwargs is None or dataset_kwargs.get("partitioning", "hive") is not None
        for key, value in _hive_keys(source) if hive else []:
            if key not in table.column_names:
                column = pa.array([value] * len(table), pa.string())
                table = table.append_column(
                    key, column.dictionary_encode() if categorical_partitions else column
                )
        tables.append(table)
    table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    for i, field in enumerate(table.schema):
        if pa.types.is_fixed_size_list(field.type) or _is_view(field.type):
            # A fixed_size_list (or a list view) is stored in parquet as a LIST, and
            # cudf's reader reads a LIST as a list column (libcudf has neither type);
            # parquet stores no values under a null list, so a null row spans none.
            table = table.set_column(i, field.name, _as_list(table.column(i)))
        if pa.types.is_float16(field.type):
            # Seen on a GPU (cudf 26.10): a parquet FLOAT16 column (FIXED_LEN_BYTE_ARRAY of
            # 2 bytes) comes back as a list column, whose .values raises NotImplementedError
            # "CuPy does not support list": here, its bytes as a list<uint8> per row.
            raw = table.column(i).combine_chunks()
            data = np.frombuffer(raw.buffers()[1], np.uint8)[
                raw.offset * 2 : (raw.offset + len(raw)) * 2
            ]
            offsets = np.arange(0, 2 * len(raw) + 1, 2, dtype=np.int32)
            as_bytes = pa.ListArray.from_arrays(pa.array(offsets), pa.array(data, pa.uint8()))
            table = table.set_column(i, field.name, as_bytes)
    frame = DataFrame.from_arrow(table)
    _reader_waits(cupy.cuda.Stream.null)
    return frame


def _reader_waits(stream: Any) -> None:
    """libcudf's parquet reader waits on the host for its stream while it reads (it copies
    page and row counts back to size its output): a host wait inside libcudf."""
    order = getattr(cupy.cuda, "_order", None)
    if order is None:
        stream.synchronize()
        return
    order.host_wait(stream._key(), inside="libcudf")
