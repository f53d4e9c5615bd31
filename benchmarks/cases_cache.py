"""Benchmark cases for the decoded cache (collected like ``cases_torch.py``).

- ``Loader(cache="disk")`` with ``shuffle`` False, True and ``"global"``: the cache is
  written by an untimed first epoch in ``setup``; every timed pass is a cached epoch,
  which reads nothing but the cache.
- The memory-copy ceiling: ``numpy.copyto`` of the same decoded columns into arrays of
  the same shape, the most a loader reading decoded rows from memory could do.

The cache epochs' goals are 2x (no shuffle), 1.5x (shuffle) and 0.7x (global shuffle)
the parquet decode limit; ``cache_speed.py`` measures them, with the cache-writing
first epoch, in fresh processes. Caches are written to a temporary directory removed
when the process exits.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from common import Case, Context


def _cached_loader(ctx: Context, directory: str, shuffle: Any) -> Any:
    import tabloader

    return tabloader.Loader(
        ctx.files,
        cats=ctx.cats,
        conts=ctx.conts,
        labels=ctx.labels,
        batch_size=ctx.batch_size,
        shuffle=shuffle,
        seed=0,
        device="cpu",
        cache="disk",
        cache_dir=directory,
    )


def _epoch(loader: Any) -> int:
    rows = 0
    for batch in loader:
        rows += len(next(iter(batch.values())))
    return rows


def cache_cases(ctx: Context) -> list[Case]:
    directory = tempfile.mkdtemp(prefix="tabloader-cache-bench-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)

    def make(shuffle: Any) -> tuple[Callable[[], int], Callable[[], None]]:
        loaders: list[Any] = []

        def setup() -> None:
            if not loaders:
                loaders.append(_cached_loader(ctx, directory, shuffle))
                _epoch(loaders[0])  # writes the cache

        def run() -> int:
            setup()
            rows = _epoch(loaders[0])
            if not loaders[0].stats().from_cache:
                raise RuntimeError("a cached epoch was not served from the cache")
            return rows

        return run, setup

    found = []
    for label, shuffle in (("no shuffle", False), ("shuffle", True), ("global shuffle", "global")):
        run, setup = make(shuffle)
        found.append(
            Case(
                f"tabloader Loader, disk cache, {label}",
                run,
                note="epochs after the first (the first writes the cache)",
                setup=setup,
            )
        )
    return found


def copy_ceiling(ctx: Context) -> Case:
    columns = ctx.cats + ctx.conts + ctx.labels
    pairs: list[tuple[np.ndarray, np.ndarray]] = []

    def setup() -> None:
        if pairs:
            return
        for path in ctx.files:
            handle = pq.ParquetFile(path)
            for g in range(handle.num_row_groups):
                table = handle.read_row_group(g, columns=columns)
                for c in columns:
                    source = table.column(c).chunk(0).to_numpy()
                    pairs.append((source, np.empty_like(source)))

    def run() -> int:
        setup()
        for source, target in pairs:
            np.copyto(target, source)
        return ctx.rows

    return Case(
        "numpy.copyto of the decoded columns (the cache's ceiling)",
        run,
        group="baseline",
        note="holds the decoded dataset in memory",
        setup=setup,
    )


def cases(ctx: Context) -> list[Case]:
    """The cache cases (CPU only: the GPU backend does not use the cache)."""
    if ctx.device != "cpu":
        return []
    return [*cache_cases(ctx), copy_ceiling(ctx)]
