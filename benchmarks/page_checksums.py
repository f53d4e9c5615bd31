"""What ``verify_checksums=True`` costs: streamed epochs with and without it, same run.

Writes a Criteo-like dataset (26 int64 ids, 13 float32 values, a label) with page
checksums (``write_page_checksum=True``; snappy, pyarrow's default), then times shuffled
epochs read from the files, alternating a dataset that verifies every page's CRC-32 and
one that does not, in the same process. Run::

    python benchmarks/page_checksums.py --rows 1000000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

import tabloader
from tabloader.synthetic import CATS, CONTS, criteo_like_table


def write(directory: Path, rows: int, files: int = 4) -> None:
    directory.mkdir(parents=True)
    share = rows // files
    for i in range(files):
        table = criteo_like_table(share, seed=i)
        pq.write_table(
            table, directory / f"part-{i}.parquet", row_group_size=131_072, write_page_checksum=True
        )


def epoch(data: str, verify: bool) -> float:
    dataset = tabloader.Dataset(data, verify_checksums=verify)
    loader = tabloader.Loader(
        dataset,
        cats=CATS,
        conts=CONTS,
        labels=["label"],
        batch_size=65536,
        shuffle=True,
        seed=0,
        device="cpu",
    )
    started = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        data = Path(directory) / "data"
        write(data, args.rows)
        epoch(str(data), True)  # warm: page cache, pools
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for verify in (False, True):
                times[verify].append(epoch(str(data), verify))
    print(f"{args.rows:,} rows, {args.rounds} rounds (seconds: fastest, median)")
    for verify, label in ((False, "without"), (True, "verify_checksums")):
        print(f"{label:18} {min(times[verify]):7.3f} {statistics.median(times[verify]):7.3f}")
    print(f"{'cost (fastest)':18} {min(times[True]) - min(times[False]):+7.3f}")


if __name__ == "__main__":
    main()
