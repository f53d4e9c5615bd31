"""How fast cached epochs are, next to the parquet decode limit and the memory-copy ceiling.

    python benchmarks/cache_speed.py                          # 4M synthetic Criteo-like rows
    python benchmarks/cache_speed.py --rows 1000000 --cache memory --json out.json

Every measurement runs in a fresh process (``--one NAME`` runs one), so none inherits
another's warm memory pools:

- ``decode``: pyarrow decoding every row group of the files to numpy (the limit of any
  loader that reads parquet each epoch); measured before and after the loaders, the
  ratios use the median of its passes;
- ``copy``: ``numpy.copyto`` of the same decoded columns into arrays of the same shape
  (the ceiling for a loader that reads decoded rows from memory);
- ``stream, shuffle``: ``Loader(shuffle=True)`` without a cache, its first epoch (the
  reference for the cache-writing epoch) and a later one;
- ``cache <mode>, <shuffle>``: ``Loader(cache=...)`` with ``shuffle`` False, True and
  ``"global"``: epoch 0 (decodes the files and writes the cache) and epochs 1..3 (read
  the cache only; their median is the figure).

A pass iterates over every batch and counts its rows, as a training loop that only
asks for batches would. The machine's load average is reported with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
GOALS = {"cache, no shuffle": 2.0, "cache, shuffle": 1.5, "cache, global shuffle": 0.7}
"""Cached epochs' goals, as multiples of the decode limit's rows/s."""
SHUFFLES = {"no shuffle": False, "shuffle": True, "global shuffle": "global"}


def dataset(rows: int, files: int, row_group_size: int, root: Path) -> list[str]:
    from tabloader.synthetic import write_criteo_like

    directory = root / f"criteo-like-{rows}-{files}-{row_group_size}"
    if not (directory / "_SUCCESS").exists():
        print(f"writing {rows:,} synthetic rows to {directory} ...", flush=True)
        write_criteo_like(directory, rows=rows, files=files, row_group_size=row_group_size)
        (directory / "_SUCCESS").write_text("")
    return sorted(str(p) for p in directory.glob("*.parquet"))


def _columns() -> list[str]:
    from tabloader.synthetic import CATS, CONTS, LABELS

    return CATS + CONTS + LABELS


def _decode(files: list[str]) -> list[dict[str, np.ndarray]]:
    columns = _columns()
    groups = []
    for path in files:
        handle = pq.ParquetFile(path)
        for g in range(handle.num_row_groups):
            table = handle.read_row_group(g, columns=columns, use_threads=True)
            groups.append({c: table.column(c).chunk(0).to_numpy() for c in columns})
    return groups


def measure_decode(files: list[str], passes: int) -> list[float]:
    """Seconds per pass of pyarrow decoding every row group to numpy."""
    times = []
    for _ in range(passes):
        started = time.perf_counter()
        _decode(files)
        times.append(time.perf_counter() - started)
    return times


def measure_copy(files: list[str], passes: int) -> list[float]:
    """Seconds per pass of copying the decoded columns into same-shaped arrays."""
    groups = _decode(files)
    targets = [{c: np.empty_like(a) for c, a in g.items()} for g in groups]
    for g, t in zip(groups, targets, strict=True):  # fault the targets' pages in
        for c in g:
            np.copyto(t[c], g[c])
    times = []
    for _ in range(passes):
        started = time.perf_counter()
        for g, t in zip(groups, targets, strict=True):
            for c in g:
                np.copyto(t[c], g[c])
        times.append(time.perf_counter() - started)
    return times


def measure_loader(
    files: list[str], batch_size: int, epochs: int, shuffle: object, **options: object
) -> list[float]:
    """Seconds per epoch of a fresh loader, epoch 0 first."""
    import tabloader
    from tabloader.synthetic import CATS, CONTS, LABELS

    loader = tabloader.Loader(
        files,
        cats=CATS,
        conts=CONTS,
        labels=LABELS,
        batch_size=batch_size,
        shuffle=shuffle,  # type: ignore[arg-type]
        seed=0,
        device="cpu",
        **options,  # type: ignore[arg-type]
    )
    times = []
    for epoch in range(epochs):
        started = time.perf_counter()
        rows = 0
        for batch in loader:
            rows += len(next(iter(batch.values())))
        times.append(time.perf_counter() - started)
        if options.get("cache") and epoch > 0:
            assert loader.stats().from_cache, "a later epoch was not served from the cache"
        assert rows == len(loader.dataset) or loader.drop_last
    return times


def run_one(name: str, args: argparse.Namespace, files: list[str]) -> list[float]:
    if name == "decode":
        return measure_decode(files, args.passes)
    if name == "copy":
        return measure_copy(files, args.passes)
    if name == "stream, shuffle":
        return measure_loader(files, args.batch_size, 2, True)
    kind, _, shuffle = name.partition(", ")
    cache_dir = tempfile.mkdtemp(prefix="tabloader-cache-bench-", dir=args.cache_dir)
    try:
        return measure_loader(
            files,
            args.batch_size,
            1 + args.passes,
            SHUFFLES[shuffle],
            cache=args.cache,
            cache_dir=cache_dir,
        )
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def in_fresh_process(name: str, argv: list[str]) -> list[float]:
    result = subprocess.run(
        [sys.executable, __file__, *argv, "--one", name],
        check=True,
        capture_output=True,
        text=True,
    )
    return list(json.loads(result.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--row-group-size", type=int, default=131_072)
    parser.add_argument("--batch-size", type=int, default=65_536)
    parser.add_argument("--passes", type=int, default=3, help="timed passes per method")
    parser.add_argument("--cache", choices=["disk", "memory"], default="disk")
    parser.add_argument("--cache-dir", default=None, help="where the disk caches are written")
    parser.add_argument("--data", type=Path, default=HERE / "data")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    files = dataset(args.rows, args.files, args.row_group_size, args.data)
    if args.one is not None:
        print(json.dumps(run_one(args.one, args, files)))
        return {}

    child_argv = list(argv if argv is not None else sys.argv[1:])
    load_before = os.getloadavg()
    names = ["decode", "copy", "stream, shuffle"] + [f"cache, {s}" for s in SHUFFLES] + ["decode"]
    seconds: dict[str, list[float]] = {}
    for name in names:
        print(f"  {name} ...", flush=True)
        seconds.setdefault(name, []).extend(in_fresh_process(name, child_argv))
    load_after = os.getloadavg()

    rows = args.rows
    decode = rows / statistics.median(seconds["decode"])
    report: dict[str, object] = {
        "rows": rows,
        "batch_size": args.batch_size,
        "cache": args.cache,
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "decode_rows_per_second": decode,
        "seconds": seconds,
    }
    lines = [f"{'method':34} {'rows/s':>12} {'x decode':>9}  goal"]

    def line(label: str, secs: float, goal: str = "") -> float:
        ratio = rows / secs / decode
        lines.append(f"{label:34} {rows / secs:12,.0f} {ratio:9.2f}  {goal}")
        return ratio

    ratios: dict[str, float] = {}
    ratios["decode"] = line("pyarrow decode (the limit)", statistics.median(seconds["decode"]))
    ratios["copy"] = line("numpy.copyto (the ceiling)", statistics.median(seconds["copy"]))
    stream = seconds["stream, shuffle"]
    ratios["stream first"] = line("stream, shuffle: epoch 0", stream[0])
    ratios["stream later"] = line("stream, shuffle: epoch 1", stream[1])
    for name in (f"cache, {s}" for s in SHUFFLES):
        first, later = seconds[name][0], statistics.median(seconds[name][1:])
        ratios[f"{name} first"] = line(
            f"{name}: epoch 0 (writes)",
            first,
            f"{first / stream[0]:.2f}x streaming epoch 0 (goal <= 1.3)",
        )
        ratios[f"{name} later"] = line(
            f"{name}: epochs 1+", later, f">= {GOALS[name]}"
        )
    report["ratios"] = ratios
    print(f"{rows:,} rows, batch {args.batch_size:,}, cache={args.cache}, {os.cpu_count()} CPUs")
    print("\n".join(lines))
    print(f"load average before {load_before}, after {load_after}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
