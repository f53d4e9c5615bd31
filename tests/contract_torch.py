"""The contract suite through the PyTorch adapter: TorchAsyncItr inside DLDataLoader,
in the training process and split between two worker processes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from contract import Adapter, Batch


def _identity(batch: Any) -> Any:
    return batch


def _make(num_workers: int) -> Callable[..., Any]:
    def make(source: Any, **options: Any) -> Any:
        from tabloader.torch import DLDataLoader, TorchAsyncItr

        dataset = TorchAsyncItr(source, device="cpu", **options)
        return DLDataLoader(dataset, batch_size=None, collate_fn=_identity, num_workers=num_workers)

    return make


def tensors_to_batches(items: Any, dataset: Any) -> list[Batch]:
    """``(x_cat, x_cont, y)`` host tensors back to ``{column: 1-D numpy array}`` per batch."""
    batches = []
    for x_cat, x_cont, y in items:
        if y.ndim == 1:
            y = y[:, None]
        batch: Batch = {}
        for tensor, names in ((x_cat, dataset.cats), (x_cont, dataset.conts), (y, dataset.labels)):
            assert tensor.shape[1] == len(names)
            for j, name in enumerate(names):
                batch[name] = np.asarray(tensor[:, j].numpy())
        batches.append(batch)
    return batches


def _epoch(loader: Any) -> list[Batch]:
    """Run the loader's next epoch."""
    return tensors_to_batches(loader, loader.dataset)


ADAPTERS = [
    Adapter("torch", _make(0), _epoch, marks=(pytest.mark.torch,)),
    # Each worker reads a contiguous share; the DataLoader takes batches from the workers
    # in turn, so unshuffled batches are not in dataset order.
    Adapter("torch-2-workers", _make(2), _epoch, marks=(pytest.mark.torch,), ordered=False),
]
