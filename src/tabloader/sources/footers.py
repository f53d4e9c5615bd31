"""Footer statistics: what a parquet footer says about a column in each row group.

A footer records, per row group and leaf column, how many values are stored, how many
are null, and the smallest and largest value. Everything tabloader learns from them is
read here, once: the loader's null check (`Source.null_flags`), the dtype check of
values at construction (`Source.value_ranges`), the ids an embedding table needs
(`tabloader.columns.id_ranges`) and ``tabloader inspect``'s null counts all start from
`ColumnStats`, one per partition, built by `column_stats`.

Examples:
    >>> import io, pyarrow as pa, pyarrow.parquet as pq
    >>> sink = io.BytesIO()
    >>> pq.write_table(pa.table({"a": [3, None, 1], "b": [[5], [2, 9], None]}), sink)
    >>> md = pq.read_metadata(io.BytesIO(sink.getvalue()))
    >>> a = column_stats(md, 0, column_leaves(md, "a"))
    >>> (a.nulls, a.low, a.high, a.nested)
    (1, 1, 3, False)
    >>> b = column_stats(md, 0, column_leaves(md, "b"))
    >>> (b.low, b.high, b.nested)
    (2, 9, True)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    import pyarrow.parquet as pq

__all__ = ["ColumnStats", "Leaves", "column_leaves", "column_stats", "constant_stats", "digest"]

Leaves = tuple[int, int, bool]
"""A column's leaf columns in a footer: the first leaf's index, how many, and whether the
column is nested (a list's values, a struct's fields) rather than a leaf itself."""


@dataclass(frozen=True)
class ColumnStats:
    """One column in one partition (row group), as its footer records it.

    Attributes:
        nulls: Null values, None where the footer does not say. For a nested column,
            the nulls of its leaves (of the values inside lists, and the null lists).
        low: The smallest value, None where the footer does not say (or says it in a
            form that is not a number, such as a 16-bit float's raw bytes).
        high: The largest value, as ``low``.
        values: Values stored (of a nested column: of its leaves).
        nested: Whether the column is a list or struct, whose ``nulls`` are not its rows'.
        constant: Whether the column is not stored but constant in the file (a partition
            key, or null for a table column the file predates): its value is left to the
            data, so ``low`` and ``high`` are None.
    """

    nulls: int | None
    low: Any
    high: Any
    values: int
    nested: bool = False
    constant: bool = False

    @property
    def extremes(self) -> tuple[Any, Any] | None:
        """``(low, high)``, or None where the footer does not say."""
        return None if self.low is None or self.high is None else (self.low, self.high)


def _leaf_count(arrow_type: pa.DataType) -> int:
    """How many parquet leaf columns an Arrow type is stored as."""
    count = getattr(arrow_type, "num_fields", 0)
    if not count:
        return 1
    return sum(_leaf_count(arrow_type.field(i).type) for i in range(count))


def column_leaves(metadata: pq.FileMetaData, column: str) -> Leaves | None:
    """Where the footer keeps ``column`` (a name the file stores): its leaves, or None when
    the file does not store it."""
    schema = metadata.schema.to_arrow_schema()
    index = schema.get_field_index(column)
    if index < 0:
        return None
    first = sum(_leaf_count(schema.field(i).type) for i in range(index))
    field_type = schema.field(index).type
    nested = pa.types.is_nested(field_type)
    return first, _leaf_count(field_type), nested


def column_stats(metadata: pq.FileMetaData, row_group: int, leaves: Leaves | None) -> ColumnStats:
    """What row group ``row_group``'s footer says about the column of ``leaves`` (see
    `column_leaves`; None: not stored, so nothing is known)."""
    group = metadata.row_group(row_group)
    if leaves is None:
        return ColumnStats(None, None, None, group.num_rows)
    first, count, nested = leaves
    nulls: int | None = 0
    values = 0
    for leaf in range(first, first + count):
        chunk = group.column(leaf)
        values += chunk.num_values
        stats = chunk.statistics
        if stats is None or not getattr(stats, "has_null_count", True) or nulls is None:
            nulls = None
        else:
            nulls += int(stats.null_count or 0)
    low = high = None
    stats = group.column(first).statistics if count == 1 else None
    # numbers only: a 16-bit float's statistics are its raw bytes, which say nothing here
    if (
        stats is not None
        and stats.has_min_max
        and all(isinstance(v, (int, float)) for v in (stats.min, stats.max))
    ):
        low, high = stats.min, stats.max
    return ColumnStats(nulls, low, high, values, nested=nested)


def constant_stats(value: Any, rows: int) -> ColumnStats:
    """A column constant in a file (``value``: its partition value, None for null)."""
    return ColumnStats(rows if value is None else 0, None, None, rows, constant=True)


def digest(footer: bytes) -> str:
    """A short hash of a parquet footer: what a file's content decides, at no read cost
    (the footer is read to plan anyway). It holds every row group's and column chunk's
    sizes, offsets and statistics, so rewritten data changes it.

    Examples:
        >>> digest(b"PAR1") == digest(b"PAR1"), len(digest(b""))
        (True, 32)
    """
    return hashlib.sha256(footer).hexdigest()[:32]
