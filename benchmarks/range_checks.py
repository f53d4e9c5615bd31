"""What checking narrowed values as they are read costs on the CPU: the same epoch with
the check and with it turned off, same run.

Writes a Criteo-like table stored wider than it is delivered (26 int64 ids delivered as
int32, 13 float64 values delivered as float32, a float32 label), so that every column's
cast could lose something and is checked by its smallest and largest value as it is
read. Times shuffled epochs in one process, alternating the check as the loader runs it
and the check replaced by nothing, and reports wall and CPU seconds (fastest and
median). Run::

    python benchmarks/range_checks.py --rows 2000000 --rounds 5
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import tabloader
import tabloader.decode.host as host

CATS = [f"C{i}" for i in range(26)]
CONTS = [f"I{i}" for i in range(13)]


def write(directory: Path, rows: int, files: int = 4) -> None:
    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    share = rows // files
    for i in range(files):
        columns: dict[str, Any] = {c: rng.integers(0, 1_000_000, share) for c in CATS}
        columns.update({c: rng.random(share) for c in CONTS})  # float64, delivered float32
        columns["label"] = rng.random(share).astype(np.float32)
        pq.write_table(pa.table(columns), directory / f"part-{i}.parquet", row_group_size=131_072)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def epoch(loader: tabloader.Loader) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), cpu_seconds()
    for _ in loader:
        pass
    return time.perf_counter() - wall, cpu_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    checked = host.check_block
    with tempfile.TemporaryDirectory() as directory:
        data = Path(directory) / "data"
        write(data, args.rows)
        loader = tabloader.Loader(
            str(data), cats=CATS, conts=CONTS, labels=["label"], batch_size=65_536,
            shuffle=True, seed=0, cat_dtype="int32", device="cpu",
        )  # fmt: skip
        epoch(loader)  # warm: page cache, pools
        times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for _ in range(args.rounds):
            for check in (True, False):
                host.check_block = checked if check else (lambda *args, **kwargs: None)
                times[check].append(epoch(loader))
        host.check_block = checked
    print(f"{args.rows:,} rows, {args.rounds} rounds, 40 columns of which 39 checked")
    print(f"{'':16} {'wall fastest':>12} {'median':>8} {'cpu fastest':>12} {'median':>8}")
    for check, label in ((True, "checked"), (False, "check off")):
        walls, cpus = zip(*times[check], strict=True)
        print(
            f"{label:16} {min(walls):12.3f} {statistics.median(walls):8.3f} "
            f"{min(cpus):12.3f} {statistics.median(cpus):8.3f}"
        )
    on, off = (statistics.median(c for _, c in times[k]) for k in (True, False))
    print(f"cpu seconds, checked / off (medians): {on / off:.3f}")


if __name__ == "__main__":
    main()
