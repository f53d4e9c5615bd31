"""GPU benchmark cases: the GPU loader against cudf's own decode of the same row groups.

``cases(ctx)`` returns nothing unless the benchmark runs with ``--device cuda`` and the
GPU backend can run here (``ctx.gpu``, decided once by the parent). Otherwise:

- limit: ``cudf.read_parquet`` of every file, with the loader's columns, straight into
  GPU memory: no loader does less work.
- tabloader: the GPU ``Loader``, shuffled and in order, in the ``"columns"`` and the
  ``"stacked"`` ``[B, k]`` layouts; ``TorchAsyncItr(device="cuda")`` through
  ``DLDataLoader`` (and, at the smallest size, iterated directly), whose tensors are the
  stacked layout's, so the derived figures compare it with the stacked ``Loader``. Every
  epoch ends with the device synchronised, so its time includes all the work queued.
- baselines, at the smallest size: a hand-written loop (``handloop_gpu.py``: cudf, a
  cupy permutation, slices); the CPU loader feeding PyTorch the usual way (pinned host
  batches copied with ``Tensor.to("cuda", non_blocking=True)``); the path users take
  without cudf (``TorchAsyncItr(device="cuda", backend="cpu")``, the CPU backend staging
  each batch through pinned memory); the CPU ``Loader`` on all the host's cores, next to
  the reference it is compared with, pyarrow decoding the same files on all cores.

The cached GPU epochs are in ``cases_gpu_cache.py``, the training step in
``cases_training.py``, the goals in ``gpu_goals.py``.

On the emulated device (``ctx.gpu == "emulated"``, in CI) the cases run through the same
code with tiny data; PyTorch has no GPU there, so the cases that hand tensors to
PyTorch's GPU use its CPU instead. Nothing measured there is a GPU figure.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

try:
    from common import Case, Context, loader_facts
except ImportError:  # imported as part of a package
    from benchmarks.common import Case, Context, loader_facts

LIMIT = "cudf.read_parquet (same row groups, same columns)"
HANDLOOP = "hand-written cudf + cupy loop (shuffle)"
PINNED = "CPU Loader + pinned torch .to('cuda', non_blocking=True) (shuffle)"
CPU_REFERENCE = "pyarrow read_table to numpy, all cores (the CPU reference)"
CPU_TORCH = "TorchAsyncItr(device='cuda', backend='cpu') + DLDataLoader (shuffle)"
TORCH_DIRECT = "TorchAsyncItr(device='cuda'), no DataLoader (shuffle)"


def _mode(shuffle: bool) -> str:
    return "shuffle" if shuffle else "no shuffle"


def loader_name(shuffle: bool, stacked: bool = False) -> str:
    """The GPU ``Loader`` case's name (the columns layout's is the name earlier runs used)."""
    return f"Loader(device='cuda') ({_mode(shuffle)}{', stacked [B, k]' if stacked else ''})"


def torch_name(shuffle: bool) -> str:
    return f"TorchAsyncItr(device='cuda') + DLDataLoader ({_mode(shuffle)})"


def cpu_loader_name(shuffle: bool) -> str:
    return f"Loader(device='cpu') ({_mode(shuffle)})"


def cases(ctx: Context) -> list[Case]:
    if ctx.device != "cuda" or not ctx.gpu:
        return []
    found = [decode_limit(ctx), *loader_cases(ctx)]
    has_torch = importlib.util.find_spec("torch") is not None
    if has_torch:
        found += torch_adapter_cases(ctx)
    found.append(Case(HANDLOOP, _handloop(ctx), group="baseline", note="handloop_gpu.py"))
    found += host_cases(ctx, has_torch)
    return found


# -- helpers shared by the GPU case modules --------------------------------------------------


def gpu_index() -> int:
    """The GPU the cases run on (the current device), importing cudf and cupy."""
    from tabloader.backends.gpu import import_gpu

    return import_gpu()[2]


def synchronize(device: int) -> None:
    """Wait for everything queued on ``device``: an epoch's time includes all its work."""
    import cupy

    with cupy.cuda.Device(device) as current:
        current.synchronize()


def counted(loader: Any, device: int | None) -> Callable[[], int]:
    """One pass over a core ``Loader``: rows delivered; the device synchronised at the
    end, and the loader's counters recorded after every epoch."""

    def run() -> int:
        rows = 0
        for batch in loader:
            rows += int(next(iter(batch.values())).shape[0])
        if device is not None:
            synchronize(device)
        loader_facts(loader)
        return rows

    return run


def torch_device(ctx: Context) -> str:
    """Where the torch cases put tensors: the current CUDA device; on the emulated device
    (PyTorch without a GPU) the CPU, so that the case's code still runs in CI."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    if ctx.gpu == "emulated":
        return "cpu"
    raise RuntimeError(
        "this case needs PyTorch built with CUDA (torch.cuda.is_available() is False here)"
    )


def torch_pass(loader: Any, batches: Iterable[Any], target: str) -> Callable[[], int]:
    """One pass over ``(x_cat, x_cont, y)`` batches (``TorchAsyncItr``'s); the device
    synchronised at the end, the core loader's counters recorded."""
    import torch

    def run() -> int:
        rows = sum(len(y) for _, _, y in batches)
        if target.startswith("cuda"):
            torch.cuda.synchronize(target)
        loader_facts(loader)
        return rows

    return run


# -- the cases ------------------------------------------------------------------------------


def decode_limit(ctx: Context) -> Case:
    def make() -> Callable[[], int]:
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

    return Case(LIMIT, make, group="limit")


def loader_cases(ctx: Context) -> list[Case]:
    def make(shuffle: bool, stacked: bool) -> Callable[[], Callable[[], int]]:
        def build() -> Callable[[], int]:
            import tabloader

            device = gpu_index()
            loader = tabloader.Loader(
                ctx.files,
                **ctx.loader_options,
                seed=0,
                shuffle=shuffle,
                device=device,
                layout="stacked" if stacked else "columns",
            )
            return counted(loader, device)

        return build

    return [
        Case(loader_name(shuffle, stacked), make(shuffle, stacked), note="cupy batches")
        for stacked in (False, True)
        for shuffle in (True, False)
    ]


def torch_adapter_cases(ctx: Context) -> list[Case]:
    def make(shuffle: bool, data_loader: bool) -> Callable[[], Callable[[], int]]:
        def build() -> Callable[[], int]:
            import tabloader
            from tabloader.torch import DLDataLoader, TorchAsyncItr

            target = torch_device(ctx)
            dataset = TorchAsyncItr(
                tabloader.Dataset(ctx.files),
                **ctx.loader_options,
                seed=0,
                shuffle=shuffle,
                device="cuda",
                backend="gpu",
            )
            batches: Iterable[Any] = dataset
            if data_loader:
                batches = DLDataLoader(dataset, batch_size=None, collate_fn=_same, num_workers=0)
            return torch_pass(dataset.loader, batches, target)

        return build

    return [
        Case(torch_name(True), make(True, True), note="torch tensors on the GPU"),
        Case(torch_name(False), make(False, True), note="torch tensors on the GPU"),
        Case(TORCH_DIRECT, make(True, False), every_size=False),
    ]


def _same(batch: Any) -> Any:
    return batch


def _handloop(ctx: Context) -> Callable[[], Callable[[], int]]:
    def make() -> Callable[[], int]:
        import handloop_gpu

        device = gpu_index()
        epochs = iter(range(1 << 30))

        def run() -> int:
            import cupy

            rows = 0
            with cupy.cuda.Device(device):
                for batch in handloop_gpu.epoch(
                    ctx.files, ctx.columns, ctx.batch_size, seed=0, epoch=next(epochs)
                ):
                    rows += int(batch[ctx.columns[0]].shape[0])
            synchronize(device)
            return rows

        return run

    return make


def host_cases(ctx: Context, has_torch: bool) -> list[Case]:
    """What runs on the GPU host's CPU, at the smallest size: the CPU reference, the CPU
    ``Loader`` on all cores, and (with PyTorch) the two ways host batches reach the GPU."""
    found = [
        Case(CPU_REFERENCE, _pyarrow_all_cores(ctx), group="reference", every_size=False),
        *(
            Case(cpu_loader_name(shuffle), _cpu_loader(ctx, shuffle), every_size=False)
            for shuffle in (True, False)
        ),
    ]
    if has_torch:
        found += [_pinned_torch_case(ctx), _cpu_backend_to_gpu(ctx)]
    return found


def _pyarrow_all_cores(ctx: Context) -> Callable[[], Callable[[], int]]:
    def make() -> Callable[[], int]:
        import pyarrow.parquet as pq

        def run() -> int:
            rows = 0
            for path in ctx.files:  # all row groups and columns of a file at once: all cores
                table = pq.read_table(path, columns=ctx.columns, use_threads=True)
                for column in table.columns:
                    for chunk in column.chunks:
                        chunk.to_numpy()
                rows += table.num_rows
            return rows

        return run

    return make


def _cpu_loader(ctx: Context, shuffle: bool) -> Callable[[], Callable[[], int]]:
    def make() -> Callable[[], int]:
        import tabloader

        loader = tabloader.Loader(
            ctx.files, **ctx.loader_options, seed=0, shuffle=shuffle, device="cpu"
        )
        return counted(loader, None)

    return make


def _pinned_torch_case(ctx: Context) -> Case:
    def make() -> Callable[[], int]:
        import torch

        import tabloader

        target = torch_device(ctx)
        pinning = target.startswith("cuda")

        def pin(batch: dict[str, np.ndarray]) -> dict[str, Any]:  # in the loader's thread
            return {
                k: torch.from_numpy(np.ascontiguousarray(v)).pin_memory()
                if pinning
                else torch.from_numpy(np.ascontiguousarray(v))
                for k, v in batch.items()
            }

        loader = tabloader.Loader(
            ctx.files,
            **ctx.loader_options,
            seed=0,
            shuffle=True,
            device="cpu",
            layout="stacked",
            transform=pin,
        )

        def run() -> int:
            rows = 0
            for batch in loader:
                moved = {k: t.to(target, non_blocking=True) for k, t in batch.items()}
                rows += int(next(iter(moved.values())).shape[0])
            if pinning:
                torch.cuda.synchronize(target)
            loader_facts(loader)
            return rows

        return run

    return Case(PINNED, make, group="baseline", every_size=False)


def _cpu_backend_to_gpu(ctx: Context) -> Case:
    def make() -> Callable[[], int]:
        import tabloader
        from tabloader.torch import DLDataLoader, TorchAsyncItr

        target = torch_device(ctx)
        dataset = TorchAsyncItr(
            tabloader.Dataset(ctx.files),
            **ctx.loader_options,
            seed=0,
            shuffle=True,
            device=target,
            backend="cpu",
        )
        batches = DLDataLoader(dataset, batch_size=None, collate_fn=_same, num_workers=0)
        return torch_pass(dataset.loader, batches, target)

    return Case(CPU_TORCH, make, note="CPU backend, pinned staging", every_size=False)
