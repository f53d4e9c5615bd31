"""Emulated ``cupy.cuda``: devices, streams and events (work is synchronous on the host)."""

from __future__ import annotations

import itertools
import threading
from typing import Any

from . import memory, runtime
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
)
from .runtime import CUDARuntimeError

__emulated__ = True

__all__ = [
    "BaseMemory",
    "CUDARuntimeError",
    "Device",
    "Event",
    "Memory",
    "MemoryPointer",
    "MemoryPool",
    "OutOfMemoryError",
    "Stream",
    "UnownedMemory",
    "alloc",
    "get_allocator",
    "get_current_stream",
    "memory",
    "runtime",
    "set_allocator",
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
        runtime._check(self.id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


_local = threading.local()
_handles = itertools.count(0x1000, 0x10)


class Event:
    """A point in a stream; always complete, since the emulated work is synchronous."""

    def __init__(self, block: bool = False, disable_timing: bool = False) -> None:
        self.stream: Stream | None = None

    def record(self, stream: Stream | None = None) -> None:
        self.stream = get_current_stream() if stream is None else stream

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    done = property(query)


class Stream:
    """A stream of the device current at creation; ``with stream:`` makes it current."""

    null: Stream

    def __init__(self, null: bool = False, non_blocking: bool = False, ptr: int = 0) -> None:
        self.ptr = 0 if null else next(_handles)
        self.non_blocking = non_blocking
        self.device_id = -1 if null else runtime.getDevice()
        self.waited: list[Event] = []

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
        pass

    def record(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        self.waited.append(event)
        del self.waited[:-8]  # kept for inspection only, bounded

    @property
    def done(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<Stream {self.ptr:#x} (device {self.device_id})>"


Stream.null = Stream(null=True)


def _stack() -> list[Stream]:
    stack = getattr(_local, "streams", None)
    if stack is None:
        stack = _local.streams = []
    return stack


def get_current_stream(device_id: Any = None) -> Stream:
    stack = _stack()
    return stack[-1] if stack else Stream.null
