"""GPU backend: cudf decodes row groups into GPU memory, cupy casts, gathers and slices.

Selected with ``device="cuda"``, ``"cuda:N"`` or an int (and by default when cudf and
cupy import and a GPU is visible, see `tabloader.device.default_device_spec`). The
plan, the shuffled delivery order and the batch cutting are the CPU backend's: the
order is drawn on the host from the plan (a chunk ahead, in a thread of its own) and
moved to the device, so a seed gives the same rows in the same batches, in the same
order, on both backends. Only reading and the array work differ.

Devices, streams, and the hand-off rules
----------------------------------------
Each loader works on its device (``cuda:N``) in every thread that touches the GPU, on two
streams of its own, created non-blocking (``cudaStreamNonBlocking``) so that they are
never queued behind the training step's kernels on the default stream, nor they behind
them: the reader's (decoding with pylibcudf, layout, the orders of chunks) and the
batcher's (a batch's gathers). ``cudf.read_parquet`` decodes on the legacy default
stream. No thread of the loader waits for the GPU (but inside libcudf's parquet reader,
which waits for its own stream); the order between the stages and the consumer is kept
by events (`tabloader.backends.gpu_memory` owns the streams and the memory):

    **A chunk is read after it is complete.** The reader records an event when a chunk
    is laid out; the batcher's stream waits for it when it takes the chunk, and for
    nothing the reader does after.

    **A batch is handed over ordered.** Once a batch's gathers are issued, the legacy
    default stream of the device waits for them (an event recorded on the batcher's
    stream, ``cudaStreamWaitEvent``). Work a consumer issues afterwards to the default
    stream, or to any blocking stream (PyTorch's and cupy's defaults), runs after the
    batch is complete. ``torch.from_dlpack(array)`` and ``jax.dlpack.from_dlpack`` in the
    loader's ``transform`` are ordered the same way by DLPack. A consumer on a
    non-blocking stream of its own makes it wait for `DeviceArrays.last_event` after
    taking a batch.

    **Memory is written only after the consumer is done with it.** Delivered arrays are
    never written again. Once the consumer lets go of a batch, its memory goes back to
    the pool only when the work the consumer queued before letting go is done: an event
    recorded on the consumer's stream then (the legacy default stream, unless an adapter
    says which), asked without waiting by the loader's threads. A consumer that reads
    batches on streams of its own must make the default stream wait for them before it
    lets go (see ``docs/gpu.md``); the framework adapters do what their framework needs.

Reading is `tabloader.decode.gpu`'s (a chunk's read planned on the order thread, a chunk
ahead; decoded on the reader's stream); this module draws each chunk's order on the
device, lays the chunk out and gathers batches from it (`DeviceArrays`).

`batch_device` tells which GPU a batch lives on (``None`` for host arrays),
`device_scope` makes that GPU current in the calling thread, and
`as_contiguous` gives the C-contiguous copy TensorFlow's DLPack import needs for a
column view.

Example (needs a CUDA GPU with cudf and cupy):

    loader = tabloader.Loader("train/", cats=["item"], labels=["click"], batch_size=65536,
                              shuffle=True, seed=0, device="cuda:0")
    batch = next(iter(loader))
    batch_device(batch)  # 0
    torch.from_dlpack(batch["item"])  # a tensor on cuda:0, no copy
"""

from __future__ import annotations

import contextlib
import sys
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from tabloader._deps import gpu_module as _import
from tabloader._deps import gpu_usable, import_gpu
from tabloader._deps import optional as _optional_import
from tabloader.backends.gpu_memory import (
    DEFAULT_POOL_BYTES,
    MEMORY_ENV,
    POOL_ENV,
    ConsumerFence,
    DeviceMemory,
    acquire_pool,
    device_bytes_in_use,
    finalize_loader_memory,
    memory_error_message,
    scoped,
    take_streams,
)
from tabloader.backends.gpu_memory import out_of_memory_as_error as _out_of_memory_as_error
from tabloader.batches import Ragged
from tabloader.decode.gpu import DeviceReader, delivery_rows, reader_setting
from tabloader.decode.gpu_columns import assemble_frames
from tabloader.errors import GPUMemoryError, GPUUnavailableError, is_out_of_memory
from tabloader.memory import chunk_rows_for_device, chunk_rows_for_fraction, free_device_memory
from tabloader.stages import Reading, each_step_in, read_in_stages

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from tabloader.batches import Part, Segment
    from tabloader.decode.gpu import ChunkPlan
    from tabloader.sources.base import Piece
    from tabloader.stages import ReadRequest, SplitWork

__all__ = [
    "DEFAULT_POOL_BYTES",
    "MEMORY_ENV",
    "POOL_ENV",
    "DeviceArrays",
    "GPUBackend",
    "GPUMemoryError",
    "GPUUnavailableError",
    "as_contiguous",
    "batch_device",
    "chunk_rows_for_device",
    "chunk_rows_for_fraction",
    "device_bytes_in_use",
    "device_scope",
    "free_device_memory",
    "gpu_usable",
    "import_gpu",
    "is_out_of_memory",
    "memory_error_message",
]

_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13  # DLPack device types whose memory is on a GPU


# -- hand-off helpers for the framework adapters ------------------------------------------


def batch_device(batch: Mapping[str, Any] | Any) -> int | None:
    """The CUDA device index a batch (or one array) lives on, or None for host memory.

    Works for anything that speaks DLPack (numpy, cupy, torch); every array of a batch
    from one loader lives on the same device.

    Examples:
        >>> import numpy as np
        >>> batch_device({"x": np.zeros(3)}) is None
        True
    """
    arrays = list(batch.values()) if isinstance(batch, Mapping) else [batch]
    for array in arrays:
        if type(array).__module__.split(".")[0] == "cupy":
            return int(array.device.id)  # cupy arrays live on a GPU, whatever DLPack says
        kind, index = array.__dlpack_device__()
        return int(index) if int(kind) in (_KDL_CUDA, _KDL_CUDA_MANAGED) else None
    return None


@contextlib.contextmanager
def device_scope(device: int) -> Iterator[None]:
    """Make CUDA device ``device`` current in the calling thread for the block.

    Sets the CUDA runtime's current device, which cupy and PyTorch both follow, so that
    new allocations made by a ``transform`` (``torch.stack``, ``torch.empty(device="cuda")``)
    land on the batch's GPU and not on GPU 0, the default of every new thread.
    """
    cupy = _import("cupy")
    with cupy.cuda.Device(device):
        yield


def as_contiguous(array: Any) -> Any:
    """``array`` itself when C-contiguous, else a C-contiguous copy on the same device.

    TensorFlow's DLPack import rejects strided arrays such as the column views of the
    ``"columns"`` layout. A GPU copy is made on the calling thread's current stream
    (the batcher's, inside the loader's ``transform``) and handed over like a batch: the
    default stream waits for it.

    Examples:
        >>> import numpy as np
        >>> block = np.arange(6).reshape(3, 2)
        >>> as_contiguous(block[:, 1]).flags.c_contiguous, as_contiguous(block) is block
        (True, True)
    """
    if array.flags.c_contiguous:
        return array
    if type(array).__module__.split(".")[0] != "cupy":
        return np.ascontiguousarray(array)
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(array.device.id):
        out = cupy.ascontiguousarray(array)
        cupy.cuda.Stream.null.wait_event(cupy.cuda.get_current_stream().record())
    return out


# -- the array namespace -------------------------------------------------------------------


class DeviceArrays:
    """The array namespace the batching code runs with on a GPU: cupy on one device, on
    the loader's streams, with the loader's allocator (see the module's rules).

    `scope` sets a thread up (device, the batcher's stream, allocator) for the batcher's
    work and `reading` for the reader's; every other method assumes one of them.
    ``take``/``concatenate`` only issue kernels; `hand_over` orders the consumer after
    them, `chunk_ready` and `wait_for` the batcher after a chunk.
    """

    def __init__(self, cupy: Any, device: int, memory: DeviceMemory) -> None:
        self.cupy = cupy
        self.device = device
        self.memory = memory
        self.stream = memory.streams.batcher
        """The batcher's stream, where batches are gathered."""
        self.reader_stream = memory.streams.reader
        """The reader's stream, where chunks are decoded and laid out."""
        self.last_event: Any = None
        """The event of the last batch handed over (written by the batcher only): a
        consumer on a non-blocking stream of its own makes it wait for this event after
        taking a batch (which it covers, with perhaps a batch or two after it)."""
        self._handed = cupy.cuda.Event(disable_timing=True)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """The loader's device, the batcher's stream and the loader's allocator, in the
        calling thread."""
        with scoped(self.cupy, self.device, self.stream, self.memory.allocator()):
            yield

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """The loader's device, the reader's stream and the loader's allocator, in the
        calling thread."""
        with scoped(self.cupy, self.device, self.reader_stream, self.memory.allocator()):
            yield

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        with _out_of_memory_as_error(self.device, doing):
            yield

    def empty(self, shape: tuple[int, ...], dtype: DTypeLike) -> Any:
        with self._errors(f"allocating {shape} {np.dtype(dtype)}"):
            return self.cupy.empty(shape, dtype=dtype)

    def take(self, array: Any, indices: Any, axis: int = 0, out: Any = None) -> Any:
        if isinstance(indices, np.ndarray):  # drawn on the host: copied in once
            indices = self.cupy.asarray(indices)
        with self._errors(f"gathering {len(indices):,} rows"):
            if (
                array.ndim == 2
                and axis == 0
                and array.shape[1] > 1
                and not array.flags.c_contiguous
                and array.flags.f_contiguous
                and (out is None or out.flags.f_contiguous)
            ):
                # Column-major: one gather along the rows of the transposed (C-ordered)
                # block, each output column written contiguously.
                result = self.cupy.take(
                    array.T, indices, axis=1, out=None if out is None else out.T
                )
                return result.T
            return self.cupy.take(array, indices, axis=axis, out=out)

    def concatenate(self, arrays: Sequence[Any], axis: int = 0, out: Any = None) -> Any:
        with self._errors("joining a batch across chunks"):
            return self.cupy.concatenate(list(arrays), axis=axis, out=out)

    def chunk_ready(self) -> Any:
        """The event at which the chunk the reader just finished is complete (the
        batcher's stream waits for it, `wait_for`); memory the consumer is done with is
        freed here too, once a chunk."""
        self.memory.collect()
        return self.memory.chunk_ready()

    def wait_for(self, ready: Any) -> None:
        """The batcher's stream waits for a chunk's event (`chunk_ready`)."""
        self.memory.wait_for(ready)

    def hand_over(self, batch: Any = None) -> None:
        """Order the default stream (and the blocking streams) after the work issued so
        far on the batcher's stream: the batch about to be handed over is complete for
        whatever the consumer issues next. ``batch``'s memory becomes the consumer's (see
        `DeviceMemory.lend`), and memory the consumer is done with is freed. No host
        wait."""
        if batch is not None:
            self.memory.lend(batch)
        self.last_event = self.stream.record(self._handed)
        self.cupy.cuda.Stream.null.wait_event(self.last_event)
        self.memory.collect()

    def set_consumer(self, fence: ConsumerFence) -> None:
        """How the consumer says it is done with memory it let go of (an adapter's
        framework, see `tabloader.backends.gpu_memory.ConsumerFence`)."""
        self.memory.set_consumer(fence)

    def synchronize(self) -> None:
        """Wait on the host for the loader's streams (tests, and the self-test's timings)."""
        self.reader_stream.synchronize()
        self.stream.synchronize()


def _nbytes(array: Any) -> int:
    if isinstance(array, Ragged):
        return int(array.values.nbytes) + int(array.offsets.nbytes)
    return int(array.nbytes)


# -- the backend ---------------------------------------------------------------------------


class GPUBackend:
    """Chunks in GPU memory: cudf decodes, cupy lays out, permutes and slices.

    Args:
        device: CUDA device index; None is the current device of the calling thread.
    """

    groups_columns = True
    """Columns of one dtype share a column-major block: one gather a batch per dtype."""

    def __init__(self, device: int | None = None) -> None:
        self._cudf, self._cupy, self.device = import_gpu(device)
        self.name = f"cuda:{self.device}"
        self._pylibcudf = reader_setting() != "cudf"
        self._rmm = _optional_import("rmm")
        self._open(None)

    def _open(self, consumer: Any) -> None:
        """Take the device's pool and a pair of streams of the loader's own (handing
        memory back after ``consumer``'s fence, when the adapter set one)."""
        pool = None if self._rmm is None else acquire_pool(self._rmm, self.device)
        memory = DeviceMemory(self._cupy, self.device, take_streams(self._cupy, self.device))
        if consumer is not None:
            memory.set_consumer(consumer)
        self.xp = DeviceArrays(self._cupy, self.device, memory)
        # Given back when the loader closes, or when it is collected.
        self._finalizer = weakref.finalize(
            self, finalize_loader_memory, self._rmm, self.device, memory, pool
        )
        self._reader = DeviceReader(
            self._cudf, self._cupy, self.device, stream=self.xp.reader_stream,
            pylibcudf=self._pylibcudf,
        )  # fmt: skip

    def close(self) -> None:
        """Give the loader's GPU memory back: memory the consumer let go of, once its work
        on it is done; the device's pool, when no other loader uses it (see
        `tabloader.backends.gpu_memory`). Batches still held stay valid."""
        self._finalizer()

    def reopen(self) -> None:
        """After `close`, take a pool and streams again for the next epoch (an epoch run
        on streams given back would share them with the next loader, and allocate
        without a pool); nothing to do otherwise."""
        if not self._finalizer.alive:
            self._open(self.xp.memory.consumer)

    @property
    def reader(self) -> str:
        """Which parquet reader decodes: ``"pylibcudf"`` (on the loader's stream) or
        ``"cudf"`` (``cudf.read_parquet``, on the default stream)."""
        return self._reader.name

    def scope(self) -> contextlib.AbstractContextManager[None]:
        return self.xp.scope()

    def read_chunks(self, request: ReadRequest) -> Iterator[list[Part]]:
        plan = request.plan
        # The order thread plans each chunk's read; the reader draws the chunk's order on
        # the device, reads and lays the chunk out.
        reading = Reading(
            partial(self._lay_out, request),
            order=partial(self._reader.plan_chunk, request.dataset, plan),
        )
        return read_in_stages(plan, reading)

    def _lay_out(
        self,
        request: ReadRequest,
        decoded: Iterator[Any] | None,
        chunk_plans: Iterator[ChunkPlan] | None,
        work: SplitWork,
    ) -> Iterator[list[Part]]:
        assert chunk_plans is not None
        plan = request.plan

        def chunks() -> Iterator[list[Part]]:
            for chunk, chunk_plan in zip(range(plan.num_chunks), chunk_plans, strict=True):
                # the shuffled order, drawn on the device (the host's draw, exactly)
                with _out_of_memory_as_error(self.device, f"drawing chunk {chunk}'s order"):
                    order = plan.batch_order(chunk, xp=self._cupy)
                yield self.load_chunk(request, plan.pieces(chunk), chunk_plan, order)

        # each chunk on the reader's stream (see `each_step_in`)
        yield from each_step_in(self.xp.reading, chunks())

    def load_chunk(
        self,
        request: ReadRequest,
        pieces: Sequence[Piece],
        chunk_plan: ChunkPlan,
        order: Any = None,
    ) -> list[Part]:
        """Read one chunk and lay it out as the request's blocks, in the calling thread
        (set up by `DeviceArrays.reading`)."""
        cupy, stats = self._cupy, request.stats
        doing = f"reading a chunk of {chunk_plan.rows:,} rows"
        with _out_of_memory_as_error(self.device, doing):
            t0 = time.perf_counter()
            frames, converted, on_default = self._reader.read_columns(
                request.dataset, pieces, chunk_plan, request.blocks, request.fill_null
            )
            memory, default = self.xp.memory, cupy.cuda.Stream.null
            if on_default:  # the layout below reads what cudf wrote
                memory.order(self.xp.reader_stream, after=default)
            t1 = time.perf_counter()
            stats.read_seconds += t1 - t0
            segment = assemble_frames(converted, request.blocks, cupy)
            if on_default:  # nothing of the chunk stays in memory of the default stream
                segment = {name: _owned(a) for name, a in segment.items()}
            stats.bytes_read += sum(_nbytes(a) for a in segment.values())
            index, first = delivery_rows(chunk_plan.spans, chunk_plan.frame_rows, order, xp=cupy)
            if index is None and (first or chunk_plan.rows != _segment_rows(segment)):
                segment = {name: a[first : first + chunk_plan.rows] for name, a in segment.items()}
            if on_default:
                # cudf's frames and their conversions go back to the default stream's pool
                # once the layout issued above has read them
                memory.order(default, after=self.xp.reader_stream)
            del converted, frames
        stats.assemble_seconds += time.perf_counter() - t1
        stats.device_bytes = device_bytes_in_use(self._rmm, cupy, self.device)
        return [(segment, index)]


def _owned(array: Any) -> Any:
    """A list column joined from one frame is that frame's own memory: copied on the
    calling thread's stream (the reader's), so that the chunk holds no memory of the
    default stream's (freed there, it would go back to that stream's pool while the
    batcher still gathers from it)."""
    if not isinstance(array, Ragged):
        return array
    rows = None if array.rows is None else array.rows.copy()
    return Ragged(array.values.copy(), array.offsets.copy(), rows)


def _segment_rows(segment: Segment) -> int:
    return len(next(iter(segment.values())))
