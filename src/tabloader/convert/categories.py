"""Categorify: count a column's values, give them ids by frequency, and look ids up, on disk.

A vocabulary of ten million values must not need the table, nor the vocabulary, in
memory. So counting spills: the counts of a few batches are merged and written out as
a *run*, a file sorted by the values' 64-bit hash (`ValueCounter`). The runs are then
merged one hash range (*bucket*) at a time into one *index* file, sorted by hash, and
the ids are given bucket by bucket (`build_index`):

- ids by descending count, from `FIRST_ID`; values of equal count in the order of
  their hash, which is the same on every machine, so the same counts give the same ids;
- a value rarer than ``min_count`` gets no id: it is out of the vocabulary (`OOV_ID`),
  as is every value not counted; a null is `NULL_ID`.

Only what a bucket needs is in memory at once, and a few numbers per distinct count.
Looking ids up (`CategoryIndex.lookup`) searches the hashes of the index, memory-mapped,
and compares the values found with the ones looked up, so a hash collision never gives
a value another's id.

Examples:
    >>> import tempfile
    >>> counter = ValueCounter("city", pa.string(), tempfile.mkdtemp())
    >>> counter.add(pa.array(["rome", "paris", "paris", None, "rome", "rome", "oslo"]))
    >>> index = build_index(counter, min_count=1)
    >>> index.lookup(pa.array(["rome", "paris", "oslo", "lima", None])).tolist()
    [2, 3, 4, 0, 1]
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from tabloader.convert.hashing import column_hashes
from tabloader.errors import InvalidFileError
from tabloader.vocabulary import (
    FIRST_ID,
    NULL_ID,
    OOV_ID,
    vocabulary_path,
    write_vocabulary,
)

__all__ = [
    "CategoryIndex",
    "ValueCounter",
    "build_index",
    "category_indexes",
    "index_from_vocabulary",
    "write_vocabularies",
]

SPILL_ENTRIES = 1 << 18
"""Distinct values (per batch, summed) held before they are merged and written as a run."""
BUCKET_BITS = 6
"""The index is merged in 2**BUCKET_BITS hash ranges, one at a time."""


def _entries(value_type: pa.DataType) -> pa.Schema:
    return pa.schema([("hash", pa.uint64()), ("value", value_type), ("count", pa.int64())])


def _bucket_bounds(hashes: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Where each bucket starts in ``hashes`` (sorted), and the end: 2**BUCKET_BITS + 1."""
    edges = np.arange(2**BUCKET_BITS + 1, dtype=object) << (64 - BUCKET_BITS)
    edges[-1] = 2**64
    limits = np.array([min(int(e), 2**64 - 1) for e in edges], dtype=np.uint64)
    bounds = np.searchsorted(hashes, limits, side="left")
    bounds[-1] = len(hashes)
    return bounds


def _write_run(path: str, table: pa.Table) -> None:
    with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=SPILL_ENTRIES)


def _open_run(path: str) -> pa.Table:
    """A run or index file, memory-mapped: nothing is read until used."""
    return ipc.open_file(pa.memory_map(path, "r")).read_all()


def _hash_sorted(table: pa.Table) -> pa.Table:
    hashes = column_hashes(table.column("value"))
    table = table.append_column("hash", pa.array(hashes, pa.uint64()))
    order = np.argsort(hashes, kind="stable")
    return table.take(order).select(["hash", "value", "count"])


class ValueCounter:
    """Counts the values of one column over batches, spilling runs into ``workdir``.

    Attributes:
        rows: Values counted, nulls included.
        nulls: Nulls among them.
    """

    def __init__(self, column: str, value_type: pa.DataType, workdir: str) -> None:
        self.column = column
        self.value_type = value_type
        self.workdir = workdir
        self.rows = 0
        self.nulls = 0
        self._pending: list[pa.Table] = []
        self._pending_entries = 0
        self._runs: list[str] = []

    def add(self, values: Any) -> None:
        """Count ``values`` (an Arrow array)."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        self.rows += len(values)
        self.nulls += values.null_count
        for start in range(0, len(values), SPILL_ENTRIES):  # a block of distinct values
            part = values.slice(start, SPILL_ENTRIES)
            counted = pc.value_counts(part.drop_null() if part.null_count else part)
            self.add_counts(counted.field("values"), counted.field("counts"))

    def add_counts(self, values: Any, counts: Any) -> None:
        """Add ``counts`` occurrences of ``values`` (distinct within this call)."""
        if not len(values):
            return
        table = pa.table({"value": values.cast(self.value_type), "count": counts.cast(pa.int64())})
        self._pending.append(table)
        self._pending_entries += len(table)
        if self._pending_entries >= SPILL_ENTRIES:
            self.spill()

    def spill(self) -> None:
        """Merge the counts held and write them as a run, sorted by hash."""
        if not self._pending:
            return
        merged = _merge_counts(pa.concat_tables(self._pending))
        path = os.path.join(self.workdir, f"{len(self._runs):05d}.run")
        _write_run(path, _hash_sorted(merged))
        self._runs.append(path)
        self._pending = []
        self._pending_entries = 0

    def runs(self) -> list[str]:
        """The runs, every count written."""
        self.spill()
        return list(self._runs)


def _merge_counts(table: pa.Table) -> pa.Table:
    grouped = table.group_by("value", use_threads=False).aggregate([("count", "sum")])
    return grouped.rename_columns(["value", "count"]).select(["value", "count"])


@dataclass
class CategoryIndex:
    """A column's vocabulary, ready to look ids up: the values sorted by hash, with their
    counts and ids (memory-mapped from ``path``).

    Attributes:
        column: The column's name.
        value_type: The values' type.
        size: Values that have an id.
        path: The index file.
    """

    column: str
    value_type: pa.DataType
    size: int
    path: str
    _table: pa.Table
    _hashes: np.ndarray[Any, Any]
    _ids: np.ndarray[Any, Any]

    @property
    def rows(self) -> int:
        """Rows of an embedding table: the values with an id and the two reserved ids."""
        return FIRST_ID + self.size

    def lookup(self, values: Any) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The id of every value: its vocabulary id, `NULL_ID` for a null, `OOV_ID` for
        a value without one."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
        if values.type != self.value_type:
            values = values.cast(self.value_type)
        out = np.full(len(values), OOV_ID, dtype=np.int64)
        if values.null_count:
            out[np.asarray(values.is_null())] = NULL_ID
        hashes = self._hashes
        if not len(hashes) or not len(values):
            return out
        wanted = column_hashes(values)
        position = np.searchsorted(hashes, wanted)
        open_rows = np.flatnonzero(np.asarray(values.is_valid()))
        stored = self._table.column("value")
        while len(open_rows):
            at = position[open_rows]
            inside = at < len(hashes)
            open_rows, at = open_rows[inside], at[inside]
            same_hash = hashes[at] == wanted[open_rows]
            open_rows, at = open_rows[same_hash], at[same_hash]
            if not len(open_rows):
                break
            found = _take(stored, at)
            same: Any = pc.equal(found, values.take(open_rows))
            equal = np.asarray(pc.fill_null(same, False))
            ids = np.asarray(self._ids[at[equal]])
            out[open_rows[equal]] = np.where(ids >= FIRST_ID, ids, OOV_ID)  # rare: unknown
            open_rows = open_rows[~equal]  # another value with the same hash: the next one
            position[open_rows] += 1
        return out

    def values_by_id(self, chunk: int = SPILL_ENTRIES) -> Iterator[tuple[Any, Any]]:
        """``(values, counts)`` of the ids ``FIRST_ID, FIRST_ID + 1, ...`` in order, a
        chunk of ids at a time."""
        for start in range(FIRST_ID, FIRST_ID + self.size, chunk):
            stop = min(start + chunk, FIRST_ID + self.size)
            where = np.flatnonzero((self._ids >= start) & (self._ids < stop))
            where = where[np.argsort(self._ids[where], kind="stable")]
            yield (
                _take(self._table.column("value"), where),
                _take(self._table.column("count"), where),
            )

    def counts(self) -> dict[str, int]:
        """Counted values left out of the vocabulary, and their occurrences."""
        left_values = left_rows = 0
        start = 0
        for chunk in self._table.column("count").chunks:
            left = np.asarray(self._ids[start : start + len(chunk)]) < FIRST_ID
            counts = chunk.to_numpy(zero_copy_only=False)
            left_values += int(left.sum())
            left_rows += int(counts[left].sum())
            start += len(chunk)
        return {"values_left_out": left_values, "rows_left_out": left_rows}


def _take(column: Any, positions: np.ndarray[Any, Any]) -> Any:
    """``column[positions]`` of a memory-mapped column of many chunks, taken chunk by
    chunk: a take over the whole column would first copy all of it into memory."""
    chunks = column.chunks
    if len(chunks) <= 1:
        return column.take(positions)
    starts = np.cumsum([0, *(len(c) for c in chunks)])
    order = np.argsort(positions, kind="stable")
    ordered = positions[order]
    bounds = np.searchsorted(ordered, starts)
    parts = [
        chunks[k].take(ordered[bounds[k] : bounds[k + 1]] - starts[k])
        for k in range(len(chunks))
        if bounds[k + 1] > bounds[k]
    ]
    if not parts:
        return pa.array([], column.type)
    joined = pa.concat_arrays(parts)
    inverse = np.empty(len(order), dtype=np.int64)
    inverse[order] = np.arange(len(order))
    return joined.take(inverse)


def _numpy(column: Any) -> np.ndarray[Any, Any]:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return cast("np.ndarray[Any, Any]", array.to_numpy(zero_copy_only=False))


def _merged_buckets(runs: list[str], *, add_up: bool) -> Iterator[pa.Table]:
    """The runs' entries merged, one hash range at a time, sorted by hash: the counts of
    one value added up (``add_up``), or left as they are (a vocabulary's entries)."""
    tables = [_open_run(path) for path in runs]
    bounds = [_bucket_bounds(_numpy(t.column("hash"))) for t in tables]
    for bucket in range(2**BUCKET_BITS):
        parts = [
            t.slice(int(b[bucket]), int(b[bucket + 1] - b[bucket]))
            for t, b in zip(tables, bounds, strict=True)
        ]
        parts = [p for p in parts if p.num_rows]
        if not parts:
            continue
        if len(parts) == 1:
            yield parts[0]
        elif add_up:
            merged = _merge_counts(pa.concat_tables(parts).select(["value", "count"]))
            yield _hash_sorted(merged)
        else:
            joined = pa.concat_tables(parts)
            order = np.argsort(_numpy(joined.column("hash")), kind="stable")
            yield joined.take(order)


class _IndexWriter:
    """Writes the index file bucket by bucket, and the ids beside it."""

    def __init__(self, path: str, schema: pa.Schema) -> None:
        self.path = path
        self.schema = schema
        self.buckets: list[tuple[int, int]] = []  # (first row, rows)
        self.rows = 0
        self._sink = pa.OSFile(path, "wb")
        self._writer = ipc.new_file(self._sink, schema)
        self._hashes = open(path + ".hashes", "wb")  # noqa: SIM115 (closed in close())

    def add(self, bucket: pa.Table) -> None:
        self._writer.write_table(bucket.select(self.schema.names).cast(self.schema))
        self._hashes.write(_numpy(bucket.column("hash")).astype(np.uint64).tobytes())
        self.buckets.append((self.rows, bucket.num_rows))
        self.rows += bucket.num_rows

    def close(self) -> pa.Table:
        self._writer.close()
        self._sink.close()
        self._hashes.close()
        return _open_run(self.path)


def build_index(counter: ValueCounter, *, min_count: int) -> CategoryIndex:
    """The index of the values ``counter`` counted, those seen ``min_count`` times or
    more with ids (see the module's docstring).

    Memory holds one bucket and, per bucket, how many values have each count: an id is
    ``FIRST_ID`` + the values with a higher count + those with the same count in the
    buckets before + those with the same count before it in its bucket (hash order).
    """
    index = _IndexWriter(os.path.join(counter.workdir, "index.arrow"), _entries(counter.value_type))
    tallies: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = []
    for bucket in _merged_buckets(counter.runs(), add_up=True):
        index.add(bucket)
        counts = _numpy(bucket.column("count"))
        tallies.append(np.unique(counts[counts >= min_count], return_counts=True))
    table = index.close()
    for run in counter.runs():
        os.remove(run)
    levels = np.unique(np.concatenate([u for u, _ in tallies])) if tallies else np.zeros(0)
    per_bucket = np.zeros((len(tallies), len(levels)), dtype=np.int64)
    for b, (uniq, n) in enumerate(tallies):
        per_bucket[b, np.searchsorted(levels, uniq)] = n
    per_level = per_bucket.sum(axis=0)
    higher = np.concatenate([np.cumsum(per_level[::-1])[::-1][1:], [0]]).astype(np.int64)
    before = np.cumsum(per_bucket, axis=0) - per_bucket
    ids = np.lib.format.open_memmap(
        index.path + ".ids.npy", mode="w+", dtype=np.int64, shape=(index.rows,)
    )
    counts_column = table.column("count")
    for b, (first, rows) in enumerate(index.buckets):
        counts = _numpy(counts_column.slice(first, rows))
        out = np.full(rows, -1, dtype=np.int64)
        kept = np.flatnonzero(counts >= min_count)
        order = kept[np.argsort(-counts[kept], kind="stable")]  # hash order within a count
        level = np.searchsorted(levels, counts[order])
        starts = np.flatnonzero(np.r_[True, level[1:] != level[:-1]])
        within = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
        out[order] = FIRST_ID + higher[level] + before[b, level] + within
        ids[first : first + rows] = out
    ids.flush()
    del ids
    return _open_index(counter.column, counter.value_type, index.path, table)


def _open_index(column: str, value_type: pa.DataType, path: str, table: pa.Table) -> CategoryIndex:
    ids = np.load(path + ".ids.npy", mmap_mode="r")
    hashes = (
        np.memmap(path + ".hashes", dtype=np.uint64, mode="r")
        if len(ids)
        else np.zeros(0, np.uint64)
    )
    size = int(np.count_nonzero(ids >= FIRST_ID))
    return CategoryIndex(column, value_type, size, path, table, hashes, ids)


def index_from_vocabulary(column: str, path: str, workdir: str) -> CategoryIndex:
    """The index of the vocabulary file ``path`` (``value``, ``count`` in id order),
    whose ids it keeps: the value on row ``k`` has id ``FIRST_ID + k``; read a row group
    at a time."""
    import pyarrow.parquet as pq

    os.makedirs(workdir, exist_ok=True)
    runs: list[str] = []
    first_id = FIRST_ID
    vocabulary = pq.ParquetFile(path)
    value_type = vocabulary.schema_arrow.field("value").type
    for batch in vocabulary.iter_batches(batch_size=SPILL_ENTRIES):
        values = batch.column(0)
        if values.null_count:
            raise InvalidFileError(f"{path}: a vocabulary holds no null (nulls have id {NULL_ID})")
        numbered = _hash_sorted(pa.table({"value": values, "count": batch.column(1)}))
        ids = np.arange(first_id, first_id + len(values), dtype=np.int64)
        order = np.argsort(column_hashes(values), kind="stable")
        numbered = numbered.append_column("id", pa.array(ids[order]))
        first_id += len(values)
        runs.append(os.path.join(workdir, f"{len(runs):05d}.run"))
        _write_run(runs[-1], numbered)
    index = _IndexWriter(os.path.join(workdir, "index.arrow"), _entries(value_type))
    ids = np.lib.format.open_memmap(
        index.path + ".ids.npy", mode="w+", dtype=np.int64, shape=(first_id - FIRST_ID,)
    )
    for bucket in _merged_buckets(runs, add_up=False):
        if pc.count_distinct(bucket.column("value")).as_py() != bucket.num_rows:
            grouped = bucket.group_by("value").aggregate([("id", "count")])
            repeated = cast(Any, pc.greater)(grouped.column("id_count"), 1)
            twice = pc.filter(grouped.column("value"), repeated)
            raise InvalidFileError(
                f"{path}: the value {twice[0].as_py()!r} is in the vocabulary twice, so it "
                "has no single id. The file was changed after tabloader wrote it: convert "
                "again"
            )
        ids[index.rows : index.rows + bucket.num_rows] = _numpy(bucket.column("id"))
        index.add(bucket)
    table = index.close()
    ids.flush()
    del ids
    for run in runs:
        os.remove(run)
    return _open_index(column, value_type, index.path, table)


def category_indexes(
    given: Mapping[str, str],
    counters: Mapping[str, ValueCounter],
    min_count: int,
    work: str,
) -> dict[str, CategoryIndex]:
    """The index of every categorified column: of its vocabulary file (``given``), or of
    the values its counter counted."""
    indexes = {
        name: index_from_vocabulary(name, path, os.path.join(work, f"given-{k}"))
        for k, (name, path) in enumerate(given.items())
    }
    for name, counter in counters.items():
        indexes[name] = build_index(counter, min_count=min_count)
    return indexes


def write_vocabularies(
    directory: str,
    indexes: Mapping[str, CategoryIndex],
    given: Mapping[str, str],
    counters: Mapping[str, ValueCounter],
    min_count: int,
) -> tuple[dict[str, str], list[str]]:
    """Each vocabulary written into ``directory`` (a given one copied), and a note on
    each."""
    os.makedirs(directory, exist_ok=True)
    written, notes = {}, []
    for name, index in indexes.items():
        if name in given:
            target = vocabulary_path(directory, name)
            shutil.copyfile(given[name], target)
            written[name] = target
            notes.append(
                f"{name}: ids from the vocabulary {given[name]} ({index.size:,} values); "
                "values it does not hold get id 0"
            )
            continue
        counter = counters[name]
        left = index.counts()
        chunks = list(index.values_by_id())
        written[name] = write_vocabulary(
            directory,
            name,
            [v for v, _ in chunks],
            [c for _, c in chunks],
            {
                "min_count": min_count,
                "training_rows": counter.rows,
                "nulls": counter.nulls,
                **left,
            },
        )
        notes.append(
            f"{name}: {_plural(index.size, 'value')} counted in "
            f"{_plural(counter.rows, 'training row')} get ids "
            f"2..{index.size + 1:,} by frequency"
            + (
                f"; {left['values_left_out']:,} values seen fewer than {min_count} times "
                f"({left['rows_left_out']:,} rows) get id 0"
                if left["values_left_out"]
                else ""
            )
            + f"; nulls ({counter.nulls:,}) get id 1"
        )
    return written, notes


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
