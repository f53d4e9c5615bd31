"""A source's rows seen as partitions: the queries every reader of a dataset asks.

`Partitioned` answers them from the source (`tabloader.sources.base.Source`): rows per
partition, the schema, files, versions and partition keys, what the footers say, the
reads a backend makes, and the format a GPU reads through.
[`Dataset`][tabloader.Dataset] is one, with where its rows come from besides;
`tabloader.embeddings` and `tabloader.decode` read a dataset through these queries
alone, which is why they sit below the dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from tabloader.errors import InvalidArgumentError, ReadError, SchemaMismatchError
from tabloader.sources.base import Source
from tabloader.sources.formats import Format, RowGroups
from tabloader.sources.partitions import Filters

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["Partitioned"]


class Partitioned:
    """The rows of a source, split into partitions: what they are, what their footers
    say, and the reads a backend makes, all answered by the source
    (`tabloader.sources.base.Source`). [`Dataset`][tabloader.Dataset] adds where the rows
    come from (its constructors), listing them again (``refresh``) and files that go
    away (``on_missing``)."""

    _source: Source

    @property
    def source(self) -> Source:
        """Where the rows come from (see `tabloader.sources.base.Source`)."""
        return self._source

    @property
    def num_rows(self) -> int:
        """Total number of rows."""
        return int(self._source.rows.sum())

    def __len__(self) -> int:
        return self.num_rows

    @property
    def num_partitions(self) -> int:
        """Number of partitions (row groups with at least one row)."""
        return len(self._source.rows)

    @property
    def partition_rows(self) -> NDArray[np.int64]:
        """Row count of every partition, in dataset order (a read-only int64 array)."""
        rows: NDArray[np.int64] = self._source.rows.view()
        rows.flags.writeable = False
        return rows

    @property
    def schema(self) -> pa.Schema:
        """Arrow schema of the first file (or of the table)."""
        return self._source.schemas[0]

    @property
    def files(self) -> list[str]:
        """The parquet files, in load order (empty for in-memory sources)."""
        return list(self._source.files)

    @property
    def version(self) -> int | None:
        """The Delta version or Iceberg snapshot id loaded (None for other sources)."""
        return self._source.version

    @property
    def table_format(self) -> str | None:
        """``"delta"`` or ``"iceberg"`` for a table, None for other sources."""
        return self._source.table_format

    @property
    def partition_keys(self) -> dict[str, pa.DataType]:
        """Partition keys and their Arrow types: the ``key=value`` directories of a
        directory or glob (types inferred from the values), or a table's partition
        columns (types from its schema). Usable in ``filters`` and as loader columns."""
        columns = self._source.columns
        return {} if columns is None else dict(columns.keys)

    @property
    def verify_checksums(self) -> bool:
        """Whether pages are checked against their checksums when read."""
        return self._source.verify_checksums

    @property
    def filters(self) -> Filters | None:
        """The filters applied, in disjunctive normal form (None: no filter)."""
        return self._source.filters

    @property
    def files_skipped(self) -> int:
        """Files the filters skipped at the last listing."""
        return self._source.files_skipped

    def partition_values(self, partition: int) -> dict[str, Any]:
        """The partition keys' values (None: null) for every row of ``partition``.

        Examples:
            >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os, tabloader
            >>> root = tempfile.mkdtemp()
            >>> os.makedirs(f"{root}/day=7")
            >>> pq.write_table(pa.table({"x": [1.0, 2.0]}), f"{root}/day=7/part-0.parquet")
            >>> tabloader.Dataset(root).partition_values(0)
            {'day': 7}
        """
        return self._source.partition_values(partition)

    def file_identities(self) -> list[dict[str, Any]]:
        """What each file was when it was listed, as JSON-ready dicts: its path, size
        and footer digest, and what a rewrite cannot keep: a local file's modification
        and change times and inode, an object's ETag, version id or generation. A file
        rewritten in place has another identity, even with its size, its modification
        time and its footer (byte for byte) kept. Empty for in-memory sources.

        Examples:
            >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os, tabloader
            >>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
            >>> pq.write_table(pa.table({"a": [1, 2]}), path)
            >>> sorted(tabloader.Dataset(path).file_identities()[0])
            ['ctime_ns', 'footer', 'inode', 'mtime_ns', 'path', 'size']
        """
        return self._source.identities()

    def content_digest(self) -> str | None:
        """For an in-memory table or a Dask DataFrame, a digest of its rows (a hash of
        the table's values; Dask's own token of the frame), None where dask cannot give
        one; None for a dataset of files, which `file_identities` describes."""
        return self._source.content_digest()

    def changed_files(self) -> list[str]:
        """The files deleted or rewritten since they were listed (one ``stat`` or metadata
        request each)."""
        source = self._source
        return [source.display(f) for i, f in enumerate(source.files) if source.changed(i)]

    def describe_partition(self, index: int) -> str:
        """Where partition ``index`` lives, for messages: ``"train/a.parquet (row group 3)"``."""
        return self._source.describe(index)

    def no_rows_message(self) -> str:
        """Why the dataset holds no row at all, naming its files, for the error that says so.

        Examples:
            >>> import pyarrow as pa, tabloader
            >>> tabloader.Dataset(pa.table({"x": pa.array([], pa.int64())})).no_rows_message()
            'the dataset has no rows: the table it was given is empty'
        """
        files = [self._source.display(f) for f in self._source.files]
        if not files:
            return "the dataset has no rows: the table it was given is empty"
        if len(files) == 1:
            return (
                f"the dataset has no rows: its one file, {files[0]}, holds 0 rows. Write rows "
                "to it, or point the loader at files that hold some"
            )
        shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        return (
            f"the dataset has no rows: each of its {len(files)} files ({shown}) holds 0 rows. "
            "Write rows to them, or point the loader at files that hold some"
        )

    def read_partition(self, index: int, columns: Sequence[str]) -> pa.Table:
        """Read the given columns of one partition into an Arrow table.

        Errors from the storage layer or the parquet decoder are raised as
        [`ReadError`][tabloader.errors.ReadError] naming the file and row group.
        """
        try:
            return self._source.read(index, list(columns))
        except (ReadError, SchemaMismatchError):
            raise
        except Exception as err:
            raise self.read_failure(index, err) from err

    def read_failure(self, index: int, error: BaseException, where: str = "") -> ReadError:
        """The error for partition ``index`` failing to read (``where``: its description):
        a file deleted or rewritten since it was listed is said to be so, not damaged."""
        return self._source.read_failure(index, error, where)

    @property
    def format(self) -> Format:
        """How the readers read the partitions besides as Arrow tables: the format object
        a GPU reads through (see `tabloader.sources.formats`)."""
        return self._source.format

    def open_row_groups(
        self, file_index: int, row_groups: Sequence[int], columns: Sequence[str]
    ) -> IO[bytes]:
        """A binary file-like object from which a parquet reader reads these row groups.

        For object storage, only the footer and the byte ranges of ``columns`` in
        ``row_groups`` are fetched; other bytes read as zeros, so give the reader the
        same row groups and columns. For local files it is the open file. Close it.

        Examples:
            >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os, tabloader
            >>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
            >>> pq.write_table(pa.table({"a": range(6), "b": range(6)}), path, row_group_size=3)
            >>> with tabloader.Dataset(path).open_row_groups(0, [1], ["b"]) as f:
            ...     pq.ParquetFile(f).read_row_groups([1], columns=["b"])["b"].to_pylist()
            [3, 4, 5]
        """
        files = self.format
        if not isinstance(files, RowGroups):
            raise InvalidArgumentError(
                f"open_row_groups reads parquet files; this dataset is a {self._source.kind} source"
            )
        return files.open_row_groups(file_index, row_groups, columns)

    def column_types(self, columns: Sequence[str]) -> dict[str, pa.DataType]:
        """Arrow type of each column, checked to be present and of one type in every file
        (widths that differ are widened: see `tabloader.columns.common_type`).

        Raises:
            ColumnNotFoundError: a column is missing from some file.
            SchemaMismatchError: files store a column with conflicting types (numbers and
                strings, lists and scalars, integers and floating point).
        """
        return self._source.column_types(columns)

    def stored_types(self, column: str) -> list[pa.DataType]:
        """The types the files store ``column`` as, each once, where their schemas name it
        (`column_types` gives the type they widen to together)."""
        found: list[pa.DataType] = []
        for schema in self._source.schemas:
            index = schema.get_field_index(column)
            if index >= 0 and schema.field(index).type not in found:
                found.append(schema.field(index).type)
        return found

    def check_worker_processes(self, start_method: Any = None) -> None:
        """Refuse worker processes that cannot read this dataset (before they start):
        a Dask DataFrame with a dask.distributed Client cannot be computed in forked
        processes. ``start_method``: a multiprocessing start method or context."""
        self._source.check_worker_processes(start_method)

    def null_partitions(self, column: str) -> NDArray[np.int8]:
        """Per partition: 1 if the footer says the column holds nulls, 0 if none, -1 unknown."""
        return self._source.null_flags(column)

    def value_ranges(self, column: str) -> list[tuple[Any, Any] | None]:
        """Per partition: the smallest and largest value of ``column`` (of its values, for
        a list column) as the footers' statistics say, or None where they do not."""
        return self._source.value_ranges(column)
