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

from typing import Any

import numpy as np

import tabloader
from common import Case, Context


def cases(ctx: Context) -> list[Case]:
    if ctx.device != "cuda":
        return []
    from tabloader.backends.gpu import gpu_usable, import_gpu

    if not gpu_usable():
        return []
    cudf, cupy, device = import_gpu()
    dataset = tabloader.Dataset(ctx.files)
    columns = [*ctx.cats, *ctx.conts, *ctx.labels]
    options: dict[str, Any] = {
        "cats": ctx.cats,
        "conts": ctx.conts,
        "labels": ctx.labels,
        "batch_size": ctx.batch_size,
        "seed": 0,
    }

    def decode() -> int:
        rows = 0
        with cupy.cuda.Device(device):
            for path in dataset.files:
                frame = cudf.read_parquet([path], columns=columns, use_pandas_metadata=False)
                rows += len(frame)
                del frame
            cupy.cuda.runtime.deviceSynchronize()
        return rows

    found = [Case("cudf.read_parquet (same row groups, same columns)", decode, group="limit")]
    for shuffle in (True, False):
        loader = tabloader.Loader(dataset, shuffle=shuffle, device=device, **options)
        found.append(
            Case(
                f"Loader(device='cuda:{device}') ({'shuffle' if shuffle else 'no shuffle'})",
                _epoch(loader),
                note="cupy batches, complete when handed over",
                setup=_first_batch(loader),
            )
        )
    baseline = _pinned_torch_case(dataset, options, device)
    if baseline is not None:
        found.append(baseline)
    return found


def _epoch(loader: tabloader.Loader) -> Any:
    def run() -> int:
        rows = 0
        for batch in loader:
            rows += int(next(iter(batch.values())).shape[0])
        return rows

    return run


def _first_batch(loader: tabloader.Loader) -> Any:
    def setup() -> None:  # CUDA context, cudf and cupy kernels warmed before timing
        with loader.iter_epoch(0) as batches:
            next(batches)

    return setup


def _pinned_torch_case(
    dataset: tabloader.Dataset, options: dict[str, Any], device: int
) -> Case | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    target = torch.device("cuda", device)

    def pin(batch: dict[str, np.ndarray]) -> dict[str, Any]:  # in the loader's thread
        return {k: torch.from_numpy(np.ascontiguousarray(v)).pin_memory() for k, v in batch.items()}

    loader = tabloader.Loader(
        dataset, shuffle=True, device="cpu", layout="stacked", transform=pin, **options
    )

    def run() -> int:
        rows = 0
        for batch in loader:
            moved = {k: t.to(target, non_blocking=True) for k, t in batch.items()}
            rows += int(next(iter(moved.values())).shape[0])
        torch.cuda.synchronize(target)
        return rows

    return Case(
        "CPU Loader + pinned torch .to('cuda', non_blocking=True) (shuffle)",
        run,
        group="baseline",
        setup=_first_batch(loader),
    )
