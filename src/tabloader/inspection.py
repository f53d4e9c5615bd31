"""What would make training on a dataset fail or crawl, found before training, from footers.

`inspect_dataset` builds ``tabloader inspect``'s report, a JSON-ready dict: files, rows
and row groups, the distinct schemas and how they differ, per column its type, nulls
and suggested use (`suggest_columns`), what one rank gets, the ids of the id columns and
an embedding table for them, and the errors (training would fail), warnings (training
would be slow, `layout_warnings`) and notes. The loader's own checks decide what fails.
`open_inspected` opens what the command is pointed at: files, or a Delta or Iceberg
table recognised by its layout. The command line writes the report as text or JSON.

Examples:
    >>> import pyarrow as pa
    >>> report = inspect_dataset(Dataset(pa.table({"id": [1, 2], "label": [0.0, 1.0]})))
    >>> report["suggested"], report["errors"]
    ({'cats': ['id'], 'conts': [], 'labels': ['label']}, [])
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabloader.checks import encoding_hint
from tabloader.columns import type_difference
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
    SchemaMismatchError,
    TabloaderError,
)
from tabloader.loader import Loader
from tabloader.plan import count_batches, rank_rows
from tabloader.sources import table_format_at
from tabloader.sources.partitions import describe_filters

__all__ = [
    "compact_names",
    "counted",
    "inspect_dataset",
    "layout_warnings",
    "open_inspected",
    "suggest_columns",
]

LABEL_NAME = re.compile(r"label|target|click", re.IGNORECASE)
"""Column names taken for labels when suggesting columns."""


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


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1.

    Examples:
        >>> counted(1, "file"), counted(1_200, "batch")
        ('1 file', '1,200 batches')
    """
    plural = {"batch": "batches"}.get(noun, noun + "s")
    return f"{n:,} {noun if n == 1 else plural}"


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
    dataset: Dataset,
    cats: Sequence[str],
    vocabulary: str | None,
    fills: Mapping[str, int] | None = None,
) -> tuple[dict[str, dict[str, Any]], list[str], list[str]]:
    """Per id column that can be sized: its ids, how many are distinct, the embedding table
    for them (rows from ``vocabulary`` where it holds the column) and its bytes, and
    whether the footers told or the column was read (on the CPU); the warnings about
    tables above the budget; and the errors: ids no embedding table has (negative ones,
    which the loader delivers as they are and an embedding lookup then refuses).
    ``fills``: the value the loader delivers for the nulls of a column that has some, an
    id like the others (counted in the table's rows; a negative one is an error)."""
    from tabloader.vocabulary import find_vocabulary_dir, vocabulary_columns, vocabulary_rows

    held: dict[str, str] = {}
    if vocabulary is not None:
        directory = find_vocabulary_dir(vocabulary)
        held = {n: directory for n in vocabulary_columns(directory)}
    found: dict[str, dict[str, Any]] = {}
    advice, errors = [], []
    for name in cats:
        try:
            ranges = id_ranges(dataset, [name], device="cpu")
        except InvalidArgumentError as err:  # negative ids: nothing else checks them
            errors.append(f"{err}. The loader delivers them as they are; an embedding lookup fails")
            continue
        except TabloaderError:
            continue  # the loader's check reports what is wrong with it
        ids = ranges[name]
        fill = (fills or {}).get(name)
        if fill is not None:
            if fill < 0:
                errors.append(
                    f"column {name!r}: its nulls are filled with {fill}, a negative id, which "
                    "no embedding table has. The loader delivers it as it is; an embedding "
                    "lookup fails. Fill them with an id the table holds"
                )
                continue
            low = fill if ids.min is None else min(ids.min, fill)
            ids = replace(ids, min=low, max=fill if ids.max is None else max(ids.max, fill))
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
    return found, advice, errors


def _fill_of(fill_null: float | Mapping[str, float] | None, name: str) -> float | None:
    """The fill value ``fill_null`` gives column ``name`` (None: none)."""
    if isinstance(fill_null, Mapping):
        return fill_null.get(name)
    return fill_null


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
        # a list's footer counts its values' nulls with its empty and null lists, which
        # are no null the loader meets: not known from the footers
        nested = any(s.nested for s in stats)
        counts[name] = None if None in nulls or nested else sum(n for n in nulls if n is not None)
    return counts


def _count_nulls(dataset: Dataset, name: str) -> int:
    """Nulls of column ``name`` the loader refuses, read from the row groups whose footers
    do not say: a list's values' (a null list is an empty one), a vector's rows' and
    values'."""
    found = dataset.source.footer_statistics(name) or [None] * dataset.num_partitions
    total = 0
    for partition, stats in enumerate(found):
        if stats is not None and stats.nulls is not None and not stats.nested:
            total += stats.nulls
            continue
        column = dataset.read_partition(partition, [name]).column(0)
        if pa.types.is_fixed_size_list(column.type):
            total += column.null_count + pc.list_flatten(column).null_count
        elif pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            total += pc.list_flatten(column).null_count
        else:
            total += column.null_count
    return total


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
    given = any(requested.values())
    which = "the requested columns" if given else "the suggested columns"
    if not given:
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
            f"schema {k + 1} ({counted(len(files), 'file')}: "
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
    else:  # nulls the footers do not record: counted, as the loader would meet them
        every = fill_null is not None and not isinstance(fill_null, Mapping)  # one for all
        filled = set(fill_null) if isinstance(fill_null, Mapping) else set()
        for name in [c for names in requested.values() for c in names]:
            if every or name in filled or nulls.get(name) is not None:
                continue  # none, or the loader's own check said (footers record them)
            null_count = _count_nulls(dataset, name)
            for column in columns:
                if column["name"] == name:
                    column["nulls"] = null_count
            if null_count:
                errors.append(
                    f"with {which}: column {name!r} has {null_count:,} null value(s) (counted in "
                    "the data: the footers do not tell them), which the loader refuses as it reads "
                    f"them. Pass --fill-null {name}=0 (fill_null={{{name!r}: 0}}), or fill "
                    "them in the data"
                )
    # a fill is an id the loader delivers, for a column with nulls (or not known without)
    fills = {
        c["name"]: int(fill)
        for c in columns
        if c["name"] in requested["cats"] and c["nulls"] != 0
        for fill in [_fill_of(fill_null, c["name"])]
        if fill is not None and float(fill).is_integer()
    }
    ids, advice, id_errors = _id_report(dataset, requested["cats"], vocabulary, fills)
    warns += advice
    if given:
        errors += id_errors
    else:  # a signed integer suggested as ids may be a measurement
        warns += [f"{e}; or, not ids, list it under --conts" for e in id_errors]
    per_rank_rows = dataset.num_rows // ranks
    batches = count_batches(per_rank_rows, batch_size, drop_last=False)
    lo, hi = rank_rows(dataset.num_rows, global_rank=0, global_size=ranks)
    if dataset.num_rows and not per_rank_rows:
        warns.append(
            f"every rank gets 0 rows: {ranks:,} ranks share {dataset.num_rows:,} rows, so "
            "the loader yields no batch. Use fewer ranks"
        )
    elif per_rank_rows and per_rank_rows < batch_size:
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


def open_inspected(
    path: str | list[str], *, kind: str = "auto", version: int | None = None, filters: Any = None
) -> Dataset:
    """The dataset ``tabloader inspect`` reports on: a Delta table (a directory holding
    ``_delta_log``), an Iceberg table (its ``*.metadata.json`` file, or a directory holding
    ``metadata/``: the newest metadata file), or files. ``kind`` forces one of
    ``"delta"``, ``"iceberg"`` or ``"files"`` (needed for URLs)."""
    if kind == "auto" and isinstance(path, str):
        kind = table_format_at(path) or kind
    if kind in ("delta", "iceberg") and not isinstance(path, str):
        raise InvalidArgumentError(f"a {kind} table is one path, got {len(path)}")
    if kind == "delta":
        return Dataset.from_delta(str(path), version=version, filters=filters)
    if kind == "iceberg":
        from tabloader.sources.iceberg import static_table

        table = static_table(str(path))
        return Dataset.from_iceberg(table, snapshot_id=version, filters=filters)
    if version is not None:
        raise InvalidArgumentError("--version applies to Delta and Iceberg tables, not to files")
    return Dataset(path, filters=filters)
