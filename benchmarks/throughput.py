"""Rows per second of tabloader next to the parquet decode limit and the usual alternatives.

    python benchmarks/throughput.py                  # 4M synthetic Criteo-like rows
    python benchmarks/throughput.py --rows 1000000 --rounds 5 --json results.json
    python benchmarks/throughput.py --device cuda    # GPU backend (needs cudf/cupy)

The data (label, I1..I13 float32, C1..C26 int64 with Zipf-like ids; see
``tabloader.synthetic``) is written once under ``benchmarks/data/``. Every case makes one
full pass and is timed; all cases run in turn, for several rounds, so that the noise of a
shared machine hits them alike. Within a round, each loader makes an untimed pass just
before its timed one, as in training, where a loader runs epoch after epoch. The report
gives each case's median rows/s and its median ratio to the *limit* measured in the
same round: pyarrow decoding the same row groups and columns straight to numpy, with
nothing else to do. Finally the peak memory of a shuffled
epoch is measured, in fresh processes, for two dataset sizes 4x apart: it is bounded by the
loader's chunk buffer, not by the dataset.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tabloader
from common import Case, Context
from tabloader.synthetic import CATS, CONTS, LABELS, write_criteo_like

HERE = Path(__file__).resolve().parent
CASE_MODULES = ("cases_torch", "cases_tensorflow", "cases_gpu")


def dataset(rows: int, files: int, row_group_size: int, root: Path) -> list[str]:
    directory = root / f"criteo-like-{rows}-{files}-{row_group_size}"
    done = directory / "_SUCCESS"
    if not done.exists():
        print(f"writing {rows:,} synthetic rows to {directory} ...", flush=True)
        write_criteo_like(directory, rows=rows, files=files, row_group_size=row_group_size)
        done.write_text("")
    return sorted(str(p) for p in directory.glob("*.parquet"))


def decode_limit(ctx: Context) -> Case:
    columns = ctx.cats + ctx.conts + ctx.labels

    def run() -> int:
        # One row group per call: measured faster here than whole-file reads, so the
        # strongest form of the limit.
        rows = 0
        for path in ctx.files:
            handle = pq.ParquetFile(path)
            for group in range(handle.num_row_groups):
                table = handle.read_row_group(group, columns=columns, use_threads=True)
                for column in table.columns:
                    for chunk in column.chunks:
                        chunk.to_numpy()
                rows += table.num_rows
        return rows

    return Case("pyarrow decode to numpy (the limit)", run, group="limit")


def loader_cases(ctx: Context) -> list[Case]:
    def make(**options: object) -> Callable[[], int]:
        loader = tabloader.Loader(
            ctx.files,
            cats=ctx.cats,
            conts=ctx.conts,
            labels=ctx.labels,
            batch_size=ctx.batch_size,
            seed=0,
            device=ctx.device,
            **options,  # type: ignore[arg-type]
        )

        def run() -> int:
            rows = 0
            for batch in loader:
                rows += len(next(iter(batch.values())))
            return rows

        return run

    return [
        Case("tabloader Loader, no shuffle", make(shuffle=False)),
        Case("tabloader Loader, shuffle", make(shuffle=True)),
        Case(
            "tabloader Loader, shuffle, stored order within batches",
            make(shuffle=True, shuffle_within_batch=False),
        ),
        Case(
            "tabloader Loader, shuffle, stacked [B, k] blocks",
            make(shuffle=True, layout="stacked"),
        ),
    ]


def in_memory_baseline(ctx: Context) -> Case:
    """What many users write: load everything with pandas, permute, slice per epoch."""
    columns = ctx.cats + ctx.conts + ctx.labels
    arrays: dict[str, np.ndarray] = {}
    load_seconds: list[float] = []

    def setup() -> None:
        import pandas as pd

        started = time.perf_counter()
        frame = pd.concat([pd.read_parquet(p, columns=columns) for p in ctx.files])
        for name in columns:
            dtype = np.int64 if name in ctx.cats else np.float32
            arrays[name] = frame[name].to_numpy(dtype=dtype)
        load_seconds.append(time.perf_counter() - started)

    def run() -> int:
        rng = np.random.default_rng()
        n = len(arrays[columns[0]])
        order = rng.permutation(n)
        rows = 0
        for start in range(0, n, ctx.batch_size):
            index = order[start : start + ctx.batch_size]
            batch = {name: array[index] for name, array in arrays.items()}
            rows += len(batch[columns[0]])
        return rows

    return Case(
        "in-memory pandas + permute-and-slice (load excluded)",
        run,
        group="baseline",
        note="holds the whole dataset in memory",
        setup=setup,
    )


def collect_cases(ctx: Context, modules: tuple[str, ...] = CASE_MODULES) -> list[Case]:
    cases: list[Case] = []
    extra: list[Case] = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise
            continue
        extra.extend(module.cases(ctx))
    device_limits = [c for c in extra if c.group == "limit"]
    cases.append(device_limits[0] if ctx.device != "cpu" and device_limits else decode_limit(ctx))
    cases.extend(loader_cases(ctx))
    cases.extend(c for c in extra if c.group != "limit")
    if ctx.device == "cpu":
        cases.append(in_memory_baseline(ctx))
    return cases


def run_rounds(cases: list[Case], rounds: int) -> dict[str, list[float]]:
    for case in cases:
        if case.setup is not None:
            case.setup()
    for case in cases:  # warm-up pass: page cache, memory pools, lazy imports
        case.run()
    rates: dict[str, list[float]] = {c.name: [] for c in cases}
    for r in range(rounds):
        for case in cases:
            if case.group != "baseline":
                # Training runs a loader epoch after epoch. The first pass after other
                # cases ran pays for refilling the memory pools they drained, so each
                # round times a loader's second consecutive pass (the per-row baselines
                # are Python-bound and gain nothing from it).
                case.run()
            started = time.perf_counter()
            rows = case.run()
            rates[case.name].append(rows / (time.perf_counter() - started))
        print(f"  round {r + 1}/{rounds} done", flush=True)
    return rates


def peak_rss_child(files: list[str], batch_size: int) -> None:
    """Run in a fresh process: one shuffled epoch; print baseline and peak RSS in bytes."""
    import psutil

    loader = tabloader.Loader(
        files,
        cats=CATS,
        conts=CONTS,
        labels=LABELS,
        batch_size=batch_size,
        shuffle=True,
        seed=0,
        device="cpu",
    )
    baseline = psutil.Process().memory_info().rss
    for _ in loader:
        pass
    print(json.dumps({"baseline": baseline, "peak": _peak_rss()}))


def _peak_rss() -> int:
    """This process's peak resident memory in bytes.

    Linux's VmHWM belongs to the process image and starts afresh at exec; ru_maxrss
    would also count the parent's memory at the moment it forked this process.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure_rss(files: list[str], batch_size: int) -> dict[str, int]:
    output = subprocess.run(
        [sys.executable, __file__, "--rss-child", *files, "--batch-size", str(batch_size)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--row-group-size", type=int, default=131_072)
    parser.add_argument("--batch-size", type=int, default=65_536)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--data", type=Path, default=HERE / "data")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--no-rss", action="store_true", help="skip the memory measurement")
    parser.add_argument(
        "--core-only",
        action="store_true",
        help="only the limit, the core Loader and the in-memory baseline (no frameworks)",
    )
    parser.add_argument("--rss-child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        peak_rss_child(args.rss_child, args.batch_size)
        return {}

    files = dataset(args.rows, args.files, args.row_group_size, args.data)
    ctx = Context(files, CATS, CONTS, LABELS, args.batch_size, args.rows, args.device)
    cases = collect_cases(ctx, () if args.core_only else CASE_MODULES)
    print(
        f"{args.rows:,} rows x {len(CATS) + len(CONTS) + len(LABELS)} columns in {len(files)} "
        f"files, row groups of {args.row_group_size:,}, batch {args.batch_size:,}; "
        f"{len(cases)} cases x {args.rounds} rounds",
        flush=True,
    )
    rates = run_rounds(cases, args.rounds)
    limit = cases[0].name
    results = []
    for case in cases:
        ratios = [r / lim for r, lim in zip(rates[case.name], rates[limit], strict=True)]
        results.append(
            {
                "name": case.name,
                "group": case.group,
                "note": case.note,
                "rows_per_second": statistics.median(rates[case.name]),
                "ratio_to_limit": statistics.median(ratios),
                "ratios": ratios,
            }
        )
    width = max(len(r["name"]) for r in results)  # type: ignore[arg-type]
    print(f"\n{'case':<{width}}  {'rows/s':>12}  {'x limit':>8}")
    for r in results:
        print(f"{r['name']:<{width}}  {r['rows_per_second']:>12,.0f}  {r['ratio_to_limit']:>8.3f}")

    memory = {}
    if not args.no_rss and args.device == "cpu":
        small_rows = max(args.rows // 4, args.files)
        small = dataset(small_rows, args.files, args.row_group_size, args.data)
        for label, paths, rows in (("small", small, small_rows), ("large", files, args.rows)):
            rss = measure_rss(paths, args.batch_size)
            memory[label] = {"rows": rows, **rss}
        grown = {k: (v["peak"] - v["baseline"]) / 2**20 for k, v in memory.items()}
        print(
            f"\npeak RSS above baseline, shuffled epoch: {grown['small']:,.0f} MiB for "
            f"{small_rows:,} rows, {grown['large']:,.0f} MiB for {args.rows:,} rows "
            f"({grown['large'] / max(grown['small'], 1):.2f}x for 4x the data)"
        )

    report = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "device": args.device,
        },
        "config": {k: v for k, v in vars(args).items() if k not in ("data", "json", "rss_child")},
        "results": results,
        "memory": memory,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
