"""Emulated ``cupy.cuda``: devices, streams and events, on the emulated device's clock
(``_order``: a stream is a queue, a kernel takes time, a query never blocks)."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from typing import Any

from . import _order, memory, pinned_memory, runtime
from ._order import RaceError
from .memory import (
    BaseMemory,
    Memory,
    MemoryPointer,
    MemoryPool,
    OutOfMemoryError,
    UnownedMemory,
    alloc,
    get_allocator,
    set_allocator,
    using_allocator,
)
from .pinned_memory import (
    PinnedMemory,
    PinnedMemoryPointer,
    PinnedMemoryPool,
    alloc_pinned_memory,
    set_pinned_memory_allocator,
)
from .runtime import CUDARuntimeError

__emulated__ = True

__all__ = [
    "BaseMemory",
    "CUDARuntimeError",
    "Device",
    "Event",
    "ExternalStream",
    "Memory",
    "MemoryPointer",
    "MemoryPool",
    "OutOfMemoryError",
    "PinnedMemory",
    "PinnedMemoryPointer",
    "PinnedMemoryPool",
    "RaceError",
    "alloc_pinned_memory",
    "Stream",
    "UnownedMemory",
    "alloc",
    "get_allocator",
    "get_current_stream",
    "memory",
    "pinned_memory",
    "runtime",
    "set_allocator",
    "set_pinned_memory_allocator",
    "using_allocator",
]


class Device:
    """A CUDA device; as a context manager it is the calling thread's current device.

    ``with Device(i):`` restores the previous device on exit, like cupy's Device.
    """

    def __init__(self, device: int | None = None) -> None:
        self.id = runtime.getDevice() if device is None else int(device)
        self._previous: list[int] = []

    def use(self) -> None:
        runtime.setDevice(self.id)

    def __enter__(self) -> Device:
        self._previous.append(runtime.getDevice())
        runtime.setDevice(self.id)
        return self

    def __exit__(self, *exc: object) -> None:
        runtime.setDevice(self._previous.pop())

    @property
    def mem_info(self) -> tuple[int, int]:
        with Device(self.id):
            return runtime.memGetInfo()

    def synchronize(self) -> None:
        """cudaDeviceSynchronize: all work of the device is complete."""
        runtime._check(self.id)
        _order.host_wait_device(self.id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


_local = threading.local()
_handles = itertools.count(0x1000, 0x10)


class Event:
    """A point in a stream: what the stream had issued when it was recorded, and when, on
    the emulated clock, that work ends (``time``).

    ``synchronize()`` blocks the host until then and tells it that the work before the
    event is complete; ``query()``/``done`` say whether it is, never blocking (True once
    the clock has passed ``time``, and then the host may rely on it, as on CUDA);
    ``Stream.wait_event`` orders a stream's later work after it (see ``_order``).
    """

    def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
        self.key: _order.Key | None = None
        self.count = 0
        self.covered: dict[_order.Key, int] = {}
        self.time = 0.0

    def record(self, stream: Stream | None = None) -> None:
        # (an event does not hold its stream alive, as in CUDA)
        self.key = (get_current_stream() if stream is None else stream)._key()
        self.count, self.covered, self.time = _order.snapshot(self.key)

    def synchronize(self) -> None:
        if self.key is not None:
            _order.host_wait(self.key, self.count, self.covered, until=self.time)

    def query(self) -> bool:
        # cudaEventQuery: cudaSuccess once the work is done, and then the host may rely on
        # it; never blocks (not counted as a host wait)
        if self.key is None:
            return True
        if _order.is_complete(self.key, self.count) or time.monotonic() >= self.time:
            _order.complete(self.key, self.count, self.covered)
            return True
        return False

    done = property(query)


class Stream:
    """A stream of the device current at creation; ``with stream:`` makes it current.

    ``Stream.null`` is the legacy default stream of whichever device is current.
    """

    null: Stream

    def __init__(self, null: bool = False, non_blocking: bool = False, ptr: int = 0) -> None:
        self.ptr = 0 if null else next(_handles)
        self.non_blocking = non_blocking
        self.device_id = -1 if null else runtime.getDevice()
        self.waited: list[Event] = []
        if not null:
            _order.register_stream((self.device_id, self.ptr), blocking=not non_blocking)

    def _key(self) -> _order.Key:
        if self.ptr == 0:
            return (runtime.getDevice(), 0)
        return (self.device_id, self.ptr)

    def __del__(self) -> None:
        # cupy destroys a stream it created when the Stream object is collected
        if self.ptr and type(self) is Stream:
            with contextlib.suppress(TypeError, AttributeError):  # collected at exit
                _order.destroyed((self.device_id, self.ptr))

    def __enter__(self) -> Stream:
        _stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _stack().pop()

    def use(self) -> Stream:
        stack = _stack()
        stack[:] = [self]
        return self

    def synchronize(self) -> None:
        """cudaStreamSynchronize: the stream's work (and what it waited for) is complete."""
        _order.host_wait(self._key())

    def record(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        """cudaStreamWaitEvent: later work on this stream runs after the event's."""
        self.waited.append(event)
        del self.waited[:-8]  # kept for inspection only, bounded
        if event.key is not None:
            _order.wait(self._key(), event.key, event.count, event.covered, event.time)

    @property
    def done(self) -> bool:
        """cudaStreamQuery: whether the stream's work is complete, never blocking."""
        event = self.record(Event())
        return event.query()

    def __repr__(self) -> str:
        return f"<Stream {self.ptr:#x} (device {self.device_id})>"


class ExternalStream(Stream):
    """A stream made elsewhere, by handle (``cupy.cuda.ExternalStream``). Handles 1 and 2
    (DLPack's legacy and per-thread default streams) are the current device's legacy
    default stream here; other handles must belong to a stream made by this module."""

    def __init__(self, ptr: int, device_id: int = -1) -> None:
        self.ptr = 0 if int(ptr) in (0, 1, 2) else int(ptr)
        self.non_blocking = False
        self.device_id = runtime.getDevice() if device_id < 0 else int(device_id)
        self.waited = []


Stream.null = Stream(null=True)


def _stack() -> list[Stream]:
    stack = getattr(_local, "streams", None)
    if stack is None:
        stack = _local.streams = []
    return stack


def get_current_stream(device_id: Any = None) -> Stream:
    stack = _stack()
    return stack[-1] if stack else Stream.null


def current_key() -> _order.Key:
    """Where work issued now goes: the current stream, on the current device (refused
    for a stream of another device, as CUDA refuses the launch)."""
    return _order.current_key(get_current_stream(), runtime.getDevice())
