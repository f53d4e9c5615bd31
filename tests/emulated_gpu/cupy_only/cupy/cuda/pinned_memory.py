"""Emulated ``cupy.cuda.pinned_memory``: page-locked host memory, its pool, the allocator.

The rules, from cupy's ``cupy/cuda/pinned_memory.pyx`` and ``cupy/__init__.py``:

- ``PinnedMemory(size, flags)`` is one ``cudaHostAlloc``; the memory stays page-locked
  until the object is collected (``cudaFreeHost`` in its deallocator).
- ``PinnedMemoryPointer(mem, offset)`` exposes the memory through the buffer protocol
  (``numpy.frombuffer`` views it) and keeps ``mem`` alive.
- ``alloc_pinned_memory(size)`` calls the current allocator, which ``cupy`` sets at
  import to the default ``PinnedMemoryPool``'s ``malloc``.
- A pool rounds sizes up to 512 bytes; a block whose pointer is collected goes back to
  the pool's free list and **stays page-locked** there, to be handed out again for the
  same size, until ``free_all_blocks()``.

Emulator-only: `locked_bytes` says how many bytes are page-locked now (a real driver has
no such query; the GPU host run reads ``n_free_blocks()`` of the default pool instead).
Here the memory is ordinary host memory, as every emulated allocation is.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable
from typing import Any

__emulated__ = True

_UNIT = 512
"""cupy's ``PinnedMemoryPool._allocation_unit_size``."""

_lock = threading.Lock()
_locked = 0


def locked_bytes() -> int:
    """Bytes page-locked now, in every live `PinnedMemory` (emulator-only)."""
    with _lock:
        return _locked


def _unlock(size: int) -> None:
    global _locked
    with _lock:
        _locked -= size


class PinnedMemory:
    """One page-locked allocation (``cudaHostAlloc``), freed when collected."""

    def __init__(self, size: int, flags: int = 0) -> None:
        global _locked
        self.size = int(size)
        self.ptr = 0
        if self.size > 0:
            with _lock:
                _locked += self.size
            weakref.finalize(self, _unlock, self.size)


class PinnedMemoryPointer(bytearray):
    """The memory of ``mem`` from ``offset``, through the buffer protocol (a buffer of
    its own here: what it holds is never read before it is written)."""

    def __init__(self, mem: PinnedMemory, offset: int) -> None:
        super().__init__(max(0, mem.size - int(offset)))
        self.mem = mem
        self.ptr = mem.ptr + int(offset)

    def size(self) -> int:  # type: ignore[override]
        return len(self)


def _malloc(size: int) -> PinnedMemoryPointer:
    return PinnedMemoryPointer(PinnedMemory(size), 0)


class PinnedMemoryPool:
    """cupy's pinned memory pool: blocks of equal (rounded) size reused; a block given
    back stays page-locked on the free list until `free_all_blocks`."""

    def __init__(self, allocator: Callable[[int], PinnedMemoryPointer] = _malloc) -> None:
        self._alloc = allocator
        self._free: dict[int, list[PinnedMemory]] = collections.defaultdict(list)
        self._in_use: dict[int, PinnedMemory] = {}
        self._lock = threading.Lock()

    def malloc(self, size: int) -> PinnedMemoryPointer:
        if size == 0:
            return PinnedMemoryPointer(PinnedMemory(0), 0)
        size = -(-int(size) // _UNIT) * _UNIT
        with self._lock:
            free = self._free[size]
            mem = free.pop() if free else self._alloc(size).mem
            self._in_use[id(mem)] = mem
        pointer = PinnedMemoryPointer(mem, 0)
        weakref.finalize(pointer, _give_back, weakref.ref(self), id(mem), size)
        return pointer

    def free(self, key: int, size: int) -> None:
        with self._lock:
            mem = self._in_use.pop(key)
            self._free[size].append(mem)

    def free_all_blocks(self) -> None:
        with self._lock:
            self._free.clear()

    def n_free_blocks(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._free.values())


def _give_back(pool: weakref.ref[PinnedMemoryPool], key: int, size: int) -> None:
    alive = pool()
    if alive is not None:
        alive.free(key, size)


_default_pool = PinnedMemoryPool()
_current: Callable[[int], Any] = _default_pool.malloc


def alloc_pinned_memory(size: int) -> Any:
    """The current allocator's page-locked memory of ``size`` bytes."""
    return _current(int(size))


def set_pinned_memory_allocator(allocator: Callable[[int], Any] | None = None) -> None:
    global _current
    _current = _malloc if allocator is None else allocator
