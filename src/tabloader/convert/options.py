"""The options of a conversion, checked and put in one form: from Python or from the command line.

Each parser takes the command line's text (``"valid=0.1,test=0.05"``) or the Python
value (a mapping, a list) and returns one checked form, so that ``tabloader convert``
and [`convert`][tabloader.convert.convert] accept the same things and say the same
things about what is wrong.

Examples:
    >>> parse_hash_buckets("item_id=1000"), parse_time_parts("ts=hour,dow")
    ({'item_id': 1000}, {'ts': ['hour', 'dow']})
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from tabloader.columns import closest_name
from tabloader.convert.hashing import TRAIN
from tabloader.errors import InvalidArgumentError

__all__ = [
    "FORMATS",
    "MAX_HASH_BUCKETS",
    "TIME_PARTS",
    "TYPE_NAMES",
    "Format",
    "parse_columns",
    "parse_hash_buckets",
    "parse_schema",
    "parse_split",
    "parse_time_parts",
    "parse_time_zone",
]

Format = Literal["csv", "tsv", "json", "parquet"]
"""The input formats: ``"json"`` is JSON lines, one object per line."""
FORMATS: tuple[Format, ...] = ("csv", "tsv", "json", "parquet")
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
MAX_HASH_BUCKETS = 2**63
"""The most buckets a hashed column may have: its ids, up to ``buckets - 1``, are int64."""


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
        try:
            return {f.name: f.type for f in pq.read_schema(text)}
        except (pa.ArrowException, OSError) as err:
            raise InvalidArgumentError(
                f"--schema {text!r} names a file that is not a parquet file ({err}): give "
                "a parquet file whose schema to take, or NAME=TYPE pairs (id=int64,x=float32)"
            ) from None
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


TIME_PARTS = {
    "epoch": "seconds since 1970-01-01 00:00 UTC",
    "year": "the year",
    "month": "1 to 12",
    "day": "the day of the month, 1 to 31",
    "dow": "the day of the week, 0 (Monday) to 6 (Sunday)",
    "hour": "0 to 23",
    "minute": "0 to 59",
}
"""The parts ``time_parts=``/``--time-parts`` can take from a timestamp, and their values."""


def parse_columns(text: str | Sequence[str] | None, what: str) -> list[str]:
    """Column names: ``"a,b"`` or a sequence of names (each may hold commas), distinct.

    Examples:
        >>> parse_columns(["user_id,item_id", "country"], "categorify")
        ['user_id', 'item_id', 'country']
    """
    if text is None:
        return []
    parts = [text] if isinstance(text, str) else list(text)
    names: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise InvalidArgumentError(f"{what} names columns, got {part!r}")
        names += [n.strip() for n in part.split(",") if n.strip()]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InvalidArgumentError(f"{what} names {', '.join(map(repr, repeated))} twice")
    return names


def _pairs(text: str | Sequence[str] | Mapping[str, Any], what: str, form: str) -> dict[str, Any]:
    if isinstance(text, Mapping):
        return dict(text)
    parts = [text] if isinstance(text, str) else list(text)
    found: dict[str, Any] = {}
    for part in parts:
        if not isinstance(part, str):
            raise InvalidArgumentError(f"{what} takes {form}, got {part!r}")
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise InvalidArgumentError(f"{what} takes {form}, got {part!r}")
        if name.strip() in found:
            raise InvalidArgumentError(f"{what} names {name.strip()!r} twice")
        found[name.strip()] = value.strip()
    return found


def parse_hash_buckets(
    text: str | Sequence[str] | Mapping[str, int] | None,
) -> dict[str, int]:
    """``{column: buckets}`` from ``"item_id=1000,ad_id=5000"`` (or a mapping). A column's
    ids are then 0 for a null and 1 to ``buckets - 1`` for its values, by their hash: at
    most 2**63 buckets, so that every id is an int64.

    Examples:
        >>> parse_hash_buckets({"item_id": 1 << 20})
        {'item_id': 1048576}
    """
    if text is None:
        return {}
    if isinstance(text, str):
        text = [text]
    if not isinstance(text, Mapping):
        text = [p for part in text for p in str(part).split(",") if p.strip()]
    found = {}
    for name, value in _pairs(text, "hash", "COLUMN=BUCKETS (item_id=100000)").items():
        try:
            buckets = int(str(value).replace("_", ""))
        except ValueError:
            buckets = -1
        if isinstance(value, bool) or buckets < 2:
            raise InvalidArgumentError(
                f"the buckets of hashed column {name!r} must be an integer of at least 2 "
                f"(id 0 is for nulls), got {value!r}"
            )
        if buckets > MAX_HASH_BUCKETS:
            raise InvalidArgumentError(
                f"the buckets of hashed column {name!r} must be at most 2**63 "
                f"({MAX_HASH_BUCKETS:,}: ids are int64), got {value!r}"
            )
        found[name] = buckets
    return found


def parse_time_parts(
    text: str | Sequence[str] | Mapping[str, str | Sequence[str]] | None,
) -> dict[str, list[str]]:
    """``{column: [part, ...]}`` from ``"event_time=hour,dow,day"`` (one column per
    string; a list of such strings for several columns) or a mapping; the parts are
    the keys of `TIME_PARTS`.

    Examples:
        >>> parse_time_parts(["ts=hour,dow", "seen=epoch"])
        {'ts': ['hour', 'dow'], 'seen': ['epoch']}
    """
    if text is None:
        return {}
    found: dict[str, list[str]] = {}
    form = "COLUMN=PART,... (event_time=hour,dow,day)"
    for name, value in _pairs(text, "time parts", form).items():
        parts = value.split(",") if isinstance(value, str) else list(value)
        parts = [str(p).strip().lower() for p in parts if str(p).strip()]
        unknown = [p for p in parts if p not in TIME_PARTS]
        if unknown or not parts:
            close = closest_name(unknown[0], TIME_PARTS) if unknown else None
            raise InvalidArgumentError(
                f"the time parts of column {name!r} must be some of {', '.join(TIME_PARTS)}"
                + (f"; got {unknown[0]!r}" if unknown else "; got none")
                + (f" (did you mean {close!r}?)" if close else "")
            )
        if len(set(parts)) != len(parts):
            raise InvalidArgumentError(f"the time parts of column {name!r} repeat: {parts}")
        found[name] = parts
    return found


def parse_time_zone(zone: str | None) -> str:
    """The time zone timestamps are read and counted in: ``"UTC"`` unless given, an IANA
    name such as ``"Europe/Paris"`` (or a fixed offset, ``"+02:00"``).

    Examples:
        >>> parse_time_zone(None), parse_time_zone("Europe/Paris")
        ('UTC', 'Europe/Paris')
    """
    if zone is None:
        return "UTC"
    if not isinstance(zone, str) or not zone.strip():
        raise InvalidArgumentError(f"time_zone must be a zone name such as 'UTC', got {zone!r}")
    zone = zone.strip()
    if re.fullmatch(r"[+-]\d\d:\d\d", zone):
        return zone
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidArgumentError(
            f"unknown time zone {zone!r}: give an IANA name such as 'UTC', 'Europe/Paris' or "
            "'America/New_York', or an offset such as '+02:00'"
        ) from None
    return zone
