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
_lock = threading.RLock()


def _runtime() -> Any:
    import cupy

    return cupy.cuda.runtime


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
        self._runtime.free(ptr)
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
    """Sub-allocates from blocks taken from ``upstream_mr``; freed memory stays in the pool.

    The initial block (default: half of the device's memory, as in rmm) is allocated from
    upstream at construction; when no free range fits, the pool grows by another upstream
    allocation, up to ``maximum_pool_size`` (default: the device's memory).
    """

    def __init__(
        self,
        upstream_mr: DeviceMemoryResource,
        initial_pool_size: int | None = None,
        maximum_pool_size: int | None = None,
    ) -> None:
        super().__init__(upstream_mr)
        total = int(_runtime().memGetInfo()[1])
        self._initial = _round(total // 2 if initial_pool_size is None else int(initial_pool_size))
        self._maximum = total if maximum_pool_size is None else int(maximum_pool_size)
        if self._initial > self._maximum:
            raise ValueError("initial_pool_size must not exceed maximum_pool_size")
        self._blocks: list[tuple[int, int]] = []
        self._free: list[tuple[int, int]] = []  # (ptr, size), sorted by address
        if self._initial:
            self._grow(self._initial)

    def _grow(self, nbytes: int) -> None:
        ptr = self.upstream_mr.allocate(nbytes)
        self._blocks.append((ptr, nbytes))
        self._release(ptr, nbytes)

    def pool_size(self) -> int:
        with _lock:
            return sum(size for _, size in self._blocks)

    def allocate(self, nbytes: int, stream: Any = None) -> int:
        size = _round(nbytes)
        with _lock:
            for i, (ptr, free) in enumerate(self._free):
                if free >= size:
                    self._free[i : i + 1] = [(ptr + size, free - size)] if free > size else []
                    return ptr
            have = self.pool_size()
            if have + size > self._maximum:
                raise _out_of_memory(nbytes, "Maximum pool size exceeded")
            self._grow(max(size, min(have, self._maximum - have)))
            return self.allocate(nbytes, stream)

    def deallocate(self, ptr: int, nbytes: int, stream: Any = None) -> None:
        with _lock:
            self._release(ptr, _round(nbytes))

    def _release(self, ptr: int, size: int) -> None:
        free = sorted([*self._free, (ptr, size)])
        merged: list[tuple[int, int]] = []
        for start, length in free:  # coalesce neighbours of the same upstream block
            if (
                merged
                and merged[-1][0] + merged[-1][1] == start
                and self._same_block(merged[-1][0], start)
            ):
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((start, length))
        self._free = merged

    def _same_block(self, a: int, b: int) -> bool:
        return any(p <= a < p + s and p <= b < p + s for p, s in self._blocks)


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
    import cupy

    for device in [devices] if isinstance(devices, int) else list(devices):
        with cupy.cuda.Device(device):
            mr: DeviceMemoryResource = (
                ManagedMemoryResource() if managed_memory else CudaMemoryResource()
            )
            if pool_allocator:
                mr = PoolMemoryResource(mr, initial_pool_size, maximum_pool_size)
            set_per_device_resource(device, mr)
    _initialized = True


def _order_of(stream: Any) -> tuple[Any, Any]:
    """The emulated device's ordering module and ``stream``'s key (None, None on a real
    cupy, which orders its streams itself). No stream is rmm's default, the legacy one."""
    import cupy

    if not getattr(cupy, "__emulated__", False):
        return None, None
    from cupy.cuda import _order

    stream = cupy.cuda.Stream.null if stream is None else stream
    return _order, stream._key()


def _free_buffer(order: Any, key: Any, mr: DeviceMemoryResource, ptr: int, size: int) -> None:
    if order is not None:
        order.freed(ptr, size, key)
    mr.deallocate(ptr, size)


class DeviceBuffer:
    """Untyped device memory from a resource, given back to it when collected.

    Allocated for ``stream`` (rmm's default stream, the legacy one, by default): rmm's
    pools are stream-ordered, so a buffer freed on a stream is handed out again to that
    stream at once, and to another stream only after synchronising.
    """

    def __init__(self, size: int = 0, stream: Any = None, mr: DeviceMemoryResource | None = None):
        self.size = int(size)
        self.mr = get_current_device_resource() if mr is None else mr
        self.ptr = self.mr.allocate(self.size) if self.size else 0
        if self.ptr:
            order, key = _order_of(stream)
            if order is not None:
                order.allocated(self.ptr, self.size, key)
            weakref.finalize(self, _free_buffer, order, key, self.mr, self.ptr, self.size)

    @property
    def nbytes(self) -> int:
        return self.size
