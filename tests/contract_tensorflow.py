"""The Keras adapter in the contract suite, on whichever backend Keras runs (TensorFlow in
the main session; JAX and PyTorch in the sessions of ``test_keras_backends.py``): epochs
are run the way Keras runs them.

Two adapters: ``keras`` asks for the batch indices in order (as ``evaluate`` and
``predict`` do), ``keras-fit-order`` in a random order per epoch (as ``fit`` does by
default). Both call ``on_epoch_begin`` / ``__getitem__`` / ``on_epoch_end`` and turn the
backend's tensors back into per-column numpy arrays. Keras' look at the first two
batches before ``fit`` starts is exercised in ``test_keras.py``. `make_loader` is the
loader ``test_keras.py`` and ``test_tensorflow.py`` build.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from contract import EXPECTED_DTYPES, Adapter, Batch

_RENAMED = {
    "cats": "cat_names",
    "conts": "cont_names",
    "labels": "label_names",
    "chunk_rows": "buffer_size",
}


CATS, CONTS, LABELS = ["id", "cat"], ["x"], ["label"]
"""The columns the Keras tests load (of ``conftest.make_table``'s rows)."""


def make_loader(paths: Any, **options: Any) -> Any:
    """The loader the Keras tests build: `CATS`, `CONTS` and `LABELS` in batches of 32,
    shuffled with seed 5, under NVTabular's keywords; ``options`` add to them or replace
    them."""
    from tabloader.keras import KerasSequenceLoader

    kwargs = {
        "batch_size": 32,
        "cat_names": CATS,
        "cont_names": CONTS,
        "label_names": LABELS,
        "shuffle": True,
        "seed": 5,
    }
    kwargs.update(options)
    return KerasSequenceLoader(paths, **kwargs)


def make(source: Any, **options: Any) -> Any:
    from tabloader.keras import KerasSequenceLoader

    return KerasSequenceLoader(source, **{_RENAMED.get(k, k): v for k, v in options.items()})


def _host(tensor: Any) -> np.ndarray:
    import keras

    return np.asarray(keras.ops.convert_to_numpy(tensor))


def _as_numpy(item: Any) -> Batch:
    features, labels = item
    batch = {name: _host(tensor) for name, tensor in features.items()}
    if isinstance(labels, dict):
        batch.update({name: _host(tensor) for name, tensor in labels.items()})
    else:
        batch["label"] = _host(labels)
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


def dtypes() -> dict[str, Any]:
    """What the backend gets: ids as int32 on JAX in its default 32-bit mode."""
    from tabloader.keras import _TENSORS

    ids = _TENSORS.dtypes()["cat"].type
    return {**EXPECTED_DTYPES, "id": ids, "cat": ids}


ADAPTERS = [
    Adapter("keras", make, ordered_epoch, marks=(pytest.mark.keras,), dtypes=dtypes),
    Adapter("keras-fit-order", make, fit_order_epoch, marks=(pytest.mark.keras,), dtypes=dtypes),
]
