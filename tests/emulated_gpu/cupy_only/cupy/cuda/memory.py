"""Emulated ``cupy.cuda.memory``: memory objects, the default pool and the allocator hook.

An allocation is an object owning an address from :func:`runtime.malloc`; a
``weakref.finalize`` on it gives the address back when the last array using it is gone,
so the byte counts are the bytes live arrays hold.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from . import _order, runtime

__emulated__ = True

# cupy's pool rounds every allocation up to 512 bytes, the alignment of cudaMalloc
# (cupy/cuda/memory.pyx, _allocation_unit_size and _round_size).
_UNIT = 512


class OutOfMemoryError(MemoryError):
    """Like cupy's: a MemoryError saying how much was asked for and how much is held."""

    def __init__(self, size: int, total: int, limit: int = 0) -> None:
        super().__init__(
            f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes)."
        )


class BaseMemory:
    ptr: int = 0
    size: int = 0
    device_id: int = 0

    @property
    def device(self) -> Any:
        from . import Device

        return Device(self.device_id)


class Memory(BaseMemory):
    """Device memory allocated directly with cudaMalloc, freed when this object is collected."""

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self.device_id = runtime.getDevice()
        self.ptr = runtime.malloc(self.size)
        _order.allocated(self.ptr, self.size, _current_key())
        weakref.finalize(self, _free, self.ptr, self.size)


class UnownedMemory(BaseMemory):
    """Memory owned by another object (an rmm buffer), kept alive as long as this is."""

    def __init__(self, ptr: int, size: int, owner: object, device_id: int = -1) -> None:
        self.ptr, self.size, self._owner = int(ptr), int(size), owner
        # -1 (what rmm's allocator passes): the device the pointer belongs to, asked of
        # the driver (cupy/cuda/memory.pyx UnownedMemory: runtime.pointerGetAttributes)
        if int(device_id) < 0:
            device_id = runtime.pointerGetAttributes(self.ptr).device
        self.device_id = int(device_id)


class MemoryPointer:
    """An address inside a memory object; arrays hold one, which holds the memory."""

    def __init__(self, mem: BaseMemory, offset: int) -> None:
        self.mem, self.offset = mem, int(offset)
        self.ptr = mem.ptr + self.offset
        self.device_id = mem.device_id

    @property
    def device(self) -> Any:
        return self.mem.device


def _current_key() -> _order.Key:
    from . import current_key

    return current_key()


def _free(ptr: int, size: int) -> None:
    _order.freed(ptr, size, None)  # cudaFree synchronises the device
    runtime.free(ptr)


class _PooledMemory(BaseMemory):
    def __init__(self, pool: MemoryPool, ptr: int, size: int, device: int, key: Any) -> None:
        self.ptr, self.size, self.device_id = ptr, size, device
        # cupy's pool keeps free blocks per stream: reused by the same stream, unordered
        _order.allocated(ptr, size, key)
        weakref.finalize(self, pool._give_back, ptr, size, device, key)


class MemoryPool:
    """cupy's default pool: freed blocks are cached and reused for the same rounded size,
    by the stream that freed them only: cupy keeps an arena per stream
    (``SingleDeviceMemoryPool._arena(stream_ident)`` in cupy/cuda/memory.pyx; a block goes
    back to the arena of the stream it was allocated on), so reuse is ordered by that
    stream's order and by nothing else.

    ``used_bytes`` is what arrays hold, ``free_bytes`` what the cache holds, ``total_bytes``
    their sum (all for the current device), as in cupy's MemoryPool.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a finalizer may give a block back inside malloc
        self._cache: dict[int, dict[Any, dict[int, list[int]]]] = {}
        self._used: dict[int, int] = {}

    def malloc(self, size: int) -> MemoryPointer:
        device = runtime.getDevice()
        key = _current_key()
        rounded = -(-int(size) // _UNIT) * _UNIT
        with self._lock:
            cached = self._cache.setdefault(device, {}).setdefault(key, {}).get(rounded)
            ptr = cached.pop() if cached else None
        if ptr is None:
            try:
                ptr = runtime.malloc(rounded)
            except runtime.CUDARuntimeError:
                self.free_all_blocks()  # cupy retries once after releasing its cache
                try:
                    ptr = runtime.malloc(rounded)
                except runtime.CUDARuntimeError:
                    raise OutOfMemoryError(rounded, runtime._allocated(device)) from None
        with self._lock:
            self._used[device] = self._used.get(device, 0) + rounded
        return MemoryPointer(_PooledMemory(self, ptr, rounded, device, key), 0)

    def _give_back(self, ptr: int, size: int, device: int, key: _order.Key) -> None:
        _order.freed(ptr, size, key)
        with self._lock:
            self._used[device] -= size
            arena = self._cache.setdefault(device, {}).setdefault(key, {})
            arena.setdefault(size, []).append(ptr)

    def _blocks(self) -> list[tuple[int, list[int]]]:
        with self._lock:
            arenas = self._cache.get(runtime.getDevice(), {}).values()
            return [(size, list(ptrs)) for arena in arenas for size, ptrs in arena.items()]

    def used_bytes(self) -> int:
        with self._lock:
            return self._used.get(runtime.getDevice(), 0)

    def free_bytes(self) -> int:
        return sum(size * len(ptrs) for size, ptrs in self._blocks())

    def total_bytes(self) -> int:
        return self.used_bytes() + self.free_bytes()

    def n_free_blocks(self) -> int:
        return sum(len(ptrs) for _, ptrs in self._blocks())

    def free_all_blocks(self, stream: object = None) -> None:
        with self._lock:
            arenas = self._cache.pop(runtime.getDevice(), {})
        for arena in arenas.values():
            for ptrs in arena.values():
                for ptr in ptrs:
                    runtime.free(ptr)  # cudaFree: nothing stays on record


_default_pool = MemoryPool()
_allocator: Callable[[int], MemoryPointer] = _default_pool.malloc


_thread = threading.local()


def set_allocator(allocator: Callable[[int], MemoryPointer] | None = None) -> None:
    """Route every later allocation through ``allocator(nbytes) -> MemoryPointer``.

    ``None`` allocates with cudaMalloc directly (no pool), as in cupy.
    """
    global _allocator
    _allocator = allocator if allocator is not None else _malloc


def get_allocator() -> Callable[[int], MemoryPointer]:
    """The calling thread's allocator (``using_allocator``), else the process's."""
    local = getattr(_thread, "allocator", None)
    return _allocator if local is None else local


class using_allocator:
    """Within the block, the calling thread allocates with ``allocator`` (cupy's
    ``cupy.cuda.using_allocator``: a thread-local allocator; None allocates directly)."""

    def __init__(self, allocator: Callable[[int], MemoryPointer] | None = None) -> None:
        self._allocator = _malloc if allocator is None else allocator

    def __enter__(self) -> None:
        self._previous = getattr(_thread, "allocator", None)
        _thread.allocator = self._allocator

    def __exit__(self, *exc: object) -> None:
        _thread.allocator = self._previous


def _malloc(size: int) -> MemoryPointer:
    try:
        return MemoryPointer(Memory(size), 0)
    except runtime.CUDARuntimeError:
        raise OutOfMemoryError(size, runtime._allocated(runtime.getDevice())) from None


def alloc(size: int) -> MemoryPointer:
    """Allocate through the current allocator, as every array creation does."""
    return get_allocator()(int(size))
