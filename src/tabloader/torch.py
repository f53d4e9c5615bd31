"""PyTorch adapter: [`TorchAsyncItr`][tabloader.torch.TorchAsyncItr] yields ready ``(x_cat, x_cont,
y)`` batches, [`DLDataLoader`][tabloader.torch.DLDataLoader] runs it inside a
``torch.utils.data.DataLoader``.

Names and keywords are NVTabular's, so its training code runs unchanged. The core
[`Loader`][tabloader.Loader] delivers ``"stacked"`` ``[B, k]`` blocks and the tensors are
made from them without a copy, in the loader's background thread (see docs/torch.md).

Examples:
    >>> import pyarrow as pa
    >>> table = pa.table({"user": [1, 2, 3, 4, 5], "x": [.1, .2, .3, .4, .5]})
    >>> train = TorchAsyncItr(table, cats=["user"], conts=["x"], batch_size=2, device="cpu")
    >>> loader = DLDataLoader(train, collate_fn=lambda x: x)
    >>> len(loader), [tuple(x_cat.shape) for x_cat, x_cont, y in loader]
    (3, [(2, 1), (2, 1), (1, 1)])
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from tabloader import _deps

try:
    import torch
    import torch.distributed
    import torch.utils.data
except ImportError:
    raise _deps.missing("torch") from None

from tabloader.config import LOADER_KEYWORDS, LoaderOptions
from tabloader.dataset import Dataset
from tabloader.device import split_backend
from tabloader.epochs import EpochRun, IterableEpochs, quiet_copy, stateful_loader_state
from tabloader.errors import (
    GPUUnavailableError,
    InvalidArgumentError,
    PerformanceWarning,
    TabloaderError,
)
from tabloader.loader import Loader
from tabloader.options import keywords_of, ranks, reject_unknown
from tabloader.staging import staging_target
from tabloader.state import STATE_FORMAT_KEY
from tabloader.state import agreed_state as agreed_states
from tabloader.tensors import DTYPE_KEYWORDS, TorchBatchBuilder, TorchTensors
from tabloader.threads import thread_advice, usable_cores

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["DLDataLoader", "TorchAsyncItr", "agreed_state"]

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""``(x_cat, x_cont, y)``."""

_TENSORS = TorchTensors()


def _resolve_ranks(global_rank: int | None, global_size: int | None) -> tuple[int, int]:
    dist = torch.distributed
    initialised = dist.is_available() and dist.is_initialized()
    group = (dist.get_rank(), dist.get_world_size()) if initialised else None
    return ranks(global_rank, global_size, group, "torch.distributed")


class TorchAsyncItr(IterableEpochs, torch.utils.data.IterableDataset[Batch]):
    """Batches of ``(x_cat, x_cont, y)`` tensors from a dataset, one epoch per ``iter()``.

    ``x_cat`` is int64 ``[B, len(cats)]``, ``x_cont`` float32 ``[B, len(conts)]``, ``y``
    float32 ``[B]`` with one label, ``[B, len(labels)]`` with several (``cat_dtype``,
    ``cont_dtype``, ``label_dtype`` choose others, e.g. ``label_dtype="int64"`` for class
    indices); a kind without columns is ``[B, 0]``. With ``sparse_names`` an item is
    ``(x_cat, x_cont, y, lists)``: each list column as ``(values, offsets)`` for
    ``torch.nn.EmbeddingBag`` (``offsets`` of length ``B``), or padded with
    ``sparse_as_dense``. ``len()`` is the exact number of batches per epoch on this rank.
    Tensors share the loader's memory (an unshuffled column read as stored is copied, so
    in-place ops never write into Arrow's buffers).

    Args:
        dataset: A [`tabloader.Dataset`][tabloader.Dataset] or anything it accepts.
        cats, conts, labels: The columns of ``x_cat``, ``x_cont`` and ``y`` (by keyword,
            or by position as NVTabular's ``TorchAsyncItr`` takes them).
        batch_size: Rows per batch (required).
        device: ``None``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``, an int or a
            ``torch.device``, resolved once by the core
            ([`tabloader.Loader.device`][tabloader.Loader.device]); on a GPU the tensors come
            through DLPack.
        backend: ``None`` lets ``device`` decide; ``"gpu"`` insists on cudf and cupy;
            ``"cpu"`` reads in host memory, and with a CUDA ``device`` stages each batch
            through pinned memory on a side stream (for a GPU machine without cudf).
        seed_fn: NVTabular's alternative to ``seed``: returns the seed, called once per
            epoch in the training process; it must agree on all ranks.
        global_rank, global_size: Left out, from ``torch.distributed`` when initialised.
        **options: Every other [`tabloader.Loader`][tabloader.Loader] keyword, as documented there
            ([`tabloader.LoaderOptions`][tabloader.LoaderOptions]). An unknown keyword raises
            ``TypeError`` naming the closest known one.

    Every ``iter()`` in the training process starts epoch `epoch` and advances it;
    [`DLDataLoader`][tabloader.torch.DLDataLoader] does that for its worker processes.

    Examples:
        >>> import pyarrow as pa
        >>> table = pa.table({"item": [3, 1, 2, 5], "label": [1., 0., 1., 0.]})
        >>> itr = TorchAsyncItr(table, cats=["item"], labels=["label"], batch_size=4,
        ...                     shuffle=True, seed=1, device="cpu")
        >>> x_cat, x_cont, y = next(iter(itr))
        >>> x_cat.dtype, tuple(x_cat.shape), tuple(x_cont.shape), y.dtype
        (torch.int64, (4, 1), (4, 0), torch.float32)
        >>> sorted(x_cat[:, 0].tolist())
        [1, 2, 3, 5]
    """

    _rebuilt = ("_builder",)

    # cats, conts and labels are also LoaderOptions keys: parameters here too, so that
    # NVTabular's positional call (dataset, cats, conts, labels, batch_size) works
    def __init__(  # type: ignore[misc]
        self,
        dataset: Dataset | Any,
        cats: Sequence[str] | None = None,
        conts: Sequence[str] | None = None,
        labels: Sequence[str] | None = None,
        batch_size: int | None = None,
        *,
        device: str | int | torch.device | None = None,
        backend: Literal["cpu", "gpu"] | None = None,
        seed_fn: Callable[[], int] | None = None,
        **options: Unpack[LoaderOptions],
    ) -> None:
        known = (*keywords_of(TorchAsyncItr.__init__), *LOADER_KEYWORDS)
        reject_unknown(options, known, "TorchAsyncItr")
        if batch_size is None:
            raise InvalidArgumentError("TorchAsyncItr needs batch_size= (rows per batch)")
        named = {"cats": cats, "conts": conts, "labels": labels}
        options.update({k: v for k, v in named.items() if v is not None})
        super().__init__()
        self.backend = backend
        # The core decides where it reads; only backend="cpu" with a CUDA device splits
        # the two: the core reads on the host and batches are staged to the GPU.
        self._core_device, staging = split_backend(device, backend)
        self._stage_to = None if staging is False else staging_target(device, staging)
        for option in DTYPE_KEYWORDS.values():  # PyTorch users write torch dtypes
            if option in options:
                options[option] = _TENSORS.numpy_dtype(options[option], option)
        ranks = _resolve_ranks(options.pop("global_rank", None), options.pop("global_size", None))
        rank_options = {"global_rank": ranks[0], "global_size": ranks[1]}
        self._threads_checked = False
        self._keep_options({**options, **rank_options, "batch_size": batch_size}, seed_fn)
        self._start_epochs(self._make_loader(dataset), seed_fn)

    def _make_loader(self, dataset: Dataset | Any) -> Loader:
        self._builder = TorchBatchBuilder(_TENSORS)
        try:
            loader = Loader(
                dataset, **self._options, layout="stacked", device=self._core_device,
                transform=self._builder,
            )  # fmt: skip
        except GPUUnavailableError as err:
            if self.backend is not None:
                raise
            # A GPU without RAPIDS: PyTorch can still have the batches on the GPU.
            raise GPUUnavailableError(
                f"{err}; or pass backend='cpu' to read and shuffle on the CPU and copy "
                "each batch to the GPU (no cudf needed)"
            ) from err.__cause__
        self._core_device = str(loader.device)  # worker processes' copies read there too
        self.device = self._builder.set_loader(loader, self._options, self._stage_to)
        return loader

    def __setstate__(self, state: dict[str, Any]) -> None:
        with quiet_copy():  # a copy's warnings were shown where the original was built
            self._attach(self._make_loader(self._restore(state)))

    def _worker(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        return (0, 1) if info is None else (info.id, info.num_workers)

    def __iter__(self) -> EpochRun:
        """Start the next epoch (in a worker process: the worker's share of it)."""
        in_worker = torch.utils.data.get_worker_info() is not None
        if in_worker and self.device.type == "cuda":
            raise TabloaderError(
                f"TorchAsyncItr(device={str(self.device)!r}) cannot run in DataLoader worker "
                "processes (CUDA does not work there): use num_workers=0, or device='cpu'"
            )
        if not in_worker and not self._threads_checked:
            self._threads_checked = True  # once: the threads are as the training loop set them
            advice = thread_advice(torch.get_num_threads(), usable_cores())
            if advice is not None:
                warnings.warn(advice, PerformanceWarning, stacklevel=2)
        receive = self._builder.receive
        return self._epochs.start(*self._worker(), receive=receive, in_worker=in_worker)

    def __repr__(self) -> str:
        return f"TorchAsyncItr({self._loader!r}, device={str(self.device)!r})"


class DLDataLoader(torch.utils.data.DataLoader[Batch]):
    """A ``torch.utils.data.DataLoader`` for [`TorchAsyncItr`][tabloader.torch.TorchAsyncItr];
    ``len()`` is the dataset's batches per epoch.

    Every ``DataLoader`` keyword works. ``batch_size`` must stay None (the dataset yields
    whole batches); ``collate_fn=lambda x: x`` yields the dataset's tuples, the default
    collate lists. ``num_workers=N`` splits each epoch between N worker processes, which
    together deliver every row once and reshuffle every epoch (this loader advances the
    epoch for them; with ``persistent_workers=True`` each copy advances in step, and
    ``set_epoch()`` after they started raises); they need ``device="cpu"`` (use
    ``pin_memory=True``). It counts the batches it hands out, so the dataset's
    ``state_dict()`` says mid-epoch how far every worker got. See docs/torch.md, "Worker
    processes", and the module's example.
    """

    def __init__(self, dataset: Any, batch_size: int | None = None, **kwargs: Any) -> None:
        reject_unknown(kwargs, keywords_of(torch.utils.data.DataLoader.__init__), "DLDataLoader")
        if isinstance(dataset, (str, os.PathLike)) or (
            not isinstance(dataset, TorchAsyncItr)
            and type(dataset).__module__.split(".")[0] == "tabloader"
        ):
            raise InvalidArgumentError(
                f"DLDataLoader takes a TorchAsyncItr, got a {type(dataset).__name__}: pass "
                "DLDataLoader(TorchAsyncItr(data, batch_size=..., cats=..., ...), "
                "batch_size=None)"
            )
        if isinstance(dataset, TorchAsyncItr):
            if kwargs.get("drop_last"):
                raise InvalidArgumentError(
                    "DLDataLoader(drop_last=True) has no batches to drop: TorchAsyncItr yields "
                    "whole batches. Pass drop_last=True to TorchAsyncItr"
                )
            if batch_size is not None:
                raise InvalidArgumentError(
                    f"DLDataLoader(batch_size={batch_size!r}) would stack that many whole "
                    "batches: TorchAsyncItr yields batches already. Pass batch_size=None and "
                    "set the batch size on TorchAsyncItr"
                )
            workers = kwargs.get("num_workers", 0)
            if dataset.device.type == "cuda" and (workers or kwargs.get("pin_memory")):
                raise InvalidArgumentError(
                    f"TorchAsyncItr(device={str(dataset.device)!r}) delivers batches on the GPU "
                    "already: leave pin_memory out, and use num_workers=0, since CUDA does not "
                    "work in worker processes (batches are prepared in a background thread)"
                )
            if workers:
                dataset._epochs.check_workers(
                    kwargs.get("multiprocessing_context"),
                    persistent=bool(kwargs.get("persistent_workers")),
                )
        super().__init__(dataset, batch_size=batch_size, **kwargs)

    def __len__(self) -> int:
        if isinstance(self.dataset, TorchAsyncItr):
            return len(self.dataset)
        return super().__len__()

    def __iter__(self) -> Any:
        dataset = self.dataset
        if not isinstance(dataset, TorchAsyncItr) or self.num_workers == 0:
            return super().__iter__()
        # Worker processes copy the dataset when they start (inside super().__iter__(),
        # or at the first epoch only with persistent workers): the epochs keep them in step,
        # and count the batches handed out, for the dataset's state_dict().
        return dataset._epochs.hand_to_workers(
            super().__iter__,
            num_workers=self.num_workers,
            started=self._iterator is not None,
            in_order=getattr(self, "in_order", True),
        )


def agreed_state(source: Any, *, group: Any = None) -> dict[str, Any]:
    """The state of this job, the same on every rank: keep one (rank 0 writes it to the
    checkpoint) and resume every rank from it, on this number of ranks and worker
    processes or another (see ``TorchAsyncItr.load_state_dict``).

    Every rank calls it at the same step: it gathers each rank's state through
    ``torch.distributed`` (``group``: the default process group) and checks that they
    are one, so ranks that were not in step, or that load other data, are refused
    rather than saved (see [`tabloader.agreed_state`][tabloader.agreed_state]). Without
    a process group the job must have one rank.

    Args:
        source: The ``TorchAsyncItr``, a ``DLDataLoader`` over it (its worker processes'
            batches are counted as the loader hands them out), torchdata's
            ``StatefulDataLoader`` over it (its worker processes' states are merged into
            the job's; save with ``snapshot_every_n_steps=1``, the default), or a state
            dict of either.

    Raises:
        InvalidArgumentError: the ranks' states differ (the message names what and the
            ranks), or ``source`` is none of the above.

    Examples:
        >>> import pyarrow as pa
        >>> itr = TorchAsyncItr(pa.table({"id": list(range(10))}), cats=["id"], batch_size=4,
        ...                     device="cpu")
        >>> first = next(iter(itr))
        >>> state = agreed_state(itr)  # one rank, no process group
        >>> state["epoch"], state["batches"], state["global_size"]
        (0, 1, 1)
    """
    state = _job_state(source)
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        if state.get("global_size", 1) != 1:
            raise InvalidArgumentError(
                f"this job has {state['global_size']} ranks but no torch.distributed process "
                "group to gather their states: initialise one, or gather every rank's "
                "state_dict() yourself and pass the list to tabloader.agreed_state"
            )
        return agreed_states([state])
    states: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(states, state, group=group)
    return agreed_states(states)


def _job_state(source: Any) -> dict[str, Any]:
    """The state of this rank that ``source`` holds (see `agreed_state`)."""
    if isinstance(source, TorchAsyncItr):
        return source.state_dict()
    if isinstance(source, Mapping):
        return dict(source) if STATE_FORMAT_KEY in source else stateful_loader_state(source)
    dataset = getattr(source, "dataset", None)
    if isinstance(source, torch.utils.data.DataLoader) and isinstance(dataset, TorchAsyncItr):
        saved = getattr(source, "state_dict", None)
        if callable(saved):
            return stateful_loader_state(saved())
        if source.num_workers > 0 and not isinstance(source, DLDataLoader):
            # the batches come from copies of the iterator in the worker processes: this
            # process's copy has counted none of them
            raise InvalidArgumentError(
                f"agreed_state cannot tell how far a {type(source).__name__} with "
                f"num_workers={source.num_workers} got: its worker processes iterate "
                "copies of the TorchAsyncItr. Use tabloader.torch.DLDataLoader, or "
                "torchdata's StatefulDataLoader, which count the batches they hand out"
            )
        return dataset.state_dict()
    raise InvalidArgumentError(
        "agreed_state takes a TorchAsyncItr, a DLDataLoader or StatefulDataLoader over "
        f"one, or a state dict, got {type(source).__name__}"
    )
