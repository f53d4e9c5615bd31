"""Emulated ``pylibcudf.io.parquet``: ``ParquetReaderOptions`` and ``read_parquet``.

Decoded on the host by pyarrow; the device buffers come from ``mr`` (else rmm's current
device resource) on the stream given (else the legacy default stream), and are written
there: libcudf allocates the table it returns from the resource it is given
(``read_parquet(options, stream, mr)`` in python/pylibcudf/pylibcudf/io/parquet.pyx),
never through cupy's allocator, whatever the calling thread set. The read waits on the
host for its stream before it returns, as libcudf's reader does. Requested columns a file
lacks are left out, as libcudf does unless told otherwise (``ignore_missing_columns``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__emulated__ = True

__all__ = ["ParquetReaderOptions", "ParquetReaderOptionsBuilder", "read_parquet"]


class ParquetReaderOptionsBuilder:
    def __init__(self, source: Any) -> None:
        self._options = ParquetReaderOptions(source)

    def use_pandas_metadata(self, value: bool) -> ParquetReaderOptionsBuilder:
        self._options._pandas_metadata = bool(value)
        return self

    def build(self) -> ParquetReaderOptions:
        return self._options


class ParquetReaderOptions:
    def __init__(self, source: Any) -> None:
        self.source = source
        self._columns: list[str] | None = None
        self._row_groups: list[list[int]] | None = None
        self._pandas_metadata = True

    @staticmethod
    def builder(source: Any) -> ParquetReaderOptionsBuilder:
        return ParquetReaderOptionsBuilder(source)

    def set_column_names(self, columns: list[str]) -> None:
        self._columns = list(columns)

    def set_columns(self, columns: list[str]) -> None:
        """Deprecated in cudf 26.10 (a FutureWarning there), as here."""
        import warnings

        warnings.warn(
            "set_columns is deprecated and will be removed in a future version of cudf. "
            "Use set_column_names instead.",
            FutureWarning,
            stacklevel=2,
        )
        self.set_column_names(columns)

    def set_row_groups(self, row_groups: list[list[int]]) -> None:
        self._row_groups = [list(g) for g in row_groups]


def _device_bytes(host: np.ndarray, stream: Any, mr: Any, cupy: Any) -> Any:
    """``host``'s bytes in a new rmm buffer from ``mr`` on ``stream``, copied there."""
    import rmm

    buffer = rmm.DeviceBuffer(size=host.nbytes, stream=stream, mr=mr)
    if not host.nbytes:
        return cupy.empty(0, dtype=np.uint8)
    memory = cupy.cuda.UnownedMemory(buffer.ptr, buffer.size, buffer, -1)
    out = cupy.ndarray((host.nbytes,), np.uint8, cupy.cuda.MemoryPointer(memory, 0))
    out.set(host.view(np.uint8).reshape(-1), stream=stream)
    return out


def _device_column(array: pa.Array, cupy: Any, stream: Any, mr: Any) -> Any:
    from .. import Column, DataType, TypeId, gpumemoryview

    kind = array.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
        raise NotImplementedError(f"the emulated pylibcudf reads fixed-width columns, not {kind}")
    zero = pa.scalar(False if pa.types.is_boolean(kind) else 0, kind)
    values = np.ascontiguousarray(array.fill_null(zero).to_numpy(zero_copy_only=False))
    data = _device_bytes(values, stream, mr, cupy)
    mask = None
    if array.null_count:
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        bits = np.packbits(valid, bitorder="little")
        padded = np.zeros(-(-len(bits) // 64) * 64, dtype=np.uint8)  # libcudf pads to 64 bytes
        padded[: len(bits)] = bits
        mask = gpumemoryview(_device_bytes(padded, stream, mr, cupy))
    # libcudf's types (pylibcudf.TypeId) have no 16-bit float
    if values.dtype == np.float16:
        raise NotImplementedError("libcudf has no type for 16-bit floats (no TypeId)")
    type_id = TypeId(np.dtype(values.dtype).name)
    return Column(
        DataType(type_id), len(array), gpumemoryview(data), mask, array.null_count, offset=0
    )


def read_parquet(options: ParquetReaderOptions, stream: Any = None, mr: Any = None) -> Any:
    import cupy

    from . import TableWithMetadata

    tables = []
    for i, path in enumerate(options.source.sources):
        file = pq.ParquetFile(path)
        names = options._columns or file.schema_arrow.names
        names = [n for n in names if n in file.schema_arrow.names]
        if options._row_groups is None:
            tables.append(file.read(columns=names, use_pandas_metadata=False))
        else:
            groups = options._row_groups[i]
            tables.append(file.read_row_groups(groups, columns=names, use_pandas_metadata=False))
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    on = cupy.cuda.Stream.null if stream is None else stream.obj
    columns = [_device_column(c.combine_chunks(), cupy, on, mr) for c in table.columns]
    order = getattr(cupy.cuda, "_order", None)
    if order is None:
        on.synchronize()
    else:  # libcudf's reader waits for its stream on the host while it reads
        order.host_wait(on._key(), inside="libcudf")
    return TableWithMetadata(columns, table.column_names)
