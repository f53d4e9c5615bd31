"""Background prefetch: run a producer in a thread, hand its items over a bounded queue.

:class:`Prefetcher` is the one threading primitive of tabloader. The loader chains two:
a reader that decodes the next chunks while the batcher shuffles and cuts the current
one into batches, which wait in a short queue for the training loop. Decoding (pyarrow)
and gathering (numpy) release the GIL, so both overlap the consumer's own work.

Guarantees:

- The queue is bounded, so a producer is at most ``depth`` items ahead.
- An exception in the producer is re-raised in the consumer, with its traceback.
- :meth:`Prefetcher.close` (also run when the prefetcher is garbage-collected) stops the
  thread at its next step: a producer waiting on a full queue wakes within
  ``_POLL_SECONDS``; one busy reading finishes that read first.
- The thread holds no reference to the :class:`Prefetcher`, so dropping the last
  reference (``break`` out of a ``for`` loop) collects it and stops the thread.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from tabloader.errors import TabloaderError

__all__ = ["Prefetcher"]

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


def _put(q: queue.Queue[Any], item: object, stops: tuple[threading.Event, ...]) -> bool:
    """Put ``item`` unless one of ``stops`` is set first; returns whether it was put."""
    while not _stopped(stops):
        try:
            q.put(item, timeout=_POLL_SECONDS)
            return True
        except queue.Full:
            continue
    return False


def _produce(
    make_items: Callable[[], Iterator[Any]],
    q: queue.Queue[Any],
    stops: tuple[threading.Event, ...],
) -> None:
    items = None
    try:
        items = make_items()
        for item in items:
            if not _put(q, item, stops):
                return
        _put(q, _END, stops)
    except BaseException as error:  # re-raised in the consumer, never swallowed
        _put(q, _Failure(error), stops)
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def _shutdown(thread: threading.Thread, q: queue.Queue[Any], stop: threading.Event) -> None:
    stop.set()
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
        depth: Queue capacity (items produced but not yet taken).
        name: Thread name, for debuggers and ``threading.enumerate()``.
        stop: The event this stage sets when it is closed (a new one by default).
        linked: The stop event of the stage this one feeds: when that stage is closed,
            this one stops too (closing this one leaves that one alone).

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
    ) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = stop if stop is not None else threading.Event()
        self._stops = (self._stop,) if linked is None else (self._stop, linked)
        self._done = False
        self._thread = threading.Thread(
            target=_produce, args=(make_items, self._queue, self._stops), name=name, daemon=True
        )
        self._finalizer = weakref.finalize(self, _shutdown, self._thread, self._queue, self._stop)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=_POLL_SECONDS)
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
        return item  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the producer, drop queued items and wait for the thread to end."""
        self._done = True
        self._finalizer()
