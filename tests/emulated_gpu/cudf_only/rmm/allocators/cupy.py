"""``rmm_cupy_allocator``: cupy allocations served by the current rmm device resource."""

from __future__ import annotations

from typing import Any

from rmm.mr import DeviceBuffer, _current_device

__emulated__ = True


def rmm_cupy_allocator(nbytes: int) -> Any:
    """An allocation for ``cupy.cuda.set_allocator``: a ``cupy.cuda.MemoryPointer``.

    Built as rmm builds it (python/rmm/rmm/allocators/cupy.py): an rmm buffer from the
    current device resource, wrapped in ``cupy.cuda.UnownedMemory`` that keeps the buffer
    alive, so the memory returns to the resource when cupy drops the last array using it.
    Works with the real cupy as with the emulated one.
    """
    import cupy

    buf = DeviceBuffer(size=nbytes)
    mem = cupy.cuda.UnownedMemory(buf.ptr, buf.size, buf, _current_device())
    return cupy.cuda.memory.MemoryPointer(mem, 0)
