"""Turn MovieLens ratings into the parquet files the MovieLens examples train on.

Writes ``<out>/train.parquet``, ``<out>/valid.parquet`` and ``<out>/meta.json``:

- ``userId``, ``movieId``: int64 ids made contiguous (0..n-1, in the order of the
  original ids) from the *training* rows; ids that only occur in the validation rows
  get the reserved id n. ``meta.json`` holds each column's cardinality (n + 1), the
  embedding table size a model needs.
- ``label``: float32, 1.0 when the rating is above 3 (a "like"), else 0.0.
- with ``--genres``: the movie's genres as a list column ``genres`` (``list<int64>``,
  ids into ``meta.json``'s ``genre_names``), for an embedding bag, and one float32
  column ``genre_<name>`` per genre, 1.0 when the movie has that genre (multi-hot).

The ratings come from an official zip: ``ml-100k.zip`` (``u.data``, genres from
``u.item``), or ``ml-latest-small.zip`` / ``ml-25m.zip`` / ``ml-20m.zip``
(``ratings.csv``, genres from ``movies.csv``), from
https://grouplens.org/datasets/movielens/. The MovieLens licence does not allow
redistributing the data: it is not shipped here, and stays out of version control
(``examples/*/data/`` is ignored).

The split is random by default: ``--valid-fraction`` of the ratings (0.2), drawn with
``--seed`` (0), so the same input always gives the same files. ``--split time`` instead
keeps the latest ratings (by timestamp) for validation, as a deployed recommender would
meet them.

Usage:
    python examples/movielens/prepare.py ml-100k.zip --genres  # an official zip
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

DEFAULT_OUT = Path(__file__).resolve().parent / "data"
ROW_GROUP_SIZE = 131_072
ML100K_GENRES = [
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
    "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
    "Romance", "Sci-Fi", "Thriller", "War", "Western",
]  # fmt: skip


# -- reading --------------------------------------------------------------------------

Genres = dict[int, list[str]]
"""movieId -> genre names."""


def _csv(
    source: IO[bytes] | Path,
    *,
    delimiter: str,
    names: list[str] | None = None,
    encoding: str = "utf8",
    quoting: bool = True,
) -> pa.Table:
    return pcsv.read_csv(
        source,
        read_options=pcsv.ReadOptions(column_names=names, encoding=encoding),
        parse_options=pcsv.ParseOptions(delimiter=delimiter, quote_char='"' if quoting else False),
    )


def _ratings(table: pa.Table) -> pa.Table:
    return pa.table(
        {
            "userId": table["userId"].cast(pa.int64()),
            "movieId": table["movieId"].cast(pa.int64()),
            "rating": table["rating"].cast(pa.float32()),
            "timestamp": pc.cast(table["timestamp"], pa.int64(), safe=False),
        }
    )


def _member(archive: zipfile.ZipFile, name: str) -> str | None:
    for member in archive.namelist():
        if member == name or member.endswith("/" + name):
            return member
    return None


def read_zip(path: Path) -> tuple[pa.Table, Genres]:
    """Ratings and genres from an official MovieLens zip."""
    with zipfile.ZipFile(path) as archive:
        if member := _member(archive, "u.data"):
            with archive.open(member) as f:
                ratings = _csv(
                    f, delimiter="\t", names=["userId", "movieId", "rating", "timestamp"]
                )
            genres: Genres = {}
            if member := _member(archive, "u.item"):
                names = ML100K_GENRES
                if genre_member := _member(archive, "u.genre"):
                    with archive.open(genre_member) as f:
                        lines = f.read().decode("latin-1").splitlines()
                    names = [line.split("|")[0] for line in lines if line.strip()]
                with archive.open(member) as f:
                    for line in f.read().decode("latin-1").splitlines():
                        fields = line.split("|")
                        if len(fields) < 5 + len(names):
                            continue
                        flags = fields[-len(names) :]
                        genres[int(fields[0])] = [
                            g for g, on in zip(names, flags, strict=True) if on == "1"
                        ]
            return _ratings(ratings), genres
        if member := _member(archive, "ratings.csv"):
            with archive.open(member) as f:
                ratings = _csv(f, delimiter=",")
            genres = {}
            if member := _member(archive, "movies.csv"):
                with archive.open(member) as f:
                    movies = _csv(f, delimiter=",")
                for movie, names in zip(
                    movies["movieId"].to_pylist(), movies["genres"].to_pylist(), strict=True
                ):
                    genres[int(movie)] = [g for g in str(names or "").split("|") if g]
            return _ratings(ratings), genres
    raise SystemExit(
        f"{path} holds neither u.data (ml-100k) nor ratings.csv (ml-latest-small, ml-20m, "
        "ml-25m); other MovieLens releases are not supported"
    )


# -- preparing ------------------------------------------------------------------------


def categorify(train: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Contiguous ids fit on ``train``; ids unseen in training map to the reserved id n.

    >>> categorify(np.array([30, 10, 30]), np.array([10, 20]))
    (array([1, 0, 1]), array([0, 2]), 3)
    """
    uniques = np.unique(train)
    train_codes = np.searchsorted(uniques, train)
    position = np.minimum(np.searchsorted(uniques, valid), len(uniques) - 1)
    valid_codes = np.where(uniques[position] == valid, position, len(uniques))
    return train_codes.astype(np.int64), valid_codes.astype(np.int64), len(uniques) + 1


def genre_column(name: str) -> str:
    """``"Children's"`` -> ``"genre_children_s"``."""
    return "genre_" + re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


def split_rows(
    table: pa.Table, *, how: str, valid_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of the training and validation rows."""
    rows = table.num_rows
    n_valid = round(rows * valid_fraction)
    if how == "time":
        order = np.argsort(table["timestamp"].to_numpy(), kind="stable")
    else:
        order = np.random.default_rng(seed).permutation(rows)
    return np.sort(order[: rows - n_valid]), np.sort(order[rows - n_valid :])


def prepare(
    ratings: pa.Table,
    genres: Genres,
    out: Path,
    *,
    with_genres: bool,
    how: str = "random",
    valid_fraction: float = 0.2,
    seed: int = 0,
    source: str = "",
) -> dict[str, Any]:
    train_rows, valid_rows = split_rows(ratings, how=how, valid_fraction=valid_fraction, seed=seed)
    columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    cardinalities = {}
    for name in ("userId", "movieId"):
        ids = ratings[name].to_numpy()
        train_ids, valid_ids, cardinalities[name] = categorify(ids[train_rows], ids[valid_rows])
        columns[name] = (train_ids, valid_ids)
    label = (ratings["rating"].to_numpy() > 3).astype(np.float32)
    columns["label"] = (label[train_rows], label[valid_rows])
    genre_names: list[str] = []
    if with_genres:
        genre_names = sorted({g for names in genres.values() for g in names})
        movies = ratings["movieId"].to_numpy()
        for genre in genre_names:
            liked = np.array([m for m, names in genres.items() if genre in names], dtype=np.int64)
            flag = np.isin(movies, liked).astype(np.float32)
            columns[genre_column(genre)] = (flag[train_rows], flag[valid_rows])
        ids = {name: i for i, name in enumerate(genre_names)}
        lists = {m: [ids[g] for g in names] for m, names in genres.items()}
        per_row = [lists.get(int(m), []) for m in movies]
        columns["genres"] = (
            [per_row[i] for i in train_rows],  # type: ignore[assignment]
            [per_row[i] for i in valid_rows],  # type: ignore[assignment]
        )
    out.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", 0), ("valid", 1)):
        table = pa.table(
            {
                name: pa.array(pair[part], pa.list_(pa.int64())) if name == "genres" else pair[part]
                for name, pair in columns.items()
            }
        )
        pq.write_table(table, out / f"{split}.parquet", row_group_size=ROW_GROUP_SIZE)
    meta = {
        "source": source,
        "split": how,
        "valid_fraction": valid_fraction,
        "seed": seed,
        "rows": {"train": len(train_rows), "valid": len(valid_rows)},
        "cardinalities": cardinalities,
        "genres": [genre_column(g) for g in genre_names],
        "genre_names": genre_names,
        "label": "rating > 3",
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("zip", type=Path, help="an official MovieLens zip (ml-100k.zip, ...)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--split", choices=["random", "time"], default="random")
    parser.add_argument("--valid-fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0, help="seed of the random split")
    parser.add_argument("--genres", action="store_true", help="add multi-hot genre columns")
    args = parser.parse_args(argv)
    if not 0 < args.valid_fraction < 1:
        parser.error(f"--valid-fraction must be in (0, 1), got {args.valid_fraction}")
    if not args.zip.is_file():
        parser.error(
            f"{args.zip} does not exist: download ml-100k.zip (or another release) from "
            "https://grouplens.org/datasets/movielens/"
        )
    ratings, genres = read_zip(args.zip)
    source = str(args.zip)
    meta = prepare(
        ratings,
        genres,
        args.out,
        with_genres=args.genres,
        how=args.split,
        valid_fraction=args.valid_fraction,
        seed=args.seed,
        source=source,
    )
    rows = meta["rows"]
    print(
        f"wrote {rows['train']} training and {rows['valid']} validation ratings to {args.out} "
        f"({meta['cardinalities']['userId'] - 1} users, "
        f"{meta['cardinalities']['movieId'] - 1} movies, {len(meta['genres'])} genre columns)"
    )
    return meta


if __name__ == "__main__":
    main(sys.argv[1:])
