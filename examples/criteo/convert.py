"""Convert the Criteo click logs (tab-separated day files) to parquet that tabloader loads fast.

    python examples/criteo/convert.py day_0 day_1 --out data/criteo/train
    python examples/criteo/convert.py 'day_*' --out data/criteo --scheduler tcp://host:8786

Each input line is ``label, I1..I13, C1..C26`` separated by tabs; integer features may be
empty, categorical features are 8-digit hex hashes or empty. The conversion, done with
Dask so it runs on a ``dask.distributed`` cluster when the data outgrows one machine:

- ``label`` -> float32;
- ``I1..I13``: missing -> 0, negative -> 0, then ``log1p`` -> float32;
- ``C1..C26``: categorified to contiguous int64 ids by frequency (id 0 = missing or rarer
  than ``--min-frequency``; the most frequent value gets id 1), or with ``--hash-buckets N``
  hashed into ``1..N-1`` (no pass over the data to count values, a fixed vocabulary);
- written with row groups of ``--row-group-size`` rows (default 131,072: big enough to
  read efficiently, small enough to shuffle well), the files in input order.

The vocabularies are saved as ``<out>/_vocab/<column>.parquet`` (value, id, count; a
``_`` folder, so loading ``<out>`` skips it) and can be applied to validation days with
``--vocab <out>/_vocab``, which gives the same values the same ids.
"""

from __future__ import annotations

import argparse
import glob
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

LABEL = "label"
CONTS = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]
COLUMNS = [LABEL, *CONTS, *CATS]


def read_days(paths: list[str], blocksize: str) -> Any:
    import dask.dataframe as dd

    dtypes: dict[str, Any] = {LABEL: "float32", **dict.fromkeys(CONTS, "float64")}
    dtypes.update(dict.fromkeys(CATS, "object"))
    return dd.read_csv(
        paths, sep="\t", names=COLUMNS, header=None, dtype=dtypes, blocksize=blocksize
    )


def count_values(frame: Any, min_frequency: int) -> dict[str, pd.DataFrame]:
    """Per categorical column: the values seen at least ``min_frequency`` times, with ids."""
    import dask

    counts = dask.compute(*[frame[c].value_counts(dropna=True) for c in CATS])
    vocab = {}
    for name, series in zip(CATS, counts, strict=True):
        kept = series[series >= min_frequency].sort_values(ascending=False, kind="stable")
        vocab[name] = pd.DataFrame(
            {"value": kept.index.astype(str), "id": np.arange(1, len(kept) + 1), "count": kept}
        ).reset_index(drop=True)
    return vocab


def encode_partition(
    part: pd.DataFrame, vocab: dict[str, pd.Series] | None, hash_buckets: int | None
) -> pd.DataFrame:
    out = pd.DataFrame(index=part.index)
    out[LABEL] = part[LABEL].fillna(0).astype(np.float32)
    for name in CONTS:
        out[name] = np.log1p(part[name].fillna(0).clip(lower=0)).astype(np.float32)
    for name in CATS:
        values = part[name]
        if hash_buckets is not None:
            hashed = pd.util.hash_pandas_object(values.fillna(""), index=False).to_numpy()
            ids = (hashed % np.uint64(hash_buckets - 1)).astype(np.int64) + 1
            ids[values.isna().to_numpy()] = 0
        else:
            assert vocab is not None
            ids = values.map(vocab[name]).fillna(0).to_numpy(dtype=np.int64)
        out[name] = ids
    return out


def convert(
    inputs: list[str],
    out: Path,
    *,
    min_frequency: int = 1,
    hash_buckets: int | None = None,
    vocab_dir: Path | None = None,
    row_group_size: int = 131_072,
    blocksize: str = "256MB",
) -> None:
    paths = sorted(p for pattern in inputs for p in (glob.glob(pattern) or [pattern]))
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise SystemExit(f"no such input file(s): {', '.join(missing)}")
    frame = read_days(paths, blocksize)
    lookups: dict[str, pd.Series] | None = None
    if hash_buckets is None:
        if vocab_dir is not None:
            vocab = {c: pd.read_parquet(vocab_dir / f"{c}.parquet") for c in CATS}
        else:
            vocab = count_values(frame, min_frequency)
            (out / "_vocab").mkdir(parents=True, exist_ok=True)
            for name, table in vocab.items():
                table.to_parquet(out / "_vocab" / f"{name}.parquet", index=False)
        lookups = {c: pd.Series(v["id"].to_numpy(), index=v["value"]) for c, v in vocab.items()}
    meta = encode_partition(frame._meta, lookups, hash_buckets)
    encoded = frame.map_partitions(encode_partition, lookups, hash_buckets, meta=meta)
    encoded.to_parquet(
        out,
        write_index=False,
        row_group_size=row_group_size,
        name_function=lambda i: f"part-{i:05d}.parquet",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="day files or globs (day_0, day_*.tsv, ...)")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--min-frequency", type=int, default=1)
    parser.add_argument("--hash-buckets", type=int, help="hash categorical values instead")
    parser.add_argument("--vocab", type=Path, help="reuse the vocabularies saved by a run")
    parser.add_argument("--row-group-size", type=int, default=131_072)
    parser.add_argument("--blocksize", default="256MB", help="bytes of text per Dask task")
    parser.add_argument("--scheduler", help="address of a dask.distributed scheduler")
    args = parser.parse_args(argv)
    if args.hash_buckets is not None and args.hash_buckets < 2:
        parser.error("--hash-buckets must be at least 2")

    from distributed import Client, LocalCluster

    cluster = None if args.scheduler else LocalCluster(dashboard_address=None)
    with Client(args.scheduler or cluster):
        convert(
            args.inputs,
            args.out,
            min_frequency=args.min_frequency,
            hash_buckets=args.hash_buckets,
            vocab_dir=args.vocab,
            row_group_size=args.row_group_size,
            blocksize=args.blocksize,
        )
    if cluster is not None:
        cluster.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
