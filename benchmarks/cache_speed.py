"""How fast cached epochs are, next to the parquet decode limit and the memory-copy ceiling.

    python benchmarks/cache_speed.py                          # 4M synthetic Criteo-like rows
    python benchmarks/cache_speed.py --rows 1000000 --cache memory --json out.json

Every method runs in a fresh process (``--one NAME`` runs one), so none inherits
another's warm memory pools, and that process also times the decode limit just before
and just after the method: on a shared machine the noise then hits both alike, and
each ratio is taken against its own process's limit. The whole set runs ``--rounds``
times; the report gives the median ratio of each figure over the rounds.

- ``decode``: pyarrow decoding every row group of the files to numpy (the limit of any
  loader that reads parquet each epoch);
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
    if loader.cache is not None:
        loader.cache.wait()  # files written in the background, before they are removed
    return times


def run_one(name: str, args: argparse.Namespace, files: list[str]) -> dict[str, list[float]]:
    """Seconds per pass of the decode limit (before and after) and of method ``name``."""
    before = measure_decode(files, 2)
    method = run_method(name, args, files)
    return {"decode": before + measure_decode(files, 2), "method": method}


def run_method(name: str, args: argparse.Namespace, files: list[str]) -> list[float]:
    if name == "copy":
        return measure_copy(files, args.passes)
    if name == "stream, shuffle":
        return measure_loader(files, args.batch_size, 2, True)
    shuffle = name.partition(", ")[2]
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


def in_fresh_process(name: str, argv: list[str]) -> dict[str, list[float]]:
    result = subprocess.run(
        [sys.executable, __file__, *argv, "--one", name],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--row-group-size", type=int, default=131_072)
    parser.add_argument("--batch-size", type=int, default=65_536)
    parser.add_argument("--passes", type=int, default=3, help="timed passes per method")
    parser.add_argument("--rounds", type=int, default=3, help="times the whole set runs")
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
    names = ["copy", "stream, shuffle"] + [f"cache, {s}" for s in SHUFFLES]
    runs: list[dict[str, dict[str, list[float]]]] = []
    for r in range(args.rounds):
        runs.append({})
        for name in names:
            print(f"  round {r + 1}/{args.rounds}: {name} ...", flush=True)
            runs[-1][name] = in_fresh_process(name, child_argv)
    load_after = os.getloadavg()

    rows = args.rows
    # Per round: each figure's rows/s over its own process's decode rows/s.
    figures: dict[str, list[float]] = {}
    limits: list[float] = []

    def add(label: str, decode_seconds: list[float], seconds: float) -> None:
        figures.setdefault(label, []).append(statistics.median(decode_seconds) / seconds)

    for run in runs:
        for name, measured in run.items():
            decode, method = measured["decode"], measured["method"]
            limits.append(rows / statistics.median(decode))
            if name == "copy":
                add("numpy.copyto (the ceiling)", decode, statistics.median(method))
            elif name == "stream, shuffle":
                add("stream, shuffle: epoch 0", decode, method[0])
                add("stream, shuffle: epoch 1", decode, method[1])
            else:
                add(f"{name}: epoch 0 (writes)", decode, method[0])
                add(f"{name}: epochs 1+", decode, statistics.median(method[1:]))
                figures.setdefault(f"{name}: epoch 0 / streaming epoch 0", []).append(
                    method[0] / run["stream, shuffle"]["method"][0]
                )
    goals = {f"{name}: epochs 1+": f">= {goal}" for name, goal in GOALS.items()}
    goals.update({f"cache, {s}: epoch 0 / streaming epoch 0": "<= 1.3" for s in SHUFFLES})
    lines = [
        f"{'figure (x the decode limit, or a ratio)':48} {'median':>7}  {'rounds':18} goal",
        f"{'pyarrow decode (the limit), rows/s':48} {statistics.median(limits):7,.0f}",
    ]
    for label, values in figures.items():
        each = " ".join(f"{v:.2f}" for v in values)
        lines.append(
            f"{label:48} {statistics.median(values):7.2f}  {each:18} {goals.get(label, '')}"
        )
    report: dict[str, object] = {
        "rows": rows,
        "batch_size": args.batch_size,
        "cache": args.cache,
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "decode_rows_per_second": limits,
        "figures": figures,
        "runs": runs,
    }
    print(f"{rows:,} rows, batch {args.batch_size:,}, cache={args.cache}, {os.cpu_count()} CPUs")
    print("\n".join(lines))
    print(f"load average (1, 5, 15 min) before {load_before}, after {load_after}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
