"""What a column holds across the files of a dataset: one type, and the closest name.

Files written at different times often store a column with different widths (``int32``
in one, ``int64`` in another; ``float`` and ``double``). Both are delivered as the
loader's dtype, so the mix is accepted: `common_type` is the one type all of them widen
to without loss. Only real conflicts (numbers in one file and strings in another, lists
and scalars, integers and floats) are refused. A name that is not a column is answered
with the closest one (`closest_name`).

The ids an id column spans, for embedding tables, are `tabloader.embeddings`' job.

Examples:
    >>> import pyarrow as pa
    >>> common_type(pa.int32(), pa.int64()), common_type(pa.float32(), pa.float64())
    (DataType(int64), DataType(double))
    >>> common_type(pa.int64(), pa.string()) is None
    True
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any, cast

import numpy as np
import pyarrow as pa

__all__ = [
    "closest_name",
    "common_type",
    "is_list_type",
    "type_difference",
    "value_type",
    "vector_width",
]


def is_list_type(field_type: pa.DataType) -> bool:
    """Whether ``field_type`` is a list (``list``, ``large_list``, fixed-size, or a list
    view of either width)."""
    list_kinds = (
        pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list,
        pa.types.is_list_view, pa.types.is_large_list_view,
    )  # fmt: skip
    return any(is_kind(field_type) for is_kind in list_kinds)


def vector_width(field_type: pa.DataType) -> int | None:
    """How many values a row of a fixed-size list column holds (a vector, delivered as a
    ``[B, k]`` block), or None for any other column.

    Examples:
        >>> vector_width(pa.list_(pa.float32(), 768)), vector_width(pa.list_(pa.int64()))
        (768, None)
    """
    if not pa.types.is_fixed_size_list(field_type):
        return None
    size: int = cast("pa.FixedSizeListType[Any]", field_type).list_size
    return size


def value_type(field_type: pa.DataType) -> pa.DataType:
    """The type of a list's values, or ``field_type`` itself for a scalar column."""
    if not is_list_type(field_type):
        return field_type
    values: pa.DataType = cast("pa.ListType[Any]", field_type).value_type
    return values


def common_type(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type both ``a`` and ``b`` widen to without loss, or None for a real conflict.

    Integers of any width and signedness widen to the narrowest integer that holds both
    (``int32`` and ``uint32`` to ``int64``; ``uint64`` with a signed type to ``int64``,
    which is what the loader delivers anyway, and a value that does not fit is an error
    when read); floating point types to the wider one; lists to a list of the common
    value type, fixed-size lists of one size to a fixed-size list of it (of two sizes,
    vectors of other lengths, they conflict). Everything else must match exactly.

    Examples:
        >>> common_type(pa.int8(), pa.uint8()), common_type(pa.float16(), pa.float32())
        (DataType(int16), DataType(float))
        >>> common_type(pa.list_(pa.int32()), pa.large_list(pa.int64()))
        LargeListType(large_list<item: int64>)
        >>> common_type(pa.list_(pa.float16(), 4), pa.list_(pa.float32(), 4))
        FixedSizeListType(fixed_size_list<item: float>[4])
        >>> common_type(pa.list_(pa.float32(), 4), pa.list_(pa.float32(), 8)) is None
        True
        >>> common_type(pa.int64(), pa.float64()) is None  # ids and measurements
        True
    """
    if a == b:
        return a
    if is_list_type(a) and is_list_type(b):
        value = common_type(value_type(a), value_type(b))
        if value is None:
            return None
        if pa.types.is_fixed_size_list(a) and pa.types.is_fixed_size_list(b):
            size: int = a.list_size
            return pa.list_(value, size) if size == b.list_size else None
        large = pa.types.is_large_list(a) or pa.types.is_large_list(b)
        return pa.large_list(value) if large else pa.list_(value)
    both_ints = pa.types.is_integer(a) and pa.types.is_integer(b)
    both_floats = pa.types.is_floating(a) and pa.types.is_floating(b)
    if not (both_ints or both_floats):
        return None
    left, right = np.dtype(a.to_pandas_dtype()), np.dtype(b.to_pandas_dtype())
    widened = np.promote_types(left, right)
    if both_ints and widened.kind == "f":  # uint64 with a signed type
        widened = np.dtype(np.int64)
    return pa.from_numpy_dtype(widened)


def type_difference(a: pa.DataType, b: pa.DataType) -> str:
    """How one file's type of a column relates to another's, for ``inspect``: ``"widened
    to int64"`` or ``"conflict"``.

    Examples:
        >>> type_difference(pa.float32(), pa.float64()), type_difference(pa.int8(), pa.string())
        ('widened to double', 'conflict')
    """
    common = common_type(a, b)
    return "conflict" if common is None else f"widened to {common}"


def closest_name(name: str, names: Iterable[str]) -> str | None:
    """The name in ``names`` most like ``name`` (a typo, another case), or None.

    Examples:
        >>> closest_name("c1", ["label", "C1", "C2"]), closest_name("zzz", ["label"])
        ('C1', None)
    """
    names = list(names)
    by_case = [n for n in names if n.lower() == name.lower()]
    if by_case:
        return by_case[0]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return close[0] if close else None
