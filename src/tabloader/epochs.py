"""Epochs handed out one ``iter()`` at a time, with seeds, worker shares and resuming.

The bookkeeping behind iterable-style adapters (PyTorch's ``IterableDataset``),
framework-agnostic: `Epochs` keeps which epoch the next iteration delivers, the
seed of each epoch (a fixed seed, or ``seed_fn`` called once per epoch), where a resumed
run continues, and which worker process share a saved position belongs to;
`EpochRun` is one epoch (or one worker's share of it) in progress, stateful in
torchdata's sense (``state_dict``/``load_state_dict``), and `stateful_loader_state`
reads a rank's state out of a torchdata ``StatefulDataLoader``'s. The adapter only
converts the batches (the loader's ``transform``) and speaks its framework's protocol.

Examples:
    >>> import pyarrow as pa, tabloader
    >>> loader = tabloader.Loader(pa.table({"x": list(range(5))}), cats=["x"], batch_size=2)
    >>> epochs = Epochs(loader, seed_given=False)
    >>> run = epochs.start()
    >>> [b["x"].tolist() for b in run], epochs.epoch
    ([[0, 1], [2, 3], [4]], 1)
"""

from __future__ import annotations

import contextlib
import operator
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tabloader.elastic import round_robin
from tabloader.errors import CacheWarning, InvalidArgumentError, TabloaderError
from tabloader.options import int_at_least
from tabloader.state import STATE_FORMAT_KEY, Cursor, Position, merge_worker_states

if TYPE_CHECKING:
    from tabloader.loader import Loader

__all__ = [
    "CountedBatches",
    "EpochRun",
    "Epochs",
    "HandedEpoch",
    "IterableEpochs",
    "check_seed_fn",
    "quiet_copy",
    "seed_value",
    "stateful_loader_state",
]

T = TypeVar("T")


def check_seed_fn(seed: object, seed_fn: object) -> None:
    """Refuse ``seed`` and ``seed_fn`` together, and a ``seed_fn`` that is not callable."""
    if seed is not None and seed_fn is not None:
        raise InvalidArgumentError("give seed= or seed_fn=, not both")
    if seed_fn is not None and not callable(seed_fn):
        raise InvalidArgumentError(f"seed_fn must be callable, got {seed_fn!r}")


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

    `state_dict` says where it stands (the epoch, its seed and the batches handed
    out, in this process or worker); `load_state_dict` makes it continue a saved
    one instead. ``receive``, if given, is applied to each batch as it is handed out.
    """

    def __init__(
        self, epochs: Epochs, start: Cursor, *, receive: Callable[[Any], Any] | None = None
    ) -> None:
        """Start at ``start``: its epoch, seed, worker share and batches already delivered."""
        self._epochs = epochs
        self._receive = receive
        self._batches = epochs.loader.iter_epoch(start)

    @property
    def cursor(self) -> Cursor:
        """Where this epoch stands."""
        return self._batches.cursor

    @property
    def position(self) -> Cursor:
        """The same as `cursor`."""
        return self._batches.cursor

    @property
    def finished(self) -> bool:
        """Whether the epoch ended."""
        return self._batches.finished

    @property
    def over(self) -> bool:
        """Whether the epoch is over: ended, or its last batch handed out."""
        return self._batches.over

    @property
    def seed(self) -> int:
        """The seed this epoch is shuffled with."""
        return self.cursor.seed

    @property
    def worker(self) -> int:
        return self.cursor.worker

    @property
    def num_workers(self) -> int:
        return self.cursor.num_workers

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands (see
        [`tabloader.Loader.state_dict`][tabloader.Loader.state_dict]): in one of several
        worker processes, this worker's share alone."""
        return self._epochs.state_of(self.cursor.position(global_size=self._epochs.global_size))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the epoch saved in ``state`` instead of this one."""
        position = self._epochs.check_state(state)
        saved = self._epochs.loader.resume_at(
            position, worker=self.worker, num_workers=self.num_workers
        )
        if saved != self.cursor or self.finished:
            self._batches.close()
            self._batches = self._epochs.loader.iter_epoch(saved)
        self._epochs.continued(self, saved)

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


class HandedEpoch:
    """An epoch handed to worker processes, seen from the training process: where each
    worker share starts, and how many batches of theirs were handed out (written by its
    `CountedBatches` only)."""

    def __init__(self, starts: Sequence[Cursor], batches: Sequence[int], *, in_order: bool) -> None:
        self.starts = list(starts)
        self.batches = list(batches)
        """The batches each worker share delivers from its start."""
        self.in_order = in_order
        self.served = 0
        self.finished = False

    @property
    def over(self) -> bool:
        """Whether the epoch is over: ended, or its last batch handed out (a loop of
        ``len()`` steps never asks past it). An epoch with no batch is not over before
        it is asked for one (as `tabloader.iterator.EpochProgress.over`)."""
        return self.finished or 0 < sum(self.batches) <= self.served

    def position(self, global_size: int) -> Position:
        """Where the job of ``global_size`` ranks stands: taken from the workers in turn,
        each worker share has handed out its share of the batches served (see
        [`round_robin`][tabloader.elastic.round_robin])."""
        first = self.starts[0]
        if not self.in_order and self.served:
            raise InvalidArgumentError(
                "the DataLoader takes batches from its worker processes as they come "
                "(in_order=False), so which worker delivered which batch is not known "
                "mid-epoch: save at the end of an epoch, or use in_order=True"
            )
        left = self.batches
        taken = round_robin(left, min(self.served, sum(left)))
        done = [start.batches + n for start, n in zip(self.starts, taken, strict=True)]
        return Position(
            first.epoch, first.seed, global_size, len(self.starts), tuple(done), first.legs
        )


class CountedBatches(Generic[T]):
    """The batches of an epoch run by worker processes, counted in its `HandedEpoch` as
    they are handed out."""

    def __init__(self, batches: Iterator[T], handed: HandedEpoch) -> None:
        self._batches = batches
        self._handed = handed

    def __iter__(self) -> CountedBatches[T]:
        return self

    def __next__(self) -> T:
        try:
            item = next(self._batches)
        except StopIteration:
            self._handed.finished = True
            raise
        self._handed.served += 1
        return item

    def __len__(self) -> int:
        return len(self._batches)  # type: ignore[arg-type]


class Epochs:
    """A loader's epochs, one per `start`: the epoch counter, each epoch's seed,
    resuming, and the epochs of worker processes that each hold a copy.

    The position is this object's own (`cursor`): it reads the loader (its plans,
    batch counts and fingerprint) and never writes it.

    Args:
        loader: The core loader; its ``epoch`` and ``seed`` are where these epochs start.
        seed_fn: Called once per epoch (in `prepare`) for that epoch's seed;
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
        self.cursor = Cursor(loader.epoch, loader.seed)
        """The epoch the next `start` delivers, and the seed of epochs without ``seed_fn``
        (a saved state's, once adopted)."""
        self.live: EpochRun | None = None  # the epoch start() last started here
        self.resume: Position | None = None  # where the next start() begins
        self.handed: HandedEpoch | None = None  # the epoch worker processes run (training process)
        self.epoch_seed: int | None = None
        self.managed = False  # epochs advanced for worker processes (see hand_to_workers)
        self.worker_epoch = 0  # the epoch persistent worker processes run next
        self.epoch_set = False

    @property
    def epoch(self) -> int:
        """The epoch the next `start` delivers."""
        return self.cursor.epoch

    @property
    def global_size(self) -> int:
        """The number of ranks."""
        return self.loader.config.global_size

    @property
    def base_seed(self) -> int:
        """The seed copies of the loader are built with (a saved state's, once adopted)."""
        return self.cursor.seed

    def attach(self, loader: Loader) -> None:
        """Serve the epochs with ``loader`` (a copy rebuilt in a worker process)."""
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        """Make the next `start` deliver epoch ``epoch``: from its start, unless a loaded
        state continues that epoch (a state of another epoch is dropped). An epoch left
        unfinished is given up: `state_dict` points where the next `start` begins."""
        epoch = int_at_least(epoch, 0, "epoch")
        if self.resume is not None and self.resume.epoch != epoch:
            self.resume = None
        self.live = self.handed = None
        if epoch != self.cursor.epoch or self.resume is None:
            self.epoch_seed = None
        self.cursor = replace(self.cursor, epoch=epoch)
        self.epoch_set = True

    def prepare(self) -> int:
        """Choose the seed of the next epoch (calling ``seed_fn`` once) and return it."""
        self.loader.refresh(self.epoch)  # before worker processes copy the dataset
        if self.epoch_seed is None:
            if self.seed_fn is None:
                self.epoch_seed = self.base_seed
            else:
                self.epoch_seed = seed_value(self.seed_fn(), "seed_fn()")
        return self.epoch_seed

    def advance(self) -> None:
        """The next epoch comes next (with a seed chosen afresh)."""
        self.cursor = self.cursor.next_epoch()
        self.epoch_seed = None

    def start(
        self,
        worker: int = 0,
        num_workers: int = 1,
        receive: Callable[[Any], Any] | None = None,
        *,
        in_worker: bool = False,
    ) -> EpochRun:
        """Start the next epoch (a resumed one where `load_state_dict` said), or
        worker ``worker``'s share of it, and advance.

        ``in_worker``: this runs in a worker process's copy. Unless the training process
        hands it each epoch (`hand_to_workers`) or the epoch was set, every epoch
        would repeat the same one, and a warning says so.
        """
        if in_worker and not self.managed and not self.epoch_set:
            warnings.warn(
                "the dataset runs in worker processes, which cannot advance the epoch of "
                f"the training process: every epoch repeats epoch {self.epoch}. Use "
                "tabloader.torch.DLDataLoader, or call set_epoch() before each epoch",
                stacklevel=3,
            )
        start = self._start_of(worker, num_workers)
        self.resume = self.handed = None
        self.live = EpochRun(self, start, receive=receive)
        self.cursor = replace(self.cursor, epoch=start.epoch)
        self.advance()
        return self.live

    def batches_next(self) -> int:
        """Batches the next `start` delivers to this rank (all worker shares together):
        after `load_state_dict`, those of the resumed epoch still to come."""
        if self.resume is None:
            return len(self.loader)
        start = self.loader.resume_at(self.resume, worker=0, num_workers=1)
        return self.loader.cursor_plan(start).num_batches

    def _start_of(self, worker: int, num_workers: int) -> Cursor:
        """Where worker share ``worker`` of ``num_workers`` starts the next epoch (a resumed
        one where `load_state_dict` said), its seed chosen (`prepare`)."""
        seed = self.prepare()
        if self.resume is None:
            return Cursor(self.epoch, seed, 0, worker, num_workers)
        start = self.loader.resume_at(self.resume, worker=worker, num_workers=num_workers)
        return replace(start, seed=seed)

    def continued(self, run: EpochRun, saved: Cursor) -> None:
        """``run`` now continues ``saved`` (`EpochRun.load_state_dict`): the epoch after
        it comes next."""
        self.cursor = replace(self.cursor, epoch=saved.epoch + 1)
        self.live = run

    def hand_to_workers(
        self,
        start_workers: Callable[[], Iterator[T]],
        *,
        num_workers: int,
        started: bool = False,
        in_order: bool = True,
    ) -> CountedBatches[T]:
        """Run ``start_workers`` (which copies this state into ``num_workers`` worker
        processes, or with persistent workers that ``started`` already, has each copy
        advance in step) with the next epoch's seed chosen first, and advance past that
        epoch afterwards. Returns the workers' batches, counted as they are handed out
        (taken from the workers in turn when ``in_order``), so that `state_dict` says
        where the epoch stands."""
        if started and self.resume is not None:
            raise TabloaderError(
                f"a state was loaded (epoch {self.resume.epoch}) after the persistent worker "
                "processes started, and they cannot see it: they would deliver the whole "
                "epoch again. Load the state before the first epoch (the worker processes "
                "copy it when they start), build a new DataLoader, or use "
                "persistent_workers=False"
            )
        if started and self.epoch != self.worker_epoch:
            raise TabloaderError(
                f"the persistent worker processes will run epoch {self.worker_epoch}, but "
                f"the dataset was moved to epoch {self.epoch} (set_epoch() or a direct "
                "iteration) after they started, which they cannot see. Call set_epoch() "
                "before the first epoch only, or use persistent_workers=False"
            )
        # where each worker starts, as each works it out in its copy (refused here first)
        starts = [self._start_of(w, num_workers) for w in range(num_workers)]
        self.managed = True
        workers = start_workers()
        self.resume = None  # the worker processes took it with their copies
        batches = [self.loader.cursor_plan(start).num_batches for start in starts]
        self.handed = HandedEpoch(starts, batches, in_order=in_order)
        self.live = None
        self.advance()
        self.worker_epoch = self.epoch
        return CountedBatches(workers, self.handed)

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
        if not persistent and self.loader.config.cache_mode == "memory":
            warnings.warn(
                'cache="memory" is kept by each worker process, and a DataLoader without '
                "persistent_workers=True starts them anew every epoch: every epoch decodes "
                "the files and fills caches that are then thrown away. Pass "
                'persistent_workers=True, or cache="disk" (the workers share its files)',
                CacheWarning,
                stacklevel=4,
            )
        if persistent and self.loader.dataset.refreshes:
            raise InvalidArgumentError(
                "Dataset(refresh=True) cannot be used with persistent_workers=True: the "
                "worker processes keep the listing of the first epoch. Use "
                "persistent_workers=False"
            )

    # -- resuming -------------------------------------------------------------------

    def state_dict(self, worker: int = 0, num_workers: int = 1) -> dict[str, Any]:
        """Where the epochs stand: mid-epoch (the epoch last started has not ended) the
        next batch of that epoch, otherwise the start of the next epoch. In worker
        process ``worker`` of ``num_workers``, that worker's share alone; in the training
        process, the whole job's (worker processes' batches counted as handed out)."""
        live, handed = self.live, self.handed
        if self.resume is not None:
            seed = self.base_seed if self.epoch_seed is None else self.epoch_seed
            position = replace(self.resume, seed=seed)
        elif live is not None and not live.over:
            position = live.cursor.position(global_size=self.global_size)
        elif handed is not None and not handed.over:
            position = handed.position(self.global_size)
        else:
            at = replace(self.cursor, worker=worker, num_workers=num_workers)
            position = at.position(global_size=self.global_size)
        return self.state_of(position)

    def state_of(self, position: Position) -> dict[str, Any]:
        """``position`` as a state dict of this loader's."""
        return position.to_state(self.loader.fingerprint(position.epoch))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next `start` continue from ``state`` (from `state_dict`), in whichever
        worker share it runs."""
        saved = self.check_state(state)
        self.resume = saved
        self.cursor = replace(self.cursor, epoch=saved.epoch)
        self.epoch_set = True

    def check_state(self, state: Mapping[str, Any]) -> Position:
        """The position ``state`` holds, checked against the loader (see
        [`Loader.saved_position`][tabloader.Loader.saved_position]); the saved seed becomes
        the seed of every epoch (without ``seed_fn``) or of the saved epoch (with it)."""
        saved = self.loader.saved_position(
            state, seed=self.base_seed, adopt_seed=not self.seed_given
        )
        if self.seed_fn is None:
            self.cursor = replace(self.cursor, seed=saved.seed)
            self.epoch_seed = None
        elif saved.started:
            self.epoch_seed = saved.seed  # the saved epoch's seed; seed_fn chooses later ones
        return saved

    # -- copies in worker processes ---------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["loader"]  # the owner rebuilds it and sets it again
        state["live"] = None  # an epoch in progress stays with its process
        state["handed"] = None
        return state


class IterableEpochs:
    """What an iterable-style adapter (PyTorch's ``IterableDataset``) shares with the
    core: the loader built from the user's options, its columns and batch counts, the
    epochs and their seeds, resuming, and the copies worker processes make.

    The adapter drives, the core never calls it back: it hands the user's options to
    `_keep_options`, builds its loader from ``self._options`` (the core loader with the
    adapter's ``transform``) and starts the epochs on it (`_start_epochs`). A worker
    process's copy leaves out the loader and the attributes listed in ``_rebuilt``; the
    adapter's ``__setstate__`` builds them anew from the dataset `_restore` gives back
    and attaches the loader (`_attach`). `_worker` says which worker process share of an
    epoch this process serves.
    """

    _rebuilt: tuple[str, ...] = ()
    _loader: Loader
    _epochs: Epochs
    _options: dict[str, Any]

    def _keep_options(self, options: Mapping[str, Any], seed_fn: Callable[[], int] | None) -> None:
        """Keep the loader's options (``self._options``), checked against ``seed_fn``."""
        seed = options.get("seed")
        check_seed_fn(seed, seed_fn)
        # The seed is replaced by seed_fn's every epoch; the core needs one meanwhile.
        self._options = {**options, "seed": 0 if seed_fn is not None else seed}

    def _start_epochs(self, loader: Loader, seed_fn: Callable[[], int] | None) -> None:
        """Start the epochs on ``loader``, built from ``self._options``."""
        given = seed_fn is None and self._options["seed"] is not None
        self._loader = loader
        # Keep the seed the core drew (seed=None), so copies in worker processes agree.
        self._options["seed"] = loader.seed
        self._epochs = Epochs(loader, seed_fn=seed_fn, seed_given=given)

    def _worker(self) -> tuple[int, int]:
        """``(worker, num_workers)`` of the worker process this one is; ``(0, 1)``."""
        return 0, 1

    @property
    def loader(self) -> Loader:
        """The core [`Loader`][tabloader.Loader] (``loader.stats()`` counts what this
        process iterated; worker processes keep their own)."""
        return self._loader

    @property
    def cats(self) -> tuple[str, ...]:
        """The categorical columns, in order."""
        return self._loader.cats

    @property
    def conts(self) -> tuple[str, ...]:
        """The continuous columns, in order."""
        return self._loader.conts

    @property
    def labels(self) -> tuple[str, ...]:
        """The label columns, in order."""
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
        """Batches one epoch delivers to this rank (all worker processes together); after
        `load_state_dict`, those of the resumed epoch still to come."""
        return self._epochs.batches_next()

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` delivers."""
        return self._epochs.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` deliver epoch ``epoch`` (like ``DistributedSampler``):
        from its start, unless a loaded state continues that epoch."""
        self._epochs.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where the epochs stand, to continue exactly there after a restart: mid-epoch
        the next batch handed out (not those read ahead), otherwise the start of the
        next epoch. In the training process, the whole job's (with worker processes
        started by ``DLDataLoader``, the batches it handed out of each), the same on
        every rank: keep one (see ``agreed_state``). In a worker process, that worker's
        share alone.
        """
        return self._epochs.state_dict(*self._worker())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next ``iter()`` continue from ``state`` (from `state_dict`), on this
        number of ranks and worker processes or another (see
        [`Loader.load_state_dict`][tabloader.Loader.load_state_dict]).

        Raises [`tabloader.InvalidArgumentError`][tabloader.errors.InvalidArgumentError] naming what
        differs when the dataset or the options that decide the order are not those of the saved
        run.
        """
        self._epochs.load_state_dict(state)

    def close(self) -> None:
        """Stop the epochs in progress (an epoch left with a ``break`` keeps reading ahead
        until the next ``iter()``) and give back the memory the loader holds for them (see
        [`Loader.close`][tabloader.Loader.close]); the next ``iter()`` starts again."""
        self._loader.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in self._rebuilt:
            del state[name]
        state["_options"] = {**self._options, "seed": self._epochs.base_seed}
        state["_dataset"] = state.pop("_loader").dataset
        return state

    def _restore(self, state: dict[str, Any]) -> Any:
        """A copy's state (from ``__getstate__``) taken back, all but its loader and the
        ``_rebuilt`` attributes; returns the dataset to build the loader from."""
        dataset = state.pop("_dataset")
        self.__dict__.update(state)
        return dataset

    def _attach(self, loader: Loader) -> None:
        """A copy's loader, built anew, attached to the epochs the copy holds."""
        self._loader = loader
        self._epochs.attach(loader)


@contextlib.contextmanager
def quiet_copy() -> Iterator[None]:
    """Build a copy's loader without the warnings the original's building showed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def stateful_loader_state(saved: Mapping[str, Any]) -> dict[str, Any]:
    """This rank's state in the state dict of torchdata's ``StatefulDataLoader`` over a
    ``TorchAsyncItr``: its worker processes' states (the iterator's, else the dataset's)
    merged, or its own (``tabloader.torch.agreed_state`` reads a loader through it).

    Examples:
        >>> stateful_loader_state({"dataset_state": {"format": 4, "epoch": 1}})
        {'format': 4, 'epoch': 1}
    """

    def of(holder: Any) -> Any:
        fetcher = holder.get("fetcher_state") or {}
        found = fetcher.get("dataset_iter_state") or holder.get("dataset_state")
        if not isinstance(found, Mapping) or STATE_FORMAT_KEY not in found:
            raise InvalidArgumentError(
                "no TorchAsyncItr state in this StatefulDataLoader state dict: pass the "
                "state_dict() of a StatefulDataLoader over a TorchAsyncItr"
            )
        return found

    snapshot = saved.get("_snapshot")
    if snapshot is None:  # no worker processes
        return dict(of(saved))
    if saved.get("_steps_since_snapshot"):
        raise InvalidArgumentError(
            f"this StatefulDataLoader state is {saved['_steps_since_snapshot']} batch(es) "
            "past its workers' last snapshot, so their states are behind the batches "
            "delivered: save with snapshot_every_n_steps=1 (the default)"
        )
    workers = snapshot.get("_worker_snapshots") or {}
    return merge_worker_states([of(worker) for worker in workers.values()])
