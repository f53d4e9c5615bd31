"""GPU benchmark cases: the GPU loader against cudf's own decode of the same row groups.

``cases(ctx)`` returns nothing unless the benchmark runs with ``--device cuda`` and the
GPU backend can run here (cudf and cupy import, a GPU is visible). Otherwise:

- limit: ``cudf.read_parquet`` of every row group of every file, with the loader's
  columns, straight into GPU memory: no loader does less work.
- tabloader: the GPU loader, shuffled and in order; its batches are complete cupy arrays
  when they are handed over, so the timing includes all device work.
- baseline: the CPU loader feeding PyTorch the usual way, pinned host batches copied with
  ``Tensor.to("cuda", non_blocking=True)`` (needs PyTorch built with CUDA).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np

import tabloader

try:
    from common import Case, Context
except ImportError:  # imported as part of a package
    from benchmarks.common import Case, Context


def cases(ctx: Context) -> list[Case]:
    if ctx.device != "cuda":
        return []
    from tabloader.backends.gpu import gpu_usable

    if not gpu_usable():
        return []
    options: dict[str, Any] = {**ctx.loader_options, "seed": 0}

    def decode() -> Callable[[], int]:
        from tabloader.backends.gpu import import_gpu

        cudf, cupy, device = import_gpu()
        columns = ctx.columns

        def run() -> int:
            rows = 0
            with cupy.cuda.Device(device) as current:
                for path in ctx.files:
                    frame = cudf.read_parquet([path], columns=columns, use_pandas_metadata=False)
                    rows += len(frame)
                    del frame
                current.synchronize()
            return rows

        return run

    def gpu_loader(shuffle: bool) -> Callable[[], Callable[[], int]]:
        def make() -> Callable[[], int]:
            from tabloader.backends.gpu import import_gpu

            device = import_gpu()[2]
            loader = tabloader.Loader(ctx.files, shuffle=shuffle, device=device, **options)
            return _epoch(loader)

        return make

    found = [Case("cudf.read_parquet (same row groups, same columns)", decode, group="limit")]
    found.extend(
        Case(
            f"Loader(device='cuda') ({'shuffle' if shuffle else 'no shuffle'})",
            gpu_loader(shuffle),
            note="cupy batches, complete when handed over",
        )
        for shuffle in (True, False)
    )
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            found.append(_pinned_torch_case(ctx, options))
    return found


def _epoch(loader: tabloader.Loader) -> Callable[[], int]:
    def run() -> int:
        rows = 0
        for batch in loader:
            rows += int(next(iter(batch.values())).shape[0])
        return rows

    return run


def _pinned_torch_case(ctx: Context, options: dict[str, Any]) -> Case:
    def make() -> Callable[[], int]:
        import torch

        from tabloader.backends.gpu import import_gpu

        target = torch.device("cuda", import_gpu()[2])

        def pin(batch: dict[str, np.ndarray]) -> dict[str, Any]:  # in the loader's thread
            return {
                k: torch.from_numpy(np.ascontiguousarray(v)).pin_memory() for k, v in batch.items()
            }

        loader = tabloader.Loader(
            ctx.files, shuffle=True, device="cpu", layout="stacked", transform=pin, **options
        )

        def run() -> int:
            rows = 0
            for batch in loader:
                moved = {k: t.to(target, non_blocking=True) for k, t in batch.items()}
                rows += int(next(iter(moved.values())).shape[0])
            torch.cuda.synchronize(target)
            return rows

        return run

    return Case(
        "CPU Loader + pinned torch .to('cuda', non_blocking=True) (shuffle)",
        make,
        group="baseline",
    )
