"""The order and the time of device work across streams: the emulated device's clock and
its race detector.

The emulated device computes every kernel's values at once on the host, so it cannot show
a race by delivering wrong bytes. Instead it keeps, for every allocation, which stream
last wrote it and which streams read it, and refuses (``RaceError``) an access that real
CUDA would not order after them, whether or not the earlier access has run by the clock.

**A stream is a queue with a clock.** Every operation issued to a stream takes time
(`KERNEL_SECONDS` a launch, plus its bytes at `BYTES_PER_SECOND`; a sleep kernel, `sleep`,
takes what it is told) and starts when the stream's earlier work, the events it was told
to wait for and, for the legacy default stream and the blocking streams, each other's
earlier work are done. Times are the host's monotonic clock: a host wait (a synchronise,
a copy to the host) blocks the calling thread until the work it waits for ends by that
clock, and ``Event.query()``/``Stream.done`` say True only once it has (never blocking).
So a consumer can be slower than the loader (a sleep queued before its reads), a wait on
an event shows as time the waiting thread is blocked (`host_wait_seconds`), and a test can
ask when an event's work ends (`event_time`) without waiting for it. The ordering rules
below decide what is a race; the clock decides when work runs, what a query sees and how
long a host wait blocks. The rules, from the CUDA C++ Programming Guide ("Streams",
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

Memory handed out again keeps its accesses on record for the new owner, whichever
stream it goes to: the pool that hands it out decides the order, and says so through
the calls above. rmm's stream-ordered pools (``rmm/mr/detail/stream_ordered_memory_resource.hpp``,
emulated in ``rmm.mr``) keep a free list per stream: a block freed on a stream goes back
to that stream with no synchronisation, and to another stream after that stream waits
for the event the freeing stream recorded when it freed the block (``cudaStreamWaitEvent``),
which orders nothing a third stream did; cupy's pool keeps free blocks per stream and
reuses them only on that stream. ``cudaFree`` synchronises the device, so memory freed to
the driver keeps nothing on record. A read of memory handed out again is then refused at
the new owner's first write unless the old reads were ordered before it, and the message
says whether the read had run by the clock or was still queued. Host reads
(``ndarray.get``) wait for the current stream only.

Every host wait is also counted, per thread (``host_waits``): a wait costs the host the
time the device still needs for the work before it, so the tests hold the loader's
threads to none. Besides the explicit ones above, cupy waits when it must know a size on
the host: boolean-mask indexing and ``nonzero`` (and ``where`` with one argument) copy
the count of true elements to the host (``int(...)`` of a device scalar, in
``cupy/_core/_routines_indexing.pyx``; cupy's own test helper
``cupy.testing.is_indexing_cause_synchronize`` lists boolean indexing as synchronizing).
"""

from __future__ import annotations

import bisect
import collections
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__emulated__ = True

KERNEL_SECONDS = float(os.environ.get("TABLOADER_EMULATED_KERNEL_SECONDS", "2e-6"))
"""What a launch takes on the emulated device's clock, whatever it does."""
BYTES_PER_SECOND = float(os.environ.get("TABLOADER_EMULATED_GPU_BANDWIDTH", "1e11"))
"""How fast an emulated kernel goes through the bytes it reads: slower than a GPU, so that
time shows."""
_SLEEP_FLOOR = 1e-4  # shorter host waits spin instead of sleeping (time.sleep overshoots)

Key = tuple[int, int]
"""(device, stream handle); the legacy default stream's handle is 0."""

_lock = threading.RLock()
_issued: dict[Key, int] = {}  # operations issued to each stream so far
_done: dict[Key, int] = {}  # operations the host has waited for
_waits: dict[Key, dict[Key, int]] = {}  # stream -> {stream it waited for: up to op}
_blocking: dict[Key, bool] = {}
_host_waits: collections.Counter[str] = collections.Counter()  # thread name -> host waits
_blocked: collections.Counter[str] = collections.Counter()  # thread name -> seconds blocked
_tail: dict[Key, float] = {}  # when the last operation issued to each stream ends
_gate: dict[Key, float] = {}  # later operations of a stream start no earlier (its waits)


class RaceError(RuntimeError):
    """Device memory accessed on a stream that CUDA does not order after its last use."""


@dataclass
class History:
    """The accesses of one allocation: the last write and the reads since, per stream,
    and when by the clock each stream's last read of it ends."""

    writes: dict[Key, int] = field(default_factory=dict)
    reads: dict[Key, int] = field(default_factory=dict)
    read_ends: dict[Key, float] = field(default_factory=dict)


_destroyed: set[Key] = set()  # streams destroyed (their objects collected)
_broken: list[str] = []  # what made the emulated device unusable, raised at the next use
_late: list[str] = []  # races found where they cannot be raised (a free), raised once next

_live: dict[int, History] = {}  # allocation base address -> its history
_sizes: dict[int, int] = {}  # allocation base address -> its size
_bases: list[int] = []  # the keys of _live, sorted
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


def _after(key: Key) -> float:
    """When work issued to ``key`` now may start: after the stream's earlier work and its
    waits, and for the legacy default stream after every blocking stream's earlier work
    (and for a blocking stream after the legacy stream's)."""
    start = max(_tail.get(key, 0.0), _gate.get(key, 0.0))
    if key[1] == 0:
        for other, end in _tail.items():
            if other[0] == key[0] and other != key and is_blocking(other):
                start = max(start, end)
    elif is_blocking(key):
        start = max(start, _tail.get((key[0], 0), 0.0))
    return start


def issue(key: Key, seconds: float | None = None) -> int:
    """One more operation on ``key``, taking ``seconds`` (`KERNEL_SECONDS` by default)
    once the stream gets to it; returns its number."""
    with _lock:
        if _broken:
            raise RuntimeError(_broken[0])
        if _late:
            message = _late.pop(0)
            _late.clear()
            raise RaceError(message)
        if key in _destroyed:
            raise RuntimeError(f"emulated CUDA: work issued to {_describe(key)}, destroyed")
        n = _issued.get(key, 0) + 1
        _issued[key] = n
        start = max(time.monotonic(), _after(key))
        _tail[key] = start + (KERNEL_SECONDS if seconds is None else float(seconds))
        return n


def kernel_seconds(nbytes: int) -> float:
    """What a kernel over ``nbytes`` bytes takes on the emulated clock."""
    return KERNEL_SECONDS + nbytes / BYTES_PER_SECOND


def sleep(seconds: float, key: Key) -> int:
    """Queue a kernel that does nothing for ``seconds`` on stream ``key`` (a test's slow
    consumer: on a GPU, ``torch.cuda._sleep(cycles)`` or a spinning kernel)."""
    return issue(key, seconds)


def ends(key: Key) -> float:
    """When the work issued to ``key`` so far ends, on the clock (``time.monotonic()``)."""
    with _lock:
        return max(_tail.get(key, 0.0), _after(key))


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


def snapshot(key: Key) -> tuple[int, dict[Key, int], float]:
    """What an event recorded on ``key`` now covers, and when that work ends."""
    with _lock:
        covered = dict(_waits.get(key, {}))
        # an event on the legacy stream also covers the blocking streams' earlier work
        if key[1] == 0:
            for other, count in _issued.items():
                if other[0] == key[0] and other != key and is_blocking(other):
                    covered[other] = max(covered.get(other, 0), count)
        return _issued.get(key, 0), covered, max(_tail.get(key, 0.0), _after(key))


def wait(dst: Key, src: Key, n: int, covered: dict[Key, int], when: float = 0.0) -> None:
    """``dst`` waits for an event recorded on ``src`` at operation ``n``, whose work ends
    at ``when``: its later work starts no earlier."""
    with _lock:
        waited = _waits.setdefault(dst, {})
        for key, count in [(src, n), *covered.items()]:
            if key != dst:
                waited[key] = max(waited.get(key, 0), count)
        _gate[dst] = max(_gate.get(dst, 0.0), when)


def complete(key: Key, n: int | None = None, covered: dict[Key, int] | None = None) -> None:
    """The host knows that ``key``'s work up to operation ``n`` (all of it by default) is
    done: later work on any stream is ordered after it."""
    with _lock:
        n = _issued.get(key, 0) if n is None else n
        _done[key] = max(_done.get(key, 0), n)
        extra = _waits.get(key, {}) if covered is None else covered
        for other, count in extra.items():
            _done[other] = max(_done.get(other, 0), count)


def is_complete(key: Key, n: int) -> bool:
    """Whether the host already knows operation ``n`` of ``key`` to be done."""
    with _lock:
        return _done.get(key, 0) >= n


def _block_until(when: float) -> None:
    """Block the calling thread until ``when`` on the clock, counting the seconds."""
    left = when - time.monotonic()
    if left <= 0:
        return
    if left > _SLEEP_FLOOR:
        time.sleep(left)
    with _lock:
        _blocked[threading.current_thread().name] += left


def host_wait(
    key: Key,
    n: int | None = None,
    covered: dict[Key, int] | None = None,
    *,
    until: float | None = None,
    inside: str | None = None,
) -> None:
    """The host blocks until ``key``'s work up to operation ``n`` is done (counted): until
    ``until`` on the clock (by default, when the work issued to ``key`` so far ends).
    ``inside`` names the library that waits (``"libcudf"``): counted under
    ``"<thread> inside <library>"``."""
    name = threading.current_thread().name
    if inside is not None:
        name = f"{name} inside {inside}"
    with _lock:
        _host_waits[name] += 1
        end = ends(key) if until is None else until
    _block_until(end)
    complete(key, n, covered)


def host_waits() -> dict[str, int]:
    """The host waits so far, per thread name (the loader's threads are ``tabloader-*``)."""
    with _lock:
        return dict(_host_waits)


def host_wait_seconds() -> dict[str, float]:
    """The seconds each thread has spent blocked in host waits, by the clock."""
    with _lock:
        return dict(_blocked)


def host_wait_device(device: int) -> None:
    """The host blocks until all work of ``device`` is done (counted)."""
    with _lock:
        _host_waits[threading.current_thread().name] += 1
        end = max([ends(key) for key in _issued if key[0] == device], default=0.0)
    _block_until(end)
    with _lock:
        for key in list(_issued):
            if key[0] == device:
                _done[key] = _issued[key]


def _describe(key: Key) -> str:
    kind = "legacy default stream" if key[1] == 0 else f"stream {key[1]:#x}"
    return f"the {kind} of device {key[0]}"


def _when(end: float) -> str:
    left = end - time.monotonic()
    if left > 0:
        return f"that read is still queued, and runs for another {left * 1e3:.1f} ms"
    return "that read has run by the clock, but nothing made it ordered: on a GPU it may not have"


def access(
    history: History | None, key: Key, n: int, *, write: bool, what: str, record: bool = True
) -> None:
    """Check and record (unless ``record`` is false) an access to memory with ``history``
    by operation ``n`` of ``key``."""
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
                        f"{_describe(src)} still reads (no event orders it after that read; "
                        f"{_when(history.read_ends.get(src, 0.0))}): on a GPU it could change "
                        "the bytes under that stream's kernels"
                    )
            if record:
                history.writes = {key: n}
                history.reads = {}
                history.read_ends = {}
        elif record:
            history.reads[key] = max(history.reads.get(key, 0), n)
            history.read_ends[key] = max(history.read_ends.get(key, 0.0), _tail.get(key, 0.0))


def history(base: int) -> History | None:
    with _lock:
        return _live.get(base)


def history_at(address: int) -> History | None:
    """The history of the live allocation holding ``address`` (a framework's view of
    memory it imported knows an address, not the allocation)."""
    with _lock:
        i = bisect.bisect_right(_bases, int(address)) - 1
        if i < 0:
            return None
        base = _bases[i]
        return _live[base] if int(address) < base + max(_sizes[base], 1) else None


def allocated(base: int, size: int, key: Key) -> None:
    """A new allocation ``[base, base + size)`` for stream ``key``. Memory freed to a pool
    keeps its accesses on record, whichever stream it goes to: the pool orders the new
    stream after the freeing stream where it does so (rmm's wait on the freeing stream's
    event), and nothing else is ordered."""
    with _lock:
        inherited = History()
        keep = []
        for start, end, _freer, old in _freed:
            if start < base + size and base < end:
                for src, count in old.writes.items():
                    inherited.writes[src] = max(inherited.writes.get(src, 0), count)
                for src, count in old.reads.items():
                    inherited.reads[src] = max(inherited.reads.get(src, 0), count)
                for src, t in old.read_ends.items():
                    inherited.read_ends[src] = max(inherited.read_ends.get(src, 0.0), t)
                continue
            keep.append((start, end, _freer, old))
        _freed[:] = keep
        if base not in _live:
            bisect.insort(_bases, base)
        _live[base] = inherited
        _sizes[base] = size


def freed(base: int, size: int, key: Key | None) -> None:
    """``[base, base + size)`` went back to a pool for stream ``key`` (None: to the driver,
    cudaFree, which synchronises the device)."""
    with _lock:
        old = _live.pop(base, None)
        if old is not None:
            _sizes.pop(base, None)
            _bases.pop(bisect.bisect_left(_bases, base))
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
        if old is None or key is None:
            return
        # Freed to a stream-ordered pool on `key`: the pool may hand the memory out again to
        # `key`'s next allocation with no synchronisation, so every access of it must be
        # ordered before `key`'s later work ("all asynchronous accesses of the allocation
        # must happen between the stream executions of the allocation and the free", CUDA
        # runtime API, Stream Ordered Memory Allocator; rmm's pools follow that contract).
        # A read another stream still has queued is a use after free; reported at the next
        # use of the device (the free runs in a garbage collection).
        late = [src for src, count in old.reads.items() if not _ordered(src, count, key)]
        late += [src for src, count in old.writes.items() if not _ordered(src, count, key)]
        if late and not _late:
            src = late[0]
            _late.append(
                f"emulated CUDA: memory freed on {_describe(key)} while {_describe(src)} "
                f"may still use it ({_when(old.read_ends.get(src, 0.0))}): a stream-ordered "
                "pool hands it out again on that stream with no wait, so the next owner can "
                "write it under that stream's kernels. Order the freeing stream after the "
                "other stream's work (an event and a wait) before the memory is let go"
            )
        if not (old.writes or old.reads):
            return
        _freed.append((base, base + size, key, old))
        del _freed[:-_FREED_KEPT]


def forget_races() -> None:
    """Forget a race found at a free and not raised yet (tests that race on purpose)."""
    with _lock:
        _late.clear()


def forget(base: int, size: int) -> None:
    """``[base, base + size)`` went back to the driver (cudaFree, which synchronises the
    device): whatever was done to it, and to the pool blocks inside it, is over."""
    with _lock:
        _freed[:] = [f for f in _freed if not (f[0] < base + size and base < f[1])]


def reset() -> None:
    """Forget all streams and histories (tests)."""
    with _lock:
        for table in (_issued, _done, _waits, _blocking, _live, _sizes, _tail, _gate):
            table.clear()
        _bases.clear()
        _freed.clear()
        _late.clear()
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
