"""The GPU backend as contract adapters: the core loader, TorchAsyncItr and the Keras loader
on a CUDA device, given explicitly (``"cuda"``) and chosen by default (``device=None``).

Batches are copied to the host only here, to check them: the core loader's arrays must
be cupy arrays, the torch tensors must sit where DLPack puts the loader's memory, and the
Keras tensors must hold the same values. These adapters run on a real GPU where cudf
imports, and on the emulated device (``tests/emulated_gpu``) everywhere else.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import contract_tensorflow
import contract_torch
import tabloader
from contract import Adapter, Batch


@contextmanager
def _default_device(device: str | None) -> Iterator[None]:
    """``device=None`` must pick the GPU by itself: unset the suite's CPU default."""
    saved = os.environ.pop("TABLOADER_DEVICE", None)
    try:
        if device is not None:
            os.environ["TABLOADER_DEVICE"] = "cpu" if saved is None else saved
        yield
    finally:
        if saved is not None:
            os.environ["TABLOADER_DEVICE"] = saved


def _core_of(loader: Any) -> tabloader.Loader:
    """The core loader behind an adapter (a DLDataLoader's dataset's, a Keras loader's)."""
    if isinstance(loader, tabloader.Loader):
        return loader
    inner = getattr(loader, "loader", None)
    if inner is None:  # DLDataLoader -> TorchAsyncItr
        inner = loader.dataset.loader
    assert isinstance(inner, tabloader.Loader)
    return inner


def _on_gpu(make: Callable[..., Any], device: str | None) -> Callable[..., Any]:
    def make_on_gpu(source: Any, **options: Any) -> Any:
        with _default_device(device):
            loader = make(source, device=device, **options)
        assert _core_of(loader).device.is_cuda, _core_of(loader).device
        return loader

    return make_on_gpu


def _core(source: Any, **options: Any) -> tabloader.Loader:
    return tabloader.Loader(source, **options)


def _stacked(source: Any, **options: Any) -> tabloader.Loader:
    return tabloader.Loader(source, layout="stacked", **options)


def _torch(source: Any, **options: Any) -> Any:
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    dataset = TorchAsyncItr(source, **options)
    return DLDataLoader(dataset, batch_size=None, collate_fn=lambda batch: batch)


def _to_host(array: Any) -> np.ndarray:
    import cupy

    assert isinstance(array, cupy.ndarray), type(array)
    return cupy.asnumpy(array)


def _columns_epoch(loader: tabloader.Loader) -> list[Batch]:
    return [{k: _to_host(v) for k, v in batch.items()} for batch in loader]


def _stacked_epoch(loader: tabloader.Loader) -> list[Batch]:
    out = []
    for batch in loader:
        flat: Batch = {}
        for kind, names in (
            ("cats", loader.cats),
            ("conts", loader.conts),
            ("labels", loader.labels),
        ):
            block = _to_host(batch[kind])
            for j, name in enumerate(names):
                flat[name] = block[:, j]
        out.append(flat)
    return out


def dlpack_torch_device() -> Any:
    """Where ``torch.from_dlpack`` puts cupy memory: the GPU, or the host when emulated."""
    import cupy
    import torch

    return torch.from_dlpack(cupy.zeros(1)).device


def _torch_epoch(loader: Any) -> list[Batch]:
    expected = dlpack_torch_device()
    batches = []
    for x_cat, x_cont, y in loader:
        assert {x_cat.device, x_cont.device, y.device} == {expected}
        batches.extend(
            contract_torch.tensors_to_batches(
                [(x_cat.cpu(), x_cont.cpu(), y.cpu())], loader.dataset
            )
        )
    return batches


_GPU = (pytest.mark.gpu,)
ADAPTERS = [
    Adapter("gpu", _on_gpu(_core, "cuda"), _columns_epoch, marks=_GPU),
    Adapter("gpu-default-device", _on_gpu(_core, None), _columns_epoch, marks=_GPU),
    Adapter("gpu-stacked", _on_gpu(_stacked, "cuda"), _stacked_epoch, marks=_GPU),
    Adapter("gpu-torch", _on_gpu(_torch, "cuda"), _torch_epoch, marks=(*_GPU, pytest.mark.torch)),
    Adapter(
        "gpu-torch-default-device",
        _on_gpu(_torch, None),
        _torch_epoch,
        marks=(*_GPU, pytest.mark.torch),
    ),
    Adapter(
        "gpu-keras",
        _on_gpu(contract_tensorflow.make, "cuda"),
        contract_tensorflow.ordered_epoch,
        marks=(*_GPU, pytest.mark.keras),
        dtypes=contract_tensorflow.dtypes,
    ),
    Adapter(
        "gpu-keras-default-device",
        _on_gpu(contract_tensorflow.make, None),
        contract_tensorflow.fit_order_epoch,
        marks=(*_GPU, pytest.mark.keras),
        dtypes=contract_tensorflow.dtypes,
    ),
]
