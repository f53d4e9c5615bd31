"""A GPU loader's decoded cache: served from GPU memory, or from pinned host memory.

The cache is filled as on the CPU (`CacheBackend`: the first epoch's pieces decoded
and written into host arrays, or straight into the files of a disk cache), so a seed
gives the CPU backend's cached batches; that epoch's batches are gathered on the host
and copied to the device. Once complete it is *placed* for the epochs after, once per
loader:

- **in GPU memory** when it fits in a share of the device's free memory
  (`$TABLOADER_GPU_CACHE_FRACTION`, 0.5 by default) and leaves the reserve free
  (`$TABLOADER_GPU_CACHE_RESERVE`, a tenth of the device's memory by default), or
  ``cache_placement="device"``: a chunk's order is drawn on the device and each window
  of it is one gather per block there, the columns of a dtype side by side,
  column-major, as streamed batches are. Its memory comes from the driver, not from the
  loader's pool, so that it goes back to the driver when the cache leaves the device;
- **in pinned host memory** otherwise (``cache_placement="host"``): a shuffled chunk
  is copied to the device in stored order (an asynchronous copy per run of the cache
  and block, at the bus's speed, nothing gathered on the host) and permuted there; a
  chunk larger than a streamed one (a global shuffle's) has a window's rows gathered
  on the host by a few threads, straight into pinned memory, and copied to the device
  while the next ones are gathered.

A window is whole batches, about a streamed chunk's bytes (`DEFAULT_CHUNK_BYTES`), and
batches are slices of it: a global shuffle's single chunk of every row never makes a
second copy of the cache on the device.

A disk cache opened by a later loader is placed the same way. Batches are the same
whatever the placement; `LoaderStats.cache_placement` says which was taken.

**The cache gives way to the training step.** When the GPU's free memory falls below the
reserve while a cache lives there (the framework took more), the cache moves to pinned
host memory at the next chunk, with a [`CacheWarning`][tabloader.errors.CacheWarning],
and its GPU memory goes back to the driver; the epoch goes on with the same batches.
A cache that does not fit when it is placed (the driver refuses the memory) is placed in
pinned host memory the same way, or raises
[`GPUMemoryError`][tabloader.errors.GPUMemoryError] with ``cache_placement="device"``.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Generator, Iterator, Mapping, Sequence
from functools import partial
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from tabloader.batches import Ragged
from tabloader.cache.fill import CachedList
from tabloader.cache.serve import CacheBackend, CacheHandle, gather_list
from tabloader.errors import CacheWarning, GPUMemoryError, InvalidArgumentError, warn_caller
from tabloader.hostmem import BufferPool, PinnedNumpy, PooledNumpy, pinned_empty
from tabloader.plan import DEFAULT_CHUNK_BYTES, EpochPlan
from tabloader.stages import Reading, each_step_in, read_in_stages

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from tabloader.batches import Block, Part, Segment
    from tabloader.stages import Backend, ReadRequest, SplitWork
    from tabloader.stats import StatsRecorder

__all__ = [
    "FRACTION_ENV",
    "RESERVE_ENV",
    "CachePlacement",
    "DeviceCacheBackend",
    "DeviceCacheHandle",
    "Placements",
    "device_reserve",
    "device_share",
]

CachePlacement = Literal["auto", "device", "host"]

FRACTION_ENV = "TABLOADER_GPU_CACHE_FRACTION"
"""Share of the device's free memory a decoded cache may take there (``auto``
placement); 0.5 by default."""
DEFAULT_FRACTION = 0.5
RESERVE_ENV = "TABLOADER_GPU_CACHE_RESERVE"
"""Share of the device's memory a decoded cache in GPU memory leaves free for the training
step; below it, the cache moves to pinned host memory. 0.1 by default."""
DEFAULT_RESERVE = 0.1
_COPIES_IN_FLIGHT = 8
"""Pinned staging arrays kept alive, at most, while their copies to the device run."""


def _share(name: str, default: float, meaning: str) -> float:
    setting = os.environ.get(name, "").strip()
    if not setting:
        return default
    try:
        value = float(setting)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise InvalidArgumentError(f"{name}={setting!r} must be a number in [0, 1] ({meaning})")
    return value


def device_share() -> float:
    """The share of free device memory a cache may take (``$TABLOADER_GPU_CACHE_FRACTION``).

    Examples:
        >>> device_share()
        0.5
    """
    return _share(
        FRACTION_ENV,
        DEFAULT_FRACTION,
        "the share of the GPU's free memory a decoded cache may take; 0 keeps caches in "
        "pinned host memory",
    )


def device_reserve() -> float:
    """The share of the device's memory a cache there leaves free
    (``$TABLOADER_GPU_CACHE_RESERVE``).

    Examples:
        >>> device_reserve()
        0.1
    """
    return _share(
        RESERVE_ENV,
        DEFAULT_RESERVE,
        "the share of the GPU's memory a decoded cache there leaves free for the training "
        "step; below it the cache moves to pinned host memory",
    )


class _HostSide:
    """The backend a GPU loader's cache is filled with: host gathers, and the GPU backend
    for whatever the cache does not serve (the rest of an epoch whose filling failed)."""

    groups_columns = False

    def __init__(self, backend: Backend) -> None:
        self.name = backend.name
        self.xp = PooledNumpy(BufferPool())
        self.read_chunks = backend.read_chunks

    def scope(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class _Placed:
    """A complete cache placed for a device: its arrays, and where they live; in pinned
    host memory, also the pinned buffers its windows are gathered into (reused from one
    window and epoch to the next, unlocked with the placement)."""

    def __init__(self, arrays: Mapping[str, Any], where: str, staging: Any = None) -> None:
        self.arrays = dict(arrays)
        self.where = where
        self.staging: PinnedNumpy | None = staging

    @property
    def on_device(self) -> bool:
        return self.where == "device"


class Placements:
    """The complete cache placed for each GPU (device index -> its arrays, and where they
    live): kept by the cache across epochs, written by the epochs served from it."""

    def __init__(self) -> None:
        self._placed: dict[int, _Placed] = {}

    def get(self, device: int) -> _Placed | None:
        return self._placed.get(device)

    def put(self, device: int, placed: _Placed) -> None:
        self._placed[device] = placed

    def clear(self) -> None:
        """Let go of every copy (their memory goes back once no window is gathered from it)."""
        self._placed = {}


class DeviceCacheHandle(CacheHandle, Protocol):
    """What a GPU loader's epoch asks of the cache besides `CacheHandle`'s: whether its rows
    are complete, and its copies placed for each GPU."""

    placements: Placements

    @property
    def complete(self) -> bool:
        """Whether every row is cached."""
        ...


class _Copies:
    """Host arrays copied to the device asynchronously, on the reader's stream: each
    copy's host memory is kept alive until the copy is done, and at most
    `_COPIES_IN_FLIGHT` copies are waited for before the next starts."""

    def __init__(self, xp: Any, layout_blocks: Sequence[Block]) -> None:
        self.xp = xp
        self._blocks = {b.name: b for b in layout_blocks}
        self._pending: deque[tuple[Any, Any]] = deque()  # (event, host array being copied)

    def block(self, host: NDArray[Any], block: Block | None) -> Any:
        """A block on the device, laid out as a streamed chunk's (column-major where
        ``block`` is)."""
        cupy = self.xp.cupy
        if _by_column(host, block):
            # gathered row by row on the host: made column-major on the device, as
            # streamed chunks are, one column copied at a time
            out = cupy.empty((host.shape[1], host.shape[0]), dtype=host.dtype)
            for j in range(host.shape[1]):
                self.array(host[:, j], out=out[j])
            return out.T
        return self.array(host)

    def array(self, host: NDArray[Any], out: Any = None) -> Any:
        """``host`` on the device (in ``out``, or new memory): an asynchronous copy on the
        reader's stream (pinned memory is kept alive until its copy is done)."""
        cupy, stream = self.xp.cupy, self.xp.reader_stream
        host = np.ascontiguousarray(host)
        if out is None:
            out = cupy.empty(host.shape, dtype=host.dtype)
        out.set(host, stream=stream)
        self._pending.append((stream.record(), host))
        while self._pending:  # let go of the copies done; wait only when too many are not
            event = self._pending[0][0]
            if not event.done:
                if len(self._pending) <= _COPIES_IN_FLIGHT:
                    break
                event.synchronize()
            self._pending.popleft()
        return out

    def part(self, part: Part) -> Part:
        """A part gathered on the host, on the device (laid out as the layout's blocks)."""
        segment, index = part
        moved: Segment = {}
        for name, array in segment.items():
            if _is_device(array):
                moved[name] = array
            elif isinstance(array, Ragged):
                moved[name] = Ragged(
                    self.array(np.asarray(array.values)),
                    self.array(np.asarray(array.offsets)),
                    None if array.rows is None else self.array(np.asarray(array.rows)),
                )
            else:
                moved[name] = self.block(np.asarray(array), self._blocks.get(name))
        if index is not None and not _is_device(index):
            index = self.array(np.asarray(index))
        return moved, index


class DeviceCacheBackend(CacheBackend):
    """A GPU loader's backend for one epoch through the cache (see the module's text)."""

    cache: DeviceCacheHandle

    def __init__(
        self,
        cache: DeviceCacheHandle,
        backend: Backend,
        *,
        write: bool,
        placement: CachePlacement,
        stats: StatsRecorder,
    ) -> None:
        super().__init__(cache, backend, write=write)
        self.placement = placement
        self.stats = stats
        self._copies = _Copies(self.xp, cache.rows.layout.blocks)

    def read_chunks(self, request: ReadRequest) -> Iterator[list[Part]]:
        # (each step on the reader's stream: see `each_step_in`)
        return each_step_in(self.xp.reading, self._read_chunks(request))

    def _read_chunks(self, request: ReadRequest) -> Iterator[list[Part]]:
        if self.write:
            host = CacheBackend(self.cache, _HostSide(self.backend), write=True)
            for parts in host.read_chunks(request):
                yield [self._copies.part(part) for part in parts]
            if self.cache.complete:
                self._placed()
            return
        placed, plan = self._placed(), request.plan
        window = window_rows(self.cache, plan.batch_size)
        on_host = not placed.on_device and not self._stages_chunks(placed, plan, window)
        reading = Reading(
            partial(self._serve, placed, plan, window),
            # rows gathered on the host: their order drawn a chunk ahead
            order=partial(self.cache.rows.delivery_rows, plan) if on_host else None,
            helpers=request.threads.device_gather,
            helper_name="tabloader-gather",
        )
        yield from read_in_stages(plan, reading)

    def _serve(
        self,
        placed: _Placed,
        plan: EpochPlan,
        window: int,
        decoded: Iterator[Any] | None,
        ahead: Iterator[Any] | None,
        work: SplitWork,
    ) -> Iterator[list[Part]]:
        """``plan``'s chunks from the placed cache, in three ways, the order of a chunk
        (the host's draw, exactly) drawn where its rows are gathered:

        - in GPU memory: the order drawn on the device, queued on the loader's stream (the
          permutations of several chunks in one pass, see `EpochPlan.batch_orders`);
        - in pinned host memory, shuffled chunks of a streamed chunk's size: each copied
          to the device in stored order (one copy per run of the cache and block, at the
          bus's speed, nothing gathered on the host) and permuted there;
        - otherwise (a global shuffle's one chunk, list columns, stored order): the rows
          gathered on the host, the order drawn a chunk ahead on the order thread.

        Rows are gathered a window at a time, so a global shuffle's chunk of every row
        is never gathered at once; ``work``'s helpers gather a window on the host.
        """
        rows, cupy = self.cache.rows, self.xp.cupy
        if placed.on_device:
            # next() rather than zip(): zip keeps its last items, here an order the index
            # may no longer need
            orders = plan.batch_orders(xp=cupy)  # several chunks' at once
            carried: Any = None  # the rows after a chunk's last whole window
            for chunk in range(plan.num_chunks):
                if placed.on_device and self._short_of_memory():
                    placed = self._give_way()  # the rest of the epoch from pinned memory
                index = rows.delivery_rows(plan, chunk, xp=cupy, order=next(orders))
                begins = plan.rows_before(chunk)
                if carried is not None:
                    index, begins = cupy.concatenate([carried, index]), begins - len(carried)
                carry = chunk + 1 < plan.num_chunks
                carried = yield from self._windows(
                    placed, plan, chunk, index, (window, work), begins, carry=carry
                )
        elif ahead is None:
            orders = plan.batch_orders(xp=cupy)
            for chunk in range(plan.num_chunks):
                staged = _Placed(self._staged(placed, plan, chunk), "device")
                yield from self._windows(staged, plan, chunk, next(orders), (window, work))
        else:
            for chunk, index in enumerate(ahead):
                yield from self._windows(placed, plan, chunk, index, (window, work))

    def _windows(
        self,
        placed: _Placed,
        plan: EpochPlan,
        chunk: int,
        index: Any,
        windows: tuple[int, SplitWork],
        begins: int | None = None,
        *,
        carry: bool = False,
    ) -> Generator[list[Part], None, Any]:
        """The rows ``index`` of ``placed`` (the epoch's delivery from row ``begins`` on,
        chunk ``chunk``'s first row by default) gathered a window at a time (``windows``:
        its rows, and the helpers gathering one on the host), each window ending where a
        batch does (its batches then slices); or without an index, chunk ``chunk`` as
        views of the cache (copied in).

        With ``carry``, only whole windows are gathered, and the rows after the last one
        are returned (None when there are none), for the next chunk's first window: a
        chunk of a cache in GPU memory then ends no batch of its own, so no batch is
        joined from two gathers (a copy of the batch's every block)."""
        if index is None:
            rows, pieces = self.cache.rows, plan.pieces(chunk)
            first = int(rows.base[pieces[0][0]]) + pieces[0][1] if pieces else 0
            n = sum(b - a for _, a, b in pieces)
            view = (rows.view(placed.arrays, first, first + n), None)
            yield [view if placed.on_device else self._copies.part(view)]
            return None
        window, work = windows
        if begins is None:
            begins = plan.rows_before(chunk)
        # the first window ends where a batch does, when the index begins inside one
        ends = list(range((-begins) % plan.batch_size + window, len(index) + 1, window))
        rest = None
        if carry:
            keep = ends.pop() if ends else 0
            index, rest = index[:keep], (index[keep:] if keep < len(index) else None)
        for lo, hi in pairwise([0, *ends, len(index)]):
            if hi > lo:
                yield [self._gather(placed, index[lo:hi], work)]
        return rest

    def _stages_chunks(self, placed: _Placed, plan: EpochPlan, window: int) -> bool:
        """Whether a pinned-host cache's chunks are permuted on the device (see `_serve`):
        shuffled chunks of at most two windows (a streamed chunk's size, whatever the
        rounding to whole batches), without list columns."""
        return (
            not placed.on_device
            and plan.shuffle
            and not any(isinstance(a, CachedList) for a in placed.arrays.values())
            and all(plan.stored_rows(c) <= 2 * window for c in range(plan.num_chunks))
        )

    def _staged(self, placed: _Placed, plan: EpochPlan, chunk: int) -> dict[str, Any]:
        """Chunk ``chunk``'s rows of the host-side cache ``placed``, in stored order, on
        the device, row-major as the cache stores them: an asynchronous copy on the
        loader's stream per run of the cache and block."""
        base, stream = self.cache.rows.base, self.xp.reader_stream
        runs = [(int(base[p]) + a, b - a) for p, a, b in plan.pieces(chunk) if b > a]
        n = sum(k for _, k in runs)
        staged: dict[str, Any] = {}
        for name, host in placed.arrays.items():
            out = self.xp.empty((n, *host.shape[1:]), host.dtype)
            at = 0
            for first, k in runs:
                out[at : at + k].set(host[first : first + k], stream=stream)
                at += k
            staged[name] = out
        return staged

    def _gather(self, placed: _Placed, rows: Any, work: SplitWork) -> Part:
        """The cache's ``rows``, in that order, on the device: gathered there (one gather
        per block), or on the host by a few threads into pinned memory and copied in."""
        if placed.on_device:
            index = self.xp.cupy.asarray(rows)  # one copy a window, on the reader's stream
            blocks = {b.name: b for b in self.cache.rows.blocks}
            segment: Segment = {
                name: gather_list(a, index)
                if isinstance(a, CachedList)
                else self._take(a, index, blocks.get(name))
                for name, a in placed.arrays.items()
            }
            return segment, None
        if not isinstance(rows, np.ndarray):  # drawn on the device before the cache gave way
            rows = self.xp.cupy.asnumpy(rows)
        pinned = placed.staging
        assert pinned is not None  # placed in pinned host memory
        gathered: Segment = {}
        jobs = []
        for name, a in placed.arrays.items():
            if isinstance(a, CachedList):
                gathered[name] = gather_list(a, rows)
                continue
            out = pinned.empty((len(rows), *a.shape[1:]), a.dtype)
            gathered[name] = out
            for share in work.shares(len(rows)):
                job = partial(np.take, a, rows[share], axis=0, out=out[share], mode="clip")
                jobs.append((share.stop - share.start, job))
        work.run(jobs)
        return self._copies.part((gathered, None))

    def _take(self, array: Any, index: Any, block: Block | None) -> Any:
        """``array[index]`` on the device, laid out as a streamed chunk's block: each
        column contiguous where the block is column-major, whatever ``array``'s order."""
        if _by_column(array, block) and array.flags.c_contiguous:
            return self.xp.take(array.T, index, axis=1).T
        return self.xp.take(array, index, axis=0)

    # -- placing a complete cache ------------------------------------------------------

    def _placed(self) -> _Placed:
        """The complete cache placed for this device, once per cache and device (and
        again in pinned memory if the device's memory grew short, see `_give_way`)."""
        placed = self.cache.placements.get(self.xp.device)
        if placed is not None and placed.on_device and self._short_of_memory():
            placed = self._give_way()
        if placed is None:
            served = self.cache.served()
            arrays = self._to_device(served) if self._fits_on_device() else None
            placed = self._in_pinned(served) if arrays is None else _Placed(arrays, "device")
            self.cache.placements.put(self.xp.device, placed)
        self.stats.cache_placement = placed.where
        return placed

    def _memory(self) -> tuple[int, int]:
        """The device's free and total memory, as the driver says."""
        with self.xp.cupy.cuda.Device(self.xp.device):
            free, total = self.xp.cupy.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def _fits_on_device(self) -> bool:
        if self.placement != "auto":
            return self.placement == "device"
        free, total = self._memory()
        nbytes = self.cache.nbytes
        return nbytes <= device_share() * free and free - nbytes >= device_reserve() * total

    def _short_of_memory(self) -> bool:
        """Whether the device's free memory fell below the reserve a cache there leaves
        for the training step (a forced ``cache_placement="device"`` stays)."""
        if self.placement == "device":
            return False
        free, total = self._memory()
        return free < device_reserve() * total

    def _give_way(self) -> _Placed:
        """Move the cache from GPU memory to pinned host memory, with a warning; its GPU
        memory goes back to the driver once the windows gathered from it are done."""
        free, total = self._memory()
        warn_caller(
            f"the GPU's free memory fell to {free:,} bytes, below the {device_reserve():.0%} "
            f"of its {total:,} bytes a decoded cache there leaves for the training step "
            f"(${RESERVE_ENV}): the cache moves to pinned host memory, and each chunk is "
            "copied to the GPU from there (same batches, a few times slower than from GPU "
            'memory). Pass cache_placement="host" to keep it there from the start',
            CacheWarning,
        )
        placed = self._in_pinned(self.cache.served())
        self.cache.placements.put(self.xp.device, placed)
        self.stats.cache_placement = placed.where
        return placed

    def _to_device(self, arrays: Mapping[str, Any]) -> dict[str, Any] | None:
        """The cache's arrays copied to the device, each block laid out as streamed
        chunks are (column-major where the layout keeps a dtype's columns together), in
        memory from the driver (not the pool, so that it goes back to the driver when the
        cache leaves the device), one column at a time: no block is on the device twice.
        None, with a warning, when the driver refuses the memory (a ``"device"``
        placement raises `GPUMemoryError` instead)."""
        from tabloader.backends.gpu_memory import is_out_of_memory, memory_error_message

        cupy = self.xp.cupy
        blocks = {b.name: b for b in self.cache.rows.blocks}
        out: dict[str, Any] = {}
        try:
            with cupy.cuda.using_allocator(None):  # cudaMalloc, cudaFree: the driver's
                for name, array in arrays.items():
                    if isinstance(array, CachedList):
                        copy = self._copies.array
                        out[name] = CachedList(copy(array.values), copy(array.spans))
                    else:
                        out[name] = self._copies.block(np.asarray(array), blocks[name])
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            out.clear()
            doing = f"placing a decoded cache of {self.cache.nbytes:,} bytes in GPU memory"
            if self.placement == "device":
                raise GPUMemoryError(
                    memory_error_message(err, device=self.xp.device, doing=doing)
                    + '; or pass cache_placement="host" (or "auto") to keep the cache in '
                    "pinned host memory"
                ) from err
            warn_caller(
                f"cuda:{self.xp.device} ran out of memory {doing} ({err}): the cache is "
                "kept in pinned host memory instead",
                CacheWarning,
            )
            return None
        return out

    def _in_pinned(self, arrays: Mapping[str, Any]) -> _Placed:
        """The cache placed in pinned host memory (see `_to_pinned`), with the pinned
        buffers its windows are gathered into."""
        cupy = self.xp.cupy
        return _Placed(self._to_pinned(arrays), "pinned host", staging=PinnedNumpy(cupy))

    def _to_pinned(self, arrays: Mapping[str, Any]) -> dict[str, Any]:
        """The cache's arrays in pinned host memory of their own, unlocked with them (as
        they are, where page-locking fails)."""
        cupy = self.xp.cupy
        out: dict[str, Any] = {}
        for name, array in arrays.items():
            try:
                if isinstance(array, CachedList):
                    out[name] = CachedList(
                        _pinned_copy(cupy, array.values), _pinned_copy(cupy, array.spans)
                    )
                else:
                    out[name] = _pinned_copy(cupy, array)
            except Exception as err:  # page-locking that much memory failed: pageable
                if "memory" not in str(err).lower() and not isinstance(err, MemoryError):
                    raise
                out[name] = array
        return out


def window_rows(cache: CacheHandle, batch_size: int) -> int:
    """Rows of ``cache`` gathered at once: whole batches, about `DEFAULT_CHUNK_BYTES` of
    them."""
    row_bytes = max(1, cache.nbytes // max(1, cache.rows.num_rows))
    return max(1, DEFAULT_CHUNK_BYTES // row_bytes // batch_size) * batch_size


def _by_column(array: Any, block: Block | None) -> bool:
    """Whether ``array`` holds several columns of a block laid out column-major (each
    column contiguous), as streamed chunks are."""
    return array.ndim == 2 and array.shape[1] > 1 and block is not None and block.column_major


def _is_device(array: Any) -> bool:
    values = array.values if isinstance(array, Ragged) else array
    return type(values).__module__.split(".")[0] == "cupy"


def _pinned_copy(cupy: Any, array: Any) -> NDArray[Any]:
    out = pinned_empty(cupy, array.shape, array.dtype)
    out[...] = array
    out.flags.writeable = False
    return out


def serving_backend(
    cache: DeviceCacheHandle,
    backend: Backend,
    *,
    write: bool,
    placement: CachePlacement,
    stats: StatsRecorder,
) -> Backend | DeviceCacheBackend | CacheBackend:
    """The epoch's backend through ``cache``: served from the host (a CPU loader), or
    placed for the device of a GPU loader."""
    if getattr(backend.xp, "cupy", None) is None:
        return CacheBackend(cache, backend, write=write)
    return DeviceCacheBackend(cache, backend, write=write, placement=placement, stats=stats)
