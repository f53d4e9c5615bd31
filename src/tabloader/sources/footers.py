"""Footer statistics: what a parquet footer says about a column in each row group.

A footer records, per row group and leaf column, how many values are stored, how many
are null, and the smallest and largest value. Everything tabloader learns from them is
read here, once: the loader's null check (`Source.null_flags`), the dtype check of
values at construction (`Source.value_ranges`), the ids an embedding table needs
(`tabloader.embeddings.id_ranges`) and ``tabloader inspect``'s null counts all start from
`ColumnStats`, one per partition, built by `column_stats`.

A footer also says which column chunks are encrypted (parquet's modular encryption).
pyarrow aborts the process when it is asked about such a chunk's metadata without the
keys, so `encrypted_columns` finds them in the footer's own bytes first.

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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tabloader.errors import InvalidFileError

if TYPE_CHECKING:
    import pyarrow.parquet as pq

__all__ = [
    "ColumnStats",
    "Leaves",
    "column_leaves",
    "column_stats",
    "constant_stats",
    "digest",
    "encrypted_columns",
    "encrypted_footer_message",
    "refuse_encrypted",
]

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


# -- encrypted column chunks ------------------------------------------------------------
#
# A footer is a Thrift ``FileMetaData`` struct in Thrift's compact protocol (parquet.thrift):
# its field 4 lists the row groups, a row group's field 1 its column chunks, and a column
# chunk carries field 8 (``crypto_metadata``) or 9 (``encrypted_column_metadata``) when it
# is encrypted. Only that much is read here; every other field is skipped by its type.

_BOOL_TRUE, _BOOL_FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY = 1, 2, 3, 4, 5, 6, 7, 8
_LIST, _SET, _MAP, _STRUCT = 9, 10, 11, 12
_ROW_GROUPS, _COLUMNS, _CRYPTO_METADATA, _ENCRYPTED_METADATA = 4, 1, 8, 9
_MAX_DEPTH = 64


class _Compact:
    """A reader of Thrift's compact protocol over ``data``, from position 0."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        value = self.data[self.at]
        self.at += 1
        return value

    def varint(self) -> int:
        shift = value = 0
        while True:
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    def fields(self) -> Iterator[tuple[int, int]]:
        """A struct's ``(field id, type)`` in turn; the caller reads or skips each value."""
        field = 0
        while True:
            header = self.byte()
            if header == 0:
                return
            delta, kind = header >> 4, header & 0x0F
            if delta:
                field += delta
            else:
                zigzag = self.varint()
                field = (zigzag >> 1) ^ -(zigzag & 1)
            yield field, kind

    def list_header(self) -> tuple[int, int]:
        header = self.byte()
        size, kind = header >> 4, header & 0x0F
        return (self.varint() if size == 15 else size), kind

    def skip(self, kind: int, depth: int = 0) -> None:
        if depth > _MAX_DEPTH:
            raise ValueError("the footer nests deeper than parquet's metadata does")
        if kind in (_BOOL_TRUE, _BOOL_FALSE):
            return
        if kind == _BYTE:
            self.at += 1
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.at += 8
        elif kind == _BINARY:
            length = self.varint()  # (read before the position it moves is added to)
            self.at += length
        elif kind in (_LIST, _SET):
            size, item = self.list_header()
            if item in (_BOOL_TRUE, _BOOL_FALSE):
                self.at += size
            else:
                for _ in range(size):
                    self.skip(item, depth + 1)
        elif kind == _MAP:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip(types >> 4, depth + 1)
                    self.skip(types & 0x0F, depth + 1)
        elif kind == _STRUCT:
            for _, field_kind in self.fields():
                self.skip(field_kind, depth + 1)
        else:
            raise ValueError(f"no Thrift type {kind}")
        if self.at > len(self.data):
            raise ValueError("the footer ends inside a value")


def encrypted_columns(footer: bytes) -> list[int]:
    """The leaf columns (their indices in the footer's schema) whose chunks are encrypted,
    from a footer's bytes (the ``FileMetaData`` first, as `digest` takes them); empty for
    a file without encrypted columns.

    Raises ValueError for bytes that are not a footer.

    Examples:
        >>> import io, pyarrow as pa, pyarrow.parquet as pq
        >>> sink = io.BytesIO()
        >>> pq.write_table(pa.table({"a": [1, 2]}), sink)
        >>> data = sink.getvalue()
        >>> encrypted_columns(data[-8 - int.from_bytes(data[-8:-4], "little") :])
        []
    """
    reader = _Compact(footer)
    found: set[int] = set()
    try:
        for field, kind in reader.fields():
            if field != _ROW_GROUPS or kind != _LIST:
                reader.skip(kind)
                continue
            groups, _ = reader.list_header()
            for _ in range(groups):
                for group_field, group_kind in reader.fields():
                    if group_field != _COLUMNS or group_kind != _LIST:
                        reader.skip(group_kind)
                        continue
                    chunks, _ = reader.list_header()
                    for leaf in range(chunks):
                        for chunk_field, chunk_kind in reader.fields():
                            if chunk_field in (_CRYPTO_METADATA, _ENCRYPTED_METADATA):
                                found.add(leaf)
                            reader.skip(chunk_kind)
    except IndexError:
        raise ValueError("the footer ends inside a value") from None
    return sorted(found)


_NO_KEYS = (
    "tabloader has no keys to read encrypted parquet. Decrypt the data where its keys are "
    "(pyarrow.parquet.read_table(..., decryption_properties=...)) and write it unencrypted "
    "for training, or leave the file out"
)


def encrypted_footer_message(shown: str) -> str:
    """The refusal of a file whose footer is encrypted (it ends with ``PARE``)."""
    return (
        f"{shown} is an encrypted parquet file (its footer is encrypted: it ends with "
        f"PARE); {_NO_KEYS}"
    )


def refuse_encrypted(shown: str, footer: bytes, metadata: pq.FileMetaData) -> None:
    """Raise [`InvalidFileError`][tabloader.errors.InvalidFileError] if the file of
    ``footer`` (parsed as ``metadata``) has encrypted columns under a plaintext footer,
    naming them, before anything asks about their chunks.

    Such a footer is signed: 28 bytes (a nonce and a tag) follow its ``FileMetaData``,
    so only a footer longer than its metadata is searched for encrypted chunks.

    Examples:
        >>> import io, pyarrow as pa, pyarrow.parquet as pq
        >>> sink = io.BytesIO()
        >>> pq.write_table(pa.table({"a": [1, 2]}), sink)
        >>> data = sink.getvalue()
        >>> footer = data[-8 - int.from_bytes(data[-8:-4], "little") :]
        >>> refuse_encrypted("a.parquet", footer, pq.read_metadata(io.BytesIO(data)))
    """
    if len(footer) - 8 <= metadata.serialized_size:
        return
    try:
        leaves = encrypted_columns(footer)
    except ValueError as err:
        raise InvalidFileError(f"{shown} has a footer tabloader cannot read ({err})") from None
    if not leaves:
        return
    schema = metadata.schema
    names = [schema.column(i).path for i in leaves if i < len(schema)]
    raise InvalidFileError(
        f"{shown} is an encrypted parquet file: its column(s) {', '.join(names)} are "
        f"encrypted (modular encryption under a plaintext footer); {_NO_KEYS}"
    )
