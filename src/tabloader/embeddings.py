"""The ids an id column spans, and the embedding table for them.

To size an embedding table, a column's smallest and largest id come from the footer
statistics of every row group (`id_ranges`); a row group whose footer records none is
read, on the device the loader would use, and the result says so. `distinct_ids` counts
the ids a column uses, `embedding_dim` picks a table's width and `embedding_advice`
says what to do about a table too large. ``Dataset.embedding_sizes`` and ``tabloader
inspect`` are built on these; they read a dataset through the queries of
`tabloader.partitioned.Partitioned` alone, so that this module sits below
``tabloader.dataset``.

Examples:
    >>> embedding_dim(1_000_000), embedding_dim(10)
    (512, 16)
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabloader.columns import is_list_type, value_type
from tabloader.errors import ColumnTypeError, EmbeddingSizeWarning, InvalidArgumentError
from tabloader.options import column_names, int_at_least
from tabloader.sources.formats import DeviceChunk, RowGroups
from tabloader.vocabulary import find_vocabulary_dir, vocabulary_columns, vocabulary_rows

if TYPE_CHECKING:
    from tabloader.device import Device
    from tabloader.partitioned import Partitioned

__all__ = [
    "EMBEDDING_BUDGET_BYTES",
    "IdRange",
    "distinct_ids",
    "embedding_advice",
    "embedding_bytes",
    "embedding_dim",
    "embedding_sizes",
    "id_ranges",
]

MIN_EMBEDDING_DIM = 16
MAX_EMBEDDING_DIM = 512
EMBEDDING_BUDGET_BYTES = 2**30
"""Above this many bytes, an embedding table is worth a warning (1 GiB, float32 weights)."""


@dataclass(frozen=True)
class IdRange:
    """The ids one column holds: the smallest and largest, and how they were found.

    Attributes:
        column: The column's name.
        min: The smallest id, None when the column holds no value (only nulls).
        max: The largest id, None when the column holds no value.
        partitions: Partitions (row groups) of the dataset.
        partitions_read: Partitions whose footer recorded no statistics for the column,
            which were read to find their ids (all of them for in-memory sources).
    """

    column: str
    min: int | None
    max: int | None
    partitions: int
    partitions_read: int

    @property
    def cardinality(self) -> int:
        """Rows an embedding table needs for every id: ``max + 1`` (ids start at 0), and
        1 for a column with no values."""
        return 1 if self.max is None else self.max + 1

    @property
    def from_footers(self) -> bool:
        """Whether the footers alone told (no row group had to be read)."""
        return self.partitions_read == 0


def embedding_dim(
    cardinality: int, *, min_dim: int = MIN_EMBEDDING_DIM, max_dim: int = MAX_EMBEDDING_DIM
) -> int:
    """A width for an embedding table of ``cardinality`` rows: fastai's rule of thumb
    ``round(1.6 * cardinality ** 0.56)``, within ``[min_dim, max_dim]`` (the rule
    NVTabular's ``get_embedding_sizes`` uses, with the same bounds).

    Examples:
        >>> [embedding_dim(n) for n in (2, 1_000, 100_000)]
        [16, 77, 512]
    """
    return int(min(max(min_dim, round(1.6 * cardinality**0.56)), max_dim))


def embedding_bytes(rows: int, width: int, *, itemsize: int = 4) -> int:
    """Bytes of an embedding table's weights (float32 by default), before the optimizer's
    state (Adam keeps two more tables of the same size).

    Examples:
        >>> embedding_bytes(5_279_480, 512) / 2**30
        10.069...
    """
    return rows * width * itemsize


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def embedding_advice(
    name: str,
    rows: int,
    width: int,
    *,
    distinct: int | None,
    budget_bytes: int = EMBEDDING_BUDGET_BYTES,
    from_vocabulary: bool = False,
) -> str | None:
    """What to do about an embedding table above ``budget_bytes``, or None below it.

    Examples:
        >>> print(embedding_advice("user", 5_279_480, 512, distinct=48_213))  # doctest: +ELLIPSIS
        the embedding table of 'user' has 5,279,480 rows x 512 = 10.1 GiB of float32 weights ...
    """
    size = embedding_bytes(rows, width)
    if size <= budget_bytes:
        return None
    text = (
        f"the embedding table of {name!r} has {rows:,} rows x {width} = {_gib(size)} of "
        f"float32 weights (before the optimizer's state), above {_gib(budget_bytes)}"
    )
    if from_vocabulary:
        return text + (
            f". Raise the minimum count of its vocabulary (tabloader convert --categorify "
            f"{name} --min-count N), or hash it (--hash {name}=BUCKETS)"
        )
    if distinct is not None and distinct < rows // 2:
        return text + (
            f": its ids run to {rows - 1:,} but only {distinct:,} are used. Give them "
            f"contiguous ids with tabloader convert --categorify {name} ({distinct + 2:,} rows), "
            f"or hash them (--hash {name}=BUCKETS)"
        )
    return text + (
        f". Keep the frequent ids only (tabloader convert --categorify {name} --min-count N), "
        f"hash them into fewer rows (--hash {name}=BUCKETS), or use a narrower width"
    )


def embedding_sizes(
    dataset: Partitioned,
    columns: str | Sequence[str],
    *,
    device: Any,
    min_dim: int,
    max_dim: int,
    vocabulary: str | os.PathLike[str] | None,
    budget_bytes: int,
) -> dict[str, tuple[int, int]]:
    """``{column: (rows, width)}`` for an embedding table per id column, rows from
    ``vocabulary`` where it holds the column, with a warning for a table above
    ``budget_bytes`` (``Dataset.embedding_sizes`` says more)."""
    min_dim = int_at_least(min_dim, 1, "min_dim")
    max_dim = int_at_least(max_dim, min_dim, "max_dim")
    budget_bytes = int_at_least(budget_bytes, 1, "budget_bytes")
    names = column_names(columns, "columns")
    held: dict[str, str] = {}
    if vocabulary is not None:
        directory = find_vocabulary_dir(vocabulary)
        held = {n: directory for n in vocabulary_columns(directory) if n in names}
    rows = {n: vocabulary_rows(held[n], n) for n in held}
    counted = [n for n in names if n not in held]
    if counted:
        ranges = id_ranges(dataset, counted, device=device)
        rows.update({name: found.cardinality for name, found in ranges.items()})
    sizes = {}
    for name in names:
        width = embedding_dim(rows[name], min_dim=min_dim, max_dim=max_dim)
        sizes[name] = (rows[name], width)
        if embedding_advice(name, rows[name], width, distinct=None, budget_bytes=budget_bytes):
            distinct = None if name in held else distinct_ids(dataset, name)
            advice = embedding_advice(
                name,
                rows[name],
                width,
                distinct=distinct,
                budget_bytes=budget_bytes,
                from_vocabulary=name in held,
            )
            warnings.warn(str(advice), EmbeddingSizeWarning, stacklevel=3)  # the caller's caller
    return sizes


def distinct_ids(dataset: Partitioned, name: str) -> int:
    """How many distinct ids (nulls left out) ``name`` holds in ``dataset``, read a
    partition at a time (on the CPU); memory holds the distinct ids, never the column.
    List columns count the ids inside their lists."""
    seen = np.zeros(0, dtype=np.int64)
    pending: list[np.ndarray[Any, Any]] = []
    held = 0
    for p in range(dataset.num_partitions):
        column: Any = dataset.read_partition(p, [name]).column(name)
        if is_list_type(column.type):
            column = pc.list_flatten(column)
        ids = pc.unique(column.drop_null()).to_numpy(zero_copy_only=False).astype(np.int64)
        pending.append(ids)
        held += len(ids)
        if held > max(len(seen), 1 << 20):
            seen = np.unique(np.concatenate([seen, *pending]))
            pending, held = [], 0
    return len(np.unique(np.concatenate([seen, *pending])))


def id_ranges(
    dataset: Partitioned, columns: str | Sequence[str], *, device: Any = None
) -> dict[str, IdRange]:
    """The smallest and largest id of each column, from the footer statistics.

    A row group whose footer records no minimum and maximum for a column (some writers
    leave statistics out) is read, with the backend of ``device`` (a loader's
    ``device``: None picks it as a loader does): on the GPU, cudf reads it and cupy
    finds the extremes. In-memory tables and Dask DataFrames have no footers and are
    read. List columns count the ids inside the lists.

    Raises:
        ColumnNotFoundError: a column is missing from some file.
        ColumnTypeError: a column does not hold integer ids.
        InvalidArgumentError: a column holds negative ids, which no embedding table has.
    """
    from tabloader.device import resolve_device

    names = column_names(columns, "columns")
    if not names:
        raise InvalidArgumentError("columns must name at least one column")
    types = dataset.column_types(names)
    for name, field_type in types.items():
        values = value_type(field_type)
        if not (pa.types.is_integer(values) or pa.types.is_boolean(values)):
            raise ColumnTypeError(
                f"column {name!r} is {field_type}; embedding sizes are for columns of integer "
                "ids (cats). Encode it as integer ids first, or leave it out"
            )
    found: dict[str, IdRange] = {}
    for name in names:
        ranges, unread = _footer_ranges(dataset, name)
        if unread:
            resolved = resolve_device(device)
            # (cudf does not check page checksums: verified reads are pyarrow's)
            gpu = resolved.is_cuda and not dataset.verify_checksums
            files = dataset.format
            if gpu and isinstance(files, RowGroups):  # read by the GPU's parquet reader
                ranges += _read_ranges_gpu(dataset, files, name, unread, resolved)
            else:
                ranges += _read_ranges_cpu(dataset, name, unread)
        found[name] = _combine(dataset, name, ranges, len(unread))
    return found


# One partition's ids: (partition, smallest, largest); none for a partition without values.
_Span = tuple[int, int, int]


def _combine(dataset: Partitioned, name: str, spans: list[_Span], read: int) -> IdRange:
    if not spans:
        return IdRange(name, None, None, dataset.num_partitions, read)
    lows = [s[1] for s in spans]
    lowest = int(np.argmin(lows))
    if lows[lowest] < 0:
        where = dataset.describe_partition(spans[lowest][0])
        raise InvalidArgumentError(
            f"column {name!r} holds negative ids (as low as {lows[lowest]}, in {where}); an "
            "embedding table is indexed from 0. Shift the ids, or re-encode them from 0"
        )
    return IdRange(name, min(lows), max(s[2] for s in spans), dataset.num_partitions, read)


def _footer_ranges(dataset: Partitioned, name: str) -> tuple[list[_Span], list[int]]:
    """Every partition's ids as its footer records them, and the partitions it does not
    (all of them without footers; a partition key's, whose value is left to the data)."""
    found = dataset.source.footer_statistics(name)
    if found is None:
        return [], list(range(dataset.num_partitions))
    spans: list[_Span] = []
    unread: list[int] = []
    for p, stats in enumerate(found):
        if stats is None or stats.constant:  # not stored in the file: read to find its ids
            unread.append(p)
        elif stats.extremes is not None:
            spans.append((p, int(stats.extremes[0]), int(stats.extremes[1])))
        elif stats.nulls is not None and stats.nulls == stats.values:
            continue  # only nulls: no id at all
        else:
            unread.append(p)
    return spans, unread


def _read_ranges_cpu(dataset: Partitioned, name: str, partitions: list[int]) -> list[_Span]:
    spans: list[_Span] = []
    for p in partitions:
        column: Any = dataset.read_partition(p, [name]).column(name)
        if is_list_type(column.type):
            column = pc.list_flatten(column)
        extremes = pc.min_max(column)
        low, high = extremes["min"].as_py(), extremes["max"].as_py()
        if low is not None:
            spans.append((p, int(low), int(high)))
    return spans


def _read_ranges_gpu(
    dataset: Partitioned, files: RowGroups, name: str, partitions: list[int], device: Device
) -> list[_Span]:
    """Read the partitions' column on the GPU, one read per file (the GPU backend's
    reader, `tabloader.decode.gpu.DeviceReader`), and find each partition's extremes with
    cupy: a few numbers per partition cross to the host, never the column."""
    from tabloader._deps import import_gpu
    from tabloader.decode.gpu import DeviceReader

    cudf, cupy, index = import_gpu(device.index)
    lists = is_list_type(dataset.column_types([name])[name])
    layout = files.layout
    rows = layout[2]
    by_file: dict[int, list[int]] = {}
    for p in partitions:
        by_file.setdefault(int(layout[0][p]), []).append(p)
    reader = DeviceReader(cudf, cupy, index)
    spans: list[_Span] = []
    with cupy.cuda.Device(index):
        for f, parts in by_file.items():
            constants = files.file_columns(f, [name]).constants
            if name in constants:  # a partition key, or a column the file predates
                value = constants[name]
                spans += [] if value is None else [(p, int(value), int(value)) for p in parts]
                continue
            chunk = reader.plan_row_groups([(p, 0, int(rows[p])) for p in parts], files)
            # (read as a list column: cudf's Series, whatever the column holds)
            (frame,), _ = reader.read_row_groups(
                DeviceChunk(dataset, (), chunk, [name], {name}), files
            )
            series = frame[name].series
            assert chunk.read is not None
            parts = chunk.read.partitions[0]
            lengths = [int(rows[p]) for p in parts]
            if lists:  # the ids inside each partition's lists
                counts = series.list.len().fillna(0).values
                sums = [
                    counts[a : a + n].sum() for a, n in zip(_starts(lengths), lengths, strict=True)
                ]
                lengths = [int(n) for n in cupy.asnumpy(cupy.stack(sums))]
                series = series.list.leaves
            spans += _device_extremes(series, parts, lengths, cupy)
    return spans


def _starts(lengths: list[int]) -> list[int]:
    return [0, *np.cumsum(lengths)[:-1].tolist()] if lengths else []


def _device_extremes(series: Any, parts: list[int], lengths: list[int], cupy: Any) -> list[_Span]:
    """Smallest and largest non-null value of consecutive slices of a cudf column."""
    valid = series.notnull().values
    values = series.fillna(0).values
    if values.dtype.kind == "b":
        values = values.astype(np.int8)
    info = np.iinfo(values.dtype)
    low = cupy.where(valid, values, values.dtype.type(info.max))
    high = cupy.where(valid, values, values.dtype.type(info.min))
    lows, highs, seen = [], [], []
    for start, n in zip(_starts(lengths), lengths, strict=True):
        if not n:
            lows.append(cupy.full((), info.max, values.dtype))
            highs.append(cupy.full((), info.min, values.dtype))
            seen.append(cupy.zeros((), bool))
            continue
        lows.append(low[start : start + n].min())
        highs.append(high[start : start + n].max())
        seen.append(valid[start : start + n].any())
    if not parts:
        return []
    extremes = cupy.asnumpy(cupy.stack([cupy.stack(lows), cupy.stack(highs)]))
    any_value = cupy.asnumpy(cupy.stack(seen))
    return [
        (p, int(extremes[0, k]), int(extremes[1, k])) for k, p in enumerate(parts) if any_value[k]
    ]
