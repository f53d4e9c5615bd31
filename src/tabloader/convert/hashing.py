"""Hashes of values and rows, the same on every machine and run, and the splits drawn from them.

A value's hash depends on the value alone: a number on its value (``123``, ``123.0`` and
an ``int32`` 123 hash alike), text on its UTF-8 bytes, a list on its values in order;
nulls all hash to one value. A row's hash combines its values in column order with a
seed. `split_rows` cuts ``[0, 1)`` into the splits' shares and gives each row the split
its hash falls in.

Examples:
    >>> import pyarrow as pa
    >>> h = column_hashes(pa.array([123, None]))
    >>> bool(h[0] == column_hashes(pa.array([123.0]))[0])
    True
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabloader.columns import is_list_type, value_type

__all__ = ["TRAIN", "column_hashes", "row_hashes", "split_rows"]

TRAIN = "train"
"""The split that gets the rows no named split takes."""

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


_TEXT_BYTES = 1 << 20
"""Bytes of text hashed at once: the hash works on a few 8-byte words per byte."""


def _text_hashes(raw: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]) -> Any:
    """One hash per string ``raw[offsets[i]:offsets[i + 1]]``, a slice of rows holding
    about ``_TEXT_BYTES`` at a time, so that memory stays bounded whatever the column."""
    rows = len(offsets) - 1
    cuts = np.searchsorted(offsets, np.arange(offsets[0], offsets[-1], _TEXT_BYTES))
    bounds = np.unique(np.clip(np.r_[0, cuts, rows], 0, rows))
    out = np.empty(rows, dtype=np.uint64)
    for start, stop in itertools.pairwise(bounds.tolist()):
        if stop == start:
            continue
        part = offsets[start : stop + 1]
        out[start:stop] = _segment_hashes(raw[part[0] : part[-1]], part)
    return out


def _integer_hashes(ints: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return _mix(ints.astype(np.int64).view(np.uint64) ^ _GOLDEN)


def column_hashes(column: Any) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """A 64-bit hash of every value of ``column``, the same on every machine and run.

    Equal values hash equally, and nulls all to one value. Numbers hash by their value
    (a whole floating point number like an integer), timestamps by their instant
    (whatever their unit), strings by their UTF-8 bytes, lists by their values in order,
    other types by their text.

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
        if pa.types.is_uint64(kind):
            ints = pc.fill_null(column, 0).to_numpy(zero_copy_only=False).view(np.int64)
        else:
            ints = pc.fill_null(column.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
        out = _integer_hashes(ints)
    elif pa.types.is_floating(kind):
        floats = pc.fill_null(column.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
        values = np.where(floats == 0, 0.0, floats)  # -0.0 and 0.0 are one number
        values = np.where(np.isnan(values), np.nan, values)  # and all NaN one NaN
        out = _mix(values.view(np.uint64) ^ (_GOLDEN >> np.uint64(1)))
        with np.errstate(invalid="ignore"):
            whole = (values == np.trunc(values)) & (np.abs(values) < 2.0**63)
        if whole.any():  # 123.0 is the number 123
            out[whole] = _integer_hashes(values[whole].astype(np.int64))
    elif pa.types.is_timestamp(kind):
        # By the instant, whatever the unit a file was read with (a text file's unit
        # follows its own values): whole seconds and the nanoseconds past them.
        per_second = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[cast(Any, kind).unit]
        ticks = pc.fill_null(column.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
        seconds, part = np.divmod(ticks, per_second)
        nanos = (part * (10**9 // per_second)).astype(np.uint64)
        out = _mix(_integer_hashes(seconds) ^ _mix(nanos + _GOLDEN))
    elif is_list_type(kind):
        lists: Any = column.cast(pa.large_list(value_type(kind)))
        offsets = np.asarray(lists.offsets).astype(np.int64)
        inner = column_hashes(lists.values)[offsets[0] : offsets[-1]]
        out = _segment_hashes(inner, offsets)
    else:  # text, binary, and anything else by its text
        if not (
            pa.types.is_string(kind)
            or pa.types.is_binary(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_large_binary(kind)
        ):
            column = column.cast(pa.string())
        raw_bytes: Any = column.cast(pa.large_binary())
        offsets = np.frombuffer(raw_bytes.buffers()[1], np.int64)[
            raw_bytes.offset : raw_bytes.offset + len(raw_bytes) + 1
        ]
        data = raw_bytes.buffers()[2]
        raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
        out = _text_hashes(raw, offsets)
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
