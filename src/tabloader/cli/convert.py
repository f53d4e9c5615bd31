"""``tabloader convert``: the flags of `tabloader.convert.convert`, and what it wrote, said
in a few lines with the next command to run.
"""

from __future__ import annotations

import argparse
import os
from typing import TextIO

from tabloader.cli.flags import non_negative, positive, split_names, wrap
from tabloader.inspection import compact_names, counted

__all__ = ["DESCRIPTION", "EPILOG", "HELP", "NAME", "add_flags", "run"]

NAME = "convert"
HELP = "CSV, TSV, JSON lines or parquet files to loader-ready parquet, split if asked"
DESCRIPTION = wrap(
    "Convert files to parquet the loader reads fast: one schema for every file, row "
    "groups sized for the loader, train/valid splits by a seeded hash of each row, "
    "rows in = rows out."
)


def add_flags(p: argparse.ArgumentParser) -> None:
    """``tabloader convert``'s flags."""
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
        "line holding no number is a header; with --names, one followed by a line holding "
        "no number either must be said)",
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
    p.add_argument("--seed", type=non_negative, default=0, help="seed of the split's hash")
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
        type=positive,
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
        type=positive,
        help="rows per row group (default: 131,072, fewer for rows wider than 512 bytes)",
    )
    p.add_argument("--rows-per-file", type=positive, help="rows per file (default: 16 row groups)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the files an earlier conversion wrote in DEST, once the new ones are "
        "complete",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Convert ``args.src`` into ``args.dest`` and say what was written; an interrupted
    conversion leaves ``args.dest`` as it was, and says so."""
    from tabloader.convert import convert

    try:
        result = convert(
            args.src,
            args.dest,
            format=args.format,
            header=args.header,
            names=split_names([args.names]) if args.names else None,
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
    except KeyboardInterrupt:
        err.write(f"\ntabloader: interrupted; {args.dest} is as it was\n")
        return 130  # 128 + SIGINT
    rows_out = sum(result.rows_out.values())
    out.write(
        f"converted {counted(len(result.inputs), 'file')}: {result.rows_in:,} rows in, "
        f"{rows_out:,} rows out\n"
    )
    for name, files in result.files.items():
        where = os.path.join(args.dest, name) if name else args.dest
        out.write(
            f"  {(name or 'rows') + ':':<8} {result.rows_out[name]:>12,} rows in "
            f"{counted(len(files), 'file')} -> {where}\n"
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

EPILOG = _CONVERT_EXAMPLES
