"""In-memory tables as a source: a ``pyarrow.Table``, a pandas or a polars DataFrame.

The table is split into partitions of ``rows_per_partition`` rows, read as zero-copy
slices. It has no footers, so null flags and value ranges come from the data itself,
computed when asked (once, at construction).

Examples:
    >>> import pyarrow as pa
    >>> source = TableSource(pa.table({"x": [1, None, 3]}), rows_per_partition=2)
    >>> source.rows.tolist(), source.null_flags("x").tolist(), source.value_ranges("x")
    ([2, 1], [1, 0], [(1, 1), (3, 3)])
"""

from __future__ import annotations

import hashlib
import io
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabloader.columns import is_list_type
from tabloader.sources.base import Source

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["TableSource", "is_pandas_frame", "is_polars_frame", "table_of"]


def is_pandas_frame(obj: object) -> bool:
    return type(obj).__module__.startswith("pandas") and hasattr(obj, "columns")


def is_polars_frame(obj: object) -> bool:
    return type(obj).__module__.startswith("polars") and hasattr(obj, "collect_schema")


def table_of(frame: Any) -> pa.Table:
    """A ``pyarrow.Table``, pandas or polars DataFrame (or LazyFrame, collected) as Arrow:
    polars hands its buffers over without copying them where their layout is Arrow's
    (numeric columns)."""
    if isinstance(frame, pa.Table):
        return frame
    if is_pandas_frame(frame):
        return pa.Table.from_pandas(frame, preserve_index=False)
    if hasattr(frame, "collect") and not hasattr(frame, "to_arrow"):
        frame = frame.collect()
    table: pa.Table = frame.to_arrow()
    return table


class TableSource(Source):
    """An Arrow table in partitions of ``rows_per_partition`` rows."""

    kind = "table"

    def __init__(self, table: pa.Table, rows_per_partition: int) -> None:
        self.table = table.combine_chunks() if table.num_rows else table
        n = table.num_rows
        self.starts = np.arange(0, n, rows_per_partition, dtype=np.int64)
        self.rows = np.minimum(rows_per_partition, n - self.starts).astype(np.int64)
        self.schemas = [table.schema.remove_metadata()]
        self.files = []
        self._content: str | None = None

    def content_digest(self) -> str:
        """A hash of every value of the table (its Arrow IPC stream, which holds the
        sliced buffers only), computed once: about a second a gigabyte."""
        if self._content is None:
            sink = _HashSink()
            table = self.table.replace_schema_metadata(None)
            with pa.PythonFile(sink, mode="w") as out, pa.ipc.new_stream(out, table.schema) as w:
                w.write_table(table)
            self._content = sink.hash.hexdigest()
        return self._content

    def describe(self, index: int) -> str:
        start = int(self.starts[index])
        return f"in-memory table (rows {start}..{start + int(self.rows[index])})"

    def schema_owner(self, schema_index: int) -> str:
        return "the in-memory table"

    def read(self, index: int, columns: list[str]) -> pa.Table:
        return self.table.slice(int(self.starts[index]), int(self.rows[index])).select(columns)

    def null_flags(self, column: str) -> NDArray[np.int8]:
        if column not in self.table.column_names:
            return super().null_flags(column)
        chunk = self.table.column(column)
        flags = np.empty(len(self.rows), dtype=np.int8)
        for p in range(len(self.rows)):
            part = chunk.slice(int(self.starts[p]), int(self.rows[p]))
            flags[p] = 1 if part.null_count else 0
        return flags

    def value_ranges(self, column: str) -> list[tuple[Any, Any] | None]:
        if column not in self.table.column_names:
            return super().value_ranges(column)
        whole: Any = self.table.column(column).combine_chunks()
        ranges: list[tuple[Any, Any] | None] = []
        for p in range(len(self.rows)):
            part = whole.slice(int(self.starts[p]), int(self.rows[p]))
            values = pc.list_flatten(part) if is_list_type(part.type) else part
            extremes = pc.min_max(values)
            low, high = extremes["min"].as_py(), extremes["max"].as_py()
            ranges.append(None if low is None else (low, high))
        return ranges


class _HashSink(io.RawIOBase):
    """A writable file that only hashes what is written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.hash = hashlib.blake2b(digest_size=16)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.hash.update(data)
        return len(data)
