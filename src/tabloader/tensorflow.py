"""Keras adapter: [`KerasSequenceLoader`][tabloader.tensorflow.KerasSequenceLoader], a
``keras.utils.PyDataset`` of ``tf.Tensor`` batches for ``model.fit``, ``evaluate`` and ``predict``,
built in the loader's background thread;
[`KerasSequenceValidater`][tabloader.tensorflow.KerasSequenceValidater], a callback adding ``val_*``
figures to each epoch.

Importing this module applies ``TF_MEMORY_ALLOCATION``
([`apply_memory_allocation`][tabloader.tensorflow.apply_memory_allocation]) and sets
``TF_CPP_MIN_LOG_LEVEL=2`` unless set (TensorFlow's informational C++ logs; ``0`` shows them).
``import tabloader`` alone never imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tabloader.backends.cpu import BufferPool, PooledNumpy
from tabloader.device import Device
from tabloader.epochs import check_seed_fn
from tabloader.errors import InvalidArgumentError
from tabloader.indexed import IndexedEpochs
from tabloader.loader import LOADER_KEYWORDS, Loader, LoaderOptions
from tabloader.memory import aligned_columns, chunk_rows_for_buffer, memory_limit_mb
from tabloader.memory import gpu_total_mb as _gpu_total_mb
from tabloader.options import keywords_of, reject_unknown

if TYPE_CHECKING:
    from typing_extensions import Unpack

# TensorFlow's C++ informational logs (CPU instruction sets, ...) tell a user of this
# module nothing they can act on: quiet by default, unless the user chose a level.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
try:
    import keras
    import tensorflow as tf
except ImportError:
    raise ImportError(
        "tabloader.tensorflow needs TensorFlow: pip install 'tabloader[tensorflow]'"
    ) from None

from tabloader.tensorflow_columns import feature_column_names

__all__ = [
    "KerasSequenceLoader",
    "KerasSequenceValidater",
    "apply_memory_allocation",
    "feature_column_names",
]

_NVTABULAR_ONLY = {  # NVTabular's keywords that mean nothing here, and what to do instead
    "schema": "pass the column names as cat_names=, cont_names= and label_names=",
    "reader_kwargs": "tabloader reads parquet with its own settings; leave it out",
    "transforms": "apply transforms in the model (Keras layers) instead",
    "workers": "tabloader reads and batches in background threads already; leave it out",
    "use_multiprocessing": "tabloader reads in background threads already; leave it out",
    "max_queue_size": "tabloader keeps its own bounded queue of ready batches; leave it out",
}


class KerasSequenceLoader(IndexedEpochs, keras.utils.PyDataset):  # type: ignore[misc]
    """Batches of parquet rows as ``tf.Tensor`` dicts, for ``model.fit`` and friends.

    Each item is ``(features, labels)``: ``features`` maps every cat (int64) and cont
    (float32) column to a 1-D tensor, for models whose ``keras.Input`` layers carry the
    column names (``keras.Input(shape=(), name="user", dtype="int64")``); ``labels`` is
    one float32 tensor, or ``{label name: tensor}`` with several label columns; with
    ``label_names=[]`` an item is ``features`` alone (for ``predict``). A list column
    (``sparse_names``) is a ``tf.RaggedTensor``, or with ``sparse_as_dense`` a padded
    ``[B, sparse_max[name]]`` tensor.

    Args:
        paths_or_dataset: A [`tabloader.Dataset`][tabloader.Dataset], or anything it accepts.
        batch_size: Rows per batch; only an epoch's last batch may be shorter.
        label_names: Target columns. Required (``model.fit`` cannot train without them):
            pass ``[]`` to predict on data without labels.
        feature_columns: Instead of ``cat_names``/``cont_names``, ``tf.feature_column``
            columns naming them (categorical ones, also inside embedding or indicator
            columns, as cats; numeric and bucketized sources as conts).
        shuffle: Default True (NVTabular's), as in [`tabloader.Loader`][tabloader.Loader].
        seed_fn: Alternatively to ``seed``, a function returning it, called once here.
        buffer_size: Rows read and shuffled together (a chunk): an int is rows, a float in
            (0, 1) a fraction of the device's total memory. Default: about 128 MiB.
        device: As in [`tabloader.Loader`][tabloader.Loader]; the tensors are built there.
        engine: ``"parquet"`` (or None), for NVTabular compatibility.
        **options: Every other [`tabloader.Loader`][tabloader.Loader] keyword, as documented there
            ([`tabloader.LoaderOptions`][tabloader.LoaderOptions]; ``cat_names``, ``cont_names``;
            ranks, ``drop_last``, ``fill_null``, ``cache``, list columns). An unknown keyword
            raises ``TypeError`` naming the closest known one.

    Each index of ``range(len(loader))`` is served once per epoch, the epoch's batches in
    stream order whatever the order of the indices; then the next epoch starts, reshuffled
    (`tabloader.indexed.IndexedEpochs`: unfinished epochs, repeated indices).

    Examples:
        >>> import pyarrow as pa
        >>> data = pa.table({"user": [1, 2, 3, 4, 5], "y": [0.0, 1.0, 0.0, 1.0, 1.0]})
        >>> loader = KerasSequenceLoader(data, batch_size=2, cat_names=["user"],
        ...                              label_names=["y"], seed=0)
        >>> features, labels = loader[0]
        >>> sorted(features), features["user"].dtype.name, labels.dtype.name
        (['user'], 'int64', 'float32')
        >>> [int(y.shape[0]) for _, y in loader]
        [2, 2, 1]
    """

    def __init__(
        self,
        paths_or_dataset: Any,
        *,
        batch_size: int,
        feature_columns: Sequence[Any] | None = None,
        seed_fn: Callable[[], int] | None = None,
        buffer_size: float | None = None,
        device: str | int | None = None,
        engine: str | None = None,
        **options: Unpack[LoaderOptions],
    ) -> None:
        _reject(options)
        if options.get("label_names") is None and options.get("labels") is None:
            raise InvalidArgumentError(
                "KerasSequenceLoader needs label_names= (the target columns) to train: without "
                "them model.fit fails later with 'None values not supported'. To predict on "
                "data without labels, pass label_names=[]"
            )
        keras.utils.PyDataset.__init__(self)
        if feature_columns is not None:
            names = ("cat_names", "cats", "cont_names", "conts")
            named = [k for k in names if options.get(k) is not None]
            if named:
                raise InvalidArgumentError("give feature_columns or cat_names/cont_names, not both")
            options["cat_names"], options["cont_names"] = feature_column_names(feature_columns)
        if engine not in (None, "parquet"):
            raise InvalidArgumentError(f"engine must be 'parquet' (or None), got {engine!r}")
        check_seed_fn(options.get("seed"), seed_fn)
        if seed_fn is not None:
            options["seed"] = seed_fn()
        options.setdefault("shuffle", True)
        if buffer_size is not None:
            options["chunk_rows"] = chunk_rows_for_buffer(buffer_size, options, batch_size, device)
        make_tensors = _TensorMaker()
        loader = Loader(
            paths_or_dataset, batch_size=batch_size, device=device, transform=make_tensors,
            **options,
        )  # fmt: skip
        if loader.sparse_names and loader.device.is_cuda:
            raise InvalidArgumentError(
                f"list columns ({', '.join(map(repr, loader.sparse_names))}) reach Keras from "
                f"the CPU only for now, but the loader reads on {loader.device}. Pass "
                "device='cpu' to KerasSequenceLoader"
            )
        make_tensors.set_columns(loader)
        self.buffer_size = buffer_size
        IndexedEpochs.__init__(self, loader)  # self.loader: the core loader

    def __repr__(self) -> str:
        return f"KerasSequenceLoader({self.loader!r}, epoch={self.epoch})"


class KerasSequenceValidater(keras.callbacks.Callback):  # type: ignore[misc]
    """Evaluate on ``dataloader`` after every epoch and log ``val_*`` figures.

    At each epoch's end ``model.evaluate`` runs over the whole ``dataloader`` (a
    [`KerasSequenceLoader`][tabloader.tensorflow.KerasSequenceLoader], typically unshuffled, or
    anything ``evaluate`` takes) and each result ``name`` goes into the epoch's logs as
    ``val_<name>``: put this callback before those that watch them
    (``EarlyStopping(monitor="val_auc")``).

    Examples:
        >>> import keras, pyarrow as pa
        >>> data = pa.table({"x": [0.0, 1.0, 2.0, 3.0], "y": [0.0, 0.0, 1.0, 1.0]})
        >>> def loader(): return KerasSequenceLoader(data, batch_size=2, cont_names=["x"],
        ...                                          label_names=["y"], seed=0)
        >>> x = keras.Input(shape=(), name="x")
        >>> model = keras.Model({"x": x}, keras.layers.Dense(1)(keras.ops.expand_dims(x, -1)))
        >>> model.compile("sgd", "mse")
        >>> history = model.fit(loader(), epochs=1, verbose=0,
        ...                     callbacks=[KerasSequenceValidater(loader())])
        >>> sorted(history.history)
        ['loss', 'val_loss']
    """

    def __init__(self, dataloader: Any) -> None:
        super().__init__()
        self.dataloader = dataloader

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        results = self.model.evaluate(self.dataloader, verbose=0, return_dict=True)
        if logs is not None:
            logs.update({f"val_{name}": value for name, value in results.items()})


# -- building tensors -----------------------------------------------------------------


class _TensorMaker:
    """The core loader's ``transform``: a batch of arrays in, ``(features, labels)`` out.

    Runs in the loader's background thread. Columns become tensors through DLPack as
    `aligned_columns` hands them over: shuffled host columns
    as they are, the others copied to 64-byte aligned memory (TensorFlow aborts on
    unaligned memory, and a tensor must not write into Arrow's buffers). A list column
    becomes a ``tf.RaggedTensor`` from its row splits, or a padded tensor.
    """

    def __init__(self) -> None:
        self.device = Device("cpu")
        self.xp: Any = None
        self.features: tuple[str, ...] = ()
        self.labels: tuple[str, ...] = ()
        self.lists: tuple[str, ...] = ()
        self.groups: list[tuple[np.dtype[Any], list[str]]] = []

    def set_columns(self, loader: Loader) -> None:
        """The loader's columns and dtypes, and its device, where the tensors are built."""
        self.device = loader.device
        cuda = self.device.is_cuda
        self.xp = importlib.import_module("cupy") if cuda else PooledNumpy(BufferPool())
        self.lists = loader.sparse_names
        self.features = tuple(c for c in (*loader.cats, *loader.conts) if c not in self.lists)
        self.labels = loader.labels
        groups: dict[np.dtype[Any], list[str]] = {}
        for name in (*self.features, *self.labels):
            groups.setdefault(loader.dtypes[name], []).append(name)
        self.groups = list(groups.items())

    def __call__(self, batch: Mapping[str, Any]) -> Any:
        on_gpu = self.device.is_cuda
        # New threads start on GPU 0: allocate on the loader's GPU (cuda:N), not there.
        with self.xp.cuda.Device(self.device.index) if on_gpu else contextlib.nullcontext():
            arrays = aligned_columns(batch, self.groups, self.xp, share=not on_gpu)
            tensors = {
                n: tf.experimental.dlpack.from_dlpack(a.__dlpack__()) for n, a in arrays.items()
            }
            if on_gpu:
                self.xp.cuda.get_current_stream().synchronize()  # TensorFlow reads on its own
        features = {name: tensors[name] for name in self.features}
        for name in self.lists:
            value = batch[name]
            if isinstance(value, tuple):
                values, offsets = map(tf.convert_to_tensor, value)
                features[name] = tf.RaggedTensor.from_row_splits(values, offsets, validate=False)
            else:
                features[name] = tf.convert_to_tensor(value)
        if not self.labels:
            return features
        if len(self.labels) == 1:
            return features, tensors[self.labels[0]]
        return features, {name: tensors[name] for name in self.labels}


def apply_memory_allocation(value: str | None = None) -> bool:
    """Cap TensorFlow's memory on every GPU to ``value`` (default ``TF_MEMORY_ALLOCATION``):
    a fraction of each GPU's memory (``"0.5"``) or megabytes (``"8192"``), leaving the rest
    to the loader. Importing this module calls it; TensorFlow takes it only before it
    initialises its GPUs (else a ``RuntimeWarning``). Returns whether a cap was applied.
    """
    value = os.environ.get("TF_MEMORY_ALLOCATION") if value is None else value
    if value is None or not value.strip():
        return False
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        memory_limit_mb(value, total_mb=1.0)  # still reject malformed values
        return False
    try:
        for index, gpu in enumerate(gpus):
            limit = memory_limit_mb(value, total_mb=_gpu_total_mb(index))
            tf.config.set_logical_device_configuration(
                gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit)]
            )
    except RuntimeError as err:
        warnings.warn(
            f"TF_MEMORY_ALLOCATION={value!r} was not applied: TensorFlow has already "
            f"initialised its GPUs ({err}). Set it before TensorFlow first uses a GPU, e.g. "
            "at the top of the script before importing tabloader.tensorflow",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return True


def _reject(options: Mapping[str, Any]) -> None:
    nvtabular = sorted(set(options) & set(_NVTABULAR_ONLY))
    if nvtabular:
        raise InvalidArgumentError(
            "KerasSequenceLoader does not support "
            + "; ".join(f"{name}= ({_NVTABULAR_ONLY[name]})" for name in nvtabular)
        )
    known = (*keywords_of(KerasSequenceLoader.__init__), *LOADER_KEYWORDS)
    reject_unknown(options, known, "KerasSequenceLoader")


apply_memory_allocation()
