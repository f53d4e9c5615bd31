"""List-column throughput: the CPU loader with a multi-hot column against pyarrow's decode.

Writes (once) ``--rows`` rows of synthetic Criteo-like data (``label``, ``I1..I13``,
``C1..C26``) plus ``genres``, a ``list<int64>`` column of 0 to 20 Zipf-distributed ids
per row, then times on the same files:

- limit: ``pyarrow.parquet.ParquetFile.read`` of every file with the loader's columns
  (decoding only: no loader does less work);
- tabloader: one epoch of ``Loader(..., sparse_names=["genres"])``, shuffled and in stored
  order, ragged (values + offsets) and padded (``sparse_as_dense``), and the same loader
  without the list column for reference.

Each figure is the best of ``--repeat`` runs, in rows per second, with the CPU seconds
the process spent (all threads; steadier than wall-clock time on a busy machine); the
JSON written to ``--out`` holds them and the ratios to the limit. Goal: the shuffled
ragged loader at least 0.3x pyarrow's decode.

    python benchmarks/lists_speed.py --rows 4000000 --out benchmarks/results/lists-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import tabloader
from tabloader.synthetic import CATS, CONTS, LABELS, criteo_like_table

MAX_LIST = 20


def genres(rows: int, seed: int) -> pa.Array:
    """0 to MAX_LIST ids per row, Zipf-distributed (a few ids very frequent)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, MAX_LIST + 1, rows)
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = (rng.zipf(1.3, int(offsets[-1])) - 1) % 100_000
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(np.int64)))


def write(directory: Path, rows: int, files: int, row_group_size: int) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"part-{f:03d}.parquet" for f in range(files)]
    if all(p.exists() for p in paths) and len(tabloader.Dataset([str(p) for p in paths])) == rows:
        return [str(p) for p in paths]
    per_file = -(-rows // files)
    for f, path in enumerate(paths):
        n = min(per_file, rows - f * per_file)
        table = criteo_like_table(n, seed=f).append_column("genres", genres(n, seed=100 + f))
        pq.write_table(table, path, row_group_size=row_group_size)
    return [str(p) for p in paths]


def best(run: Callable[[], int], repeat: int) -> tuple[float, float, int]:
    """Best wall-clock seconds, best CPU seconds (all threads of this process), rows."""
    times, cpu, rows = [], [], 0
    for _ in range(repeat):
        started, cpu_started = time.perf_counter(), time.process_time()
        rows = run()
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
    return min(times), min(cpu), rows


def epoch(loader: tabloader.Loader) -> Callable[[], int]:
    def run() -> int:
        rows = 0
        for batch in loader:
            rows += len(batch["label"])
        return rows

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--row-group-size", type=int, default=250_000)
    parser.add_argument("--batch-size", type=int, default=65_536)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dir", default="/tmp/tabloader-lists-bench")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    files = write(Path(args.dir), args.rows, args.files, args.row_group_size)
    columns = [*LABELS, *CONTS, *CATS, "genres"]

    def decode() -> int:
        rows = 0
        for path in files:
            rows += pq.ParquetFile(path).read(columns=columns).num_rows
        return rows

    common: dict[str, Any] = {
        "cats": CATS,
        "conts": CONTS,
        "labels": LABELS,
        "batch_size": args.batch_size,
        "seed": 0,
        "device": "cpu",
    }
    lists: dict[str, Any] = {**common, "cats": [*CATS, "genres"], "sparse_names": ["genres"]}
    dense = {**lists, "sparse_as_dense": True, "sparse_max": {"genres": MAX_LIST}}
    cases: list[tuple[str, Callable[[], int]]] = [
        ("pyarrow ParquetFile.read (same files, same columns)", decode),
        ("Loader + genres ragged (shuffle)", epoch(tabloader.Loader(files, **lists, shuffle=True))),
        ("Loader + genres ragged (no shuffle)", epoch(tabloader.Loader(files, **lists))),
        ("Loader + genres padded (shuffle)", epoch(tabloader.Loader(files, **dense, shuffle=True))),
        ("Loader without genres (shuffle)", epoch(tabloader.Loader(files, **common, shuffle=True))),
    ]
    results = []
    limit = None
    for name, run in cases:
        seconds, cpu_seconds, rows = best(run, args.repeat)
        rate = rows / seconds
        limit = limit or rate
        results.append(
            {
                "case": name,
                "rows": rows,
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "rows_per_s": rate,
                "vs_pyarrow": rate / limit,
            }
        )
        print(
            f"{name:55s} {rate / 1e6:8.2f} M rows/s  {rate / limit:5.2f}x pyarrow  "
            f"(CPU {cpu_seconds:.2f} s)",
            flush=True,
        )
    report = {
        "rows": args.rows,
        "files": args.files,
        "row_group_size": args.row_group_size,
        "batch_size": args.batch_size,
        "list_lengths": f"0..{MAX_LIST}, uniform; ids Zipf(1.3)",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "results": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
