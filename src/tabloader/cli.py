"""The ``tabloader`` command: convert data, check it before training, and time how it loads.

tabloader convert raw/*.csv data --split valid=0.1
tabloader inspect data/train
tabloader bench data/train --fill-null 0 --epochs 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

import numpy as np
import pyarrow as pa

from tabloader.columns import type_difference
from tabloader.config import encoding_hint
from tabloader.dataset import (
    LARGE_ROW_GROUP_BYTES,
    SMALL_ROW_GROUP_ROWS,
    Dataset,
    small_row_groups,
)
from tabloader.embeddings import (
    distinct_ids,
    embedding_advice,
    embedding_bytes,
    embedding_dim,
    id_ranges,
)
from tabloader.errors import (
    ColumnNotFoundError,
    ColumnTypeError,
    EmptyDatasetError,
    InvalidArgumentError,
    PerformanceWarning,
    SchemaMismatchError,
    SourceNotFoundError,
    TabloaderError,
)
from tabloader.loader import Loader
from tabloader.plan import count_batches, rank_rows
from tabloader.progress import Progress
from tabloader.sources.partitions import describe_filters
from tabloader.stages import LOADER_THREADS, thread_advice, usable_cores

__all__ = [
    "LOADER_THREADS",
    "Progress",
    "bench_columns",
    "build_parser",
    "inspect_dataset",
    "layout_warnings",
    "main",
    "open_inspected",
    "parse_filter",
    "suggest_columns",
    "usable_cores",
]

LABEL_NAME = re.compile(r"label|target|click", re.IGNORECASE)
"""Column names taken for labels when suggesting columns."""


# -- inspect ----------------------------------------------------------------------------


def layout_warnings(
    partition_rows: np.ndarray, partition_bytes: np.ndarray | None, *, ranks: int
) -> list[str]:
    """Warnings about a layout that will load slowly (pure, for ``inspect``).

    Small row groups are judged by `tabloader.dataset.small_row_groups`, the rule
    the loader warns with.

    Examples:
        >>> layout_warnings(np.array([100] * 40), None, ranks=1)[0].split(":")[0]
        'small row groups'
    """
    found = []
    median = small_row_groups(partition_rows)
    if median is not None:
        found.append(
            f"small row groups: the median row group holds {median:,.0f} rows, below "
            f"{SMALL_ROW_GROUP_ROWS:,}; reading pays a fixed cost per row group, so aim for "
            "64k-1M rows (row_group_size= when writing)"
        )
    if partition_bytes is not None and len(partition_bytes):
        largest = int(partition_bytes.max())
        if largest > LARGE_ROW_GROUP_BYTES:
            found.append(
                f"large row groups: the largest holds {largest / 2**30:.1f} GiB uncompressed; "
                "a chunk holds at least one row group, so memory use will be high. Write "
                "smaller ones"
            )
    if ranks > len(partition_rows):
        found.append(
            f"more ranks ({ranks}) than row groups ({len(partition_rows)}): every rank will "
            "decode whole row groups to use a fraction of them. Write more, smaller row groups"
        )
    return found


def _kind(field_type: pa.DataType) -> str:
    """``"int"``, ``"float"``, ``"bool"``, ``"list"``, ``"unsupported"``, or for a
    fixed-size list of numbers (delivered as ``[B, k]``) ``"int vector"`` and so on.

    Examples:
        >>> _kind(pa.list_(pa.float32(), 8)), _kind(pa.list_(pa.float32()))
        ('float vector', 'list')
    """
    if pa.types.is_boolean(field_type):
        return "bool"
    if pa.types.is_integer(field_type):
        return "int"
    if pa.types.is_floating(field_type):
        return "float"
    if pa.types.is_fixed_size_list(field_type):
        values = _kind(field_type.value_type)
        return f"{values} vector" if values in ("int", "float", "bool") else "unsupported"
    if pa.types.is_list(field_type) or pa.types.is_large_list(field_type):
        return "list"
    return "unsupported"


def suggest_columns(schema: pa.Schema) -> dict[str, list[str]]:
    """Columns to load, by type and name: integers are categorical ids, floats and booleans
    continuous (vectors of them too), and a numeric column named like label, target or
    click is a label.

    Examples:
        >>> schema = pa.schema([("click", pa.int8()), ("user", pa.int64()),
        ...                     ("price", pa.float32()), ("name", pa.string())])
        >>> suggest_columns(schema)
        {'cats': ['user'], 'conts': ['price'], 'labels': ['click']}
    """
    found: dict[str, list[str]] = {"cats": [], "conts": [], "labels": []}
    for field in schema:
        kind = _kind(field.type)
        if kind in ("list", "unsupported"):
            continue
        if LABEL_NAME.search(field.name):
            found["labels"].append(field.name)
        else:
            found["cats" if kind.split()[0] == "int" else "conts"].append(field.name)
    return found


def compact_names(names: Sequence[str]) -> str:
    """Names joined by commas, runs like C1, C2, ..., C26 written ``C1..C26``.

    Examples:
        >>> compact_names(["label", "I1", "I2", "I3", "C1", "C2", "x"])
        'label, I1..I3, C1, C2, x'
    """
    parts: list[str] = []
    run: list[str] = []
    previous: tuple[str, int] | None = None

    def flush() -> None:
        if len(run) >= 3:
            parts.append(f"{run[0]}..{run[-1]}")
        else:
            parts.extend(run)
        run.clear()

    for name in names:
        match = re.fullmatch(r"(.*?)(\d+)", name)
        key = (match[1], int(match[2])) if match else None
        if key is None or previous is None or key != (previous[0], previous[1] + 1):
            flush()
        run.append(name)
        previous = key
    flush()
    return ", ".join(parts)


def _schema_groups(dataset: Dataset) -> list[tuple[pa.Schema, list[str]]]:
    """Each distinct schema with the files that have it (one group for in-memory sources)."""
    source = dataset.source
    return [(schema, source.schema_files(k)) for k, schema in enumerate(source.schemas)]


def _schema_difference(schema: pa.Schema, reference: pa.Schema) -> tuple[str, bool]:
    """How ``schema`` differs from ``reference``, in a few words, and whether a column's
    types conflict (rather than differ in width only, which the loader reads as one)."""
    notes = []
    conflict = False
    for field in schema:
        index = reference.get_field_index(field.name)
        if index < 0:
            notes.append(f"{field.name} only here")
        elif reference.field(index).type != field.type:
            verdict = type_difference(reference.field(index).type, field.type)
            conflict = conflict or verdict == "conflict"
            notes.append(
                f"{field.name} is {field.type} (not {reference.field(index).type}): {verdict}"
            )
    missing = [f.name for f in reference if schema.get_field_index(f.name) < 0]
    if missing:
        notes.append(f"no {compact_names(missing)}")
    return "; ".join(notes) or "same columns, in another order", conflict


def _id_report(
    dataset: Dataset, cats: Sequence[str], vocabulary: str | None
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Per id column that can be sized: its ids, how many are distinct, the embedding table
    for them (rows from ``vocabulary`` where it holds the column) and its bytes, and
    whether the footers told or the column was read (on the CPU); and the warnings about
    tables above the budget."""
    from tabloader.vocabulary import find_vocabulary_dir, vocabulary_columns, vocabulary_rows

    held: dict[str, str] = {}
    if vocabulary is not None:
        directory = find_vocabulary_dir(vocabulary)
        held = {n: directory for n in vocabulary_columns(directory)}
    found: dict[str, dict[str, Any]] = {}
    advice = []
    for name in cats:
        try:
            ranges = id_ranges(dataset, [name], device="cpu")
        except TabloaderError:
            continue  # the loader's check reports what is wrong with it
        ids = ranges[name]
        rows = vocabulary_rows(held[name], name) if name in held else ids.cardinality
        width = embedding_dim(rows)
        distinct = distinct_ids(dataset, name)
        found[name] = {
            "min": ids.min,
            "max": ids.max,
            "distinct": distinct,
            "rows": rows,
            "width": width,
            "bytes": embedding_bytes(rows, width),
            "vocabulary": name in held,
            "row_groups_read": ids.partitions_read,
            "row_groups": ids.partitions,
        }
        if ids.max is not None and name in held and ids.max >= rows:
            advice.append(
                f"column {name!r} holds id {ids.max:,}, beyond its vocabulary's {rows:,} rows: "
                f"the data was not converted with the vocabulary in {held[name]}"
            )
        said = embedding_advice(name, rows, width, distinct=distinct, from_vocabulary=name in held)
        if said:
            advice.append(said)
    return found, advice


def _null_counts(dataset: Dataset) -> dict[str, int | None]:
    """Nulls per column summed from the parquet footers (None where a footer does not say)."""
    counts: dict[str, int | None] = {}
    for name in dataset.schema.names:
        found = dataset.source.footer_statistics(name)
        if found is None:  # no footers (an in-memory source)
            counts[name] = None
            continue
        stats = [s for s in found if s is not None]  # files that do not store it: no nulls
        nulls = [s.nulls for s in stats]
        counts[name] = None if None in nulls else sum(n for n in nulls if n is not None)
    return counts


def inspect_dataset(
    dataset: Dataset,
    *,
    ranks: int = 1,
    batch_size: int = 65_536,
    cats: Sequence[str] = (),
    conts: Sequence[str] = (),
    labels: Sequence[str] = (),
    fill_null: float | Mapping[str, float] | None = None,
    vocabulary: str | None = None,
) -> dict[str, Any]:
    """Everything about ``dataset`` that would make training fail or crawl, from footers.

    Returns a JSON-ready report: files, rows and row groups, the distinct schemas with
    their files, per column its type, nulls and suggested use, what one rank gets, the
    suggested ``cats``/``conts``/``labels``, per categorical column its ids and an
    embedding table for them (``ids``: from the footer statistics; ``row_groups_read``
    counts the row groups that had none and were read), and ``errors`` (training would
    fail), ``warnings`` (training would be slow) and ``notes``. The columns to check are
    the ones given, or the suggested ones.

    Examples:
        >>> table = pa.table({"user": [1, 2, 3], "x": [0.5, None, 1.0], "label": [0., 1., 0.]})
        >>> report = inspect_dataset(Dataset(table), batch_size=2)
        >>> report["suggested"], report["per_rank"]["batches"]
        ({'cats': ['user'], 'conts': ['x'], 'labels': ['label']}, 2)
    """
    rows = dataset.partition_rows
    sizes = dataset.source.partition_bytes()
    groups = _schema_groups(dataset)
    reference = groups[0][0]
    nulls = _null_counts(dataset)
    suggested = suggest_columns(reference)
    role = {name: kind for kind, names in suggested.items() for name in names}
    columns = [
        {
            "name": field.name,
            "type": str(field.type),
            "nulls": nulls.get(field.name),
            "use": role.get(field.name, _kind(field.type)),
        }
        for field in reference
    ]
    keys = dataset.partition_keys
    requested = {"cats": list(cats), "conts": list(conts), "labels": list(labels)}
    which = "the requested columns" if any(requested.values()) else "the suggested columns"
    if not any(requested.values()):
        requested = suggested
    failure = _loader_failure(
        dataset, requested, batch_size=batch_size, ranks=ranks, fill_null=fill_null
    )
    errors: list[str] = []
    warns = layout_warnings(rows, sizes, ranks=ranks)
    notes: list[str] = []
    if len(groups) > 1:
        differences = [_schema_difference(schema, reference) for schema, _ in groups]
        listing = "; ".join(
            f"schema {k + 1} ({_count(len(files), 'file')}: "
            f"{', '.join(files[:3])}{', ...' if len(files) > 3 else ''})"
            + ("" if k == 0 else f": {differences[k][0]}")
            for k, (schema, files) in enumerate(groups)
        )
        if any(conflict for _, conflict in differences) or isinstance(
            failure, (SchemaMismatchError, ColumnNotFoundError)
        ):
            # An error when it touches the columns to load; else training works regardless.
            fatal = isinstance(failure, (SchemaMismatchError, ColumnNotFoundError))
            (errors if fatal else warns).append(
                f"the files disagree on their schema ({len(groups)} schemas): {listing}. "
                "Rewrite the odd files with the common schema (tabloader convert writes one)"
            )
        else:
            notes.append(
                f"the files store some columns with other widths ({len(groups)} schemas): "
                f"{listing}. The loader reads each column as one type; widening loses nothing"
            )
    unsupported = [f for f in reference if role.get(f.name, _kind(f.type)) == "unsupported"]
    if unsupported:
        warns.append(
            "columns that cannot be loaded: "
            + "; ".join(
                f"{f.name} ({f.type}): {encoding_hint(f.name, f.type)}" for f in unsupported
            )
        )
    if failure is not None:
        errors.append(f"with {which}: {failure}")
    ids, advice = _id_report(dataset, requested["cats"], vocabulary)
    warns += advice
    per_rank_rows = dataset.num_rows // ranks
    batches = count_batches(per_rank_rows, batch_size, drop_last=False)
    lo, hi = rank_rows(dataset.num_rows, global_rank=0, global_size=ranks)
    if per_rank_rows and per_rank_rows < batch_size:
        warns.append(
            f"every rank gets {per_rank_rows:,} rows, fewer than one batch of {batch_size:,}: "
            "with drop_last=True the loader would yield nothing. Lower the batch size"
        )
    return {
        "files": len(dataset.files),
        "rows": dataset.num_rows,
        "row_groups": dataset.num_partitions,
        "row_group_rows": {
            "min": int(rows.min()) if len(rows) else 0,
            "median": int(np.median(rows)) if len(rows) else 0,
            "max": int(rows.max()) if len(rows) else 0,
        },
        "row_group_bytes_median": int(np.median(sizes))
        if sizes is not None and len(sizes)
        else None,
        "schemas": [
            {"files": files, "columns": {f.name: str(f.type) for f in schema}}
            for schema, files in groups
        ],
        "columns": columns,
        "partitions": {
            "format": dataset.table_format or "files",
            "version": dataset.version,
            "keys": {name: str(t) for name, t in keys.items()},
            "filters": describe_filters(dataset.filters),
            "files_skipped": dataset.files_skipped,
        },
        "per_rank": {
            "ranks": ranks,
            "batch_size": batch_size,
            "rows": hi - lo,
            "batches": batches,
            "last_batch_rows": per_rank_rows - (batches - 1) * batch_size if batches else 0,
            "rows_left_over": dataset.num_rows - ranks * per_rank_rows,
        },
        "suggested": suggested,
        "checked": requested,
        "ids": ids,
        "errors": errors,
        "warnings": warns,
        "notes": notes,
    }


def _loader_failure(
    dataset: Dataset,
    columns: dict[str, list[str]],
    *,
    batch_size: int,
    ranks: int,
    fill_null: float | Mapping[str, float] | None = None,
) -> TabloaderError | None:
    """Why a loader of ``columns`` could not be built on ``dataset``, or None if it can.

    The loader's own checks (columns present in every file with one type, numeric, no
    nulls, at least one batch) decide, from the footers alone.
    """
    if not dataset.num_rows:
        return EmptyDatasetError(dataset.no_rows_message())
    if not any(columns.values()):
        return ColumnTypeError(
            "no column can be loaded: none is numeric. Encode the columns as numbers first"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # inspect reports the layout itself
            Loader(
                dataset,
                batch_size=batch_size,
                global_size=ranks,
                device="cpu",
                cats=columns["cats"],
                conts=columns["conts"],
                labels=columns["labels"],
                fill_null=fill_null,
            )
    except TabloaderError as error:
        return error
    return None


def _count(n: int, noun: str) -> str:
    plural = {"batch": "batches"}.get(noun, noun + "s")
    return f"{n:,} {noun if n == 1 else plural}"


def _write_report(report: dict[str, Any], out: TextIO, *, max_files: int) -> None:
    parts = report["partitions"]
    if parts["format"] != "files":
        what = "version" if parts["format"] == "delta" else "snapshot"
        out.write(f"{parts['format']} table, {what} {parts['version']}\n")
    if parts["keys"]:
        source = "the table's schema" if parts["format"] != "files" else "the directory names"
        keys = ", ".join(f"{name} {t}" for name, t in parts["keys"].items())
        out.write(f"partition keys (types from {source}): {keys}\n")
    if parts["filters"]:
        out.write(
            f"filters: {' or '.join(parts['filters'])}; "
            f"{_count(parts['files_skipped'], 'file')} skipped\n"
        )
    rg = report["row_group_rows"]
    out.write(
        f"{report['rows']:,} rows in {report['row_groups']:,} row groups"
        + (f" of {_count(report['files'], 'file')}\n" if report["files"] else "\n")
    )
    if report["row_groups"]:
        size = report["row_group_bytes_median"]
        out.write(
            f"rows per row group: min {rg['min']:,}, median {rg['median']:,}, max {rg['max']:,}"
            + (f"; median {size / 2**20:,.1f} MiB uncompressed\n" if size is not None else "\n")
        )
    schemas = report["schemas"]
    if len(schemas) > 1:
        out.write(f"schemas: {len(schemas)} distinct ones (see below)\n")
        for k, schema in enumerate(schemas, 1):
            files = schema["files"]
            shown = ", ".join(files[:max_files]) + (", ..." if len(files) > max_files else "")
            out.write(f"  schema {k}: {_count(len(files), 'file')}: {shown}\n")
    out.write(f"columns ({len(report['columns'])}):\n")
    by_use: dict[tuple[str, str], list[str]] = {}
    for column in report["columns"]:
        by_use.setdefault((column["use"], column["type"]), []).append(column["name"])
    for (use, type_name), names in by_use.items():
        out.write(f"  {use:<12} {type_name:<14} {compact_names(names)}\n")
    with_nulls = [
        f"{c['name']} {c['nulls']:,}"
        for c in report["columns"]
        if c["nulls"] is not None and c["nulls"]
    ]
    unknown = [c["name"] for c in report["columns"] if c["nulls"] is None]
    out.write(
        "nulls (from the footers): "
        + (", ".join(with_nulls) if with_nulls else "none")
        + (f"; not recorded for {compact_names(unknown)}" if unknown else "")
        + "\n"
    )
    per_rank = report["per_rank"]
    last = per_rank["last_batch_rows"]
    out.write(
        f"per rank (--ranks {per_rank['ranks']}, --batch-size {per_rank['batch_size']:,}): "
        f"{per_rank['rows']:,} rows, {_count(per_rank['batches'], 'batch')}"
        + (f" (the last holds {last:,} rows)" if last and last < per_rank["batch_size"] else "")
        + "\n"
    )
    suggested = report["suggested"]
    flags = " ".join(f"--{kind} {','.join(names)}" for kind, names in suggested.items() if names)
    out.write(f"suggested columns: {flags or 'none (no numeric columns)'}\n")
    _write_ids(report["ids"], out)
    for note in report["notes"]:
        out.write(f"note: {note}\n")
    for warning in report["warnings"]:
        out.write(f"warning: {warning}\n")
    for error in report["errors"]:
        out.write(f"error: {error}\n")
    if not report["errors"]:
        out.write("ok: nothing here would make training fail\n")


def parse_filter(text: str) -> tuple[str, str, Any]:
    """One ``--filter`` term: ``COLUMN OP VALUE``, the value an integer, a number, or text.

    Examples:
        >>> parse_filter("day<23"), parse_filter("region in eu,us"), parse_filter("r != a b")
        (('day', '<', 23), ('region', 'in', ['eu', 'us']), ('r', '!=', 'a b'))
    """
    match = re.fullmatch(r"\s*([^\s<>=!]+)\s*(==|=|!=|<=|>=|<|>|\s+not\s+in\s+|\s+in\s+)(.*)", text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"a filter is COLUMN OP VALUE with OP one of = != < <= > >= in, not in (values "
            f"comma separated), for example 'day<23'; got {text!r}"
        )
    column, op, value = match[1], " ".join(match[2].split()), match[3].strip()
    if op in ("in", "not in"):
        return column, op, [_literal(v.strip()) for v in value.split(",")]
    return column, op, _literal(value)


def _literal(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def open_inspected(
    path: str | list[str], *, kind: str = "auto", version: int | None = None, filters: Any = None
) -> Dataset:
    """The dataset ``tabloader inspect`` reports on: a Delta table (a directory holding
    ``_delta_log``), an Iceberg table (its ``*.metadata.json`` file, or a directory holding
    ``metadata/``: the newest metadata file), or files. ``kind`` forces one of
    ``"delta"``, ``"iceberg"`` or ``"files"`` (needed for URLs)."""
    if kind == "auto" and isinstance(path, str):
        local = path.removeprefix("file://") if "://" not in path.removeprefix("file://") else ""
        if path.endswith(".metadata.json"):
            kind = "iceberg"
        elif local and os.path.isdir(os.path.join(local, "_delta_log")):
            kind = "delta"
        elif local and os.path.isdir(os.path.join(local, "metadata")):
            kind = "iceberg"
    if kind in ("delta", "iceberg") and not isinstance(path, str):
        raise InvalidArgumentError(f"a {kind} table is one path, got {len(path)}")
    if kind == "delta":
        return Dataset.from_delta(str(path), version=version, filters=filters)
    if kind == "iceberg":
        from tabloader.sources.iceberg import static_table

        location = str(path)
        if not location.endswith(".metadata.json") and "://" not in location:
            location = _newest_metadata(location)
        return Dataset.from_iceberg(static_table(location), snapshot_id=version, filters=filters)
    if version is not None:
        raise InvalidArgumentError("--version applies to Delta and Iceberg tables, not to files")
    return Dataset(path, filters=filters)


def _newest_metadata(table_directory: str) -> str:
    """The metadata file of an Iceberg table directory with the highest version number."""
    folder = os.path.join(table_directory, "metadata")
    hint = os.path.join(folder, "version-hint.text")
    if os.path.isfile(hint):
        return table_directory  # pyiceberg follows the hint itself
    names = [n for n in os.listdir(folder) if n.endswith(".metadata.json")]
    if not names:
        raise SourceNotFoundError(f"{folder} holds no *.metadata.json file")

    def number(name: str) -> int:
        digits = re.match(r"v?(\d+)", name)
        return int(digits[1]) if digits else -1

    return os.path.join(folder, max(names, key=lambda n: (number(n), n)))


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} bytes"


def _write_ids(ids: dict[str, dict[str, Any]], out: TextIO) -> None:
    """``ids`` a line per column: ``C1 0..1,459, 1,203 distinct -> 1,460 x 96, 535.3 KiB``."""
    if not ids:
        return
    out.write(
        "ids (min..max, distinct -> embedding rows x width, float32 bytes; "
        "Dataset.embedding_sizes):\n"
    )
    for name, found in ids.items():
        span = "no values" if found["max"] is None else f"{found['min']:,}..{found['max']:,}"
        rows = f"{found['rows']:,}" + (" (vocabulary)" if found["vocabulary"] else "")
        out.write(
            f"  {name} {span}, {found['distinct']:,} distinct -> {rows} x {found['width']}, "
            f"{_size(found['bytes'])}\n"
        )
    read = [
        f"{name} ({found['row_groups_read']:,} of {found['row_groups']:,} row groups)"
        for name, found in ids.items()
        if found["row_groups_read"]
    ]
    if read:
        out.write(
            "  no statistics in the footers, so read to find the ids: " + ", ".join(read) + "\n"
        )


def _refuse_text_files(paths: str | list[str]) -> None:
    """A CSV, TSV or JSON lines file is no parquet: say how to convert it."""
    from tabloader.convert.inputs import COMPRESSION, SUFFIXES

    for path in [paths] if isinstance(paths, str) else paths:
        stem, suffix = os.path.splitext(path.lower())
        if suffix in COMPRESSION:
            suffix = os.path.splitext(stem)[1]
        kind = SUFFIXES.get(suffix)
        if kind is not None and kind != "parquet" and os.path.isfile(path):
            raise InvalidArgumentError(
                f"{path} is a {kind.upper()} file; the loader reads parquet. Convert it first: "
                f"tabloader convert {path} DEST (see tabloader convert --help), then "
                "tabloader inspect DEST"
            )


def inspect(args: argparse.Namespace, out: TextIO) -> int:
    _refuse_text_files(args.path)
    filters = [parse_filter(t) for t in args.filter] if args.filter else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it reports layout problems itself
        dataset = open_inspected(args.path, kind=args.format, version=args.version, filters=filters)
    report = inspect_dataset(
        dataset,
        ranks=args.ranks,
        batch_size=args.batch_size,
        cats=_names(args.cats),
        conts=_names(args.conts),
        labels=_names(args.labels),
        fill_null=_fill_null(args.fill_null),
        vocabulary=args.vocabulary,
    )
    if args.json:
        json.dump(report, out, indent=2)
        out.write("\n")
    else:
        _write_report(report, out, max_files=args.max_files)
    return 1 if report["errors"] else 0


# -- bench ------------------------------------------------------------------------------

FRAMEWORKS = {
    "none": "tabloader.Loader (numpy arrays per column)",
    "torch": "TorchAsyncItr through DLDataLoader (torch tensors)",
    "tensorflow": "KerasSequenceLoader, as model.fit reads it (TensorFlow tensors)",
    "jax": "JaxLoader (jax.Array per column, on the loader's JAX device)",
}
"""What ``bench --framework`` times, in the words its report uses."""


def _names(values: Sequence[str] | None) -> list[str]:
    return [n for v in values or () for n in v.split(",") if n]


def _pairs(text: str, what: str) -> dict[str, str]:
    """``"a=1,b=2"`` as ``{"a": "1", "b": "2"}``."""
    found = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise InvalidArgumentError(f"{what} takes NAME=VALUE pairs, got {part!r}")
        found[name.strip()] = value.strip()
    return found


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidArgumentError(f"{what} must be a number, got {text!r}") from None


def _fill_null(text: str | None) -> float | dict[str, float] | None:
    """``--fill-null``: one number for every column, or ``NAME=VALUE,...``."""
    if text is None:
        return None
    if "=" not in text:
        return _number(text, "--fill-null")
    return {k: _number(v, f"--fill-null {k}") for k, v in _pairs(text, "--fill-null").items()}


def _sparse_max(text: str | None) -> dict[str, int] | None:
    if text is None:
        return None
    found = {}
    for name, value in _pairs(text, "--sparse-max").items():
        try:
            found[name] = int(value)
        except ValueError:
            raise InvalidArgumentError(
                f"--sparse-max {name} must be an integer, got {value!r}"
            ) from None
    return found


def bench_columns(args: argparse.Namespace, dataset: Dataset | None) -> dict[str, list[str]]:
    """The columns ``bench`` loads: ``--cats``/``--conts``/``--labels``; or ``--columns``,
    each given the use ``inspect`` suggests for its type and name; or, with neither, every
    column ``inspect`` suggests."""
    given = {kind: _names(getattr(args, kind)) for kind in ("cats", "conts", "labels")}
    chosen = _names(getattr(args, "columns", None))
    if any(given.values()) or dataset is None:
        if chosen:
            raise InvalidArgumentError("give --columns or --cats/--conts/--labels, not both")
        return given
    schema = dataset.schema
    if chosen:
        missing = [n for n in chosen if schema.get_field_index(n) < 0]
        if missing:
            dataset.column_types(missing)  # the error naming the closest column
        schema = pa.schema([schema.field(n) for n in chosen])
    found = suggest_columns(schema)
    if chosen:
        left_out = [n for n in chosen if not any(n in names for names in found.values())]
        if left_out:
            raise ColumnTypeError(
                f"--columns {','.join(left_out)}: not numeric, so not loadable; leave "
                f"{'it' if len(left_out) == 1 else 'them'} out, or encode as numbers first"
            )
    return found


def _batches(args: argparse.Namespace, options: dict[str, Any]) -> tuple[Iterable[Any], Loader]:
    """The iterable to time, and the core loader whose statistics describe it."""
    dataset = Dataset(args.path)
    device = getattr(args, "device", None)
    if args.framework == "torch":
        from tabloader.torch import DLDataLoader, TorchAsyncItr

        torch_dataset = TorchAsyncItr(dataset, device=device, **options)
        torch_loader = DLDataLoader(torch_dataset, batch_size=None, collate_fn=lambda x: x)
        return torch_loader, torch_dataset.loader
    if args.framework == "tensorflow":
        from tabloader.tensorflow import KerasSequenceLoader

        keras_loader = KerasSequenceLoader(dataset, device=device, **options)

        def items() -> Iterable[Any]:
            for i in range(len(keras_loader)):
                yield keras_loader[i]
            keras_loader.on_epoch_end()

        return _Repeatable(items), keras_loader.loader
    if args.framework == "jax":
        from tabloader.jax import JaxLoader

        jax_loader = JaxLoader(dataset, device=device, **options)
        return jax_loader, jax_loader.loader
    loader = Loader(dataset, device=device, **options)
    return loader, loader


class _Repeatable:
    def __init__(self, make: Any) -> None:
        self.make = make

    def __iter__(self) -> Any:
        return iter(self.make())


def _loader_options(args: argparse.Namespace, dataset: Dataset | None = None) -> dict[str, Any]:
    """The loader keywords the command line gives (columns: see `bench_columns`)."""
    shuffle: bool | str = "global" if args.shuffle == "global" else args.shuffle == "true"
    return {
        **bench_columns(args, dataset),
        "batch_size": args.batch_size,
        "shuffle": shuffle,
        "shuffle_within_batch": not args.stored_order,
        "seed": args.seed,
        "fill_null": _fill_null(args.fill_null),
        "cache": None if args.cache == "none" else args.cache,
        "cache_dir": args.cache_dir,
        "cache_max_bytes": args.cache_max_bytes,
        "sparse_names": _names(args.sparse) or None,
        "sparse_max": _sparse_max(args.sparse_max),
        "sparse_as_dense": args.sparse_as_dense,
        "drop_last": args.drop_last,
        "prefetch": args.prefetch,
        "chunk_rows": args.chunk_rows,
        "parts_per_chunk": args.parts_per_chunk,
        "global_rank": args.rank,
        "global_size": args.ranks,
        "cont_dtype": args.cont_dtype,
        "label_dtype": args.label_dtype,
        **({} if args.cat_dtype is None else {"cat_dtype": args.cat_dtype}),
    }


def _what_was_measured(args: argparse.Namespace, loader: Loader, rows: int) -> str:
    kinds = {"cats": len(loader.cats), "conts": len(loader.conts), "labels": len(loader.labels)}
    columns = ", ".join(f"{n} {k[:-1] if n == 1 else k}" for k, n in kinds.items() if n)
    shuffle = "global" if loader.global_shuffle else "on" if loader.shuffle else "off"
    if loader.shuffle and not loader.shuffle_within_batch:
        shuffle += " (rows in stored order within a batch)"
    cache = getattr(loader.cache, "mode", None) if loader.cache is not None else None
    return (
        f"measured: {FRAMEWORKS[args.framework]} on {loader.device}; "
        f"{_count(args.epochs, 'epoch')} of {rows:,} rows "
        f"(rank {loader.global_rank} of {loader.global_size}) in batches of "
        f"{loader.batch_size:,}; {columns}; shuffle {shuffle}; cache {cache or 'none'}"
        + (f"; --fill-null {args.fill_null}" if args.fill_null is not None else "")
    )


def bench(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the loader says the same when it is built
        dataset = Dataset(args.path)
    options = _loader_options(args, dataset)
    if not any(_names(getattr(args, kind)) for kind in ("cats", "conts", "labels", "columns")):
        flags = " ".join(
            f"--{k} {','.join(v)}"
            for k, v in options.items()
            if k in ("cats", "conts", "labels") and v
        )
        err.write(f"tabloader: loading the suggested columns: {flags or 'none'}\n")
    iterable, loader = _batches(args, options)
    if args.framework == "torch":
        import torch

        advice = thread_advice(torch.get_num_threads(), usable_cores())
        if advice:
            err.write(f"tabloader: warning: {advice}\n")
    batches = len(loader)
    lo, hi = rank_rows(
        loader.dataset.num_rows, global_rank=loader.global_rank, global_size=loader.global_size
    )
    epoch_rows = min(hi - lo, batches * args.batch_size)
    out.write(_what_was_measured(args, loader, epoch_rows) + "\n")
    started = time.perf_counter()
    for epoch in range(args.epochs):
        epoch_started = time.perf_counter()
        with (
            Progress(epoch_rows, desc=f"epoch {epoch}", stream=err) as progress,
            warnings.catch_warnings(),
        ):
            # said above, not again as TorchAsyncItr's warning when the epoch starts
            warnings.filterwarnings("ignore", "PyTorch uses", PerformanceWarning)
            for i, _ in enumerate(iterable):
                progress.update(min(args.batch_size, epoch_rows - i * args.batch_size))
        seconds = time.perf_counter() - epoch_started
        out.write(f"epoch {epoch}: {epoch_rows:,} rows in {seconds:.2f}s\n")
    elapsed = time.perf_counter() - started
    stats = loader.stats()
    rows = stats.rows if stats.rows else epoch_rows * args.epochs
    out.write(
        f"throughput: {rows / elapsed:,.0f} rows/s, {stats.batches / elapsed:,.1f} batches/s "
        f"over the {_count(args.epochs, 'epoch')}, end to end\n"
        f"background: read {stats.read_seconds:.2f}s, assemble {stats.assemble_seconds:.2f}s, "
        f"shuffle and slice {stats.batch_seconds:.2f}s"
        + (f"; {stats.cache_epochs} epoch(s) from the cache" if stats.cache_epochs else "")
        + "\n"
        f"waiting for data: {stats.wait_seconds:.2f}s of {stats.consume_seconds:.2f}s "
        f"({stats.input_bound_fraction:.0%} input-bound)\n"
    )
    return 0


# -- convert ----------------------------------------------------------------------------


def convert_files(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from tabloader.convert import convert

    result = convert(
        args.src,
        args.dest,
        format=args.format,
        header=args.header,
        names=_names([args.names]) if args.names else None,
        delimiter=args.delimiter,
        schema=args.schema,
        split=args.split,
        split_key=args.split_key,
        seed=args.seed,
        categorify=args.categorify,
        min_count=args.min_count,
        vocabulary=args.vocabulary,
        hash_buckets=args.hash,
        time_parts=args.time_parts,
        time_zone=args.time_zone,
        row_group_rows=args.row_group_rows,
        rows_per_file=args.rows_per_file,
        overwrite=args.overwrite,
        cluster=args.cluster,
        progress=None if args.quiet else err,
    )
    rows_out = sum(result.rows_out.values())
    out.write(
        f"converted {_count(len(result.inputs), 'file')}: {result.rows_in:,} rows in, "
        f"{rows_out:,} rows out\n"
    )
    for name, files in result.files.items():
        where = os.path.join(args.dest, name) if name else args.dest
        out.write(
            f"  {(name or 'rows') + ':':<8} {result.rows_out[name]:>12,} rows in "
            f"{_count(len(files), 'file')} -> {where}\n"
        )
    by_type: dict[str, list[str]] = {}
    for field in result.schema:
        by_type.setdefault(str(field.type), []).append(field.name)
    out.write(
        "schema: " + "; ".join(f"{t} {compact_names(n)}" for t, n in by_type.items()) + "\n"
        f"row groups of up to {result.row_group_rows:,} rows\n"
    )
    for note in result.notes:
        out.write(f"  {note}\n")
    if result.vocabulary_dir is not None:
        out.write(
            f"vocabularies -> {result.vocabulary_dir} (embedding rows: "
            + ", ".join(f"{n} {rows:,}" for n, rows in result.vocabulary.items())
            + f"); convert later data with --vocabulary {result.vocabulary_dir}\n"
        )
    first = next(iter(result.files))
    target = os.path.join(args.dest, first) if first else args.dest
    more = f" --vocabulary {result.vocabulary_dir}" if result.vocabulary_dir else ""
    out.write(f"next: tabloader inspect {target}{more}\n")
    return 0


# -- the command line -------------------------------------------------------------------

_EXAMPLES = """\
examples:
  tabloader convert raw/*.csv data --split valid=0.1  your files as parquet, split
  tabloader inspect data/train                         check the files before training
  tabloader inspect data/train --ranks 8 --json        the same, for a script
  tabloader bench data/train --fill-null 0 --epochs 2  time epochs of the suggested columns
  tabloader bench data/train --cats C1,C2 --conts I1 --labels label --framework torch
  tabloader selftest --device cuda                     check the install
"""
_INSPECT_EXAMPLES = """\
examples:
  tabloader inspect data/train                       files, schema, nulls, suggested columns
  tabloader inspect 'data/*/part-*.parquet' --ranks 8 --batch-size 65536
  tabloader inspect data/train --cats C1,C2 --labels label   check these columns
  tabloader inspect data/train --json | jq .errors
  tabloader inspect data/events --filter 'day<23'    a Delta table, partitions selected
  tabloader inspect wh/db/events --version 4         an Iceberg table, one snapshot

The columns checked are --cats/--conts/--labels, or the suggested ones. For each
categorical column it shows the ids' range and an embedding table for them, from the
footer statistics (a column whose footers have none is read, and the report says so).
Exit status: 0 when nothing would make training fail, 1 when something would (files
whose schemas conflict on those columns; columns missing, not numeric or holding nulls;
no rows), 2 when the files cannot be found or read at all.
"""
_BENCH_EXAMPLES = """\
examples:
  tabloader bench data/train                         the suggested columns, one epoch
  tabloader bench data/train --fill-null 0 --epochs 3 --batch-size 8192
  tabloader bench data/train --cats C1,C2 --conts I1,I2 --labels label --framework torch
  tabloader bench data/train --columns C1,I1,label --shuffle global --cache memory
  tabloader bench data/train --sparse genres --device cuda

It prints what it measured (adapter, device, epochs, rows, batch size, shuffle, cache),
each epoch's time, rows/s and batches/s end to end, and where the time went: the
loader's background work (read, assemble, shuffle and slice) and the time the loop
waited for data.
"""
_CONVERT_EXAMPLES = """\
examples:
  tabloader convert clicks.csv data                   one CSV with a header
  tabloader convert 'raw/day_*.tsv.gz' data --no-header --names label,I1,I2,C1
  tabloader convert events.jsonl data --split valid=0.1,test=0.1 --seed 7
  tabloader convert old/*.parquet data --schema user=int32,price=float64
  tabloader convert clicks.csv data --split valid=0.1 --categorify user_id,country
  tabloader convert clicks.csv data --time-parts event_time=hour,dow --hash item_id=100000
  tabloader convert day2.csv data2 --vocabulary data --time-parts event_time=hour,dow

Every file gets one schema: integers (and whole numbers in text) int64, other
floating point float32, text stays text, or the --schema types; a value that would
change is an error naming it and its row. With --split, each row goes to a split by a
seeded hash of its values as read (DEST/train/, DEST/valid/, ...), which no encoding
changes. It checks that rows in = rows out, and puts the files in place only when all
are written (docs/convert.md).
"""
_SELFTEST_DESCRIPTION = """\
Check this install on generated data (with nulls, NaN and infinities): every row once
per epoch with the requested dtypes; on a GPU, batches bit-identical to the CPU's; the
PyTorch and Keras adapters when installed; memory flat over epochs; and throughput
against the decode limit. Prints PASS, FAIL or SKIP per check; exit status 0 when
nothing failed, 1 when a check failed, 2 when the device cannot be used here.
"""


def _version() -> str:
    from tabloader import __version__

    return __version__


def _wrap(text: str) -> str:
    import textwrap

    return textwrap.fill(text, width=88)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and every option's default at the end of its help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            not action.option_strings
            or "default" in text
            or action.default is argparse.SUPPRESS
            or isinstance(action, (argparse._HelpAction, argparse._VersionAction))
        ):
            return text
        default = action.default
        if default is None:
            shown = "none"
        elif default is True or default is False:
            shown = "on" if default else "off"
        elif isinstance(default, int) and not isinstance(default, bool):
            shown = f"{default:_}" if default >= 100_000 else str(default)
        else:
            shown = str(default)
        return f"{text} (default: {shown})"


def build_parser() -> argparse.ArgumentParser:
    formatter = _HelpFormatter
    parser = argparse.ArgumentParser(
        prog="tabloader",
        description=_wrap(
            "Convert tabular data to parquet, check it before training, and time how fast it loads."
        ),
        epilog=_EXAMPLES,
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"tabloader {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser(
        "convert",
        help="CSV, TSV, JSON lines or parquet files to loader-ready parquet, split if asked",
        description=_wrap(
            "Convert files to parquet the loader reads fast: one schema for every file, row "
            "groups sized for the loader, train/valid splits by a seeded hash of each row, "
            "rows in = rows out."
        ),
        epilog=_CONVERT_EXAMPLES,
        formatter_class=formatter,
    )
    p.add_argument("src", nargs="+", metavar="SRC", help="input files, directories or globs")
    p.add_argument("dest", metavar="DEST", help="output directory (new or empty)")
    p.add_argument(
        "--format",
        choices=["csv", "tsv", "json", "parquet"],
        help="the input format (default: from each file's suffix, else its first bytes)",
    )
    p.add_argument(
        "--header",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether CSV/TSV files start with a header line (default: detected: a first "
        "line holding no number is a header)",
    )
    p.add_argument(
        "--names",
        help="column names for CSV/TSV, comma separated: of files without a header, or "
        "replacing the header (default: the header, else f0, f1, ...)",
    )
    p.add_argument("--delimiter", help="CSV field separator (default: ',', and a tab for TSV)")
    p.add_argument(
        "--schema",
        help="types of some columns, NAME=TYPE,... (int32, int64, float32, float64, bool, "
        "string, ...) or a parquet file whose schema to take (default: ints as int64, "
        "floats as float32, text as string)",
    )
    p.add_argument(
        "--split",
        help="NAME=FRACTION,...: write each split to DEST/NAME by a seeded hash of each row; "
        "train gets the rest (default: no split, DEST/part-*.parquet)",
    )
    p.add_argument(
        "--split-key",
        metavar="COLUMNS",
        help="hash these columns' values for the split instead of the whole row, e.g. "
        "user_id: a user's rows stay in one split (default: the whole row as read)",
    )
    p.add_argument("--seed", type=_non_negative, default=0, help="seed of the split's hash")
    group = p.add_argument_group("encoding columns on the way")
    group.add_argument(
        "--categorify",
        action="append",
        metavar="COLUMNS",
        help="text or integer columns whose values become ids by frequency (2, 3, ...; 0 "
        "for values not in the vocabulary, 1 for nulls), counted on the train split and "
        "written to DEST/_vocabulary (default: none, or those of --vocabulary)",
    )
    group.add_argument(
        "--min-count",
        type=_positive,
        help="values seen fewer times in training get id 0 (default: 1)",
    )
    group.add_argument(
        "--vocabulary",
        metavar="DIR",
        help="take the ids from this vocabulary (a DEST/_vocabulary of an earlier "
        "conversion, or that DEST) instead of counting them: ids stay the same (default: "
        "count them)",
    )
    group.add_argument(
        "--hash",
        action="append",
        metavar="COLUMN=BUCKETS",
        help="ids by the value's hash, 1..BUCKETS-1 (0 for nulls), without a vocabulary "
        "(default: none)",
    )
    group.add_argument(
        "--time-parts",
        action="append",
        metavar="COLUMN=PARTS",
        help="replace a timestamp column by int64 columns of its parts: epoch, year, month, "
        "day, dow, hour, minute, e.g. event_time=hour,dow,day (repeat for more columns; "
        "default: none)",
    )
    group.add_argument(
        "--time-zone",
        help="zone of times written without an offset, and of the parts (default: UTC)",
    )
    p.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="run on this Dask scheduler (tcp://HOST:8786); the inputs and DEST must be on a "
        "file system every worker sees (default: this machine)",
    )
    p.add_argument(
        "--row-group-rows",
        type=_positive,
        help="rows per row group (default: 131,072, fewer for rows wider than 512 bytes)",
    )
    p.add_argument("--rows-per-file", type=_positive, help="rows per file (default: 16 row groups)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the files an earlier conversion wrote in DEST, once the new ones are "
        "complete",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    p = commands.add_parser(
        "inspect",
        help="preflight: schemas, unsupported columns, nulls, row groups, ids, rows per rank",
        description=_wrap(
            "Report everything about the files that would make training fail or crawl, from "
            "the parquet footers alone."
        ),
        epilog=_INSPECT_EXAMPLES,
        formatter_class=formatter,
    )
    p.add_argument(
        "path",
        nargs="+",
        help="files, directories, globs or URLs; a Delta table's directory; an Iceberg "
        "table's directory or metadata file",
    )
    p.add_argument(
        "--format",
        choices=["auto", "files", "delta", "iceberg"],
        default="auto",
        help="what the path is (auto: a local Delta or Iceberg table is recognised)",
    )
    p.add_argument(
        "--version", type=_non_negative, default=None, help="Delta version or Iceberg snapshot id"
    )
    p.add_argument(
        "--filter",
        action="append",
        help="partition filter COLUMN OP VALUE, e.g. 'day<23' (repeat: all must hold)",
    )
    p.add_argument("--ranks", type=_positive, default=1, help="ranks the data will be split across")
    p.add_argument("--batch-size", type=_positive, default=65_536, help="rows per batch per rank")
    _column_flags(p, "to check", "the suggested ones")
    _fill_null_flag(p)
    p.add_argument(
        "--vocabulary",
        metavar="DIR",
        help="size the embedding tables of categorified columns by their vocabularies "
        "(DEST/_vocabulary of tabloader convert --categorify) (default: max id + 1)",
    )
    p.add_argument("--max-files", type=_positive, default=5, help="files to list per schema")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = commands.add_parser(
        "bench",
        help="time full epochs on your data and say where the time goes",
        description=_wrap(
            "Time full epochs of a loader on your data, with the loader's keywords as flags, "
            "and say what was measured and where the time went."
        ),
        epilog=_BENCH_EXAMPLES,
        formatter_class=formatter,
    )
    p.add_argument("path", nargs="+", help="files, directories, globs or URLs")
    group = p.add_argument_group("what to load")
    _column_flags(group, "to load", "without these or --columns, the suggested ones")
    group.add_argument(
        "--columns",
        action="append",
        help="columns to load, comma separated, each as a cat, cont or label by its type and "
        "name as inspect suggests (default: see --cats)",
    )
    _fill_null_flag(group)
    group.add_argument(
        "--sparse", action="append", help="list (multi-hot) columns, comma separated"
    )
    group.add_argument(
        "--sparse-max", metavar="NAME=N,...", help="most values per row of each list column"
    )
    group.add_argument(
        "--sparse-as-dense",
        action="store_true",
        help="deliver list columns padded to --sparse-max values",
    )
    group.add_argument(
        "--cat-dtype",
        help="dtype of categorical columns (default: int64; int32 with --framework jax)",
    )
    group.add_argument("--cont-dtype", default="float32", help="dtype of continuous columns")
    group.add_argument("--label-dtype", default="float32", help="dtype of label columns")
    group = p.add_argument_group("how to batch and shuffle")
    group.add_argument("--batch-size", type=_positive, default=65_536, help="rows per batch")
    group.add_argument("--epochs", type=_positive, default=1, help="epochs to time")
    group.add_argument(
        "--shuffle",
        choices=["true", "false", "global"],
        default="true",
        help="true: row groups in a new order and rows mixed within chunks every epoch; "
        "global: all rows mixed (needs --cache)",
    )
    group.add_argument(
        "--no-shuffle",
        dest="shuffle",
        action="store_const",
        const="false",
        help="the same as --shuffle false (default: off)",
    )
    group.add_argument(
        "--stored-order",
        action="store_true",
        help="shuffled batches keep their rows in stored order (shuffle_within_batch=False)",
    )
    group.add_argument("--seed", type=_non_negative, default=0, help="seed of the shuffle")
    group.add_argument("--drop-last", action="store_true", help="drop a short last batch")
    group.add_argument(
        "--chunk-rows",
        type=_positive,
        help="most rows read and shuffled together (default: chunks of 128 MiB)",
    )
    group.add_argument(
        "--parts-per-chunk",
        type=_positive,
        help="row groups read and shuffled together, instead of --chunk-rows",
    )
    group.add_argument("--prefetch", type=_positive, default=1, help="chunks decoded ahead")
    group = p.add_argument_group("where, and how often the files are read")
    group.add_argument(
        "--device",
        help="cpu, cuda or cuda:N (default: $TABLOADER_DEVICE, else the GPU when cudf and "
        "cupy can use one, else the CPU)",
    )
    group.add_argument(
        "--cache",
        choices=["none", "memory", "disk"],
        default="none",
        help="keep decoded rows after the first epoch, in memory or on disk (CPU only)",
    )
    group.add_argument(
        "--cache-dir",
        help="directory of disk caches (default: $TABLOADER_CACHE_DIR, else ~/.cache/tabloader)",
    )
    group.add_argument(
        "--cache-max-bytes",
        type=_positive,
        help="largest cache to write (default: no limit "
        "but the free disk space or half the memory)",
    )
    group.add_argument(
        "--ranks", type=_positive, default=1, help="ranks the data is split across (global_size)"
    )
    group.add_argument(
        "--rank", type=_non_negative, default=0, help="the rank to time (global_rank)"
    )
    group.add_argument(
        "--framework",
        choices=list(FRAMEWORKS),
        default="none",
        help="none: the core Loader; torch: TorchAsyncItr and DLDataLoader; tensorflow: "
        "KerasSequenceLoader; jax: JaxLoader",
    )

    p = commands.add_parser(
        "selftest",
        help="check the install on generated data: parity, adapters, memory, speed",
        description=_SELFTEST_DESCRIPTION,
        formatter_class=formatter,
    )
    p.add_argument("--device", default=None, help="cpu or a GPU: cuda or cuda:N (default: cpu)")
    p.add_argument("--rows", type=_positive, default=200_000, help="rows of generated data")
    return parser


def _column_flags(parser: Any, what: str, default: str) -> None:
    for kind, meaning in (("cats", "categorical"), ("conts", "continuous"), ("labels", "label")):
        parser.add_argument(
            f"--{kind}",
            action="append",
            metavar="NAMES",
            help=f"{meaning} columns {what}, comma separated (default: {default})",
        )


def _fill_null_flag(parser: Any) -> None:
    parser.add_argument(
        "--fill-null",
        metavar="VALUE|NAME=VALUE,...",
        help="replace nulls as the loader's fill_null does: one number for every column, or "
        "per column (default: none, nulls are an error)",
    )


def _positive(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _non_negative(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "selftest":
        from tabloader.selftest import run_selftest

        return run_selftest(args.device, rows=args.rows)
    if args.command != "convert" and len(args.path) == 1:
        args.path = args.path[0]
    try:
        if args.command == "inspect":
            code = inspect(args, sys.stdout)
        elif args.command == "convert":
            code = convert_files(args, sys.stdout, sys.stderr)
        else:
            code = bench(args, sys.stdout, sys.stderr)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except TabloaderError as error:
        sys.stderr.write(f"tabloader: error: {error}\n")
        return 2
    except ImportError as error:  # an optional framework that is not installed
        sys.stderr.write(f"tabloader: error: {error}\n")
        return 2
    except KeyboardInterrupt:
        what = f"; {args.dest} is as it was" if args.command == "convert" else ""
        sys.stderr.write(f"\ntabloader: interrupted{what}\n")
        return 130  # 128 + SIGINT
    except BrokenPipeError:
        # The reader went away (`tabloader inspect ... | head`): stop quietly, as other
        # command-line tools do. Python would flush stdout again at exit and fail.
        with contextlib.suppress(OSError, ValueError, AttributeError):  # not a real fd
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool stopped by the pipe
    except Exception as error:
        if args.command != "inspect":
            raise
        # inspect reports on files others wrote: what it meets is said in one line, as
        # a finding, never as a traceback
        sys.stderr.write(
            f"tabloader: error: {type(error).__name__}: {error} (tabloader has no message "
            "of its own for this: please report it, with the command)\n"
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
