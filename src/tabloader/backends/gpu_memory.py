"""A GPU loader's streams and memory: where its work runs, how much memory it may take,
and when memory it let go of may be written again.

**Streams.** Each loader issues its work to two CUDA streams of its own, both created
non-blocking (``cudaStreamNonBlocking``), so that neither waits for the training step's
kernels on the legacy default stream nor holds them up: the *reader's* (decoding with
pylibcudf, laying chunks out, drawing their orders, a cache's gathers) and the
*batcher's* (a batch's gathers and joins). The reader records an event when a chunk is
complete (`DeviceMemory.chunk_ready`) and the batcher's stream waits for it when it takes
the chunk (`DeviceMemory.wait_for`): one event a chunk, so a batch waits for its own
chunk and not for the next one being decoded. Streams are never destroyed: a loader
takes a pair from its device's list (`take_streams`) and gives it back when it closes,
for the next loader. Memory allocated on a stream can be freed on it after the loader is
gone, and rmm's stream-ordered pool then records an event there (a destroyed stream
crashed a GPU at a garbage collection).

**Memory goes back in order.** A stream-ordered pool (rmm's
``stream_ordered_memory_resource``) hands memory freed on a stream out again to that
stream's next allocation with no wait, and to another stream after waiting only for the
freeing stream. So a block may go back to the pool only once every stream that used it
is done with it; the loader allocates through an allocator of its own
(`DeviceMemory.allocator`) and decides when cupy lets go of an allocation:

- the reader's memory (a chunk, its order, a cache's window) was read by the batcher's
  stream: the reader's stream waits for the batcher's work so far (an event), then the
  memory is freed on the reader's stream;
- memory handed to the consumer (a batch, or a chunk a batch is a view of) is freed
  once the consumer's work queued before it let go is done: `ConsumerFence` says how the
  consumer's framework tells (an event recorded on its stream when it lets go, a marker
  queued on XLA's stream, a host wait for TensorFlow). The loader's threads ask, without
  waiting, once a batch and once a chunk (`DeviceMemory.collect`), as PyTorch's caching
  allocator queries the events of ``record_stream`` at each allocation. No stream waits
  for the consumer, so the loader's streams never queue behind the training step.

Memory libcudf allocates (a decoded chunk) is written and read on the reader's stream
only, and freed there. cudf's reads (``cudf.read_parquet``) run on the legacy default
stream; the backend orders them itself (see ``backends/gpu.py``).

**The pool.** Importing cudf points cupy at rmm, whose default resource calls
``cudaMalloc`` and ``cudaFree`` for every allocation (each synchronising the device).
While GPU loaders live on a device that still has that default, the device gets one
pool (`acquire_pool`): ``rmm.mr.PoolMemoryResource`` with an initial size of
``$TABLOADER_GPU_POOL_SIZE`` bytes (256 MiB by default) and a maximum of
``$TABLOADER_GPU_MEMORY`` (bytes, or a share of the device's memory: half by default),
wrapped in a statistics adaptor. libcudf's temporaries, cudf's frames and the loaders'
arrays come from it, and so does whatever else the process allocates through rmm
meanwhile (cupy's arrays, once cudf is imported; not PyTorch's, JAX's or TensorFlow's,
which have allocators of their own); past its maximum an allocation fails with
[`GPUMemoryError`][tabloader.errors.GPUMemoryError]. The pool grows as the loaders need
(rmm grows it by its size, up to the maximum) and never shrinks while they live. When
the last loader on the device closes or is collected, the device gets its previous
resource back and the pool gives its memory back to the driver once the arrays still
using it are gone. A resource the user set up (a pool shared with the framework, managed
memory) is kept as it is.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from tabloader.errors import GPUMemoryError, InvalidArgumentError, is_out_of_memory

__all__ = [
    "DEFAULT_MEMORY_SHARE",
    "DEFAULT_POOL_BYTES",
    "MEMORY_ENV",
    "POOL_ENV",
    "ConsumerFence",
    "DeviceMemory",
    "HostFence",
    "LoaderStreams",
    "MarkerFence",
    "StreamFence",
    "acquire_pool",
    "device_bytes_in_use",
    "is_out_of_memory",
    "memory_budget",
    "memory_error_message",
    "out_of_memory_as_error",
    "release_pool",
    "take_streams",
]

POOL_ENV = "TABLOADER_GPU_POOL_SIZE"
"""Initial size in bytes of the memory pool tabloader sets up, or ``off`` for none."""
DEFAULT_POOL_BYTES = 256 * 2**20
MEMORY_ENV = "TABLOADER_GPU_MEMORY"
"""The most GPU memory the pool may take: bytes, or a share of the device's memory."""
DEFAULT_MEMORY_SHARE = 0.5
PENDING_LIMIT = 64
"""Allocations the consumer let go of that the loader keeps, at most, before it waits on
the host for the oldest (a consumer whose queued work lags that far behind)."""


# -- streams -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoaderStreams:
    """A loader's two streams on one device: the reader's and the batcher's."""

    device: int
    reader: Any
    batcher: Any


_SPARE_STREAMS: dict[int, list[LoaderStreams]] = {}
_STREAMS_LOCK = threading.Lock()


def take_streams(cupy: Any, device: int) -> LoaderStreams:
    """A pair of non-blocking streams on ``device`` for one loader: one a closed loader
    gave back, else new ones (never destroyed, see the module's text)."""
    with _STREAMS_LOCK:
        spare = _SPARE_STREAMS.setdefault(device, [])
        if spare:
            return spare.pop()
    with cupy.cuda.Device(device):
        return LoaderStreams(
            device, cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
        )


def _give_back_streams(streams: LoaderStreams) -> None:
    with _STREAMS_LOCK:
        _SPARE_STREAMS.setdefault(streams.device, []).append(streams)


# -- how the consumer says it is done with memory ------------------------------------------


class _Token(Protocol):
    def done(self) -> bool: ...

    def wait(self) -> None: ...


class ConsumerFence(Protocol):
    """How the loader learns that the consumer's work on memory it let go of is done.

    `on_release` runs in the thread that lets go (a training loop dropping a tensor, a
    garbage collection) and returns a token; `settle` runs in a loader thread before
    the tokens are asked whether they are done, and may queue what the framework needs.
    """

    def on_release(self) -> _Token: ...

    def settle(self, tokens: list[Any]) -> None: ...


class _EventToken:
    def __init__(self, event: Any) -> None:
        self.event = event

    def done(self) -> bool:
        return bool(self.event.done)  # cudaEventQuery: never blocks

    def wait(self) -> None:
        self.event.synchronize()


class StreamFence:
    """The consumer reads on the legacy default stream, or on streams ordered with it (the
    blocking streams, PyTorch's and cupy's defaults, or any stream it makes the default
    stream wait for before letting go): an event recorded on the legacy default stream
    when it lets go tells when its work queued before is done, whichever thread lets go
    (the last reference to a batch may be dropped in a loader thread).

    Args:
        cupy: The array module.
        device: The CUDA device.
    """

    def __init__(self, cupy: Any, device: int) -> None:
        self.cupy, self.device = cupy, device

    def on_release(self) -> _Token:
        cuda = self.cupy.cuda
        with cuda.Device(self.device):
            return _EventToken(cuda.Stream.null.record(cuda.Event(disable_timing=True)))

    def settle(self, tokens: list[Any]) -> None:
        return None


class _MarkerToken:
    def __init__(self, fence: MarkerFence) -> None:
        self.fence = fence
        self.marker: Any = None

    def done(self) -> bool:
        return self.marker is not None and bool(self.marker.is_ready())

    def wait(self) -> None:
        if self.marker is None:
            self.fence.settle([self])
        self.marker.block_until_ready()


class MarkerFence:
    """The consumer reads on a stream the loader cannot see (XLA's compute stream): a
    small computation queued there after it let go (``mark()``) is done once the work
    queued before it is; ``is_ready()`` tells without blocking. Markers are queued in a
    loader thread (`settle`), one for all the memory let go of since the last."""

    def __init__(self, mark: Callable[[], Any]) -> None:
        self.mark = mark

    def on_release(self) -> _Token:
        return _MarkerToken(self)

    def settle(self, tokens: list[Any]) -> None:
        waiting = [t for t in tokens if isinstance(t, _MarkerToken) and t.marker is None]
        if waiting:
            marker = self.mark()
            for token in waiting:
                token.marker = marker


class _HostToken:
    def __init__(self, fence: HostFence) -> None:
        self.fence = fence
        self.synced = False

    def done(self) -> bool:
        return self.synced

    def wait(self) -> None:
        self.fence.sync_now()


class HostFence:
    """The consumer's stream is unknown (TensorFlow's): the host waits for all the
    framework's queued work (``sync()``), once `batches` allocations it let go of wait,
    in a loader thread."""

    def __init__(self, sync: Callable[[], None], *, batches: int = 4) -> None:
        self.sync = sync
        self.batches = batches
        self._tokens: list[_HostToken] = []
        self._lock = threading.RLock()
        self.syncs = 0
        """How many times the host waited for the framework (for tests)."""

    def on_release(self) -> _Token:
        token = _HostToken(self)
        with self._lock:
            self._tokens.append(token)
        return token

    def settle(self, tokens: list[Any]) -> None:
        with self._lock:
            waiting = len(self._tokens)
        if waiting >= self.batches:
            self.sync_now()

    def sync_now(self) -> None:
        with self._lock:
            tokens, self._tokens = self._tokens, []
        self.sync()  # the framework let go of them before: its work on them is done now
        self.syncs += 1
        for token in tokens:
            token.synced = True


# -- the loader's memory ---------------------------------------------------------------------


class _Keeper:
    """Owns one allocation of the loader's allocator while cupy uses it; when cupy lets
    go, tells `DeviceMemory` (see the module's text)."""

    __slots__ = ("__weakref__", "inner", "lent", "memory", "role")

    def __init__(self, memory: DeviceMemory, role: str | None, inner: Any) -> None:
        self.memory, self.role, self.inner, self.lent = memory, role, inner, False

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit
            self.memory._let_go(self.role, self.inner, self.lent)


class DeviceMemory:
    """The memory of one GPU loader's threads: its streams, its allocator, and the order
    in which memory goes back to the pool (see the module's text).

    Args:
        cupy: The array module.
        device: The CUDA device.
        streams: The loader's streams (`take_streams`).
    """

    def __init__(self, cupy: Any, device: int, streams: LoaderStreams) -> None:
        self.cupy, self.device, self.streams = cupy, device, streams
        self.consumer: ConsumerFence = StreamFence(cupy, device)
        """How the consumer tells that it is done with memory it let go of: by default an
        event on the legacy default stream (raw batches, PyTorch's default stream);
        adapters set their framework's (`set_consumer`)."""
        self._keepers: weakref.WeakValueDictionary[int, _Keeper] = weakref.WeakValueDictionary()
        self._pending: list[tuple[_Token, Any]] = []
        self._lock = threading.RLock()  # (an allocation let go of in a collection re-enters)
        self._events = threading.local()

    def set_consumer(self, fence: ConsumerFence) -> None:
        """Wait for ``fence`` before writing memory the consumer let go of."""
        self.consumer = fence

    # -- allocating --------------------------------------------------------------------

    def allocator(self) -> Callable[[int], Any]:
        """cupy's allocator for the calling thread's loader work: the thread's current
        allocator (rmm's once cudf is imported), each allocation kept as `_Keeper`."""
        return partial(self._allocate, self.cupy.cuda.get_allocator())

    def _allocate(self, base: Callable[[int], Any], nbytes: int) -> Any:
        try:
            inner = base(nbytes)
        except MemoryError:  # memory the consumer let go of may be waiting: wait for it
            self.collect(wait=True)
            with out_of_memory_as_error(self.device, f"allocating {int(nbytes):,} bytes"):
                inner = base(nbytes)
        if not nbytes or not inner.ptr:
            return inner
        cuda = self.cupy.cuda
        ptr = int(cuda.get_current_stream().ptr)
        role = "reader" if ptr == self.streams.reader.ptr else None
        role = "batcher" if ptr == self.streams.batcher.ptr else role
        keeper = _Keeper(self, role, inner)
        self._keepers[int(inner.ptr)] = keeper
        memory = cuda.UnownedMemory(int(inner.ptr), int(nbytes), keeper, self.device)
        return cuda.MemoryPointer(memory, 0)

    # -- handing over and letting go ----------------------------------------------------

    def _keeper(self, array: Any) -> _Keeper | None:
        memory = getattr(getattr(array, "data", None), "mem", None)
        return None if memory is None else self._keepers.get(int(memory.ptr))

    def lend(self, arrays: Mapping[str, Any] | Any) -> None:
        """Mark the memory of ``arrays`` (a batch handed to the consumer) as the
        consumer's: the reader's memory a batch is a view of waits for the consumer too
        (the batcher's always does)."""
        for array in _leaves(arrays):
            keeper = self._keeper(array)
            if keeper is not None:
                keeper.lent = True

    def _let_go(self, role: str | None, inner: Any, lent: bool) -> None:
        """cupy let go of an allocation (in whichever thread, the consumer's or a loader
        thread's, whichever held it last): free it now, ordered, or once the consumer is
        done with it."""
        if role == "reader":
            self.order(self.streams.reader, after=self.streams.batcher)
        if role != "batcher" and not lent:
            return  # freed on return, on its own stream
        token = self.consumer.on_release()
        if token.done():
            return
        with self._lock:
            self._pending.append((token, inner))

    def collect(self, *, wait: bool = False) -> None:
        """Free the memory whose consumer is done with it (asked without blocking; with
        ``wait``, after waiting for all of it). Called by the loader's threads once a
        batch and once a chunk, and when an allocation fails."""
        with self._lock:
            pending = list(self._pending)
        if not pending:
            return
        self.consumer.settle([token for token, _ in pending])
        over = len(pending) - PENDING_LIMIT
        finished = []
        for i, (token, inner) in enumerate(pending):
            if wait or i < over:
                token.wait()
            if token.done():
                finished.append((token, inner))
        with self._lock:
            ids = {id(item[0]) for item in finished}
            self._pending = [item for item in self._pending if id(item[0]) not in ids]
        # the memory goes back to the pool here, in this loader thread, once the last
        # token holding it is done
        finished.clear()

    @property
    def pending(self) -> int:
        """Allocations let go of and not yet freed (waiting for the consumer)."""
        with self._lock:
            return len(self._pending)

    # -- events ----------------------------------------------------------------------------

    def _event(self, name: str) -> Any:
        """The calling thread's event ``name``, made once and recorded again for each order
        it passes on (a stream waits for an event's latest record at the time it is told:
        a record and a wait back to back need no event of their own)."""
        event = getattr(self._events, name, None)
        if event is None:
            event = self.cupy.cuda.Event(disable_timing=True)
            setattr(self._events, name, event)
        return event

    def order(self, stream: Any, *, after: Any) -> None:
        """Make ``stream``'s later work wait for the work issued to ``after`` so far."""
        with self.cupy.cuda.Device(self.device):
            stream.wait_event(after.record(self._event("order")))

    def chunk_ready(self) -> Any:
        """An event at the reader's work so far: a chunk is complete there (one a chunk;
        the batcher's stream waits for it, `wait_for`)."""
        with self.cupy.cuda.Device(self.device):
            return self.streams.reader.record(self.cupy.cuda.Event(disable_timing=True))

    def wait_for(self, event: Any) -> None:
        """The batcher's stream waits for ``event`` (a chunk's, `chunk_ready`)."""
        if event is not None:
            self.streams.batcher.wait_event(event)

    def close(self) -> None:
        """Wait for the consumer's work on what it let go of, and free it."""
        self.collect(wait=True)


def _leaves(arrays: Any) -> Iterator[Any]:
    if isinstance(arrays, Mapping):
        for value in arrays.values():
            yield from _leaves(value)
    elif isinstance(arrays, (tuple, list)):
        for value in arrays:
            yield from _leaves(value)
    elif hasattr(arrays, "offsets") and hasattr(arrays, "values"):  # a Ragged
        yield arrays.values
        yield arrays.offsets
    else:
        yield arrays


# -- running out -------------------------------------------------------------------------------


def memory_error_message(error: BaseException, *, device: int, doing: str) -> str:
    """The [`GPUMemoryError`][tabloader.errors.GPUMemoryError] message: what failed, and
    how to make chunks smaller or the loader's share of the GPU larger."""
    maximum = pool_maximum(device)
    budget = (
        ""
        if maximum is None
        else f"; tabloader's memory pool on cuda:{device} may take {maximum:,} bytes "
        f"(${MEMORY_ENV}: bytes, or a share of the GPU's memory such as 0.5)"
    )
    return (
        f"cuda:{device} ran out of memory {doing} ({type(error).__name__}: {error}{budget}). "
        "Make chunks smaller: pass a smaller chunk_rows= or parts_per_chunk= to the Loader "
        "(or a smaller buffer_size= to the Keras loader), lower prefetch=, or free memory "
        "the framework holds. An RMM pool shared by cudf, cupy and the framework avoids "
        "fragmentation (see docs/gpu.md)"
    )


@contextlib.contextmanager
def out_of_memory_as_error(device: int, doing: str) -> Iterator[None]:
    """Within the block, a GPU allocation failure raises `GPUMemoryError` saying
    ``doing`` (one raised inside already is left as it is)."""
    try:
        yield
    except GPUMemoryError:
        raise
    except Exception as err:
        if is_out_of_memory(err):
            raise GPUMemoryError(memory_error_message(err, device=device, doing=doing)) from err
        raise


# -- the pool --------------------------------------------------------------------------------


def _size_setting(name: str, value: str, total: int, example: str) -> int:
    """Bytes from a setting of bytes (at least 1) or of a share of ``total`` in (0, 1)."""
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not number > 0 or number != number or number == float("inf"):
        raise InvalidArgumentError(
            f"{name}={value!r} must be a number of bytes or a share of the GPU's memory in "
            f"(0, 1), for example {example}"
        )
    return int(number * total) if number < 1 else int(number)


def memory_budget(total: int) -> int:
    """The most memory tabloader's pool takes on a device of ``total`` bytes:
    ``$TABLOADER_GPU_MEMORY`` (bytes, or a share of ``total``), half by default.

    Examples:
        >>> memory_budget(80 * 2**30) // 2**30
        40
    """
    setting = os.environ.get(MEMORY_ENV, "").strip()
    if not setting:
        return int(total * DEFAULT_MEMORY_SHARE)
    return _size_setting(MEMORY_ENV, setting, total, "0.5 or 8000000000")


@dataclass
class _SharedPool:
    pool: Any
    previous: Any
    users: int
    maximum: int


_POOLS: dict[int, _SharedPool] = {}
_POOLS_LOCK = threading.Lock()


def acquire_pool(rmm: Any, device: int) -> _SharedPool | None:
    """Give ``device`` tabloader's pool while a loader uses it (see the module's text):
    the pool, to give back with `release_pool`; None when the pool is off
    (``$TABLOADER_GPU_POOL_SIZE=off``) or the device has a resource of the user's.

    The pool is built with ``device`` current: rmm's resources allocate on the current
    device, so a pool made while GPU 0 is current would serve device N with GPU 0's
    memory.
    """
    setting = os.environ.get(POOL_ENV, "").strip().lower()
    if setting in ("off", "0", "none"):
        return None
    try:
        size = int(setting) if setting else DEFAULT_POOL_BYTES
    except ValueError:
        raise InvalidArgumentError(
            f"{POOL_ENV}={setting!r} must be a number of bytes or 'off'"
        ) from None
    with _POOLS_LOCK:
        current = rmm.mr.get_per_device_resource(device)
        shared = _POOLS.get(device)
        if shared is not None and shared.pool is current:
            shared.users += 1
            return shared
        if type(current) is not rmm.mr.CudaMemoryResource:
            return None
        import cupy

        with cupy.cuda.Device(device):
            total = int(cupy.cuda.runtime.memGetInfo()[1])
            # rmm takes pool sizes in multiples of 256 bytes only, the initial one at
            # most the maximum (pool_memory_resource's constructor refuses others)
            maximum = max(memory_budget(total), 2**20) // 256 * 256
            initial = min(-(-size // 256) * 256, maximum)
            pool = rmm.mr.StatisticsResourceAdaptor(
                rmm.mr.PoolMemoryResource(
                    current, initial_pool_size=initial, maximum_pool_size=maximum
                )
            )
            rmm.mr.set_per_device_resource(device, pool)
        shared = _POOLS[device] = _SharedPool(pool, current, 1, maximum)
        return shared


def release_pool(rmm: Any, device: int, shared: _SharedPool) -> None:
    """One loader less using ``shared`` on ``device`` (see `acquire_pool`): the last gives
    the device its previous resource back, unless another was set since."""
    with _POOLS_LOCK:
        shared.users -= 1
        if shared.users > 0:
            return
        if _POOLS.get(device) is shared:
            del _POOLS[device]
        if rmm.mr.get_per_device_resource(device) is shared.pool:
            rmm.mr.set_per_device_resource(device, shared.previous)


def pool_maximum(device: int) -> int | None:
    """The maximum of tabloader's pool on ``device``, when it serves the device."""
    with _POOLS_LOCK:
        shared = _POOLS.get(device)
    return None if shared is None else shared.maximum


def device_bytes_in_use(rmm: Any, cupy: Any, device: int) -> int:
    """Bytes allocated on ``device``: rmm's count when it keeps one, else the driver's."""
    resource = rmm.mr.get_per_device_resource(device) if rmm is not None else None
    counts = getattr(resource, "allocation_counts", None)
    if counts is not None:
        # rmm before 25.x returns a dict; newer rmm a Statistics object with the same fields.
        current = counts["current_bytes"] if isinstance(counts, dict) else counts.current_bytes
        return int(current)
    with cupy.cuda.Device(device):
        free, total = cupy.cuda.runtime.memGetInfo()
    return int(total) - int(free)


@contextlib.contextmanager
def scoped(cupy: Any, device: int, stream: Any, allocate: Callable[[int], Any]) -> Iterator[None]:
    """``device`` current, ``stream`` the current stream, ``allocate`` cupy's allocator, in
    the calling thread for the block."""
    cuda = cupy.cuda
    with cuda.Device(device), stream, cuda.using_allocator(allocate):
        yield


def finalize_loader_memory(
    rmm: Any, device: int, memory: DeviceMemory, pool: _SharedPool | None
) -> None:
    """What a GPU backend gives back when it closes or is collected (see `DeviceMemory`
    and `release_pool`)."""
    memory.close()
    _give_back_streams(memory.streams)
    if pool is not None:
        release_pool(rmm, device, pool)
