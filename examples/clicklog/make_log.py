"""Write two days of a raw click log as CSV, the way a web service exports them.

    python examples/clicklog/make_log.py data/raw --rows 200000

Each day is ``day1.csv``, ``day2.csv`` in the directory given, with a header and:

- ``user_id`` (``u1234``: a few heavy users, many who come once), ``item_id``
  (``item-00042``), ``country`` (two-letter codes, empty when unknown): text;
- ``price`` and ``dwell_sec``: numbers, empty when not recorded;
- ``event_time``: ``2024-03-01 18:04:31`` (UTC, no offset);
- ``click``: 0 or 1, more likely for some users, some items, in the evening, and for
  cheap items, so that a model has something to learn.

The second day has new users and items besides the first day's. The log is generated
(no real clicks are shipped here); ``--seed`` fixes it.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

COUNTRIES = ["fr", "de", "us", "br", "in", "jp"]


def write_day(path: Path, rows: int, *, day: int, seed: int) -> None:
    rng = np.random.default_rng([seed, day])
    users = rng.geometric(1 / 3_000, rows) + 1_000 * day  # some users new on each day
    items = rng.geometric(1 / 500, rows) + 100 * day
    start = dt.datetime(2024, 3, day, tzinfo=dt.timezone.utc).timestamp()
    seconds = start + rng.integers(0, 86_400, rows)
    hours = (seconds // 3_600) % 24
    price = np.round(rng.lognormal(2.5, 0.8, rows), 2)
    user_taste = np.sin(users * 12.9898) * 1.5  # a fixed bias per user
    item_appeal = np.cos(items * 78.233) * 1.5  # and per item
    logit = -1.0 + user_taste + item_appeal + 0.8 * (hours >= 18) - 0.05 * price
    click = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    country = rng.integers(0, len(COUNTRIES) + 1, rows)
    table = pa.table(
        {
            "user_id": [f"u{u}" for u in users],
            "item_id": [f"item-{i:05d}" for i in items],
            "country": pa.array(
                [COUNTRIES[c] if c < len(COUNTRIES) else None for c in country], pa.string()
            ),
            "price": pa.array(price, mask=rng.random(rows) < 0.05),
            "dwell_sec": pa.array(
                np.round(rng.exponential(30, rows), 1), mask=rng.random(rows) < 0.2
            ),
            "event_time": [
                dt.datetime.fromtimestamp(s, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
                for s in seconds
            ],
            "click": click,
        }
    )
    pacsv.write_csv(table, path, pacsv.WriteOptions(quoting_style="none"))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory to write day1.csv and day2.csv to")
    parser.add_argument("--rows", type=int, default=200_000, help="rows per day")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for day in (1, 2):
        write_day(args.out / f"day{day}.csv", args.rows, day=day, seed=args.seed)
    print(f"wrote {args.rows:,} rows a day to {args.out}/day1.csv and day2.csv")


if __name__ == "__main__":
    main()
