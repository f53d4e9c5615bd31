"""Keras 3 adapter, on every Keras backend: `KerasSequenceLoader`, a
``keras.utils.PyDataset`` of ready batches for ``model.fit``, ``evaluate`` and
``predict``, built in the loader's background thread; `KerasSequenceValidater`,
a callback adding ``val_*`` figures to each epoch.

Keras' backend (``KERAS_BACKEND``: ``tensorflow``, ``jax`` or ``torch``) decides what a
batch is made of: ``tf.Tensor``, ``jax.Array`` or ``torch.Tensor``, on the loader's
device (``/GPU:N``, JAX's GPU N, ``cuda:N``, or the CPU), handed over through DLPack
without a copy, never through the host (see docs/keras.md). The dtypes follow the
backend: JAX in its default 32-bit mode gets int32 ids, checked to fit.

This module imports TensorFlow only when Keras' backend is TensorFlow; it then also
applies TensorFlow's GPU memory setting (`apply_memory_allocation`) and sets
``TF_CPP_MIN_LOG_LEVEL=2`` unless set. ``import tabloader`` alone never imports Keras.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tabloader import _deps
from tabloader.config import LOADER_KEYWORDS, LoaderOptions
from tabloader.epochs import check_seed_fn
from tabloader.errors import InvalidArgumentError, PerformanceWarning
from tabloader.indexed import IndexedEpochs
from tabloader.loader import Loader
from tabloader.memory import chunk_rows_for_buffer
from tabloader.options import keywords_of, reject_unknown
from tabloader.tensors import (
    BatchConverter,
    Tensors,
    core_dtypes,
    delivered_dtypes,
    tensors_for,
)

if TYPE_CHECKING:
    from types import FrameType

    from typing_extensions import Unpack

# TensorFlow's C++ informational logs (CPU instruction sets, ...) tell a user of this
# module nothing they can act on: quiet by default, unless the user chose a level.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
try:
    import keras
except ImportError as err:
    raise _deps.keras_import_error(err) from None
if int(keras.__version__.split(".")[0]) < 3:
    raise ImportError(
        f"tabloader.keras needs Keras 3, found Keras {keras.__version__}: pip install 'keras>=3'"
    )

BACKEND: str = keras.backend.backend()
"""Keras' backend, fixed when Keras was first imported (``KERAS_BACKEND``)."""
if BACKEND not in ("tensorflow", "jax", "torch"):
    raise ImportError(
        f"tabloader.keras supports Keras' tensorflow, jax and torch backends, not {BACKEND!r}: "
        "set KERAS_BACKEND before Keras is first imported"
    )
_TENSORS: Tensors = tensors_for(BACKEND)

if BACKEND == "tensorflow":
    from tabloader.keras_tensorflow import apply_memory_allocation, device_batches_installed

    apply_memory_allocation()
    device_batches_installed()
else:

    def apply_memory_allocation(value: str | None = None) -> bool:
        """TensorFlow's GPU memory setting: nothing to do, Keras does not run on TensorFlow."""
        return False

    def device_batches_installed() -> bool:
        return True


__all__ = [
    "BACKEND",
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


def feature_column_names(columns: Sequence[Any]) -> tuple[list[str], list[str]]:
    """``(cat_names, cont_names)`` named by ``tf.feature_column`` columns (needs
    TensorFlow; see `tabloader.tensorflow_columns.feature_column_names`)."""
    from tabloader.tensorflow_columns import feature_column_names as names

    return names(columns)


class KerasSequenceLoader(IndexedEpochs, keras.utils.PyDataset):  # type: ignore[misc]
    """Batches of parquet rows as dicts of the Keras backend's tensors, for ``model.fit``
    and friends.

    Each item is ``(features, labels)``: ``features`` maps every cat and cont column to
    a 1-D tensor, for models whose ``keras.Input`` layers carry the column names
    (``keras.Input(shape=(), name="user", dtype="int64")``); ``labels`` is one tensor,
    or ``{label name: tensor}`` with several label columns; with ``label_names=[]`` an
    item is ``features`` alone (for ``predict``). Tensors are ``tf.Tensor``,
    ``jax.Array`` or ``torch.Tensor`` as Keras' backend is, on the loader's device.
    Cats are int64 (int32 on JAX in its default 32-bit mode), conts and labels
    float32; ``cat_dtype``, ``cont_dtype``, ``label_dtype`` take numpy, Keras or
    framework dtypes (``"int32"``, ``tf.int64``). A list column (``sparse_names``) is
    a ``tf.RaggedTensor`` (TensorFlow only), or with ``sparse_as_dense`` a padded
    ``[B, sparse_max[name]]`` tensor (every backend).

    Args:
        paths_or_dataset: A [`tabloader.Dataset`][tabloader.Dataset], or anything it accepts.
        batch_size: Rows per batch; only an epoch's last batch may be shorter.
        label_names: Target columns. Required (``model.fit`` cannot train without them):
            pass ``[]`` to predict on data without labels.
        feature_columns: Instead of ``cat_names``/``cont_names``, ``tf.feature_column``
            columns naming them (needs TensorFlow; categorical ones, also inside
            embedding or indicator columns, as cats; numeric and bucketized sources as
            conts).
        shuffle: Default True (NVTabular's), as in [`tabloader.Loader`][tabloader.Loader].
        seed_fn: Alternatively to ``seed``, a function returning it, called once here.
        buffer_size: Rows read and shuffled together (a chunk): an int is rows, a float in
            (0, 1) a fraction of the device's total memory. Default: about 128 MiB. With
            ``parts_per_chunk`` too (NVTabular's scripts pass both), a chunk holds that many
            such parts.
        device: As in [`tabloader.Loader`][tabloader.Loader]; the tensors are built there.
        engine: ``"parquet"`` (or None), for NVTabular compatibility.
        **options: Every other [`tabloader.Loader`][tabloader.Loader] keyword, as
            documented there ([`tabloader.LoaderOptions`][tabloader.LoaderOptions];
            ``cat_names``, ``cont_names``; ranks, ``drop_last``, ``fill_null``, ``cache``,
            list columns). An unknown keyword raises ``TypeError`` naming the closest
            known one.

    Each index of ``range(len(loader))`` is served once per epoch, the epoch's batches in
    stream order whatever the order of the indices; then the next epoch starts, reshuffled
    (`tabloader.indexed.IndexedEpochs`: unfinished epochs, repeated indices).

    Examples:
        >>> import pyarrow as pa
        >>> data = pa.table({"user": [1, 2, 3, 4, 5], "y": [0.0, 1.0, 0.0, 1.0, 1.0]})
        >>> loader = KerasSequenceLoader(data, batch_size=2, cat_names=["user"],
        ...                              label_names=["y"], seed=0)
        >>> features, labels = loader[0]
        >>> sorted(features), keras.ops.convert_to_numpy(labels).dtype.name
        (['user'], 'float32')
        >>> [int(y.shape[0]) for _, y in loader]
        [2, 2, 1]
    """

    _device_batches = True
    """Handed to Keras' TensorFlow trainer as they are (see `tabloader.keras_tensorflow`)."""

    # label_names is also a LoaderOptions key: a parameter here too, so that NVTabular's
    # positional call (paths, batch_size, label_names) works
    def __init__(  # type: ignore[misc]
        self,
        paths_or_dataset: Any,
        batch_size: int | None = None,
        label_names: Sequence[str] | None = None,
        *,
        feature_columns: Sequence[Any] | None = None,
        seed_fn: Callable[[], int] | None = None,
        buffer_size: float | None = None,
        device: str | int | None = None,
        engine: str | None = None,
        **options: Unpack[LoaderOptions],
    ) -> None:
        _reject(options)
        if batch_size is None:
            raise InvalidArgumentError("KerasSequenceLoader needs batch_size= (rows per batch)")
        if label_names is not None:
            options["label_names"] = label_names
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
        ragged = options.get("sparse_names") and not options.get("sparse_as_dense")
        if ragged and BACKEND != "tensorflow":
            raise InvalidArgumentError(
                f"list columns reach Keras' {BACKEND} backend padded only: pass "
                "sparse_as_dense=True with sparse_max={column: longest list} (ragged "
                "tensors are TensorFlow's)"
            )
        delivered = delivered_dtypes(_TENSORS, options)
        options.update(core_dtypes(_TENSORS, delivered))
        if buffer_size is not None:
            options["chunk_rows"] = chunk_rows_for_buffer(buffer_size, options, batch_size, device)
            options.pop("parts_per_chunk", None)  # counted in: the buffer's parts per chunk
        make_tensors = _TensorMaker(_TENSORS)
        loader = Loader(
            paths_or_dataset, batch_size=batch_size, device=device, transform=make_tensors,
            **options,
        )  # fmt: skip
        make_tensors.set_columns(loader, delivered)
        if loader.device.is_cuda and BACKEND == "tensorflow" and not device_batches_installed():
            warnings.warn(
                "this Keras hands PyDataset batches to TensorFlow through tf.data, which copies "
                f"each batch from {loader.device} to the host and back",
                PerformanceWarning,
                stacklevel=2,
            )
        self.buffer_size = buffer_size
        self._tensor_maker = make_tensors
        # (self.loader: the core loader; a seed_fn's seed gives way to a loaded state's)
        IndexedEpochs.__init__(self, loader, adopt_seed=True if seed_fn is not None else None)

    @property
    def batch_size(self) -> int:
        return self.loader.batch_size

    def __getitem__(self, index: int) -> Any:
        return self.batch(index, stacklevel=2, look=_keras_looks())

    def __repr__(self) -> str:
        return f"KerasSequenceLoader({self.loader!r}, backend={BACKEND!r}, epoch={self.epoch})"


_LOOKS = ("_symbolic_build", "_maybe_symbolic_build")
"""Keras' methods that take a batch to build the model (on JAX and PyTorch, the first
``fit`` or ``evaluate`` of an unbuilt model) before they ask for it again to train."""


def _keras_looks() -> bool:
    """Whether this request comes from Keras building the model (`_LOOKS`): the batch
    is looked at, not trained on, and asked for again in the epoch, in any turn."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name in _LOOKS and f"keras{os.sep}" in code.co_filename:
            return True
        frame = frame.f_back
    return False


class KerasSequenceValidater(keras.callbacks.Callback):  # type: ignore[misc]
    """Evaluate on ``dataloader`` after every epoch and log ``val_*`` figures.

    At each epoch's end ``model.evaluate`` runs over the whole ``dataloader`` (a
    `KerasSequenceLoader`, typically unshuffled, or anything ``evaluate`` takes)
    and each result ``name`` goes into the epoch's logs as ``val_<name>``: put this
    callback before those that watch them (``EarlyStopping(monitor="val_auc")``).

    Examples:
        >>> import pyarrow as pa
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
    """The core loader's ``transform``: a batch of arrays in, ``(features, labels)`` out,
    made by a `BatchConverter` (aligned, narrowed, through
    DLPack); a ragged list column becomes a ``tf.RaggedTensor`` from its row splits."""

    def __init__(self, tensors: Tensors) -> None:
        self.convert = BatchConverter(tensors)
        self.features: tuple[str, ...] = ()
        self.labels: tuple[str, ...] = ()

    def set_columns(self, loader: Loader, delivered: Mapping[str, np.dtype[Any]]) -> None:
        """The loader's columns, dtypes and device (see ``BatchConverter.set_loader``)."""
        self.convert.set_loader(loader, delivered)
        self.features = tuple(loader.cats) + tuple(loader.conts)
        self.labels = loader.labels

    def __call__(self, batch: Mapping[str, Any]) -> Any:
        with self.convert.on_device():
            tensors = self.convert.tensors_of(self.convert.arrays(batch))
        features = {}
        for name in self.features:
            if name in tensors:
                features[name] = tensors[name]
            else:
                import tensorflow as tf  # ragged lists: refused on the other backends

                features[name] = tf.RaggedTensor.from_row_splits(
                    tensors[(name, "values")], tensors[(name, "offsets")], validate=False
                )
        if not self.labels:
            return features
        if len(self.labels) == 1:
            return features, tensors[self.labels[0]]
        return features, {name: tensors[name] for name in self.labels}


def _reject(options: Mapping[str, Any]) -> None:
    nvtabular = sorted(set(options) & set(_NVTABULAR_ONLY))
    if nvtabular:
        raise InvalidArgumentError(
            "KerasSequenceLoader does not support "
            + "; ".join(f"{name}= ({_NVTABULAR_ONLY[name]})" for name in nvtabular)
        )
    known = (*keywords_of(KerasSequenceLoader.__init__), *LOADER_KEYWORDS)
    reject_unknown(options, known, "KerasSequenceLoader")
