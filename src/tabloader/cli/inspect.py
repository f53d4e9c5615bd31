"""``tabloader inspect``: the report on files before training, as text or JSON.

The report is `tabloader.inspection.inspect_dataset`'s; this module reads the flags,
opens what they point at (`tabloader.inspection.open_inspected`) and writes the report.
The exit status is 0 when nothing would make training fail, 1 when something would, 2
when the files cannot be found or read at all.
"""

from __future__ import annotations

import argparse
import json
import re
import warnings
from typing import Any, TextIO

from tabloader.cli.flags import (
    column_flags,
    dataset_paths,
    fill_null_flag,
    non_negative,
    parse_fill_null,
    positive,
    refuse_text_files,
    split_names,
    wrap,
)
from tabloader.errors import InvalidArgumentError, TabloaderError
from tabloader.inspection import compact_names, counted, inspect_dataset, open_inspected

__all__ = ["DESCRIPTION", "EPILOG", "HELP", "NAME", "add_flags", "parse_filter", "run"]

NAME = "inspect"
HELP = "preflight: schemas, unsupported columns, nulls, row groups, ids, rows per rank"
DESCRIPTION = wrap(
    "Report everything about the files that would make training fail or crawl, from "
    "the parquet footers alone."
)


def add_flags(p: argparse.ArgumentParser) -> None:
    """``tabloader inspect``'s flags."""
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
        "--version", type=non_negative, default=None, help="Delta version or Iceberg snapshot id"
    )
    p.add_argument(
        "--filter",
        action="append",
        help="partition filter COLUMN OP VALUE, e.g. 'day<23' (repeat: all must hold)",
    )
    p.add_argument("--ranks", type=positive, default=1, help="ranks the data will be split across")
    p.add_argument("--batch-size", type=positive, default=65_536, help="rows per batch per rank")
    column_flags(p, "to check", "the suggested ones")
    fill_null_flag(p)
    p.add_argument(
        "--vocabulary",
        metavar="DIR",
        help="size the embedding tables of categorified columns by their vocabularies "
        "(DEST/_vocabulary of tabloader convert --categorify) (default: max id + 1)",
    )
    p.add_argument("--max-files", type=positive, default=5, help="files to list per schema")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Write the report on ``args.path`` to ``out``; 1 when training would fail.

    What the files hold is said in one line on ``err`` even where tabloader has no
    message of its own for it: inspect reports on files others wrote, so what it meets
    is a finding, never a traceback.
    """
    args.path = dataset_paths(args.path)
    try:
        return _inspect(args, out)
    except (TabloaderError, ImportError, BrokenPipeError):
        raise  # said as every command says them
    except Exception as error:
        err.write(
            f"tabloader: error: {type(error).__name__}: {error} (tabloader has no message "
            "of its own for this: please report it, with the command)\n"
        )
        return 2


def _inspect(args: argparse.Namespace, out: TextIO) -> int:
    refuse_text_files(args.path, command="inspect")
    filters = [parse_filter(t) for t in args.filter] if args.filter else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it reports layout problems itself
        dataset = open_inspected(args.path, kind=args.format, version=args.version, filters=filters)
    report = inspect_dataset(
        dataset,
        ranks=args.ranks,
        batch_size=args.batch_size,
        cats=split_names(args.cats),
        conts=split_names(args.conts),
        labels=split_names(args.labels),
        fill_null=parse_fill_null(args.fill_null),
        vocabulary=args.vocabulary,
    )
    if args.json:
        json.dump(report, out, indent=2)
        out.write("\n")
    else:
        _write_report(report, out, max_files=args.max_files)
    return 1 if report["errors"] else 0


def parse_filter(text: str) -> tuple[str, str, Any]:
    """One ``--filter`` term: ``COLUMN OP VALUE``, the value an integer, a number, or text.

    Examples:
        >>> parse_filter("day<23"), parse_filter("region in eu,us"), parse_filter("r != a b")
        (('day', '<', 23), ('region', 'in', ['eu', 'us']), ('r', '!=', 'a b'))
    """
    match = re.fullmatch(r"\s*([^\s<>=!]+)\s*(==|=|!=|<=|>=|<|>|\s+not\s+in\s+|\s+in\s+)(.*)", text)
    if not match:
        raise InvalidArgumentError(
            "--filter: a filter is COLUMN OP VALUE with OP one of = != < <= > >= in, not in "
            f"(values comma separated), for example 'day<23'; got {text!r}"
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
            f"{counted(parts['files_skipped'], 'file')} skipped\n"
        )
    rg = report["row_group_rows"]
    out.write(
        f"{report['rows']:,} rows in {report['row_groups']:,} row groups"
        + (f" of {counted(report['files'], 'file')}\n" if report["files"] else "\n")
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
            out.write(f"  schema {k}: {counted(len(files), 'file')}: {shown}\n")
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
        f"{per_rank['rows']:,} rows, {counted(per_rank['batches'], 'batch')}"
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


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} bytes"


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

EPILOG = _INSPECT_EXAMPLES
