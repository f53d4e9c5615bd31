"""Checking the options users pass: one place, one message style (value, constraint, remedy).

Every entry point (the core loader, the PyTorch and Keras adapters, the command line)
validates its keywords with these functions, so a value from a config file or a command
line (``shuffle="no"``, ``drop_last="False"``) is refused the same way everywhere instead
of being taken as true.

Examples:
    >>> flag("false", "shuffle")
    Traceback (most recent call last):
    ...
    tabloader.errors.InvalidArgumentError: shuffle must be True or False, got 'false'
    >>> int_at_least(3, 1, "batch_size")
    3
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np

from tabloader.errors import InvalidArgumentError

__all__ = [
    "column_names",
    "flag",
    "int_at_least",
    "is_number",
    "keywords_of",
    "numeric_dtype",
    "one_spelling",
    "optional_positive",
    "ranks",
    "reject_unknown",
]


def flag(value: object, what: str) -> bool:
    """``value`` as a bool, accepting only ``True``/``False`` (and numpy's booleans).

    Strings are refused: ``bool("False")`` is True, which is how ``drop_last="False"``
    from a config file would silently drop the last batch.
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise InvalidArgumentError(f"{what} must be True or False, got {value!r}")


def int_at_least(value: object, minimum: int, what: str) -> int:
    """``value`` as an int, refusing bools, non-integers and values below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < minimum:
        kind = (
            "a positive"
            if minimum == 1
            else "a non-negative"
            if minimum == 0
            else f"an integer >= {minimum}, i.e. a"
        )
        raise InvalidArgumentError(f"{what} must be {kind} integer, got {value!r}")
    return int(value)


def optional_positive(value: object, what: str) -> int | None:
    """None, or a positive int."""
    return None if value is None else int_at_least(value, 1, what)


def is_number(value: object) -> bool:
    """Whether ``value`` is a real number (bools are not)."""
    return isinstance(value, Real) and not isinstance(value, bool)


def column_names(value: str | Sequence[str] | None, what: str) -> tuple[str, ...]:
    """Column names given as one name, a list of names, or None (no columns)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Iterable):
        raise InvalidArgumentError(f"{what} must be a column name or a list of them, got {value!r}")
    names = tuple(value)
    for name in names:
        if not isinstance(name, str):
            raise InvalidArgumentError(f"{what} must be column names (str), got {name!r}")
    return names


def numeric_dtype(value: Any, what: str, *, integer: bool) -> np.dtype[Any]:
    """``value`` as a numpy dtype of integers (``integer=True``) or of any numbers."""
    try:
        dtype: np.dtype[Any] = np.dtype(value)
    except TypeError:
        raise InvalidArgumentError(f"{what} must be a numpy dtype, got {value!r}") from None
    allowed = "iu" if integer else "iuf"
    if dtype.kind == "V" and not integer:  # bfloat16 and other extension dtypes
        raise InvalidArgumentError(
            f"{what}={dtype} is not one of numpy's own number types, which batches are "
            "built with: pass float32 or float16, and convert the arrays in the model"
        )
    if dtype.kind not in allowed:
        kind = "an integer" if integer else "a numeric"
        raise InvalidArgumentError(f"{what} must be {kind} dtype, got {dtype}")
    return dtype


def reject_unknown(
    given: Mapping[str, Any] | Iterable[str], known: Iterable[str], owner: str
) -> None:
    """Raise ``TypeError`` for keywords ``owner`` does not take, suggesting the closest.

    Examples:
        >>> try:
        ...     reject_unknown({"batch_sise": 2}, ["batch_size", "shuffle"], "Loader")
        ... except TypeError as err:
        ...     print(str(err).split("; ")[1])
        did you mean 'batch_size'?
    """
    known = list(known)
    for name in given:
        if name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = (
            f"; did you mean {close[0]!r}?" if close else f"; it accepts {', '.join(sorted(known))}"
        )
        raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}{hint}")


def keywords_of(function: Callable[..., Any]) -> list[str]:
    """The keyword arguments ``function`` takes by name (for `reject_unknown`)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind in kinds and name != "self"
    ]


def one_spelling(values: Mapping[str, Any]) -> Any:
    """The value of an option that has two names, given under at most one of them.

    The core says ``cats``/``conts``/``labels``; NVTabular's Keras loader says
    ``cat_names``/``cont_names``/``label_names``. Every entry point takes both, and None
    means "not given".

    Examples:
        >>> one_spelling({"cats": None, "cat_names": ["user"]})
        ['user']
        >>> try:
        ...     one_spelling({"cats": ["a"], "cat_names": ["b"]})
        ... except ValueError as err:
        ...     print(err)
        cats= and cat_names= are two names for the same option: give one of them
    """
    given = {name: value for name, value in values.items() if value is not None}
    if len(given) > 1:
        first, second = given
        raise InvalidArgumentError(
            f"{first}= and {second}= are two names for the same option: give one of them"
        )
    return next(iter(given.values()), None)


def ranks(
    global_rank: int | None,
    global_size: int | None,
    group: tuple[int, int] | None,
    source: str,
) -> tuple[int, int]:
    """``(global_rank, global_size)``, each taken from ``group`` when not given.

    ``group`` is ``(rank, size)`` of an initialised process group (``source`` names it,
    e.g. ``"torch.distributed"``), None without one: then both default to 0 and 1, and
    giving only one of them raises.

    Examples:
        >>> ranks(None, None, None, "torch.distributed"), ranks(None, 4, (2, 8), "pg")
        ((0, 1), (2, 4))
    """
    if global_rank is None and global_size is None:
        return group if group is not None else (0, 1)
    if global_rank is None or global_size is None:
        if group is None:
            given = "global_size" if global_rank is None else "global_rank"
            missing = "global_rank" if global_rank is None else "global_size"
            raise InvalidArgumentError(
                f"{given} is given but {missing} is not, and {source} is not "
                f"initialised to supply it: pass both global_rank= and global_size="
            )
        if global_rank is None:
            global_rank = group[0]
        if global_size is None:
            global_size = group[1]
    return global_rank, global_size
