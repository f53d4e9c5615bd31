"""Epochs handed out one ``iter()`` at a time, with seeds, worker shares and resuming.

The bookkeeping behind iterable-style adapters (PyTorch's ``IterableDataset``),
framework-agnostic: :class:`Epochs` keeps which epoch the next iteration delivers, the
seed of each epoch (a fixed seed, or ``seed_fn`` called once per epoch), where a resumed
run continues, and which worker process share a saved position belongs to;
:class:`EpochRun` is one epoch (or one worker's share of it) in progress, stateful in
torchdata's sense (``state_dict``/``load_state_dict``). The adapter only converts the
batches (the loader's ``transform``) and speaks its framework's protocol.

Examples:
    >>> import pyarrow as pa, tabloader
    >>> loader = tabloader.Loader(pa.table({"x": list(range(5))}), cats=["x"], batch_size=2)
    >>> epochs = Epochs(loader, seed_given=False)
    >>> run = epochs.start()
    >>> [b["x"].tolist() for b in run], epochs.epoch
    ([[0, 1], [2, 3], [4]], 1)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from tabloader.errors import InvalidArgumentError
from tabloader.loader import EpochPosition

if TYPE_CHECKING:
    from tabloader.loader import BatchIterator, Loader

__all__ = ["EpochRun", "Epochs", "seed_value"]

T = TypeVar("T")


def seed_value(value: object, what: str) -> int:
    """``value`` as a seed: a non-negative integer (numpy integers too, not bools).

    Examples:
        >>> seed_value(7, "seed_fn()")
        7
        >>> seed_value(-1, "seed_fn()")
        Traceback (most recent call last):
        ...
        tabloader.errors.InvalidArgumentError: seed_fn() must be a non-negative integer, got -1
    """
    try:
        seed = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        seed = -1
    if isinstance(value, bool) or seed < 0:
        raise InvalidArgumentError(f"{what} must be a non-negative integer, got {value!r}")
    return seed


class EpochRun:
    """One epoch (or one worker's share of it) in progress; ``len()`` is the batches still
    to come.

    :meth:`state_dict` says where it stands (the epoch, its seed and the batches handed
    out, in this process or worker); :meth:`load_state_dict` makes it continue a saved
    one instead. ``receive``, if given, is applied to each batch as it is handed out.
    """

    def __init__(
        self,
        epochs: Epochs,
        *,
        epoch: int,
        seed: int,
        start: int,
        worker: int,
        num_workers: int,
        receive: Callable[[Any], Any] | None = None,
    ) -> None:
        self._epochs = epochs
        self._receive = receive
        self.seed = seed
        self.worker, self.num_workers = worker, num_workers
        self._batches = self._start(epoch, start)
        self.position: EpochPosition = self._batches.position

    def _start(self, epoch: int, start: int) -> BatchIterator:
        loader = self._epochs.loader
        loader.seed = self.seed
        return loader.iter_epoch(
            epoch, worker=self.worker, num_workers=self.num_workers, start_batch=start
        )

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands (see :meth:`tabloader.Loader.state_dict`)."""
        return self._epochs.loader.epoch_state(
            self.position.epoch,
            self.position.batches,
            seed=self.seed,
            worker=self.worker,
            num_workers=self.num_workers,
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the epoch saved in ``state`` instead of this one."""
        epoch, batches, seed = self._epochs.check_state(state, self.worker, self.num_workers)
        current = (self.position.epoch, self.position.batches, self.seed)
        if current != (epoch, batches, seed) or self.position.finished:
            self._batches.close()
            self.seed = seed
            self._batches = self._start(epoch, batches)
            self.position = self._batches.position
        self._epochs.loader.epoch = epoch + 1
        self._epochs.live = self

    def __iter__(self) -> EpochRun:
        return self

    def __len__(self) -> int:
        return len(self._batches)

    def __next__(self) -> Any:
        item = next(self._batches)
        if self._receive is not None:
            return self._receive(item)
        return item

    def close(self) -> None:
        """Stop the background threads of this epoch."""
        self._batches.close()


class Epochs:
    """A loader's epochs, one per :meth:`start`: the epoch counter, each epoch's seed,
    resuming, and the epochs of worker processes that each hold a copy.

    Args:
        loader: The core loader; its ``epoch`` is the epoch the next :meth:`start`
            delivers.
        seed_fn: Called once per epoch (in :meth:`prepare`) for that epoch's seed;
            None: the loader's seed.
        seed_given: Whether the user fixed the seed; a saved state's seed is adopted
            only when not.
    """

    def __init__(
        self, loader: Loader, *, seed_fn: Callable[[], int] | None = None, seed_given: bool
    ) -> None:
        self.loader = loader
        self.seed_fn = seed_fn
        self.seed_given = seed_given
        self.base_seed = loader.seed
        """The seed copies of the loader are built with (a saved state's, once adopted)."""
        self.live: EpochRun | None = None  # the epoch start() last started here
        self.resume: EpochPosition | None = None  # where the next start() begins
        self.resume_for = (0, 1)  # (worker, num_workers) the resume state is for
        self.epoch_seed: int | None = None
        self.managed = False  # epochs advanced for worker processes (see hand_to_workers)
        self.epoch_set = False

    @property
    def epoch(self) -> int:
        """The epoch the next :meth:`start` delivers."""
        return self.loader.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next :meth:`start` deliver epoch ``epoch``."""
        self.loader.set_epoch(epoch)
        self.epoch_seed = None
        self.epoch_set = True

    def prepare(self) -> int:
        """Choose the seed of the next epoch (calling ``seed_fn`` once) and return it."""
        self.loader.refresh(self.loader.epoch)  # before worker processes copy the dataset
        if self.epoch_seed is None:
            if self.seed_fn is None:
                self.epoch_seed = self.loader.seed
            else:
                self.epoch_seed = seed_value(self.seed_fn(), "seed_fn()")
        return self.epoch_seed

    def advance(self) -> None:
        """The next epoch comes next (with a seed chosen afresh)."""
        self.loader.epoch += 1
        self.epoch_seed = None

    def start(
        self, worker: int = 0, num_workers: int = 1, receive: Callable[[Any], Any] | None = None
    ) -> EpochRun:
        """Start the next epoch (a resumed one where :meth:`load_state_dict` said), or
        worker ``worker``'s share of it, and advance."""
        seed = self.prepare()
        epoch, start = self.epoch, 0
        if self.resume is not None:
            epoch, start = self.resume.epoch, self.resume.batches
            if start and self.resume_for != (worker, num_workers):
                raise InvalidArgumentError(
                    f"this state was saved mid-epoch by worker {self.resume_for[0]} of "
                    f"{self.resume_for[1]} and cannot continue in worker {worker} of "
                    f"{num_workers}: resume with the same num_workers (with worker "
                    "processes, save and load through torchdata's StatefulDataLoader)"
                )
            self.resume = None
        self.live = EpochRun(
            self,
            epoch=epoch,
            seed=seed,
            start=start,
            worker=worker,
            num_workers=num_workers,
            receive=receive,
        )
        self.loader.epoch = epoch
        self.advance()
        return self.live

    def hand_to_workers(self, start_workers: Callable[[], T]) -> T:
        """Run ``start_workers`` (which copies this state into worker processes) with the
        next epoch's seed chosen first, and advance past that epoch afterwards."""
        self.prepare()
        self.managed = True
        started = start_workers()
        self.resume = None  # the worker processes took it with their copies
        self.advance()
        return started

    def check_workers(self, start_method: Any = None, *, persistent: bool = False) -> None:
        """Refuse worker processes (``persistent``: kept from epoch to epoch) that could
        not deliver these epochs: the dataset's own checks, then ``seed_fn`` and a
        refreshing dataset, which persistent copies would never see change."""
        if persistent and self.seed_fn is not None:
            raise InvalidArgumentError(
                "seed_fn cannot be used with persistent_workers=True: it would be called "
                "inside each worker process. Pass seed= instead, or persistent_workers=False"
            )
        self.loader.dataset.check_worker_processes(start_method)
        if persistent and self.loader.dataset.refreshes:
            raise InvalidArgumentError(
                "Dataset(refresh=True) cannot be used with persistent_workers=True: the "
                "worker processes keep the listing of the first epoch. Use "
                "persistent_workers=False"
            )

    # -- resuming -------------------------------------------------------------------

    def state_dict(self, worker: int = 0, num_workers: int = 1) -> dict[str, Any]:
        """Where the epochs stand: mid-epoch (the epoch last started has not ended) the
        next batch of that epoch, otherwise the start of the next epoch."""
        live = self.live
        if self.resume is not None:
            position, seed = self.resume, self.epoch_seed
            worker, num_workers = self.resume_for
        elif live is not None and not live.position.finished:
            position, seed = live.position, live.seed
            worker, num_workers = live.worker, live.num_workers
        else:
            position, seed = EpochPosition(self.epoch, 0), None
        return self.loader.epoch_state(
            position.epoch,
            position.batches,
            seed=self.loader.seed if seed is None else seed,
            worker=worker,
            num_workers=num_workers,
        )

    def load_state_dict(
        self, state: Mapping[str, Any], worker: int = 0, num_workers: int = 1
    ) -> None:
        """Make the next :meth:`start` continue from ``state`` (from :meth:`state_dict`)."""
        epoch, batches, _ = self.check_state(state, worker, num_workers)
        self.resume = EpochPosition(epoch, batches)
        self.resume_for = (worker, num_workers)
        self.loader.epoch = epoch
        self.epoch_set = True

    def check_state(
        self, state: Mapping[str, Any], worker: int, num_workers: int
    ) -> tuple[int, int, int]:
        """``(epoch, batches, seed)`` of ``state``, checked against the loader; the saved
        seed becomes the loader's (without ``seed_fn``) or the saved epoch's (with it)."""
        epoch, batches, seed = self.loader.check_state(
            state, adopt_seed=not self.seed_given, worker=worker, num_workers=num_workers
        )
        if self.seed_fn is None:
            self.loader.seed = self.base_seed = seed
            self.epoch_seed = None
        elif batches:
            self.epoch_seed = seed  # the saved epoch's seed; seed_fn chooses later ones
        return epoch, batches, seed

    # -- copies in worker processes ---------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["loader"]  # the owner rebuilds it and sets it again
        state["live"] = None  # an epoch in progress stays with its process
        return state
