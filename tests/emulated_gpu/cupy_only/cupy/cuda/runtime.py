"""Emulated ``cupy.cuda.runtime``: devices, device memory and the current device per thread.

"Device memory" is host memory from numpy. ``malloc``/``free`` count the bytes of each
emulated GPU, so ``memGetInfo`` reports what is really allocated, and allocations beyond
``TABLOADER_EMULATED_GPU_MEMORY`` bytes (default 16 GiB) fail as out of memory.
"""

from __future__ import annotations

import bisect
import os
import threading
from types import SimpleNamespace

import numpy as np

from . import _order

__emulated__ = True

_GIB = 2**30


class CUDARuntimeError(RuntimeError):
    """Raised like ``cupy_backends.cuda.api.runtime.CUDARuntimeError`` (message 'cudaError...')."""

    def __init__(self, status: str, message: str) -> None:
        self.status = status
        super().__init__(f"{status}: {message}")


def _device_count() -> int:
    return int(os.environ.get("TABLOADER_EMULATED_GPUS", "1"))


def _capacity() -> int:
    return int(os.environ.get("TABLOADER_EMULATED_GPU_MEMORY", str(16 * _GIB)))


_local = threading.local()
_lock = threading.Lock()
"""Guards the tables below; taken only through `_held`."""
_buffers: dict[int, tuple[np.ndarray, int, int]] = {}  # ptr -> (host buffer, bytes, device)
_starts: list[int] = []  # the keys of _buffers, sorted
_used: dict[int, int] = {}  # device -> bytes allocated by malloc and not yet freed


class _Held:
    """``with _held():`` the tables' lock. The garbage collector may run a finalizer that
    frees device memory (rmm's ``DeviceBuffer``, cupy's pool) on any allocation made
    while the lock is held, in this very thread: such a free is kept and done once the
    lock is let go (a real cudaFree from a finalizer inside cudaMalloc does not hang)."""

    def __enter__(self) -> None:
        _lock.acquire()
        _local.held = True

    def __exit__(self, *exc: object) -> None:
        _local.held = False
        _lock.release()
        deferred = getattr(_local, "deferred", None)
        while deferred:
            free(deferred.pop())


_held = _Held()


def getDeviceCount() -> int:
    # A host without a GPU makes the real call raise cudaErrorNoDevice, not return 0.
    count = _device_count()
    if count < 1:
        raise CUDARuntimeError("cudaErrorNoDevice", "no CUDA-capable device is detected")
    return count


def _check(device: int) -> int:
    device = int(device)
    if not 0 <= device < getDeviceCount():
        raise CUDARuntimeError("cudaErrorInvalidDevice", "invalid device ordinal")
    return device


def getDevice() -> int:
    # CUDA keeps the current device per host thread; every new thread starts on device 0.
    return getattr(_local, "device", 0)


def setDevice(device: int) -> None:
    _local.device = _check(device)


def memGetInfo() -> tuple[int, int]:
    """``(free, total)`` bytes of the current device: total minus what is allocated."""
    total = _capacity()
    with _held:
        used = _used.get(getDevice(), 0)
    return max(total - used, 0), total


def getDeviceProperties(device: int) -> dict[str, object]:
    _check(device)
    return {"name": b"Emulated GPU", "totalGlobalMem": _capacity(), "major": 8, "minor": 0}


def driverGetVersion() -> int:
    return 12040


def runtimeGetVersion() -> int:
    return 12040


def malloc(size: int) -> int:
    """Allocate ``size`` bytes on the current device; returns the address (cudaMalloc)."""
    device = getDevice()
    size = int(size)
    with _held:
        if _used.get(device, 0) + size > _capacity():
            raise CUDARuntimeError("cudaErrorMemoryAllocation", "out of memory")
        # 256 spare bytes align the block like cudaMalloc does; untouched pages of a large
        # numpy buffer are not backed by RAM until written.
        buffer = np.empty(size + 256, dtype=np.uint8)
        ptr = buffer.ctypes.data + (-buffer.ctypes.data) % 256
        _buffers[ptr] = (buffer, size, device)
        bisect.insort(_starts, ptr)
        _used[device] = _used.get(device, 0) + size
    return ptr


def free(ptr: int) -> None:
    """Release an address returned by :func:`malloc` (cudaFree: it synchronises the
    device, so nothing done to the memory stays on record)."""
    if getattr(_local, "held", False):  # a finalizer run while this thread holds the lock
        _local.__dict__.setdefault("deferred", []).append(int(ptr))
        return
    with _held:
        _buffer, size, device = _buffers.pop(int(ptr))
        _starts.pop(bisect.bisect_left(_starts, int(ptr)))
        _used[device] -= size
    _order.host_wait_device(device)
    _order.forget(int(ptr), size)


memoryTypeDevice = 2


def pointerGetAttributes(ptr: int) -> SimpleNamespace:
    """cudaPointerGetAttributes: the device that owns an address inside any allocation.

    cupy asks it when memory comes without a device (``UnownedMemory(device_id=-1)``,
    which is what rmm's cupy allocator passes): an array then lives where its memory
    does, whichever device is current.
    """
    with _held:
        i = bisect.bisect_right(_starts, int(ptr)) - 1
        if i >= 0:
            start = _starts[i]
            _buffer, size, device = _buffers[start]
            if start <= int(ptr) < start + max(size, 1):
                return SimpleNamespace(device=device, type=memoryTypeDevice, devicePointer=ptr)
    raise CUDARuntimeError("cudaErrorInvalidValue", f"{ptr:#x} is not device memory")


def _allocated(device: int) -> int:
    with _held:
        return _used.get(device, 0)


# cudaHostAlloc's flags (cupy_backends/cuda/api/runtime.pyx)
hostAllocDefault = 0
hostAllocPortable = 1
