"""Host memory for chunks and batches: buffers reused once no array refers to them.

A chunk's blocks are hundreds of megabytes, and fresh memory mapped in page by page on
first touch costs about as much as the shuffle itself. `BufferPool` lends large arrays
over buffers it keeps, each taken back once no array refers to it any more, and maps a
new buffer's pages in with one system call (`populated_empty`, `map_in`: without the
GIL, and only the bytes asked for). `PooledNumpy` is the array namespace the batching
code runs with on the CPU (numpy, its new arrays from a pool); `PinnedNumpy` makes them
in page-locked memory, which a GPU copies from at the bus's full speed.
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import DTypeLike, NDArray

__all__ = [
    "BufferPool",
    "PinnedNumpy",
    "PooledNumpy",
    "map_in",
    "pinned_buffer",
    "pinned_empty",
    "populated_empty",
]


def _size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to one of four sizes per doubling (at most 25% more).

    Chunks and carried rows vary in size from one chunk to the next; rounding makes
    buffers of nearly equal requests interchangeable.

    Examples:
        >>> [_size_class(n) >> 20 for n in (128 << 20, 129 << 20, 159 << 20, 161 << 20)]
        [128, 160, 160, 192]
    """
    step = 1 << max(nbytes.bit_length() - 3, 12)
    return -(-nbytes // step) * step


# madvise(2) advice that maps pages in for writing (Linux 5.14 and later).
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise``, called through ctypes, which lets the GIL go for the call
    (``mmap.madvise`` holds it: mapping in a gigabyte stopped every other thread of the
    loader for a quarter of a second); None where there is none to call."""
    if sys.platform != "linux":
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def _populate(address: int, nbytes: int) -> bool:
    """Map in the pages of ``nbytes`` bytes from ``address`` for writing, at once and
    without the GIL; returns whether they were. Where the advice is unknown (older
    kernels, other systems), they are mapped in on first touch instead."""
    madvise = _madvise()
    if madvise is None or nbytes <= 0:
        return False
    first = address - address % mmap.PAGESIZE
    stop = -(-(address + nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE
    return madvise(first, stop - first, _MADV_POPULATE_WRITE) == 0


def _map_memory(nbytes: int, used: int | None = None) -> mmap.mmap:
    """Fresh, page-aligned, private anonymous memory of ``nbytes``, its first ``used``
    bytes (all by default) mapped in at once.

    Mapping the pages in with one system call is several times faster than one page
    fault per page on first touch; the rest of a buffer rounded up to its size class is
    left unmapped, so it takes no memory until a larger request reuses the buffer. The
    memory is not marked for transparent huge pages (numpy marks its large arrays), so
    the kernel never stalls compacting memory to find them: both were the cost of a
    loader's first epoch. The other threads run meanwhile (see `_madvise`).

    Examples:
        >>> memory = _map_memory(1 << 20, used=4096)
        >>> len(memory)
        1048576
    """
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    used = nbytes if used is None else min(used, nbytes)
    if used:
        _populate(ctypes.addressof(ctypes.c_char.from_buffer(memory)), used)
    return memory


def populated_empty(shape: tuple[int, ...], dtype: Any, *, populate: bool = True) -> NDArray[Any]:
    """An empty array in fresh memory mapped in at once (see `_map_memory`), for a
    large array filled right away, such as a decoded cache; freed with the array.

    With ``populate=False`` no page is mapped in yet: `map_in` maps in each part just
    before it is written, by the thread writing it (a cache filled piece by piece maps
    its gigabytes in on the threads that write them, alongside the decoder, instead of
    all at once before the first piece).

    Examples:
        >>> a = populated_empty((3, 2), "float32")
        >>> a.shape, a.dtype, a.flags.writeable, a.ctypes.data % 4096
        ((3, 2), dtype('float32'), True, 0)
    """
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    memory = _map_memory(nbytes, used=None if populate else 0)
    return np.frombuffer(memory, dtype, count=math.prod(shape)).reshape(shape)


def map_in(array: NDArray[Any]) -> bool:
    """Map in the pages of a contiguous ``array`` for writing, at once and without the
    GIL (the pages of a `populated_empty` array made with ``populate=False``: see there);
    returns whether they were (else first touch maps them in).

    Examples:
        >>> a = populated_empty((1024, 2), "int64", populate=False)
        >>> _ = map_in(a[10:20])
        >>> a[10:20] = 7
        >>> int(a[10:20].sum())
        140
    """
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        raise ValueError("map_in maps in a contiguous array's memory")
    return _populate(array.ctypes.data, array.nbytes)


class BufferPool:
    """Large host arrays whose memory is reused once no array refers to it any more.

    A chunk's blocks are hundreds of megabytes. Fresh memory costs as much to map in
    as the shuffle itself; reusing the memory of blocks already consumed avoids that.
    A buffer is lent out as a numpy array over a memoryview that only that array (and
    its views, and tensors made from them) keep alive, so a weak reference to the
    memoryview says exactly when the buffer is free again.

    What the pool keeps is bounded by what the loader holds at once, not by the data:
    requests are rounded up to size classes (so buffers are interchangeable), and idle
    buffers, smallest first, are released whenever keeping them would take the pool
    beyond ``slack`` times the most it ever had lent out at once. It keeps what the
    loader keeps using, not all that a rare moment needed: an idle buffer not lent again
    while the pool lent ``stale_after`` times that most is released. Arrays are 64-byte
    aligned (page aligned, in fact).

    Examples:
        >>> pool = BufferPool()
        >>> a = pool.empty((1 << 18,), "int64")
        >>> a.ctypes.data % 64, pool.idle_bytes()
        (0, 0)
        >>> del a
        >>> pool.idle_bytes() > 0
        True
    """

    min_bytes = 1 << 20
    """Smaller arrays come from numpy directly."""
    max_buffers = 16
    """Buffers kept at most; idle ones beyond this are released."""
    slack = 1.25
    """Pooled bytes kept at most, as a multiple of the most bytes ever lent at once."""
    stale_after = 4.0
    """An idle buffer is released once the pool has lent this multiple of the most bytes
    ever lent at once without lending that buffer. In a steady stream a chunk's buffer is
    lent again after about two chunks' worth of blocks and batches, well within that; a
    buffer mapped for a rare moment (a third chunk in flight, an extra batch queued)
    would otherwise stay resident for good, and memory crept up from epoch to epoch."""

    def __init__(
        self,
        allocate: Callable[[int, int], Any] = _map_memory,
        *,
        min_bytes: int | None = None,
        max_buffers: int | None = None,
    ) -> None:
        self._allocate = allocate
        """Makes a buffer: ``allocate(size, used)`` (`_map_memory`, or `pinned_buffer`)."""
        if min_bytes is not None:
            self.min_bytes = min_bytes
        if max_buffers is not None:
            self.max_buffers = max_buffers
        self._lock = threading.Lock()
        self._buffers: list[Any] = []
        self._leases: list[weakref.ref[memoryview] | None] = []
        self._used: list[int] = []  # when each buffer was last lent (the clock then)
        self._clock = 0  # bytes lent so far
        self._peak_lent = 0

    def _idle(self, i: int) -> bool:
        lease = self._leases[i]
        return lease is None or lease() is None

    def idle_bytes(self) -> int:
        with self._lock:
            return sum(len(b) for i, b in enumerate(self._buffers) if self._idle(i))

    @property
    def peak_lent_bytes(self) -> int:
        """The most bytes (of whole buffers) lent out at once so far."""
        return self._peak_lent

    def pooled_bytes(self) -> int:
        """Bytes the pool holds, lent or idle."""
        with self._lock:
            return sum(len(b) for b in self._buffers)

    def empty(self, shape: tuple[int, ...], dtype: DTypeLike) -> NDArray[Any]:
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        nbytes = count * dtype.itemsize
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype)
        size = _size_class(nbytes)
        with self._lock:
            idle = [self._idle(i) for i in range(len(self._buffers))]
            # The smallest idle buffer that fits without wasting more than half of it.
            fits = [
                (len(memory), i)
                for i, memory in enumerate(self._buffers)
                if size <= len(memory) <= 2 * size and idle[i]
            ]
            best = min(fits)[1] if fits else -1
            if best < 0:
                lent = sum(len(b) for b, free in zip(self._buffers, idle, strict=True) if not free)
                self._peak_lent = max(self._peak_lent, lent + size)
                self._release_idle(idle, room=size)
                self._buffers.append(self._allocate(size, nbytes))
                self._leases.append(None)
                self._used.append(0)
                best = len(self._buffers) - 1
            self._clock += len(self._buffers[best])
            self._used[best] = self._clock
            view = memoryview(self._buffers[best])[:nbytes]
            flat = np.frombuffer(view, dtype=dtype)
            self._leases[best] = weakref.ref(flat.base)  # type: ignore[arg-type]
            self._release_stale()
        return flat.reshape(shape)

    def _release_idle(self, idle: list[bool], room: int) -> None:
        """Release idle buffers, smallest first, to make ``room`` bytes."""
        budget = self.slack * self._peak_lent - room
        total = sum(len(b) for b in self._buffers)
        count = len(self._buffers)
        drop = set()
        # Smallest first: they are the cheapest to map in again, and the big ones (whole
        # chunks) are the ones every chunk asks for.
        free = [i for i, f in enumerate(idle) if f]
        for i in sorted(free, key=lambda i: (len(self._buffers[i]), self._used[i])):
            if total <= budget and count < self.max_buffers:
                break
            total -= len(self._buffers[i])
            count -= 1
            drop.add(i)
        self._keep([i for i in range(len(self._buffers)) if i not in drop])

    def _release_stale(self) -> None:
        """Release the idle buffers not lent for a long while (see ``stale_after``)."""
        horizon = self.stale_after * self._peak_lent
        stale = {
            i
            for i in range(len(self._buffers))
            if self._clock - self._used[i] > horizon and self._idle(i)
        }
        if stale:
            self._keep([i for i in range(len(self._buffers)) if i not in stale])

    def _keep(self, keep: list[int]) -> None:
        """Keep only buffers ``keep`` (indices, in order); the others are released."""
        self._buffers = [self._buffers[i] for i in keep]
        self._leases = [self._leases[i] for i in keep]
        self._used = [self._used[i] for i in keep]


class PooledNumpy:
    """The array namespace the batching code runs with on the CPU: numpy, pooled memory.

    Examples:
        >>> import numpy as np
        >>> xp = PooledNumpy(BufferPool())
        >>> xp.take(np.array([[1, 2], [3, 4]]), np.array([1, 0]), axis=0).tolist()
        [[3, 4], [1, 2]]
    """

    def __init__(self, pool: BufferPool) -> None:
        self.pool = pool

    def empty(self, shape: tuple[int, ...], dtype: DTypeLike) -> NDArray[Any]:
        return self.pool.empty(shape, dtype)

    def take(
        self,
        array: NDArray[Any],
        indices: NDArray[np.int64],
        axis: int = 0,
        out: NDArray[Any] | None = None,
    ) -> NDArray[Any]:
        if out is None:
            shape = list(array.shape)
            shape[axis] = len(indices)
            out = self.empty(tuple(shape), array.dtype)
        # Indices come from a permutation of the rows, so they are in range: "clip" skips
        # the bounds-checking copy numpy makes in its default mode.
        np.take(array, indices, axis=axis, out=out, mode="clip")
        return out

    def concatenate(
        self, arrays: Sequence[NDArray[Any]], axis: int = 0, out: NDArray[Any] | None = None
    ) -> NDArray[Any]:
        if out is None:
            shape = list(arrays[0].shape)
            shape[axis] = sum(a.shape[axis] for a in arrays)
            out = self.empty(tuple(shape), np.result_type(*arrays))
        np.concatenate(arrays, axis=axis, out=out)
        return out

    def hand_over(self, batch: Any = None) -> None:
        """Nothing to order: numpy's work is done when its calls return."""

    def chunk_ready(self) -> None:
        """Nothing to wait for: a chunk is complete when it is read (see ``hand_over``)."""

    def wait_for(self, ready: None) -> None:
        """Nothing to wait for (see ``hand_over``)."""


def pinned_buffer(cupy: Any, nbytes: int, used: int = 0) -> memoryview:
    """``nbytes`` of page-locked (pinned) host memory, straight from the driver and
    unlocked once nothing refers to it any more.

    Not ``cupy.cuda.alloc_pinned_memory``: that takes from cupy's pinned memory pool,
    which keeps the memory given back page-locked until ``free_all_blocks()``
    (``cupy/cuda/pinned_memory.pyx``), so a loader's cache would stay locked after
    ``close()``, and no other process could have that RAM."""
    memory = cupy.cuda.PinnedMemory(nbytes, cupy.cuda.runtime.hostAllocPortable)
    return memoryview(cupy.cuda.PinnedMemoryPointer(memory, 0))


def pinned_empty(cupy: Any, shape: tuple[int, ...], dtype: DTypeLike) -> NDArray[Any]:
    """An empty array of its own in page-locked host memory (see `pinned_buffer`),
    unlocked when the array and its views are gone."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    if count == 0:
        return np.empty(shape, dtype)
    buffer = pinned_buffer(cupy, count * dtype.itemsize)
    return np.frombuffer(buffer, dtype, count).reshape(shape)


class PinnedNumpy(PooledNumpy):
    """numpy, its new arrays in page-locked (pinned) host memory, copied to the device
    asynchronously at the bus's full speed: buffers of its own pool (`pinned_buffer`),
    reused while it lives and unlocked once it and the arrays lent from it are gone."""

    def __init__(self, cupy: Any) -> None:
        # Every array pinned, however small; and more buffers kept than for pageable
        # memory (a window holds one per block): page-locking memory, and unlocking it
        # (which waits for the device), cost far more than mapping it in.
        pool = BufferPool(functools.partial(pinned_buffer, cupy), min_bytes=0, max_buffers=256)
        super().__init__(pool)
