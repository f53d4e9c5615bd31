"""The ``tabloader`` command: check a dataset before training, and measure how fast it loads.

tabloader inspect data/train/
tabloader bench data/train/ --cats C1,C2 --conts I1 --labels label --batch-size 65536
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
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import numpy as np
import pyarrow as pa

from tabloader.dataset import (
    LARGE_ROW_GROUP_BYTES,
    SMALL_ROW_GROUP_ROWS,
    Dataset,
    _ParquetSource,
    small_row_groups,
)
from tabloader.errors import (
    ColumnNotFoundError,
    ColumnTypeError,
    EmptyDatasetError,
    InvalidArgumentError,
    SchemaMismatchError,
    SourceNotFoundError,
    TabloaderError,
)
from tabloader.loader import Loader
from tabloader.plan import count_batches, rank_rows
from tabloader.reader import usable_cores
from tabloader.sources.partitions import describe_filters

__all__ = [
    "LOADER_THREADS",
    "Progress",
    "inspect_dataset",
    "layout_warnings",
    "main",
    "open_inspected",
    "parse_filter",
    "suggest_columns",
    "usable_cores",
]

LOADER_THREADS = 2
"""Background threads of one loader (a reader and a batcher), besides pyarrow's decode pool
and the reader's short-lived layout helpers."""
LABEL_NAME = re.compile(r"label|target|click", re.IGNORECASE)
"""Column names taken for labels when suggesting columns."""


# -- progress -------------------------------------------------------------------------


class Progress:
    """Rows done in one epoch: a tqdm bar on a terminal, a plain line now and then elsewhere.

    The bar redraws at most four times a second, whatever the batch rate; off a terminal
    (a log file, a pipe, CI) a line with the rows done and rows/s is written every
    ``interval`` seconds, and one at the end.

    Examples:
        >>> import io
        >>> out = io.StringIO()
        >>> with Progress(1000, desc="epoch 0", stream=out) as bar:
        ...     for _ in range(4):
        ...         bar.update(250)
        >>> out.getvalue().startswith("epoch 0: 1,000/1,000 rows in ")
        True
    """

    def __init__(
        self, total_rows: int, *, desc: str, stream: TextIO | None = None, interval: float = 10.0
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.total = int(total_rows)
        self.desc = desc
        self.rows = 0
        self.interval = interval
        self.started = time.perf_counter()
        self._next_line = self.started + interval
        self._bar: Any = None
        isatty = getattr(self.stream, "isatty", None)
        if isatty is not None and isatty():
            from tqdm import tqdm  # type: ignore[import-untyped]

            self._bar = tqdm(
                total=self.total,
                desc=desc,
                unit="rows",
                unit_scale=True,
                mininterval=0.25,
                file=self.stream,
                dynamic_ncols=True,
            )

    def update(self, rows: int) -> None:
        """Count ``rows`` more rows done."""
        self.rows += rows
        if self._bar is not None:
            self._bar.update(rows)
            return
        now = time.perf_counter()
        if now >= self._next_line:
            self._next_line = now + self.interval
            self._line(now, final=False)

    def close(self) -> None:
        """Finish the bar, or write the last line."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        else:
            self._line(time.perf_counter(), final=True)

    def _line(self, now: float, *, final: bool) -> None:
        seconds = max(now - self.started, 1e-9)
        verb = "in" if final else "after"
        self.stream.write(
            f"{self.desc}: {self.rows:,}/{self.total:,} rows {verb} {seconds:.1f}s "
            f"({self.rows / seconds:,.0f} rows/s)\n"
        )
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _thread_warning(torch_threads: int, cores: int) -> str | None:
    """What to set when PyTorch's intra-op threads and the loader's threads exceed the cores.

    Examples:
        >>> _thread_warning(2, 2).split(";")[0]
        'PyTorch uses 2 intra-op threads and the loader 2 background threads on 2 cores'
        >>> _thread_warning(6, 8) is None
        True
    """
    if torch_threads + LOADER_THREADS <= cores:
        return None
    fit = max(1, cores - LOADER_THREADS)
    return (
        f"PyTorch uses {torch_threads} intra-op threads and the loader {LOADER_THREADS} "
        f"background threads on {cores} cores; they will fight over the cores and an epoch "
        f"can take several times longer. Call torch.set_num_threads({fit}) or set "
        f"OMP_NUM_THREADS={fit} (see docs/performance.md)"
    )


# -- inspect ----------------------------------------------------------------------------


def layout_warnings(
    partition_rows: np.ndarray, partition_bytes: np.ndarray | None, *, ranks: int
) -> list[str]:
    """Warnings about a layout that will load slowly (pure, for ``inspect``).

    Small row groups are judged by :func:`tabloader.dataset.small_row_groups`, the rule
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
    """``"int"``, ``"float"``, ``"bool"``, ``"list"`` or ``"unsupported"``."""
    if pa.types.is_boolean(field_type):
        return "bool"
    if pa.types.is_integer(field_type):
        return "int"
    if pa.types.is_floating(field_type):
        return "float"
    if (
        pa.types.is_list(field_type)
        or pa.types.is_large_list(field_type)
        or pa.types.is_fixed_size_list(field_type)
    ):
        return "list"
    return "unsupported"


def suggest_columns(schema: pa.Schema) -> dict[str, list[str]]:
    """Columns to load, by type and name: integers are categorical ids, floats and booleans
    continuous, and a numeric column named like label, target or click is a label.

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
            found["cats" if kind == "int" else "conts"].append(field.name)
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
    source = dataset._source
    if not isinstance(source, _ParquetSource):
        return [(dataset.schema, [])]
    return [
        (schema, [source.files[f] for f in np.flatnonzero(source.file_schema == k)])
        for k, schema in enumerate(source.schemas)
    ]


def _schema_difference(schema: pa.Schema, reference: pa.Schema) -> str:
    """How ``schema`` differs from ``reference``, in a few words."""
    notes = []
    for field in schema:
        index = reference.get_field_index(field.name)
        if index < 0:
            notes.append(f"{field.name} only here")
        elif reference.field(index).type != field.type:
            notes.append(f"{field.name} is {field.type} (not {reference.field(index).type})")
    missing = [f.name for f in reference if schema.get_field_index(f.name) < 0]
    if missing:
        notes.append(f"no {compact_names(missing)}")
    return "; ".join(notes) or "same columns, in another order"


def _null_counts(dataset: Dataset) -> dict[str, int | None]:
    """Nulls per column summed from the parquet footers (None where a footer does not say)."""
    source = dataset._source
    if not isinstance(source, _ParquetSource):
        return dict.fromkeys(dataset.schema.names)
    counts: dict[str, int | None] = {}
    mapping = source.columns
    for f in range(len(source.files)):
        md = source.metadata(f)
        # The dataset's name of each stored column (an Iceberg column may have been
        # renamed since the file was written), and the columns constant in this file.
        names = {
            stored: name
            for name in dataset.schema.names
            if (stored := mapping.stored_name(f, name)) is not None
        }
        for name in dataset.schema.names:
            constant = name not in names.values() and name in mapping.types
            if constant and counts.get(name, 0) is not None:
                null = mapping.values[f].get(name) is None
                counts[name] = (counts.get(name) or 0) + (md.num_rows if null else 0)
        for g in range(md.num_row_groups):
            row_group = md.row_group(g)
            for c in range(row_group.num_columns):
                column = row_group.column(c)
                stored = column.path_in_schema.split(".")[0]
                name = names.get(stored, stored)
                stats = column.statistics
                if stats is None or not getattr(stats, "has_null_count", True):
                    counts[name] = None
                elif name not in counts or counts[name] is not None:
                    counts[name] = (counts.get(name) or 0) + int(stats.null_count or 0)
    return counts


def _row_group_bytes(dataset: Dataset) -> np.ndarray | None:
    source = dataset._source
    if not isinstance(source, _ParquetSource):
        return None
    return np.array(
        [
            source.metadata(int(f)).row_group(int(g)).total_byte_size
            for f, g in zip(source.part_file, source.part_row_group, strict=True)
        ],
        dtype=np.int64,
    )


def inspect_dataset(
    dataset: Dataset,
    *,
    ranks: int = 1,
    batch_size: int = 65_536,
    cats: Sequence[str] = (),
    conts: Sequence[str] = (),
    labels: Sequence[str] = (),
) -> dict[str, Any]:
    """Everything about ``dataset`` that would make training fail or crawl, from footers.

    Returns a JSON-ready report: files, rows and row groups, the distinct schemas with
    their files, per column its type, nulls and suggested use, what one rank gets, the
    suggested ``cats``/``conts``/``labels``, and ``errors`` (training would fail) and
    ``warnings`` (training would be slow). The columns to check are the ones given, or
    the suggested ones.

    Examples:
        >>> table = pa.table({"user": [1, 2, 3], "x": [0.5, None, 1.0], "label": [0., 1., 0.]})
        >>> report = inspect_dataset(Dataset(table), batch_size=2)
        >>> report["suggested"], report["per_rank"]["batches"]
        ({'cats': ['user'], 'conts': ['x'], 'labels': ['label']}, 2)
    """
    rows = dataset.partition_rows
    sizes = _row_group_bytes(dataset)
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
    failure = _loader_failure(dataset, requested, batch_size=batch_size, ranks=ranks)
    errors: list[str] = []
    warns = layout_warnings(rows, sizes, ranks=ranks)
    if len(groups) > 1:
        listing = "; ".join(
            f"schema {k + 1} ({_count(len(files), 'file')}: "
            f"{', '.join(files[:3])}{', ...' if len(files) > 3 else ''})"
            + ("" if k == 0 else f": {_schema_difference(schema, reference)}")
            for k, (schema, files) in enumerate(groups)
        )
        # An error when it touches the columns to load; else training works regardless.
        fatal = isinstance(failure, (SchemaMismatchError, ColumnNotFoundError))
        (errors if fatal else warns).append(
            f"the files disagree on their schema ({len(groups)} schemas): {listing}. Rewrite "
            "the odd files with the common schema"
        )
    unsupported = [c for c in columns if c["use"] == "unsupported"]
    if unsupported:
        warns.append(
            "columns that cannot be loaded: "
            + ", ".join(f"{c['name']} ({c['type']})" for c in unsupported)
            + ". Encode strings as integer ids (for example with pandas factorize), or leave "
            "them out"
        )
    if failure is not None:
        errors.append(f"with {which}: {failure}")
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
        "errors": errors,
        "warnings": warns,
    }


def _loader_failure(
    dataset: Dataset, columns: dict[str, list[str]], *, batch_size: int, ranks: int
) -> TabloaderError | None:
    """Why a loader of ``columns`` could not be built on ``dataset``, or None if it can.

    The loader's own checks (columns present in every file with one type, numeric, no
    nulls, at least one batch) decide, from the footers alone.
    """
    if not dataset.num_rows:
        return EmptyDatasetError("the dataset has no rows")
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
            )
    except TabloaderError as error:
        return error
    return None


def _count(n: int, noun: str) -> str:
    plural = noun + ("es" if noun.endswith("ch") else "s")
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
        out.write(f"schemas: {len(schemas)} distinct ones (see the error below)\n")
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
        from tabloader.sources.iceberg import import_pyiceberg

        import_pyiceberg()
        from pyiceberg.table import StaticTable

        location = str(path)
        if not location.endswith(".metadata.json") and "://" not in location:
            location = _newest_metadata(location)
        table = StaticTable.from_metadata(location)
        return Dataset.from_iceberg(table, snapshot_id=version, filters=filters)
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


def inspect(args: argparse.Namespace, out: TextIO) -> int:
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
    )
    if args.json:
        json.dump(report, out, indent=2)
        out.write("\n")
    else:
        _write_report(report, out, max_files=args.max_files)
    return 1 if report["errors"] else 0


# -- bench ------------------------------------------------------------------------------


def _names(values: Sequence[str] | None) -> list[str]:
    return [n for v in values or () for n in v.split(",") if n]


def _batches(args: argparse.Namespace, options: dict[str, Any]) -> tuple[Iterable[Any], Loader]:
    """The iterable to time, and the core loader whose statistics describe it."""
    dataset = Dataset(args.path)
    if args.framework == "torch":
        from tabloader.torch import DLDataLoader, TorchAsyncItr

        torch_dataset = TorchAsyncItr(dataset, **options)
        torch_loader = DLDataLoader(torch_dataset, batch_size=None, collate_fn=lambda x: x)
        return torch_loader, torch_dataset.loader
    if args.framework == "tensorflow":
        from tabloader.tensorflow import KerasSequenceLoader

        keras_loader = KerasSequenceLoader(
            dataset,
            batch_size=options["batch_size"],
            cat_names=options["cats"],
            cont_names=options["conts"],
            label_names=options["labels"],
            shuffle=options["shuffle"],
            shuffle_within_batch=options["shuffle_within_batch"],
            seed=options["seed"],
        )

        def items() -> Iterable[Any]:
            for i in range(len(keras_loader)):
                yield keras_loader[i]
            keras_loader.on_epoch_end()

        return _Repeatable(items), keras_loader.loader
    loader = Loader(dataset, **options)
    return loader, loader


class _Repeatable:
    def __init__(self, make: Any) -> None:
        self.make = make

    def __iter__(self) -> Any:
        return iter(self.make())


def _loader_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "cats": _names(args.cats),
        "conts": _names(args.conts),
        "labels": _names(args.labels),
        "batch_size": args.batch_size,
        "shuffle": args.shuffle,
        "shuffle_within_batch": not args.stored_order,
        "seed": args.seed,
    }


def bench(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    iterable, loader = _batches(args, _loader_options(args))
    if args.framework == "torch":
        import torch

        advice = _thread_warning(torch.get_num_threads(), usable_cores())
        if advice:
            err.write(f"tabloader: warning: {advice}\n")
    batches = len(loader)
    lo, hi = rank_rows(
        loader.dataset.num_rows, global_rank=loader.global_rank, global_size=loader.global_size
    )
    epoch_rows = min(hi - lo, batches * args.batch_size)
    started = time.perf_counter()
    for epoch in range(args.epochs):
        epoch_started = time.perf_counter()
        with Progress(epoch_rows, desc=f"epoch {epoch}", stream=err) as progress:
            for i, _ in enumerate(iterable):
                progress.update(min(args.batch_size, epoch_rows - i * args.batch_size))
        seconds = time.perf_counter() - epoch_started
        out.write(f"epoch {epoch}: {epoch_rows:,} rows in {seconds:.2f}s\n")
    elapsed = time.perf_counter() - started
    stats = loader.stats()
    rows = stats.rows if stats.rows else epoch_rows * args.epochs
    out.write(
        f"{rows / elapsed:,.0f} rows/s, {stats.batches / elapsed:,.1f} batches/s "
        f"({args.framework})\n"
        f"background: read {stats.read_seconds:.2f}s, assemble {stats.assemble_seconds:.2f}s, "
        f"shuffle and slice {stats.batch_seconds:.2f}s\n"
        f"waiting for data: {stats.wait_seconds:.2f}s of {stats.consume_seconds:.2f}s "
        f"({stats.input_bound_fraction:.0%} input-bound)\n"
    )
    return 0


# -- the command line -------------------------------------------------------------------

_EXAMPLES = """\
examples:
  tabloader inspect 'data/train/*.parquet'           check the files before training
  tabloader inspect data/train --ranks 8 --json      the same, for a script
  tabloader bench data/train --cats C1,C2 --conts I1 --labels label --epochs 2
  tabloader bench data/train --cats C1 --labels label --framework torch
"""
_INSPECT_EXAMPLES = """\
examples:
  tabloader inspect data/train                       files, schema, nulls, suggested columns
  tabloader inspect 'data/*/part-*.parquet' --ranks 8 --batch-size 65536
  tabloader inspect data/train --cats C1,C2 --labels label   check these columns
  tabloader inspect data/train --json | jq .errors
  tabloader inspect data/events --filter 'day<23'    a Delta table, partitions selected
  tabloader inspect wh/db/events --version 4         an Iceberg table, one snapshot

The columns checked are --cats/--conts/--labels, or the suggested ones. Exit status: 0
when nothing would make training fail, 1 when something would (files whose schemas
disagree on those columns; columns missing, not numeric or holding nulls; no rows), 2
when the files cannot be found or read at all.
"""
_BENCH_EXAMPLES = """\
examples:
  tabloader bench data/train --cats C1,C2 --conts I1,I2 --labels label
  tabloader bench data/train --cats C1 --labels label --batch-size 8192 --epochs 3
  tabloader bench data/train --cats C1 --labels label --framework torch --stored-order
"""


def _version() -> str:
    from tabloader import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="tabloader",
        description=__doc__.splitlines()[0],
        epilog=_EXAMPLES,
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"tabloader {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser(
        "inspect",
        help="preflight: schemas, unsupported columns, nulls, row groups, rows per rank",
        description="Report everything about the files that would make training fail or "
        "crawl, from the parquet footers alone.",
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
    _column_flags(p, "to check (default: the suggested ones)")
    p.add_argument("--max-files", type=_positive, default=5, help="files to list per schema")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    p = commands.add_parser(
        "bench",
        help="time full epochs and say where the time goes",
        epilog=_BENCH_EXAMPLES,
        formatter_class=formatter,
    )
    p.add_argument("path", nargs="+", help="files, directories, globs or URLs")
    _column_flags(p, "to load")
    p.add_argument("--batch-size", type=_positive, default=65_536)
    p.add_argument("--epochs", type=_positive, default=1)
    p.add_argument("--no-shuffle", dest="shuffle", action="store_false")
    p.add_argument(
        "--stored-order",
        action="store_true",
        help="shuffled batches keep their rows in stored order (shuffle_within_batch=False)",
    )
    p.add_argument("--seed", type=_non_negative, default=0)
    p.add_argument("--framework", choices=["none", "torch", "tensorflow"], default="none")
    p = commands.add_parser(
        "selftest", help="check the install on generated data: parity, adapters, memory, speed"
    )
    p.add_argument("--device", default=None, help="cpu (default), cuda or cuda:N")
    p.add_argument("--rows", type=int, default=200_000, help="rows of generated data")
    return parser


def _column_flags(parser: argparse.ArgumentParser, what: str) -> None:
    for kind, meaning in (("cats", "categorical"), ("conts", "continuous"), ("labels", "label")):
        parser.add_argument(
            f"--{kind}", action="append", help=f"{meaning} columns {what}, comma separated"
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
    if len(args.path) == 1:
        args.path = args.path[0]
    try:
        if args.command == "inspect":
            code = inspect(args, sys.stdout)
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
    except BrokenPipeError:
        # The reader went away (`tabloader inspect ... | head`): stop quietly, as other
        # command-line tools do. Python would flush stdout again at exit and fail.
        with contextlib.suppress(OSError, ValueError, AttributeError):  # not a real fd
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool stopped by the pipe


if __name__ == "__main__":
    sys.exit(main())
