"""Keras adapter: a ``keras.utils.PyDataset`` over the tabloader core, and a validation callback.

:class:`KerasSequenceLoader` serves ``(features, labels)`` batches of ``tf.Tensor`` to
``model.fit``, ``evaluate`` and ``predict``; :class:`KerasSequenceValidater` evaluates a
model on a validation loader at the end of every training epoch and adds ``val_*``
entries to the epoch's logs. The tensors are built in the loader's background thread, so
the training loop does no copying.

Importing this module applies ``TF_MEMORY_ALLOCATION`` (see :func:`apply_memory_allocation`)
and, unless set already, sets ``TF_CPP_MIN_LOG_LEVEL=2`` before importing TensorFlow,
which hides TensorFlow's informational C++ logs (set it to ``0`` to see them);
``import tabloader`` alone never imports TensorFlow.

Examples:
    >>> import tempfile
    >>> from tabloader.synthetic import write_criteo_like
    >>> from tabloader.tensorflow import KerasSequenceLoader
    >>> tmp = tempfile.mkdtemp()
    >>> files = write_criteo_like(tmp, rows=1000, files=2, row_group_size=250, seed=0)
    >>> train = KerasSequenceLoader(files, batch_size=256, cat_names=["C1", "C2"],
    ...                             cont_names=["I1"], label_names=["label"], seed=0)
    >>> len(train)
    4
    >>> features, labels = train[0]
    >>> sorted(features), features["C1"].dtype.name, features["I1"].dtype.name, labels.shape
    (['C1', 'C2', 'I1'], 'int64', 'float32', TensorShape([256]))
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from tabloader.backends.cpu import BufferPool, PooledNumpy
from tabloader.dataset import Dataset
from tabloader.device import Device
from tabloader.errors import InvalidArgumentError
from tabloader.indexed import IndexedEpochs
from tabloader.loader import Loader
from tabloader.memory import ALIGN, address, aligned_rows, chunk_rows_for_buffer, memory_limit_mb
from tabloader.memory import gpu_total_mb as _gpu_total_mb
from tabloader.memory import total_memory_bytes as total_memory_bytes  # moved, importable here
from tabloader.options import keywords_of, one_spelling, reject_unknown

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

_NVTABULAR_ONLY = {
    "schema": "pass the column names as cat_names=, cont_names= and label_names=",
    "reader_kwargs": "tabloader reads parquet with its own settings; leave it out",
    "transforms": "apply transforms in the model (Keras layers) instead",
    "workers": (
        "tabloader reads and batches in its own background threads; Keras worker threads "
        "would only add overhead, so leave it out"
    ),
    "use_multiprocessing": "tabloader reads in background threads of this process; leave it out",
    "max_queue_size": "tabloader keeps its own bounded queue of ready batches; leave it out",
}


class KerasSequenceLoader(IndexedEpochs, keras.utils.PyDataset):  # type: ignore[misc]
    """Batches of parquet rows as ``tf.Tensor`` dicts, for ``model.fit`` and friends.

    Each item is ``(features, labels)``. ``features`` maps every categorical and
    continuous column name to a 1-D tensor of the batch's rows (cats int64, conts
    float32), so it feeds functional models whose ``keras.Input`` layers carry the
    column names (``keras.Input(shape=(), name="user", dtype="int64")``; ``shape=(1,)``
    works too, Keras adds the axis). ``labels`` is one float32 tensor when there is one
    label column, a dict ``{label name: tensor}`` when there are several (for models
    with one named output per label), and the item is ``features`` alone when there is
    none (for ``predict``).

    What to read:
        paths_or_dataset: A :class:`tabloader.Dataset`, or anything it accepts (files,
            globs, directories, URLs, tables, DataFrames).
        batch_size: Rows per batch; only an epoch's last batch may be shorter.
        label_names: Target columns (float32). Required: a loader without them raises at
            construction, since ``model.fit`` cannot train without targets. For
            ``predict`` on data without labels, pass ``label_names=[]``.
        cat_names: Categorical columns, integer ids delivered as int64.
        cont_names: Continuous columns, delivered as float32.
        cats, conts, labels: The core's names for ``cat_names``, ``cont_names`` and
            ``label_names``; give each option under one name. An unknown keyword raises
            ``TypeError`` naming the closest known one.
        feature_columns: Instead of ``cat_names``/``cont_names``, ``tf.feature_column``
            columns: categorical columns (also inside embedding or indicator columns) are
            read as cats, numeric and bucketized columns' sources as conts. They only name
            the columns: tabloader delivers the raw values, the model does the rest.
        engine: ``"parquet"`` (or None); accepted for NVTabular compatibility.

    How to shuffle:
        shuffle: Default True. Visit row groups in a new random order every epoch and
            shuffle rows within each chunk.
        shuffle_within_batch: False keeps each shuffled batch's rows in stored order
            (same random batch composition, faster; see :class:`tabloader.Loader`).
        seed: Seed of all randomness; same seed and epoch, same batches. None draws one.
        seed_fn: Alternatively, a function returning the seed, called once here (for
            example one that broadcasts rank 0's seed to every rank).
        buffer_size: Rows read and shuffled together (a chunk). An int is a number of
            rows; a float in (0, 1) is a fraction of the device's total memory per chunk
            (host memory on the CPU), converted to rows with the delivered bytes per row.
            The loader holds about three chunks at once. Default: about 128 MiB chunks.
        parts_per_chunk: Alternatively, row groups per chunk.

    Distributed:
        global_size, global_rank: Number of ranks and this rank (default 1 and 0). Every
            rank gets disjoint rows and the same number of batches; pass the same seed.
        drop_last: Drop each epoch's last batch if it is short.
        device: ``None`` (the GPU when cudf and cupy can run, else the CPU),
            ``"cpu"``, or a CUDA device for the GPU backend. The core loader resolves
            it once (:attr:`tabloader.Loader.device`) and tensors are built there.
        fill_null: Replacement for nulls, as in :class:`tabloader.Loader`.

    Caching:
        cache, cache_dir, cache_max_bytes: Keep the decoded rows after the first epoch
            and serve later epochs from them (``shuffle="global"`` needs one); see
            :class:`tabloader.Loader` and docs/cache.md. CPU only.

    List (multi-hot) columns:
        sparse_names: List columns (NVTabular's keyword), also allowed in ``cat_names``
            or ``cont_names``; each is a feature of its own: a ``tf.RaggedTensor``
            (row splits from the offsets), or with ``sparse_as_dense`` a padded
            ``[B, sparse_max[name]]`` tensor (feed it to ``keras.Input(shape=(max,))``).
        sparse_max, sparse_as_dense, sparse_pad: As in :class:`tabloader.Loader`.

    Epochs: each batch index of ``range(len(loader))`` is served once per epoch, with
    the epoch's batches in the order the background reader delivers them, whatever the
    order of the indices (``fit`` shuffles indices by default; that adds nothing, and
    takes nothing away). Once every index was served, the next request (or Keras'
    ``on_epoch_end``) starts the next epoch, reshuffled. Asking again for an index
    already served in the current epoch returns the same batch: instantly for the
    epoch's first two batches, otherwise by reading the epoch again up to it. An epoch
    left unfinished (``steps_per_epoch``, ``evaluate(steps=...)``, a ``break``) is
    continued by requests for new indices and served again from its start by requests
    for old ones. ``len()`` never changes and never disturbs an epoch in progress.

    Examples:
        >>> import tempfile
        >>> from tabloader.synthetic import write_criteo_like
        >>> files = write_criteo_like(tempfile.mkdtemp(), rows=600, files=1, seed=0)
        >>> loader = KerasSequenceLoader(files, batch_size=256, cat_names=["C1"],
        ...                              cont_names=["I1", "I2"], label_names=["label"],
        ...                              shuffle=True, seed=0, buffer_size=300)
        >>> [int(labels.shape[0]) for _, labels in loader]
        [256, 256, 88]
        >>> loader.epoch
        1
    """

    def __init__(
        self,
        paths_or_dataset: Any,
        *,
        batch_size: int,
        label_names: str | Sequence[str] | None = None,
        feature_columns: Sequence[Any] | None = None,
        cat_names: str | Sequence[str] | None = None,
        cont_names: str | Sequence[str] | None = None,
        engine: str | None = None,
        shuffle: bool | Literal["global"] = True,
        shuffle_within_batch: bool = True,
        seed: int | None = None,
        seed_fn: Callable[[], int] | None = None,
        buffer_size: float | None = None,
        device: str | int | None = None,
        parts_per_chunk: int | None = None,
        global_size: int | None = None,
        global_rank: int | None = None,
        drop_last: bool = False,
        fill_null: float | Mapping[str, float] | None = None,
        cache: Literal["memory", "disk"] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_max_bytes: int | None = None,
        sparse_names: str | Sequence[str] | None = None,
        sparse_max: Mapping[str, int] | None = None,
        sparse_as_dense: bool = False,
        sparse_pad: float = 0,
        cats: str | Sequence[str] | None = None,
        conts: str | Sequence[str] | None = None,
        labels: str | Sequence[str] | None = None,
        **unsupported: Any,
    ) -> None:
        if unsupported:
            _reject(unsupported)
        # The core's names (cats, ...) are accepted too, one spelling per option.
        cat_names = one_spelling({"cat_names": cat_names, "cats": cats})
        cont_names = one_spelling({"cont_names": cont_names, "conts": conts})
        label_names = one_spelling({"label_names": label_names, "labels": labels})
        if label_names is None:
            raise InvalidArgumentError(
                "KerasSequenceLoader needs label_names= (the target columns) to train: without "
                "them model.fit fails later with 'None values not supported'. To predict on "
                "data without labels, pass label_names=[]"
            )
        keras.utils.PyDataset.__init__(self)
        if feature_columns is not None:
            if cat_names is not None or cont_names is not None:
                raise InvalidArgumentError("give feature_columns or cat_names/cont_names, not both")
            cat_names, cont_names = feature_column_names(feature_columns)
        if engine not in (None, "parquet"):
            raise InvalidArgumentError(
                f"engine must be 'parquet' (or None), got {engine!r}: convert other formats "
                "to parquet first"
            )
        if seed_fn is not None:
            if seed is not None:
                raise InvalidArgumentError("give seed or seed_fn, not both")
            if not callable(seed_fn):
                raise InvalidArgumentError(f"seed_fn must be callable, got {seed_fn!r}")
            seed = seed_fn()
        chunk_rows = chunk_rows_for_buffer(
            buffer_size,
            parts_per_chunk=parts_per_chunk,
            kinds=(cat_names, cont_names, label_names),
            batch_size=batch_size,
            device=device,
        )
        dataset = (
            paths_or_dataset if isinstance(paths_or_dataset, Dataset) else Dataset(paths_or_dataset)
        )
        make_tensors = _TensorMaker()
        lists = _ListTensors(make_tensors, sparse_names)
        loader = Loader(
            dataset,
            batch_size=batch_size,
            cats=cat_names,
            conts=cont_names,
            labels=label_names,
            shuffle=shuffle,
            shuffle_within_batch=shuffle_within_batch,
            seed=seed,
            parts_per_chunk=parts_per_chunk,
            chunk_rows=chunk_rows,
            drop_last=drop_last,
            fill_null=fill_null,
            global_rank=0 if global_rank is None else global_rank,
            global_size=1 if global_size is None else global_size,
            device=device,
            transform=lists if lists.names else make_tensors,
            sparse_names=sparse_names,
            sparse_max=sparse_max,
            sparse_as_dense=sparse_as_dense,
            sparse_pad=sparse_pad,
            cache=cache,
            cache_dir=cache_dir,
            cache_max_bytes=cache_max_bytes,
        )
        if loader.sparse_names and loader.device.is_cuda:
            raise InvalidArgumentError(
                f"list columns ({', '.join(map(repr, loader.sparse_names))}) reach Keras from "
                f"the CPU only for now, but the loader reads on {loader.device}. Pass "
                "device='cpu' to KerasSequenceLoader"
            )
        cats = [c for c in loader.cats if c not in loader.sparse_names]
        conts = [c for c in loader.conts if c not in loader.sparse_names]
        make_tensors.set_columns(cats, conts, loader.labels, device=loader.device)
        self.buffer_size = buffer_size
        IndexedEpochs.__init__(self, loader)  # self.loader: the core loader

    # -- the Keras interface: the epochs (len(), on_epoch_begin/end, epoch, set_epoch,
    # state_dict, load_state_dict, close) are those of IndexedEpochs.

    def __getitem__(self, index: int) -> Any:
        return self.batch(index, stacklevel=2)

    def __iter__(self) -> Iterator[Any]:
        """One epoch: ``on_epoch_begin``, every batch in order, ``on_epoch_end``."""
        self.on_epoch_begin()
        for i in range(len(self)):
            yield self[i]
        self.on_epoch_end()

    def __repr__(self) -> str:
        return f"KerasSequenceLoader({self.loader!r}, epoch={self.epoch})"


class KerasSequenceValidater(keras.callbacks.Callback):  # type: ignore[misc]
    """Evaluate on a validation loader after every epoch and log ``val_*`` figures.

    At each epoch's end the model is evaluated (``model.evaluate``: metric states reset
    first, loss and every compiled metric over the whole loader), and each result
    ``name`` is written into the epoch's logs as ``val_<name>``. The entries show up in
    ``History`` and in every callback listed after this one, so put it before callbacks
    that watch validation figures (``EarlyStopping(monitor="val_auc")``,
    ``ModelCheckpoint``).

    Args:
        dataloader: What to evaluate on: a :class:`KerasSequenceLoader` (typically with
            ``shuffle=False``) or anything ``model.evaluate`` accepts.

    Examples:
        >>> import tempfile, keras
        >>> from tabloader.synthetic import write_criteo_like
        >>> files = write_criteo_like(tempfile.mkdtemp(), rows=512, files=1, seed=0)
        >>> def loader(shuffle):
        ...     return KerasSequenceLoader(files, batch_size=128, cont_names=["I1", "I2"],
        ...                                label_names=["label"], shuffle=shuffle, seed=0)
        >>> inputs = {n: keras.Input(shape=(), name=n) for n in ["I1", "I2"]}
        >>> x = keras.layers.Concatenate()([keras.ops.expand_dims(t, -1) for t in inputs.values()])
        >>> model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
        >>> model.compile("adam", "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
        >>> history = model.fit(loader(True), epochs=2, verbose=0,
        ...                     callbacks=[KerasSequenceValidater(loader(False))])
        >>> sorted(history.history)
        ['auc', 'loss', 'val_auc', 'val_loss']
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

    Runs in the loader's background thread. On the CPU, a column the core already
    delivers as a writable, contiguous, 64-byte aligned array (every column of a
    shuffled batch: the core gathers each batch into one pooled allocation whose
    blocks start on 64-byte boundaries) becomes a tensor through DLPack as it is, with
    no copy. The other columns (an unshuffled batch's read-only views of Arrow memory,
    views that start off a 64-byte boundary, device arrays) are copied into the rows
    of one 64-byte aligned 2-D buffer per dtype (rows padded to 64 bytes), and each row
    becomes a tensor: TensorFlow aborts the process on memory that is not 64-byte
    aligned, and a tensor must not write into Arrow's immutable buffers.
    """

    def __init__(self) -> None:
        self.on_gpu = False
        self.device = Device("cpu")
        self.xp: Any = None
        self.features: tuple[str, ...] = ()
        self.labels: tuple[str, ...] = ()
        self.groups: list[tuple[np.dtype[Any], tuple[str, ...]]] = []

    def set_columns(
        self, cats: Sequence[str], conts: Sequence[str], labels: Sequence[str], *, device: Device
    ) -> None:
        """The columns batches hold (cats as int64, conts and labels as float32), and
        the device the loader resolved, where the tensors are built."""
        self.on_gpu = device.is_cuda
        self.device = device
        if self.on_gpu:
            import cupy

            self.xp = cupy
        else:
            self.xp = PooledNumpy(BufferPool())
        self.features = (*cats, *conts)
        self.labels = tuple(labels)
        self.groups = [
            (np.dtype(dtype), names)
            for dtype, names in (("int64", tuple(cats)), ("float32", (*conts, *labels)))
            if names
        ]

    def _on_device(self) -> Any:
        if not self.on_gpu:
            return contextlib.nullcontext()
        return self.xp.cuda.Device(self.device.index)

    def _shareable(self, array: Any, dtype: np.dtype[Any]) -> bool:
        """Whether TensorFlow may use ``array``'s memory as it is."""
        return (
            not self.on_gpu
            and isinstance(array, np.ndarray)
            and array.dtype == dtype
            and array.ndim == 1
            and array.flags.c_contiguous
            and array.flags.writeable
            and address(array) % ALIGN == 0
        )

    def __call__(self, batch: Mapping[str, Any]) -> Any:
        rows = int(next(iter(batch.values())).shape[0])
        tensors: dict[str, Any] = {}
        # New threads start on GPU 0: allocate on the loader's GPU (cuda:N), not there.
        with self._on_device():
            for dtype, names in self.groups:
                copied = [name for name in names if not self._shareable(batch[name], dtype)]
                for name in names:
                    if name not in copied:
                        column = batch[name].__dlpack__()
                        tensors[name] = tf.experimental.dlpack.from_dlpack(column)
                if not copied:
                    continue
                block = aligned_rows(self.xp, len(copied), rows, dtype)
                for j, name in enumerate(copied):
                    block[j, :rows] = batch[name]
                for j, name in enumerate(copied):
                    column = block[j, :rows].__dlpack__()
                    tensors[name] = tf.experimental.dlpack.from_dlpack(column)
            if self.on_gpu:
                self.xp.cuda.get_current_stream().synchronize()  # TensorFlow reads on its own
        features = {name: tensors[name] for name in self.features}
        if not self.labels:
            return features
        if len(self.labels) == 1:
            return features, tensors[self.labels[0]]
        return features, {name: tensors[name] for name in self.labels}


class _ListTensors:
    """``transform`` with list columns: the scalar columns through :class:`_TensorMaker`,
    each list column added to the features as a padded ``tf.Tensor`` (dense) or a
    ``tf.RaggedTensor`` built from its row splits."""

    def __init__(self, make_tensors: _TensorMaker, names: str | Sequence[str] | None) -> None:
        self.make_tensors = make_tensors
        self.names = (names,) if isinstance(names, str) else tuple(names or ())

    def __call__(self, batch: Mapping[str, Any]) -> Any:
        result = self.make_tensors({k: v for k, v in batch.items() if k not in self.names})
        features = result[0] if isinstance(result, tuple) else result
        for name in self.names:
            value = batch[name]
            if isinstance(value, tuple):
                values, offsets = value
                features[name] = tf.RaggedTensor.from_row_splits(
                    tf.convert_to_tensor(values), tf.convert_to_tensor(offsets), validate=False
                )
            else:
                features[name] = tf.convert_to_tensor(value)
        return result


def apply_memory_allocation(value: str | None = None) -> bool:
    """Cap TensorFlow's memory on every GPU as ``TF_MEMORY_ALLOCATION`` says.

    ``value`` (default: the environment variable) is a fraction of each GPU's total
    memory (``"0.5"``) or megabytes (``"8192"``); the rest is left to the loader.
    TensorFlow only accepts this before it initialises its GPUs, so set the variable
    before importing ``tabloader.tensorflow`` (which calls this once) and before running
    anything on a GPU. Without the variable or without a GPU nothing happens; when
    TensorFlow has already initialised its GPUs a ``RuntimeWarning`` says so. Returns
    whether a cap was applied.
    """
    if value is None:
        value = os.environ.get("TF_MEMORY_ALLOCATION")
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


def _reject(unsupported: Mapping[str, Any]) -> None:
    known = sorted(set(unsupported) & set(_NVTABULAR_ONLY))
    if known:
        raise InvalidArgumentError(
            "KerasSequenceLoader does not support "
            + "; ".join(f"{name}= ({_NVTABULAR_ONLY[name]})" for name in known)
        )
    reject_unknown(unsupported, keywords_of(KerasSequenceLoader.__init__), "KerasSequenceLoader")


apply_memory_allocation()
