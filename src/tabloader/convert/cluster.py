"""The same conversion on a Dask cluster: one task per input file, the plan shipped to each.

Two rounds of tasks, through ``distributed``'s own ``Client.map`` (nothing of a cluster
is written here):

1. with ``categorify``, each worker counts the training rows' values of one input file
   and returns the counts; they are added up here, with the same `ValueCounter` and
   `build_index` as on one machine, so the vocabulary and the ids are the same;
2. each worker encodes one input file with the vocabularies (read from the staging
   directory, which every worker must see) and writes its rows of each split to files
   of its own, ``part-FFFFF-NNNNN.parquet`` (``FFFFF`` the input's position), so that
   reading the files in order reads the rows in the order one machine writes them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tabloader._deps import require
from tabloader.convert.categories import (
    ValueCounter,
    category_indexes,
    index_from_vocabulary,
    write_vocabularies,
)
from tabloader.convert.encode import Encoder, TimeSpan
from tabloader.convert.inputs import Input
from tabloader.convert.output import Destination, SplitWriter
from tabloader.convert.plan import ConvertPlan, count_file
from tabloader.vocabulary import VOCABULARY_DIR

__all__ = ["convert_on_cluster"]

Written = dict[str, tuple[int, list[str]]]


def _count_task(
    item: Input, plan: ConvertPlan, columns: list[str]
) -> dict[str, tuple[Any, Any, int, int]]:
    """One input's counts: ``{column: (values, counts, rows, nulls)}`` of its training
    rows (the counts of the values a worker saw, which the client adds up)."""
    counted: dict[str, list[pa.Table]] = {n: [] for n in columns}
    rows = dict.fromkeys(columns, 0)
    nulls = dict.fromkeys(columns, 0)

    def add(name: str, values: Any) -> None:
        if name not in counted:
            return
        rows[name] += len(values)
        nulls[name] += values.null_count
        found = pc.value_counts(values.drop_null())
        counted[name].append(
            pa.table({"value": found.field("values"), "count": found.field("counts")})
        )

    for _ in count_file(item, plan, add):
        pass
    result = {}
    for name, tables in counted.items():
        value_type = plan.cast_schema.field(name).type
        table = (
            pa.concat_tables(tables)
            if tables
            else pa.table({"value": pa.array([], value_type), "count": pa.array([], pa.int64())})
        )
        table = table.group_by("value", use_threads=False).aggregate([("count", "sum")])
        result[name] = (
            table.column("value").combine_chunks(),
            table.column("count_sum").combine_chunks(),
            rows[name],
            nulls[name],
        )
    return result


def _write_task(
    item: Input,
    position: int,
    plan: ConvertPlan,
    vocabularies: Mapping[str, str],
    staging: str,
    names_out: list[str],
    group_rows: int,
    file_rows: int,
) -> tuple[int, Written, dict[str, TimeSpan]]:
    """One input encoded and written: its rows read, per split its rows and files, and
    the span of its time columns."""
    with tempfile.TemporaryDirectory(prefix="tabloader-convert-") as work:
        indexes = {
            name: index_from_vocabulary(name, path, os.path.join(work, str(k)))
            for k, (name, path) in enumerate(vocabularies.items())
        }
        encoder = Encoder(plan.encodings, indexes)
        writers = {
            name: _PrefixedWriter(
                os.path.join(staging, name), plan.out_schema, group_rows, file_rows, position
            )
            for name in names_out
        }
        rows_in = 0
        try:
            for parts, _, rows in plan.batches(item, encoder):
                rows_in += rows
                for name, table in parts.items():
                    writers[name].add(table)
            for writer in writers.values():
                writer.close()
        finally:
            for writer in writers.values():
                writer.abandon()
    written = {
        name: (w.rows, [os.path.relpath(f, staging) for f in w.files])
        for name, w in writers.items()
    }
    return rows_in, written, encoder.times


class _PrefixedWriter(SplitWriter):
    """A split's files named after the input they come from."""

    def __init__(
        self, directory: str, schema: pa.Schema, rows: int, file_rows: int, at: int
    ) -> None:
        super().__init__(directory, schema, rows, file_rows)
        self.prefix = f"part-{at:05d}"

    def file_name(self, number: int) -> str:
        return f"{self.prefix}-{number:05d}.parquet"


def convert_on_cluster(
    cluster: Any,
    inputs: list[Input],
    plan: ConvertPlan,
    destination: Destination,
    *,
    given: Mapping[str, str],
    min_count: int,
    names_out: list[str],
    group_rows: int,
    file_rows: int,
) -> tuple[int, Written, dict[str, str], list[str]]:
    """Convert ``inputs`` on ``cluster`` (a ``distributed.Client`` or a scheduler's
    address) into ``destination``'s staging directory."""
    distributed = require(
        "distributed", what="convert on a Dask cluster", extra="dask", otherwise="leave cluster out"
    )
    own = not isinstance(cluster, distributed.Client)
    client = distributed.Client(cluster) if own else cluster
    try:
        with tempfile.TemporaryDirectory(prefix="tabloader-convert-") as work:
            counted = [n for n in plan.encodings.categorify if n not in given]
            counters = {}
            if counted:
                counting = client.map(_count_task, inputs, plan=plan, columns=counted, pure=False)
                for k, name in enumerate(counted):
                    counters[name] = ValueCounter(
                        name, plan.cast_schema.field(name).type, os.path.join(work, f"count-{k}")
                    )
                    os.makedirs(counters[name].workdir)
                # added up in input order: the same runs, the same ids as on one machine
                for future in counting:
                    for name, (values, counts, rows, nulls) in future.result().items():
                        if name in counters:
                            counters[name].add_counts(values, counts)
                            counters[name].rows += rows
                            counters[name].nulls += nulls
            indexes = category_indexes(given, counters, min_count, work)
            vocab, notes = write_vocabularies(
                destination.staged(VOCABULARY_DIR), indexes, given, counters, min_count
            )
            writing = client.map(
                _write_task,
                inputs,
                range(len(inputs)),
                plan=plan,
                vocabularies=vocab,
                staging=destination.staging,
                names_out=names_out,
                group_rows=group_rows,
                file_rows=file_rows,
                pure=False,
            )
            rows_in = 0
            written: Written = {name: (0, []) for name in names_out}
            spans = Encoder(plan.encodings, {})
            for future in writing:
                rows, parts, times = future.result()
                rows_in += rows
                for name, (n, files) in parts.items():
                    written[name] = (written[name][0] + n, written[name][1] + files)
                for name, span in times.items():
                    spans.times[name].merge(span)
    finally:
        if own:
            client.close()
    return rows_in, written, vocab, spans.report() + notes
