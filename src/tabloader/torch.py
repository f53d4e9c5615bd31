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

import operator
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
from tabloader.errors import InvalidArgumentError, PerformanceWarning, TabloaderError
from tabloader.loader import BatchIterator, Loader

__all__ = ["DLDataLoader", "TorchAsyncItr"]

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""``(x_cat, x_cont, y)``."""

_KINDS = (("cats", torch.int64), ("conts", torch.float32), ("labels", torch.float32))


def _resolve_device(device: str | int | torch.device | None) -> torch.device:
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    if isinstance(device, bool):
        raise InvalidArgumentError(
            f"device must be 'cpu', 'cuda', 'cuda:N' or an int, got {device!r}"
        )
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InvalidArgumentError(
            f"device must be 'cpu', 'cuda', 'cuda:N' or an int, got {device!r}"
        ) from None
    if resolved.type == "cpu":
        return torch.device("cpu")
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
    initialised = torch.distributed.is_available() and torch.distributed.is_initialized()
    if global_rank is None and global_size is None:
        if initialised:
            return torch.distributed.get_rank(), torch.distributed.get_world_size()
        return 0, 1
    if global_rank is None or global_size is None:
        if not initialised:
            given = "global_size" if global_rank is None else "global_rank"
            missing = "global_rank" if global_rank is None else "global_size"
            raise InvalidArgumentError(
                f"{given} is given but {missing} is not, and torch.distributed is not "
                f"initialised to supply it: pass both global_rank= and global_size="
            )
        if global_rank is None:
            global_rank = torch.distributed.get_rank()
        if global_size is None:
            global_size = torch.distributed.get_world_size()
    return global_rank, global_size


def _seed_value(value: object, what: str) -> int:
    try:
        seed = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        seed = -1
    if isinstance(value, bool) or seed < 0:
        raise InvalidArgumentError(f"{what} must be a non-negative integer, got {value!r}")
    return seed


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
    """The core loader's ``transform``: a stacked batch dict in, ``(x_cat, x_cont, y)`` out."""

    def __init__(self, device: torch.device, stager: _CudaStager | None) -> None:
        self.device = device
        self.stager = stager

    def __call__(self, batch: dict[str, Any]) -> Any:
        rows = int(next(iter(batch.values())).shape[0])
        tensors = []
        for kind, dtype in _KINDS:
            block = batch.get(kind)
            if block is None:  # no columns of this kind: nothing to allocate or copy
                tensors.append(torch.empty((rows, 0), dtype=dtype, device=self.device))
            else:
                tensors.append(_as_tensor(block))
        x_cat, x_cont, y = tensors
        if y.shape[1] == 1:
            y = y[:, 0]
        if self.stager is not None:
            return self.stager.send((x_cat, x_cont, y))
        return x_cat, x_cont, y


class _Epoch:
    """One epoch of ``(x_cat, x_cont, y)`` in progress; ``len()`` is the batches still to come."""

    def __init__(self, batches: BatchIterator, stager: _CudaStager | None) -> None:
        self._batches = batches
        self._stager = stager

    def __iter__(self) -> _Epoch:
        return self

    def __len__(self) -> int:
        return len(self._batches)

    def __next__(self) -> Batch:
        item = next(self._batches)
        if self._stager is not None:
            return self._stager.receive(item)
        return item  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the background threads of this epoch."""
        self._batches.close()


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
        cats, conts, labels: Column names, as lists (see :class:`tabloader.Loader`).
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

    Where batches go:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, an int or a ``torch.device``.
            Default: the current CUDA device when CUDA is available, else ``"cpu"``.
            On a CUDA device, each batch is staged in pinned host memory and copied
            with ``non_blocking=True`` on a side stream from the background thread;
            the training stream waits for the copy only when it gets the batch.
        backend: ``"cpu"`` (default) reads and shuffles in host memory with pyarrow and
            numpy, whatever ``device`` is. ``"gpu"`` reads and shuffles on ``device``
            (which must be CUDA) with cudf and cupy (``pip install 'tabloader[gpu]'``);
            the batch arrays then already live on the GPU and become tensors through
            DLPack, with no copy and no staging.

    Distributed:
        global_rank, global_size: This process's rank and the number of ranks. When both
            are left out they come from ``torch.distributed`` if it is initialised
            (``get_rank()``, ``get_world_size()``), else 0 and 1. Every rank gets the
            same number of batches; the ranks' rows are disjoint, and at most
            ``global_size - 1`` rows sit out each epoch.

    NVTabular's ``sparse_names``, ``sparse_max`` and ``sparse_as_dense`` are accepted
    with their defaults only (tabloader delivers dense tensors); any other value raises.
    Unknown keywords raise ``TypeError``.

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
        shuffle: bool = False,
        shuffle_within_batch: bool = True,
        seed: int | None = None,
        seed_fn: Callable[[], int] | None = None,
        parts_per_chunk: int | None = None,
        chunk_rows: int | None = None,
        drop_last: bool = False,
        device: str | int | torch.device | None = None,
        backend: Literal["cpu", "gpu"] = "cpu",
        global_size: int | None = None,
        global_rank: int | None = None,
        fill_null: float | Mapping[str, float] | None = None,
        prefetch: int = 1,
        sparse_names: Sequence[str] | None = None,
        sparse_max: Mapping[str, int] | None = None,
        sparse_as_dense: bool = False,
    ) -> None:
        super().__init__()
        for name, value, default in (
            ("sparse_names", sparse_names, None),
            ("sparse_max", sparse_max, None),
            ("sparse_as_dense", sparse_as_dense, False),
        ):
            if value is not default:
                raise InvalidArgumentError(
                    f"{name}={value!r} is not supported: tabloader delivers dense tensors "
                    f"only. Leave {name} out"
                )
        if seed is not None and seed_fn is not None:
            raise InvalidArgumentError("give seed= or seed_fn=, not both")
        if seed_fn is not None and not callable(seed_fn):
            raise InvalidArgumentError(f"seed_fn must be callable, got {seed_fn!r}")
        if backend not in ("cpu", "gpu"):
            raise InvalidArgumentError(f"backend must be 'cpu' or 'gpu', got {backend!r}")
        self.device = _resolve_device(device)
        if backend == "gpu" and self.device.type != "cuda":
            raise InvalidArgumentError(
                f"backend='gpu' reads on the GPU and needs a CUDA device, got device="
                f"{device!r}. Use backend='cpu', or pass device='cuda'"
            )
        self.backend = backend
        global_rank, global_size = _resolve_ranks(global_rank, global_size)
        self._seed_fn = seed_fn
        self._options: dict[str, Any] = {
            "cats": cats,
            "conts": conts,
            "labels": labels,
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
        }
        self._loader = self._make_loader(dataset)
        # Keep the seed the core drew (seed=None), so copies in worker processes agree.
        self._options["seed"] = self._loader.seed
        self._epoch_seed: int | None = None
        self._epochs_managed = False  # DLDataLoader advances epochs for worker processes
        self._epoch_set = False

    def _make_loader(self, dataset: Dataset | Any) -> Loader:
        # Only the GPU backend reads on the device; the CPU backend's batches are copied
        # to it by the stager.
        core_device = f"cuda:{self.device.index}" if self.backend == "gpu" else "cpu"
        stage = self.device.type == "cuda" and self.backend == "cpu"
        self._builder = _BatchBuilder(self.device, _CudaStager(self.device) if stage else None)
        return Loader(
            dataset, **self._options, layout="stacked", device=core_device, transform=self._builder
        )

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
        self._loader.set_epoch(epoch)
        self._epoch_seed = None
        self._epoch_set = True

    def _prepare_epoch(self) -> int:
        """Choose the seed of the next epoch (calling ``seed_fn`` once) and return it."""
        self._loader.refresh(self._loader.epoch)  # before worker processes copy the dataset
        if self._epoch_seed is None:
            if self._seed_fn is None:
                self._epoch_seed = self._loader.seed
            else:
                self._epoch_seed = _seed_value(self._seed_fn(), "seed_fn()")
        return self._epoch_seed

    def _advance(self) -> None:
        self._loader.epoch += 1
        self._epoch_seed = None

    def __iter__(self) -> _Epoch:
        """Start the next epoch (in a worker process: the worker's share of it)."""
        info = torch.utils.data.get_worker_info()
        if info is not None and self.device.type == "cuda":
            raise TabloaderError(
                f"TorchAsyncItr(device={str(self.device)!r}) cannot run in DataLoader worker "
                "processes: CUDA does not work in forked workers. Use num_workers=0 (the "
                "loader already prepares batches in a background thread), or device='cpu'"
            )
        if info is not None and not self._epochs_managed and not self._epoch_set:
            warnings.warn(
                f"TorchAsyncItr runs in DataLoader worker processes, which cannot advance "
                f"the epoch of the training process: every epoch repeats epoch "
                f"{self.epoch}. Use tabloader.torch.DLDataLoader, or call set_epoch() "
                "before each epoch",
                stacklevel=2,
            )
        self._loader.seed = self._prepare_epoch()
        if info is None:
            batches = self._loader.iter_epoch(self.epoch)
        else:
            batches = self._loader.iter_epoch(
                self.epoch, worker=info.id, num_workers=info.num_workers
            )
        self._advance()
        return _Epoch(batches, self._builder.stager)

    # -- pickling (worker processes started with "spawn" or "forkserver") -----------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_builder"]
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
            self._loader = self._make_loader(dataset)
        self._loader.epoch = epoch

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
            if workers and kwargs.get("persistent_workers") and dataset._seed_fn is not None:
                raise InvalidArgumentError(
                    "seed_fn cannot be used with persistent_workers=True: it would be called "
                    "inside each worker process. Pass seed= instead, or persistent_workers=False"
                )
            if workers:
                dataset._loader.dataset.check_worker_processes(
                    kwargs.get("multiprocessing_context")
                )
            if workers and kwargs.get("persistent_workers") and dataset._loader.dataset.refreshes:
                raise InvalidArgumentError(
                    "Dataset(refresh=True) cannot be used with persistent_workers=True: the "
                    "worker processes keep the listing of the first epoch. Use "
                    "persistent_workers=False"
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
        # super().__iter__()): the seed is chosen and the epoch advanced here, in the
        # training process, around that moment.
        dataset._prepare_epoch()
        dataset._epochs_managed = True
        iterator = super().__iter__()
        dataset._advance()
        self._worker_epoch = dataset.epoch
        return iterator
