"""Convert the Criteo click logs (tab-separated day files) to the parquet train_torch.py reads.

    python examples/criteo/convert.py day_0 day_1 --out data/criteo
    python examples/criteo/train_torch.py --data data/criteo

Each input line is ``label, I1..I13, C1..C26`` separated by tabs, without a header;
integer features may be empty, categorical features are 8-digit hex hashes or empty.
This is ``tabloader convert`` (:func:`tabloader.convert.convert`) with the Criteo
column names and one encoding step on the way:

- ``label`` -> float32;
- ``I1..I13``: missing -> 0, negative -> 0, then ``log1p`` -> float32;
- ``C1..C26``: hashed into ids ``1..--hash-buckets - 1`` (id 0 = missing), int64; no
  pass over the data to count values, and the same value gets the same id in every day;
- ``<out>/train/`` and ``<out>/valid/`` (``--valid 0.1`` of the rows, by a seeded hash
  of each row), row groups sized for the loader. Day files may be compressed (``.gz``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabloader.convert import ConvertResult, column_hashes, convert

LABEL = "label"
CONTS = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]
COLUMNS = [LABEL, *CONTS, *CATS]
READ_AS = {LABEL: "float32", **dict.fromkeys(CONTS, "float64"), **dict.fromkeys(CATS, "string")}
"""How the text is read: the encoding below decides the types written."""


def encode(table: pa.Table, hash_buckets: int) -> pa.Table:
    """One batch of raw rows as the model's inputs (see the module docstring)."""
    columns = {LABEL: pc.fill_null(table.column(LABEL), 0).cast(pa.float32())}
    for name in CONTS:
        values = pc.max_element_wise(pc.fill_null(table.column(name), 0.0), 0.0)
        columns[name] = pc.log1p(values).cast(pa.float32())
    for name in CATS:
        values = table.column(name)
        ids = (column_hashes(values) % np.uint64(hash_buckets - 1)).astype(np.int64) + 1
        ids[np.asarray(pc.is_null(values))] = 0
        columns[name] = pa.array(ids)
    return pa.table(columns)


def convert_days(
    inputs: list[str],
    out: Path,
    *,
    hash_buckets: int = 1 << 22,
    valid: float = 0.1,
    seed: int = 0,
    row_group_rows: int | None = None,
    progress: bool = True,
) -> ConvertResult:
    return convert(
        inputs,
        out,
        format="tsv",
        header=False,
        names=COLUMNS,
        schema=READ_AS,
        split={"valid": valid},
        seed=seed,
        row_group_rows=row_group_rows,
        transform=lambda table: encode(table, hash_buckets),
        progress=sys.stderr if progress else None,
    )


def main(argv: list[str] | None = None) -> ConvertResult:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="day files or globs (day_0, day_*.gz, ...)")
    parser.add_argument("--out", type=Path, required=True, help="output directory (new)")
    parser.add_argument(
        "--hash-buckets", type=int, default=1 << 22, help="ids per categorical column"
    )
    parser.add_argument("--valid", type=float, default=0.1, help="share of rows in valid/")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/valid split")
    parser.add_argument("--row-group-rows", type=int, help="rows per row group")
    args = parser.parse_args(argv)
    if args.hash_buckets < 2:
        parser.error("--hash-buckets must be at least 2")
    result = convert_days(
        args.inputs,
        args.out,
        hash_buckets=args.hash_buckets,
        valid=args.valid,
        seed=args.seed,
        row_group_rows=args.row_group_rows,
    )
    print(
        f"{result.rows_in:,} rows -> {args.out}/train ({result.rows_out['train']:,}) and "
        f"{args.out}/valid ({result.rows_out['valid']:,})"
    )
    return result


if __name__ == "__main__":
    main()
