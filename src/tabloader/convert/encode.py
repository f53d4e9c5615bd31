"""Columns encoded on the way: categories as ids, hashed ids, and the parts of timestamps.

`Encodings` holds what was asked (checked against the columns as read), `Encoder`
applies it to every batch of rows:

- ``categorify``: each value's id in its column's vocabulary (`tabloader.vocabulary`:
  0 for a value it does not hold, 1 for a null, 2 for the most frequent value, ...);
- ``hash_buckets``: id 0 for a null and ``1 + hash % (buckets - 1)`` for a value, by
  the 64-bit hash (`column_hashes`) of the value's text (``123`` as ``"123"``, whether
  a day's files are read as numbers or as text; a timestamp by its instant), the same
  on every machine;
- ``time_parts``: a timestamp column replaced by one int64 column per part
  (``event_time_hour``, ...). Text is read as ISO 8601 (``2024-03-01 12:34:56``, with
  or without ``T``, fractions of a second and an offset), integers as seconds since
  1970. A time without an offset is a time in ``time_zone`` (UTC unless given); a
  time with one is converted into it; the parts are counted in ``time_zone``, and
  ``epoch`` is seconds since 1970-01-01 00:00 UTC whatever the zone.

Examples:
    >>> import pyarrow as pa
    >>> encodings = Encodings(hash_buckets={"item": 100}, time_parts={"ts": ["hour", "dow"]})
    >>> table = pa.table({"item": ["a", None], "ts": ["2024-03-01 13:00:00", None]})
    >>> encodings.output_schema(table.schema).names
    ['item', 'ts_hour', 'ts_dow']
    >>> Encoder(encodings, {}).encode(table, "clicks.csv", 0).to_pydict()["ts_hour"]
    [13, None]
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabloader.columns import closest_name, is_list_type
from tabloader.convert.categories import CategoryIndex
from tabloader.convert.hashing import column_hashes
from tabloader.errors import ColumnNotFoundError, ColumnTypeError, InvalidArgumentError
from tabloader.errors import InvalidFileError as _InvalidFileError

__all__ = ["Encoder", "Encodings", "TimeSpan", "categorifiable"]

_EPOCH_SECONDS_LIMIT = 10**11
"""Integers beyond this many seconds (the year 5138) are taken for another unit."""
_UNIT_PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def categorifiable(field_type: pa.DataType) -> bool:
    """Whether a column of ``field_type`` can get a vocabulary: text, integers, booleans,
    dates."""
    return bool(
        pa.types.is_string(field_type)
        or pa.types.is_large_string(field_type)
        or pa.types.is_binary(field_type)
        or pa.types.is_integer(field_type)
        or pa.types.is_boolean(field_type)
        or pa.types.is_date(field_type)
    )


@dataclass(frozen=True)
class Encodings:
    """What to encode: columns to categorify, to hash, and to take parts of timestamps from."""

    categorify: Sequence[str] = ()
    hash_buckets: Mapping[str, int] = field(default_factory=dict)
    time_parts: Mapping[str, Sequence[str]] = field(default_factory=dict)
    time_zone: str = "UTC"

    def __bool__(self) -> bool:
        return bool(self.categorify or self.hash_buckets or self.time_parts)

    def check(self, schema: pa.Schema) -> None:
        """Every column named is in ``schema``, with a type its encoding takes, and
        encoded once.

        Raises:
            ColumnNotFoundError: a column is missing.
            ColumnTypeError: a column's type does not suit its encoding.
            InvalidArgumentError: a column is named by two encodings, or a time part's
                column would replace a column there is.
        """
        named = [
            *(("categorify", n) for n in self.categorify),
            *(("hash", n) for n in self.hash_buckets),
            *(("time_parts", n) for n in self.time_parts),
        ]
        seen: dict[str, str] = {}
        for option, name in named:
            if name in seen:
                raise InvalidArgumentError(
                    f"column {name!r} is named by {seen[name]} and by {option}: encode it once"
                )
            seen[name] = option
            if schema.get_field_index(name) < 0:
                close = closest_name(name, schema.names)
                raise ColumnNotFoundError(
                    f"{option} names column {name!r}, which the files do not have"
                    + (f" (did you mean {close!r}?)" if close else "")
                )
            kind = schema.field(name).type
            if option == "categorify" and not categorifiable(kind):
                raise ColumnTypeError(
                    f"column {name!r} is {kind}; categorify gives ids to text, integers, "
                    "booleans and dates. "
                    + (
                        "A floating point column is a measurement: leave it as it is"
                        if pa.types.is_floating(kind)
                        else "Leave it out of categorify"
                    )
                )
            if option == "hash" and (is_list_type(kind) or pa.types.is_null(kind)):
                raise ColumnTypeError(
                    f"column {name!r} is {kind}; hash takes columns of single values"
                )
            if option == "time_parts" and not (
                pa.types.is_timestamp(kind)
                or pa.types.is_date(kind)
                or pa.types.is_string(kind)
                or pa.types.is_large_string(kind)
                or pa.types.is_integer(kind)
            ):
                raise ColumnTypeError(
                    f"column {name!r} is {kind}; time parts are taken from timestamps, "
                    "ISO 8601 text or integer seconds since 1970"
                )
        for name, parts in self.time_parts.items():
            for part in parts:
                made = f"{name}_{part}"
                if schema.get_field_index(made) >= 0:
                    raise InvalidArgumentError(
                        f"time part {part!r} of column {name!r} makes a column {made!r}, "
                        "which the files already have: rename one"
                    )

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        """The columns written: encoded columns as int64 ids, a timestamp replaced by its
        parts in its place."""
        fields = []
        for f in schema:
            if f.name in self.time_parts:
                fields += [(f"{f.name}_{part}", pa.int64()) for part in self.time_parts[f.name]]
            elif f.name in self.categorify or f.name in self.hash_buckets:
                fields.append((f.name, pa.int64()))
            else:
                fields.append((f.name, f.type))
        return pa.schema(fields)


@dataclass
class TimeSpan:
    """The times one column held: the first and last (seconds since 1970, UTC) and nulls."""

    first: int | None = None
    last: int | None = None
    nulls: int = 0

    def add(self, seconds: np.ndarray[Any, Any], nulls: int) -> None:
        self.nulls += nulls
        if len(seconds):
            low, high = int(seconds.min()), int(seconds.max())
            self.first = low if self.first is None else min(self.first, low)
            self.last = high if self.last is None else max(self.last, high)

    def merge(self, other: TimeSpan) -> None:
        """Add the times ``other`` saw."""
        if other.first is not None and other.last is not None:
            self.add(np.array([other.first, other.last]), 0)
        self.nulls += other.nulls

    def describe(self, zone: str) -> str:
        if self.first is None or self.last is None:
            return "no times (only nulls)"
        shown = [
            dt.datetime.fromtimestamp(s, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
            for s in (self.first, self.last)
        ]
        return f"{shown[0]} to {shown[1]} UTC" + (f" ({self.nulls:,} nulls)" if self.nulls else "")


class Encoder:
    """Encodes batches as `Encodings` says, with the vocabularies ``indexes`` (one per
    categorified column), and keeps the span of every time column it reads."""

    def __init__(self, encodings: Encodings, indexes: Mapping[str, CategoryIndex]) -> None:
        self.encodings = encodings
        self.indexes = dict(indexes)
        self.times: dict[str, TimeSpan] = {n: TimeSpan() for n in encodings.time_parts}

    def encode(self, table: pa.Table, where: str, first_row: int) -> pa.Table:
        """``table`` (a batch of ``where``, its first row ``first_row + 1``) encoded."""
        if not self.encodings:
            return table
        columns: dict[str, Any] = {}
        for name in table.column_names:
            column = table.column(name)
            if name in self.indexes:
                columns[name] = pa.array(self.indexes[name].lookup(column), pa.int64())
            elif name in self.encodings.hash_buckets:
                columns[name] = _hashed(column, self.encodings.hash_buckets[name])
            elif name in self.encodings.time_parts:
                seconds = self._seconds(name, column, where, first_row)
                for part in self.encodings.time_parts[name]:
                    columns[f"{name}_{part}"] = _part(seconds, part, self.encodings.time_zone)
            else:
                columns[name] = column
        return pa.table(columns)

    def _seconds(self, name: str, column: Any, where: str, first_row: int) -> Any:
        """``column``'s times as a timestamp[s] array in UTC."""
        times = _timestamps(name, column, self.encodings.time_zone, where, first_row)
        seconds = _floor_seconds(times)
        valid = np.asarray(pc.is_valid(times))
        self.times[name].add(seconds[valid], int(len(valid) - valid.sum()))
        return pa.array(seconds, pa.timestamp("s", tz="UTC"), mask=~valid)

    def report(self) -> list[str]:
        """What the time parts read, a line per column."""
        zone = self.encodings.time_zone
        return [
            f"{name}: times without an offset read in {zone}, parts counted in {zone}: "
            f"{span.describe(zone)} -> "
            + ", ".join(f"{name}_{p}" for p in self.encodings.time_parts[name])
            for name, span in self.times.items()
        ]


def _hashed(column: Any, buckets: int) -> Any:
    """Hashed ids of ``column``'s values by their text, so that a value's id does not
    depend on the type its files were read as (``123`` a number one day, text the next);
    a timestamp's by its instant, whatever its unit."""
    kind = column.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)) and not (
        pa.types.is_timestamp(kind) or pa.types.is_binary(kind)
    ):
        column = column.cast(pa.string())
    ids = (column_hashes(column) % np.uint64(buckets - 1)).astype(np.int64) + 1
    if column.null_count:
        ids[np.asarray(pc.is_null(column))] = 0
    return pa.array(ids)


def _timestamps(name: str, column: Any, zone: str, where: str, first_row: int) -> Any:
    """A time column as timestamps with ``zone`` (see the module docstring)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    kind = column.type
    if pa.types.is_date(kind):
        column = column.cast(pa.timestamp("s"))
    elif pa.types.is_integer(kind):
        values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
        beyond = np.flatnonzero(np.abs(values.astype(np.float64)) >= _EPOCH_SECONDS_LIMIT)
        beyond = beyond[np.asarray(column.is_valid())[beyond]] if len(beyond) else beyond
        if len(beyond):
            i = int(beyond[0])
            raise _InvalidFileError(
                f"{where}: time column {name!r} holds {values[i]} at row {first_row + i + 1:,}, "
                "which as seconds since 1970 is after the year 5000: it looks like "
                "milliseconds or microseconds. Divide it into seconds first, or write it as "
                "ISO 8601 text"
            )
        column = column.cast(pa.int64()).cast(pa.timestamp("s", tz="UTC"))
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        column = _parse_times(name, column, where, first_row)
    kind = column.type
    if cast(Any, kind).tz is None:
        return pc.assume_timezone(column, zone, ambiguous="earliest", nonexistent="earliest")
    return column.cast(pa.timestamp(cast(Any, kind).unit, tz=zone))


_TEXT_TIME_TYPES = [pa.timestamp(unit, tz=zone) for unit in ("ns", "us") for zone in (None, "UTC")]
"""The types text times are parsed as: to the nanosecond, or to the microsecond for
dates beyond the nanosecond's range (before 1677, after 2262)."""


def _parse_times(name: str, column: Any, where: str, first_row: int) -> Any:
    for target in _TEXT_TIME_TYPES:
        try:
            return column.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    for i, value in enumerate(column.to_pylist()):
        if value is None:
            continue
        if not any(_parses(value, t) for t in _TEXT_TIME_TYPES):
            raise _InvalidFileError(
                f"{where}: time column {name!r} holds {value!r} at row {first_row + i + 1:,}, "
                "which is not an ISO 8601 time (2024-03-01 12:34:56, 2024-03-01T12:34:56Z, "
                "2024-03-01T12:34:56+02:00). Correct it, or leave the column out of "
                "time_parts"
            )
    raise _InvalidFileError(
        f"{where}: time column {name!r} mixes times with and without an offset after row "
        f"{first_row:,}: write them all one way"
    )


def _parses(value: str, target: pa.DataType) -> bool:
    try:
        pa.array([value]).cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def _floor_seconds(times: Any) -> np.ndarray[Any, Any]:
    unit = cast(Any, times.type).unit
    ticks = pc.fill_null(times.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    return cast("np.ndarray[Any, Any]", ticks // _UNIT_PER_SECOND[unit])


def _part(seconds: Any, part: str, zone: str) -> Any:
    if part == "epoch":
        return seconds.cast(pa.int64())
    local = seconds.cast(pa.timestamp("s", tz=zone))
    found: Any = {
        "year": pc.year,
        "month": pc.month,
        "day": pc.day,
        "dow": pc.day_of_week,  # Monday 0 .. Sunday 6
        "hour": pc.hour,
        "minute": pc.minute,
    }[part]
    return found(local).cast(pa.int64())
