"""One epoch in progress: the iterator a [`Loader`][tabloader.Loader] hands out.

A `BatchIterator` takes the batches its epoch's pipeline (`tabloader.stages`) prefetched,
counts them in the loader's statistics, and keeps how far the epoch got in its
`EpochProgress`, which the loader keeps after the iterator is gone to say where the epoch
stands. Closing it (or dropping it) stops the epoch's threads.

Examples:
    >>> import pyarrow as pa, tabloader
    >>> loader = tabloader.Loader(pa.table({"x": list(range(5))}), cats=["x"], batch_size=2)
    >>> with iter(loader) as batches:
    ...     first = next(batches)
    ...     len(batches), batches.cursor.batches, batches.finished
    (2, 1, False)
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from tabloader.memory import release_arrow_memory

if TYPE_CHECKING:
    from tabloader.stages import Prefetcher
    from tabloader.state import Cursor
    from tabloader.stats import StatsRecorder

__all__ = ["BatchIterator", "EpochProgress"]


class EpochProgress:
    """How far one epoch's iterator got: the batches it handed out after its start, and
    whether it ended. Its `BatchIterator` is its only writer."""

    def __init__(self, start: Cursor, batches: int) -> None:
        self.start = start
        self.batches = batches
        """Batches the iterator was to hand out."""
        self.served = 0
        self.finished = False

    @property
    def cursor(self) -> Cursor:
        return self.start.at(self.start.batches + self.served)

    @property
    def over(self) -> bool:
        """Whether the epoch is over: ended, or every batch of it handed out (a loop
        counting ``len()`` steps never asks past the last one). An epoch with no batch
        for this share is not over before it is asked for one: on another number of
        ranks, its rows may be some rank's."""
        return self.finished or 0 < self.batches <= self.served


class BatchIterator:
    """One epoch in progress. Close it (or drop it) to stop its background threads.

    ``len()`` is the number of batches still to come.
    """

    def __init__(
        self,
        stage: Prefetcher[tuple[int, Any]],
        num_batches: int,
        stats: StatsRecorder,
        start: Cursor,
    ):
        self._stage = stage
        self._remaining = num_batches
        self._stats = stats
        self._started: float | None = None
        self.progress = EpochProgress(start, num_batches)
        """How far this epoch got; written by this iterator only, and kept by its loader
        to say where the epoch stands after the iterator is gone."""

    @property
    def cursor(self) -> Cursor:
        """Where this epoch stands: its epoch, seed and worker share, and the batches of it
        handed out so far (counting any skipped on resume)."""
        return self.progress.cursor

    @property
    def position(self) -> Cursor:
        """The same as `cursor`."""
        return self.progress.cursor

    @property
    def finished(self) -> bool:
        """Whether the epoch ended (its last batch was handed out and asked past)."""
        return self.progress.finished

    @property
    def over(self) -> bool:
        """Whether the epoch is over: ended, or its last batch handed out (not after a
        failure or a close(), where the rest is still to come)."""
        return self.progress.over

    def __iter__(self) -> BatchIterator:
        return self

    def __len__(self) -> int:
        return self._remaining

    def __next__(self) -> Any:
        now = time.perf_counter()
        if self._started is None:
            self._started = now
        try:
            rows, batch = next(self._stage)
        except StopIteration:
            # the end of the epoch only if its batches ran out: not after a failure or
            # a close(), where the state stays at the next batch not handed out
            self.progress.finished = self._stage.exhausted
            self._finish()
            release_arrow_memory()  # the epoch's threads have ended
            raise
        except BaseException:
            self._finish()
            raise
        self._stats.wait_seconds += time.perf_counter() - now
        self._stats.rows += rows
        self._stats.batches += 1
        self._remaining -= 1
        self.progress.served += 1
        return batch

    def _finish(self) -> None:
        if self._started is not None:
            self._stats.consume_seconds += time.perf_counter() - self._started
            self._started = None

    def close(self) -> None:
        """Stop the background threads; the iterator yields nothing more."""
        self._finish()
        self._stage.close()
        self._remaining = 0
        release_arrow_memory()

    def __enter__(self) -> BatchIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self._finish()

    @property
    def threads(self) -> list[threading.Thread]:
        """The background thread serving this iterator (for tests and debugging)."""
        return [self._stage.thread]
