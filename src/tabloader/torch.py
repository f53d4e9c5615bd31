"""PyTorch adapter: :class:`TorchAsyncItr` yields ready ``(x_cat, x_cont, y)`` batches,
:class:`DLDataLoader` runs it inside a ``torch.utils.data.DataLoader``.

The names and keywords follow NVTabular's PyTorch data loader, so training code written
for it runs unchanged. Batches come from the core :class:`~tabloader.Loader` in its
``"stacked"`` layout: cats, conts and labels arrive as row-major ``[B, k]`` blocks, and
the tensors are made from them without a copy in the loader's background thread, so the
training thread only receives finished tensors.

Examples:
    >>> import pyarrow as pa, tabloader
    >>> from tabloader.torch import TorchAsyncItr, DLDataLoader
    >>> table = pa.table({"user": [1, 2, 3, 4, 5], "x": [.1, .2, .3, .4, .5],
    ...                   "y": [0., 1., 0., 1., 1.]})
    >>> train = TorchAsyncItr(tabloader.Dataset(table), cats=["user"], conts=["x"],
    ...                       labels=["y"], batch_size=2, device="cpu")
    >>> loader = DLDataLoader(train, batch_size=None, collate_fn=lambda x: x)
    >>> len(loader)
    3
    >>> [(tuple(c.shape), tuple(x.shape), tuple(y.shape)) for c, x, y in loader][-1]
    ((1, 1), (1, 1), (1,))
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

try:
    import torch
    import torch.distributed
    import torch.utils.data
    import torch.utils.dlpack
except ImportError:
    raise ImportError("tabloader.torch needs PyTorch: pip install 'tabloader[torch]'") from None

from tabloader.dataset import Dataset
from tabloader.epochs import EpochRun, Epochs
from tabloader.errors import (
    EmptyEpochWarning,
    InvalidArgumentError,
    PerformanceWarning,
    TabloaderError,
)
from tabloader.loader import Loader
from tabloader.options import keywords_of, one_spelling, ranks, reject_unknown

__all__ = ["DLDataLoader", "TorchAsyncItr"]

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""``(x_cat, x_cont, y)``."""

_KINDS = (("cats", torch.int64), ("conts", torch.float32), ("labels", torch.float32))


def _staging_target(device: object) -> torch.device:
    """The CUDA device the CPU backend's batches are copied to, as ``torch`` names it.

    Only for ``backend="cpu"`` with a CUDA ``device``: the core reads on the host and
    this adapter stages each batch to that GPU.
    """
    try:
        resolved = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError, ValueError):
        raise InvalidArgumentError(
            f"device must be 'cpu', 'cuda', 'cuda:N' or an int, got {device!r}"
        ) from None
    if resolved.type != "cuda":
        raise InvalidArgumentError(
            f"device must be 'cpu' or a CUDA device, got {device!r} ({resolved.type} is not "
            "supported)"
        )
    if not torch.cuda.is_available():
        raise InvalidArgumentError(
            f"device={device!r} needs CUDA, but torch.cuda.is_available() is False here. "
            "Pass device='cpu' (or leave device out)"
        )
    index: int | None = resolved.index  # None for a bare "cuda"
    return torch.device("cuda", torch.cuda.current_device() if index is None else index)


def _resolve_ranks(global_rank: int | None, global_size: int | None) -> tuple[int, int]:
    dist = torch.distributed
    initialised = dist.is_available() and dist.is_initialized()
    group = (dist.get_rank(), dist.get_world_size()) if initialised else None
    return ranks(global_rank, global_size, group, "torch.distributed")


def _worker() -> tuple[int, int]:
    """``(worker, num_workers)`` of this DataLoader worker process; ``(0, 1)`` outside one."""
    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def _as_tensor(array: Any) -> torch.Tensor:
    """A tensor sharing ``array``'s memory (host numpy, or device arrays via DLPack)."""
    if isinstance(array, np.ndarray):
        if not array.flags.writeable:
            # A read-only array is a view of Arrow's immutable buffers (no shuffle, one
            # column of the delivered dtype). A tensor over it would be writable, and an
            # in-place op on the batch would write into Arrow's memory: copy it instead.
            array = array.copy()
        return torch.from_numpy(array)
    if hasattr(array, "__dlpack__"):
        return torch.utils.dlpack.from_dlpack(array)
    return torch.as_tensor(array)  # __cuda_array_interface__ and the like, zero-copy


class _CudaStager:
    """Moves host batches to one CUDA device: pinned staging copy, then an asynchronous copy.

    :meth:`send` runs in the loader's background thread and enqueues the copies on a side
    stream; :meth:`receive` runs in the training thread and makes its current stream wait
    for them, so the copy overlaps the compute already queued on the training stream.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]

    def send(self, tensors: Batch) -> tuple[Batch, torch.cuda.Event]:
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            moved = tuple(
                t if t.device == self.device else t.pin_memory().to(self.device, non_blocking=True)
                for t in tensors
            )
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)
        return (moved[0], moved[1], moved[2]), done

    def receive(self, staged: tuple[Batch, torch.cuda.Event]) -> Batch:
        tensors, done = staged
        current = torch.cuda.current_stream(self.device)
        current.wait_event(done)
        for t in tensors:
            if t.numel():
                # Memory allocated on the side stream must not be reused before the
                # training stream is done with it.
                t.record_stream(current)
        return tensors


class _BatchBuilder:
    """The core loader's ``transform``: a stacked batch dict in, ``(x_cat, x_cont, y)`` out
    (and the list columns' tensors as a fourth item when there are any)."""

    def __init__(self, lists: Sequence[str] = ()) -> None:
        self.device = torch.device("cpu")
        self.stager: _CudaStager | None = None
        self.lists = tuple(lists)

    def set_device(self, device: torch.device, stager: _CudaStager | None) -> None:
        """Where the tensors go: the loader's device, or a GPU the stager copies to."""
        self.device = device
        self.stager = stager

    def __call__(self, batch: dict[str, Any]) -> Any:
        rows = int(next(iter(batch.values())).shape[0])
        made = {kind: _as_tensor(batch[kind]) for kind, _ in _KINDS if kind in batch}
        # A kind with no columns is an empty tensor where the others are.
        where = next(iter(made.values())).device if made else self.device
        tensors = [
            made[kind] if kind in made else torch.empty((rows, 0), dtype=dtype, device=where)
            for kind, dtype in _KINDS
        ]
        x_cat, x_cont, y = tensors
        if y.shape[1] == 1:
            y = y[:, 0]
        if self.lists:
            return x_cat, x_cont, y, _list_tensors(batch, self.lists)
        if self.stager is not None:
            return self.stager.send((x_cat, x_cont, y))
        return x_cat, x_cont, y


def _list_tensors(batch: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """List columns as tensors: a padded ``[B, max]`` tensor, or ``(values, offsets)`` with
    ``offsets`` of length ``B`` (each bag's start, without the final end), the form
    ``torch.nn.EmbeddingBag`` takes by default."""
    out: dict[str, Any] = {}
    for name in names:
        value = batch[name]
        if isinstance(value, tuple):
            values, offsets = value
            out[name] = (_as_tensor(values), _as_tensor(offsets[:-1]))
        else:
            out[name] = _as_tensor(value)
    return out


class TorchAsyncItr(torch.utils.data.IterableDataset[Batch]):
    """Batches of ``(x_cat, x_cont, y)`` tensors from a dataset, one epoch per ``iter()``.

    Each item is a whole batch: ``x_cat`` is int64 ``[B, len(cats)]``, ``x_cont`` float32
    ``[B, len(conts)]`` and ``y`` float32 ``[B]`` with one label or ``[B, len(labels)]``
    with several. A kind with no columns is an empty tensor of that dtype, ``[B, 0]``
    (so ``y`` is ``[B, 0]`` without labels). ``len()`` is the exact number of batches one
    epoch delivers to this rank. Wrap it in :class:`DLDataLoader`.

    Tensors share memory with the loader's arrays wherever the layout allows: the only
    copy is the one that builds the ``[B, k]`` blocks, made in the background thread.
    The exception: without shuffling, a kind with a single column that the file already
    stores in the delivered dtype would be a read-only view of Arrow memory; it is copied
    so that in-place operations on the batch stay safe.

    What to read:
        dataset: A :class:`tabloader.Dataset` or anything it accepts.
        cats, conts, labels: Column names, as lists (see :class:`tabloader.Loader`);
            ``cat_names``, ``cont_names``, ``label_names`` are accepted too (one name per
            option).
        cat_dtype, cont_dtype, label_dtype: The tensors' dtypes, as numpy dtypes
            (default int64, float32, float32; ``label_dtype="int64"`` for class indices).
        fill_null: Replacement for nulls, as in :class:`tabloader.Loader`.

    How to batch and shuffle:
        batch_size: Rows per batch (required).
        shuffle: Reshuffle partitions and rows every epoch. Default False.
        shuffle_within_batch: False keeps each shuffled batch's rows in stored order
            (same random batch composition, faster; see :class:`tabloader.Loader`).
        seed: Seed of the shuffle; the same seed and epoch give the same batches.
            None draws a fresh seed (not allowed with shuffle on several ranks).
        seed_fn: NVTabular's alternative to ``seed``: a callable returning a
            non-negative integer, called once per epoch in the process that creates the
            epoch (the training process, also when ``DLDataLoader`` uses worker
            processes). All ranks must return the same value, for example a seed that
            rank 0 draws and broadcasts. Give ``seed`` or ``seed_fn``, not both.
        parts_per_chunk, chunk_rows: Chunk size for shuffling, as in
            :class:`tabloader.Loader`. None of either (default): the core loader's
            default chunk size.
        drop_last: Drop each epoch's short last batch.
        prefetch: Chunks decoded ahead.
        cache, cache_dir, cache_max_bytes: Keep the decoded rows after the first epoch
            and serve later epochs from them (``shuffle="global"`` needs one); see
            :class:`tabloader.Loader` and docs/cache.md. Needs ``backend="cpu"``.

    Where batches go:
        device: ``None`` (default), ``"cpu"``, ``"cuda"``, ``"cuda:N"``, an int or a
            ``torch.device``. It is handed to the core :class:`tabloader.Loader`, which
            resolves it once (``None``: the GPU when cudf and cupy can run there, else
            the CPU; see :attr:`tabloader.Loader.device`), and the tensors are
            delivered on the device the loader resolved: on a GPU the batch arrays
            become tensors through DLPack, with no copy.
        backend: ``None`` (default) lets ``device`` decide, as above. ``"gpu"`` insists
            on reading with cudf and cupy (``pip install 'tabloader[gpu]'``).
            ``"cpu"`` reads and shuffles in host memory whatever ``device`` is; with a
            CUDA ``device`` each batch is then staged in pinned host memory and copied
            with ``non_blocking=True`` on a side stream from the background thread,
            and the training stream waits for the copy only when it gets the batch
            (for a GPU machine without cudf).

    Distributed:
        global_rank, global_size: This process's rank and the number of ranks. When both
            are left out they come from ``torch.distributed`` if it is initialised
            (``get_rank()``, ``get_world_size()``), else 0 and 1. Every rank gets the
            same number of batches; the ranks' rows are disjoint, and at most
            ``global_size - 1`` rows sit out each epoch.

    List (multi-hot) columns:
        sparse_names: List columns (NVTabular's keyword), also allowed in ``cats`` or
            ``conts``. With any, each item is ``(x_cat, x_cont, y, lists)``: ``x_cat`` and
            ``x_cont`` hold the scalar columns, and ``lists`` maps each list column to
            ``(values, offsets)``, ready for ``torch.nn.EmbeddingBag``: ``offsets`` has
            length ``B`` (each row's start, without the final end, EmbeddingBag's default
            ``include_last_offset=False``). On a GPU they come from the GPU backend
            (not from ``backend="cpu"`` staging).
        sparse_as_dense: Deliver each list column as an int64 (cats) or float32 (conts)
            ``[B, sparse_max[name]]`` tensor padded with ``sparse_pad`` instead.
        sparse_max: ``{name: most values per row}``; required with ``sparse_as_dense``;
            a longer list raises rather than being truncated.
        sparse_pad: Pad value of dense list columns (default 0).

    Unknown keywords raise ``TypeError`` naming the closest known one.

    Epochs: every ``iter()`` in the training process starts epoch :attr:`epoch` and
    advances it; :meth:`set_epoch` chooses the next one. With ``DLDataLoader`` worker
    processes the loader advances the epoch for them (see :class:`DLDataLoader`).

    Examples:
        >>> import pyarrow as pa, tabloader
        >>> table = pa.table({"item": [3, 1, 2, 5], "label": [1., 0., 1., 0.]})
        >>> itr = TorchAsyncItr(table, cats=["item"], labels=["label"], batch_size=4,
        ...                     shuffle=True, seed=1, device="cpu")
        >>> x_cat, x_cont, y = next(iter(itr))
        >>> x_cat.dtype, tuple(x_cat.shape), x_cont.dtype, tuple(x_cont.shape), y.dtype
        (torch.int64, (4, 1), torch.float32, (4, 0), torch.float32)
        >>> sorted(x_cat[:, 0].tolist())
        [1, 2, 3, 5]
    """

    def __init__(
        self,
        dataset: Dataset | Any,
        *,
        cats: Sequence[str] | None = None,
        conts: Sequence[str] | None = None,
        labels: Sequence[str] | None = None,
        batch_size: int,
        shuffle: bool | Literal["global"] = False,
        shuffle_within_batch: bool = True,
        seed: int | None = None,
        seed_fn: Callable[[], int] | None = None,
        parts_per_chunk: int | None = None,
        chunk_rows: int | None = None,
        drop_last: bool = False,
        device: str | int | torch.device | None = None,
        backend: Literal["cpu", "gpu"] | None = None,
        global_size: int | None = None,
        global_rank: int | None = None,
        fill_null: float | Mapping[str, float] | None = None,
        prefetch: int = 1,
        sparse_names: Sequence[str] | None = None,
        sparse_max: Mapping[str, int] | None = None,
        sparse_as_dense: bool = False,
        cache: Literal["memory", "disk"] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_max_bytes: int | None = None,
        sparse_pad: float = 0,
        cat_dtype: Any = "int64",
        cont_dtype: Any = "float32",
        label_dtype: Any = "float32",
        cat_names: Sequence[str] | None = None,
        cont_names: Sequence[str] | None = None,
        label_names: Sequence[str] | None = None,
        **unknown: Any,
    ) -> None:
        if unknown:
            reject_unknown(unknown, keywords_of(TorchAsyncItr.__init__), "TorchAsyncItr")
        super().__init__()
        if seed is not None and seed_fn is not None:
            raise InvalidArgumentError("give seed= or seed_fn=, not both")
        if seed_fn is not None and not callable(seed_fn):
            raise InvalidArgumentError(f"seed_fn must be callable, got {seed_fn!r}")
        if backend not in (None, "cpu", "gpu"):
            raise InvalidArgumentError(f"backend must be None, 'cpu' or 'gpu', got {backend!r}")
        if isinstance(device, bool):
            raise InvalidArgumentError(
                f"device must be 'cpu', 'cuda', 'cuda:N' or an int, got {device!r}"
            )
        self.backend = backend
        # Where the core reads is decided once, by the core (device=None: the GPU when
        # cudf can run, else the CPU). Only backend="cpu" with a CUDA device splits the
        # two: the core reads on the host and batches are staged to that GPU.
        self._core_device: Any = "cpu" if backend == "cpu" else device
        if backend == "gpu" and self._core_device is None:
            self._core_device = "cuda"
        staging = backend == "cpu" and device is not None and str(device) != "cpu"
        self._stage_to = _staging_target(device) if staging else None
        global_rank, global_size = _resolve_ranks(global_rank, global_size)
        self._options: dict[str, Any] = {
            "cats": one_spelling({"cats": cats, "cat_names": cat_names}),
            "conts": one_spelling({"conts": conts, "cont_names": cont_names}),
            "labels": one_spelling({"labels": labels, "label_names": label_names}),
            "cat_dtype": cat_dtype,
            "cont_dtype": cont_dtype,
            "label_dtype": label_dtype,
            "batch_size": batch_size,
            "shuffle": shuffle,
            "shuffle_within_batch": shuffle_within_batch,
            # The seed is replaced by seed_fn's every epoch; the core needs one meanwhile.
            "seed": 0 if seed_fn is not None else seed,
            "parts_per_chunk": parts_per_chunk,
            "chunk_rows": chunk_rows,
            "drop_last": drop_last,
            "global_rank": global_rank,
            "global_size": global_size,
            "fill_null": fill_null,
            "prefetch": prefetch,
            "cache": cache,
            "cache_dir": cache_dir,
            "cache_max_bytes": cache_max_bytes,
            "sparse_names": sparse_names,
            "sparse_max": sparse_max,
            "sparse_as_dense": sparse_as_dense,
            "sparse_pad": sparse_pad,
        }
        self._loader = self._make_loader(dataset)
        # Keep the seed the core drew (seed=None), so copies in worker processes agree.
        self._options["seed"] = self._loader.seed
        self._epochs = Epochs(self._loader, seed_fn=seed_fn, seed_given=seed is not None)

    def _make_loader(self, dataset: Dataset | Any) -> Loader:
        names = self._options["sparse_names"]
        lists = (names,) if isinstance(names, str) else tuple(names or ())
        self._builder = _BatchBuilder(lists)
        loader = Loader(
            dataset,
            **self._options,
            layout="stacked",
            device=self._core_device,
            transform=self._builder,
        )
        if self.backend == "gpu" and not loader.device.is_cuda:
            raise InvalidArgumentError(
                f"backend='gpu' reads on the GPU and needs a CUDA device, got device="
                f"{self._core_device!r}. Use backend='cpu', or pass device='cuda'"
            )
        # Rebuilt copies (worker processes) use the device this one resolved.
        self._core_device = str(loader.device)
        self.device = self._stage_to or torch.device(str(loader.device))
        stager = _CudaStager(self.device) if self._stage_to is not None else None
        if lists and stager is not None:
            raise InvalidArgumentError(
                f"list columns (sparse_names={names!r}) are not staged to {self.device} from "
                "host reads (backend='cpu'). Read on the GPU (leave backend out, with cudf "
                "installed), or pass device='cpu' and move the batch in the training loop "
                "(tensor.to('cuda', non_blocking=True))"
            )
        self._builder.set_device(self.device, stager)
        return loader

    # -- what the loader delivers -------------------------------------------------

    @property
    def cats(self) -> tuple[str, ...]:
        """The columns of ``x_cat``, in order."""
        return self._loader.cats

    @property
    def conts(self) -> tuple[str, ...]:
        """The columns of ``x_cont``, in order."""
        return self._loader.conts

    @property
    def labels(self) -> tuple[str, ...]:
        """The columns of ``y``, in order."""
        return self._loader.labels

    @property
    def batch_size(self) -> int:
        return self._loader.batch_size

    @property
    def global_rank(self) -> int:
        return self._loader.global_rank

    @property
    def global_size(self) -> int:
        return self._loader.global_size

    def __len__(self) -> int:
        """Batches one epoch delivers to this rank (all worker processes together)."""
        return len(self._loader)

    @property
    def loader(self) -> Loader:
        """The core :class:`~tabloader.Loader` behind this dataset (``loader.stats()``
        counts what this process iterated; worker processes keep their own)."""
        return self._loader

    # -- epochs ---------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` delivers."""
        return self._loader.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` deliver epoch ``epoch`` (like ``DistributedSampler``)."""
        self._epochs.set_epoch(epoch)

    def __iter__(self) -> EpochRun:
        """Start the next epoch (in a worker process: the worker's share of it)."""
        info = torch.utils.data.get_worker_info()
        if info is not None and self.device.type == "cuda":
            raise TabloaderError(
                f"TorchAsyncItr(device={str(self.device)!r}) cannot run in DataLoader worker "
                "processes: CUDA does not work in forked workers. Use num_workers=0 (the "
                "loader already prepares batches in a background thread), or device='cpu'"
            )
        if info is not None and not self._epochs.managed and not self._epochs.epoch_set:
            warnings.warn(
                f"TorchAsyncItr runs in DataLoader worker processes, which cannot advance "
                f"the epoch of the training process: every epoch repeats epoch "
                f"{self.epoch}. Use tabloader.torch.DLDataLoader, or call set_epoch() "
                "before each epoch",
                stacklevel=2,
            )
        stager = self._builder.stager
        return self._epochs.start(*_worker(), receive=None if stager is None else stager.receive)

    # -- resuming -------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where this dataset stands, to continue exactly there after a restart.

        Mid-epoch (the epoch ``iter()`` last started has not ended) it points at the
        next batch of that epoch; otherwise at the start of the next epoch. Batches
        read ahead in the background do not count, only those handed out. Inside a
        ``DataLoader`` worker process it is that worker's state; torchdata's
        ``StatefulDataLoader`` collects the workers' states and restores them (see
        docs/torch.md, "Resume after pre-emption").
        """
        return self._epochs.state_dict(*_worker())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next ``iter()`` continue from ``state`` (from :meth:`state_dict`).

        Raises :class:`tabloader.InvalidArgumentError` naming what differs when the
        dataset or the options that decide the order are not those of the saved run.
        """
        self._epochs.load_state_dict(state, *_worker())

    # -- pickling (worker processes started with "spawn" or "forkserver") -----------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_builder"]
        state["_options"] = {**self._options, "seed": self._epochs.base_seed}
        loader = state.pop("_loader")
        state["_dataset"] = loader.dataset
        state["_epoch"] = loader.epoch
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        dataset = state.pop("_dataset")
        epoch = state.pop("_epoch")
        self.__dict__.update(state)
        with warnings.catch_warnings():  # already shown where the original was built
            warnings.simplefilter("ignore", PerformanceWarning)
            warnings.simplefilter("ignore", EmptyEpochWarning)
            self._loader = self._make_loader(dataset)
        self._loader.epoch = epoch
        self._epochs.loader = self._loader

    def __repr__(self) -> str:
        return (
            f"TorchAsyncItr(batch_size={self.batch_size}, cats={len(self.cats)}, "
            f"conts={len(self.conts)}, labels={len(self.labels)}, "
            f"shuffle={self._loader.shuffle}, rank={self.global_rank}/{self.global_size}, "
            f"device={str(self.device)!r}, backend={self.backend!r}, batches={len(self)})"
        )


class DLDataLoader(torch.utils.data.DataLoader[Batch]):
    """A ``torch.utils.data.DataLoader`` for :class:`TorchAsyncItr`.

    ``len()`` is the dataset's number of batches per epoch. Every ``DataLoader`` keyword
    works; with a :class:`TorchAsyncItr`:

    - ``batch_size`` must be None (the default here): the dataset yields whole batches.
    - ``collate_fn=lambda x: x`` yields each batch as the dataset's tuple
      ``(x_cat, x_cont, y)``. Without ``collate_fn``, PyTorch's default conversion
      yields the same tensors in a list ``[x_cat, x_cont, y]``; unpacking
      (``for x_cat, x_cont, y in loader``) works the same with both.
    - ``num_workers=N`` splits every epoch between N worker processes: each reads a
      disjoint, contiguous run of the rank's batches and together they deliver every
      row once. This loader advances the dataset's epoch in the training process each
      time it starts one, so worker processes reshuffle every epoch. With
      ``persistent_workers=True`` each worker advances its own copy in step; calling
      ``set_epoch()`` (or iterating the dataset directly) after the workers started
      raises, because the workers cannot see it, and ``seed_fn`` is refused since it
      could only be called inside the workers. Worker processes need ``device="cpu"``
      (use ``pin_memory=True`` here and move batches to the GPU in the loop).
    - ``pin_memory=True`` pins host batches; it is refused when the dataset already
      delivers to a CUDA device.

    Examples:
        >>> import pyarrow as pa, tabloader
        >>> from tabloader.torch import TorchAsyncItr
        >>> itr = TorchAsyncItr(pa.table({"x": [1., 2., 3.]}), conts=["x"], batch_size=2,
        ...                     device="cpu")
        >>> [type(b).__name__ for b in DLDataLoader(itr)]
        ['list', 'list']
    """

    def __init__(self, dataset: Any, batch_size: int | None = None, **kwargs: Any) -> None:
        reject_unknown(kwargs, keywords_of(torch.utils.data.DataLoader.__init__), "DLDataLoader")
        if isinstance(dataset, TorchAsyncItr):
            if batch_size is not None:
                raise InvalidArgumentError(
                    f"DLDataLoader(batch_size={batch_size!r}) would stack that many whole "
                    "batches: TorchAsyncItr yields batches already. Pass batch_size=None and "
                    "set the batch size on TorchAsyncItr"
                )
            workers = kwargs.get("num_workers", 0)
            if workers and dataset.device.type == "cuda":
                raise InvalidArgumentError(
                    f"num_workers={workers} with TorchAsyncItr(device="
                    f"{str(dataset.device)!r}): CUDA does not work in worker processes. Use "
                    "num_workers=0 (batches are prepared in a background thread already), or "
                    "device='cpu' with pin_memory=True"
                )
            if kwargs.get("pin_memory") and dataset.device.type == "cuda":
                raise InvalidArgumentError(
                    "pin_memory=True, but TorchAsyncItr already delivers batches on "
                    f"{dataset.device}, staged through pinned memory. Leave pin_memory out"
                )
            if workers:
                dataset._epochs.check_workers(
                    kwargs.get("multiprocessing_context"),
                    persistent=bool(kwargs.get("persistent_workers")),
                )
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        self._worker_epoch: int | None = None

    def __len__(self) -> int:
        if isinstance(self.dataset, TorchAsyncItr):
            return len(self.dataset)
        return super().__len__()

    def __iter__(self) -> Any:
        dataset = self.dataset
        if not isinstance(dataset, TorchAsyncItr) or self.num_workers == 0:
            return super().__iter__()
        if self._iterator is not None and dataset.epoch != self._worker_epoch:
            raise TabloaderError(
                f"the persistent worker processes will run epoch {self._worker_epoch}, but "
                f"the dataset was moved to epoch {dataset.epoch} (set_epoch() or a direct "
                "iteration) after they started, which they cannot see. Call set_epoch() "
                "before the first epoch only, or use persistent_workers=False"
            )
        # Worker processes get a copy of the dataset when they start (inside
        # super().__iter__()): the seed is chosen and the epoch advanced around that.
        iterator = dataset._epochs.hand_to_workers(super().__iter__)
        self._worker_epoch = dataset.epoch
        return iterator
