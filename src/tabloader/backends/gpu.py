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
import os
import sys
import time
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from numbers import Real
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tabloader._deps import gpu_module as _import
from tabloader._deps import gpu_usable, import_gpu
from tabloader._deps import optional as _optional_import
from tabloader.backends.cpu import null_message
from tabloader.backends.gpu_dask import dask_compute_options
from tabloader.backends.gpu_memory import (
    DEFAULT_POOL_BYTES,
    MEMORY_ENV,
    POOL_ENV,
    ConsumerFence,
    DeviceMemory,
    acquire_pool,
    device_bytes_in_use,
    finalize_loader_memory,
    free_device_memory,
    is_out_of_memory,
    memory_error_message,
    scoped,
    take_streams,
)
from tabloader.backends.gpu_memory import out_of_memory_as_error as _out_of_memory_as_error
from tabloader.batches import Ragged, host_int
from tabloader.casting import check_block
from tabloader.dataset import read_error
from tabloader.errors import (
    GPUMemoryError,
    GPUUnavailableError,
    InvalidArgumentError,
    NullValuesError,
    PerformanceWarning,
    ReadError,
)
from tabloader.sources.partitions import same_reads
from tabloader.stages import drawn_ahead

if TYPE_CHECKING:
    from numpy.typing import DTypeLike, NDArray

    from tabloader.backends import Piece, ReadRequest
    from tabloader.batches import Block, Part, Segment
    from tabloader.dataset import Dataset
    from tabloader.plan import EpochPlan

__all__ = [
    "DEFAULT_POOL_BYTES",
    "MEMORY_ENV",
    "POOL_ENV",
    "DeviceArrays",
    "GPUBackend",
    "GPUMemoryError",
    "GPUUnavailableError",
    "as_contiguous",
    "assemble_frames",
    "batch_device",
    "chunk_rows_for_device",
    "chunk_rows_for_fraction",
    "delivery_rows",
    "device_bytes_in_use",
    "device_scope",
    "free_device_memory",
    "gpu_usable",
    "import_gpu",
    "is_out_of_memory",
    "memory_error_message",
    "plan_read",
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
        free_bytes: Free device memory (`free_device_memory`).
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


def chunk_rows_for_device(
    fraction: float, *, row_bytes: int, batch_size: int, device: int | None = None
) -> int:
    """`chunk_rows_for_fraction` of the memory free on ``device`` right now."""
    return chunk_rows_for_fraction(fraction, free_device_memory(device), row_bytes, batch_size)


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


def delivery_rows(
    spans: Sequence[tuple[int, int, int, int]],
    frame_rows: Sequence[int],
    order: Any,
    *,
    xp: Any = np,
) -> tuple[Any, int]:
    """Where a chunk's rows lie in its read frames laid end to end, in delivery order.

    ``spans`` holds ``(frame, partition, start, stop)`` for each piece of the chunk, in
    plan order; ``frame_rows`` the rows of each frame; ``order`` the chunk's delivery
    order (None: plan order), an array of ``xp`` (numpy, or cupy: then the rows are
    worked out on the device). Returns ``(index, first)``: the block rows to gather, in
    delivery order, or None and the first row when they are one ascending run (served as
    zero-copy slices).

    Examples:
        >>> delivery_rows([(0, 7, 2, 5), (1, 3, 0, 4)], [5, 4], None)
        (None, 2)
        >>> index, _ = delivery_rows([(1, 3, 0, 2), (0, 7, 0, 2)], [5, 4], np.array([3, 0, 2, 1]))
        >>> index.tolist()
        [1, 5, 0, 6]
    """
    starts = [0]
    for n in frame_rows:
        starts.append(starts[-1] + int(n))
    runs = [(starts[f] + start, stop - start) for f, _, start, stop in spans]
    runs = [(first, n) for first, n in runs if n > 0]
    if not runs:
        return None, 0
    contiguous = all(a + n == b for (a, n), (b, _) in pairwise(runs))
    if contiguous:
        if order is None:
            return None, runs[0][0]
        return order + runs[0][0], 0  # one pass over the order, on its device
    rows = xp.concatenate([xp.arange(a, a + n, dtype=np.int64) for a, n in runs])
    return (rows if order is None else rows[order]), 0


@dataclass(frozen=True)
class ChunkPlan:
    """What the reader does for one chunk, worked out ahead on the host: the read (one
    parquet read of its row groups for files), and where its pieces lie in what is read
    (``spans`` in frames of ``frame_rows`` rows; see `delivery_rows`)."""

    read: ChunkRead | None
    spans: list[tuple[int, int, int, int]]
    frame_rows: list[int]
    rows: int


# -- columns of a read frame ---------------------------------------------------------------


def _device_list_column(
    series: Any, name: str, fill: float | None, where: str, cupy: Any
) -> Ragged:
    """A cudf list column as a `Ragged` of cupy arrays, as on the CPU: null lists
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


class _Undecodable(Exception):
    """cudf decoded a column as something else than the numbers it holds (a 16-bit float
    comes back as a list of bytes): the chunk is decoded on the host instead."""


class _CudfColumn:
    """A column of a cudf DataFrame, as the reader uses it."""

    def __init__(self, series: Any, *, is_list: bool = False) -> None:
        self.series = series
        if not is_list and getattr(series.dtype, "kind", "") not in "iufb":
            raise _Undecodable(f"{series.name!r} decoded as {series.dtype}")
        self.null_count = int(series.null_count)

    def nulls_in(self, start: int, stop: int) -> int:
        return int(self.series.iloc[start:stop].null_count)

    def to_device(self, name: str, fill: float | None, where: str, cupy: Any) -> Any:
        return _device_column(self.series, name, fill, where, cupy)

    def to_ragged(self, name: str, fill: float | None, where: str, cupy: Any) -> Ragged:
        return _device_list_column(self.series, name, fill, where, cupy)


_TYPE_NAMES = {"bool8": "bool"}  # libcudf's type ids that numpy spells otherwise


class _PlcColumn:
    """A fixed-width pylibcudf column as cupy views of its buffers: values, and validity
    from its null mask (one bit a row, least significant first, as in Arrow)."""

    def __init__(self, column: Any, cupy: Any) -> None:
        self.column, self.cupy = column, cupy
        self.null_count = int(column.null_count())
        self.size, self.offset = int(column.size()), int(column.offset())
        type_name = str(column.type().id().name).lower()
        try:
            self.dtype = np.dtype(_TYPE_NAMES.get(type_name, type_name))
        except TypeError:
            raise NotImplementedError(f"no fixed-width reading of {type_name} columns") from None

    def values(self) -> Any:
        if not self.size:
            return self.cupy.empty(0, dtype=self.dtype)
        raw = self.cupy.asarray(self.column.data())  # bytes of the buffer, zero-copy
        nbytes = self.dtype.itemsize
        return raw[self.offset * nbytes : (self.offset + self.size) * nbytes].view(self.dtype)

    def valid(self, start: int, stop: int) -> Any:
        cupy = self.cupy
        bits = cupy.asarray(self.column.null_mask()).view(np.uint8)
        rows = cupy.arange(self.offset + start, self.offset + stop, dtype=np.int64)
        return ((bits[rows >> 3] >> (rows & 7).astype(np.uint8)) & 1).astype(bool)

    def nulls_in(self, start: int, stop: int) -> int:
        if not self.null_count:
            return 0
        return (stop - start) - host_int(self.valid(start, stop).sum())

    def to_device(self, name: str, fill: float | None, where: str, cupy: Any) -> Any:
        """The values, nulls replaced by ``fill`` (NaN left as stored: a NaN is a value)."""
        values = self.values()
        if not self.null_count:
            return values
        if fill is None:
            raise NullValuesError(null_message(name, self.null_count, where))
        return cupy.where(self.valid(0, self.size), values, values.dtype.type(fill))

    def to_ragged(self, name: str, fill: float | None, where: str, cupy: Any) -> Ragged:
        raise NotImplementedError("list columns are read through cudf")


def _frame_columns(
    frame: Mapping[str, Any],
    columns: Sequence[str],
    lists: set[str],
    fill_null: Mapping[str, float],
    pieces: Sequence[tuple[int, int, int]],
    dataset: Dataset,
    cupy: Any,
    vectors: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """A read frame's columns (``_CudfColumn``/``_PlcColumn`` by name) as device arrays,
    list columns as `Ragged`, vector columns (``vectors``: fixed-size lists, which cudf
    reads as lists) as ``[rows, k]``.

    Nulls are filled by ``fill_null``; a column without a fill value may hold nulls only
    in rows no piece delivers (a rank's share ending inside a row group), which are then
    filled with 0 and never delivered. Otherwise
    [`NullValuesError`][tabloader.errors.NullValuesError] names the row group of the first piece
    with nulls (``pieces``: ``(partition, start, stop)`` rows of this frame).
    """
    out: dict[str, Any] = {}
    where = dataset.describe_partition(pieces[0][0]) if pieces else "a chunk"
    if len(pieces) > 1:
        where += f" or one of {len(pieces) - 1} other row group(s)"
    for c in columns:
        column = frame.get(c)
        if column is None:
            raise ReadError(
                f"column {c!r} is missing from {where}: the file changed after the dataset "
                "was created. Create the Dataset again"
            )
        fill = fill_null.get(c)
        if fill is None and c not in lists and column.null_count:
            for partition, start, stop in pieces:
                nulls = column.nulls_in(start, stop)
                if nulls:
                    part = dataset.describe_partition(partition)
                    raise NullValuesError(null_message(c, nulls, part))
            fill = 0  # the nulls are in rows no piece delivers
        if c in lists:
            out[c] = column.to_ragged(c, fill, where, cupy)
        elif vectors and c in vectors:  # a null row is an empty list, made k fills
            ragged = column.to_ragged(c, fill, where, cupy)
            out[c] = ragged.to_dense(vectors[c], 0 if fill is None else fill, c)
        else:
            out[c] = column.to_device(c, fill, where, cupy)
    return out


class _ConstantColumn:
    """A column every row of which holds one value (a partition key) or is null (a column
    added to a table after the file was written), made on the device only as delivered."""

    def __init__(self, values: Sequence[Any], rows: Sequence[int], kind: Any) -> None:
        self.values, self.rows, self.kind = list(values), list(rows), kind
        self.null_count = sum(n for v, n in zip(self.values, self.rows, strict=True) if v is None)

    def _runs(self, start: int, stop: int) -> Iterator[tuple[Any, int, int]]:
        at = 0
        for value, n in zip(self.values, self.rows, strict=True):
            lo, hi = max(start, at), min(stop, at + n)
            if lo < hi:
                yield value, lo, hi
            at += n

    def nulls_in(self, start: int, stop: int) -> int:
        return sum(hi - lo for value, lo, hi in self._runs(start, stop) if value is None)

    def to_device(self, name: str, fill: float | None, where: str, cupy: Any) -> Any:
        if self.null_count and fill is None:
            raise NullValuesError(null_message(name, self.null_count, where))
        rows = sum(self.rows)
        out = cupy.empty(rows, dtype=np.dtype(self.kind.to_pandas_dtype()))
        for value, lo, hi in self._runs(0, rows):
            out[lo:hi] = fill if value is None else value
        return out

    def to_ragged(self, name: str, fill: float | None, where: str, cupy: Any) -> Ragged:
        raise ReadError(f"{name!r} is not a list column in {where}")


def _complete_columns(
    frame: dict[str, Any],
    how: Sequence[Any],
    file_rows: Sequence[int],
    columns: Sequence[str],
    where: str = "the file read",
) -> dict[str, Any]:
    """The columns read from files (their stored names, file after file; ``how`` holds
    each file's `FileColumns`) as the requested
    ``columns``: renamed, constant ones (partition keys, columns a file predates) added.
    A column neither read nor constant raises [`ReadError`][tabloader.errors.ReadError]
    naming ``where``."""
    first = how[0]
    if all(h.plain for h in how):
        return frame
    stored = {first.rename.get(name, name): name for name in first.read}
    out = {}
    for c in columns:
        if c in first.constants:
            values = [h.constants.get(c) for h in how]
            out[c] = _ConstantColumn(values, file_rows, first.types[c])
        elif c in stored and stored[c] in frame:
            out[c] = frame[stored[c]]
        else:
            name = stored.get(c, c)
            also = f" (stored as {name!r})" if name != c else ""
            raise ReadError(
                f"column {c!r}{also} is missing from {where}: the file changed after the "
                "dataset was created, or its table's metadata no longer matches it. Create "
                "the Dataset again"
            )
    return out


def _as_cudf_lists(table: Any) -> Any:
    """``table`` (Arrow) with its fixed-size list and list view columns as list columns,
    whose null rows hold no values: what cudf reads from parquet, and what its Arrow
    interop takes (libcudf has neither a fixed-size list type nor list views)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for i, field in enumerate(table.schema):
        kind = field.type
        views = pa.types.is_list_view(kind) or pa.types.is_large_list_view(kind)
        if pa.types.is_fixed_size_list(kind) or views:
            array: Any = table.column(i).combine_chunks()
            lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy()
            offsets = np.zeros(len(array) + 1, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            mask = array.is_null() if array.null_count else None
            starts: Any = pa.array(offsets)
            lists = pa.ListArray.from_arrays(starts, array.flatten(), mask=mask)
            table = table.set_column(i, field.name, lists)
    return table


def _cudf_frame(frame: Any, lists: set[str]) -> dict[str, _CudfColumn]:
    return {name: _CudfColumn(frame[name], is_list=name in lists) for name in frame.columns}


def assemble_frames(
    frames: Sequence[Mapping[str, Any]], blocks: Sequence[Block], xp: Any
) -> Segment:
    """The frames' columns laid out as the blocks, cast to their dtypes, frame after frame.

    Row-major blocks (``[rows, k]``, the stacked layout) and column-major ones (each
    column contiguous, columns of one dtype side by side) take one cast-and-copy kernel
    per column and frame; list columns are joined. Uses only ``xp.empty`` and slice
    assignment, so numpy runs exactly the code cupy runs.

    Examples:
        >>> from tabloader.batches import Block
        >>> blocks = [Block("<int64>", ("a", "b"), np.dtype("int64"), column_major=True)]
        >>> frames = [{"a": np.arange(2), "b": np.arange(2) * 10}, {"a": np.array([7]),
        ...            "b": np.array([70])}]
        >>> segment = assemble_frames(frames, blocks, np)
        >>> segment["<int64>"].tolist(), segment["<int64>"][:, 1].flags.c_contiguous
        ([[0, 0], [1, 10], [7, 70]], True)
    """
    rows = sum(len(next(iter(f.values()))) for f in frames)
    for frame in frames:  # a value that does not fit its block's dtype is an error
        for b in blocks:
            check_block(frame, b)
    segment: Segment = {}
    for b in blocks:
        if b.ragged:
            whole = Ragged.concatenate([f[b.columns[0]] for f in frames])
            segment[b.name] = Ragged(whole.values.astype(b.dtype, copy=False), whole.offsets)
            continue
        k = b.width
        if b.column_major:
            out = xp.empty((k, rows), dtype=b.dtype).T
        else:
            out = xp.empty((rows, k), dtype=b.dtype)
        offset = 0
        for frame in frames:
            n = len(frame[b.columns[0]])
            for column, j, stop in b.spans():  # (a vector column takes k places)
                place = j if stop == j + 1 and frame[column].ndim == 1 else slice(j, stop)
                out[offset : offset + n, place] = frame[column]  # one cast-and-copy kernel
            offset += n
        segment[b.name] = out
    return segment


# -- remote files, handed to cudf as local sparse copies -------------------------------------


@contextlib.contextmanager
def _local_copies(handles: Sequence[Any]) -> Iterator[list[str]]:
    """Paths of local files holding what ``handles`` (`RangeFile`) fetched.

    cudf reads a path through its own, well-trodden file source; a Python file-like
    object it would read whole, or from several threads seeking one handle. Each copy is
    sparse (only the fetched byte ranges take memory) and anonymous: a ``memfd`` where
    Linux has one, else a deleted temporary file; gone when the block ends.
    """
    fds: list[int] = []
    try:
        for handle in handles:
            memfd = getattr(os, "memfd_create", None)
            if memfd is not None:
                fd = memfd("tabloader-range", getattr(os, "MFD_CLOEXEC", 0))
            else:  # pragma: no cover - systems without memfd
                import tempfile

                fd, path = tempfile.mkstemp(prefix="tabloader-range-")
                os.unlink(path)
            fds.append(fd)
            handle.write_sparse(fd)
        yield [f"/proc/self/fd/{fd}" for fd in fds]
    finally:
        for fd in fds:
            os.close(fd)


# -- the array namespace ---------------------------------------------------------------------


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

READER_ENV = "TABLOADER_GPU_READER"
"""``cudf`` makes the GPU backend decode with ``cudf.read_parquet`` even where pylibcudf's
reader works (to compare the two); unset, pylibcudf's is used where it can be."""


def _rmm_stream(stream: Any) -> Any:
    """``stream`` (cupy's) as the stream object pylibcudf takes, or None where rmm cannot
    wrap it (pylibcudf then decodes on the default stream)."""
    try:
        from rmm.pylibrmm.stream import Stream

        return Stream(obj=stream)
    except Exception:
        return None


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
        reader = os.environ.get(READER_ENV, "").strip().lower()
        if reader not in ("", "cudf", "pylibcudf"):
            raise InvalidArgumentError(f"{READER_ENV}={reader!r} must be 'cudf' or 'pylibcudf'")
        self._rmm = _optional_import("rmm")
        pool = None if self._rmm is None else acquire_pool(self._rmm, self.device)
        memory = DeviceMemory(self._cupy, self.device, take_streams(self._cupy, self.device))
        self.xp = DeviceArrays(self._cupy, self.device, memory)
        # Given back when the loader closes, or when it is collected.
        self._finalizer = weakref.finalize(
            self, finalize_loader_memory, self._rmm, self.device, memory, pool
        )
        self._plc: Any = None if reader == "cudf" else _optional_import("pylibcudf")
        self._plc_stream = _rmm_stream(self.xp.reader_stream) if self._plc is not None else None
        self._plc_worked = False

    def close(self) -> None:
        """Give the loader's GPU memory back: memory the consumer let go of, once its work
        on it is done; the device's pool, when no other loader uses it (see
        `tabloader.backends.gpu_memory`). Batches still held stay valid."""
        self._finalizer()

    @property
    def reader(self) -> str:
        """Which parquet reader decodes: ``"pylibcudf"`` (on the loader's stream) or
        ``"cudf"`` (``cudf.read_parquet``, on the default stream)."""
        return "cudf" if self._plc is None else "pylibcudf"

    def scope(self) -> contextlib.AbstractContextManager[None]:
        return self.xp.scope()

    def read_chunks(self, request: ReadRequest) -> Iterator[list[Part]]:
        plan, dataset = request.plan, request.dataset
        chunk_plans = drawn_ahead(plan, partial(self.plan_chunk, dataset, plan))
        try:
            with self.xp.reading():
                for chunk, chunk_plan in zip(range(plan.num_chunks), chunk_plans, strict=True):
                    # the shuffled order, drawn on the device (the host's draw, exactly)
                    with _out_of_memory_as_error(self.device, f"drawing chunk {chunk}'s order"):
                        order = plan.batch_order(chunk, xp=self._cupy)
                    yield self.load_chunk(request, plan.pieces(chunk), chunk_plan, order)
        finally:
            chunk_plans.close()

    @staticmethod
    def plan_chunk(dataset: Dataset, plan: EpochPlan, chunk: int) -> ChunkPlan:
        """The read of chunk ``chunk``, and where its pieces lie in it (host work done a
        chunk ahead in a thread of its own)."""
        pieces = plan.pieces(chunk)
        layout = dataset.parquet_layout()
        if layout is not None:
            read = plan_read(pieces, *layout)
            frame_rows = [sum(int(layout[2][p]) for p in parts) for parts in read.partitions]
            spans = [
                (f, p, start - read.starts[f], stop - read.starts[f])
                for f, p, start, stop in read.spans
            ]
            return ChunkPlan(read, spans, frame_rows, sum(b - a for _, _, a, b in spans))
        # one frame per piece, holding exactly its rows
        frame_rows = [last - first for _, first, last in pieces]
        spans = [(i, int(pieces[i][0]), 0, n) for i, n in enumerate(frame_rows)]
        return ChunkPlan(None, spans, frame_rows, sum(frame_rows))

    def load_chunk(
        self,
        request: ReadRequest,
        pieces: Sequence[Piece],
        chunk_plan: ChunkPlan,
        order: Any = None,
    ) -> list[Part]:
        """Read one chunk and lay it out as the request's blocks, in the calling thread
        (set up by `DeviceArrays.reading`)."""
        cupy, stats, dataset = self._cupy, request.stats, request.dataset
        blocks = request.blocks
        columns = [c for b in blocks for c in b.columns]
        lists = {c for b in blocks if b.ragged for c in b.columns}
        vectors = {c: k for b in blocks for c, k in b.vectors}  # read as lists by cudf
        doing = f"reading a chunk of {chunk_plan.rows:,} rows"
        with _out_of_memory_as_error(self.device, doing):
            t0 = time.perf_counter()
            frames, on_default = self._read_frames(
                dataset, pieces, chunk_plan.read, columns, lists | set(vectors)
            )
            # The conversions run where the decode ran: after it, in order.
            with cupy.cuda.Stream.null if on_default else contextlib.nullcontext():
                converted = [
                    _frame_columns(
                        frame, columns, lists, request.fill_null, rows, dataset, cupy, vectors
                    )
                    for frame, rows in zip(
                        frames, _pieces_by_frame(pieces, chunk_plan, frames), strict=True
                    )
                ]
            memory, default = self.xp.memory, cupy.cuda.Stream.null
            if on_default:  # the layout below reads what cudf wrote
                memory.order(self.xp.reader_stream, after=default)
            t1 = time.perf_counter()
            stats.read_seconds += t1 - t0
            segment = assemble_frames(converted, blocks, cupy)
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

    def _read_frames(
        self,
        dataset: Dataset,
        pieces: Sequence[Piece],
        read: ChunkRead | None,
        columns: list[str],
        lists: set[str],
    ) -> tuple[list[dict[str, Any]], bool]:
        """The chunk's columns by name, frame after frame: one read of all its parquet
        row groups (or one frame per file, see `_read_parquet`), else one frame per
        piece; and whether they were made on the default stream (else on the loader's)."""
        cudf = self._cudf
        if read is not None:
            return self._read_parquet(dataset, read, columns, lists)
        # dask's threads on this GPU, not GPU 0
        scheduler = dask_compute_options(self.device, self._cupy)
        partitions = dataset.computed_partitions(pieces, columns, scheduler=scheduler)
        if partitions is not None:  # dask-cudf partitions stay on the device
            frames = [
                frame if type(frame).__module__.startswith("cudf") else cudf.from_pandas(frame)
                for frame in partitions
            ]
        else:  # an in-memory table lives on the host: one copy to the device is unavoidable
            frames = [
                cudf.DataFrame.from_arrow(_as_cudf_lists(t))
                for t in dataset.iter_pieces(pieces, columns)
            ]
        return [_cudf_frame(frame, lists) for frame in frames], True

    def _read_parquet(
        self, dataset: Dataset, read: ChunkRead, columns: list[str], lists: set[str]
    ) -> tuple[list[dict[str, Any]], bool]:
        """``read``'s row groups as one frame, or one per file (see below)."""
        parts = [p for file_parts in read.partitions for p in file_parts]
        where = dataset.describe_partition(parts[0])
        if len(parts) > 1:
            where += f" or one of {len(parts) - 1} other row group(s)"
        if dataset.verify_checksums:  # cudf's reader does not check page checksums
            return [self._decode_on_host(dataset, read, columns, lists)], True
        # Partition keys and renamed or added table columns: what each file stores.
        how = [dataset.file_columns(f, columns) for f in read.files]
        if len(how) > 1 and not same_reads(how):
            return self._read_each_file(dataset, read, columns, lists)
        stored = list(how[0].read)
        expected = int(sum(dataset.partition_rows[p] for p in parts))
        try:
            with contextlib.ExitStack() as opened:
                paths = dataset.local_paths(read.files)
                if paths is None:
                    # Only the footer and the byte ranges of these row groups and columns
                    # cross the network (retried like the CPU's reads); cudf reads them
                    # from sparse local copies.
                    handles = [
                        opened.enter_context(dataset.open_row_groups(f, groups, stored))
                        for f, groups in zip(read.files, read.row_groups, strict=True)
                    ]
                    paths = opened.enter_context(_local_copies(handles))
                frame, rows, on_default = self._decode(paths, read.row_groups, stored, lists)
        except _Undecodable:  # decoded by pyarrow: renamed and completed as on the CPU
            return [self._decode_on_host(dataset, read, columns, lists)], True
        except ReadError:
            raise  # a network failure, already named with its remedy
        except Exception as err:
            if is_out_of_memory(err):
                raise
            if len(read.files) > 1:
                return self._read_each_file(dataset, read, columns, lists)
            raise read_error(where, err) from err
        if rows != expected:
            if len(read.files) > 1:
                return self._read_each_file(dataset, read, columns, lists)
            raise ReadError(
                f"cudf read {rows} rows from {where}, but the footers listed {expected}: "
                "the file changed after the dataset was created. Create the Dataset again"
            )
        # Partition keys, and table columns renamed or added after a file was written:
        # deliver exactly the requested columns, keys typed as on the CPU.
        file_rows = [int(sum(dataset.partition_rows[p] for p in ps)) for ps in read.partitions]
        return [_complete_columns(frame, how, file_rows, columns, where)], on_default

    def _decode_on_host(
        self, dataset: Dataset, read: ChunkRead, columns: list[str], lists: set[str]
    ) -> Any:
        """``read``'s row groups decoded by pyarrow, as the CPU backend decodes them, and
        copied to the device: for columns cudf does not decode (16-bit floats, widened to
        32 bits here, which holds every value), and for pages whose checksums are
        checked (``verify_checksums``), which cudf does not check."""
        import pyarrow as pa

        tables = [
            dataset.read_partition(p, columns) for file_parts in read.partitions for p in file_parts
        ]
        table = pa.concat_tables(tables, promote_options="permissive")
        for i, field in enumerate(table.schema):
            if pa.types.is_float16(field.type):
                table = table.set_column(i, field.name, table.column(i).cast(pa.float32()))
        with self._cupy.cuda.Stream.null:
            return _cudf_frame(self._cudf.DataFrame.from_arrow(_as_cudf_lists(table)), lists)

    def _decode(
        self, paths: list[str], row_groups: list[list[int]], columns: list[str], lists: set[str]
    ) -> tuple[dict[str, Any], int, bool]:
        """Decode the row groups of ``paths``: ``(columns by name, rows, on the default
        stream)``. pylibcudf's reader where it works (no list columns): on the loader's
        stream, without cudf's DataFrame layer; else ``cudf.read_parquet``."""
        if self._plc is not None and not lists:
            try:
                decoded = self._decode_with_pylibcudf(paths, row_groups, columns)
                self._plc_worked = True
                return decoded
            except (AttributeError, TypeError, NotImplementedError, ValueError) as err:
                # Before any success: another pylibcudf than this code knows; after one:
                # a column it does not decode (cudf.read_parquet reads this chunk).
                if not self._plc_worked:
                    self._plc = None
                    warnings.warn(
                        f"pylibcudf's parquet reader could not be used here "
                        f"({type(err).__name__}: {err}); reading with cudf.read_parquet instead",
                        PerformanceWarning,
                        stacklevel=2,
                    )
        frame = self._cudf.read_parquet(
            paths,
            columns=columns,
            row_groups=row_groups,
            use_pandas_metadata=False,
            # the files are listed already: no directory discovery, no hive keys
            dataset_kwargs={"partitioning": None},
        )
        return _cudf_frame(frame, lists), len(frame), True

    def _decode_with_pylibcudf(
        self, paths: list[str], row_groups: list[list[int]], columns: list[str]
    ) -> tuple[dict[str, Any], int, bool]:
        plc = self._plc
        options = (
            plc.io.parquet.ParquetReaderOptions.builder(plc.io.SourceInfo(paths))
            .use_pandas_metadata(False)
            .build()
        )
        # (set_columns is deprecated in cudf 26.10, which has set_column_names)
        set_columns = getattr(options, "set_column_names", None) or options.set_columns
        set_columns(columns)
        options.set_row_groups(row_groups)
        stream = self._plc_stream
        if stream is not None:
            result = plc.io.parquet.read_parquet(options, stream=stream)
        else:
            result = plc.io.parquet.read_parquet(options)
        decoded = result.columns
        frame = {
            name: _PlcColumn(column, self._cupy)
            for name, column in zip(result.column_names(), decoded, strict=True)
        }
        rows = int(decoded[0].size()) if decoded else 0
        return frame, rows, stream is None

    def _read_each_file(
        self, dataset: Dataset, read: ChunkRead, columns: list[str], lists: set[str]
    ) -> tuple[list[dict[str, Any]], bool]:
        """``read`` one file at a time: files that fail together may each read alone (their
        schemas may differ in columns not read), and a file at fault is named."""
        frames, on_default = [], False
        for f, groups, ps in zip(read.files, read.row_groups, read.partitions, strict=True):
            one = ChunkRead([f], [groups], [ps], [0], [])
            (frame,), default = self._read_parquet(dataset, one, columns, lists)
            frames.append(frame)
            on_default = on_default or default
        return frames, on_default


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


def _pieces_by_frame(
    pieces: Sequence[Piece], chunk_plan: ChunkPlan, frames: Sequence[Any]
) -> list[list[tuple[int, int, int]]]:
    """Each frame's pieces as ``(partition, start, stop)`` rows of that frame."""
    if chunk_plan.read is None:
        return [[(int(p), 0, last - first)] for p, first, last in pieces]
    read = chunk_plan.read
    if len(frames) == 1:  # all files in one frame: rows from the read's start
        return [[(p, start, stop) for _, p, start, stop in read.spans]]
    out: list[list[tuple[int, int, int]]] = [[] for _ in frames]
    for f, p, start, stop in read.spans:
        out[f].append((p, start - read.starts[f], stop - read.starts[f]))
    return out
