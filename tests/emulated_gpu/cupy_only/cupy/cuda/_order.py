"""The order of device work across streams, checked: the emulated device's race detector.

The emulated device runs every kernel at once on the host, so it cannot show a race by
delivering wrong bytes. Instead it keeps, for every allocation, which stream last wrote
it and which streams read it, and refuses (``RaceError``) an access that real CUDA would
not order after them. The rules, from the CUDA C++ Programming Guide ("Streams",
"Default Stream", "Implicit Synchronization", "Events") and the CUDA runtime API:

- Work on one stream runs in issue order.
- The legacy default stream (handle 0; ``cupy.cuda.Stream.null``; DLPack's stream 1) is
  one per device. Work issued to it waits for all earlier work of the *blocking* streams
  of that device, and work issued to a blocking stream waits for earlier work of the
  legacy stream. A stream created with ``non_blocking=True`` (cudaStreamNonBlocking) is
  ordered with neither.
- ``stream.wait_event(event)`` (cudaStreamWaitEvent) orders the stream's later work
  after what the event's stream had issued when the event was recorded (and, through
  it, after whatever that stream had waited for).
- ``stream.synchronize()``, ``event.synchronize()``, ``Device.synchronize()``
  (cudaDeviceSynchronize) and ``cudaFree`` make the host wait: the work they cover is
  complete, so anything issued later, on any stream, is ordered after it.
- A stream belongs to the device current when it was created; issuing work to it while
  another device is current fails (cudaErrorInvalidResourceHandle, "invalid resource
  handle").

Memory pools order reuse by stream (rmm's stream-ordered pools; cupy's pool keeps free
blocks per stream): memory freed on a stream is handed out again to that stream without a
wait, so its old accesses stay on record for the new owner; a pool handing it to another
stream synchronises first, so they are dropped. Host reads (``ndarray.get``) wait for
the current stream only.

Every host wait is also counted, per thread (``host_waits``): a wait costs the host the
time the device still needs for the work before it, so the tests hold the loader's
threads to none. Besides the explicit ones above, cupy waits when it must know a size on
the host: boolean-mask indexing and ``nonzero`` (and ``where`` with one argument) copy
the count of true elements to the host (``int(...)`` of a device scalar, in
``cupy/_core/_routines_indexing.pyx``; cupy's own test helper
``cupy.testing.is_indexing_cause_synchronize`` lists boolean indexing as synchronizing).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Any

__emulated__ = True

Key = tuple[int, int]
"""(device, stream handle); the legacy default stream's handle is 0."""

_lock = threading.RLock()
_issued: dict[Key, int] = {}  # operations issued to each stream so far
_done: dict[Key, int] = {}  # operations the host has waited for
_waits: dict[Key, dict[Key, int]] = {}  # stream -> {stream it waited for: up to op}
_blocking: dict[Key, bool] = {}
_host_waits: collections.Counter[str] = collections.Counter()  # thread name -> host waits


class RaceError(RuntimeError):
    """Device memory accessed on a stream that CUDA does not order after its last use."""


@dataclass
class History:
    """The accesses of one allocation: the last write and the reads since, per stream."""

    writes: dict[Key, int] = field(default_factory=dict)
    reads: dict[Key, int] = field(default_factory=dict)


_destroyed: set[Key] = set()  # streams destroyed (their objects collected)
_broken: list[str] = []  # what made the emulated device unusable, raised at the next use

_live: dict[int, History] = {}  # allocation base address -> its history
_freed: list[tuple[int, int, Key, History]] = []  # (start, end, freeing stream, history)
_FREED_KEPT = 4096


def register_stream(key: Key, *, blocking: bool) -> None:
    with _lock:
        _blocking[key] = blocking


def is_blocking(key: Key) -> bool:
    return key[1] == 0 or _blocking.get(key, True)


def destroyed(key: Key) -> None:
    """A stream was destroyed (cudaStreamDestroy, when cupy's Stream object is collected)."""
    with _lock:
        _destroyed.add(key)


def issue(key: Key) -> int:
    """One more operation on ``key``; returns its number."""
    with _lock:
        if _broken:
            raise RuntimeError(_broken[0])
        if key in _destroyed:
            raise RuntimeError(f"emulated CUDA: work issued to {_describe(key)}, destroyed")
        n = _issued.get(key, 0) + 1
        _issued[key] = n
        return n


def issued(key: Key) -> int:
    with _lock:
        return _issued.get(key, 0)


def _ordered(src: Key, n: int, dst: Key) -> bool:
    """Whether work on ``dst`` issued from now on runs after operation ``n`` of ``src``."""
    if src == dst or _done.get(src, 0) >= n or _waits.get(dst, {}).get(src, 0) >= n:
        return True
    if src[0] != dst[0]:
        return False
    legacy_src, legacy_dst = src[1] == 0, dst[1] == 0
    # the legacy default stream and the blocking streams of a device order each other
    return (legacy_src and is_blocking(dst)) or (legacy_dst and is_blocking(src))


def snapshot(key: Key) -> tuple[int, dict[Key, int]]:
    """What an event recorded on ``key`` now covers."""
    with _lock:
        covered = dict(_waits.get(key, {}))
        # an event on the legacy stream also covers the blocking streams' earlier work
        if key[1] == 0:
            for other, count in _issued.items():
                if other[0] == key[0] and other != key and is_blocking(other):
                    covered[other] = max(covered.get(other, 0), count)
        return _issued.get(key, 0), covered


def wait(dst: Key, src: Key, n: int, covered: dict[Key, int]) -> None:
    """``dst`` waits for an event recorded on ``src`` at operation ``n``."""
    with _lock:
        waited = _waits.setdefault(dst, {})
        for key, count in [(src, n), *covered.items()]:
            if key != dst:
                waited[key] = max(waited.get(key, 0), count)


def complete(key: Key, n: int | None = None, covered: dict[Key, int] | None = None) -> None:
    """The host waited for ``key`` up to operation ``n`` (all of it by default)."""
    with _lock:
        n = _issued.get(key, 0) if n is None else n
        _done[key] = max(_done.get(key, 0), n)
        extra = _waits.get(key, {}) if covered is None else covered
        for other, count in extra.items():
            _done[other] = max(_done.get(other, 0), count)


def host_wait(key: Key, n: int | None = None, covered: dict[Key, int] | None = None) -> None:
    """The host blocked until ``key``'s work up to operation ``n`` was done (counted)."""
    with _lock:
        _host_waits[threading.current_thread().name] += 1
    complete(key, n, covered)


def host_waits() -> dict[str, int]:
    """The host waits so far, per thread name (the loader's threads are ``tabloader-*``)."""
    with _lock:
        return dict(_host_waits)


def host_wait_device(device: int) -> None:
    """The host blocked until all work of ``device`` was done (counted)."""
    with _lock:
        _host_waits[threading.current_thread().name] += 1
        for key in list(_issued):
            if key[0] == device:
                _done[key] = _issued[key]


def _describe(key: Key) -> str:
    kind = "legacy default stream" if key[1] == 0 else f"stream {key[1]:#x}"
    return f"the {kind} of device {key[0]}"


def access(history: History | None, key: Key, n: int, *, write: bool, what: str) -> None:
    """Check and record an access to memory with ``history`` by operation ``n`` of ``key``."""
    if history is None:
        return
    with _lock:
        for src, count in list(history.writes.items()):
            if not _ordered(src, count, key):
                raise RaceError(
                    f"emulated CUDA: {what} on {_describe(key)} reads memory written on "
                    f"{_describe(src)} without waiting for it (no event, no synchronise): on "
                    "a GPU it could read the bytes before they are written"
                )
        if write:
            for src, count in list(history.reads.items()):
                if not _ordered(src, count, key):
                    raise RaceError(
                        f"emulated CUDA: {what} on {_describe(key)} overwrites memory that "
                        f"{_describe(src)} still reads (no event orders it after that read): "
                        "on a GPU it could change the bytes under that stream's kernels"
                    )
            history.writes = {key: n}
            history.reads = {}
        else:
            history.reads[key] = max(history.reads.get(key, 0), n)


def history(base: int) -> History | None:
    with _lock:
        return _live.get(base)


def allocated(base: int, size: int, key: Key) -> None:
    """A new allocation ``[base, base + size)`` for stream ``key``: memory freed on the
    same stream keeps its accesses on record; freed on another, the pool synchronised."""
    with _lock:
        inherited = History()
        keep = []
        for start, end, freer, old in _freed:
            if start < base + size and base < end:
                if freer == key:
                    for src, count in old.writes.items():
                        inherited.writes[src] = max(inherited.writes.get(src, 0), count)
                    for src, count in old.reads.items():
                        inherited.reads[src] = max(inherited.reads.get(src, 0), count)
                continue
            keep.append((start, end, freer, old))
        _freed[:] = keep
        _live[base] = inherited


def freed(base: int, size: int, key: Key | None) -> None:
    """``[base, base + size)`` went back to a pool for stream ``key`` (None: to the driver,
    cudaFree, which synchronises the device)."""
    with _lock:
        old = _live.pop(base, None)
        if key is not None and key in _destroyed and not _broken:
            # rmm's pools keep a freed block in the free list of the stream it was freed on,
            # and synchronise with that stream when another stream takes the block: a
            # destroyed stream there is a dangling handle (seen on a GPU: a crash in a
            # garbage collection). Reported at the next use of the device.
            _broken.append(
                f"emulated CUDA: memory freed on {_describe(key)} after that stream was "
                "destroyed; a stream-ordered pool would later use the dead stream (on a GPU: "
                "a crash). Keep a stream alive while memory allocated on it can be freed"
            )
        if old is None or key is None or not (old.writes or old.reads):
            return
        _freed.append((base, base + size, key, old))
        del _freed[:-_FREED_KEPT]


def reset() -> None:
    """Forget all streams and histories (tests)."""
    with _lock:
        for table in (_issued, _done, _waits, _blocking, _live):
            table.clear()
        _freed.clear()
        _destroyed.clear()
        _broken.clear()


def current_key(stream: Any, device: int) -> Key:
    """The key of ``stream`` used while ``device`` is current; refuses another device's."""
    from .runtime import CUDARuntimeError

    if stream.ptr == 0:
        return (device, 0)
    if stream.device_id != device:
        # CUDA C++ Programming Guide, "Stream and Event Behavior": "A kernel launch will
        # fail if it is issued to a stream that is not associated to the current device."
        raise CUDARuntimeError(
            "cudaErrorInvalidResourceHandle",
            f"invalid resource handle (a stream of device {stream.device_id} used while "
            f"device {device} is current)",
        )
    return (device, stream.ptr)
