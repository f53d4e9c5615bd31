"""Never convert silently: whether a value fits the dtype it is delivered as.

The loader delivers every column in one dtype (``cat_dtype``, ``cont_dtype``,
``label_dtype``) whatever the files store. A cast that cannot lose anything (int32 to
int64, any integer to float32, float32 to float64) needs no check. Any other cast is
checked, so that nothing wraps around or is cut off in silence:

- an integer target takes whole numbers in its range only: uint64 ids at or above 2**63
  do not fit int64, 0.3 does not fit int8, NaN and infinities fit no integer;
- a floating-point target takes any number within its range (rounded to its precision,
  which is what a float is), and NaN and infinities as stored.

The checks come first from the parquet footers' statistics (the smallest and largest
value of every row group, read at construction): one whose statistics do not fit is an
error before any data is read. Statistics are written by whoever wrote the file and
can be wrong (a page edited, a writer's bug), so on the CPU every column whose cast
could lose something is checked again when its data is read, by `check_values`: its
smallest and largest value (two reductions over the column), and only where those do
not fit (or for floats delivered as integers, whose fractions statistics cannot show)
the values one by one, to name the first that does not fit. On a GPU a verdict is a
wait for the device, so only the columns the statistics cannot vouch for are checked
as they are read (`tabloader.checks.DatasetChecks.read_checks` decides). Option values
that end up in the data (``fill_null``, ``sparse_pad``) follow the same rule, checked
by `fits`.

Every function here is pure and works on numpy or cupy arrays alike (the array module
is taken from the array); only a verdict (one value) is copied to the host.

Examples:
    >>> import numpy as np
    >>> [fits(v, np.dtype("int64")) for v in (2**64 - 1, 300, 2.5)]
    [False, True, False]
    >>> fits(float("nan"), np.dtype("float32")), fits(1e39, np.dtype("float32"))
    (True, False)
    >>> [lossless(np.dtype(a), np.dtype("int64")) for a in ("int32", "uint64")]
    [True, False]
    >>> try:
    ...     check_values(np.array([1, 2**40]), np.dtype("int32"), column="id")
    ... except ValueRangeError as err:
    ...     print(err)  # doctest: +NORMALIZE_WHITESPACE
    column 'id' holds 1099511627776, which does not fit int32, the dtype it is delivered
    as (whole numbers from -2147483648 to 2147483647): it would wrap around. Deliver it as
    a dtype that holds every value (cat_dtype=, cont_dtype= or label_dtype=), or change
    the data
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

import numpy as np

from tabloader.errors import ValueRangeError

if TYPE_CHECKING:
    import pyarrow as pa

    from tabloader.batches import Block, Layout

__all__ = [
    "delivered_fill",
    "holding",
    "checked_layout",
    "check_block",
    "check_values",
    "describe_range",
    "fits",
    "lossless",
    "misfit_message",
    "stored_dtype",
]

Range = tuple[Any, Any]
"""The smallest and the largest value of a column in one partition."""


def _bounds(dtype: np.dtype[Any]) -> tuple[float | int, float | int]:
    """The smallest and largest finite value of a numeric ``dtype`` (exact, as Python
    numbers)."""
    if dtype.kind == "b":
        return 0, 1
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return int(info.min), int(info.max)
    finfo = np.finfo(dtype)
    return float(finfo.min), float(finfo.max)


def lossless(source: np.dtype[Any], target: np.dtype[Any]) -> bool:
    """Whether every value of ``source`` fits ``target``, so a cast needs no check.

    Examples:
        >>> [lossless(np.dtype(a), np.dtype(b)) for a, b in
        ...  [("int8", "uint8"), ("bool", "int8"), ("int64", "float32"), ("float64", "float32")]]
        [False, True, True, False]
    """
    source, target = np.dtype(source), np.dtype(target)
    if source == target or source.kind == "b":
        return True
    if target.kind in "iu":
        if source.kind not in "iu":
            return False
        lo, hi = _bounds(source)
        tlo, thi = _bounds(target)
        return tlo <= lo and hi <= thi
    # A float target: every finite value of the source within its range.
    return float(_bounds(source)[1]) <= float(_bounds(target)[1])


def fits(value: object, target: np.dtype[Any]) -> bool:
    """Whether the number ``value`` is delivered as ``target`` unchanged (for an integer
    target) or within range (for a float target: rounded to its precision; NaN and
    infinities fit as themselves).

    Examples:
        >>> [fits(v, np.dtype("int8")) for v in (127, 128, -128.0, 2.5, float("inf"), True)]
        [True, False, True, False, False, True]
    """
    target = np.dtype(target)
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, Real):
        return False
    if target.kind in "iub":
        lo, hi = _bounds(target)
        if isinstance(value, Integral):
            return lo <= int(value) <= hi
        number = float(value)
        return math.isfinite(number) and number.is_integer() and lo <= int(number) <= hi
    if isinstance(value, Integral):
        return abs(int(value)) <= int(_bounds(target)[1])
    number = float(value)
    return not math.isfinite(number) or abs(number) <= float(_bounds(target)[1])


def describe_range(target: np.dtype[Any]) -> str:
    """What ``target`` holds, for messages.

    Examples:
        >>> describe_range(np.dtype("uint8")), describe_range(np.dtype("float16"))
        ('whole numbers from 0 to 255', 'numbers from -65504.0 to 65504.0')
    """
    target = np.dtype(target)
    lo, hi = _bounds(target)
    kind = "whole numbers" if target.kind in "iub" else "numbers"
    return f"{kind} from {lo} to {hi}"


def misfit_message(
    column: str, value: object, target: np.dtype[Any], *, where: str = "", option: str = ""
) -> str:
    """The message of a value of ``column`` that does not fit ``target``."""
    target = np.dtype(target)
    if isinstance(value, np.generic):
        value = value.item()
    integral = isinstance(value, Integral) or (
        isinstance(value, float) and math.isfinite(value) and value.is_integer()
    )
    effect = (
        "it would wrap around"
        if target.kind in "iu" and integral
        else "it would lose its fraction"
        if target.kind in "iu" and isinstance(value, float) and math.isfinite(value)
        else "no integer is NaN or infinite"
        if target.kind in "iu"
        else "it would become infinite"
    )
    place = f" ({where})" if where else ""
    named = f"{option}={target}" if option else f"{target}, the dtype it is delivered as"
    remedy = (
        f"Pass a {option} that holds every value"
        if option
        else "Deliver it as a dtype that holds every value (cat_dtype=, cont_dtype= or "
        "label_dtype=)"
    )
    return (
        f"column {column!r} holds {value!r}{place}, which does not fit {named} "
        f"({describe_range(target)}): {effect}. {remedy}, or change the data"
    )


def _module(array: Any) -> Any:
    """numpy or cupy, whichever ``array`` belongs to."""
    return sys.modules[type(array).__module__.split(".")[0]]


def _host(value: Any) -> Any:
    """A device scalar or small array on the host (an explicit copy)."""
    get = getattr(value, "get", None)
    return np.asarray(get() if callable(get) else value)


def _misfits(values: Any, target: np.dtype[Any], xp: Any) -> Any:
    """A boolean array: where ``values`` do not fit ``target``."""
    lo, hi = _bounds(target)
    if target.kind in "iu":
        if values.dtype.kind in "iu":
            # (numbers compared as Python ints, so uint64 against int64 bounds is exact)
            below = values < lo if _bounds(values.dtype)[0] < lo else None
            above = values > hi if _bounds(values.dtype)[1] > hi else None
            if below is None:
                return above
            return below if above is None else below | above
        # Floats: finite, whole, and in [lo, hi + 1), whose ends are powers of two
        # (exact in any float), where ``hi`` itself may round up to ``hi + 1``. A bound
        # beyond the float type's own range needs no comparison.
        good = xp.isfinite(values) & (values % 1 == 0)
        largest = float(np.finfo(values.dtype).max)
        if hi + 1 <= largest:
            good = good & (values < float(hi + 1))
        if -largest <= lo:
            good = good & (values >= float(lo))
        return ~good
    limit = float(hi)
    if values.dtype.kind == "f":
        return xp.isfinite(values) & (abs(values) > limit)
    return abs(values.astype(np.float64)) > limit


def _within(values: Any, target: np.dtype[Any]) -> bool:
    """Whether the smallest and the largest of host ``values`` fit ``target`` (so every
    value does), from two reductions; False when they do not, when one is NaN, for
    floats delivered as integers (a fraction hides between), and for device arrays,
    whose verdict is taken from the values at once (one read back to the host)."""
    if values.dtype.kind == "f" and target.kind in "iu":
        return False
    if not isinstance(values, np.ndarray):
        return False
    with np.errstate(invalid="ignore"):
        low, high = values.min().item(), values.max().item()
    lo, hi = _bounds(target)
    return bool(lo <= low and high <= hi)


def check_values(
    values: Any,
    target: np.dtype[Any],
    *,
    column: str,
    where: str = "",
    option: str = "",
) -> None:
    """Raise [`ValueRangeError`][tabloader.errors.ValueRangeError] if a value of the 1-D array
    ``values`` (numpy or cupy) does not fit ``target``, naming the column, the first such value and
    the dtype. Casts that cannot lose anything return at once.

    Examples:
        >>> check_values(np.array([0.0, 1.0, -3.0]), np.dtype("int8"), column="x")
        >>> try:
        ...     check_values(np.array([0.0, 0.3]), np.dtype("int8"), column="x", where="a.pq")
        ... except ValueRangeError as err:
        ...     print(err)  # doctest: +NORMALIZE_WHITESPACE
        column 'x' holds 0.3 (a.pq), which does not fit int8, the dtype it is delivered as
        (whole numbers from -128 to 127): it would lose its fraction. Deliver it as a dtype
        that holds every value (cat_dtype=, cont_dtype= or label_dtype=), or change the data
    """
    target = np.dtype(target)
    if len(values) == 0 or lossless(values.dtype, target) or _within(values, target):
        return
    xp = _module(values)
    with np.errstate(invalid="ignore"):  # (numpy: infinity % 1 is NaN, which is no fit)
        bad = _misfits(values, target, xp)
    if bad is None or not bool(_host(bad.any())):
        return
    first = xp.where(bad)[0][:1]
    value = _host(values[first])[0].item()
    raise ValueRangeError(misfit_message(column, value, target, where=where, option=option))


def holding(dtype: np.dtype[Any], fill: float) -> np.dtype[Any]:
    """``dtype``, or the one nulls are filled in when ``fill`` does not fit it: a file
    may store a column narrower than the type the files widen to (int8 beside int64),
    and the fill was checked against that. A float type holds a fill it represents
    exactly (fills come rounded to the delivered dtype, see `LoaderConfig.fills`): a
    narrower one would round it again (0.1 in float16 is 0.0999755859375).

    Examples:
        >>> holding(np.dtype("int8"), 5), holding(np.dtype("int8"), 1000)
        (dtype('int8'), dtype('int64'))
        >>> holding(np.dtype("float32"), 1e39), holding(np.dtype("uint8"), 0.5)
        (dtype('float64'), dtype('float64'))
        >>> holding(np.dtype("float16"), 0.5), holding(np.dtype("float16"), 0.1)
        (dtype('float16'), dtype('float64'))
    """
    dtype = np.dtype(dtype)
    if fits(fill, dtype) and (dtype.kind != "f" or _exact(fill, dtype)):
        return dtype
    whole = float(fill).is_integer() and dtype.kind in "iub"
    return np.dtype(np.int64 if whole and fits(fill, np.dtype(np.int64)) else np.float64)


def check_block(piece: Mapping[str, Any], block: Block, *, where: str = "") -> None:
    """Check the columns of ``block`` that need it (`Block.checked`) in one decoded ``piece``
    (``{column: values}``, a list column as `Ragged`), before they are cast to the
    block's dtype. Both backends call it where they cast."""
    for column in block.checked:
        values = piece[column]
        values = getattr(values, "values", values)  # a list column: its values
        if values.ndim > 1:  # a vector column: every value of every row
            values = values.reshape(-1)
        check_values(values, block.dtype, column=column, where=where)


def _exact(value: float, dtype: np.dtype[Any]) -> bool:
    """Whether the float ``dtype`` represents ``value`` exactly (NaN and infinities
    included)."""
    number = float(value)
    if not math.isfinite(number):
        return True
    with np.errstate(over="ignore"):
        return float(dtype.type(number)) == number


def delivered_fill(fill: float, dtype: np.dtype[Any]) -> float:
    """``fill`` as the delivered ``dtype`` gives it: rounded to a float dtype's precision
    once (then held exactly by every type at least that wide), as it is for an integer
    dtype.

    Examples:
        >>> delivered_fill(0.1, np.dtype("float32")), delivered_fill(7, np.dtype("int64"))
        (0.10000000149011612, 7)
    """
    dtype = np.dtype(dtype)
    if dtype.kind != "f" or isinstance(fill, bool):
        return fill
    return float(dtype.type(fill))


def checked_layout(layout: Layout, columns: Sequence[str] | frozenset[str]) -> Layout:
    """``layout`` with each block told which of its columns to check when read."""
    from tabloader.batches import Layout

    blocks = tuple(
        replace(b, checked=tuple(c for c in b.columns if c in columns)) for b in layout.blocks
    )
    return Layout(blocks, layout.outputs)


def stored_dtype(arrow_type: pa.DataType) -> np.dtype[Any]:
    """The numpy dtype of a numeric (or boolean) Arrow type, or of a list's values.

    Examples:
        >>> import pyarrow as pa
        >>> stored_dtype(pa.int32()), stored_dtype(pa.list_(pa.float16(), 4))
        (dtype('int32'), dtype('float16'))
    """
    from tabloader.columns import value_type

    return np.dtype(value_type(arrow_type).to_pandas_dtype())
