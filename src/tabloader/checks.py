"""A loader's options checked against its dataset: what only the data can tell.

`check_dataset` checks a [`LoaderConfig`][tabloader.config.LoaderConfig] against a
[`Dataset`][tabloader.Dataset]: every column present with a type it can be delivered as,
fill values that fit, no nulls without a fill value, values that fit their dtype (as far
as the footers tell), rows for this rank, and a warning for a setup that will be slow.
What it found, `DatasetChecks`, says which columns are checked again as they are read.

Examples:
    >>> import pyarrow as pa, tabloader
    >>> from tabloader.config import LoaderConfig
    >>> config = LoaderConfig.build(batch_size=2, cats=["x"])
    >>> checks = check_dataset(config, tabloader.Dataset(pa.table({"x": [1, 2]})), stacklevel=1)
    >>> checks.types["x"], sorted(checks.narrowed)
    (DataType(int64), [])
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, cast

import numpy as np
import pyarrow as pa

from tabloader.casting import describe_range, fits, lossless, misfit_message, stored_dtype
from tabloader.columns import is_list_type, vector_width
from tabloader.config import LoaderConfig
from tabloader.dataset import SMALL_ROW_GROUP_ROWS, Dataset, small_row_groups
from tabloader.device import Device
from tabloader.errors import (
    ColumnTypeError,
    EmptyDatasetError,
    EmptyEpochWarning,
    InvalidArgumentError,
    NullValuesError,
    PerformanceWarning,
    ValueRangeError,
)
from tabloader.options import is_number
from tabloader.plan import rank_rows

__all__ = ["DatasetChecks", "check_dataset", "encoding_hint"]


@dataclass(frozen=True)
class DatasetChecks:
    """What `check_dataset` found: each column's Arrow type, the columns whose cast to
    their dtype could lose something, those of them the footers' statistics cannot
    vouch for (missing, an infinite bound, a float delivered as an integer), and the
    vector columns (fixed-size lists) with their values a row."""

    types: dict[str, pa.DataType]
    narrowed: frozenset[str]
    unvouched: frozenset[str]
    widths: dict[str, int] = field(default_factory=dict)
    list_values: dict[str, float] = field(default_factory=dict)
    """Each list column's values a row on average, where the footers tell (for sizing
    chunks)."""

    def read_checks(self, device: Device) -> frozenset[str]:
        """The columns whose values are checked as they are read on ``device``: on the
        CPU every cast that could lose something (statistics can be wrong: a page
        edited under its footer); on a GPU those the statistics cannot vouch for, as
        checking the others would make the reader wait for the device at every piece.

        Examples:
            >>> from tabloader.device import Device
            >>> checks = DatasetChecks({}, frozenset("ab"), frozenset("b"))
            >>> [sorted(checks.read_checks(Device(kind))) for kind in ("cpu", "cuda")]
            [['a', 'b'], ['b']]
        """
        return self.unvouched if device.is_cuda else self.narrowed


def check_dataset(config: LoaderConfig, dataset: Dataset, *, stacklevel: int) -> DatasetChecks:
    """Check ``config`` against ``dataset``: every column present with a type it can be
    delivered as, fill values that fit, no nulls without a fill value, values that fit
    their dtype (as far as the footers tell), and rows for this rank; warn about a
    setup that will be slow. ``stacklevel`` points the warnings at the user's call.

    Raises:
        ColumnNotFoundError, SchemaMismatchError: a column is missing, or of conflicting
            types across files.
        ColumnTypeError: a column's type cannot be delivered as its option asks.
        InvalidArgumentError: a fill value does not fit.
        NullValuesError: a column holds nulls and has no fill value.
        ValueRangeError: a value does not fit its delivered dtype.
        EmptyDatasetError: the dataset has no rows.
    """
    types = dataset.column_types(config.columns)
    _check_types(config, types, dataset)
    _check_fill(config, types)
    _check_nulls(config, dataset)
    narrowed, unvouched = _check_ranges(config, types, dataset)
    _check_size(config, dataset, stacklevel=stacklevel + 1)
    widths = {
        name: width
        for name, t in types.items()
        if name not in config.sparse_names and (width := vector_width(t)) is not None
    }
    return DatasetChecks(types, narrowed, unvouched, widths, _list_values(config, dataset))


def _list_values(config: LoaderConfig, dataset: Dataset) -> dict[str, float]:
    """Each list column's values a row, on average over the row groups whose footers
    record them (the values of a list column's leaves)."""
    out: dict[str, float] = {}
    for name in config.sparse_names:
        found = dataset.source.footer_statistics(name)
        rows = values = 0
        for partition, stats in enumerate(found or ()):
            if stats is not None and stats.values is not None:
                rows += int(dataset.partition_rows[partition])
                values += stats.values
        if rows:
            out[name] = values / rows
    return out


def _check_types(config: LoaderConfig, types: Mapping[str, pa.DataType], dataset: Dataset) -> None:
    where = dataset.files[0] if dataset.files else "the table"
    for name, t in types.items():
        width = vector_width(t)
        if width is not None and name not in config.sparse_names:
            _check_vector(config, name, t, width, where)
            continue
        is_list = is_list_type(t)
        if name in config.sparse_names:
            value = getattr(t, "value_type", None)
            numeric = value is not None and (
                pa.types.is_integer(value)
                or pa.types.is_boolean(value)
                or (pa.types.is_floating(value) and name in config.conts)
            )
            if not numeric:
                kind = "integer ids" if name in config.cats else "numbers"
                raise ColumnTypeError(
                    f"list column {name!r} is {t} in {where}; sparse_names must be lists of "
                    f"{kind} (list<int64>, for example)"
                    + ("" if is_list else ". Leave it out of sparse_names")
                )
            continue
        if is_list:
            raise ColumnTypeError(
                f"column {name!r} is {t} in {where}, a list column: name it in "
                f"sparse_names=[{name!r}] to read it as values + offsets (or padded)"
            )
        if name in config.cats:
            if not (pa.types.is_integer(t) or pa.types.is_boolean(t)):
                raise ColumnTypeError(
                    f"categorical column {name!r} is {t} in {where}; cats must hold integer "
                    f"ids. {encoding_hint(name, t)}"
                )
        elif not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
            kind = "label" if name in config.labels else "continuous column"
            raise ColumnTypeError(
                f"{kind} {name!r} is {t} in {where}; conts and labels must be numeric "
                f"(integer, floating point or boolean). {encoding_hint(name, t)}"
            )


def _check_vector(config: LoaderConfig, name: str, t: pa.DataType, width: int, where: str) -> None:
    """A fixed-size list is a vector, delivered as a ``[B, k]`` block: of numbers, ids
    for cats."""
    value = cast("pa.FixedSizeListType[Any]", t).value_type
    numeric = pa.types.is_integer(value) or pa.types.is_boolean(value)
    if not numeric and not pa.types.is_floating(value):
        raise ColumnTypeError(
            f"column {name!r} is {t} in {where}, a vector of {value}; vector columns "
            "(fixed-size lists, delivered as [B, k]) must hold numbers (integer, floating "
            "point or boolean). Convert it, or leave it out"
        )
    if name in config.cats and not numeric:
        raise ColumnTypeError(
            f"categorical column {name!r} is {t} in {where}, a vector of {value}; cats "
            "must hold integer ids. List it under conts (a vector of numbers), or encode "
            "its values as integer ids"
        )
    if width < 1:
        raise ColumnTypeError(
            f"column {name!r} is {t} in {where}: a vector of no values holds nothing to "
            "deliver. Leave it out"
        )


def encoding_hint(name: str, field_type: pa.DataType) -> str:
    """How to make a column of ``field_type`` loadable, for an error or ``inspect``.

    Examples:
        >>> encoding_hint("country", pa.string()).split(" (or")[0]
        'Give it integer ids with tabloader convert --categorify country'
    """
    if pa.types.is_string(field_type) or pa.types.is_large_string(field_type):
        return (
            f"Give it integer ids with tabloader convert --categorify {name} (or --hash "
            f"{name}=BUCKETS)"
        )
    if pa.types.is_timestamp(field_type) or pa.types.is_date(field_type):
        return (
            f"Take its parts as integers with tabloader convert --time-parts "
            f"{name}=hour,dow (or epoch)"
        )
    if pa.types.is_floating(field_type):
        return "A floating point column is a measurement: list it under conts"
    return "Leave it out, or convert it to numbers first"


def _check_fill(config: LoaderConfig, types: Mapping[str, pa.DataType]) -> None:
    for name, value in config.fill_null.items():
        if not is_number(value):
            raise InvalidArgumentError(f"fill_null for {name!r} must be a number, got {value!r}")
        # Nulls are filled in the stored type (or one that holds the fill), then
        # delivered: the value must fit what is delivered, and an id (delivered as
        # integers) must be one the column's own type holds too.
        stored, delivered = stored_dtype(types[name]), config.dtypes[name]
        if delivered.kind in "iub" and not fits(value, stored):
            whole = "a whole number" if stored.kind in "iub" else "a number"
            raise InvalidArgumentError(
                f"fill_null for {name!r} must be {whole} that fits {stored}, the "
                f"type the column is stored as ({describe_range(stored)}), got {value!r}"
            )
        if not fits(value, delivered):
            option = config.dtype_option(name)
            raise InvalidArgumentError(
                f"fill_null for {name!r} is {value!r}, which does not fit {option}="
                f"{delivered} ({describe_range(delivered)}). Pass a fill value that fits, "
                f"or another {option}"
            )


def _check_nulls(config: LoaderConfig, dataset: Dataset) -> None:
    """Every column with nulls and no fill value, in one error with the fill to pass."""
    found = []
    for name in config.dtypes:
        if name in config.fill_null or name in config.sparse_names:
            continue  # null lists are empty lists; nulls inside raise when read
        flags = dataset.null_partitions(name)
        bad = np.flatnonzero(flags == 1)
        if len(bad):
            more = f" and {len(bad) - 1} more partition(s)" if len(bad) > 1 else ""
            found.append((name, f"{dataset.describe_partition(int(bad[0]))}{more}"))
    if not found:
        return
    fill = {**config.fill_null, **dict.fromkeys((name for name, _ in found), 0)}
    where = "; ".join(f"{name!r} in {place}" for name, place in found)
    flag = ",".join(f"{name}={value:g}" for name, value in fill.items())
    columns = "column" if len(found) == 1 else f"{len(found)} columns"
    raise NullValuesError(
        f"{columns} with null values and no fill value: {where}. Fill them in the data, or "
        f"pass fill_null={fill!r} (any numbers) to the loader; on the command line, "
        f"--fill-null {flag}"
    )


def _check_ranges(
    config: LoaderConfig, types: Mapping[str, pa.DataType], dataset: Dataset
) -> tuple[frozenset[str], frozenset[str]]:
    """The columns whose cast could lose something, and those of them the statistics
    cannot vouch for; raises [`ValueRangeError`][tabloader.errors.ValueRangeError] when a
    footer's statistics show a value that does not fit the column's delivered dtype.

    A column whose stored type fits its dtype needs no check; otherwise every row
    group's statistics must fit it (see `DatasetChecks.read_checks` for what is
    checked again as it is read).
    """
    narrowed, unvouched = set(), set()
    for name, kind in types.items():
        # each file's own type, not only the one they widen to: uint64 ids beside int32
        # ones widen to int64, which does not hold what uint64 may
        target = config.dtypes[name]
        sources = {stored_dtype(t) for t in (kind, *dataset.stored_types(name))}
        if all(lossless(source, target) for source in sources):
            continue
        narrowed.add(name)
        ranges = dataset.value_ranges(name)
        for partition, extremes in enumerate(ranges):
            for value in extremes or ():
                if not fits(value, target):
                    raise ValueRangeError(
                        misfit_message(
                            name,
                            value,
                            target,
                            where=dataset.describe_partition(partition),
                            option=config.dtype_option(name),
                        )
                    )
        floats = any(source.kind == "f" for source in sources)
        if (floats and target.kind in "iu") or not all(map(_bounded, ranges)):
            unvouched.add(name)
    return frozenset(narrowed), frozenset(unvouched)


def _bounded(extremes: tuple[Any, Any] | None) -> bool:
    """Whether a row group's statistics bound its values: both ends known and finite
    (a maximum of infinity says nothing of the finite values below it).

    Examples:
        >>> _bounded((1, 5)), _bounded((0.5, float("inf"))), _bounded(None)
        (True, False, False)
    """
    if extremes is None:
        return False
    return all(isinstance(v, Real) and math.isfinite(v) for v in extremes)


def _check_size(config: LoaderConfig, dataset: Dataset, *, stacklevel: int) -> None:
    if dataset.num_rows == 0:
        raise EmptyDatasetError(dataset.no_rows_message())
    rank, size = config.global_rank, config.global_size
    if config.batches_per_epoch(dataset.num_rows) == 0:
        lo, hi = rank_rows(dataset.num_rows, global_rank=rank, global_size=size)
        # torch's convention (DataLoader with drop_last=True over too few samples):
        # the loader is empty, not an error.
        why, remedy = (
            (
                f", fewer than batch_size={config.batch_size} with drop_last=True",
                "Lower batch_size or set drop_last=False",
            )
            if config.drop_last
            else ("", "Use fewer ranks")
        )
        warnings.warn(
            f"this loader yields no batch: rank {rank} of {size} gets {hi - lo} of "
            f"{dataset.num_rows} rows{why}, so len(loader) == 0 and every epoch is empty. "
            f"{remedy}",
            EmptyEpochWarning,
            stacklevel=stacklevel + 1,
        )
    parts = dataset.num_partitions
    if size > parts:
        warnings.warn(
            f"{size} ranks share {parts} partitions: every rank decodes whole "
            "row groups to use a fraction of them. Write more, smaller row groups",
            PerformanceWarning,
            stacklevel=stacklevel + 1,
        )
    median = small_row_groups(dataset.partition_rows)
    if median is not None:
        warnings.warn(
            f"row groups hold {median:,.0f} rows (median); reading is slow below "
            f"{SMALL_ROW_GROUP_ROWS:,} rows per row group. Rewrite the files with a "
            "row_group_size of 64k to 1M rows",
            PerformanceWarning,
            stacklevel=stacklevel + 1,
        )
