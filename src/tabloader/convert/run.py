"""`convert`: the options checked, the plan made, the vocabularies fitted, the files written."""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from tabloader.convert.categories import ValueCounter, category_indexes, write_vocabularies
from tabloader.convert.encode import Encoder, Encodings
from tabloader.convert.hashing import TRAIN
from tabloader.convert.inputs import Input, common_schema, describe, expand, probe
from tabloader.convert.options import (
    FORMATS,
    Format,
    parse_columns,
    parse_hash_buckets,
    parse_schema,
    parse_split,
    parse_time_parts,
    parse_time_zone,
)
from tabloader.convert.output import Destination, SplitWriter
from tabloader.convert.plan import ConvertPlan, count_file
from tabloader.dataset import DEFAULT_ROWS_PER_PARTITION, SMALL_ROW_GROUP_ROWS
from tabloader.errors import (
    ColumnNotFoundError,
    InvalidArgumentError,
    InvalidFileError,
)
from tabloader.options import int_at_least
from tabloader.vocabulary import (
    VOCABULARY_DIR,
    find_vocabulary_dir,
    vocabulary_columns,
    vocabulary_metadata,
    vocabulary_path,
)

__all__ = ["ConvertResult", "convert", "row_group_rows_for"]

TARGET_ROW_GROUP_BYTES = 64 * 2**20
"""About this many decoded bytes per row group (fewer rows for wide rows)."""
ROW_GROUPS_PER_FILE = 16


def row_group_rows_for(schema: pa.Schema) -> int:
    """Rows per row group for ``schema``: 131,072, or fewer when a row is so wide that
    row groups would exceed about 64 MiB decoded, but never fewer than
    ``SMALL_ROW_GROUP_ROWS`` (below which the loader warns).

    Examples:
        >>> row_group_rows_for(pa.schema([("x", pa.float32())] * 40))
        131072
        >>> row_group_rows_for(pa.schema([(f"x{i}", pa.float64()) for i in range(400)]))
        20971
    """
    row_bytes = sum(_value_bytes(f.type) for f in schema) or 1
    rows = min(DEFAULT_ROWS_PER_PARTITION, TARGET_ROW_GROUP_BYTES // row_bytes)
    return int(max(SMALL_ROW_GROUP_ROWS, rows))


def _value_bytes(field_type: pa.DataType) -> int:
    from tabloader.columns import is_list_type

    if is_list_type(field_type):
        return 64
    try:
        return max(1, field_type.bit_width // 8)
    except ValueError:  # variable width: strings, binary
        return 32


@dataclass(frozen=True)
class ConvertResult:
    """What [`convert`][tabloader.convert.convert] did.

    Attributes:
        rows_in: Rows read from the inputs.
        rows_out: Rows written, per split (``{"": n}`` without a split).
        files: The parquet files written, per split, in order.
        schema: The schema every file was written with.
        inputs: The input files, in the order they were read.
        row_group_rows: Rows per row group (the last of each split may hold fewer).
        vocabulary: Per categorified column, the rows of its embedding table (its
            vocabulary's values and the ids of unknown values and nulls).
        vocabulary_dir: Where the vocabularies were written (``DEST/_vocabulary``), or
            None.
        notes: What was converted and how, a line per column concerned: time columns
            (their zone and span), vocabularies (their values and what was left out).
    """

    rows_in: int
    rows_out: dict[str, int]
    files: dict[str, list[str]]
    schema: pa.Schema
    inputs: list[str]
    row_group_rows: int
    vocabulary: dict[str, int] = field(default_factory=dict)
    vocabulary_dir: str | None = None
    notes: list[str] = field(default_factory=list)


def convert(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    dest: str | os.PathLike[str],
    *,
    format: Format | None = None,
    header: bool | None = None,
    names: Sequence[str] | None = None,
    delimiter: str | None = None,
    schema: str | Mapping[str, Any] | pa.Schema | None = None,
    split: str | Mapping[str, float] | None = None,
    split_key: str | Sequence[str] | None = None,
    seed: int = 0,
    categorify: str | Sequence[str] | None = None,
    min_count: int | None = None,
    vocabulary: str | os.PathLike[str] | None = None,
    hash_buckets: str | Mapping[str, int] | None = None,
    time_parts: str | Sequence[str] | Mapping[str, Sequence[str]] | None = None,
    time_zone: str | None = None,
    row_group_rows: int | None = None,
    rows_per_file: int | None = None,
    transform: Callable[[pa.Table], pa.Table] | None = None,
    overwrite: bool = False,
    cluster: Any = None,
    progress: TextIO | None = None,
) -> ConvertResult:
    """Convert CSV, TSV, JSON lines and parquet files into parquet the loader reads fast.

    Every option has a flag of the same name on the command line (``split_key`` is
    ``--split-key``, ``hash_buckets`` is ``--hash``), and both give the same files.

    Args:
        sources: Files, directories or globs, read in the order given (files of a
            directory or glob in sorted order; a directory or glob holding ``dest``
            leaves its files out).
        dest: The output directory: ``part-00000.parquet``, ... in it, or with
            ``split`` one subdirectory per split (``train/``, ``valid/``). It must be
            empty or absent, or hold only what a previous conversion wrote (with
            ``overwrite``).
        format: ``"csv"``, ``"tsv"``, ``"json"`` (JSON lines) or ``"parquet"`` for every
            file; default: from each file's suffix (``.csv``, ``.tsv``, ``.jsonl``,
            ``.parquet``, also compressed as ``.gz``, ``.bz2``, ``.zst``), else from its
            first bytes.
        header: Whether CSV/TSV files start with a header line; default: detected (a
            first line holding no number is a header). With ``names``, a first line
            holding no number followed by another holding none either could be a row of
            text: it must be said.
        names: Column names for CSV/TSV files: those of a file without a header, or new
            names replacing a header. Without a header or names, columns are named
            ``f0``, ``f1``, ...
        delimiter: The CSV field separator; default ``,`` (``\\t`` for TSV).
        schema: Types for some or all columns, replacing the inferred ones: a mapping
            ``{column: type}`` (a pyarrow type or a name such as ``"int32"``,
            ``"float64"``, ``"string"``), the text form ``"user=int32,price=float64"``, a
            ``pyarrow.Schema``, or a parquet file whose schema to take. Otherwise
            integers, and floating point columns holding whole numbers only (pandas'
            ``123.0``), are written as int64, other floating point columns as float32,
            text as string. A value that would change is an error naming it and its row.
        split: ``{name: fraction}`` (or ``"valid=0.1,test=0.1"``): write each split to
            its own subdirectory; ``train`` gets the rows no named split takes.
        split_key: Columns whose values decide a row's split (``"user_id"``: a user's
            rows stay together); default: the whole row. Either way the split is a hash
            of the values as read with ``seed``: encodings and ``transform`` never move
            a row to another split.
        seed: The seed of the split's hash.
        categorify: Columns (text, integers) whose values become ids by frequency:
            the most frequent value 2, the next 3, ...; 0 for a value not in the
            vocabulary, 1 for a null. The vocabulary is counted on the ``train`` split
            only and written to ``dest/_vocabulary/COLUMN.parquet``.
        min_count: Values seen fewer times in training get id 0; default 1 (every value
            seen).
        vocabulary: A vocabulary directory (or a destination holding one) to take the
            ids from instead of counting them: new values get id 0, and the ids of a
            model in production stay the same. Without ``categorify``, every column it
            has a vocabulary for is categorified.
        hash_buckets: ``{column: buckets}`` (or ``"item_id=100000"``): ids by the hash of
            the value's text, 0 for a null and 1 to ``buckets - 1`` (at most 2**63) for
            values, without a vocabulary.
        time_parts: ``{column: [part, ...]}`` (or ``"event_time=hour,dow,day"``): the
            column replaced by one int64 column per part, ``COLUMN_PART``: ``epoch``
            (seconds since 1970), ``year``, ``month``, ``day``, ``dow`` (Monday 0),
            ``hour``, ``minute``.
        time_zone: The zone of times written without an offset, and the one the parts
            are counted in; default UTC.
        row_group_rows: Rows per row group; default
            [`row_group_rows_for`][tabloader.convert.row_group_rows_for] the schema
            (131,072 for most).
        rows_per_file: Rows per file; default 16 row groups.
        transform: Called on every batch of rows (a ``pyarrow.Table``, encoded as
            above; with ``split``, on each split's rows of it) before it is written; it
            must return as many rows (in any order) and the columns and types it returns
            for a batch without rows, which are those written, made int64 and float32 by
            the same rules.
        overwrite: Replace the files a previous conversion wrote in ``dest``: the new
            set is written beside them and takes their place only when it is complete.
        cluster: A Dask ``distributed.Client``, or the address of a scheduler
            (``"tcp://10.0.0.5:8786"``): each input file is read by a worker. The
            inputs and ``dest`` must be on a file system every worker sees. The same
            rows, splits, vocabularies and ids as on one machine; each input's rows are
            written to files of their own.
        progress: Where to show a progress bar (``sys.stderr``; a bar on a terminal, a
            line every ten seconds elsewhere); default none.

    Returns:
        A [`ConvertResult`][tabloader.convert.ConvertResult]: rows in, rows out per split, the files
        written, the vocabularies' sizes.

    Raises:
        SourceNotFoundError: an input is missing.
        ColumnNotFoundError: the files do not have the same columns, or an option names
            a column they do not have.
        ColumnTypeError: a column's type does not suit its encoding.
        SchemaMismatchError: a column's types differ in ways that do not mix.
        InvalidFileError: a value does not fit its column's type (with the
            ``--schema`` to pass); a file is damaged.
        InvalidArgumentError: a bad option, or a destination that is not empty.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    paths = expand([os.fspath(s) for s in sources], dest=os.fspath(dest))
    if format is not None and format not in FORMATS:
        raise InvalidArgumentError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if names is not None:
        names = [str(n) for n in names]
        if len(set(names)) != len(names):
            repeated = sorted({n for n in names if names.count(n) > 1})
            raise InvalidArgumentError(f"names must be distinct, {repeated} repeat")
    if delimiter is not None and len(delimiter) != 1:
        raise InvalidArgumentError(f"delimiter must be one character, got {delimiter!r}")
    splits = parse_split(split)
    key = tuple(parse_columns(split_key, "split_key"))
    if key and not splits:
        raise InvalidArgumentError("split_key (--split-key) needs split (--split valid=0.1)")
    forced = parse_schema(schema)
    seed = int_at_least(seed, 0, "seed")
    wanted = parse_columns(categorify, "categorify")
    if min_count is not None:
        min_count = int_at_least(min_count, 1, "min_count")
    buckets = parse_hash_buckets(hash_buckets)
    parts = parse_time_parts(time_parts)
    zone = parse_time_zone(time_zone)
    if row_group_rows is not None:
        row_group_rows = int_at_least(row_group_rows, 1, "row_group_rows")
    if rows_per_file is not None:
        rows_per_file = int_at_least(rows_per_file, 1, "rows_per_file")
    inputs = [describe(p, format) for p in paths]
    if names is not None and any(i.format not in ("csv", "tsv") for i in inputs):
        raise InvalidArgumentError(
            "names= names the columns of CSV and TSV files; parquet and JSON files name "
            "their own columns"
        )
    for item in inputs:
        probe(item, header=header, names=names, delimiter=delimiter)
    given = _given_vocabularies(vocabulary, wanted, min_count, inputs[0].schema.names, forced)
    categories = wanted or sorted(given)
    read_schema, cast_schema = common_schema(inputs, forced)
    for name in key:
        if read_schema.get_field_index(name) < 0:
            raise ColumnNotFoundError(
                f"split_key names column {name!r}, which the files do not have; they have "
                f"{', '.join(read_schema.names[:12])}"
            )
    encodings = Encodings(tuple(categories), buckets, parts, zone)
    encodings.check(cast_schema)
    plan = ConvertPlan(
        read_schema=read_schema,
        cast_schema=cast_schema,
        forced=frozenset(forced),
        splits=splits,
        seed=seed,
        split_key=key,
        encodings=encodings,
        transform=transform,
        out_schema=ConvertPlan.output_schema(cast_schema, encodings, transform),
    )
    group_rows = row_group_rows or row_group_rows_for(plan.out_schema)
    file_rows = rows_per_file or group_rows * ROW_GROUPS_PER_FILE
    root = os.fspath(dest)
    destination = Destination(root, overwrite=overwrite)
    names_out = [*([] if TRAIN in splits else [TRAIN]), *splits] if splits else [""]
    try:
        with tempfile.TemporaryDirectory(prefix="tabloader-convert-") as work:
            if cluster is not None:
                from tabloader.convert.cluster import convert_on_cluster

                convert_rows = functools.partial(convert_on_cluster, cluster)
            else:
                convert_rows = functools.partial(_convert_here, work=work, progress=progress)
            rows_in, written, vocab, notes = convert_rows(
                inputs,
                plan,
                destination,
                given=given,
                min_count=min_count or 1,
                names_out=names_out,
                group_rows=group_rows,
                file_rows=file_rows,
            )
            rows_out = {name: rows for name, (rows, _) in written.items()}
            counted = {
                name: sum(pq.read_metadata(destination.staged(f)).num_rows for f in files)
                for name, (_, files) in written.items()
            }
            if sum(rows_out.values()) != rows_in or counted != rows_out:
                raise InvalidFileError(
                    f"read {rows_in:,} rows but wrote {counted} (counted {rows_out}): nothing "
                    "was moved into place. Report this as a bug"
                )
            relative = [f for _, files in written.values() for f in files]
            relative += [os.path.relpath(p, destination.staging) for p in vocab.values()]
            destination.swap(relative, {"splits": list(written), "inputs": paths})
    finally:
        destination.discard()
    files = {name: [os.path.join(root, f) for f in fs] for name, (_, fs) in written.items()}
    sizes = {
        name: vocabulary_metadata(os.path.join(root, os.path.relpath(p, destination.staging)))[
            "values"
        ]
        + 2
        for name, p in vocab.items()
    }
    return ConvertResult(
        rows_in,
        rows_out,
        files,
        plan.out_schema,
        paths,
        group_rows,
        vocabulary=sizes,
        vocabulary_dir=os.path.join(root, VOCABULARY_DIR) if vocab else None,
        notes=notes,
    )


def _given_vocabularies(
    vocabulary: str | os.PathLike[str] | None,
    wanted: list[str],
    min_count: int | None,
    columns: list[str],
    forced: dict[str, pa.DataType],
) -> dict[str, str]:
    """``{column: vocabulary file}`` of the vocabularies to reuse; their value types
    become the columns' read types (in ``forced``)."""
    if vocabulary is None:
        return {}
    if min_count is not None:
        raise InvalidArgumentError(
            "min_count applies when a vocabulary is counted; with vocabulary= the ids are "
            "the vocabulary's. Leave one out"
        )
    directory = find_vocabulary_dir(vocabulary)
    held = vocabulary_columns(directory)
    chosen = wanted or [c for c in columns if c in held]
    if not chosen:
        raise InvalidArgumentError(
            f"the vocabulary {directory!r} holds {', '.join(map(repr, held))}, none of which "
            "the files have"
        )
    missing = [c for c in chosen if c not in held]
    if missing:
        raise InvalidArgumentError(
            f"the vocabulary {directory!r} has no column {missing[0]!r} (it has "
            f"{', '.join(map(repr, held))}): leave it out of categorify, or convert without "
            "vocabulary= to count a new one"
        )
    found = {}
    for name in chosen:
        path = vocabulary_path(directory, name)
        value_type = pq.read_schema(path).field("value").type
        if name in forced and forced[name] != value_type:
            raise InvalidArgumentError(
                f"schema makes column {name!r} {forced[name]}, but its vocabulary holds "
                f"{value_type} values: leave it out of schema"
            )
        forced[name] = value_type  # read as the vocabulary's values: "007" stays text
        found[name] = path
    return found


def _convert_here(
    inputs: list[Input],
    plan: ConvertPlan,
    destination: Destination,
    work: str,
    *,
    given: Mapping[str, str],
    min_count: int,
    names_out: list[str],
    group_rows: int,
    file_rows: int,
    progress: TextIO | None,
) -> tuple[int, dict[str, tuple[int, list[str]]], dict[str, str], list[str]]:
    from tabloader.progress import Progress

    counted = [n for n in plan.encodings.categorify if n not in given]
    passes = 2 if counted else 1
    total_bytes = sum(i.size for i in inputs) * passes
    bar = (
        Progress(total_bytes, desc="converting", stream=progress, unit="bytes")
        if progress
        else None
    )
    writers = {
        name: SplitWriter(destination.staged(name), plan.out_schema, group_rows, file_rows)
        for name in names_out
    }
    try:
        counters = {
            name: ValueCounter(
                name, plan.cast_schema.field(name).type, os.path.join(work, f"count-{k}")
            )
            for k, name in enumerate(counted)
        }
        for counter in counters.values():
            os.makedirs(counter.workdir)
        for item in inputs if counters else ():
            consumed = 0
            for position in count_file(item, plan, lambda n, v: counters[n].add(v)):
                if bar is not None:
                    bar.update(position - consumed)
                consumed = position
            if bar is not None:
                bar.update(item.size - consumed)
        indexes = category_indexes(given, counters, min_count, work)
        vocab, notes = write_vocabularies(
            destination.staged(VOCABULARY_DIR), indexes, given, counters, min_count
        )
        encoder = Encoder(plan.encodings, indexes)
        rows_in = 0
        for item in inputs:
            consumed = 0
            for parts, position, rows in plan.batches(item, encoder):
                rows_in += rows
                for name, table in parts.items():
                    writers[name].add(table)
                if bar is not None:
                    bar.update(position - consumed)
                consumed = position
            if bar is not None:
                bar.update(item.size - consumed)
        for writer in writers.values():
            writer.close()
    finally:
        for writer in writers.values():
            writer.abandon()
        if bar is not None:
            bar.close()
    written = {
        name: (w.rows, [os.path.relpath(f, destination.staging) for f in w.files])
        for name, w in writers.items()
    }
    return rows_in, written, vocab, encoder.report() + notes
