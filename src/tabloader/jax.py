"""JAX adapter: `JaxLoader` yields ``(features, labels)`` batches of ``jax.Array``
on the JAX device of the loader's device, ready for a jit-compiled training step.

Features are a dict of column name to array; list columns come padded to a fixed width,
with their lengths, and ``pad_last=True`` pads an epoch's short last batch to full size
and adds a mask, so that every batch has the same shapes and a jitted step compiles
once (see docs/jax.md). On a GPU the arrays are the loader's device memory, handed
over through DLPack, never through the host.

Examples:
    >>> import pyarrow as pa
    >>> table = pa.table({"user": [1, 2, 3, 4, 5], "x": [.1, .2, .3, .4, .5],
    ...                   "y": [0., 1., 0., 1., 1.]})
    >>> loader = JaxLoader(table, cats=["user"], conts=["x"], labels=["y"], batch_size=2,
    ...                    pad_last=True, device="cpu")
    >>> [(f["user"].shape, y.shape, mask.tolist()) for f, y, mask in loader]
    [((2,), (2,), [True, True]), ((2,), (2,), [True, True]), ((2,), (2,), [True, False])]
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tabloader import _deps

try:
    import jax
except ImportError:
    raise _deps.missing("jax") from None

from tabloader.batches import Ragged
from tabloader.config import LOADER_KEYWORDS, LoaderOptions, list_widths_given
from tabloader.dataset import Dataset
from tabloader.epochs import EpochRun, IterableEpochs, quiet_copy
from tabloader.errors import InvalidArgumentError
from tabloader.loader import Loader
from tabloader.options import flag, keywords_of, ranks, reject_unknown
from tabloader.state import agreed_state as agreed_states
from tabloader.tensors import BatchConverter, JaxTensors, core_dtypes, delivered_dtypes

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["JaxLoader", "agreed_state"]


class JaxLoader(IterableEpochs):
    """Batches of ``jax.Array`` from a dataset, one epoch per ``iter()``.

    Each item is ``(features, labels)``, or ``(features, labels, mask)`` with
    ``pad_last``:

    - ``features`` maps each cat and cont column to a ``[B]`` array, and each list
      column (``sparse_names``) to ``(values, lengths)``: ``values`` ``[B,
      sparse_max[name]]`` padded with ``sparse_pad``, ``lengths`` int32 ``[B]``.
    - ``labels`` is a ``[B]`` array with one label column, ``{name: array}`` with
      several, None with none.
    - ``mask`` is bool ``[B]``, False on the rows ``pad_last`` added.

    Cats are int32 in JAX's default 32-bit mode (int64 with ``jax_enable_x64``): an id
    that does not fit int32 raises, naming the column; conts and labels float32
    (``cat_dtype``, ``cont_dtype``, ``label_dtype`` choose others JAX can hold).

    Args:
        dataset: A [`tabloader.Dataset`][tabloader.Dataset] or anything it accepts.
        batch_size: Rows per batch.
        pad_last: Pad the epoch's short last batch to ``batch_size`` rows (zeros, lists
            empty) and add ``mask``: every batch then has the same shapes, so a jitted
            step never compiles again for the last one.
        device: ``None``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or an int, resolved once
            by the core ([`Loader.device`][tabloader.Loader.device]); the arrays are on
            the JAX device of that device (JAX's GPU ``N`` for ``cuda:N``).
        seed_fn: Alternatively to ``seed``, returns the seed, called once per epoch; it
            must agree on all processes.
        global_rank, global_size: Left out, ``jax.process_index()`` and
            ``jax.process_count()`` (one process and rank 0 without ``jax.distributed``).
        **options: Every other [`tabloader.Loader`][tabloader.Loader] keyword, as
            documented there ([`tabloader.LoaderOptions`][tabloader.LoaderOptions]). List
            columns need ``sparse_max`` (JAX's shapes are static). An unknown keyword
            raises ``TypeError`` naming the closest known one.

    ``len()`` is the exact number of batches per epoch on this process;
    `set_epoch`, `state_dict` and `load_state_dict` resume exactly, also on another
    number of processes (see `agreed_state`).

    Examples:
        >>> import pyarrow as pa
        >>> table = pa.table({"user": [7, 1, 2, 5], "y": [1., 0., 1., 0.]})
        >>> loader = JaxLoader(table, cats=["user"], labels=["y"], batch_size=4, shuffle=True,
        ...                    seed=1, device="cpu")
        >>> features, labels = next(iter(loader))
        >>> features["user"].dtype, labels.dtype, sorted(features["user"].tolist())
        (dtype('int32'), dtype('float32'), [1, 2, 5, 7])
    """

    _rebuilt = ("_maker",)

    def __init__(
        self,
        dataset: Dataset | Any,
        *,
        batch_size: int,
        pad_last: bool = False,
        device: str | int | None = None,
        seed_fn: Callable[[], int] | None = None,
        **options: Unpack[LoaderOptions],
    ) -> None:
        known = (*keywords_of(JaxLoader.__init__), *LOADER_KEYWORDS)
        reject_unknown(options, known, "JaxLoader")
        self.pad_last = flag(pad_last, "pad_last")
        self._device = device
        self._tensors = JaxTensors()
        settings: dict[str, Any] = dict(options)
        self._delivered = delivered_dtypes(self._tensors, settings)
        settings.update(core_dtypes(self._tensors, self._delivered))
        self._widths = _list_widths(settings)
        group = (jax.process_index(), jax.process_count())
        rank, size = ranks(
            settings.pop("global_rank", None), settings.pop("global_size", None), group,
            "jax.distributed",
        )  # fmt: skip
        settings.update(global_rank=rank, global_size=size, batch_size=batch_size)
        self._keep_options(settings, seed_fn)
        self._start_epochs(self._make_loader(dataset), seed_fn)

    def _make_loader(self, dataset: Dataset | Any) -> Loader:
        self._maker = _BatchMaker(self._tensors, self._widths, pad_last=self.pad_last)
        loader = Loader(dataset, **self._options, device=self._device, transform=self._maker)
        self._maker.set_loader(loader, self._delivered)
        return loader

    def __setstate__(self, state: dict[str, Any]) -> None:
        with quiet_copy():  # a copy's warnings were shown where the original was built
            self._attach(self._make_loader(self._restore(state)))

    @property
    def device(self) -> Any:
        """The JAX device the arrays are on."""
        return self._maker.jax_device

    def __iter__(self) -> EpochRun:
        """Start the next epoch (a resumed one after `load_state_dict`)."""
        return self._epochs.start()

    def __repr__(self) -> str:
        return f"JaxLoader({self._loader!r}, pad_last={self.pad_last})"


def agreed_state(source: JaxLoader | Mapping[str, Any]) -> dict[str, Any]:
    """The state of this job, the same in every process: keep one (process 0 writes it
    to the checkpoint) and resume every process from it, on this number of processes or
    another (see `JaxLoader.load_state_dict`).

    Every process calls it at the same step: with several processes
    (``jax.distributed``) it gathers their states (``jax.process_count()`` of them, in
    ``jax.process_index()`` order) and checks that they are one (see
    [`tabloader.agreed_state`][tabloader.agreed_state]), so processes that were not in
    step, or that load other data, are refused rather than saved.

    Args:
        source: The ``JaxLoader``, or its ``state_dict()``.

    Examples:
        >>> import pyarrow as pa
        >>> loader = JaxLoader(pa.table({"id": list(range(10))}), cats=["id"], batch_size=4,
        ...                    device="cpu")
        >>> first = next(iter(loader))
        >>> state = agreed_state(loader)
        >>> state["epoch"], state["batches"], state["global_size"]
        (0, 1, 1)
    """
    state = source.state_dict() if isinstance(source, JaxLoader) else dict(source)
    if jax.process_count() == 1:
        return agreed_states([state])
    from jax.experimental import multihost_utils

    encoded = np.frombuffer(json.dumps(state, sort_keys=True).encode(), dtype=np.uint8)
    sizes = multihost_utils.process_allgather(np.array([len(encoded)], dtype=np.int64))
    padded = np.zeros(int(np.max(sizes)), dtype=np.uint8)
    padded[: len(encoded)] = encoded
    gathered = multihost_utils.process_allgather(padded)
    return agreed_states(
        [
            json.loads(bytes(row[: int(n)]).decode())
            for row, n in zip(np.asarray(gathered), np.asarray(sizes).ravel(), strict=True)
        ]
    )


def _list_widths(options: dict[str, Any]) -> dict[str, int]:
    """Each list column's padded width (``sparse_max``); lists reach the core ragged."""
    names = options.get("sparse_names")
    names = [names] if isinstance(names, str) else list(names or ())
    if options.pop("sparse_as_dense", True) is False and names:
        raise InvalidArgumentError(
            "JaxLoader always pads list columns (JAX's shapes are static): leave "
            "sparse_as_dense out"
        )
    widths = list_widths_given(options.get("sparse_max"))
    missing = [n for n in names if n not in widths]
    if missing:
        raise InvalidArgumentError(
            f"JaxLoader pads list columns to a fixed width, so that a jitted step sees "
            f"static shapes, but sparse_max has no entry for {missing}. Pass "
            f"sparse_max={{{missing[0]!r}: <longest list>, ...}}"
        )
    return {n: int(widths[n]) for n in names}


class _BatchMaker:
    """The core loader's ``transform``: arrays in, ``(features, labels[, mask])`` of
    ``jax.Array`` out (lists padded, the last batch padded with ``pad_last``)."""

    def __init__(self, tensors: JaxTensors, widths: Mapping[str, int], *, pad_last: bool) -> None:
        self.convert = BatchConverter(tensors)
        self.widths = dict(widths)
        self.pad_last = pad_last
        self.batch_size = 0
        self.pad = 0.0
        self.features: tuple[str, ...] = ()
        self.labels: tuple[str, ...] = ()
        self.jax_device: Any = None

    def set_loader(self, loader: Loader, delivered: Mapping[str, np.dtype[Any]]) -> None:
        self.convert.set_loader(loader, delivered)
        self.batch_size = loader.batch_size
        self.pad = float(loader.sparse_pad)
        self.features = loader.cats + loader.conts
        self.labels = loader.labels
        with self.convert.on_device():
            probe = self.convert.tensors_of({"probe": self.convert.empty((1,), np.float32)})
        self.jax_device = next(iter(probe["probe"].devices()))

    def __call__(self, batch: Mapping[str, Any]) -> Any:
        convert = self.convert
        with convert.on_device():
            arrays = convert.arrays(batch)
            for name, width in self.widths.items():
                lists = Ragged(arrays.pop((name, "values")), arrays.pop((name, "offsets")))
                arrays[name] = convert.aligned(lists.to_dense(width, self.pad, name))
                arrays[(name, "lengths")] = convert.aligned(lists.lengths().astype(np.int32))
            rows = int(next(iter(arrays.values())).shape[0])
            if self.pad_last:
                arrays = self._padded(arrays, rows)
            tensors = convert.tensors_of(arrays)
        features = {
            n: (tensors[n], tensors[(n, "lengths")]) if n in self.widths else tensors[n]
            for n in self.features
        }
        labels: Any = None
        if len(self.labels) == 1:
            labels = tensors[self.labels[0]]
        elif self.labels:
            labels = {n: tensors[n] for n in self.labels}
        if self.pad_last:
            return features, labels, tensors["\0mask"]
        return features, labels

    def _padded(self, arrays: dict[Any, Any], rows: int) -> dict[Any, Any]:
        """Every array padded to ``batch_size`` rows, and the mask of the real rows."""
        size = self.batch_size
        mask = self.convert.empty((size,), np.bool_)
        mask[...] = True
        if rows == size:
            return {**arrays, "\0mask": mask}
        mask[rows:] = False
        out: dict[Any, Any] = {"\0mask": mask}
        for key, array in arrays.items():
            padded = self.convert.empty((size, *array.shape[1:]), array.dtype)
            padded[...] = self.pad if key in self.widths else 0
            padded[:rows] = array
            out[key] = padded
        return out
