"""Emulated ``rmm.mr``: device memory resources, per device, and rmm's device buffer.

Resources allocate with ``cupy.cuda.runtime.malloc``/``free`` (cudaMalloc/cudaFree) of
whichever cupy imports, so with the emulated cupy the bytes show in ``memGetInfo`` and
count against the emulated memory size, and with the real cupy they are real.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any

__emulated__ = True

_ALIGN = 256  # rmm aligns every allocation to 256 bytes (rmm::CUDA_ALLOCATION_ALIGNMENT)


class _Lock:
    """The lock of the resources: the emulated device's own where it is emulated (a buffer
    collected while that lock is held frees into a pool, which records on the device: one
    lock, so that no two threads take the two in opposite orders)."""

    def __init__(self) -> None:
        self._own = threading.RLock()

    def _lock(self) -> Any:
        order = _order()
        return self._own if order is None else order._lock

    def __enter__(self) -> None:
        self._lock().acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock().release()


_lock = _Lock()


_CUPY: list[Any] = []


def _cupy() -> Any:
    """The cupy this rmm works with, found once: buffers freed later (at a garbage
    collection, after a test took the emulated stack off ``sys.modules``) still reach it."""
    if not _CUPY:
        import cupy

        _CUPY.append(cupy)
    return _CUPY[0]


def _runtime() -> Any:
    return _cupy().cuda.runtime


def _current_device() -> int:
    try:
        return int(_runtime().getDevice())
    except ImportError:
        return 0


def _out_of_memory(nbytes: int, why: str) -> MemoryError:
    # rmm raises rmm::out_of_memory, which Python sees as MemoryError with this prefix.
    return MemoryError(f"std::bad_alloc: out_of_memory: RMM failure: {why} ({nbytes:,} bytes)")


class DeviceMemoryResource:
    """Base of the resources: ``allocate(nbytes) -> ptr``, ``deallocate(ptr, nbytes)``."""

    def allocate(self, nbytes: int, stream: Any = None) -> int:
        raise NotImplementedError

    def deallocate(self, ptr: int, nbytes: int, stream: Any = None) -> None:
        raise NotImplementedError


class CudaMemoryResource(DeviceMemoryResource):
    """rmm's default resource: one cudaMalloc per allocation, one cudaFree per free.

    ``CudaMemoryResource.allocations`` and ``.deallocations`` count those calls for all
    instances (class-level), so a test can see that a pool avoids them.
    """

    allocations = 0
    deallocations = 0

    def __init__(self) -> None:
        # bound now: a buffer may be freed after the cupy module is gone (at exit)
        self._runtime = _runtime()

    def allocate(self, nbytes: int, stream: Any = None) -> int:
        try:
            ptr = int(self._runtime.malloc(int(nbytes)))
        except Exception as err:
            if "memory" not in str(err).lower():
                raise
            raise _out_of_memory(nbytes, "cudaMalloc failed: out of memory") from err
        with _lock:
            CudaMemoryResource.allocations += 1
        return ptr

    def deallocate(self, ptr: int, nbytes: int, stream: Any = None) -> None:
        self._runtime.free(ptr)  # cudaFree synchronises the device
        with _lock:
            CudaMemoryResource.deallocations += 1


class ManagedMemoryResource(CudaMemoryResource):
    """cudaMallocManaged; emulated as device memory like CudaMemoryResource."""


class _UpstreamAdaptor(DeviceMemoryResource):
    def __init__(self, upstream_mr: DeviceMemoryResource) -> None:
        if not isinstance(upstream_mr, DeviceMemoryResource):
            raise TypeError(f"upstream_mr must be a DeviceMemoryResource, got {upstream_mr!r}")
        self.upstream_mr = upstream_mr

    def get_upstream(self) -> DeviceMemoryResource:
        return self.upstream_mr


class PoolMemoryResource(_UpstreamAdaptor):
    """Sub-allocates from blocks taken from ``upstream_mr``; freed memory stays in the pool,
    in a free list per stream, as rmm's ``stream_ordered_memory_resource``
    (``cpp/include/rmm/mr/detail/stream_ordered_memory_resource.hpp``) keeps it:

    - ``deallocate`` on stream S records S's event (``cudaEventRecord`` in
      ``do_deallocate``) and puts the block in S's free list;
    - ``allocate`` on S takes the best fit from S's own list with no synchronisation
      (``get_block``: "no sync required"); else a block from another stream's list, after S
      waits for that stream's event (``get_block_from_other_stream``:
      ``cudaStreamWaitEvent``), which orders S after the freeing stream's work and nothing
      else; else all lists merged into S's (each waited for the same way); else the pool
      grows by another upstream allocation (rmm: by the larger of the request and the pool's
      size), up to ``maximum_pool_size``.

    A free list's blocks are coalesced with their neighbours from the same upstream block,
    and the best fit is the smallest block that fits, the lowest address first
    (``coalescing_free_list::get_block``). The initial block (default: half of the
    device's memory, as in rmm) is allocated from upstream at construction and put in the
    legacy default stream's list. Destroying the pool gives every upstream block back.
    """

    def __init__(
        self,
        upstream_mr: DeviceMemoryResource,
        initial_pool_size: int | None = None,
        maximum_pool_size: int | None = None,
    ) -> None:
        super().__init__(upstream_mr)
        total = int(_runtime().memGetInfo()[1])
        # rmm refuses sizes that are not multiples of 256 bytes (pool_memory_resource's
        # constructor: RMM_EXPECTS(is_aligned(..., CUDA_ALLOCATION_ALIGNMENT), "Error,
        # Initial pool size required to be a multiple of 256 bytes"; the same of the
        # maximum); its default initial size is rounded.
        for name, given in (("Initial", initial_pool_size), ("Maximum", maximum_pool_size)):
            if given is not None and int(given) % 256:
                raise MemoryError(
                    f"RMM failure: Error, {name} pool size required to be a multiple of 256 bytes"
                )
        self._initial = _round(total // 2) if initial_pool_size is None else int(initial_pool_size)
        self._maximum = total if maximum_pool_size is None else int(maximum_pool_size)
        if self._initial > self._maximum:
            raise ValueError("initial_pool_size must not exceed maximum_pool_size")
        self._blocks: list[tuple[int, int]] = []
        self._lists: dict[Any, list[tuple[int, int]]] = {}  # stream -> (ptr, size) by address
        self._events: dict[Any, Any] = {}  # stream key -> the event recorded at its frees
        self._finalizer = weakref.finalize(self, _release_blocks, self.upstream_mr, self._blocks)
        if self._initial:
            self._grow(self._initial, _stream(None))

    def _grow(self, nbytes: int, stream: Any) -> None:
        ptr = self.upstream_mr.allocate(nbytes)
        self._blocks.append((ptr, nbytes))
        self._release(ptr, nbytes, _key(stream), stream)

    def pool_size(self) -> int:
        with _lock:
            return sum(size for _, size in self._blocks)

    def allocate(self, nbytes: int, stream: Any = None) -> int:
        size = _round(nbytes)
        stream = _stream(stream)
        key = _key(stream)
        with _lock:
            own = self._lists.setdefault(key, [])
            ptr = self._take(own, size)
            if ptr is not None:
                return ptr
            for other, blocks in self._lists.items():  # a block another stream freed
                if other != key:
                    ptr = self._take(blocks, size)
                    if ptr is not None:
                        stream.wait_event(self._events[other])
                        return ptr
            for other in [k for k in self._lists if k != key and self._lists[k]]:
                stream.wait_event(self._events[other])  # merged after waiting
                for block in self._lists.pop(other):
                    self._insert(own, *block)
            ptr = self._take(own, size)
            if ptr is not None:
                return ptr
            have = self.pool_size()
            if have + size > self._maximum:
                raise _out_of_memory(nbytes, "Maximum pool size exceeded")
            self._grow(max(size, min(have, self._maximum - have)), stream)
            ptr = self._take(self._lists[key], size)
            assert ptr is not None
            return ptr

    def _take(self, blocks: list[tuple[int, int]], size: int) -> int | None:
        """The best fit in ``blocks`` (smallest, lowest address), split; None if none fits."""
        fits = [(length, start) for start, length in blocks if length >= size]
        if not fits:
            return None
        length, start = min(fits)
        blocks.remove((start, length))
        if length > size:
            self._insert(blocks, start + size, length - size)
        return start

    def deallocate(self, ptr: int, nbytes: int, stream: Any = None) -> None:
        stream = _stream(stream)
        with _lock:
            self._release(ptr, _round(nbytes), _key(stream), stream)

    def _release(self, ptr: int, size: int, key: Any, stream: Any) -> None:
        order = _order()
        if order is not None:
            order.freed(ptr, size, key)
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = _cupy().cuda.Event(disable_timing=True)
        event.record(stream)  # do_deallocate: cudaEventRecord on the freeing stream
        self._insert(self._lists.setdefault(key, []), ptr, size)

    def _insert(self, blocks: list[tuple[int, int]], ptr: int, size: int) -> None:
        """Put a free block in a list, coalesced with neighbours of the same upstream block."""
        merged: list[tuple[int, int]] = []
        for start, length in sorted([*blocks, (ptr, size)]):
            if (
                merged
                and merged[-1][0] + merged[-1][1] == start
                and self._same_block(merged[-1][0], start)
            ):
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        blocks[:] = merged

    def _same_block(self, a: int, b: int) -> bool:
        return any(p <= a < p + s and p <= b < p + s for p, s in self._blocks)


def _release_blocks(upstream: DeviceMemoryResource, blocks: list[tuple[int, int]]) -> None:
    """A pool destroyed gives its upstream blocks back (rmm's ``release``, in the pool's
    destructor, once every buffer allocated from it is gone: each holds the pool)."""
    for ptr, size in blocks:
        try:
            upstream.deallocate(ptr, size)
        except Exception:  # at interpreter exit
            return
    blocks.clear()


@dataclasses.dataclass(frozen=True)
class Statistics:
    """What ``StatisticsResourceAdaptor.allocation_counts`` returns: fields, not keys."""

    current_bytes: int
    current_count: int
    peak_bytes: int
    peak_count: int
    total_bytes: int
    total_count: int


class StatisticsResourceAdaptor(_UpstreamAdaptor):
    """Counts what passes through to ``upstream_mr``.

    ``allocation_counts`` is a property returning a :class:`Statistics` with the fields
    ``current_bytes``, ``current_count``, ``peak_bytes``, ``peak_count``, ``total_bytes``
    and ``total_count``, as rmm 25 and later do (rmm 26.10 was seen to; older rmm returned
    a dict with those keys).
    """

    def __init__(self, upstream_mr: DeviceMemoryResource) -> None:
        super().__init__(upstream_mr)
        self._counts = dict.fromkeys(
            (
                "current_bytes",
                "current_count",
                "peak_bytes",
                "peak_count",
                "total_bytes",
                "total_count",
            ),
            0,
        )

    @property
    def allocation_counts(self) -> Statistics:
        with _lock:
            return Statistics(**self._counts)

    def allocate(self, nbytes: int, stream: Any = None) -> int:
        ptr = self.upstream_mr.allocate(nbytes, stream)
        with _lock:
            c = self._counts
            c["current_bytes"] += nbytes
            c["current_count"] += 1
            c["total_bytes"] += nbytes
            c["total_count"] += 1
            c["peak_bytes"] = max(c["peak_bytes"], c["current_bytes"])
            c["peak_count"] = max(c["peak_count"], c["current_count"])
        return ptr

    def deallocate(self, ptr: int, nbytes: int, stream: Any = None) -> None:
        self.upstream_mr.deallocate(ptr, nbytes, stream)
        with _lock:
            self._counts["current_bytes"] -= nbytes
            self._counts["current_count"] -= 1


def _round(nbytes: int) -> int:
    return -(-int(nbytes) // _ALIGN) * _ALIGN


# -- per-device resources ----------------------------------------------------------------

_resources: dict[int, DeviceMemoryResource] = {}
_initialized = False


def get_per_device_resource(device: int) -> DeviceMemoryResource:
    """The resource of ``device``: a CudaMemoryResource until another is set (as in rmm)."""
    with _lock:
        return _resources.setdefault(int(device), CudaMemoryResource())


def set_per_device_resource(device: int, mr: DeviceMemoryResource) -> None:
    with _lock:
        _resources[int(device)] = mr


def get_current_device_resource() -> DeviceMemoryResource:
    return get_per_device_resource(_current_device())


def set_current_device_resource(mr: DeviceMemoryResource) -> None:
    set_per_device_resource(_current_device(), mr)


def is_initialized() -> bool:
    return _initialized


def _initialize(
    *,
    pool_allocator: bool,
    managed_memory: bool,
    initial_pool_size: int | None,
    maximum_pool_size: int | None,
    devices: int | list[int],
) -> None:
    global _initialized
    cupy = _cupy()
    for device in [devices] if isinstance(devices, int) else list(devices):
        with cupy.cuda.Device(device):
            mr: DeviceMemoryResource = (
                ManagedMemoryResource() if managed_memory else CudaMemoryResource()
            )
            if pool_allocator:
                mr = PoolMemoryResource(mr, initial_pool_size, maximum_pool_size)
            set_per_device_resource(device, mr)
    _initialized = True


def _order() -> Any:
    """The emulated device's ordering module, or None on a real cupy (which orders its
    streams itself)."""
    cupy = _cupy()
    return cupy.cuda._order if getattr(cupy, "__emulated__", False) else None


def _stream(stream: Any) -> Any:
    """The cupy stream of ``stream``: a cupy stream, rmm's ``Stream`` (which wraps one), or
    None for rmm's default, the legacy default stream."""
    if stream is None:
        return _cupy().cuda.Stream.null
    return getattr(stream, "obj", stream)


def _key(stream: Any) -> Any:
    """What tells streams apart: the emulated device's key, else the handle."""
    key = getattr(stream, "_key", None)
    return key() if key is not None else int(stream.ptr)


class _DestroyedStream:
    """What a buffer holds of a stream destroyed before the buffer was freed: its key (the
    emulated device reports the use of a dead stream, see ``_order.freed``)."""

    def __init__(self, key: Any) -> None:
        self.key = key
        self.ptr = key[1] if isinstance(key, tuple) else key

    def _key(self) -> Any:
        return self.key

    def record(self, event: Any = None) -> Any:
        return event

    def wait_event(self, event: Any) -> None:
        return None


def _free_buffer(mr: DeviceMemoryResource, ptr: int, size: int, stream_ref: Any, key: Any) -> None:
    """Give a buffer back on the stream it was made on (None: the legacy default stream)."""
    if stream_ref is None:
        mr.deallocate(ptr, size, None)
        return
    stream = stream_ref()
    mr.deallocate(ptr, size, _DestroyedStream(key) if stream is None else stream)


class DeviceBuffer:
    """Untyped device memory from a resource (the current device's by default), on
    ``stream`` (rmm's default stream, the legacy one, by default), given back to the
    resource on that same stream when collected, as rmm's ``device_buffer`` frees on its
    stream; the buffer holds its resource (and a pool the memory of its upstream) alive.
    """

    def __init__(self, size: int = 0, stream: Any = None, mr: DeviceMemoryResource | None = None):
        self.size = int(size)
        self.mr = get_current_device_resource() if mr is None else mr
        on = _stream(stream)
        self.ptr = self.mr.allocate(self.size, on) if self.size else 0
        if self.ptr:
            key = _key(on)
            order = _order()
            if order is not None:
                order.allocated(self.ptr, self.size, key)
            # the stream is not kept alive by the buffer: a stream destroyed before its
            # memory is freed is the emulated device's to report (a crash on a GPU)
            ref = None if on is _stream(None) else weakref.ref(on)
            weakref.finalize(self, _free_buffer, self.mr, self.ptr, self.size, ref, key)

    @property
    def nbytes(self) -> int:
        return self.size
