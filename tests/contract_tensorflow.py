"""The Keras adapter in the contract suite: epochs are run the way Keras runs them.

Two adapters: ``keras`` asks for the batch indices in order (as ``evaluate`` and
``predict`` do), ``keras-fit-order`` in a random order per epoch (as ``fit`` does by
default). Both call ``on_epoch_begin`` / ``__getitem__`` / ``on_epoch_end`` and turn the
tensors back into per-column numpy arrays. Keras' look at the first two batches before
``fit`` starts is exercised in ``test_tensorflow.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from contract import Adapter, Batch

_RENAMED = {
    "cats": "cat_names",
    "conts": "cont_names",
    "labels": "label_names",
    "chunk_rows": "buffer_size",
}


def make(source: Any, **options: Any) -> Any:
    from tabloader.tensorflow import KerasSequenceLoader

    return KerasSequenceLoader(source, **{_RENAMED.get(k, k): v for k, v in options.items()})


def _as_numpy(item: Any) -> Batch:
    features, labels = item
    batch = {name: tensor.numpy() for name, tensor in features.items()}
    if isinstance(labels, dict):
        batch.update({name: tensor.numpy() for name, tensor in labels.items()})
    else:
        batch["label"] = labels.numpy()
    return batch


def _epoch(loader: Any, order: np.ndarray | None = None) -> list[Batch]:
    loader.on_epoch_begin()
    indices = range(len(loader)) if order is None else order.tolist()
    batches = [_as_numpy(loader[i]) for i in indices]
    loader.on_epoch_end()
    return batches


def ordered_epoch(loader: Any) -> list[Batch]:
    return _epoch(loader)


def fit_order_epoch(loader: Any) -> list[Batch]:
    # fit() asks for the indices in a random order; batches still come in stream order.
    order = np.random.default_rng(loader.epoch).permutation(len(loader))
    return _epoch(loader, order)


ADAPTERS = [
    Adapter("keras", make, ordered_epoch, marks=(pytest.mark.tensorflow,)),
    Adapter("keras-fit-order", make, fit_order_epoch, marks=(pytest.mark.tensorflow,)),
]
