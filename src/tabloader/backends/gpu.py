"""GPU backend: cudf decodes row groups into GPU memory, cupy casts, gathers and slices.

Selected with ``device="cuda"``, ``"cuda:N"`` or an int (and by default when cudf and
cupy import and a GPU is visible, see :func:`tabloader.device.default_device_spec`). The
plan, the shuffled delivery order and the batch cutting are the CPU backend's: the
order is drawn on the host from the plan and moved to the device, so a seed gives the
same rows in the same batches, in the same order, on both backends. Only reading and
the array work differ.

Streams, and the hand-off rules
-------------------------------
Everything here runs on the device's legacy default stream, where cudf decodes too.
Two rules follow, and the framework adapters rely on both:

    **Every array this backend hands out is complete.** A chunk leaves the reader thread
    only after the stream is synchronised, and the batcher synchronises it again once a
    batch's gathers are queued, before the batch is handed over, so batch arrays have no
    pending work on any stream. ``torch.from_dlpack(array)`` or
    ``tf.experimental.dlpack.from_dlpack(array.__dlpack__())`` may run in the loader's
    ``transform`` (the batcher thread) without further synchronisation.

    **A batch's memory is reused only after the consumer's work on it.** Delivered
    arrays are never written again; once the consumer drops them their memory returns
    to the pool, and the pool hands it out again only to work queued on the legacy
    default stream, which CUDA orders after all work already queued on the framework's
    default stream. (A side stream of the loader's own would let a new batch overwrite
    memory that a training kernel still reads, since DLPack orders nothing between the
    consumer's stream and the producer's next write.) Consumers that train on streams
    of their own, or with per-thread default streams, must make the legacy default
    stream wait for them before dropping a batch (see ``docs/gpu.md``).

:func:`batch_device` tells which GPU a batch lives on (``None`` for host arrays),
:func:`device_scope` makes that GPU current in the calling thread, and
:func:`as_contiguous` gives the C-contiguous copy TensorFlow's DLPack import needs for a
column view, also complete when it returns.

Example (needs a CUDA GPU with cudf and cupy)::

    loader = tabloader.Loader("train/", cats=["item"], labels=["click"], batch_size=65536,
                              shuffle=True, seed=0, device="cuda:0")
    batch = next(iter(loader))
    batch_device(batch)  # 0
    torch.from_dlpack(batch["item"])  # a tensor on cuda:0, no copy
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from numbers import Real
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tabloader.backends.cpu import null_message
from tabloader.backends.gpu_dask import dask_threads_on
from tabloader.batches import Ragged, host_int
from tabloader.dataset import _DaskSource, _ParquetSource, read_error
from tabloader.errors import InvalidArgumentError, NullValuesError, ReadError, TabloaderError

if TYPE_CHECKING:
    from numpy.typing import DTypeLike, NDArray

    from tabloader.backends import Piece, ReadRequest
    from tabloader.batches import Block, Part, Segment
    from tabloader.dataset import Dataset
    from tabloader.stats import StatsRecorder

__all__ = [
    "DeviceArrays",
    "GPUBackend",
    "GPUMemoryError",
    "GPUUnavailableError",
    "as_contiguous",
    "assemble_segments",
    "batch_device",
    "chunk_rows_for_device",
    "chunk_rows_for_fraction",
    "device_scope",
    "free_device_memory",
    "gpu_usable",
    "import_gpu",
    "is_out_of_memory",
    "memory_error_message",
    "plan_read",
]

INSTALL = "pip install 'tabloader[gpu]'"
_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13  # DLPack device types whose memory is on a GPU


class GPUUnavailableError(TabloaderError, ImportError):
    """The GPU backend was asked for, but cudf or cupy is missing or broken, or no GPU is seen."""


class GPUMemoryError(TabloaderError, MemoryError):
    """A chunk did not fit in GPU memory; the message says how to make chunks smaller."""


# -- importing cudf and cupy, guarded ----------------------------------------------------


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception as err:  # a broken CUDA install raises RuntimeError, OSError, ...
        raise GPUUnavailableError(
            f"the GPU backend needs {name}, which could not be imported "
            f"({type(err).__name__}: {err}). Install the CUDA 12 builds (cudf-cu12, "
            f"cupy-cuda12x) with: {INSTALL}, or pass device='cpu'"
        ) from err


def _visible_devices() -> str:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "CUDA_VISIBLE_DEVICES is not set" if value is None else f"CUDA_VISIBLE_DEVICES={value!r}"


def import_gpu(device: int | None = None) -> tuple[Any, Any, int]:
    """Import cudf and cupy and check the device: returns ``(cudf, cupy, device index)``.

    cupy is imported and asked for the device count first, and cudf only when a GPU is
    visible: importing cudf on a host without a usable GPU fails in ways that vary across
    releases. ``device=None`` is the calling thread's current CUDA device (the one
    ``torch.cuda.set_device`` or ``cupy.cuda.Device(i).use()`` chose; 0 by default).

    Raises:
        GPUUnavailableError: cudf or cupy cannot be imported, or no GPU is visible.
        InvalidArgumentError: ``device`` is not one of the visible GPUs.
    """
    cupy = _import("cupy")
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as err:  # CUDARuntimeError: no driver, insufficient driver, ...
        raise GPUUnavailableError(
            f"the GPU backend found no usable CUDA GPU: cupy.cuda.runtime.getDeviceCount() "
            f"failed ({type(err).__name__}: {err}). Check the NVIDIA driver with nvidia-smi, "
            f"or pass device='cpu'"
        ) from err
    if count < 1:
        raise GPUUnavailableError(
            f"the GPU backend found no CUDA GPU ({_visible_devices()}). Check nvidia-smi and "
            "CUDA_VISIBLE_DEVICES, or pass device='cpu'"
        )
    if device is None:
        device = int(cupy.cuda.runtime.getDevice())
    if not 0 <= device < count:
        raise InvalidArgumentError(
            f"device cuda:{device} does not exist: {count} CUDA GPU(s) are visible "
            f"(cuda:0..cuda:{count - 1}; {_visible_devices()}). With one process per GPU, "
            "pass device=local_rank, or device='cuda' for the current device"
        )
    return _import("cudf"), cupy, device


@functools.cache
def gpu_usable() -> bool:
    """Whether the GPU backend can run here: cudf and cupy import and a GPU is visible.

    Cheap when cudf or cupy is not installed (their import specs are looked up, nothing
    is imported). The answer is cached for the process; ``gpu_usable.cache_clear()``
    forgets it.
    """
    try:
        if importlib.util.find_spec("cupy") is None or importlib.util.find_spec("cudf") is None:
            return False
    except Exception:  # a half-installed package can fail while its spec is looked up
        return False
    try:
        import_gpu()
    except TabloaderError:
        return False
    return True


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
    ``"columns"`` layout. A GPU copy is synchronised before it is returned, so it keeps
    the hand-off rule (complete arrays only).

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
        cupy.cuda.get_current_stream().synchronize()
    return out


# -- memory ----------------------------------------------------------------------------


def _is_number(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def chunk_rows_for_fraction(
    fraction: float, free_bytes: int, row_bytes: int, batch_size: int
) -> int:
    """Rows per chunk so that one chunk takes about ``fraction`` of ``free_bytes``.

    The result is a whole number of batches, and at least one batch. The loader holds
    about ``prefetch + 2`` chunks at once (see ``docs/gpu.md``), so the memory it uses
    is about ``(prefetch + 2) * fraction`` of the free memory: 0.1 with the default
    ``prefetch=1`` uses about 30%.

    Args:
        fraction: Share of the free memory one chunk may take, in (0, 1] (the Keras
            loader's ``buffer_size``).
        free_bytes: Free device memory (:func:`free_device_memory`).
        row_bytes: Bytes per delivered row (the sum of the delivered dtypes' sizes).
        batch_size: Rows per batch.

    Examples:
        >>> chunk_rows_for_fraction(0.1, 16 * 2**30, 160, 65536)
        10682368
        >>> chunk_rows_for_fraction(0.1, 2**20, 160, 65536)  # less than a batch fits: one batch
        65536
    """
    if not _is_number(fraction) or not 0 < fraction <= 1:
        raise InvalidArgumentError(
            f"buffer_size (the share of free GPU memory one chunk may take) must be a "
            f"number in (0, 1], got {fraction!r}; for example 0.1"
        )
    for name, value, least in (
        ("free_bytes", free_bytes, 0),
        ("row_bytes", row_bytes, 1),
        ("batch_size", batch_size, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise InvalidArgumentError(f"{name} must be an integer >= {least}, got {value!r}")
    rows = int(float(fraction) * int(free_bytes)) // int(row_bytes)
    return max(rows // batch_size, 1) * int(batch_size)


def free_device_memory(device: int | None = None) -> int:
    """Bytes a new allocation can get on ``device`` (None: the current device).

    Free memory as the driver reports it, plus what cupy's default memory pool holds
    unused (it hands that out before asking the driver).
    """
    _, cupy, device = import_gpu(device)
    with cupy.cuda.Device(device):
        free, _total = cupy.cuda.runtime.memGetInfo()
        pooled = cupy.get_default_memory_pool().free_bytes()
    return int(free) + int(pooled)


def chunk_rows_for_device(
    fraction: float, *, row_bytes: int, batch_size: int, device: int | None = None
) -> int:
    """:func:`chunk_rows_for_fraction` of the memory free on ``device`` right now."""
    return chunk_rows_for_fraction(fraction, free_device_memory(device), row_bytes, batch_size)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is a GPU allocation failure from cudf, rmm, cupy or CUDA.

    rmm and cudf raise ``MemoryError`` (``std::bad_alloc: out_of_memory``), cupy its
    ``OutOfMemoryError`` (a ``MemoryError``); some CUDA paths raise ``RuntimeError``.

    Examples:
        >>> is_out_of_memory(MemoryError("std::bad_alloc: out_of_memory: RMM failure"))
        True
        >>> is_out_of_memory(RuntimeError("cudaErrorMemoryAllocation out of memory"))
        True
        >>> is_out_of_memory(ValueError("bad value"))
        False
    """
    if isinstance(error, MemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and (
        "out of memory" in text or "out_of_memory" in text or "memoryallocation" in text
    )


def memory_error_message(error: BaseException, *, device: int, doing: str) -> str:
    """The :class:`GPUMemoryError` message: what failed, and how to make chunks smaller."""
    return (
        f"cuda:{device} ran out of memory {doing} ({type(error).__name__}: {error}). "
        "Make chunks smaller: pass a smaller chunk_rows= or parts_per_chunk= to the Loader "
        "(or a smaller buffer_size= to the Keras loader), lower prefetch=, or free memory "
        "the framework holds. An RMM pool shared by cudf, cupy and the framework avoids "
        "fragmentation (see docs/gpu.md)"
    )


@contextlib.contextmanager
def _out_of_memory_as_error(device: int, doing: str) -> Iterator[None]:
    try:
        yield
    except GPUMemoryError:
        raise
    except Exception as err:
        if is_out_of_memory(err):
            raise GPUMemoryError(memory_error_message(err, device=device, doing=doing)) from err
        raise


# -- pure helpers of the reader (tested on the CPU) ----------------------------------------


class ChunkRead(NamedTuple):
    """One ``cudf.read_parquet`` call for a chunk: each file once, its row groups ascending.

    ``spans`` locates every piece, in the chunk's order, in the rows the call returns:
    ``(file position, partition, start, stop)``. ``starts`` holds the rows before each
    file's first, so a file read alone finds its pieces at ``start - starts[i]``.
    """

    files: list[int]
    row_groups: list[list[int]]
    partitions: list[list[int]]
    starts: list[int]
    spans: list[tuple[int, int, int, int]]


def plan_read(
    pieces: Sequence[Piece],
    part_file: NDArray[Any],
    part_row_group: NDArray[Any],
    partition_rows: NDArray[Any],
) -> ChunkRead:
    """Plan the one read of a chunk's pieces: every row group it touches, read once.

    cudf reads several files in the order given, and each file's row groups in the order
    given; ascending row groups per file make the order of the returned rows plain.
    A row group that two pieces share (a rank's share ending inside it) is read once.

    Examples:
        >>> read = plan_read([(2, 0, 7), (0, 0, 10), (1, 5, 20)], part_file=[0, 0, 1],
        ...                  part_row_group=[0, 1, 0], partition_rows=[10, 20, 7])
        >>> read.files, read.row_groups, read.starts
        ([0, 1], [[0, 1], [0]], [0, 30])
        >>> read.spans  # (file position, partition, start, stop) in the 37 rows read
        [(1, 2, 30, 37), (0, 0, 0, 10), (0, 1, 15, 30)]
    """
    touched = sorted(
        {int(partition) for partition, _, _ in pieces},
        key=lambda q: (int(part_file[q]), int(part_row_group[q])),
    )
    files: list[int] = []
    row_groups: list[list[int]] = []
    partitions: list[list[int]] = []
    starts: list[int] = []
    offset_of: dict[int, tuple[int, int]] = {}  # partition -> (file position, first row)
    offset = 0
    for partition in touched:
        file = int(part_file[partition])
        if not files or files[-1] != file:
            files.append(file)
            row_groups.append([])
            partitions.append([])
            starts.append(offset)
        row_groups[-1].append(int(part_row_group[partition]))
        partitions[-1].append(partition)
        offset_of[partition] = (len(files) - 1, offset)
        offset += int(partition_rows[partition])
    spans = []
    for partition, first, last in pieces:
        position, at = offset_of[int(partition)]
        spans.append((position, int(partition), at + int(first), at + int(last)))
    return ChunkRead(files, row_groups, partitions, starts, spans)


def assemble_segments(
    pieces: Sequence[Mapping[str, Any]], blocks: Sequence[Block], *, concatenate: bool, xp: Any
) -> list[Segment]:
    """Lay out decoded columns as the blocks' row-major 2-D arrays, cast to their dtypes.

    ``pieces`` holds one ``{column: 1-D array}`` per piece. With ``concatenate`` the
    result is one segment of all rows in piece order; otherwise one segment per piece,
    a single column already of the block's dtype being a zero-copy view. Uses only
    ``xp.empty`` and slice assignment, so numpy runs exactly the code cupy runs.
    """
    if concatenate:
        rows = sum(len(next(iter(p.values()))) for p in pieces)
        segment: Segment = {}
        for b in blocks:
            if b.ragged:  # a list column: its pieces' values one after the other
                whole = Ragged.concatenate([piece[b.columns[0]] for piece in pieces])
                segment[b.name] = Ragged(whole.values.astype(b.dtype, copy=False), whole.offsets)
                continue
            out = xp.empty((rows, len(b.columns)), dtype=b.dtype)
            offset = 0
            for piece in pieces:
                n = len(piece[b.columns[0]])
                for j, column in enumerate(b.columns):
                    out[offset : offset + n, j] = piece[column]  # one cast-and-copy kernel
                offset += n
            segment[b.name] = out
        return [segment]
    segments = []
    for piece in pieces:
        segment = {}
        for b in blocks:
            cols = [piece[c] for c in b.columns]
            if b.ragged:
                segment[b.name] = Ragged(
                    cols[0].values.astype(b.dtype, copy=False), cols[0].offsets
                )
                continue
            if len(cols) == 1 and cols[0].dtype == b.dtype:
                segment[b.name] = cols[0].reshape(-1, 1)
                continue
            out = xp.empty((len(cols[0]), len(cols)), dtype=b.dtype)
            for j, col in enumerate(cols):
                out[:, j] = col
            segment[b.name] = out
        segments.append(segment)
    return segments


# -- the backend ---------------------------------------------------------------------------


class DeviceArrays:
    """The array namespace the batching code runs with on a GPU.

    cupy on one device and one stream: every call makes the device current (the
    batcher thread starts on GPU 0 like any new thread) and runs on the stream.
    ``take``/``concatenate`` only queue their kernels; the batcher calls
    :meth:`synchronize` once a batch's gathers are queued, which keeps the hand-off
    rule. Their inputs may be dropped before that: memory goes back to a pool that
    hands it out again only to work queued after theirs on the same stream.
    """

    def __init__(self, cupy: Any, device: int, stream: Any) -> None:
        self.cupy = cupy
        self.device = device
        self.stream = stream

    @contextlib.contextmanager
    def _on_device(self, doing: str) -> Iterator[None]:
        with (
            self.cupy.cuda.Device(self.device),
            self.stream,
            _out_of_memory_as_error(self.device, doing),
        ):
            yield

    def empty(self, shape: tuple[int, ...], dtype: DTypeLike) -> Any:
        with self._on_device(f"allocating {shape} {np.dtype(dtype)}"):
            return self.cupy.empty(shape, dtype=dtype)

    def take(self, array: Any, indices: Any, axis: int = 0, out: Any = None) -> Any:
        with self._on_device(f"shuffling a block of {array.shape[0]:,} rows"):
            return self.cupy.take(array, indices, axis=axis, out=out)

    def concatenate(self, arrays: Sequence[Any], axis: int = 0, out: Any = None) -> Any:
        with self._on_device("joining a batch across chunks"):
            return self.cupy.concatenate(list(arrays), axis=axis, out=out)

    def synchronize(self) -> None:
        """Wait for the work queued on the stream: what it wrote is complete."""
        self.stream.synchronize()


def _optional_import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _nbytes(array: Any) -> int:
    if isinstance(array, Ragged):
        return int(array.values.nbytes) + int(array.offsets.nbytes)
    return int(array.nbytes)


def _device_list_column(
    series: Any, name: str, fill: float | None, where: str, cupy: Any
) -> Ragged:
    """A cudf list column as a :class:`Ragged` of cupy arrays, as on the CPU: null lists
    are empty lists, nulls inside lists take ``fill`` (or raise)."""
    lengths = series.list.len().fillna(0).values
    offsets = cupy.zeros(len(lengths) + 1, dtype=np.int64)
    cupy.cumsum(lengths, out=offsets[1:])
    leaves = series.list.leaves
    values = _device_column(leaves, name, fill, where + " (inside lists)", cupy)
    if len(values) != host_int(offsets[-1]):
        raise ReadError(
            f"the list column {name!r} in {where} has null lists that still span values; "
            "tabloader reads them as empty lists. Rewrite the file with empty lists for "
            "nulls (pyarrow does so), or read it with device='cpu'"
        )
    return Ragged(values, offsets)


def _device_column(series: Any, name: str, fill: float | None, where: str, cupy: Any) -> Any:
    """One cudf column as a cupy array, nulls filled or refused exactly as on the CPU.

    The rule on both backends: nulls are filled, NaN and infinities are delivered as
    stored. pyarrow's ``fill_null`` touches nulls only, but cudf's ``fillna`` follows
    pandas and replaces NaN as well, so the NaN of a float column are put back where
    they were. ``series != series`` is true exactly there: a NaN is unequal to itself,
    and a comparison with a null is null, read as false.
    """
    nulls = int(series.null_count)
    if not nulls:
        return series.values
    if fill is None:
        raise NullValuesError(null_message(name, nulls, where))
    values = series.fillna(series.dtype.type(fill)).values
    if series.dtype.kind == "f":
        is_nan = (series != series).fillna(False).values
        values = cupy.where(is_nan, values.dtype.type("nan"), values)
    return values


# -- device memory ---------------------------------------------------------------------------

POOL_ENV = "TABLOADER_GPU_POOL_SIZE"
"""Initial size in bytes of the memory pool tabloader sets up, or ``off`` for none."""
DEFAULT_POOL_BYTES = 256 * 2**20


def ensure_memory_pool(rmm: Any, device: int) -> bool:
    """Give ``device`` an rmm pool unless memory there was configured already.

    cudf points cupy at rmm when it is imported, and rmm's default resource calls
    ``cudaMalloc``/``cudaFree`` for every allocation, which synchronises the device. When
    the device still has that default resource, a :class:`rmm.mr.PoolMemoryResource`
    (initial size ``$TABLOADER_GPU_POOL_SIZE`` bytes, 256 MiB by default, growing on
    demand) wrapped in a statistics adaptor becomes its resource; any other resource
    (the user's pool, managed memory, an arena) is left as it is. Returns whether a
    pool was set up.
    """
    setting = os.environ.get(POOL_ENV, "").strip().lower()
    if setting in ("off", "0", "none"):
        return False
    try:
        size = int(setting) if setting else DEFAULT_POOL_BYTES
    except ValueError:
        raise InvalidArgumentError(
            f"{POOL_ENV}={setting!r} must be a number of bytes or 'off'"
        ) from None
    current = rmm.mr.get_per_device_resource(device)
    if type(current) is not rmm.mr.CudaMemoryResource:
        return False
    size = -(-size // 256) * 256  # rmm pools grow in multiples of 256 bytes
    pool = rmm.mr.PoolMemoryResource(current, initial_pool_size=size)
    rmm.mr.set_per_device_resource(device, rmm.mr.StatisticsResourceAdaptor(pool))
    return True


def device_bytes_in_use(rmm: Any, cupy: Any, device: int) -> int:
    """Bytes allocated on ``device``: rmm's count when it keeps one, else the driver's."""
    resource = rmm.mr.get_per_device_resource(device) if rmm is not None else None
    counts = getattr(resource, "allocation_counts", None)
    if counts is not None:
        # rmm before 25.x returns a dict; newer rmm a Statistics object with the same fields.
        current = counts["current_bytes"] if isinstance(counts, dict) else counts.current_bytes
        return int(current)
    with cupy.cuda.Device(device):
        free, total = cupy.cuda.runtime.memGetInfo()
    return int(total) - int(free)


class GPUBackend:
    """Chunks in GPU memory: cudf decodes, cupy lays out, permutes and slices.

    Args:
        device: CUDA device index; None is the current device of the calling thread.
    """

    def __init__(self, device: int | None = None) -> None:
        self._cudf, self._cupy, self.device = import_gpu(device)
        self.name = f"cuda:{self.device}"
        self._rmm = _optional_import("rmm")
        if self._rmm is not None:
            ensure_memory_pool(self._rmm, self.device)
        # The legacy default stream: see "Streams, and the hand-off rules" above.
        self._stream = self._cupy.cuda.Stream.null
        self.xp = DeviceArrays(self._cupy, self.device, self._stream)

    def read_chunks(self, request: ReadRequest) -> Iterator[list[Part]]:
        plan = request.plan
        for chunk in range(plan.num_chunks):
            yield self.load_chunk(
                request.dataset,
                plan.pieces(chunk),
                request.blocks,
                request.fill_null,
                order=plan.batch_order(chunk),
                stats=request.stats,
            )

    def load_chunk(
        self,
        dataset: Dataset,
        pieces: Sequence[Piece],
        blocks: Sequence[Block],
        fill_null: Mapping[str, float],
        *,
        order: NDArray[np.int64] | None,
        stats: StatsRecorder,
    ) -> list[Part]:
        cupy = self._cupy
        columns = [c for b in blocks for c in b.columns]
        lists = {c for b in blocks if b.ragged for c in b.columns}
        rows = sum(last - first for _, first, last in pieces)
        doing = f"reading a chunk of {rows:,} rows"
        with cupy.cuda.Device(self.device), _out_of_memory_as_error(self.device, doing):
            t0 = time.perf_counter()
            frames, spans = self._read_frames(dataset, pieces, columns)
            arrays = self._piece_arrays(dataset, frames, spans, columns, lists, fill_null)
            stats.bytes_read += sum(_nbytes(a) for piece in arrays for a in piece.values())
            t1 = time.perf_counter()
            stats.read_seconds += t1 - t0
            # Shuffled, the chunk is gathered batch by batch in delivery order: on the
            # device a gather costs little, so there is no need to reorder it up front.
            concatenate = order is not None
            with self._stream:
                segments = assemble_segments(arrays, blocks, concatenate=concatenate, xp=cupy)
                index = None if order is None else cupy.asarray(order)
            self._stream.synchronize()  # the hand-off rule: the chunk leaves complete
        stats.assemble_seconds += time.perf_counter() - t1
        stats.device_bytes = device_bytes_in_use(self._rmm, cupy, self.device)
        return [(segment, index) for segment in segments]

    def _piece_arrays(
        self,
        dataset: Dataset,
        frames: list[Any],
        spans: list[tuple[int, int, int, int]],
        columns: list[str],
        lists: set[str],
        fill_null: Mapping[str, float],
    ) -> list[dict[str, Any]]:
        """Each piece's columns as device arrays (or :class:`Ragged`), in piece order.

        A frame's columns are converted once and sliced per piece (views, no copies),
        unless a piece needs its own conversion: list columns, or nulls in a column with
        no fill value, which are an error only in the rows a piece delivers and must name
        its row group.
        """
        cupy = self._cupy
        whole: dict[int, dict[str, Any] | None] = {}
        out = []
        for i, partition, start, stop in spans:
            frame = frames[i]
            if i not in whole:
                series = {c: frame[c] for c in columns}
                refused = any(fill_null.get(c) is None and series[c].null_count for c in columns)
                whole[i] = (
                    None
                    if lists or refused
                    else {
                        c: _device_column(col, c, fill_null.get(c), "", cupy)
                        for c, col in series.items()
                    }
                )
            converted = whole[i]
            if converted is not None:
                out.append({c: a[start:stop] for c, a in converted.items()})
                continue
            piece = frame if start == 0 and stop == len(frame) else frame.iloc[start:stop]
            where = dataset.describe_partition(partition)
            out.append(
                {
                    c: (_device_list_column if c in lists else _device_column)(
                        piece[c], c, fill_null.get(c), where, cupy
                    )
                    for c in columns
                }
            )
        return out

    def _read_frames(
        self, dataset: Dataset, pieces: Sequence[Piece], columns: list[str]
    ) -> tuple[list[Any], list[tuple[int, int, int, int]]]:
        """cudf DataFrames of the pieces' rows, and where each piece lies in them.

        Returns ``(frames, spans)``: ``spans`` holds ``(frame, partition, start, stop)``
        for every piece, in order. A chunk of parquet files is one read.
        """
        cudf = self._cudf
        source = dataset._source
        if isinstance(source, _ParquetSource):
            read = plan_read(pieces, source.part_file, source.part_row_group, source.rows)
            frames = self._read_parquet(dataset, source, read, columns)
            if len(frames) == 1:
                return frames, [(0, p, start, stop) for _, p, start, stop in read.spans]
            return frames, [
                (i, p, start - read.starts[i], stop - read.starts[i])
                for i, p, start, stop in read.spans
            ]
        frames = []
        if isinstance(source, _DaskSource):
            for partition, first, last in pieces:
                try:
                    with dask_threads_on(self.device, self._cupy):  # not on GPU 0
                        frame = source.compute_partition(partition, columns).iloc[first:last]
                except Exception as err:
                    if is_out_of_memory(err):
                        raise
                    raise read_error(dataset.describe_partition(partition), err) from err
                if not type(frame).__module__.startswith("cudf"):  # dask with pandas parts
                    frame = cudf.from_pandas(frame)
                frames.append(frame)
        else:
            # An in-memory table lives on the host: one copy to the device is unavoidable.
            for table in dataset.iter_pieces(pieces, columns):
                frames.append(cudf.DataFrame.from_arrow(table))
        # One frame per piece, holding exactly its rows.
        spans = [(i, int(p), 0, len(frames[i])) for i, (p, _, _) in enumerate(pieces)]
        return frames, spans

    def _read_parquet(
        self, dataset: Dataset, source: _ParquetSource, read: ChunkRead, columns: list[str]
    ) -> list[Any]:
        """``read``'s row groups as one cudf DataFrame, or one per file (see below)."""
        parts = [p for file_parts in read.partitions for p in file_parts]
        where = dataset.describe_partition(parts[0])
        if len(parts) > 1:
            where += f" or one of {len(parts) - 1} other row group(s)"
        try:
            with contextlib.ExitStack() as opened:
                if source.filesystem is None:
                    sources: list[Any] = [source.files[f] for f in read.files]
                else:
                    # Only the footer and the byte ranges of these row groups and columns
                    # cross the network (retried like the CPU's reads); cudf given the URL
                    # would fetch the whole object.
                    sources = [
                        opened.enter_context(dataset.open_row_groups(f, groups, columns))
                        for f, groups in zip(read.files, read.row_groups, strict=True)
                    ]
                frame = self._cudf.read_parquet(
                    sources, columns=columns, row_groups=read.row_groups, use_pandas_metadata=False
                )
        except ReadError:
            raise  # a network failure, already named with its remedy
        except Exception as err:
            if is_out_of_memory(err):
                raise
            if len(read.files) > 1:
                return self._read_each_file(dataset, source, read, columns)
            raise read_error(where, err) from err
        expected = int(sum(source.rows[p] for p in parts))
        if len(frame) != expected:
            if len(read.files) > 1:
                return self._read_each_file(dataset, source, read, columns)
            raise ReadError(
                f"cudf read {len(frame)} rows from {where}, but the footers listed {expected}: "
                "the file changed after the dataset was created. Create the Dataset again"
            )
        # cudf adds the key=value directories of a hive-partitioned path as columns; the
        # CPU backend reads the file alone, so deliver exactly the requested columns.
        if list(frame.columns) != columns:
            frame = frame[columns]
        return [frame]

    def _read_each_file(
        self, dataset: Dataset, source: _ParquetSource, read: ChunkRead, columns: list[str]
    ) -> list[Any]:
        """``read`` one file at a time: files that fail together may each read alone (their
        schemas may differ in columns not read), and a file at fault is named."""
        return [
            self._read_parquet(dataset, source, ChunkRead([f], [groups], [ps], [0], []), columns)[0]
            for f, groups, ps in zip(read.files, read.row_groups, read.partitions, strict=True)
        ]
