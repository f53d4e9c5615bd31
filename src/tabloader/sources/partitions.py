"""Partition keys and filters: values that hold for every row of a file.

A Hive-style directory (``day=3/part-0.parquet``), a Delta Lake log (each file's
``partitionValues``) and an Iceberg manifest (each data file's partition tuple) give every
file values for a few *partition keys*. They serve twice:

- ``filters`` (pyarrow's form) are evaluated on them, so a file is kept or skipped whole,
  before anything is read, and ``len()`` stays exact;
- a key named in ``cats``/``conts``/``labels`` is delivered as a column, the file's value
  repeated, next to the columns the file stores.

`ColumnSources` says, per file, which requested columns are read from the file
(under which name: an Iceberg column renamed since the file was written is matched by its
field id) and which are constant (a partition value, or null where the file predates the
column). `TableSnapshot` is one version of a table: its files, their partition
values and row counts, its schema. Everything here is pure: no I/O.
"""

from __future__ import annotations

import datetime
import decimal
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

import numpy as np
import pyarrow as pa

from tabloader.errors import InvalidArgumentError, SchemaMismatchError, UnsupportedTableError

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "HIVE_NULL",
    "OPERATORS",
    "ColumnSources",
    "FileColumns",
    "Filters",
    "TableFile",
    "TableLog",
    "TableSnapshot",
    "check_filters",
    "constant_array",
    "describe_filters",
    "hive_values",
    "in_load_order",
    "infer_key_types",
    "keep_file",
    "normalize_filters",
    "parse_key_values",
    "same_reads",
    "widens",
]

OPERATORS = ("=", "==", "!=", "<", "<=", ">", ">=", "in", "not in")
"""The comparison operators of pyarrow's filter form (``pyarrow.parquet.filters_to_expression``)."""
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
"""The directory value Hive, Spark and Delta write for a null partition value."""

Term = tuple[str, str, Any]
Filters = tuple[tuple[Term, ...], ...]
"""Filters in disjunctive normal form: a file is kept if all terms of any one group hold."""

_HIVE_SEGMENT = re.compile(r"^([^=/]+)=([^/]*)$")
_INTEGER = re.compile(r"^[+-]?\d+$")


# -- filters -------------------------------------------------------------------------------


def normalize_filters(filters: object) -> Filters | None:
    """pyarrow's filter form, checked: ``[(col, op, value), ...]`` (all must hold) or a
    list of such lists (any one must hold); None for no filter.

    Examples:
        >>> normalize_filters([("day", "<", 23)])
        ((('day', '<', 23),),)
        >>> normalize_filters([[("day", "=", 1)], [("day", "in", [5, 6])]])
        ((('day', '=', 1),), (('day', 'in', (5, 6)),))
        >>> try:
        ...     normalize_filters([("day", "~", 1)])
        ... except InvalidArgumentError as err:
        ...     print(err)
        filters: the operator '~' of ('day', '~', 1) is not one of =, ==, !=, <, <=, >, >=, ...
    """
    if filters is None:
        return None
    shape = (
        "filters must be a list of (column, operator, value) tuples (all must hold), or a "
        "list of such lists (any one must hold), as pyarrow.parquet takes them"
    )
    if not isinstance(filters, (list, tuple)) or not filters:
        raise InvalidArgumentError(f"{shape}; got {filters!r}")
    if all(isinstance(t, (list, tuple)) and len(t) == 3 and isinstance(t[0], str) for t in filters):
        groups: Sequence[Any] = [filters]
    else:
        groups = filters
    out = []
    for group in groups:
        if not isinstance(group, (list, tuple)) or not group:
            raise InvalidArgumentError(f"{shape}; got {filters!r}")
        out.append(tuple(_term(t, shape) for t in group))
    return tuple(out)


def _term(term: object, shape: str) -> Term:
    if not (isinstance(term, (list, tuple)) and len(term) == 3 and isinstance(term[0], str)):
        raise InvalidArgumentError(f"{shape}; {term!r} is not a (column, operator, value) tuple")
    column, op, value = term
    if op not in OPERATORS:
        raise InvalidArgumentError(
            f"filters: the operator {op!r} of {tuple(term)!r} is not one of "
            f"{', '.join(OPERATORS[:7])}, ... (pyarrow's: {', '.join(OPERATORS)})"
        )
    if op in ("in", "not in"):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
            raise InvalidArgumentError(
                f"filters: {op!r} takes a list of values, got {value!r} in {tuple(term)!r}"
            )
        if any(v is None for v in value):
            raise InvalidArgumentError(f"filters: {tuple(term)!r} lists None; {_NULL_HINT}")
        value = (
            tuple(sorted(value, key=repr)) if isinstance(value, (set, frozenset)) else tuple(value)
        )
    elif value is None:
        raise InvalidArgumentError(f"filters: {tuple(term)!r} compares with None; {_NULL_HINT}")
    return (column, "=" if op == "==" else op, value)


_NULL_HINT = (
    "a comparison with a null partition value never holds (a file whose key is null is "
    "skipped by every term on that key but 'not in'); filter on the other values"
)


def _kind(t: pa.DataType) -> str:
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "str"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "datetime"
    if pa.types.is_time(t):
        return "time"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytes"
    return "other"


def _zone(t: pa.DataType) -> str | None:
    """A timestamp key's time zone (None for a naive one, and for a date)."""
    return cast(Any, t).tz if pa.types.is_timestamp(t) else None


def _fits(value: Any, kind: str) -> bool:
    if kind in ("int", "number"):
        return isinstance(value, (int, float, decimal.Decimal, np.integer, np.floating)) and not (
            isinstance(value, (bool, np.bool_))
        )
    if kind == "bool":
        return isinstance(value, (bool, np.bool_))
    if kind == "str":
        return isinstance(value, str)
    if kind == "date":
        return isinstance(value, datetime.date) and not isinstance(value, datetime.datetime)
    if kind == "datetime":
        return isinstance(value, datetime.datetime)
    if kind == "time":
        return isinstance(value, datetime.time)
    if kind == "bytes":
        return isinstance(value, bytes)
    return False


def check_filters(
    filters: Filters, keys: Mapping[str, pa.DataType], *, what: str, columns: Sequence[str] = ()
) -> None:
    """Refuse terms on anything but a partition key, or with a value of another type.

    ``what`` names the dataset in messages; ``columns`` are the columns stored in its
    files, named in the message when a filter is on one of them.

    Examples:
        >>> keys = {"day": pa.int64()}
        >>> check_filters(normalize_filters([("day", "<", 3)]), keys, what="data/")
        >>> try:
        ...     check_filters(normalize_filters([("x", "<", 3)]), keys, what="data/", columns=["x"])
        ... except InvalidArgumentError as err:
        ...     print(str(err).split(", and ")[1].split(" (")[0])
        'x' is a column stored in the files of data/, not a partition key
    """
    names = ", ".join(keys) if keys else "none: its files are not in key=value directories"
    for group in filters:
        for column, op, value in group:
            if column not in keys:
                stored = (
                    f"a column stored in the files of {what}"
                    if column in columns
                    else (f"not a column of {what}")
                )
                raise InvalidArgumentError(
                    f"filters select whole files by partition key, and {column!r} is {stored}, "
                    f"not a partition key (its partition keys: {names}). Rows are never "
                    "dropped after len() is known: filter the batches yourself, or write the "
                    f"data partitioned by {column!r}"
                )
            kind = _kind(keys[column])
            if kind == "other":
                raise InvalidArgumentError(
                    f"filters: {(column, op, value)!r} is on the partition key {column!r} of "
                    f"type {keys[column]}, which filters cannot compare; filter on another "
                    "key, or select the files yourself"
                )
            for v in value if op in ("in", "not in") else (value,):
                if not _fits(v, kind):
                    raise InvalidArgumentError(
                        f"filters: {(column, op, value)!r} compares the partition key "
                        f"{column!r} ({keys[column]}) with {type(v).__name__} {v!r}; give a "
                        f"value of the key's type"
                    )
                if kind == "datetime" and (v.tzinfo is None) != (_zone(keys[column]) is None):
                    # Python cannot compare a naive and an aware time (or an equality
                    # between them never holds): which instant is meant is the user's
                    raise InvalidArgumentError(
                        f"filters: {(column, op, value)!r} compares the partition key "
                        f"{column!r} ({keys[column]}) with a time "
                        + (
                            "without a time zone; give one (tzinfo=datetime.timezone.utc)"
                            if v.tzinfo is None
                            else "with a time zone, and the key has none; give a naive time"
                        )
                    )


def keep_file(filters: Filters | None, values: Mapping[str, Any]) -> bool:
    """Whether a file with these partition values passes ``filters`` (pure).

    A null value (None) satisfies no comparison and no ``in``, as a null compares in
    pyarrow and SQL; it satisfies ``not in``, as in pyarrow's filters.

    Examples:
        >>> f = normalize_filters([[("day", "<", 3)], [("day", "in", [7])]])
        >>> [keep_file(f, {"day": d}) for d in (1, 3, 7, None)]
        [True, False, True, False]
        >>> keep_file(normalize_filters([("day", "not in", [7])]), {"day": None})
        True
    """
    if filters is None:
        return True
    return any(all(_holds(values.get(c), op, v) for c, op, v in group) for group in filters)


def _holds(actual: Any, op: str, value: Any) -> bool:
    if actual is None:
        return op == "not in"  # pyarrow: ~is_in(null) holds, is_in skipping nulls
    if op in ("in", "not in"):
        return any(_holds(actual, "=", v) for v in value) == (op == "in")
    if isinstance(actual, decimal.Decimal) and isinstance(value, (float, np.floating)):
        # pyarrow compares a decimal with a float as floats: 1.10 (decimal) equals 1.1,
        # which as a Decimal it does not (Decimal(1.1) is 1.100000000000000088...)
        actual = float(actual)
    if op == "=":
        return bool(actual == value)
    if op == "!=":
        return bool(actual != value)
    if op == "<":
        return bool(actual < value)
    if op == "<=":
        return bool(actual <= value)
    if op == ">":
        return bool(actual > value)
    return bool(actual >= value)


def describe_filters(filters: Filters | None) -> list[str]:
    """Each OR-group as text, for ``inspect`` and messages.

    Examples:
        >>> describe_filters(normalize_filters([("day", ">=", 3), ("region", "in", ["eu"])]))
        ["day >= 3 and region in ('eu',)"]
    """
    if filters is None:
        return []
    return [" and ".join(f"{c} {op} {v!r}" for c, op, v in group) for group in filters]


# -- Hive-style directories ----------------------------------------------------------------


def hive_values(relative_path: str) -> dict[str, str | None]:
    """The ``key=value`` directories of a path below the dataset's root, URL-decoded.

    Examples:
        >>> hive_values("day=3/region=eu%20west/part-0.parquet")
        {'day': '3', 'region': 'eu west'}
        >>> hive_values("day=__HIVE_DEFAULT_PARTITION__/x.parquet"), hive_values("x.parquet")
        ({'day': None}, {})
    """
    found: dict[str, str | None] = {}
    for segment in relative_path.replace("\\", "/").split("/")[:-1]:
        match = _HIVE_SEGMENT.match(segment)
        if match:
            text = unquote(match[2])
            found[unquote(match[1])] = None if text == HIVE_NULL else text
    return found


def infer_key_types(values: Sequence[Mapping[str, str | None]]) -> dict[str, pa.DataType]:
    """A type per key from its values in every file: int64 if all are integers that fit
    it, float64 if all are finite float64 numbers, else string (as pyarrow keeps them).
    Keys in the order first seen.

    Examples:
        >>> infer_key_types([{"day": "3", "r": "eu"}, {"day": "10", "r": "1.5"}])
        {'day': DataType(int64), 'r': DataType(string)}
        >>> infer_key_types([{"id": "18446744073709551616", "w": "1e400"}])
        {'id': DataType(string), 'w': DataType(string)}
    """
    seen: dict[str, list[str]] = {}
    for file_values in values:
        for key, text in file_values.items():
            seen.setdefault(key, [])
            if text is not None:
                seen[key].append(text)
    types: dict[str, pa.DataType] = {}
    for key, texts in seen.items():
        if texts and all(_INTEGER.match(t) for t in texts):
            fit = all(-(2**63) <= int(t) < 2**63 for t in texts)
            types[key] = pa.int64() if fit else pa.string()  # not rounded through float64
        elif texts and all(_is_float(t) for t in texts):
            types[key] = pa.float64()
        else:
            types[key] = pa.string()
    return types


_FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
"""A decimal number as written: not Python's wider reading (``1_000``, `` 5``)."""


def _is_float(text: str) -> bool:
    """Whether ``text`` is a decimal number that is a finite float64 (``1e400`` is not:
    it would be infinity; ``1_000`` and `` 5``, which Python's ``float`` takes, are not
    numbers written so either).

    Examples:
        >>> [_is_float(t) for t in ("1.5", "-2e3", ".5", "1_000", " 5", "nan", "1e400")]
        [True, True, True, False, False, False, False]
    """
    return _FLOAT.fullmatch(text) is not None and math.isfinite(float(text))


def parse_key_values(
    values: Mapping[str, str | None], types: Mapping[str, pa.DataType]
) -> dict[str, Any]:
    """Directory values as Python values of the keys' types; a missing key is null.

    Examples:
        >>> parse_key_values({"day": "3"}, {"day": pa.int64(), "r": pa.string()})
        {'day': 3, 'r': None}
    """
    out: dict[str, Any] = {}
    for key, t in types.items():
        text = values.get(key)
        if text is None:
            out[key] = None
        elif pa.types.is_integer(t):
            out[key] = int(text)
        elif pa.types.is_floating(t):
            out[key] = float(text)
        else:
            out[key] = text
    return out


# -- which columns a file stores, and under which names -------------------------------------


def widens(stored: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether a file's ``stored`` type reads as ``wanted`` without loss (Iceberg's type
    promotions: int to long, float to double, a wider decimal), or is the same kind of
    non-numeric type (string, large_string and string_view are one).

    Examples:
        >>> widens(pa.int32(), pa.int64()), widens(pa.int64(), pa.int32())
        (True, False)
        >>> widens(pa.large_string(), pa.string()), widens(pa.float64(), pa.int64())
        (True, False)
    """
    if stored == wanted:
        return True
    if pa.types.is_integer(stored) and pa.types.is_integer(wanted):
        return (
            pa.types.is_signed_integer(stored) == pa.types.is_signed_integer(wanted)
            and stored.bit_width <= wanted.bit_width
        ) or (
            pa.types.is_unsigned_integer(stored)
            and pa.types.is_signed_integer(wanted)
            and stored.bit_width < wanted.bit_width
        )
    if pa.types.is_floating(stored) and pa.types.is_floating(wanted):
        return bool(stored.bit_width <= wanted.bit_width)
    if pa.types.is_decimal(stored) and pa.types.is_decimal(wanted):
        return bool(stored.scale == wanted.scale and stored.precision <= wanted.precision)
    lists = (pa.types.is_list, pa.types.is_large_list, pa.types.is_list_view)
    if any(f(stored) for f in lists) and any(f(wanted) for f in lists):
        return widens(stored.value_type, wanted.value_type)  # type: ignore[attr-defined]
    numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_boolean)
    if any(f(stored) for f in numeric) or any(f(wanted) for f in numeric):
        return False
    return _kind(stored) == _kind(wanted) or (_kind(stored) == _kind(wanted) == "other")


@dataclass(frozen=True)
class FileColumns:
    """How to get the requested columns from one file.

    Attributes:
        read: the names to read from the file, in request order.
        rename: file name -> column name, for the read columns stored under another name
            (an Iceberg column renamed after the file was written).
        constants: column -> its value in every row of the file (a partition value; None
            for null: a column added to the table after the file was written, or a
            partition value that is null).
        types: the Arrow type of each constant column.
    """

    read: tuple[str, ...]
    rename: Mapping[str, str] = field(default_factory=dict)
    constants: Mapping[str, Any] = field(default_factory=dict)
    types: Mapping[str, pa.DataType] = field(default_factory=dict)

    @property
    def plain(self) -> bool:
        """True when every column is read from the file under its own name."""
        return not self.rename and not self.constants

    def complete(self, table: pa.Table, columns: Sequence[str]) -> pa.Table:
        """``table`` (the ``read`` columns of some rows) as the requested ``columns``.

        Examples:
            >>> fc = FileColumns(("x",), {"x": "price"}, {"day": 3}, {"day": pa.int64()})
            >>> fc.complete(pa.table({"x": [1.5, 2.5]}), ["day", "price"]).to_pydict()
            {'day': [3, 3], 'price': [1.5, 2.5]}
        """
        if self.plain:
            return table if table.column_names == list(columns) else table.select(columns)
        stored = {self.rename.get(name, name): name for name in self.read}
        n = table.num_rows
        arrays = [
            constant_array(self.constants[c], self.types[c], n)
            if c in self.constants
            else table.column(stored[c])
            for c in columns
        ]
        return pa.table(arrays, names=list(columns))


def constant_array(value: Any, t: pa.DataType, rows: int) -> pa.Array[Any]:
    """``value`` repeated ``rows`` times as an Arrow array of type ``t`` (null for None).

    Examples:
        >>> constant_array(7, pa.int16(), 3).to_pylist()
        [7, 7, 7]
        >>> constant_array(None, pa.int8(), 2).null_count
        2
    """
    if value is None:
        return pa.nulls(rows, t)  # type: ignore[call-overload,no-any-return]
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return pa.array(np.full(rows, value, dtype=t.to_pandas_dtype()), type=t)
    return pa.array([value] * rows, type=t)


@dataclass
class ColumnSources:
    """Where each column of a dataset comes from, file by file.

    A requested column is read from the file if its schema stores it (``names`` maps the
    dataset's name to the file's); else it is the file's partition value for a partition
    key; else (a table column the file predates) its default, or null without one.

    Attributes:
        keys: partition key -> Arrow type, in order.
        values: per file, partition key -> value (None: null).
        file_schema: per file, the index of its schema in ``names``.
        names: per distinct file schema, dataset column -> name in the file.
        types: the Arrow type of every column a file may lack (table columns and keys).
        defaults: column -> the value of every row of a file written before the column
            was added (Iceberg's ``initial-default``); a column without one is null there.
    """

    keys: dict[str, pa.DataType]
    values: list[dict[str, Any]]
    file_schema: NDArray[np.int32]
    names: list[dict[str, str]]
    types: dict[str, pa.DataType]
    defaults: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def by_name(
        cls,
        schemas: Sequence[pa.Schema],
        file_schema: NDArray[np.int32],
        keys: dict[str, pa.DataType] | None = None,
        values: list[dict[str, Any]] | None = None,
    ) -> ColumnSources:
        """Files that store columns under their own names (plain parquet, Hive keys)."""
        keys = keys or {}
        return cls(
            keys=keys,
            values=values if values is not None else [{} for _ in range(len(file_schema))],
            file_schema=file_schema,
            names=[{n: n for n in s.names} for s in schemas],
            types=dict(keys),
        )

    def __post_init__(self) -> None:
        self.identity = not self.types and all(
            all(k == v for k, v in n.items()) for n in self.names
        )
        """True when every file stores every column under its own name (no work to do)."""

    def file_columns(self, file_index: int, columns: Sequence[str]) -> FileColumns:
        """How to get ``columns`` from file ``file_index``."""
        if self.identity:
            return FileColumns(tuple(columns))
        names = self.names[int(self.file_schema[file_index])]
        read, rename, constants, types = [], {}, {}, {}
        for c in columns:
            stored = names.get(c)
            if stored is not None:
                read.append(stored)
                if stored != c:
                    rename[stored] = c
            elif c in self.keys or c in self.types:
                constants[c] = self.constant(file_index, c)
                types[c] = self.keys[c] if c in self.keys else self.types[c]
            else:
                read.append(c)  # absent: the reader names it (column_types refused it before)
        return FileColumns(tuple(read), rename, constants, types)

    def constant(self, file_index: int, column: str) -> Any:
        """The value of ``column`` in every row of a file that does not store it: its
        partition value, else the column's default (None: null)."""
        values = self.values[file_index]
        return values[column] if column in values else self.defaults.get(column)

    def stored_name(self, file_index: int, column: str) -> str | None:
        """The name ``column`` has in the file, or None if the file does not store it."""
        return self.names[int(self.file_schema[file_index])].get(column)


# -- one version of a table ----------------------------------------------------------------


@dataclass(frozen=True)
class TableFile:
    """One data file of a table version.

    Attributes:
        path: absolute local path or URL.
        values: partition key -> value (None: null).
        rows: row count from the table's log, None where the log does not record it.
    """

    path: str
    values: Mapping[str, Any]
    rows: int | None = None


def in_load_order(files: Iterable[TableFile]) -> tuple[TableFile, ...]:
    """A table version's data files in the order they are loaded: by path, so that two
    listings of one version give one order."""
    return tuple(sorted(files, key=lambda f: f.path))


@dataclass(frozen=True)
class TableSnapshot:
    """The files that make up one version of a Delta or Iceberg table.

    Attributes:
        format: ``"delta"`` or ``"iceberg"``.
        name: the table's URI or identifier, for messages.
        version: the Delta version, or the Iceberg snapshot id.
        files: the active data files, in load order.
        schema: the table's columns, under their current names, partition keys included.
        keys: partition key -> Arrow type: the keys filters may use and every file has a
            value for.
        field_ids: Iceberg: column -> field id, to match a file's columns by id. None:
            files store columns under the table's names.
        stored_keys: whether a file may store a partition key's values itself (Iceberg),
            which then win over its partition value; Delta takes the log's value.
        name_ids: Iceberg: the table's name mapping (``schema.name-mapping.default``), a
            name a file stores a column under -> its field id, for files written without
            field ids. None: the table has no name mapping.
        defaults: Iceberg: column -> its ``initial-default``, the value of every row of a
            file written before the column was added.
    """

    format: str
    name: str
    version: int
    files: tuple[TableFile, ...]
    schema: pa.Schema
    keys: dict[str, pa.DataType]
    field_ids: dict[str, int] | None = None
    stored_keys: bool = False
    name_ids: Mapping[str, int] | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def reading(self) -> dict[str, Any]:
        """What decides the values read from this version's files besides the files
        themselves, JSON-ready: the schema they are read under, how a file's columns are
        matched to it (field ids, the name mapping), the columns' defaults and the
        partition keys. An Iceberg schema change makes no snapshot, and a snapshot pinned
        is read under the schema it was written with, so one version's files can read as
        other values.

        Examples:
            >>> snapshot = TableSnapshot("iceberg", "db.t", 1, (), pa.schema([("x", pa.int64())]),
            ...                          {}, field_ids={"x": 3})
            >>> snapshot.reading()["field_ids"]
            {'x': 3}
        """
        return {
            "schema": [[f.name, str(f.type)] for f in self.schema],
            "keys": {k: str(t) for k, t in sorted(self.keys.items())},
            "field_ids": self.field_ids,
            "name_ids": None if self.name_ids is None else dict(sorted(self.name_ids.items())),
            "defaults": {k: repr(v) for k, v in sorted(self.defaults.items())},
        }

    def column_names(self, file_schema: pa.Schema) -> dict[str, str]:
        """Table column -> name in a file of this ``file_schema``, for the columns it stores.

        An Iceberg file's columns are matched by field id: the ids it stores, or for a
        file written without them, the ids the table's name mapping gives their names
        (as Iceberg's readers do: a column dropped and added again under the same name is
        another field, which such a file does not store unless the mapping says so).

        Raises:
            SchemaMismatchError: the file stores a column with a type that does not read
                as the table's without loss.
            UnsupportedTableError: an Iceberg file stores no field ids and the table has no
                name mapping, so nothing says which of the table's columns it holds.

        Examples:
            >>> snapshot = TableSnapshot("iceberg", "db.t", 1, (), pa.schema([("x", pa.int64())]),
            ...                          {}, field_ids={"x": 3}, name_ids={"x": 2})
            >>> snapshot.column_names(pa.schema([("x", pa.int64())]))  # field 2 was dropped
            {}
        """
        names: dict[str, str] = {}
        if self.field_ids is not None:
            if _has_field_ids(file_schema):
                by_id = {_field_id(f): f.name for f in file_schema}
            elif self.name_ids is not None:
                by_id = {self.name_ids[n]: n for n in file_schema.names if n in self.name_ids}
            else:
                raise UnsupportedTableError(
                    f"a data file of the {self.format} table {self.name} stores no field ids "
                    "and the table has no name mapping (schema.name-mapping.default), so "
                    "nothing says which of the table's columns its columns are. Set the "
                    "table's name mapping (pyiceberg's add_files does), or rewrite the file "
                    "with field ids"
                )
            for column, fid in self.field_ids.items():
                stored = by_id.get(fid)
                if stored is not None:
                    names[column] = stored
        else:
            names = {n: n for n in self.schema.names if file_schema.get_field_index(n) >= 0}
        if not self.stored_keys:
            for key in self.keys:
                names.pop(key, None)
        for column, stored_name in names.items():
            stored = file_schema.field(stored_name).type
            wanted = self.schema.field(column).type
            if not widens(stored, wanted):
                raise SchemaMismatchError(
                    f"a data file of the {self.format} table {self.name} stores column "
                    f"{column!r} as {stored}, which does not read as the table's {wanted} "
                    "without loss; the file does not match the table's schema"
                )
        return names


def _field_id(f: pa.Field[Any]) -> int | None:
    raw = (f.metadata or {}).get(b"PARQUET:field_id")
    return int(raw) if raw is not None else None


def _has_field_ids(schema: pa.Schema) -> bool:
    return any(_field_id(f) is not None for f in schema)


class TableLog:
    """Reads a table's log: its latest version, and the files of a version.

    Subclassed per format (`tabloader.sources.delta`, `tabloader.sources.iceberg`).
    A log travels to worker processes without its connection (``__getstate__``); only
    the process that created it looks for new versions.

    Attributes:
        name: the table's path, URL or identifier, for messages.
        url: a URL of the table's storage if it is remote (its data files are read
            through fsspec with ``storage_options``), None for local files.
        storage_options: fsspec options for the data files.
        credentials: where a user gives the credentials of the data files, for messages.
        pinned: the version asked for (time travel), None to follow the latest.
    """

    name: str
    url: str | None = None
    storage_options: dict[str, Any]
    credentials = "storage_options"
    pinned: int | None = None
    format = "table"

    def latest(self) -> int:
        """The newest version (Delta version, Iceberg snapshot id)."""
        raise NotImplementedError

    def snapshot(self, version: int) -> TableSnapshot:
        """The files of ``version``."""
        raise NotImplementedError


def same_reads(how: Sequence[FileColumns]) -> bool:
    """Whether files can be read in one call: the same stored names and constant columns."""
    first = how[0]
    return all(
        h.read == first.read
        and h.rename == first.rename
        and h.constants.keys() == first.constants.keys()
        for h in how[1:]
    )
