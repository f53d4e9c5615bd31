"""The pipeline's threads, in one place: what runs in the background, and how it stops.

An epoch runs in these threads (the picture in docs/architecture.md, "The pipeline"),
each a stage fed by the one before through a bounded queue:

- **decoder** (`decode_ahead`, ``tabloader-decoder``): decodes the plan's pieces one
  ahead of the reader;
- **order** (`drawn_ahead`, ``tabloader-order``): draws the next chunk's row order (on
  a GPU: plans its read) while the current one is laid out or gathered;
- **reader** (`chunks_ahead`, ``tabloader-reader``): the backend's ``read_chunks``,
  laying out ``prefetch`` chunks ahead of the batcher, with `SplitWork` helpers taking
  a share of each step (``tabloader-layout``, ``tabloader-cache-fill``, a GPU cache's
  ``tabloader-gather``), or, for an epoch served from a decoded cache, `run_ahead`'s
  gather threads (``tabloader-gather``);
- **batcher** (`batches_ahead`, `batch_stream`, ``tabloader-batcher``): cuts the chunks
  into batches, runs the ``transform``, and keeps `BATCH_QUEUE_DEPTH` batches ready for
  the consumer.

Every way of reading (streamed on the CPU or a GPU, filling or served from a decoded
cache) is a `Reading`: what its decoder, order thread, reader, helpers and gather
threads each do; `read_in_stages` starts those threads and ends them. A decoded cache's
files are checksummed by `map_on_threads` (``tabloader-checksum``) and written out by a
thread of its own, `start_thread` (``tabloader-cache-writer``), which outlives the epoch.

`Prefetcher` is the primitive every stage is built on: a producer in a daemon thread
feeding a bounded queue. Decoding (pyarrow) and laying out (numpy, cupy) release the
GIL, so the stages overlap each other and the consumer's own work.

Guarantees:

- A producer is at most ``depth`` items ahead, counting the one it is producing: it
  starts an item only when fewer than ``depth`` are waiting, so that (for chunks of a
  hundred megabytes) memory holds the consumer's item and ``depth`` more, not one more
  finished item parked while the next is made.
- An exception in the producer is re-raised in the consumer, with its traceback.
- `Prefetcher.close` (also run when the prefetcher is garbage-collected) stops the
  thread at its next step: a producer waiting for a free slot wakes within
  ``_POLL_SECONDS``; one busy reading finishes that read first. Closing the batcher
  stops the reader (``linked``), which stops the decoder and the order thread when
  it ends.
- The thread holds no reference to the `Prefetcher`, so dropping the last
  reference (``break`` out of a ``for`` loop) collects it and stops the thread.

This module knows the backends, the dataset and the plan only by their methods: it
sits below them in the package's layering.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from tabloader.batches import cut_batches, detached
from tabloader.errors import TabloaderError
from tabloader.threads import Threads

if TYPE_CHECKING:
    from tabloader.batches import Block, Layout, Part
    from tabloader.dataset import Dataset
    from tabloader.plan import EpochPlan
    from tabloader.stats import StatsRecorder

__all__ = [
    "BATCH_QUEUE_DEPTH",
    "Backend",
    "Prefetcher",
    "ReadRequest",
    "Reading",
    "SplitWork",
    "balanced_groups",
    "batch_stream",
    "batches_ahead",
    "chunks_ahead",
    "decode_ahead",
    "drawn_ahead",
    "each_step_in",
    "map_on_threads",
    "read_in_stages",
    "run_ahead",
    "start_thread",
]

BATCH_QUEUE_DEPTH = 4
"""Ready batches waiting for the consumer."""

T = TypeVar("T")
D = TypeVar("D")
Ord = TypeVar("Ord")
R = TypeVar("R")

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
    # Free the queued items now rather than when the last reference goes: those queued
    # already, and the one a producer was making, which it puts before it sees the stop
    # (a chunk in GPU memory held by a closed iterator kept the loader's pool alive).
    _drain(q)
    if thread.ident is not None and thread is not threading.current_thread():
        thread.join(_JOIN_SECONDS)  # (a thread that never started has nothing to join)
        _drain(q)


def _drain(q: queue.SimpleQueue[Any]) -> None:
    try:
        while True:
            q.get_nowait()
    except queue.Empty:
        pass


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
        self.exhausted = False
        """Whether the producer's items ran out (not closed, not failed): the consumer
        asked past the last."""
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
            self.exhausted = True
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


# -- the stages, in the order the data flows -------------------------------------------------


@dataclass(frozen=True)
class ReadRequest:
    """What a backend's ``read_chunks`` reads (in the reader thread): an epoch's plan over
    a dataset."""

    dataset: Dataset
    plan: EpochPlan
    blocks: Sequence[Block]
    """The delivered blocks; each chunk's columns are cast to their dtypes."""
    fill_null: Mapping[str, float]
    """Replacement of nulls, per column."""
    stats: StatsRecorder
    chunks_ahead: int = 1
    """Chunks the reader may lay out ahead of the one being cut into batches."""
    consumer_waiting: threading.Event | None = None
    """Set while the consumer of the chunks waits for one (see ``Backend.read_chunks``)."""
    threads: Threads = field(default_factory=lambda: Threads(1))
    """How many threads each stage may run (the loader's, sized once)."""


class Backend(Protocol):
    """What the stages need from an array backend (`tabloader.backends`): the reader's
    ``read_chunks`` and the array namespace the batcher cuts batches with."""

    name: str
    xp: Any
    groups_columns: bool
    """Whether the ``"columns"`` layout keeps columns of one dtype in one block
    (see `Layout.build`)."""

    def scope(self) -> AbstractContextManager[None]:
        """Set up the calling thread to work with this backend's arrays (a GPU backend's
        device, stream and allocator), for as long as the block runs."""
        ...

    def read_chunks(self, request: ReadRequest) -> Iterator[list[Part]]:
        """Read the plan's chunks in turn, each block cast to its dtype.

        Unshuffled, a chunk is one part per piece, its rows in stored order (zero-copy
        where the layout allows). Shuffled, it is parts that deliver the chunk's rows in
        [`EpochPlan.batch_order`][tabloader.plan.EpochPlan.batch_order]: reordered
        up front, or gathered batch by batch through an index.

        A backend whose batches are views of their chunk (the CPU's, shuffled) holds
        at most ``chunks_ahead`` chunks besides the one being cut, waiting for an older
        chunk to be let go before laying out a new one, unless ``consumer_waiting`` says
        the consumer has run out (it keeps batches, so the old chunk stays).
        """
        ...


def decode_ahead(
    plan: EpochPlan, decode: Callable[[Sequence[tuple[int, int, int]]], Iterator[T]]
) -> Prefetcher[T]:
    """Decoder thread: ``decode(pieces)`` over all of the plan's pieces, in plan order,
    one piece ahead of the caller, across chunk boundaries, while the caller lays out
    the previous piece."""
    pieces = [p for chunk in range(plan.num_chunks) for p in plan.pieces(chunk)]
    return Prefetcher(partial(decode, pieces), depth=1, name="tabloader-decoder")


def drawn_ahead(plan: EpochPlan, draw: Callable[[int], T]) -> Prefetcher[T]:
    """Order thread: ``draw(chunk)`` for each chunk of ``plan`` in turn, the next chunk's
    drawn in a thread of its own while the current one is used: permuting a chunk's rows
    takes as long as laying out a good part of it, or gathering a few of its batches, and
    the decoder, one piece ahead, would wait at every chunk boundary."""
    return Prefetcher(
        lambda: (draw(chunk) for chunk in range(plan.num_chunks)),
        depth=1,
        name="tabloader-order",
    )


def each_step_in(
    scope: Callable[[], AbstractContextManager[Any]], items: Iterator[T]
) -> Iterator[T]:
    """``items``, each advanced inside a ``scope()`` of its own (a GPU loader's device,
    stream and allocator), left before the item is handed on.

    A generator suspended with the scope entered would leave it in whichever thread
    finalises it: cupy's contexts restore the state of the thread that exits them (a
    stream's pops that thread's stack), which put another loader's reader on the legacy
    stream. Each step enters and leaves the scope in the thread that runs it.
    """
    try:
        while True:
            with scope():
                try:
                    item = next(items)
                except StopIteration:
                    return
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            with scope():
                close()


def run_ahead(tasks: Iterator[Callable[[], list[Part]]], threads: int) -> Iterator[list[Part]]:
    """Gather threads (an epoch served from a decoded cache): the tasks' results in
    order, computed by ``threads`` threads ahead of the consumer.

    Gathers release the GIL, so windows are gathered on several cores at once; at most
    two per thread are done or in progress, which bounds the memory they hold.
    """
    threads = max(1, threads)
    pool = ThreadPoolExecutor(threads, thread_name_prefix="tabloader-gather")
    pending: deque[Future[list[Part]]] = deque()
    try:
        for task in tasks:
            pending.append(pool.submit(task))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class Reading(Generic[D, Ord]):
    """One way of reading an epoch's chunks, stage by stage; `read_in_stages` starts its
    threads. Every path (streamed on the CPU or a GPU, filling or served from a decoded
    cache, in GPU memory or pinned) is one of these:

    - ``decode``: the decoder thread's work (`decode_ahead`): every piece of the plan,
      one ahead of the reader (None: the reader reads by itself);
    - ``order``: the order thread's work (`drawn_ahead`): each chunk's, one ahead of the
      reader (None: drawn by the reader, on a GPU);
    - ``lay_out``: the reader's work, given the decoded pieces, the orders and the
      helpers: each chunk's parts, or (with ``gathers``) tasks that gather them;
    - ``helpers``: threads of one step (`SplitWork`), the reader's own included, named
      ``helper_name``;
    - ``gathers``: threads running the reader's tasks ahead of the batcher (`run_ahead`;
      0: none);
    - ``finish``: the reader's work once every part is handed on, with the helpers still
      there (the rows a decoded cache still lacks).
    """

    lay_out: Callable[[Iterator[D] | None, Iterator[Ord] | None, SplitWork], Iterator[Any]]
    decode: Callable[[Sequence[tuple[int, int, int]]], Iterator[D]] | None = None
    order: Callable[[int], Ord] | None = None
    helpers: int = 1
    helper_name: str = "tabloader-layout"
    gathers: int = 0
    finish: Callable[[SplitWork], None] | None = None


def read_in_stages(plan: EpochPlan, reading: Reading[Any, Any]) -> Iterator[list[Part]]:
    """Reader thread: ``plan``'s chunks read as ``reading`` says, its decoder, order,
    helper and gather threads started here and ended with it."""
    decoded = None if reading.decode is None else decode_ahead(plan, reading.decode)
    orders = None if reading.order is None else drawn_ahead(plan, reading.order)
    work = SplitWork(reading.helpers, name=reading.helper_name)
    try:
        made = reading.lay_out(decoded, orders, work)
        yield from run_ahead(made, reading.gathers) if reading.gathers else made
        if reading.finish is not None:
            reading.finish(work)
    finally:
        work.close()
        if orders is not None:
            orders.close()
        if decoded is not None:
            decoded.close()


def map_on_threads(
    function: Callable[[T], R], items: Sequence[T], threads: int, *, name: str
) -> list[R]:
    """``function`` of each of ``items``, in order, computed by at most ``threads`` threads
    named ``name`` (the checksum pools of a decoded cache's files), or in the calling
    thread alone for one.

    Examples:
        >>> map_on_threads(len, ["a", "bc", "def"], 2, name="example")
        [1, 2, 3]
    """
    threads = max(1, min(threads, len(items)))
    if threads == 1:
        return [function(item) for item in items]
    # Threads of its own rather than a ThreadPoolExecutor: a cache written in the
    # background is finished while the interpreter exits, when executors refuse new work.
    results: list[Any] = [None] * len(items)
    failures: list[BaseException] = []
    positions = itertools.count()  # next() is atomic: each item is taken once

    def work() -> None:
        for i in iter(positions.__next__, None):
            if i >= len(items) or failures:
                return
            try:
                results[i] = function(items[i])
            except BaseException as error:  # handed to the caller
                failures.append(error)
                return

    helpers = [
        threading.Thread(target=work, name=f"{name}_{k}", daemon=True) for k in range(threads - 1)
    ]
    for helper in helpers:
        helper.start()
    work()
    for helper in helpers:
        helper.join()
    if failures:
        raise failures[0]
    return results


def start_thread(
    target: Callable[..., None], *args: Any, name: str, niceness: int = 0
) -> threading.Thread:
    """A daemon thread running ``target(*args)``, started (the decoded cache's writer:
    ``niceness`` lowers its priority, on Linux, where a thread has its own, so that it
    yields to the threads serving epochs)."""

    def run() -> None:
        if niceness and sys.platform.startswith("linux"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
        target(*args)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def _read_chunks(backend: Backend, request: ReadRequest) -> Iterator[tuple[list[Part], Any]]:
    """Reader thread: each planned chunk, as parts in delivery order, with the event at
    which it is complete on a GPU (`DeviceArrays.chunk_ready`; None on the CPU)."""
    for parts in backend.read_chunks(request):
        request.stats.chunks += 1
        yield parts, backend.xp.chunk_ready()


def chunks_ahead(
    backend: Backend, request: ReadRequest, *, stop: threading.Event
) -> Prefetcher[tuple[list[Part], Any]]:
    """Reader thread: ``backend.read_chunks(request)``, ``request.chunks_ahead`` chunks
    ahead of the batcher, stopped with the batcher (``stop``); ``request``'s
    ``consumer_waiting`` is set while the batcher waits for a chunk."""
    return Prefetcher(
        partial(_read_chunks, backend, request),
        depth=request.chunks_ahead,
        name="tabloader-reader",
        linked=stop,
        starved=request.consumer_waiting,
    )


def batch_stream(
    *,
    dataset: Dataset,
    backend: Backend,
    plan: EpochPlan,
    layout: Layout,
    fill_null: Mapping[str, float],
    transform: Callable[[dict[str, Any]], Any] | None,
    prefetch: int,
    threads: Threads,
    stats: StatsRecorder,
    stop: threading.Event,
) -> Iterator[tuple[int, Any]]:
    """Batcher thread: shuffle each chunk, cut batches, transform them; yields each
    batch with its number of rows."""
    waiting = threading.Event()  # set while the batcher waits for a chunk
    request = ReadRequest(
        dataset, plan, layout.blocks, fill_null, stats, chunks_ahead=prefetch,
        consumer_waiting=waiting, threads=threads,
    )  # fmt: skip
    chunks = chunks_ahead(backend, request, stop=stop)
    upstream_wait = 0.0

    def parts() -> Iterator[Part]:
        nonlocal upstream_wait
        while True:
            started = time.perf_counter()
            read = next(chunks, None)
            upstream_wait += time.perf_counter() - started
            if read is None:
                return
            chunk, ready = read
            backend.xp.wait_for(ready)  # on a GPU: gathers from the chunk run after it is laid out
            while chunk:
                yield chunk.pop(0)

    delivered = 0
    batches = cut_batches(
        parts(),
        batch_size=plan.batch_size,
        layout=layout,
        xp=backend.xp,
    )

    def made() -> Iterator[tuple[int, Any]]:
        nonlocal delivered
        try:
            while True:
                started, waited = time.perf_counter(), upstream_wait
                batch = next(batches, None)
                if batch is None:
                    break
                if delivered == plan.num_batches - 1:
                    batch = detached(batch)  # lets go of the last chunk when the epoch ends
                rows = int(next(iter(batch.values())).shape[0])
                result = batch if transform is None else transform(batch)
                # On a GPU: the consumer's work is ordered after the batch's (no host wait),
                # and the batch's memory is the consumer's until it is done with it.
                backend.xp.hand_over(batch)
                stats.batch_seconds += time.perf_counter() - started - (upstream_wait - waited)
                yield rows, result
                delivered += 1
        finally:
            chunks.close()

    # The backend's device, stream and allocator in this thread for each batch: its
    # gathers, the epoch's last (detached) batch and the tensors a transform makes land on
    # its device.
    yield from each_step_in(backend.scope, made())
    if delivered != plan.num_batches and not stop.is_set():
        raise TabloaderError(
            f"internal error: planned {plan.num_batches} batches but cut {delivered}; "
            "please report this with the dataset's partition sizes"
        )


def batches_ahead(stream: Callable[..., Iterator[tuple[int, Any]]]) -> Prefetcher[tuple[int, Any]]:
    """Batcher thread: ``stream(stop=...)`` (`batch_stream` with its other arguments
    bound), its batches `BATCH_QUEUE_DEPTH` ahead of the consumer; closing it sets
    ``stop``, which stops every stage of the epoch."""
    stop = threading.Event()  # the batcher stage's own, set when the consumer closes
    return Prefetcher(
        partial(stream, stop=stop),
        depth=BATCH_QUEUE_DEPTH,
        name="tabloader-batcher",
        stop=stop,
    )
