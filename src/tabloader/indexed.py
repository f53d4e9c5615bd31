"""Epochs served by batch index: the bookkeeping behind index-based frameworks.

Keras' ``PyDataset`` asks for batches by index (``dataset[i]``), in any order, and
fetches the first two batches of an epoch to inspect them before the epoch proper. The
core [`Loader`][tabloader.Loader] streams an epoch's batches in one fixed order.
`IndexedEpochs` joins the two: each index of ``range(len())`` is served once per
epoch with the epoch's batches in stream order, whatever the order of the indices; the
epoch's first `HEAD_BATCHES` batches are kept for replay; once every index was
served, the next request (or `IndexedEpochs.on_epoch_end`) starts the next epoch.
It knows nothing of any framework: the loader's ``transform`` makes the tensors.

Examples:
    >>> import pyarrow as pa, tabloader
    >>> loader = tabloader.Loader(pa.table({"x": list(range(10))}), cats=["x"], batch_size=4)
    >>> epochs = IndexedEpochs(loader)
    >>> len(epochs), [epochs.batch(i)["x"].tolist() for i in (2, 0, 1)]
    (3, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]])
    >>> epochs.batch(0)["x"].tolist(), epochs.epoch  # every index served: next epoch
    ([0, 1, 2, 3], 1)
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator, Mapping
from numbers import Integral
from typing import TYPE_CHECKING, Any

from tabloader.errors import PerformanceWarning, TabloaderError
from tabloader.options import int_at_least
from tabloader.state import Cursor

if TYPE_CHECKING:
    from tabloader.elastic import Leg
    from tabloader.iterator import BatchIterator
    from tabloader.loader import Loader

__all__ = ["HEAD_BATCHES", "IndexedEpochs"]

HEAD_BATCHES = 2
"""Leading batches of each epoch kept for replay: Keras fetches the first two batches of a
``PyDataset`` to inspect their structure before it starts the epoch proper."""


class IndexedEpochs:
    """A loader's epochs served by batch index, each index once per epoch.

    ``batch(i)`` for ``i`` in ``range(len(self))`` serves the epoch's batches in the
    order the loader streams them, whatever the order of the indices. Asking again for
    an index already served in the current epoch returns the same batch: instantly for
    the epoch's first `HEAD_BATCHES` batches, otherwise by reading the epoch again
    up to it (with a [`PerformanceWarning`][tabloader.errors.PerformanceWarning]). An epoch left
    unfinished is continued by requests for new indices and served again from its start by requests
    for old ones. `on_epoch_begin` and `on_epoch_end` mark the framework's
    epoch boundaries: requests between two of them are one go at the epoch. Thread-safe.
    """

    def __init__(self, loader: Loader, *, adopt_seed: bool | None = None) -> None:
        self.loader = loader
        """The core [`tabloader.Loader`][tabloader.Loader] (its ``stats()``, ``plan()``);
        this object keeps its own epoch and seed and never changes the loader's."""
        self._adopt_seed = adopt_seed
        """Whether a loaded state's seed is taken rather than refused (None: when the
        loader's seed was not given; True for a seed drawn by a ``seed_fn``, which a
        restarted run draws anew)."""
        self._epoch = loader.epoch
        self._known: int | None = None  # batches of the epoch being served, once counted
        self._start = 0  # batches of that epoch delivered before a resume (on this world)
        self._legs: tuple[Leg, ...] = ()  # the worlds that served it before (a resume)
        self._lock = threading.RLock()
        self._seed = loader.seed  # a loaded state's, once adopted
        # Where the current epoch stands: a few counters and maps, reset by _reset_pass.
        self._given: dict[int, int] = {}  # batch index -> position in the epoch's stream
        self._since: dict[int, int] = {}  # the same, for requests since the last hook
        self._used: set[int] = set()  # positions given out
        self._next = 0  # no position below this is free
        self._head: list[Any] = []  # the epoch's first HEAD_BATCHES batches, kept
        self._iterator: BatchIterator | None = None
        self._consumed = 0  # batches taken from _iterator
        self._looked: tuple[int, Any] | None = None  # a batch looked at beyond the head

    def __len__(self) -> int:
        """Batches of the epoch being served (after a resume: those still to come). The
        epoch after it is counted once `on_epoch_end` made way for it, when first asked:
        a dataset listed again at each epoch is listed then (Keras asks ``len()`` as
        ``fit`` starts, and again at an epoch's end, before it calls `on_epoch_end`)."""
        with self._lock:
            return self._num_batches

    def __getitem__(self, index: int) -> Any:
        return self.batch(index, stacklevel=2)

    def __iter__(self) -> Iterator[Any]:
        """One epoch: `on_epoch_begin`, every batch in order, `on_epoch_end`."""
        self.on_epoch_begin()
        for i in range(len(self)):
            yield self[i]
        self.on_epoch_end()

    def batch(self, index: int, *, stacklevel: int = 1, look: bool = False) -> Any:
        """The batch served for ``index`` in the current epoch (see the class).

        ``look``: the framework looks at a batch, to learn its structure, and will ask for
        it again, as a batch to train on, in any turn: the look is served the batch the
        next new index gets (kept for it), and no index or batch counts as served.
        ``stacklevel`` counts the caller's frames above this one, for warnings.
        """
        i = self._check_index(index)
        with self._lock:
            if len(self._given) == self._num_batches and not self._is_replay(i):
                self._advance()
            if look:
                at = self._next_free_position()
                looked = self._batch_at(at, stacklevel + 2)
                if at >= len(self._head):
                    self._looked = (at, looked)
                return looked
            position = self._since.get(i)
            if position is None:
                position = self._given.get(i)
                if position is not None and position >= len(self._head):
                    # An index of an earlier, unfinished go at this epoch: the epoch is
                    # being served again from its start. Keep what this go already got.
                    self._warn_if_cut(stacklevel + 2)
                    self._given = dict(self._since)
                    self._used = set(self._since.values())
                    self._next = 0
                    position = None
            if position is None:
                position = self._next_free_position()
                self._given[i] = position
                self._used.add(position)
            self._since[i] = position
            batch = self._batch_at(position, stacklevel + 2)
            if len(self._given) == self._num_batches:
                self._close_iterator()
            return batch

    def on_epoch_begin(self) -> None:
        """Called by Keras before each epoch: starts reading if nothing is under way."""
        with self._lock:
            if len(self._given) == self._num_batches:
                self._advance()
            self._since = {}
            if self._iterator is None and not self._given:
                self._start_iterator()

    def on_epoch_end(self) -> None:
        """Called by Keras after each epoch: a finished epoch makes way for the next."""
        with self._lock:
            if len(self._given) == self._num_batches:
                self._advance()
            self._since = {}

    # -- epochs -------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch being served (or about to be): 0, 1, 2, ..."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Serve epoch ``epoch`` from its start next (to resume a training run)."""
        epoch = int_at_least(epoch, 0, "epoch")
        with self._lock:
            self._close_iterator()
            self._epoch = epoch
            self._reset_pass()
            self._start, self._legs, self._known = 0, (), None

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands, to continue exactly there after a restart.

        Mid-epoch it points at the next batch of the epoch being served (batches
        handed to Keras count, those read ahead do not); after an epoch's last batch,
        at the start of the next epoch. See
        [`tabloader.Loader.state_dict`][tabloader.Loader.state_dict].
        """
        with self._lock:
            served = len(self._used)
            cursor = Cursor(self._epoch, self._seed, self._start + served, legs=self._legs)
            if served >= self._num_batches:
                cursor = cursor.next_epoch()
            position = cursor.position(global_size=self.loader.config.global_size)
            return position.to_state(self.loader.fingerprint())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from `state_dict`): the rest of the saved epoch
        comes next, bit-identical to the run that saved it (on another number of ranks:
        the rows no rank delivered, dealt evenly, see
        [`Loader.load_state_dict`][tabloader.Loader.load_state_dict]), then the later
        epochs.

        Until that epoch ends, ``len()`` is the number of its batches still to come.
        Keras fixes the steps per epoch when ``fit`` starts, so finish the resumed epoch
        with one call and run the later ones with another:

        ```python
        loader.load_state_dict(state)
        model.fit(loader, initial_epoch=state["epoch"], epochs=state["epoch"] + 1)
        model.fit(loader, initial_epoch=state["epoch"] + 1, epochs=total_epochs)
        ```

        A state from a different dataset or different options raises
        [`tabloader.InvalidArgumentError`][tabloader.errors.InvalidArgumentError] naming what
        differs.
        """
        saved = self.loader.resume_cursor(state, seed=self._seed, adopt_seed=self._adopt_seed)
        rest = self.loader.cursor_plan(saved).num_batches
        if rest == 0 and (saved.batches or saved.legs):  # it ended: Keras needs batches
            saved = saved.next_epoch()
            rest = self._batches_of(saved.epoch)
        with self._lock:
            self._close_iterator()
            self._seed = saved.seed
            self._epoch = saved.epoch
            self._reset_pass()
            self._start, self._legs, self._known = saved.batches, saved.legs, rest

    def close(self) -> None:
        """Stop the background threads of an unfinished epoch and drop its kept batches."""
        with self._lock:
            self._close_iterator()
            self._head = []

    # -- internals ----------------------------------------------------------------

    def _reset_pass(self) -> None:
        self._given = {}
        self._since = {}
        self._used = set()
        self._next = 0
        self._head = []
        self._iterator = None
        self._consumed = 0
        self._looked = None

    def _advance(self) -> None:
        self._close_iterator()
        self._epoch += 1
        self._reset_pass()
        self._start, self._legs, self._known = 0, (), None

    @property
    def _num_batches(self) -> int:
        """Batches of the epoch being served: counted when first asked, so that a
        dataset listed again at each epoch is listed when the epoch starts (Keras asks
        ``len()`` then), not when the one before ended."""
        if self._known is None:
            self._known = self._batches_of(self._epoch)
        return self._known

    def _batches_of(self, epoch: int) -> int:
        """Batches of ``epoch`` from its start: of its listing, for a dataset that is
        listed again at each epoch (`Loader.refresh`)."""
        self.loader.refresh(epoch)
        return len(self.loader)

    def _is_replay(self, i: int) -> bool:
        """Whether index ``i`` asks again for a kept batch given out before the last hook.

        That is Keras fetching the two batches it looked at before the epoch started:
        the epoch is not over until it has had them.
        """
        position = self._given.get(i)
        return i not in self._since and position is not None and position < len(self._head)

    def _warn_if_cut(self, stacklevel: int) -> None:
        """Say so when an epoch of a dataset listed again at each epoch is served again
        from its start after a go of fewer indices than it has: Keras counts an epoch's
        steps when ``fit`` starts, so a dataset that grew since has its later epochs cut
        to that count, their first batches trained again and the rest never."""
        asked, batches = len(self._given), self._num_batches
        if self.loader.dataset.refreshes and asked < batches:
            warnings.warn(
                f"epoch {self._epoch} has {batches} batches (its files were listed again), "
                f"and the framework asked for {asked} before it asked for them again from "
                f"the first: it counted an epoch's batches when it started (Keras' fit does, "
                f"once), so epoch {self._epoch}'s first batches are served again and the rest "
                "never. Run one fit(epochs=1) per epoch (each counts the epoch it trains), "
                "or pass steps_per_epoch and let the loader's epochs run across fit's",
                UserWarning,
                stacklevel=stacklevel,
            )

    def _check_index(self, index: object) -> int:
        if isinstance(index, bool) or not isinstance(index, Integral):
            raise TypeError(f"batch index must be an integer, got {index!r}")
        i = int(index)
        # Once an epoch is done the next one is whole again (after a resume, too).
        done = len(self._given) == self._num_batches
        limit = self._batches_of(self._epoch + 1) if done else self._num_batches  # it starts
        if not 0 <= i < limit:
            raise IndexError(
                f"batch index {i} is out of range: this loader has {limit} "
                f"batches per epoch (indices 0..{limit - 1})"
            )
        return i

    def _next_free_position(self) -> int:
        while self._next in self._used:
            self._next += 1
        return self._next

    def _start_iterator(self) -> None:
        start = Cursor(self._epoch, self._seed, self._start, legs=self._legs)
        self._iterator = self.loader.iter_epoch(start)
        self._consumed = 0

    def _close_iterator(self) -> None:
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None

    def _batch_at(self, position: int, stacklevel: int) -> Any:
        """Batch ``position`` of the current epoch's stream."""
        if position < len(self._head):
            return self._head[position]
        if self._looked is not None and self._looked[0] == position:
            batch, self._looked = self._looked[1], None
            return batch
        if self._iterator is None or self._consumed > position:
            if position > len(self._head):
                warnings.warn(
                    f"batch {position} of epoch {self._epoch} was asked for again or out of "
                    f"turn: reading the epoch again from its start to serve it. Keras' fit, "
                    "evaluate and predict never do this unless an epoch is cut short",
                    PerformanceWarning,
                    stacklevel=stacklevel,
                )
            self._close_iterator()
            self._start_iterator()
        iterator = self._iterator
        assert iterator is not None  # set just above; for the type checker
        try:
            while self._consumed < position:
                next(iterator)
                self._consumed += 1
            batch = next(iterator)
        except StopIteration:
            self._close_iterator()
            raise TabloaderError(
                f"internal error: epoch {self._epoch} ended before batch {position}; "
                "please report this with the dataset's partition sizes"
            ) from None
        except BaseException:
            self._close_iterator()
            raise
        self._consumed += 1
        if position == len(self._head) and position < HEAD_BATCHES:
            self._head.append(batch)
        return batch
