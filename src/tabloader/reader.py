"""Background prefetch: run a producer in a thread, hand its items over a bounded queue.

`Prefetcher` is tabloader's threading primitive (`SplitWork` runs the
independent jobs of one step on a few threads at once). The loader chains two:
a reader that decodes the next chunks while the batcher shuffles and cuts the current
one into batches, which wait in a short queue for the training loop. Decoding (pyarrow)
and gathering (numpy) release the GIL, so both overlap the consumer's own work.

Guarantees:

- A producer is at most ``depth`` items ahead, counting the one it is producing: it
  starts an item only when fewer than ``depth`` are waiting, so that (for chunks of a
  hundred megabytes) memory holds the consumer's item and ``depth`` more, not one more
  finished item parked while the next is made.
- An exception in the producer is re-raised in the consumer, with its traceback.
- `Prefetcher.close` (also run when the prefetcher is garbage-collected) stops the
  thread at its next step: a producer waiting for a free slot wakes within
  ``_POLL_SECONDS``; one busy reading finishes that read first.
- The thread holds no reference to the `Prefetcher`, so dropping the last
  reference (``break`` out of a ``for`` loop) collects it and stops the thread.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from tabloader.errors import TabloaderError

__all__ = ["Prefetcher", "SplitWork", "balanced_groups", "usable_cores"]

T = TypeVar("T")

_POLL_SECONDS = 0.05
_JOIN_SECONDS = 30.0


class _End:
    pass


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = _End()


def _stopped(stops: tuple[threading.Event, ...]) -> bool:
    return any(event.is_set() for event in stops)


def _acquire(slots: threading.Semaphore, stops: tuple[threading.Event, ...]) -> bool:
    """Take a free slot unless one of ``stops`` is set first; returns whether it did."""
    while not _stopped(stops):
        if slots.acquire(timeout=_POLL_SECONDS):
            return True
    return False


def _produce(
    make_items: Callable[[], Iterator[Any]],
    q: queue.SimpleQueue[Any],
    slots: threading.Semaphore,
    stops: tuple[threading.Event, ...],
) -> None:
    items = None
    try:
        items = make_items()
        while _acquire(slots, stops):
            item = next(items, _END)
            q.put(item)
            if item is _END:
                return
    except BaseException as error:  # re-raised in the consumer, never swallowed
        q.put(_Failure(error))
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def _shutdown(
    thread: threading.Thread,
    q: queue.SimpleQueue[Any],
    stop: threading.Event,
    starved: threading.Event,
) -> None:
    stop.set()
    # A producer waiting for its consumer to need more goes on, to its next put, where it
    # sees the stop: the consumer will take nothing more.
    starved.set()
    # Free the queued items now rather than when the last reference goes.
    try:
        while True:
            q.get_nowait()
    except queue.Empty:
        pass
    if thread.ident is not None and thread is not threading.current_thread():
        thread.join(_JOIN_SECONDS)  # (a thread that never started has nothing to join)


class Prefetcher(Generic[T]):
    """Iterate over ``make_items()`` run in a background thread, ``depth`` items ahead.

    Args:
        make_items: Called once in the thread; returns the iterator to drain.
        depth: Items ahead of the one the consumer last took: waiting, or being produced.
        name: Thread name, for debuggers and ``threading.enumerate()``.
        stop: The event this stage sets when it is closed (a new one by default).
        linked: The stop event of the stage this one feeds: when that stage is closed,
            this one stops too (closing this one leaves that one alone).
        starved: The event to set while the consumer waits and no item is ready, and
            once the stage is closed (a new one by default; the producer may watch it).

    Examples:
        >>> from tabloader.reader import Prefetcher
        >>> list(Prefetcher(lambda: iter(range(3)), depth=2))
        [0, 1, 2]
    """

    def __init__(
        self,
        make_items: Callable[[], Iterator[T]],
        *,
        depth: int,
        name: str = "tabloader-prefetch",
        stop: threading.Event | None = None,
        linked: threading.Event | None = None,
        starved: threading.Event | None = None,
    ) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._slots = threading.Semaphore(depth)  # items waiting or being produced
        self._stop = stop if stop is not None else threading.Event()
        self._stops = (self._stop,) if linked is None else (self._stop, linked)
        self._done = False
        self.starved = starved if starved is not None else threading.Event()
        """Set while the consumer waits for an item and none is ready, and once closed."""
        self._thread = threading.Thread(
            target=_produce,
            args=(make_items, self._queue, self._slots, self._stops),
            name=name,
            daemon=True,
        )
        self._finalizer = weakref.finalize(
            self, _shutdown, self._thread, self._queue, self._stop, self.starved
        )
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        if self._queue.empty():
            self.starved.set()
        while True:
            try:
                item = self._queue.get(timeout=_POLL_SECONDS)
                self.starved.clear()
                break
            except queue.Empty:
                if _stopped(self._stops):  # closed, here or further down a chain
                    self._done = True
                    raise StopIteration from None
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise TabloaderError(
                        f"background thread {self._thread.name} ended without a result"
                    ) from None
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        self._slots.release()
        return item  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the producer, drop queued items and wait for the thread to end."""
        self._done = True
        self._finalizer()


class SplitWork:
    """Independent jobs run by the calling thread and ``threads - 1`` helpers together.

    The jobs of one call are grouped by weight into one group per thread; the caller
    runs its group, then waits for the others', so every job has ended when
    `run` returns or raises (the first error of any group is raised in the
    caller). Helper threads start on first use and end at `close`.

    Examples:
        >>> done = []
        >>> work = SplitWork(2, name="example")
        >>> work.run([(3, lambda: done.append("a")), (1, lambda: done.append("b"))])
        >>> work.close()
        >>> sorted(done)
        ['a', 'b']
    """

    def __init__(self, threads: int, *, name: str) -> None:
        self.threads = max(1, threads)
        self._name = name
        self._pool: ThreadPoolExecutor | None = None

    def run(self, jobs: Sequence[tuple[int, Callable[[], None]]]) -> None:
        groups = [
            [jobs[i][1] for i in group]
            for group in balanced_groups([w for w, _ in jobs], self.threads)
        ]
        if len(groups) <= 1:
            _run_all(groups[0] if groups else [])
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads - 1, thread_name_prefix=self._name)
        futures = [self._pool.submit(_run_all, group) for group in groups[1:]]
        errors: list[BaseException] = []
        try:
            _run_all(groups[0])
        except BaseException as error:  # raised below, once every group has ended
            errors.append(error)
        errors.extend(e for e in (f.exception() for f in futures) if e is not None)
        if errors:
            raise errors[0]

    def shares(self, rows: int) -> list[slice]:
        """``rows`` rows cut into at most `threads` contiguous shares of nearly
        equal size, for jobs that each take a share of a piece's rows.

        Examples:
            >>> SplitWork(3, name="example").shares(7)
            [slice(0, 3, None), slice(3, 6, None), slice(6, 7, None)]
            >>> SplitWork(2, name="example").shares(0)
            []
        """
        step = max(-(-rows // self.threads), 1)
        return [slice(lo, min(lo + step, rows)) for lo in range(0, rows, step)]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def balanced_groups(weights: Sequence[int], count: int) -> list[list[int]]:
    """The indices of ``weights`` in at most ``count`` non-empty groups of nearly equal
    total weight: heaviest first, each to the lightest group so far.

    No group exceeds the mean by more than the heaviest weight.

    Examples:
        >>> balanced_groups([5, 4, 3, 2], 2)
        [[0, 3], [1, 2]]
        >>> balanced_groups([7], 3)
        [[0]]
    """
    groups: list[list[int]] = [[] for _ in range(max(1, min(count, len(weights))))]
    loads = [0] * len(groups)
    for i in sorted(range(len(weights)), key=lambda i: -weights[i]):
        lightest = loads.index(min(loads))
        groups[lightest].append(i)
        loads[lightest] += weights[i]
    return [g for g in groups if g]


def _run_all(jobs: Sequence[Callable[[], None]]) -> None:
    for job in jobs:
        job()


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
