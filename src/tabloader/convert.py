"""Your files as parquet the loader reads fast: CSV, TSV, JSON lines or parquet in.

``tabloader convert raw/*.csv data --split valid=0.1`` (or [`convert`][tabloader.convert.convert])
reads every file once, in order, and writes parquet:

- **one schema for every file**: integer columns become ``int64``, floating point
  columns (and columns mixing integers and floats) ``float32``, text stays text;
  ``schema=`` (``--schema``) sets the type of any column;
- **row groups sized for the loader**: 131,072 rows (fewer for wide rows, so that one
  holds about 64 MiB), never below the size the loader warns about, and files of 16 row
  groups;
- **splits by a seeded hash of each row** (``split={"valid": 0.1}``): a row's split
  depends on its values and the seed only, so the same rows land in the same split
  whatever the files, their order or the machine; the rest is ``train``;
- **rows in = rows out**, checked against the written footers before anything is moved
  into place. Files are written into a hidden folder of the destination first, so an
  interrupted conversion leaves nothing a loader would read.

CSV and TSV files may have a header or not (it is detected: a first line holding no
number is a header), ``names=`` names or renames their columns, empty fields are nulls,
and ``.gz``, ``.bz2`` and ``.zst`` files are read as they are.

Examples:
    >>> import os, tempfile, tabloader
    >>> from tabloader.convert import convert
    >>> tmp = tempfile.mkdtemp()
    >>> with open(os.path.join(tmp, "clicks.csv"), "w") as f:
    ...     rows = "".join(f"{i},{i / 4},{i % 2}\\n" for i in range(100))
    ...     _ = f.write("user,price,label\\n" + rows)
    >>> result = convert(os.path.join(tmp, "clicks.csv"), os.path.join(tmp, "data"),
    ...                  split={"valid": 0.2}, seed=0)
    >>> result.rows_in, sum(result.rows_out.values()), sorted(result.rows_out)
    (100, 100, ['train', 'valid'])
    >>> tabloader.Dataset(os.path.join(tmp, "data", "train")).schema.types
    [DataType(int64), DataType(float), DataType(int64)]
"""

from __future__ import annotations

import csv as csvlib
import glob as globlib
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from tabloader.columns import closest_name, is_list_type, value_type
from tabloader.dataset import DEFAULT_ROWS_PER_PARTITION, SMALL_ROW_GROUP_ROWS
from tabloader.errors import (
    ColumnNotFoundError,
    InvalidArgumentError,
    InvalidFileError,
    SchemaMismatchError,
    SourceNotFoundError,
)
from tabloader.options import int_at_least

__all__ = [
    "ConvertResult",
    "Format",
    "column_hashes",
    "convert",
    "parse_schema",
    "parse_split",
    "row_group_rows_for",
    "row_hashes",
    "split_rows",
]

Format = Literal["csv", "tsv", "json", "parquet"]
"""The input formats: ``"json"`` is JSON lines, one object per line."""
FORMATS: tuple[Format, ...] = ("csv", "tsv", "json", "parquet")
SUFFIXES: dict[str, Format] = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".txt": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".parquet": "parquet",
    ".parq": "parquet",
    ".pq": "parquet",
}
COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd"}
TARGET_ROW_GROUP_BYTES = 64 * 2**20
"""About this many decoded bytes per row group (fewer rows for wide rows)."""
ROW_GROUPS_PER_FILE = 16
TRAIN = "train"
"""The split that gets the rows no named split takes."""
_BLOCK_BYTES = 16 * 2**20
"""Bytes of text parsed at once; column types are inferred from the first block."""
TYPE_NAMES: dict[str, pa.DataType] = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float16": pa.float16(),
    "float32": pa.float32(),
    "float": pa.float32(),
    "float64": pa.float64(),
    "double": pa.float64(),
    "bool": pa.bool_(),
    "string": pa.string(),
    "str": pa.string(),
}
"""Type names ``schema=``/``--schema`` accept."""


# -- options --------------------------------------------------------------------------------


def parse_split(text: str | Mapping[str, float] | None) -> dict[str, float]:
    """``"valid=0.1,test=0.05"`` (or a mapping) as ``{name: fraction}``, checked.

    The fractions must be in (0, 1) and sum to at most 1; the rest goes to ``train``
    unless ``train`` is named, in which case they must sum to 1.

    Examples:
        >>> parse_split("valid=0.1, test=0.05")
        {'valid': 0.1, 'test': 0.05}
        >>> parse_split({"train": 0.8, "valid": 0.2})
        {'train': 0.8, 'valid': 0.2}
    """
    if text is None:
        return {}
    if isinstance(text, str):
        pairs: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = part.partition("=")
            if not sep or not name.strip():
                raise InvalidArgumentError(f"a split is NAME=FRACTION (valid=0.1), got {part!r}")
            try:
                pairs[name.strip()] = float(value)
            except ValueError:
                raise InvalidArgumentError(
                    f"the fraction of split {name.strip()!r} must be a number, got {value!r}"
                ) from None
    elif isinstance(text, Mapping):
        pairs = dict(text)
    else:
        raise InvalidArgumentError(f"split must be a mapping {{name: fraction}}, got {text!r}")
    if not pairs:
        raise InvalidArgumentError("split names no split: give NAME=FRACTION (valid=0.1)")
    for name, fraction in pairs.items():
        if not isinstance(name, str) or not re.fullmatch(r"[\w.-]+", name) or name in (".", ".."):
            raise InvalidArgumentError(
                f"a split's name becomes a directory: letters, digits, _, - and . only, got "
                f"{name!r}"
            )
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise InvalidArgumentError(f"the fraction of split {name!r} must be a number")
        if not 0 < fraction <= 1:
            raise InvalidArgumentError(
                f"the fraction of split {name!r} must be in (0, 1], got {fraction!r}"
            )
    total = float(sum(pairs.values()))
    if total > 1 + 1e-9:
        raise InvalidArgumentError(f"the split fractions add up to {total:g}, more than 1")
    if TRAIN in pairs and abs(total - 1) > 1e-9:
        raise InvalidArgumentError(
            f"the split fractions add up to {total:g}: with {TRAIN!r} named they must add up "
            f"to 1 (or leave {TRAIN!r} out, and it gets the rest)"
        )
    return {name: float(f) for name, f in pairs.items()}


def parse_schema(text: str | Mapping[str, Any] | pa.Schema | None) -> dict[str, pa.DataType]:
    """Column types to force: ``"user=int32,price=float64"``, a mapping of names to types
    (pyarrow types or the names in `TYPE_NAMES`), a ``pyarrow.Schema``, or the path
    of a parquet file whose schema to take.

    Examples:
        >>> parse_schema("user=int32, price:double, name=string")
        {'user': DataType(int32), 'price': DataType(double), 'name': DataType(string)}
    """
    if text is None:
        return {}
    if isinstance(text, pa.Schema):
        return {f.name: f.type for f in text}
    if isinstance(text, str) and os.path.isfile(text):
        return {f.name: f.type for f in pq.read_schema(text)}
    if isinstance(text, str):
        pairs: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            match = re.fullmatch(r"(.+?)\s*[=:]\s*(.+)", part)
            if match is None:
                raise InvalidArgumentError(
                    f"a schema entry is NAME=TYPE (user=int64), got {part!r}; or pass the path "
                    "of a parquet file whose schema to take"
                )
            name, kind = match.groups()
            pairs[name] = kind
    elif isinstance(text, Mapping):
        pairs = dict(text)
    else:
        raise InvalidArgumentError(f"schema must be a mapping {{column: type}}, got {text!r}")
    types = {}
    for name, kind in pairs.items():
        if isinstance(kind, pa.DataType):
            types[name] = kind
            continue
        key = str(kind).strip().lower()
        if key not in TYPE_NAMES:
            close = closest_name(key, TYPE_NAMES)
            raise InvalidArgumentError(
                f"unknown type {kind!r} for column {name!r}"
                + (f" (did you mean {close!r}?)" if close else "")
                + f"; known: {', '.join(TYPE_NAMES)}"
            )
        types[name] = TYPE_NAMES[key]
    return types


def row_group_rows_for(schema: pa.Schema) -> int:
    """Rows per row group for ``schema``: 131,072, or fewer when a row is so wide that
    row groups would exceed about 64 MiB decoded, but never fewer than
    ``SMALL_ROW_GROUP_ROWS`` (below which the loader warns).

    Examples:
        >>> row_group_rows_for(pa.schema([("x", pa.float32())] * 40))
        131072
        >>> row_group_rows_for(pa.schema([(f"x{i}", pa.float64()) for i in range(400)]))
        20971
    """
    row_bytes = sum(_value_bytes(f.type) for f in schema) or 1
    rows = min(DEFAULT_ROWS_PER_PARTITION, TARGET_ROW_GROUP_BYTES // row_bytes)
    return int(max(SMALL_ROW_GROUP_ROWS, rows))


def _value_bytes(field_type: pa.DataType) -> int:
    if is_list_type(field_type):
        return 64
    try:
        return max(1, field_type.bit_width // 8)
    except ValueError:  # variable width: strings, binary
        return 32


# -- hashing rows into splits ---------------------------------------------------------------

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_NULL = np.uint64(0x5BD1E9955BD1E995)


def _mix(h: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """splitmix64's finaliser: every input bit flips about half of the output bits."""
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint64(30))
        h = h * _M1
        h = h ^ (h >> np.uint64(27))
        h = h * _M2
        return cast("np.ndarray[Any, Any]", h ^ (h >> np.uint64(31)))


def _segment_hashes(values: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]) -> Any:
    """One hash per segment ``values[offsets[i]:offsets[i + 1]]``, order-sensitive."""
    counts = np.diff(offsets).astype(np.int64)
    out = _mix(counts.astype(np.uint64) + _GOLDEN)
    if not len(values):
        return out
    starts = np.repeat(offsets[:-1].astype(np.int64), counts)
    position = np.arange(len(values), dtype=np.int64) - (starts - int(offsets[0]))
    with np.errstate(over="ignore"):
        weighted = _mix(values.astype(np.uint64) ^ _mix(position.astype(np.uint64) + _GOLDEN))
    nonempty = counts > 0
    first = (offsets[:-1] - offsets[0]).astype(np.int64)[nonempty]
    with np.errstate(over="ignore"):
        sums = np.add.reduceat(weighted, first) if len(first) else weighted[:0]
        out[nonempty] = _mix(out[nonempty] ^ sums)
    return out


def column_hashes(column: Any) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """A 64-bit hash of every value of ``column``, the same on every machine and run.

    Equal values hash equally, and nulls all to one value. Strings are hashed by their
    UTF-8 bytes, lists by their values in order, other types by their text.

    Examples:
        >>> h = column_hashes(pa.array(["a", "b", "a", None]))
        >>> bool(h[0] == h[2]), bool(h[0] == h[1]), h.dtype
        (True, False, dtype('uint64'))
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    kind = column.type
    if pa.types.is_dictionary(kind):
        column = column.cast(kind.value_type)
        kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        ints = pc.fill_null(column.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
        out = _mix(ints.view(np.uint64) ^ _GOLDEN)
    elif pa.types.is_floating(kind):
        floats = pc.fill_null(column.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
        values = np.where(floats == 0, 0.0, floats)  # -0.0 and 0.0 are one number
        values = np.where(np.isnan(values), np.nan, values)  # and all NaN one NaN
        out = _mix(values.view(np.uint64) ^ (_GOLDEN >> np.uint64(1)))
    elif is_list_type(kind):
        lists: Any = column.cast(pa.large_list(value_type(kind)))
        offsets = np.asarray(lists.offsets).astype(np.int64)
        inner = column_hashes(lists.values)[offsets[0] : offsets[-1]]
        out = _segment_hashes(inner, offsets)
    else:  # text, binary, and anything else by its text
        if not (pa.types.is_string(kind) or pa.types.is_binary(kind)):
            column = column.cast(pa.string())
        raw_bytes: Any = column.cast(pa.large_binary())
        offsets = np.frombuffer(raw_bytes.buffers()[1], np.int64)[
            raw_bytes.offset : raw_bytes.offset + len(raw_bytes) + 1
        ]
        data = raw_bytes.buffers()[2]
        raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
        out = _segment_hashes(raw[offsets[0] : offsets[-1]], offsets)
    if column.null_count:
        out[np.asarray(column.is_null())] = _NULL
    return cast("np.ndarray[Any, np.dtype[np.uint64]]", out)


def row_hashes(table: pa.Table, seed: int) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """A 64-bit hash of every row of ``table`` (its values, in column order) and ``seed``.

    Examples:
        >>> t = pa.table({"a": [1, 2, 1], "b": ["x", "y", "x"]})
        >>> h = row_hashes(t, seed=0)
        >>> bool(h[0] == h[2]), bool(h[0] == row_hashes(t, seed=1)[0])
        (True, False)
    """
    h = np.full(table.num_rows, _mix(np.array([seed], dtype=np.uint64) + _GOLDEN)[0])
    for column in table.columns:
        with np.errstate(over="ignore"):
            h = _mix(h * _M1 ^ column_hashes(column))
    return cast("np.ndarray[Any, np.dtype[np.uint64]]", h)


def split_rows(hashes: np.ndarray[Any, Any], split: Mapping[str, float]) -> dict[str, Any]:
    """The rows of each split: row ``i`` goes to the split whose share of [0, 1) holds
    ``hashes[i] / 2**64``; ``train`` takes the rest. Returns ``{name: row indices}``.

    Examples:
        >>> rows = split_rows(np.arange(10, dtype=np.uint64) << np.uint64(60), {"valid": 0.25})
        >>> rows["valid"].tolist(), rows["train"].tolist()
        ([0, 1, 2, 3], [4, 5, 6, 7, 8, 9])
    """
    unit = (hashes >> np.uint64(11)).astype(np.float64) * 2.0**-53
    found: dict[str, Any] = {}
    low = 0.0
    taken = np.zeros(len(hashes), dtype=bool)
    for name, fraction in split.items():
        high = low + fraction
        rows = (unit >= low) & (unit < high) & ~taken
        taken |= rows
        found[name] = np.flatnonzero(rows)
        low = high
    if TRAIN not in split:
        found[TRAIN] = np.flatnonzero(~taken)
    elif not taken.all():  # fractions adding up to 1 in floating point: the last gets the rest
        last = list(split)[-1]
        found[last] = np.sort(np.concatenate([found[last], np.flatnonzero(~taken)]))
    return found


# -- reading --------------------------------------------------------------------------------


@dataclass
class _Input:
    path: str
    format: Format
    compression: str | None
    size: int
    delimiter: str = ","
    header: bool = False
    names: list[str] | None = None
    schema: pa.Schema = field(default_factory=lambda: pa.schema([]))


def _expand(sources: Sequence[str]) -> list[str]:
    files: list[str] = []
    for spec in sources:
        path = os.path.expanduser(spec)
        if "://" in path:
            raise InvalidArgumentError(
                f"convert reads local files, got {spec!r}: copy the files here first"
            )
        if globlib.has_magic(path):
            found = sorted(p for p in globlib.glob(path, recursive=True) if os.path.isfile(p))
            if not found:
                raise SourceNotFoundError(f"the glob {spec!r} matched no files")
        elif os.path.isdir(path):
            found = sorted(
                os.path.join(d, n)
                for d, dirs, names in os.walk(path)
                for n in names
                if not n.startswith((".", "_"))
            )
            if not found:
                raise SourceNotFoundError(f"the directory {spec!r} holds no files")
        elif os.path.isfile(path):
            found = [path]
        else:
            raise SourceNotFoundError(f"{spec!r} does not exist")
        files.extend(f for f in found if not os.path.basename(f).startswith((".", "_")))
    return list(dict.fromkeys(files))


def _open_stream(item: _Input) -> tuple[Any, Any]:
    """``(raw file, stream to read)``: the raw file's position tells the progress."""
    raw = pa.OSFile(item.path, "rb")
    if item.compression is None:
        return raw, raw
    return raw, pa.CompressedInputStream(raw, cast(Any, item.compression))


def _head(item: _Input, limit: int = 1 << 16) -> str:
    raw, stream = _open_stream(item)
    try:
        data = stream.read(limit)
    finally:
        raw.close()
    return bytes(data).decode("utf-8", errors="replace")


def _describe(path: str, given: Format | None) -> _Input:
    name = os.path.basename(path).lower()
    stem, suffix = os.path.splitext(name)
    compression = COMPRESSION.get(suffix)
    if compression is not None:
        suffix = os.path.splitext(stem)[1]
    size = os.path.getsize(path)
    kind: Format | None = given or SUFFIXES.get(suffix)
    item = _Input(path, kind or "csv", compression, size)
    if kind is None:  # no telling suffix: look at the text
        head = _head(item).lstrip()
        if head.startswith("PAR1"):
            item.format = "parquet"
        elif head.startswith("{"):
            item.format = "json"
        else:
            first = head.splitlines()[0] if head else ""
            item.format = "tsv" if "\t" in first else "csv"
    if item.format == "parquet" and compression is not None:
        raise InvalidArgumentError(f"{path}: a parquet file compresses its own pages; unpack it")
    return item


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _first_fields(item: _Input) -> list[str]:
    lines = _head(item).splitlines()
    if not lines:
        return []
    return next(csvlib.reader([lines[0]], delimiter=item.delimiter), [])


def _csv_options(item: _Input, column_types: Mapping[str, pa.DataType] | None) -> dict[str, Any]:
    read = pacsv.ReadOptions(
        block_size=_BLOCK_BYTES,
        skip_rows=1 if item.header and item.names is not None else 0,
        column_names=item.names,
        autogenerate_column_names=not item.header and item.names is None,
    )
    return {
        "read_options": read,
        "parse_options": pacsv.ParseOptions(delimiter=item.delimiter),
        "convert_options": pacsv.ConvertOptions(
            column_types=dict(column_types or {}),
            strings_can_be_null=True,
            quoted_strings_can_be_null=True,
        ),
    }


def _probe(
    item: _Input, *, header: bool | None, names: Sequence[str] | None, delimiter: str | None
) -> None:
    """Fill in how to read ``item`` and the schema its first rows suggest."""
    if item.format == "parquet":
        try:
            item.schema = pq.read_schema(item.path)
        except (pa.ArrowException, OSError) as err:
            raise InvalidFileError(f"{item.path} is not a readable parquet file ({err})") from err
        return
    if item.format == "json":
        from pyarrow import json as pajson

        raw, stream = _open_stream(item)
        try:
            options = pajson.ReadOptions(block_size=_BLOCK_BYTES)
            item.schema = pajson.open_json(stream, read_options=options).schema
        except pa.ArrowException as err:
            raise InvalidFileError(f"{item.path} is not JSON lines ({err})") from err
        finally:
            raw.close()
        return
    item.delimiter = delimiter or ("\t" if item.format == "tsv" else ",")
    first = _first_fields(item)
    item.header = (
        header if header is not None else bool(first) and not any(_is_number(f) for f in first)
    )
    if names is not None:
        if first and len(names) != len(first):
            raise InvalidArgumentError(
                f"{len(names)} names given, but the first line of {item.path} holds "
                f"{len(first)} fields: {_shorten(first)}"
            )
        item.names = list(names)
    raw, stream = _open_stream(item)
    try:
        item.schema = pacsv.open_csv(stream, **_csv_options(item, None)).schema
    except pa.ArrowException as err:
        raise InvalidFileError(
            f"{item.path} could not be read as {item.format.upper()} ({err})"
        ) from err
    finally:
        raw.close()


def _shorten(values: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


def _target_type(name: str, types: list[tuple[str, pa.DataType]]) -> pa.DataType:
    """The type a column is written with, from its types in every file."""
    kinds = [t for _, t in types if not pa.types.is_null(t)]
    kinds = [cast(Any, t).value_type if pa.types.is_dictionary(t) else t for t in kinds]
    if not kinds:
        return pa.float32()  # empty everywhere: numbers with nulls are the likeliest
    if all(pa.types.is_integer(t) for t in kinds):
        return pa.int64()
    if all(pa.types.is_boolean(t) for t in kinds):
        return pa.bool_()
    if all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in kinds):
        return pa.float32()
    if all(pa.types.is_string(t) or pa.types.is_large_string(t) for t in kinds):
        return pa.string()
    if all(is_list_type(t) for t in kinds):
        values = [(where, value_type(t)) for where, t in types if is_list_type(t)]
        return pa.list_(_target_type(name, values))
    if all(t == kinds[0] for t in kinds):
        return kinds[0]
    listed = "; ".join(f"{t} in {where}" for where, t in types[:4])
    raise SchemaMismatchError(
        f"column {name!r} has types that do not mix ({listed}). Pass schema={{{name!r}: ...}} "
        f"(--schema {name}=TYPE) to convert every file's {name!r} to one type"
    )


def _common_schema(inputs: list[_Input], forced: Mapping[str, pa.DataType]) -> pa.Schema:
    first = inputs[0]
    names = first.schema.names
    for item in inputs[1:]:
        missing = [n for n in names if n not in item.schema.names]
        extra = [n for n in item.schema.names if n not in names]
        if missing or extra:
            what = (
                f"has no column {missing[0]!r}"
                if missing
                else f"has a column {extra[0]!r} that {first.path} has not"
            )
            close = closest_name(missing[0], extra) if missing and extra else None
            raise ColumnNotFoundError(
                f"{item.path} {what}"
                + (f" (it has {close!r})" if close else "")
                + f": every file needs the same columns ({_shorten(names)}). Convert them "
                "separately, or name the columns with names= (--names)"
            )
    unknown = [n for n in forced if n not in names]
    if unknown:
        close = closest_name(unknown[0], names)
        raise ColumnNotFoundError(
            f"schema names column {unknown[0]!r}, which the files do not have"
            + (f" (did you mean {close!r}?)" if close else "")
            + f"; they have {_shorten(names)}"
        )
    return pa.schema(
        [
            (
                name,
                forced[name]
                if name in forced
                else _target_type(name, [(i.path, i.schema.field(name).type) for i in inputs]),
            )
            for name in names
        ]
    )


def _read(item: _Input, schema: pa.Schema) -> Iterator[tuple[pa.Table, int]]:
    """``item``'s rows with ``schema``'s types (in its column order), and the input bytes
    consumed so far."""
    if item.format == "parquet":
        parquet = pq.ParquetFile(item.path)
        total = max(parquet.metadata.num_rows, 1)
        done = 0
        for batch in parquet.iter_batches(batch_size=65_536, columns=schema.names):
            done += batch.num_rows
            table = pa.Table.from_batches([batch])
            yield _cast(item, table, schema), item.size * done // total
        return
    raw, stream = _open_stream(item)
    try:
        if item.format == "json":
            from pyarrow import json as pajson

            reader: Any
            reader = pajson.open_json(
                stream,
                read_options=pajson.ReadOptions(block_size=_BLOCK_BYTES),
                parse_options=pajson.ParseOptions(
                    explicit_schema=_read_schema(schema), unexpected_field_behavior="error"
                ),
            )
        else:
            reader = pacsv.open_csv(stream, **_csv_options(item, _read_types(item, schema)))
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except pa.ArrowInvalid as err:
                raise _value_error(item, schema, err) from None
            table = pa.Table.from_batches([batch]).select(schema.names)
            yield _cast(item, table, schema), raw.tell()
    finally:
        raw.close()


def _read_schema(schema: pa.Schema) -> pa.Schema:
    """What text is parsed as: floats as doubles (cast later, checking the range)."""
    return pa.schema(
        [(f.name, pa.float64() if pa.types.is_floating(f.type) else f.type) for f in schema]
    )


def _read_types(item: _Input, schema: pa.Schema) -> dict[str, pa.DataType]:
    return {f.name: f.type for f in _read_schema(schema)}


def _value_error(item: _Input, schema: pa.Schema, err: pa.ArrowInvalid) -> InvalidFileError:
    message = str(err)
    index = re.search(r"column #(\d+)", message)
    value = re.search(r"invalid value '([^']*)'", message)
    if index is None:
        return InvalidFileError(f"{item.path} could not be read: {message}")
    name = item.schema.names[int(index.group(1))]
    target = schema.field(name).type
    shown = f"holds {value.group(1)!r}" if value else "holds a value"
    return InvalidFileError(
        f"{item.path}: column {name!r} {shown}, which is not {target}: the type comes from "
        f"the first rows of the files (or from schema=). Pass --schema {name}=TYPE "
        f"(schema={{{name!r}: ...}}) with a type that holds every value, e.g. "
        f"{'float32' if pa.types.is_integer(target) else 'string'}"
    )


def _cast(item: _Input, table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` as ``schema``: widening freely, narrowing only what fits."""
    columns = []
    for f in schema:
        column = table.column(f.name)
        if column.type != f.type:
            try:
                converted = column.cast(f.type, safe=True)
            except pa.ArrowInvalid as err:
                raise InvalidFileError(
                    f"{item.path}: column {f.name!r} does not fit {f.type} ({err}). Pass "
                    f"--schema {f.name}=TYPE (schema={{{f.name!r}: ...}}) with a wider type"
                ) from None
            if pa.types.is_floating(f.type) and pa.types.is_floating(column.type):
                overflow = pc.and_(pc.is_inf(converted), pc.invert(pc.is_inf(column)))
                if pc.any(overflow).as_py():
                    value = pc.filter(column, overflow)[0].as_py()
                    raise InvalidFileError(
                        f"{item.path}: column {f.name!r} holds {value!r}, beyond the range of "
                        f"{f.type}. Pass --schema {f.name}=float64 (schema={{{f.name!r}: "
                        "'float64'}})"
                    )
            column = converted
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


# -- writing --------------------------------------------------------------------------------


class _SplitWriter:
    """One split's files: row groups of ``row_group_rows`` rows, files of
    ``rows_per_file`` rows, written as the rows arrive."""

    def __init__(
        self, directory: str, schema: pa.Schema, row_group_rows: int, rows_per_file: int
    ) -> None:
        self.directory = directory
        self.schema = schema
        self.row_group_rows = row_group_rows
        self.rows_per_file = rows_per_file
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.writer: pq.ParquetWriter | None = None
        self.file_rows = 0
        self.files: list[str] = []
        self.rows = 0

    def add(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        self.pending.append(table)
        self.pending_rows += table.num_rows
        while self.pending_rows >= self.row_group_rows:
            self._write(self.row_group_rows)

    def _write(self, rows: int) -> None:
        whole = pa.concat_tables(self.pending)
        group, rest = whole.slice(0, rows), whole.slice(rows)
        self.pending = [rest] if rest.num_rows else []
        self.pending_rows = rest.num_rows
        if self.writer is None:
            os.makedirs(self.directory, exist_ok=True)
            path = os.path.join(self.directory, f"part-{len(self.files):05d}.parquet")
            self.writer = pq.ParquetWriter(path, self.schema)
            self.files.append(path)
        self.writer.write_table(group, row_group_size=rows)
        self.rows += rows
        self.file_rows += rows
        if self.file_rows >= self.rows_per_file:
            self.writer.close()
            self.writer = None
            self.file_rows = 0

    def close(self) -> None:
        if self.pending_rows:
            self._write(self.pending_rows)
        if self.writer is not None:
            self.writer.close()
            self.writer = None


@dataclass(frozen=True)
class ConvertResult:
    """What [`convert`][tabloader.convert.convert] did.

    Attributes:
        rows_in: Rows read from the inputs.
        rows_out: Rows written, per split (``{"": n}`` without a split).
        files: The parquet files written, per split, in order.
        schema: The schema every file was written with.
        inputs: The input files, in the order they were read.
        row_group_rows: Rows per row group (the last of each split may hold fewer).
    """

    rows_in: int
    rows_out: dict[str, int]
    files: dict[str, list[str]]
    schema: pa.Schema
    inputs: list[str]
    row_group_rows: int


def convert(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    dest: str | os.PathLike[str],
    *,
    format: Format | None = None,
    header: bool | None = None,
    names: Sequence[str] | None = None,
    delimiter: str | None = None,
    schema: str | Mapping[str, Any] | pa.Schema | None = None,
    split: str | Mapping[str, float] | None = None,
    seed: int = 0,
    row_group_rows: int | None = None,
    rows_per_file: int | None = None,
    transform: Callable[[pa.Table], pa.Table] | None = None,
    overwrite: bool = False,
    progress: TextIO | None = None,
) -> ConvertResult:
    """Convert CSV, TSV, JSON lines and parquet files into parquet the loader reads fast.

    Args:
        sources: Files, directories or globs, read in the order given (files of a
            directory or glob in sorted order).
        dest: The output directory: ``part-00000.parquet``, ... in it, or with
            ``split`` one subdirectory per split (``train/``, ``valid/``). It must be
            empty or absent, unless ``overwrite``.
        format: ``"csv"``, ``"tsv"``, ``"json"`` (JSON lines) or ``"parquet"`` for every
            file; default: from each file's suffix (``.csv``, ``.tsv``, ``.jsonl``,
            ``.parquet``, also compressed as ``.gz``, ``.bz2``, ``.zst``), else from its
            first bytes.
        header: Whether CSV/TSV files start with a header line; default: detected (a
            first line holding no number is a header).
        names: Column names for CSV/TSV files: those of a file without a header, or new
            names replacing a header. Without a header or names, columns are named
            ``f0``, ``f1``, ...
        delimiter: The CSV field separator; default ``,`` (``\\t`` for TSV).
        schema: Types for some or all columns, replacing the inferred ones: a mapping
            ``{column: type}`` (a pyarrow type or a name such as ``"int32"``,
            ``"float64"``, ``"string"``), the text form ``"user=int32,price=float64"``, a
            ``pyarrow.Schema``, or a parquet file whose schema to take. Otherwise
            integers are written as int64, floating point numbers (and columns mixing
            integers and floats) as float32, text as string.
        split: ``{name: fraction}`` (or ``"valid=0.1,test=0.1"``): write each split to
            its own subdirectory, every row to one split by a hash of its values and
            ``seed``; ``train`` gets the rows no named split takes.
        seed: The seed of the split's hash.
        row_group_rows: Rows per row group; default
            [`row_group_rows_for`][tabloader.convert.row_group_rows_for] the schema (131,072 for
            most).
        rows_per_file: Rows per file; default 16 row groups.
        transform: Called on every batch of rows (a ``pyarrow.Table`` with the types
            above, ``schema`` included) before it is written, for encoding columns on
            the way; the types written are its result's, made int64 and float32 by the
            same rules.
        overwrite: Replace the parquet files of a destination that holds some.
        progress: Where to show a progress bar (``sys.stderr``; a bar on a terminal, a
            line every ten seconds elsewhere); default none.

    Returns:
        A [`ConvertResult`][tabloader.convert.ConvertResult]: rows in, rows out per split, the files
        written.

    Raises:
        SourceNotFoundError: an input is missing.
        ColumnNotFoundError: the files do not have the same columns.
        SchemaMismatchError: a column's types differ in ways that do not mix.
        InvalidFileError: a value does not fit its column's type (with the
            ``--schema`` to pass).
        InvalidArgumentError: a bad option, or a destination that is not empty.
    """
    from tabloader.progress import Progress

    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    paths = _expand([os.fspath(s) for s in sources])
    if format is not None and format not in FORMATS:
        raise InvalidArgumentError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if names is not None:
        names = [str(n) for n in names]
        if len(set(names)) != len(names):
            repeated = sorted({n for n in names if names.count(n) > 1})
            raise InvalidArgumentError(f"names must be distinct, {repeated} repeat")
    if delimiter is not None and len(delimiter) != 1:
        raise InvalidArgumentError(f"delimiter must be one character, got {delimiter!r}")
    splits = parse_split(split)
    forced = parse_schema(schema)
    seed = int_at_least(seed, 0, "seed")
    if row_group_rows is not None:
        row_group_rows = int_at_least(row_group_rows, 1, "row_group_rows")
    if rows_per_file is not None:
        rows_per_file = int_at_least(rows_per_file, 1, "rows_per_file")
    inputs = [_describe(p, format) for p in paths]
    text_inputs = [i for i in inputs if i.format in ("csv", "tsv")]
    if names is not None and len(text_inputs) != len(inputs):
        raise InvalidArgumentError(
            "names= names the columns of CSV and TSV files; parquet and JSON files name "
            "their own columns"
        )
    for item in inputs:
        _probe(item, header=header, names=names, delimiter=delimiter)
    read_schema = _common_schema(inputs, forced)
    out_schema = read_schema
    if transform is not None:
        sample = transform(read_schema.empty_table())
        out_schema = pa.schema(
            [(f.name, _target_type(f.name, [("transform", f.type)])) for f in sample.schema]
        )
    group_rows = row_group_rows or row_group_rows_for(out_schema)
    file_rows = rows_per_file or group_rows * ROW_GROUPS_PER_FILE

    root = os.fspath(dest)
    names_out = [*([] if TRAIN in splits else [TRAIN]), *splits]
    targets = {name: os.path.join(root, name) for name in names_out} if splits else {"": root}
    _prepare_destination(root, list(targets.values()), overwrite=overwrite)
    staging = os.path.join(root, f".tabloader-convert-{uuid.uuid4().hex[:12]}")
    writers = {
        name: _SplitWriter(os.path.join(staging, name), out_schema, group_rows, file_rows)
        for name in targets
    }
    rows_in = 0
    total_bytes = sum(i.size for i in inputs)
    bar = (
        Progress(total_bytes, desc="converting", stream=progress, unit="bytes")
        if progress
        else None
    )
    try:
        for item in inputs:
            consumed = 0
            for table, position in _read(item, read_schema):
                rows_in += table.num_rows
                if transform is not None:
                    table = _cast(item, transform(table), out_schema)
                if splits:
                    for name, rows in split_rows(row_hashes(table, seed), splits).items():
                        writers[name].add(table.take(rows))
                else:
                    writers[""].add(table)
                if bar is not None:
                    bar.update(position - consumed)
                consumed = position
            if bar is not None:
                bar.update(item.size - consumed)
        for writer in writers.values():
            writer.close()
        rows_out = {name: w.rows for name, w in writers.items()}
        written = {
            name: sum(pq.read_metadata(f).num_rows for f in w.files) for name, w in writers.items()
        }
        if sum(rows_out.values()) != rows_in or written != rows_out:
            raise InvalidFileError(
                f"read {rows_in:,} rows but wrote {written} (counted {rows_out}): nothing was "
                "moved into place. Report this as a bug"
            )
        files = _move_into_place(writers, targets)
    finally:
        for writer in writers.values():
            if writer.writer is not None:
                writer.writer.close()
        if bar is not None:
            bar.close()
        shutil.rmtree(staging, ignore_errors=True)
    return ConvertResult(rows_in, rows_out, files, out_schema, paths, group_rows)


def _prepare_destination(root: str, directories: list[str], *, overwrite: bool) -> None:
    if os.path.exists(root) and not os.path.isdir(root):
        raise InvalidArgumentError(f"the destination {root!r} is a file; give a directory")
    existing = [
        os.path.join(d, n)
        for d in dict.fromkeys([root, *directories])
        if os.path.isdir(d)
        for n in sorted(os.listdir(d))
        if not n.startswith(".")
    ]
    if not existing:
        return
    parquet = [p for p in existing if os.path.isfile(p) and p.endswith(".parquet")]
    others = [p for p in existing if p not in parquet and p not in directories]
    if not overwrite or others:
        shown = _shorten([os.path.relpath(p, root) for p in (others or existing)], 5)
        raise InvalidArgumentError(
            f"the destination {root!r} is not empty ({shown}): give a new directory"
            + ("" if others else ", or overwrite=True (--overwrite) to replace its parquet files")
        )
    for path in parquet:
        os.remove(path)


def _move_into_place(
    writers: Mapping[str, _SplitWriter], targets: Mapping[str, str]
) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for name, writer in writers.items():
        os.makedirs(targets[name], exist_ok=True)
        files[name] = []
        for path in writer.files:
            final = os.path.join(targets[name], os.path.basename(path))
            os.replace(path, final)
            files[name].append(final)
    return files
