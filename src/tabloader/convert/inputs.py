"""Reading the inputs: which files, in which format, with which types, and every value checked.

Each input is probed once (format, header, delimiter, the types its first block of rows
suggests), the types of all inputs are merged into one read type and one written type
per column, and then the rows are read block by block. Nothing is changed silently:

- a column of whole numbers in text (``123`` or pandas' ``123.0``) is written as
  ``int64``; a later fraction in it, or a value beyond ``int64``, is an error naming the
  file, the column, the value and the row (a parquet file's floating point columns stay
  floating point: their type was chosen);
- a column with fractions is written as ``float32``, unless it holds a whole number
  ``float32`` cannot hold exactly (an id near 2**40): that is an error too, unless
  ``schema=`` says which type to write;
- a damaged compressed file, a header naming a column twice and text that is not UTF-8
  are errors naming the file.

Rows are numbered from 1, the first row of data of each file (a header is not counted).
"""

from __future__ import annotations

import csv as csvlib
import glob as globlib
import io
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from tabloader.columns import closest_name, is_list_type, value_type
from tabloader.convert.options import Format
from tabloader.errors import (
    ColumnNotFoundError,
    InvalidArgumentError,
    InvalidFileError,
    SchemaMismatchError,
    SourceNotFoundError,
)
from tabloader.sources.listing import glob_root, refuse_table_files
from tabloader.sources.partitions import hive_values

__all__ = [
    "Input",
    "cast_table",
    "common_schema",
    "describe",
    "expand",
    "probe",
    "read",
    "written_type",
]

SUFFIXES: dict[str, Format] = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".parquet": "parquet",
    ".parq": "parquet",
    ".pq": "parquet",
}
COMPRESSION = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd"}
BLOCK_BYTES = 16 * 2**20
"""Bytes of text parsed at once; column types are inferred from the first block."""
_PARQUET_BATCH_ROWS = 65_536
_INT64_LIMIT = 2.0**63
_ID_LIMIT = 1e20
"""Whole numbers up to this magnitude (20 digits, as many as a 64-bit id has) may be ids:
a column of them is never rounded to floating point silently."""
_EXACT_WHOLE_LIMIT = 2.0**53
"""Above it, float64 cannot tell every whole number from its neighbours."""
_FLOAT32_EXACT = 2**24
"""Integers up to this magnitude are exact in float32."""


@dataclass
class Input:
    """One input file and how to read it (filled in by `probe`)."""

    path: str
    format: Format
    compression: str | None
    size: int
    delimiter: str = ","
    header: bool = False
    names: list[str] | None = None
    schema: pa.Schema = field(default_factory=lambda: pa.schema([]))
    whole: dict[str, bool] = field(default_factory=dict)
    """Per floating point column: whether the first block held whole numbers only."""


def expand(sources: Sequence[str], *, dest: str | None = None) -> list[str]:
    """The input files ``sources`` name (files, directories, globs), in order. A directory
    or glob above ``dest`` (the output directory) leaves out the files in it: what a
    conversion wrote there is not an input of the next; a file of ``dest`` named itself,
    or a directory or glob inside it, is read."""
    files: list[str] = []
    for spec in sources:
        path = os.path.expanduser(spec)
        if "://" in path:
            raise InvalidArgumentError(
                f"convert reads local files, got {spec!r}: copy the files here first"
            )
        if os.path.isfile(path):
            files.append(path)  # named: converted whatever its name
            continue
        if globlib.has_magic(path):
            found = sorted(p for p in globlib.glob(path, recursive=True) if os.path.isfile(p))
            if not found:
                raise SourceNotFoundError(f"the glob {spec!r} matched no files")
        elif os.path.isdir(path):
            found = sorted(_data_files(path))
            if not found:
                raise SourceNotFoundError(
                    f"the directory {spec!r} holds no files (names that start with '_' or "
                    "'.' are a writer's own, skipped: name such a file itself to convert it)"
                )
        else:
            raise SourceNotFoundError(f"{spec!r} does not exist")
        root = path if os.path.isdir(path) else glob_root(path) or "."
        if dest is not None and not _inside(root, dest):
            found = [f for f in found if not _inside(f, dest)]
        kept = [f for f in found if not os.path.basename(f).startswith((".", "_"))]
        if not kept:
            raise SourceNotFoundError(
                f"{spec!r} names only files whose names start with '_' or '.' (a writer's "
                "own files, skipped), or files of the destination: name such a file itself "
                "to convert it"
            )
        _refuse_keys_in_directories(spec, root, kept)
        files.extend(kept)
    refuse_table_files(", ".join(sources), files)
    # One file named twice (a/b.csv and ./a/b.csv, a directory and a file in it) is read
    # once: its rows would be converted twice.
    first: dict[str, str] = {}
    for f in files:
        first.setdefault(os.path.realpath(f), f)
    return list(first.values())


def _inside(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or below it (links followed)."""
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _refuse_keys_in_directories(spec: str, root: str, files: Sequence[str]) -> None:
    """Refuse files found in ``key=value`` directories below ``root`` (a hive layout):
    their keys are in the directories' names, not in the files, and converting the files
    alone would lose them."""
    for path in files:
        keys = hive_values(os.path.relpath(path, root))
        if keys:
            key, value = next(iter(keys.items()))
            raise InvalidArgumentError(
                f"{spec!r} holds files in key=value directories ({key}={value}/ and "
                f"others): their keys ({', '.join(keys)}) are in the directories' names, "
                "not in the files, and converting the files alone would lose them. Convert "
                f"each directory on its own into the same layout (tabloader convert "
                f"SRC/{key}={value} DEST/{key}={value}), which the loader reads the keys from"
            )


def _data_files(directory: str) -> Iterator[str]:
    """The files under ``directory`` but those whose name, or a directory's on the way,
    starts with ``_`` or ``.`` (a vocabulary, a conversion being written, a manifest)."""
    for d, dirs, names in os.walk(directory):
        dirs[:] = [n for n in dirs if not n.startswith((".", "_"))]
        yield from (os.path.join(d, n) for n in names if not n.startswith((".", "_")))


def _open_stream(item: Input) -> tuple[Any, Any]:
    """``(raw file, stream to read)``: the raw file's position tells the progress."""
    raw = pa.OSFile(item.path, "rb")
    if item.compression is None:
        return raw, raw
    return raw, pa.CompressedInputStream(raw, cast(Any, item.compression))


def _damaged(item: Input, err: Exception, rows: int | None = None) -> InvalidFileError:
    after = f" after {rows:,} rows" if rows else ""
    return InvalidFileError(
        f"{item.path}: the {item.compression} stream is damaged{after} ({err}): the file is "
        "truncated, or has bytes after its end. Copy or download it again, or test it "
        f"with `{'gzip' if item.compression == 'gzip' else item.compression} -t`"
    )


def _head(item: Input, limit: int = 1 << 16) -> str:
    raw, stream = _open_stream(item)
    try:
        data = stream.read(limit)
    except OSError as err:
        raise _damaged(item, err) from None
    finally:
        raw.close()
    return bytes(data).decode("utf-8", errors="replace")


def describe(path: str, given: Format | None) -> Input:
    """``path``'s format and compression, from ``given``, its suffix or its first bytes."""
    name = os.path.basename(path).lower()
    stem, suffix = os.path.splitext(name)
    compression = COMPRESSION.get(suffix)
    if compression is not None:
        suffix = os.path.splitext(stem)[1]
    size = os.path.getsize(path)
    kind: Format | None = given or SUFFIXES.get(suffix)
    item = Input(path, kind or "csv", compression, size)
    if kind is None:  # no telling suffix (".txt" tells nothing): look at the text
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


def _first_fields(item: Input, line: int = 0) -> list[str]:
    """The fields of line ``line`` (from 0) of ``item``; none past its first 64 KiB."""
    lines = _head(item).splitlines()
    if len(lines) <= line:
        return []
    return next(csvlib.reader([lines[line]], delimiter=item.delimiter), [])


def _is_header(item: Input, fields: list[str], names: Sequence[str] | None) -> bool:
    """Whether the first line of ``item`` (its ``fields``) is a header: one holding no
    number. With ``names``, such a line followed by another holding no number either may
    be a row of text as well as a header, and which it is would be lost: refused."""
    if not fields or any(_is_number(f) for f in fields):
        return False
    if names is not None and not any(_is_number(f) for f in _first_fields(item, 1)):
        raise InvalidArgumentError(
            f"{item.path}: its first line ({shorten(fields)}) may be a header or a row of "
            "text, and names= (--names) is given: pass header=True (--header) to replace that "
            "line with the names, or header=False (--no-header) to keep it as a row"
        )
    return True


def _csv_options(item: Input, column_types: Mapping[str, pa.DataType] | None) -> dict[str, Any]:
    read = pacsv.ReadOptions(
        block_size=BLOCK_BYTES,
        skip_rows=1 if item.header and item.names is not None else 0,
        column_names=item.names,
        autogenerate_column_names=not item.header and item.names is None,
    )
    return {
        "read_options": read,
        # a quoted value may hold line breaks (spreadsheets and pandas write them); at no
        # measurable cost to the reading
        "parse_options": pacsv.ParseOptions(delimiter=item.delimiter, newlines_in_values=True),
        "convert_options": pacsv.ConvertOptions(
            column_types=dict(column_types or {}),
            # only an empty cell is a null: "NA" (Namibia), "null" (a user's name) and
            # "NaN" (a float) are values, as they are in JSON lines
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=True,
        ),
    }


def probe(
    item: Input, *, header: bool | None, names: Sequence[str] | None, delimiter: str | None
) -> None:
    """Fill in how to read ``item``, the schema its first rows suggest, and which of its
    floating point columns held whole numbers only there."""
    first: pa.RecordBatch | None = None
    if item.format == "parquet":
        try:
            parquet = pq.ParquetFile(item.path, coerce_int96_timestamp_unit="us")
            item.schema = parquet.schema_arrow
            _refuse_repeated_names(item, item.schema.names)
            first = next(parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS), None)
        except (pa.ArrowException, OSError) as err:
            raise InvalidFileError(f"{item.path} is not a readable parquet file ({err})") from err
    elif item.format == "json":
        from pyarrow import json as pajson

        raw, stream = _open_stream(item)
        try:
            options = pajson.ReadOptions(block_size=BLOCK_BYTES)
            reader = pajson.open_json(stream, read_options=options)
            item.schema = reader.schema
            first = _first_batch(reader)
        except OSError as err:
            raise _damaged(item, err) from None
        except pa.ArrowException as err:
            raise InvalidFileError(f"{item.path} is not JSON lines ({err})") from err
        finally:
            raw.close()
        _json_times_as_csv_reads_them(item)
    else:
        item.delimiter = delimiter or ("\t" if item.format == "tsv" else ",")
        fields = _first_fields(item)
        item.header = header if header is not None else _is_header(item, fields, names)
        if names is not None:
            if fields and len(names) != len(fields):
                raise InvalidArgumentError(
                    f"{len(names)} names given, but the first line of {item.path} holds "
                    f"{len(fields)} fields: {shorten(fields)}"
                )
            item.names = list(names)
        elif item.header:
            _refuse_repeated_names(item, fields)
        raw, stream = _open_stream(item)
        try:
            csv_reader = pacsv.open_csv(stream, **_csv_options(item, None))
            item.schema = csv_reader.schema
            first = _first_batch(csv_reader)
        except OSError as err:
            raise _damaged(item, err) from None
        except pa.ArrowException as err:
            raise InvalidFileError(
                f"{item.path} could not be read as {item.format.upper()} ({err})"
            ) from err
        finally:
            raw.close()
        _refuse_undecoded_text(item, first)
        _read_leading_zeros_as_text(item)
    if first is not None and item.format != "parquet":  # a parquet file's types are its own
        for f in item.schema:
            if pa.types.is_floating(f.type):
                item.whole[f.name] = _all_whole(first.column(f.name))


def _read_leading_zeros_as_text(item: Input) -> None:
    """Read as text the integer columns of a CSV file whose first block holds a number
    written with a leading zero: ``007`` and ``7`` are two ids, ``02134`` a zip code."""
    integers = [f.name for f in item.schema if pa.types.is_integer(f.type)]
    if not integers:
        return
    options = _csv_options(item, dict.fromkeys(integers, pa.string()))
    options["convert_options"].include_columns = integers
    raw, stream = _open_stream(item)
    try:
        first = _first_batch(pacsv.open_csv(stream, **options))
    finally:
        raw.close()
    if first is None:
        return
    for name in integers:
        zeros = pc.match_substring_regex(first.column(name), r"^[+-]?0[0-9]")
        if pc.any(zeros).as_py():
            index = item.schema.get_field_index(name)
            item.schema = item.schema.set(index, pa.field(name, pa.string()))


def _json_times_as_csv_reads_them(item: Input) -> None:
    """The JSON reader gives a column of times with and without offsets one type,
    converting those with an offset to UTC and dropping it: read such columns as text,
    typed as the CSV reader types them (with an offset: in UTC; without: as written; a mix:
    text, which time parts refuse)."""
    times = [f.name for f in item.schema if pa.types.is_timestamp(f.type)]
    if not times:
        return
    from pyarrow import json as pajson

    raw, stream = _open_stream(item)
    try:
        explicit = pa.schema([(name, pa.string()) for name in times])
        reader = pajson.open_json(
            stream,
            read_options=pajson.ReadOptions(block_size=BLOCK_BYTES),
            parse_options=pajson.ParseOptions(explicit_schema=explicit),
        )
        first = _first_batch(reader)
    finally:
        raw.close()
    if first is None:
        return
    for name in times:
        index = item.schema.get_field_index(name)
        item.schema = item.schema.set(index, pa.field(name, _time_type(first.column(name))))


def _time_type(text: Any) -> pa.DataType:
    for target in (pa.timestamp("s"), pa.timestamp("s", tz="UTC")):
        try:
            text.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        return target
    return pa.string()


def _first_batch(reader: Any) -> pa.RecordBatch | None:
    try:
        return cast(pa.RecordBatch, reader.read_next_batch())
    except StopIteration:
        return None


def _refuse_repeated_names(item: Input, names: Sequence[str]) -> None:
    repeated = sorted({n for n in names if list(names).count(n) > 1})
    if repeated:
        where = ", ".join(
            f"{n!r} (columns {', '.join(str(i + 1) for i, m in enumerate(names) if m == n)})"
            for n in repeated
        )
        raise InvalidFileError(
            f"{item.path}: the header names {where} more than once, so a column could not "
            "be told from another. Rename them in the file, or pass names= (--names) with a "
            "distinct name for every column"
        )


def _refuse_undecoded_text(item: Input, batch: pa.RecordBatch | None) -> None:
    """Text that is not UTF-8 makes the CSV reader give raw bytes: refused, with the row."""
    if batch is None:
        return
    for f in item.schema:
        if not pa.types.is_binary(f.type):
            continue
        values = batch.column(f.name).to_pylist()
        row, value = next(
            ((i, v) for i, v in enumerate(values) if v is not None and not _utf8(v)),
            (0, b""),
        )
        raise InvalidFileError(
            f"{item.path}: column {f.name!r} holds bytes that are not UTF-8 text, at row "
            f"{row + 1:,}: {value!r}. Save the file as UTF-8 (for example `iconv -f latin1 -t "
            "utf-8`), or correct that row"
        )


def _utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _all_whole(column: Any) -> bool:
    """Whether every value of a floating point column is a whole number (and some have at
    most 20 digits: a column of 1e30s is a measurement, a column of 20-digit ids, even all
    beyond int64, holds ids)."""
    values = column.drop_null().to_numpy(zero_copy_only=False).astype(np.float64)
    if not len(values):
        return False
    with np.errstate(invalid="ignore"):
        return bool(
            np.isfinite(values).all()
            and (values == np.trunc(values)).all()
            and (np.abs(values) <= _ID_LIMIT).any()
        )


def shorten(values: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(v) for v in values[:limit])
    return shown + (f", ... ({len(values)} in all)" if len(values) > limit else "")


# -- one type per column --------------------------------------------------------------------


def _plain(t: pa.DataType) -> pa.DataType:
    return cast(Any, t).value_type if pa.types.is_dictionary(t) else t


def _read_type(
    name: str, types: list[tuple[str, pa.DataType]], forced: pa.DataType | None
) -> pa.DataType:
    """The one type a column is read as, from its types in every file: numbers at full
    width, so that checking them against the written type can name what does not fit."""
    kinds = [_plain(t) for _, t in types if not pa.types.is_null(t)]
    numeric = all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in kinds)
    if forced is not None:
        if pa.types.is_string(forced) or pa.types.is_large_string(forced):
            return pa.string()
        if pa.types.is_floating(forced) and numeric:
            return pa.float64()
        if pa.types.is_integer(forced) and numeric:
            if any(pa.types.is_floating(t) for t in kinds):
                return pa.float64()
            return pa.uint64() if pa.types.is_uint64(forced) else pa.int64()
        return forced
    if not kinds:
        return pa.float64()  # empty everywhere: numbers with nulls are the likeliest
    if all(pa.types.is_integer(t) for t in kinds):
        return pa.uint64() if all(pa.types.is_uint64(t) for t in kinds) else pa.int64()
    if numeric:
        return pa.float64()
    if all(pa.types.is_boolean(t) for t in kinds):
        return pa.bool_()
    if all(pa.types.is_string(t) or pa.types.is_large_string(t) for t in kinds):
        return pa.string()
    if all(pa.types.is_timestamp(t) for t in kinds):
        zones = {cast(Any, t).tz for t in kinds}
        if len(zones) == 1:
            units = ["s", "ms", "us", "ns"]
            unit = max((cast(Any, t).unit for t in kinds), key=units.index)
            return pa.timestamp(unit, tz=zones.pop())
    if all(is_list_type(t) for t in kinds):
        values = [(where, value_type(t)) for where, t in types if is_list_type(t)]
        return pa.list_(_read_type(name, values, None))
    if all(t == kinds[0] for t in kinds):
        return kinds[0]
    listed = "; ".join(f"{t} in {where}" for where, t in types[:4])
    raise SchemaMismatchError(
        f"column {name!r} has types that do not mix ({listed}). Pass schema={{{name!r}: ...}} "
        f"(--schema {name}=TYPE) to convert every file's {name!r} to one type"
    )


def written_type(read: pa.DataType, *, whole: bool) -> pa.DataType:
    """The type a column read as ``read`` is written with: integers as int64, floating
    point as int64 when its values are ``whole`` numbers and float32 otherwise,
    timestamps of seconds as milliseconds (parquet stores no seconds), text as text.

    Examples:
        >>> written_type(pa.float64(), whole=True), written_type(pa.float64(), whole=False)
        (DataType(int64), DataType(float))
        >>> written_type(pa.timestamp("s"), whole=False)
        TimestampType(timestamp[ms])
    """
    if pa.types.is_integer(read):
        return pa.int64()
    if pa.types.is_floating(read):
        return pa.int64() if whole else pa.float32()
    if pa.types.is_timestamp(read) and cast(Any, read).unit == "s":
        return pa.timestamp("ms", tz=cast(Any, read).tz)
    if pa.types.is_large_string(read):
        return pa.string()
    if is_list_type(read):
        return pa.list_(written_type(value_type(read), whole=False))
    return read


def common_schema(
    inputs: list[Input], forced: Mapping[str, pa.DataType]
) -> tuple[pa.Schema, pa.Schema]:
    """``(read schema, written schema)`` of the inputs: every file must have the same
    columns; ``forced`` (``schema=``) decides the types it names."""
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
                + f": every file needs the same columns ({shorten(names)}). Convert them "
                "separately, or name the columns with names= (--names)"
            )
    unknown = [n for n in forced if n not in names]
    if unknown:
        close = closest_name(unknown[0], names)
        raise ColumnNotFoundError(
            f"schema names column {unknown[0]!r}, which the files do not have"
            + (f" (did you mean {close!r}?)" if close else "")
            + f"; they have {shorten(names)}"
        )
    read_fields, written_fields = [], []
    for name in names:
        types = [(i.path, i.schema.field(name).type) for i in inputs]
        read = _read_type(name, types, forced.get(name))
        whole = all(
            pa.types.is_integer(_plain(t)) or i.whole.get(name, False)
            for i, (_, t) in zip(inputs, types, strict=True)
            if not pa.types.is_null(t)
        ) and any(not pa.types.is_null(t) for _, t in types)
        read_fields.append((name, read))
        written_fields.append((name, forced.get(name) or written_type(read, whole=whole)))
    return pa.schema(read_fields), pa.schema(written_fields)


# -- reading --------------------------------------------------------------------------------


def read(item: Input, schema: pa.Schema) -> Iterator[tuple[pa.Table, int, int]]:
    """``item``'s rows with ``schema``'s types (in its column order), the input bytes
    consumed so far, and the number of rows before these in the file."""
    done = 0
    if item.format == "parquet":
        parquet = pq.ParquetFile(item.path, coerce_int96_timestamp_unit="us")
        total = max(parquet.metadata.num_rows, 1)
        try:
            for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=schema.names):
                table = pa.Table.from_batches([batch])
                yield (
                    cast_table(item, table, schema, done),
                    item.size * (done + len(batch)) // (total),
                    done,
                )
                done += batch.num_rows
        except (pa.ArrowException, OSError) as err:
            raise InvalidFileError(f"{item.path} could not be read: {err}") from err
        return
    raw, stream = _open_stream(item)
    try:
        reader: Any
        try:  # the reader converts its first block as it opens
            if item.format == "json":
                from pyarrow import json as pajson

                reader = pajson.open_json(
                    stream,
                    read_options=pajson.ReadOptions(block_size=BLOCK_BYTES),
                    parse_options=pajson.ParseOptions(
                        explicit_schema=_json_schema(item, schema),
                        unexpected_field_behavior="error",
                    ),
                )
            else:
                reader = pacsv.open_csv(stream, **_csv_options(item, _types(schema)))
        except pa.ArrowInvalid as err:
            raise _value_error(item, schema, err, done) from None
        except OSError as err:
            raise _damaged(item, err, done) from None
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except pa.ArrowInvalid as err:
                raise _value_error(item, schema, err, done) from None
            except OSError as err:
                raise _damaged(item, err, done) from None
            table = pa.Table.from_batches([batch]).select(schema.names)
            yield cast_table(item, table, schema, done), raw.tell(), done
            done += batch.num_rows
    finally:
        raw.close()


def _types(schema: pa.Schema) -> dict[str, pa.DataType]:
    return {f.name: f.type for f in schema}


def _json_schema(item: Input, schema: pa.Schema) -> pa.Schema:
    """The types the JSON reader reads ``schema``'s columns with: times as text (its own
    parsing drops their offsets) and numbers as numbers, even for a column read as text
    (it reads no number as text); `cast_table` makes them ``schema``'s."""
    fields: list[Any] = []
    for f in schema:
        found = item.schema.field(f.name).type if f.name in item.schema.names else f.type
        if pa.types.is_timestamp(f.type):
            fields.append(pa.field(f.name, pa.string()))
        elif pa.types.is_string(f.type) and pa.types.is_integer(found):
            fields.append(pa.field(f.name, pa.int64()))
        elif pa.types.is_string(f.type) and pa.types.is_floating(found):
            fields.append(pa.field(f.name, pa.float64()))
        else:
            fields.append(f)
    return pa.schema(fields)


def _value_error(
    item: Input, schema: pa.Schema, err: pa.ArrowInvalid, rows: int
) -> InvalidFileError:
    message = str(err)
    index = re.search(r"column #(\d+)", message)
    value = re.search(r"invalid value '([^']*)'", message)
    after = f" (after row {rows:,})" if rows else ""
    if item.format == "json":
        return _json_value_error(item, schema, message, after)
    if index is None:
        return InvalidFileError(f"{item.path} could not be read{after}: {message}")
    name = item.schema.names[int(index.group(1))]
    row = _row_holding(item, name, value.group(1), rows) if value else None
    if row is not None:
        after = f" at row {row:,}"
    target = schema.field(name).type
    if "invalid UTF8" in message:
        return InvalidFileError(
            f"{item.path}: column {name!r} holds bytes that are not UTF-8 text{after}. Save "
            "the file as UTF-8 (for example `iconv -f latin1 -t utf-8`), or correct that row"
        )
    shown = f"holds {value.group(1)!r}" if value else "holds a value"
    text = value is not None and not _is_number(value.group(1))
    return _not_of_type(item, name, f"{shown}{after}", target, text=text)


def _not_of_type(
    item: Input, name: str, holds: str, target: pa.DataType, *, text: bool
) -> InvalidFileError:
    """A value (``holds``: ``"holds 'x' at row 3"``) of ``text`` or not, that is not of
    its column's type ``target``, with the ``--schema`` that holds it."""
    numeric = pa.types.is_integer(target) or pa.types.is_floating(target)
    if numeric and text:
        wider = "string (text: give it ids with --categorify or --hash)"
    else:
        wider = "float32" if numeric else "string"
    return InvalidFileError(
        f"{item.path}: column {name!r} {holds}, which is not {target}: the type comes "
        f"from the first rows of the files (or from schema=). Pass --schema {name}=TYPE "
        f"(schema={{{name!r}: ...}}) with a type that holds every value, e.g. {wider}"
    )


def _json_value_error(item: Input, schema: pa.Schema, message: str, after: str) -> InvalidFileError:
    """Why the JSON reader could not read ``item`` as ``schema``: its messages name
    neither the column nor the row, so the file is read again, line by line, up to the
    first value that does not fit."""
    types = _json_schema(item, schema)
    found = _json_misfit(item, types)
    if found is None:
        return InvalidFileError(f"{item.path} could not be read{after}: {message}")
    row, name, value = found
    if name not in types.names:
        return InvalidFileError(
            f"{item.path}: row {row:,} has a field {name!r} that the first rows of the files "
            f"have not ({shorten(types.names)}): the columns come from the first rows. Give "
            f"the first rows every field (null where there is no value), or convert the "
            "files separately"
        )
    target = schema.field(name).type
    read_as = types.field(name).type
    shown = repr(value) if isinstance(value, str) else json.dumps(value)
    if pa.types.is_string(target) and isinstance(value, str) != pa.types.is_string(read_as):
        return InvalidFileError(
            f"{item.path}: column {name!r} holds {shown} at row {row:,} after numbers, or a "
            "number after strings: the JSON reader reads a column's values one way, so a "
            "column of text must be written all as JSON strings "
            f'("{name}": "123") in the file'
        )
    if pa.types.is_integer(target) and isinstance(value, int) and not isinstance(value, bool):
        info = np.iinfo(target.to_pandas_dtype())
        return InvalidFileError(
            f"{item.path}: column {name!r} holds {value} at row {row:,}, beyond the range of "
            f"{target} ({info.min:,} to {info.max:,}). Pass --schema {name}=TYPE "
            f"(schema={{{name!r}: ...}}): float64, or {_text_for_ids(item, name)}"
        )
    holds = f"holds {shown} at row {row:,}"
    return _not_of_type(item, name, holds, target, text=isinstance(value, str))


def _json_misfit(item: Input, types: pa.Schema) -> tuple[int, str, Any] | None:
    """``(row, column, value)`` of the first value of ``item`` that is not of its column's
    type in ``types`` (or of a field ``types`` has not); None if there is none."""
    raw, stream = _open_stream(item)
    try:
        lines = io.TextIOWrapper(cast(Any, stream), encoding="utf-8", errors="replace")
        row = 0
        for line in lines:
            if not line.strip():
                continue
            row += 1
            record = json.loads(line)
            for name, value in record.items() if isinstance(record, dict) else ():
                if name not in types.names or not _json_fits(value, types.field(name).type):
                    return row, name, value
    except (ValueError, OSError, pa.ArrowException):
        return None
    finally:
        raw.close()
    return None


def _json_fits(value: Any, kind: pa.DataType) -> bool:
    """Whether the JSON reader reads ``value`` (as Python's json gives it) as ``kind``."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if value is None:
        return True
    if pa.types.is_integer(kind):
        info = np.iinfo(kind.to_pandas_dtype())
        return number and isinstance(value, int) and info.min <= value <= info.max
    if pa.types.is_floating(kind):
        return number
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return isinstance(value, str)
    if pa.types.is_boolean(kind):
        return isinstance(value, bool)
    return not pa.types.is_null(kind)


def _row_holding(item: Input, name: str, value: str, rows: int) -> int | None:
    """The row (from 1) of ``item``'s CSV column ``name`` that first holds the text
    ``value`` after its first ``rows`` rows: the CSV reader names the value it could not
    convert, not its row. The file is read again up to it, that column alone, as text;
    None if it cannot be found (the file changed)."""
    raw, stream = _open_stream(item)
    try:
        options = _csv_options(item, {name: pa.string()})
        options["convert_options"].include_columns = [name]
        seen = 0
        for batch in pacsv.open_csv(stream, **options):
            column = batch.column(0)
            if seen + len(column) > rows:
                skip = max(rows - seen, 0)
                found = pc.index(column.slice(skip), value).as_py()
                if found >= 0:
                    return seen + skip + found + 1
            seen += len(column)
    except (pa.ArrowException, OSError):
        return None
    finally:
        raw.close()
    return None


# -- every value checked --------------------------------------------------------------------


def _numbers(column: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A numeric column's values (nulls as 0) and where they are valid."""
    valid = np.asarray(column.is_valid()) if column.null_count else np.ones(len(column), bool)
    values: np.ndarray[Any, Any] = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
    return values, valid


def _shown(value: Any) -> str:
    if isinstance(value, float) and value == value and value == int(value):
        return f"{int(value)}"
    return repr(value)


def _misfit(
    item: Input, name: str, column: Any, target: pa.DataType, first_row: int, *, forced: bool
) -> InvalidFileError | None:
    """Why ``column`` (numbers) cannot be written as ``target`` without changing a value,
    naming the first value that would change and its row; None when all fit."""
    if pa.types.is_floating(column.type) and pa.types.is_string(target):
        return _digits_lost(item, name, column, first_row)
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        return None
    if not (pa.types.is_integer(target) or pa.types.is_floating(target)):
        return None
    values, valid = _numbers(column)
    fix = f"Pass --schema {name}=TYPE (schema={{{name!r}: ...}})"
    if pa.types.is_integer(target):
        fraction, beyond = _integer_misfits(values, valid, np.dtype(target.to_pandas_dtype()))
        inexact = np.zeros(len(values), bool)
        if values.dtype.kind == "f":
            with np.errstate(invalid="ignore"):
                inexact = valid & ~fraction & ~beyond & (np.abs(values) > _EXACT_WHOLE_LIMIT)
        bad = fraction | beyond | inexact
        if not bad.any():
            return None
        i = int(np.flatnonzero(bad)[0])
        if inexact[i]:
            why = (
                f"a whole number read as floating point (its files store it so, or hold "
                f"numbers beyond int64), which holds whole numbers exactly only up to 2**53 "
                f"({int(_EXACT_WHOLE_LIMIT):,}): the value in the file may differ. {fix}: "
                "string for ids, or float64"
            )
        elif fraction[i] and not forced:
            why = (
                f"which is not a whole number; its first rows held whole numbers only, so it "
                f"is written as {target}. {fix} with a floating point type (float32, float64) "
                "to keep fractions"
            )
        elif fraction[i]:
            why = f"which {target} cannot hold. {fix} with a floating point type"
        else:
            info = np.iinfo(target.to_pandas_dtype())
            why = (
                f"beyond the range of {target} ({info.min:,} to {info.max:,}). {fix}: "
                f"float64, or {_text_for_ids(item, name)}"
            )
        return InvalidFileError(
            f"{item.path}: column {name!r} holds {_shown(values[i].item())} at row "
            f"{first_row + i + 1:,}, {why}"
        )
    narrow = np.dtype(target.to_pandas_dtype())
    with np.errstate(over="ignore", invalid="ignore"):
        converted = values.astype(narrow)
        overflow = valid & np.isinf(converted) & ~np.isinf(values.astype(np.float64))
    if overflow.any():
        i = int(np.flatnonzero(overflow)[0])
        return InvalidFileError(
            f"{item.path}: column {name!r} holds {values[i].item()!r} at row "
            f"{first_row + i + 1:,}, beyond the range of {target}. Pass --schema {name}=float64 "
            f"(schema={{{name!r}: 'float64'}})"
        )
    if forced:
        return None  # the type asked for rounds as it does
    changed = _inexact_wholes(values, valid, converted)
    if not changed.any():
        return None
    i = int(np.flatnonzero(changed)[0])
    return InvalidFileError(
        f"{item.path}: column {name!r} holds {_shown(values[i].item())} at row "
        f"{first_row + i + 1:,}, a whole number {target} cannot hold exactly (it would become "
        f"{_shown(float(converted[i]))}), and the column is written as {target} (it holds "
        f"fractions, or its files store floating point numbers). Pass --schema {name}=int64 "
        f"for ids, or {name}=float64 (schema={{{name!r}: 'float64'}})"
    )


def _digits_lost(item: Input, name: str, column: Any, first_row: int) -> InvalidFileError | None:
    """Numbers read as floating point (a JSON file's) and written as text: a whole number
    beyond 2**53 would not be written with the digits of the file."""
    values, valid = _numbers(column)
    with np.errstate(invalid="ignore"):
        inexact = valid & (values == np.trunc(values)) & (np.abs(values) > _EXACT_WHOLE_LIMIT)
    if not inexact.any():
        return None
    i = int(np.flatnonzero(inexact)[0])
    return InvalidFileError(
        f"{item.path}: column {name!r} holds {_shown(values[i].item())} at row "
        f"{first_row + i + 1:,}, a number read as floating point, which holds whole numbers "
        f"exactly only up to 2**53 ({int(_EXACT_WHOLE_LIMIT):,}): its digits may differ from "
        f"the file's. Write it as text: {_text_for_ids(item, name)}"
    )


def _text_for_ids(item: Input, name: str) -> str:
    """How to keep ids as text: ``--schema NAME=string``, but JSON lines' numbers are read
    as numbers (an id beyond int64 as floating point): ids must be strings in the file."""
    if item.format == "json":
        return (
            f'for ids, JSON strings in the file ("{name}": "123") kept with --schema {name}=string'
        )
    return "string for ids"


def _integer_misfits(
    values: np.ndarray[Any, Any], valid: np.ndarray[Any, Any], target: np.dtype[Any]
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Where ``values`` are not whole numbers, and where they are beyond ``target``."""
    info = np.iinfo(target)
    if values.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            fraction = valid & ~(np.isfinite(values) & (values == np.trunc(values)))
            beyond = (
                valid & ~fraction & ((values < float(info.min)) | (values >= float(info.max) + 1.0))
            )
        return fraction, beyond
    source = np.iinfo(values.dtype)
    low, high = max(info.min, source.min), min(info.max, source.max)
    beyond = valid & ((values < values.dtype.type(low)) | (values > values.dtype.type(high)))
    return np.zeros(len(values), bool), beyond


def _inexact_wholes(
    values: np.ndarray[Any, Any], valid: np.ndarray[Any, Any], converted: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    """Where a whole number (an id, a count) comes out of the narrower type changed."""
    back = converted.astype(np.float64)
    if values.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            whole = (
                valid
                & np.isfinite(values)
                & (values == np.trunc(values))
                & (np.abs(values) <= _ID_LIMIT)
            )
        changed: np.ndarray[Any, Any] = whole & (back != values.astype(np.float64))
        return changed
    inside = np.abs(back) < _INT64_LIMIT
    as_int = np.where(inside, back, 0).astype(np.int64)
    if values.dtype == np.uint64:
        changed = valid & (~inside | (as_int < 0) | (as_int.astype(np.uint64) != values))
    else:
        changed = valid & (~inside | (as_int != values.astype(np.int64)))
    return changed


def cast_table(
    item: Input,
    table: pa.Table,
    schema: pa.Schema,
    first_row: int,
    *,
    forced: frozenset[str] = frozenset(),
) -> pa.Table:
    """``table`` as ``schema``: widening freely, anything else only where every value is
    kept (``forced`` columns: as their type holds them); otherwise an error naming the
    value and its row, counted from ``first_row``."""
    columns = []
    for f in schema:
        column: Any = table.column(f.name)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if column.type != f.type:
            if isinstance(column, pa.ChunkedArray):
                column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
            problem = _misfit(item, f.name, column, f.type, first_row, forced=f.name in forced)
            if problem is not None:
                raise problem
            try:
                column = column.cast(f.type, safe=not pa.types.is_floating(f.type))
            except pa.ArrowInvalid as err:
                raise InvalidFileError(
                    f"{item.path}: column {f.name!r} does not fit {f.type} ({err}). Pass "
                    f"--schema {f.name}=TYPE (schema={{{f.name!r}: ...}}) with a wider type"
                ) from None
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)
