"""What the Keras adapter does only when Keras runs on TensorFlow: GPU memory, and batches
handed to Keras' train step as they are, on the device.

Imported by `tabloader.keras` when Keras' backend is TensorFlow; it imports
TensorFlow, so nothing else imports it.

GPU memory
    TensorFlow takes nearly all of a GPU's memory when it first uses it, leaving none
    for a GPU-backed loader. `apply_memory_allocation` caps it at
    ``TF_MEMORY_ALLOCATION`` (NVTabular's variable) or, when that is unset, turns on
    memory growth, so TensorFlow takes what it uses and no more.

Batches on the device
    Keras hands a ``PyDataset`` to TensorFlow through ``tf.data.Dataset.from_generator``,
    whose ``numpy_function`` turns every tensor into a numpy array: a batch on the GPU
    would go to the host and back each step. Keras' TensorFlow trainer also takes a
    plain iterable (its train function runs one step per item it yields), so a loader of
    this package is handed over as that, `DeviceBatches`, and each batch reaches
    the train step as the tensors the loader made. This needs two small hooks into
    Keras (`device_batches_installed`): the data adapter of a ``PyDataset`` and
    TensorFlow's epoch iterator, which knows the distribution strategy. Under a
    strategy of several replicas, which splits batches itself, ``tf.data`` is used as
    before.
"""

from __future__ import annotations

import contextvars
import os
import warnings
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from tabloader.memory import gpu_total_mb, memory_limit_mb

__all__ = ["DeviceBatches", "apply_memory_allocation", "device_batches_installed"]

MEMORY_ENV = "TF_MEMORY_ALLOCATION"

_OUTSIDE = object()  # not inside TensorFlow's epoch iterator
_STRATEGY: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "tabloader_keras_strategy", default=_OUTSIDE
)
_installed = False


def apply_memory_allocation(value: str | None = None) -> bool:
    """Set how much of each GPU TensorFlow takes, before it first uses one.

    ``value`` (default ``$TF_MEMORY_ALLOCATION``) caps it: below 1 a fraction of each
    GPU's total memory (``"0.5"``), else megabytes (``"8192"``). Unset, memory growth
    is turned on instead (unless the GPU was configured already, or
    ``TF_FORCE_GPU_ALLOW_GROWTH`` is set): TensorFlow then takes memory as it needs it.
    Importing `tabloader.keras` calls this. TensorFlow accepts either only before
    it initialises its GPUs; afterwards a ``RuntimeWarning`` says so. Returns whether a
    setting was applied.
    """
    value = os.environ.get(MEMORY_ENV) if value is None else value
    capped = value is not None and bool(value.strip())
    gpus = tf.config.list_physical_devices("GPU")
    if capped and not gpus:
        memory_limit_mb(str(value), total_mb=1.0)  # still reject malformed values
    if not gpus or (not capped and os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")):
        return False
    try:
        for index, gpu in enumerate(gpus):
            if capped:
                limit = memory_limit_mb(str(value), total_mb=gpu_total_mb(index))
                tf.config.set_logical_device_configuration(
                    gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit)]
                )
            elif not tf.config.get_logical_device_configuration(gpu):
                tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError as err:
        setting = f"{MEMORY_ENV}={value!r}" if capped else "memory growth (the default)"
        warnings.warn(
            f"{setting} was not applied: TensorFlow has already initialised its GPUs "
            f"({err}), and may hold most of their memory, leaving the loader too little. "
            f"Import tabloader.keras (or set {MEMORY_ENV}) before TensorFlow first uses a GPU",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return True


class DeviceBatches:
    """A ``PyDataset``'s batches as Keras' ``PyDatasetAdapter`` standardises them (class
    weights included), handed to TensorFlow's trainer as a plain iterable: one epoch
    per ``iter()``, each batch as the loader made it."""

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter

    def __iter__(self) -> Iterator[Any]:
        iterator: Iterator[Any] = self.adapter._get_iterator()
        return iterator


def _single_replica(strategy: Any) -> bool:
    """Whether ``strategy`` runs one replica on the default device (no distribution)."""
    return type(strategy).__name__ == "_DefaultDistributionStrategy"


def device_batches_installed() -> bool:
    """Whether Keras hands this package's loaders to TensorFlow as they are (see the module).

    Installs the hooks on first call; False if this Keras lacks the internals they hook
    (batches then go through ``tf.data``, with a copy through the host on a GPU).
    """
    global _installed
    if _installed:
        return True
    try:
        from keras.src.backend.tensorflow.trainer import TFEpochIterator
        from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

        original_dataset = PyDatasetAdapter.get_tf_dataset
        original_init = TFEpochIterator.__init__
        PyDatasetAdapter._get_iterator  # noqa: B018  (checked to exist)
    except (ImportError, AttributeError):
        return False

    def get_tf_dataset(self: Any) -> Any:
        strategy = _STRATEGY.get()
        own = getattr(self.py_dataset, "_device_batches", False)
        # (an empty loader goes the usual way, for Keras' own "PyDataset has length 0")
        if own and self.py_dataset.num_batches and _single_replica(strategy):
            return DeviceBatches(self)
        return original_dataset(self)

    def epoch_iterator_init(self: Any, distribute_strategy: Any = None, *a: Any, **k: Any) -> None:
        token = _STRATEGY.set(distribute_strategy)
        try:
            original_init(self, distribute_strategy, *a, **k)
        finally:
            _STRATEGY.reset(token)

    PyDatasetAdapter.get_tf_dataset = get_tf_dataset
    TFEpochIterator.__init__ = epoch_iterator_init
    _installed = True
    return True
