"""Reading on a GPU: a chunk's pieces decoded by pylibcudf or cudf into GPU memory.

`plan_read` works out, on the host and a chunk ahead, the one read of a chunk's row
groups (each file once, its row groups ascending) and where its pieces lie in what is
read (`ChunkPlan`; `delivery_rows` turns that into the rows a chunk delivers, in order).
`DeviceReader` makes the read: pylibcudf's parquet reader on the loader's reader stream
where it works, ``cudf.read_parquet`` on the default stream otherwise (list columns, an
older pylibcudf); files on object storage as sparse local copies of the byte ranges
fetched; one file at a time where files store the columns under other names or fail
together; on the host with pyarrow where cudf cannot decode a column or where page
checksums are checked. A Dask DataFrame's partitions are computed by threads on the
loader's GPU (`tabloader.decode.gpu_dask`), an in-memory table copied in once. The
columns read become cupy arrays as on the host (`tabloader.decode.gpu_columns`).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tabloader._deps import optional as _optional_import
from tabloader.casting import check_block
from tabloader.decode.gpu_columns import (
    PlcColumn,
    Undecodable,
    as_cudf_lists,
    complete_columns,
    cudf_frame,
    frame_columns,
)
from tabloader.decode.gpu_dask import dask_compute_options
from tabloader.errors import (
    InvalidArgumentError,
    PerformanceWarning,
    ReadError,
    ValueRangeError,
    is_out_of_memory,
)
from tabloader.sources.formats import DeviceChunk
from tabloader.sources.partitions import same_reads

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from tabloader.batches import Block
    from tabloader.partitioned import Partitioned
    from tabloader.plan import EpochPlan
    from tabloader.sources.base import Piece
    from tabloader.sources.formats import Computation, RowGroups

__all__ = [
    "READER_ENV",
    "ChunkPlan",
    "ChunkRead",
    "DeviceReader",
    "delivery_rows",
    "pieces_by_frame",
    "plan_read",
    "reader_setting",
]

READER_ENV = "TABLOADER_GPU_READER"
"""``cudf`` makes the GPU backend decode with ``cudf.read_parquet`` even where pylibcudf's
reader works (to compare the two); unset, pylibcudf's is used where it can be."""


def reader_setting() -> str:
    """``$TABLOADER_GPU_READER``, checked: ``""``, ``"cudf"`` or ``"pylibcudf"``."""
    reader = os.environ.get(READER_ENV, "").strip().lower()
    if reader not in ("", "cudf", "pylibcudf"):
        raise InvalidArgumentError(f"{READER_ENV}={reader!r} must be 'cudf' or 'pylibcudf'")
    return reader


# -- planning a chunk's read (pure, tested on the CPU) -------------------------------------


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


# -- files on object storage, handed to cudf as local sparse copies ---------------------


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


def _rmm_stream(stream: Any) -> Any:
    """``stream`` (cupy's) as the stream object pylibcudf takes, or None where rmm cannot
    wrap it (pylibcudf then decodes on the default stream)."""
    try:
        from rmm.pylibrmm.stream import Stream

        return Stream(obj=stream)
    except Exception:
        return None


# -- the reads ---------------------------------------------------------------------------


class DeviceReader:
    """The reads of a GPU loader (or of one query on a GPU), on CUDA device ``device``.

    Args:
        cudf, cupy: The modules (`tabloader._deps.import_gpu`).
        device: The CUDA device index.
        stream: The stream pylibcudf decodes on (the loader's reader stream); None
            decodes on the default stream.
        pylibcudf: Whether pylibcudf's reader may be used where it works.
    """

    def __init__(
        self, cudf: Any, cupy: Any, device: int, *, stream: Any = None, pylibcudf: bool = True
    ) -> None:
        self._cudf, self._cupy, self.device = cudf, cupy, device
        self._plc: Any = _optional_import("pylibcudf") if pylibcudf else None
        usable = self._plc is not None and stream is not None
        self._plc_stream = _rmm_stream(stream) if usable else None
        self._plc_worked = False

    @property
    def name(self) -> str:
        """Which parquet reader decodes: ``"pylibcudf"`` (on the loader's stream) or
        ``"cudf"`` (``cudf.read_parquet``, on the default stream)."""
        return "cudf" if self._plc is None else "pylibcudf"

    def plan_chunk(self, dataset: Partitioned, plan: EpochPlan, chunk: int) -> ChunkPlan:
        """The read of chunk ``chunk``, and where its pieces lie in it (host work done a
        chunk ahead in a thread of its own), as the dataset's format plans it."""
        chunk_plan: ChunkPlan = dataset.format.plan_on_device(self, plan.pieces(chunk))
        return chunk_plan

    def plan_pieces(self, pieces: Sequence[Piece]) -> ChunkPlan:
        """One frame per piece, holding exactly its rows."""
        frame_rows = [last - first for _, first, last in pieces]
        spans = [(i, int(pieces[i][0]), 0, n) for i, n in enumerate(frame_rows)]
        return ChunkPlan(None, spans, frame_rows, sum(frame_rows))

    def plan_row_groups(self, pieces: Sequence[Piece], files: RowGroups) -> ChunkPlan:
        """One read of the row groups the pieces touch, each once (`plan_read`)."""
        layout = files.layout
        read = plan_read(pieces, *layout)
        frame_rows = [sum(int(layout[2][p]) for p in parts) for parts in read.partitions]
        spans = [
            (f, p, start - read.starts[f], stop - read.starts[f])
            for f, p, start, stop in read.spans
        ]
        return ChunkPlan(read, spans, frame_rows, sum(b - a for _, _, a, b in spans))

    def read_columns(
        self,
        dataset: Partitioned,
        pieces: Sequence[Piece],
        chunk_plan: ChunkPlan,
        blocks: Sequence[Block],
        fill_null: Mapping[str, float],
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
        """A chunk's frames as read, their columns as device arrays (list columns as
        `Ragged`, vectors as ``[rows, k]``, nulls filled or refused) frame after frame,
        and whether they were made on the default stream (else on the reader's): the
        conversions run where the decode ran, after it, in order."""
        columns = [c for b in blocks for c in b.columns]
        lists = {c for b in blocks if b.ragged for c in b.columns}
        vectors = {c: k for b in blocks for c, k in b.vectors}  # read as lists by cudf
        chunk = DeviceChunk(dataset, pieces, chunk_plan, columns, lists | set(vectors))
        frames, on_default = dataset.format.read_on_device(self, chunk)
        cupy = self._cupy
        with cupy.cuda.Stream.null if on_default else contextlib.nullcontext():
            converted = []
            for frame, rows in zip(
                frames, pieces_by_frame(pieces, chunk_plan, frames), strict=True
            ):
                arrays = frame_columns(
                    frame, columns, lists, fill_null, rows, dataset, cupy, vectors
                )
                # values that would not fit their dtype: an error, in the rows delivered,
                # naming the row group as the host's decoder does. The frame is checked
                # whole first (one wait for the device), its pieces only when it fails.
                for block in blocks:
                    try:
                        check_block(arrays, block)
                    except ValueRangeError:
                        for partition, start, stop in rows:
                            piece = {c: arrays[c][start:stop] for c in block.columns}
                            where = dataset.describe_partition(partition)
                            check_block(piece, block, where=where)
                converted.append(arrays)
        return frames, converted, on_default

    def read_tables(self, chunk: DeviceChunk) -> tuple[list[dict[str, Any]], bool]:
        """Each piece read as Arrow on the host and copied to the device: an in-memory
        table lives on the host, and one copy is unavoidable."""
        cudf, read = self._cudf, chunk.dataset.read_partition
        frames = [
            cudf.DataFrame.from_arrow(
                as_cudf_lists(read(p, chunk.columns).slice(first, last - first))
            )
            for p, first, last in chunk.pieces
        ]
        return [cudf_frame(frame, chunk.lists) for frame in frames], True

    def read_computed(
        self, chunk: DeviceChunk, compute: Computation
    ) -> tuple[list[dict[str, Any]], bool]:
        """Each piece computed by dask's threads on this GPU, not GPU 0: dask-cudf
        partitions stay on the device, pandas ones are copied in."""
        cudf, options = self._cudf, dask_compute_options(self.device, self._cupy)
        partitions = compute(chunk.pieces, chunk.columns, options)
        frames = [
            frame if type(frame).__module__.startswith("cudf") else cudf.from_pandas(frame)
            for frame in partitions
        ]
        return [cudf_frame(frame, chunk.lists) for frame in frames], True

    def read_row_groups(
        self, chunk: DeviceChunk, files: RowGroups
    ) -> tuple[list[dict[str, Any]], bool]:
        """A chunk's row groups (its plan, from `plan_row_groups`) as one frame, or one
        per file (see `_read_files`); whether they were made on the default stream."""
        assert chunk.plan.read is not None
        return self._read_files(chunk, files, chunk.plan.read)

    def _read_files(
        self, chunk: DeviceChunk, files: RowGroups, read: ChunkRead
    ) -> tuple[list[dict[str, Any]], bool]:
        """``read``'s row groups as one frame, or one per file (see below)."""
        dataset, columns, lists = chunk.dataset, chunk.columns, chunk.lists
        parts = [p for file_parts in read.partitions for p in file_parts]
        where = dataset.describe_partition(parts[0])
        if len(parts) > 1:
            where += f" or one of {len(parts) - 1} other row group(s)"
        if dataset.verify_checksums:  # cudf's reader does not check page checksums
            return [self._decode_on_host(dataset, read, columns, lists)], True
        # Partition keys and renamed or added table columns: what each file stores.
        how = [files.file_columns(f, columns) for f in read.files]
        if len(how) > 1 and not same_reads(how):
            return self._read_each_file(chunk, files, read)
        stored = list(how[0].read)
        expected = int(sum(dataset.partition_rows[p] for p in parts))
        try:
            with contextlib.ExitStack() as opened:
                paths = files.local_paths(read.files)
                if paths is None:
                    # Only the footer and the byte ranges of these row groups and columns
                    # cross the network (retried like the CPU's reads); cudf reads them
                    # from sparse local copies.
                    handles = [
                        opened.enter_context(files.open_row_groups(f, groups, stored))
                        for f, groups in zip(read.files, read.row_groups, strict=True)
                    ]
                    paths = opened.enter_context(_local_copies(handles))
                frame, rows, on_default = self._decode(paths, read.row_groups, stored, lists)
        except Undecodable:  # decoded by pyarrow: renamed and completed as on the CPU
            return [self._decode_on_host(dataset, read, columns, lists)], True
        except ReadError:
            raise  # a network failure, already named with its remedy
        except Exception as err:
            if is_out_of_memory(err):
                raise
            if len(read.files) > 1:
                return self._read_each_file(chunk, files, read)
            raise dataset.read_failure(parts[0], err, where) from err
        if rows != expected:
            if len(read.files) > 1:
                return self._read_each_file(chunk, files, read)
            raise ReadError(
                f"cudf read {rows} rows from {where}, but the footers listed {expected}: "
                "the file changed after the dataset was created. Create the Dataset again"
            )
        # Partition keys, and table columns renamed or added after a file was written:
        # deliver exactly the requested columns, keys typed as on the CPU.
        file_rows = [int(sum(dataset.partition_rows[p] for p in ps)) for ps in read.partitions]
        return [complete_columns(frame, how, file_rows, columns, where)], on_default

    def _decode_on_host(
        self, dataset: Partitioned, read: ChunkRead, columns: list[str], lists: set[str]
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
            return cudf_frame(self._cudf.DataFrame.from_arrow(as_cudf_lists(table)), lists)

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
        return cudf_frame(frame, lists), len(frame), True

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
            name: PlcColumn(column, self._cupy)
            for name, column in zip(result.column_names(), decoded, strict=True)
        }
        rows = int(decoded[0].size()) if decoded else 0
        return frame, rows, stream is None

    def _read_each_file(
        self, chunk: DeviceChunk, files: RowGroups, read: ChunkRead
    ) -> tuple[list[dict[str, Any]], bool]:
        """``read`` one file at a time: files that fail together may each read alone (their
        schemas may differ in columns not read), and a file at fault is named."""
        frames, on_default = [], False
        for f, groups, ps in zip(read.files, read.row_groups, read.partitions, strict=True):
            one = ChunkRead([f], [groups], [ps], [0], [])
            (frame,), default = self._read_files(chunk, files, one)
            frames.append(frame)
            on_default = on_default or default
        return frames, on_default


def pieces_by_frame(
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
