"""``rmm_cupy_allocator``: cupy allocations served by the current rmm device resource."""

from __future__ import annotations

from typing import Any

from rmm.mr import DeviceBuffer

__emulated__ = True


def rmm_cupy_allocator(nbytes: int) -> Any:
    """An allocation for ``cupy.cuda.set_allocator``: a ``cupy.cuda.MemoryPointer``.

    Built as rmm builds it (python/rmm/rmm/allocators/cupy.py): an rmm buffer from the
    current device resource, on cupy's current stream, wrapped in
    ``cupy.cuda.UnownedMemory`` that keeps the buffer alive, so the memory returns to the
    resource when cupy drops the last array using it. The device passed is -1 ("the
    pointer's own"), so an array lives on the device its memory came from, whichever is
    current. Works with the real cupy as with the emulated one.
    """
    import cupy

    buf = DeviceBuffer(size=nbytes, stream=cupy.cuda.get_current_stream())
    device = -1 if buf.ptr else cupy.cuda.runtime.getDevice()
    mem = cupy.cuda.UnownedMemory(buf.ptr, buf.size, buf, device)
    return cupy.cuda.memory.MemoryPointer(mem, 0)
