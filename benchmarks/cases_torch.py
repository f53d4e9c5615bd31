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

from collections.abc import Callable
from typing import Any

import numpy as np

from common import Case, Context

BASELINE_ROWS = 200_000
"""Rows after which a per-row baseline pass stops."""


def _identity(batch: Any) -> Any:
    return batch


def adapter_cases(ctx: Context) -> list[Case]:
    import tabloader
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    def make(shuffle: bool) -> Callable[[], int]:
        dataset = TorchAsyncItr(
            tabloader.Dataset(ctx.files),
            cats=ctx.cats,
            conts=ctx.conts,
            labels=ctx.labels,
            batch_size=ctx.batch_size,
            shuffle=shuffle,
            seed=0,
            device=ctx.device,
            backend="gpu" if ctx.device != "cpu" else "cpu",
        )
        loader = DLDataLoader(dataset, batch_size=None, collate_fn=_identity, num_workers=0)

        def run() -> int:
            rows = 0
            for _, _, y in loader:
                rows += len(y)
            return rows

        return run

    return [
        Case("TorchAsyncItr + DLDataLoader, no shuffle", make(False)),
        Case("TorchAsyncItr + DLDataLoader, shuffle", make(True)),
    ]


class RowDataset:
    """The textbook map-style dataset: all rows in memory, one row's tensors per index.

    (``DataLoader`` treats any object with ``__len__`` and ``__getitem__`` as a map-style
    dataset; subclassing ``torch.utils.data.Dataset`` would change nothing.)
    """

    def __init__(self, ctx: Context) -> None:
        import pandas as pd

        frame = pd.concat(
            [pd.read_parquet(p, columns=ctx.cats + ctx.conts + ctx.labels) for p in ctx.files],
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
    import torch.utils.data

    loaded: list[RowDataset] = []

    def setup() -> None:
        if not loaded:
            loaded.append(RowDataset(ctx))

    def make(workers: int) -> Callable[[], int]:
        def run() -> int:
            setup()
            loader = torch.utils.data.DataLoader(
                loaded[0], batch_size=ctx.batch_size, shuffle=True, num_workers=workers
            )
            rows = 0
            for _, _, y in loader:
                rows += len(y)
                if rows >= BASELINE_ROWS:
                    break
            return rows

        return run

    note = f"stops after {BASELINE_ROWS:,} rows; load excluded; holds the dataset in memory"
    return [
        Case(
            f"per-row torch Dataset + DataLoader, {w} workers",
            make(w),
            group="baseline",
            note=note,
            setup=setup,
        )
        for w in (0, 2)
    ]


def cases(ctx: Context) -> list[Case]:
    """The PyTorch cases, or none when PyTorch is not installed."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return []
    found = adapter_cases(ctx)
    if ctx.device == "cpu":
        found.extend(baseline_cases(ctx))
    return found
