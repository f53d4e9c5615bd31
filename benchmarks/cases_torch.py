"""Benchmark cases for the PyTorch adapter (collected by ``throughput.py``).

- ``TorchAsyncItr`` through ``DLDataLoader``, shuffled and not: what a training loop
  receives, ``(x_cat, x_cont, y)`` tensors, compared in the report with the core
  ``Loader`` to show the adapter's overhead.
- The textbook PyTorch input pipeline as the baseline: a map-style ``Dataset`` over the
  data loaded with pandas, whose ``__getitem__`` returns one row's tensors, batched by
  ``DataLoader(batch_size=..., shuffle=True)`` with 0 and 2 worker processes. It is so
  slow that it stops after ``BASELINE_ROWS`` rows and reports the rows it delivered.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np

try:
    from common import Case, Context
except ImportError:  # imported as part of a package
    from benchmarks.common import Case, Context

BASELINE_ROWS = 200_000
"""Rows after which a per-row baseline pass stops."""


def _identity(batch: Any) -> Any:
    return batch


def adapter_pass(ctx: Context, **options: Any) -> tuple[Any, Callable[[], int]]:
    """``TorchAsyncItr`` over the files through ``DLDataLoader``, as a training loop uses
    it, with ``options``: its core ``Loader`` (for its stats) and one pass, which returns
    the rows it delivered."""
    import tabloader
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    dataset = TorchAsyncItr(
        tabloader.Dataset(ctx.files),
        **ctx.loader_options,
        seed=0,
        device=ctx.device,
        backend="gpu" if ctx.device != "cpu" else "cpu",
        **options,
    )
    batches = DLDataLoader(dataset, batch_size=None, collate_fn=_identity, num_workers=0)

    def run() -> int:
        return sum(len(y) for _, _, y in batches)

    return dataset.loader, run


def adapter_cases(ctx: Context) -> list[Case]:
    def make(shuffle: bool) -> Callable[[], Callable[[], int]]:
        return lambda: adapter_pass(ctx, shuffle=shuffle)[1]

    return [
        Case("TorchAsyncItr + DLDataLoader, shuffle", make(True)),
        Case("TorchAsyncItr + DLDataLoader, no shuffle", make(False)),
    ]


class RowDataset:
    """The textbook map-style dataset: all rows in memory, one row's tensors per index.

    (``DataLoader`` treats any object with ``__len__`` and ``__getitem__`` as a map-style
    dataset; subclassing ``torch.utils.data.Dataset`` would change nothing.)
    """

    def __init__(self, ctx: Context) -> None:
        import pandas as pd

        frame = pd.concat(
            [pd.read_parquet(p, columns=ctx.columns) for p in ctx.files],
            ignore_index=True,
        )
        self.cats = frame[ctx.cats].to_numpy(dtype=np.int64, copy=True)
        self.conts = frame[ctx.conts].to_numpy(dtype=np.float32, copy=True)
        self.labels = frame[ctx.labels[0]].to_numpy(dtype=np.float32, copy=True)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> Any:
        import torch

        return (
            torch.from_numpy(self.cats[i]),
            torch.from_numpy(self.conts[i]),
            torch.tensor(self.labels[i]),
        )


def baseline_cases(ctx: Context) -> list[Case]:
    def make(workers: int) -> Callable[[], Callable[[], int]]:
        def build() -> Callable[[], int]:
            import torch.utils.data

            rows_dataset = RowDataset(ctx)

            def run() -> int:
                loader = torch.utils.data.DataLoader(
                    rows_dataset, batch_size=ctx.batch_size, shuffle=True, num_workers=workers
                )
                rows = 0
                for _, _, y in loader:
                    rows += len(y)
                    if rows >= BASELINE_ROWS:
                        break
                return rows

            return run

        return build

    note = f"stops after {BASELINE_ROWS:,} rows; load untimed (setup); holds the dataset"
    return [
        Case(
            f"per-row torch Dataset + DataLoader, {w} workers",
            make(w),
            group="baseline",
            note=note,
            every_size=False,
        )
        for w in (0, 2)
    ]


def cases(ctx: Context) -> list[Case]:
    """The PyTorch cases on the CPU, or none when PyTorch is not installed (the GPU's
    are cases_gpu.py's)."""
    if importlib.util.find_spec("torch") is None or ctx.device != "cpu":
        return []
    return [*adapter_cases(ctx), *baseline_cases(ctx)]
