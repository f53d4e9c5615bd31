"""The core cases: the parquet decode limit, the memory-copy ceiling, the core Loader in
each of its modes, and the in-memory pandas baseline (CPU only).

- limit: pyarrow decoding the same row groups and columns straight to numpy, one row
  group at a time (measured faster than whole-file reads), with nothing else to do. No
  streaming loader does less work; every ratio in the report is to this.
- ceiling: ``numpy.copyto`` of the decoded arrays into arrays of the same size, the data
  loaded untimed first: the memory bandwidth a cached epoch could reach at most.
- tabloader: ``Loader`` shuffled (rows in random order), not shuffled, shuffled with
  each batch's rows in stored order (``shuffle_within_batch=False``), and shuffled and
  not in the ``"stacked"`` ``[B, k]`` layout the framework adapters use.
- baseline: what many users write: the files loaded with pandas (untimed), then a
  permutation and one fancy-indexing gather per batch every epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

try:
    from common import Case, Context
except ImportError:  # imported as part of a package
    from benchmarks.common import Case, Context


def decode_limit(ctx: Context) -> Case:
    def make() -> Callable[[], int]:
        import pyarrow.parquet as pq

        columns = ctx.columns

        def run() -> int:
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

        return run

    return Case("pyarrow decode to numpy (the limit)", make, group="limit")


def _decoded(ctx: Context) -> dict[str, np.ndarray]:
    """The whole dataset decoded into one array per column (file by file, to keep the
    peak memory near the size of the result)."""
    import pyarrow.parquet as pq

    columns = ctx.columns
    arrays = {
        name: np.empty(ctx.rows, np.int64 if name in ctx.cats else np.float32) for name in columns
    }
    offset = 0
    for path in ctx.files:
        table = pq.read_table(path, columns=columns)
        for name in columns:
            arrays[name][offset : offset + table.num_rows] = table.column(name).to_numpy()
        offset += table.num_rows
    return {name: array[:offset] for name, array in arrays.items()}


def copy_ceiling(ctx: Context) -> Case:
    def make() -> Callable[[], int]:
        arrays = _decoded(ctx)
        targets = {name: np.empty_like(a) for name, a in arrays.items()}

        def run() -> int:
            for name, array in arrays.items():
                np.copyto(targets[name], array)
            return len(next(iter(arrays.values())))

        return run

    return Case(
        "numpy.copyto of the decoded arrays (copy ceiling)",
        make,
        group="ceiling",
        note="data decoded untimed first and held in memory",
        every_size=False,  # a memory bandwidth, whatever the size
    )


def loader_cases(ctx: Context) -> list[Case]:
    def loader(**options: Any) -> Callable[[], Callable[[], int]]:
        def make() -> Callable[[], int]:
            import tabloader

            built = tabloader.Loader(
                ctx.files,
                **ctx.loader_options,
                seed=0,
                device=ctx.device,
                **options,
            )

            def run() -> int:
                rows = 0
                for batch in built:
                    rows += int(next(iter(batch.values())).shape[0])
                return rows

            return run

        return make

    return [
        Case("Loader, shuffle", loader(shuffle=True)),
        Case("Loader, no shuffle", loader(shuffle=False)),
        Case(
            "Loader, shuffle, stored order within batches",
            loader(shuffle=True, shuffle_within_batch=False),
        ),
        Case("Loader, shuffle, stacked [B, k]", loader(shuffle=True, layout="stacked")),
        Case("Loader, no shuffle, stacked [B, k]", loader(shuffle=False, layout="stacked")),
    ]


def in_memory_baseline(ctx: Context) -> Case:
    def make() -> Callable[[], int]:
        import pandas as pd

        columns = ctx.columns
        frames = [pd.read_parquet(p, columns=columns) for p in ctx.files]
        arrays = {
            name: np.concatenate([f[name].to_numpy() for f in frames]).astype(
                np.int64 if name in ctx.cats else np.float32, copy=False
            )
            for name in columns
        }
        del frames
        rng = np.random.default_rng(0)

        def run() -> int:
            n = len(arrays[columns[0]])
            order = rng.permutation(n)
            rows = 0
            for start in range(0, n, ctx.batch_size):
                index = order[start : start + ctx.batch_size]
                batch = {name: array[index] for name, array in arrays.items()}
                rows += len(batch[columns[0]])
            return rows

        return run

    return Case(
        "in-memory pandas + permute-and-slice",
        make,
        group="baseline",
        note="load untimed (setup); holds the whole dataset in memory",
    )


def cases(ctx: Context) -> list[Case]:
    if ctx.device != "cpu":  # the GPU's cases are cases_gpu.py's
        return []
    return [decode_limit(ctx), copy_ceiling(ctx), *loader_cases(ctx), in_memory_baseline(ctx)]
