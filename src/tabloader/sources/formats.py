"""How the readers read a source's partitions: a format object, which they read through
without asking what kind of source they read (as a scan of ``pyarrow.dataset`` reads
through its fragments' format).

Every source decodes any partition to Arrow on the host (`Source.read`), which is how
the CPU reads. A GPU reads through the source's format instead, which picks the read
its partitions want from the GPU's reader (`DeviceReads`):

- `Format`, the default: each piece read as an Arrow table on the host and copied to the
  device once (an in-memory table);
- `ComputedPartitions`: a Dask DataFrame's partitions computed, dask-cudf's staying on
  the device;
- `RowGroups`: parquet files, one partition per row group; a chunk's row groups read by
  the GPU's own parquet reader in one read, each file's bytes its local path or, on
  object storage, the byte ranges of the row groups and columns read
  (`RowGroups.open_row_groups`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, NamedTuple, Protocol, cast

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from tabloader.sources.partitions import ColumnSources, FileColumns

__all__ = [
    "ComputedPartitions",
    "DeviceChunk",
    "DeviceReads",
    "Format",
    "Piece",
    "RowGroupFiles",
    "RowGroups",
]

Piece = tuple[int, int, int]
"""``(partition, first row, stop row)``: a slice of one partition."""


class DeviceChunk(NamedTuple):
    """A chunk a GPU's reader reads: ``pieces`` of ``dataset`` (a
    `tabloader.partitioned.Partitioned`) as its format planned them (``plan``), the
    ``columns`` read, ``lists`` among them read as lists."""

    dataset: Any
    pieces: Sequence[Piece]
    plan: Any
    columns: list[str]
    lists: set[str]


class DeviceReads(Protocol):
    """The reads a GPU's reader makes (`tabloader.decode.gpu.DeviceReader`), of which a
    format picks its own: how a chunk is planned, and how it is read (each read returns
    the chunk's frames and whether they were made on the default stream)."""

    def plan_pieces(self, pieces: Sequence[Piece]) -> Any:
        """One frame per piece, holding exactly its rows."""
        ...

    def plan_row_groups(self, pieces: Sequence[Piece], files: RowGroups) -> Any:
        """One read of the row groups the pieces touch, each once."""
        ...

    def read_tables(self, chunk: DeviceChunk) -> Any:
        """Each piece read as Arrow on the host and copied in."""
        ...

    def read_computed(self, chunk: DeviceChunk, compute: Computation) -> Any:
        """Each piece computed (``compute``, with the reader's scheduler options)."""
        ...

    def read_row_groups(self, chunk: DeviceChunk, files: RowGroups) -> Any:
        """A chunk's row groups (its plan: from `plan_row_groups`) read from the files."""
        ...


Computation = Callable[[Sequence[Piece], Sequence[str], Mapping[str, Any] | None], list[Any]]
"""Each piece's rows computed: ``compute(pieces, columns, scheduler options)``."""


class Format:
    """A source read as Arrow tables on the host alone (an in-memory table): a GPU reads
    each piece so and copies it in."""

    def plan_on_device(self, reads: DeviceReads, pieces: Sequence[Piece]) -> Any:
        """How a GPU reads the chunk of ``pieces`` (planned a chunk ahead)."""
        return reads.plan_pieces(pieces)

    def read_on_device(self, reads: DeviceReads, chunk: DeviceChunk) -> Any:
        """``chunk`` read on a GPU, as its plan (`plan_on_device`) says: its frames, and
        whether they were made on the default stream."""
        return reads.read_tables(chunk)


class ComputedPartitions(Format):
    """A Dask DataFrame's partitions, each piece's rows computed when read (``compute``):
    dask-cudf's stay on the device, pandas' are copied in."""

    def __init__(self, compute: Computation) -> None:
        self.compute = compute

    def read_on_device(self, reads: DeviceReads, chunk: DeviceChunk) -> Any:
        return reads.read_computed(chunk, self.compute)


class RowGroupFiles(Protocol):
    """What a source of parquet files tells its `RowGroups`
    (`tabloader.sources.parquet.ParquetSource`)."""

    files: list[str]
    rows: NDArray[Any]
    part_file: NDArray[Any]
    part_row_group: NDArray[Any]
    columns: ColumnSources
    remote: Any

    def fetch_row_groups(
        self, file_index: int, row_groups: list[int], columns: list[str]
    ) -> Any: ...


class RowGroups(Format):
    """Parquet files, one partition per row group: a GPU reads a chunk's row groups with
    its own parquet reader, in one read."""

    def __init__(self, files: RowGroupFiles) -> None:
        self._files = files

    @property
    def layout(self) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]]:
        """Each partition's file index, row group and rows."""
        files = self._files
        return files.part_file, files.part_row_group, files.rows

    def file_columns(self, file_index: int, columns: Sequence[str]) -> FileColumns:
        """How to get ``columns`` from file ``file_index``: the names to read, renames and
        constant columns (see `tabloader.sources.partitions.FileColumns`)."""
        return self._files.columns.file_columns(file_index, columns)

    def local_paths(self, files: Sequence[int]) -> list[str] | None:
        """The local paths of these files (by index), or None for object storage."""
        if self._files.remote is not None:
            return None
        return [self._files.files[f] for f in files]

    def open_row_groups(
        self, file_index: int, row_groups: Sequence[int], columns: Sequence[str]
    ) -> IO[bytes]:
        """A binary file from which a parquet reader reads these row groups (on object
        storage, only the footer and these row groups' byte ranges of ``columns``)."""
        if self._files.remote is None:
            return open(self._files.files[file_index], "rb")
        handle = self._files.fetch_row_groups(file_index, list(row_groups), list(columns))
        return cast(IO[bytes], handle)

    def plan_on_device(self, reads: DeviceReads, pieces: Sequence[Piece]) -> Any:
        return reads.plan_row_groups(pieces, self)

    def read_on_device(self, reads: DeviceReads, chunk: DeviceChunk) -> Any:
        return reads.read_row_groups(chunk, self)
