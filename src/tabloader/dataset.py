"""Sources to partitions: which rows exist, where they live, read from parquet footers alone.

A [`Dataset`][tabloader.Dataset] turns what the user points at (paths, globs, directories, fsspec
URLs, an in-memory table, a Dask DataFrame) into an ordered list of *partitions*: for parquet,
one partition per row group. Each partition knows its row count without any data being
read; the loader plans an epoch from these counts and reads only the partitions and
columns it needs.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import io
import multiprocessing
import os
import sys
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any, Literal, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tabloader.casting import footer_leaf, footer_range
from tabloader.columns import closest_name, common_type
from tabloader.errors import (
    ColumnNotFoundError,
    InvalidArgumentError,
    InvalidFileError,
    ReadError,
    SchemaMismatchError,
    SourceNotFoundError,
    TabloaderError,
)
from tabloader.options import flag, int_at_least, is_number
from tabloader.sources.partitions import (
    ColumnSources,
    FileColumns,
    Filters,
    TableLog,
    check_filters,
    describe_filters,
    hive_values,
    infer_key_types,
    keep_file,
    normalize_filters,
    parse_key_values,
)
from tabloader.sources.remote import (
    RangeFile,
    RemoteStore,
    access_denied_error,
    column_chunk_ranges,
    footer_metadata,
    merge_ranges,
)
from tabloader.splits import refuse_mixed_splits

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["Dataset"]

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
DEFAULT_ROWS_PER_PARTITION = 131_072
_FOOTER_THREADS = 16
SMALL_ROW_GROUP_ROWS = 16_384
"""Row groups with fewer rows than this (the median, in a dataset of 16 or more) load
slowly: reading pays a fixed cost per row group. The loader warns and ``tabloader
inspect`` reports with this one threshold; aim for 64k to 1M rows per row group."""
LARGE_ROW_GROUP_BYTES = 1 << 30
"""Above this many decoded bytes, one row group strains the chunk buffer (a chunk holds at
least one row group)."""


def small_row_groups(partition_rows: Sequence[int] | NDArray[np.int64]) -> float | None:
    """The median rows per row group if they are too small to load fast, else None.

    Too small: below `SMALL_ROW_GROUP_ROWS`, in a dataset of 16 row groups or more
    (fewer load in no time whatever their size).

    Examples:
        >>> small_row_groups([1_000] * 20), small_row_groups([1_000] * 3)
        (1000.0, None)
    """
    if len(partition_rows) < 16:
        return None
    median = float(np.median(partition_rows))
    return median if median < SMALL_ROW_GROUP_ROWS else None


class Dataset:
    """The rows a loader draws from, split into partitions (parquet row groups).

    Constructing a dataset reads parquet footers only: the file list, row groups, row
    counts and schemas. No column data is read until a loader iterates.

    Args: What to read
        source: What to load, one of:

            - a path to a parquet file, a directory (searched recursively for
              ``*.parquet``, ``*.parq`` and ``*.pq``), or a glob such as
              ``"data/train/*.parquet"``; directories and globs skip names that start
              with ``_`` or ``.`` (``_SUCCESS``, ``_metadata``, checksum files); a path
              that exists is itself, even with glob characters (``"a[1].parquet"``);
            - an fsspec URL of any of those (``"s3://bucket/train/*.parquet"``,
              ``"memory://..."``); install the fsspec implementation for the protocol;
            - a list of any of the above (files are listed in sorted order per entry,
              entries in the order given, duplicates removed);
            - a ``pyarrow.Table``, ``pandas.DataFrame`` or polars ``DataFrame`` or
              ``LazyFrame`` (collected; polars hands its Arrow memory over without a copy
              where it can), split into partitions of ``rows_per_partition`` rows;
            - a Dask DataFrame (dask or dask-cudf), one partition per Dask partition.
              Row counts are computed once at construction.
        engine: Only ``"parquet"``; accepted for NVTabular compatibility.
        storage_options: Passed to the fsspec filesystem for URLs (credentials,
            endpoints); see docs/remote.md for S3, GCS and Azure. Refused for local
            paths and tables, which have no filesystem to pass them to.
        rows_per_partition: Partition size for in-memory tables.

    Args: Partitions (see docs/tables.md)
        filters: Select whole files by partition key, in pyarrow's form:
            ``[("day", "<", 23)]`` (all terms must hold) or ``[[...], [...]]`` (any group
            must hold); operators ``=``, ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``,
            ``in``, ``not in``. The keys are the ``key=value`` directories below a
            directory or glob (their types inferred: integer, float, else string), or a
            Delta or Iceberg table's partition columns. Files that fail are skipped before
            anything of them is read, so ``len()`` is exact. A filter on any other column
            is refused: rows are never dropped inside a file. Partition keys can also be
            named in a loader's ``cats``/``conts``/``labels``.

    Args: A directory that changes (see docs/data-layout.md, "A dataset that grows")
        refresh: List the directories and globs again at the start of every epoch
            (when a loader's ``iter()`` starts it): new complete files join, deleted
            ones leave. Files whose footer cannot be read yet (still being written) are
            skipped with one warning and tried again next epoch. Under an initialised
            ``torch.distributed`` process group, rank 0 lists and every rank uses its
            list. Default False: the files are listed once, here.
        on_missing: ``"raise"`` (default): a file deleted or truncated during an epoch
            fails the epoch with an error naming it. ``"skip"``: its remaining rows are
            skipped, replaced by repeats of rows read just before them so every rank
            still gets the same number of batches, counted in
            [`rows_skipped`][tabloader.Dataset.rows_skipped] and warned about once per file.

    Args: Object storage (URLs only; see docs/remote.md)
        max_concurrent_reads: Requests in flight at most, default 16. Row groups are
            fetched this many ahead of the one being decoded, which hides the first-byte
            latency of object stores; raise it for high-latency links, lower it to hold
            fewer fetched row groups in memory. For s3:// it also raises s3fs's
            connection pool (``config_kwargs={"max_pool_connections": ...}``) unless
            ``storage_options`` sets it.
        retry_seconds: How long a failing request is retried (exponential backoff with
            jitter) before the epoch fails with a
            [`ReadError`][tabloader.errors.ReadError], default 60. Missing objects and
            denied access are not retried.
        request_timeout: Seconds one attempt of a request may take, default 30.

    Examples:
        >>> import pyarrow as pa, tabloader
        >>> ds = tabloader.Dataset(pa.table({"x": range(10)}), rows_per_partition=4)
        >>> len(ds), ds.num_partitions, ds.partition_rows.tolist()
        (10, 3, [4, 4, 2])
    """

    def __init__(
        self,
        source: Any,
        *,
        engine: Literal["parquet"] = "parquet",
        storage_options: dict[str, Any] | None = None,
        rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION,
        max_concurrent_reads: int = 16,
        retry_seconds: float = 60.0,
        request_timeout: float = 30.0,
        refresh: bool = False,
        on_missing: Literal["raise", "skip"] = "raise",
        filters: Any = None,
    ) -> None:
        if engine != "parquet":
            raise InvalidArgumentError(
                f"engine must be 'parquet', got {engine!r}: convert other formats to parquet first"
            )
        if not isinstance(rows_per_partition, (int, np.integer)) or rows_per_partition < 1:
            raise InvalidArgumentError(
                f"rows_per_partition must be a positive integer, got {rows_per_partition!r}"
            )
        max_concurrent_reads = int_at_least(max_concurrent_reads, 1, "max_concurrent_reads")
        if not is_number(retry_seconds) or not 0 <= retry_seconds < float("inf"):
            raise InvalidArgumentError(
                f"retry_seconds must be a number of seconds >= 0, got {retry_seconds!r}"
            )
        if not is_number(request_timeout) or not 0 < request_timeout < float("inf"):
            raise InvalidArgumentError(
                f"request_timeout must be a positive number of seconds, got {request_timeout!r}"
            )
        self.refreshes = flag(refresh, "refresh")
        if on_missing not in ("raise", "skip"):
            raise InvalidArgumentError(f"on_missing must be 'raise' or 'skip', got {on_missing!r}")
        self.on_missing = on_missing
        self._rows_skipped = 0
        self._missing_warned: set[str] = set()
        self._listed_epoch: int | None = None
        checked_filters = normalize_filters(filters)
        self._source: _Source
        if storage_options and not _names_urls(source):
            raise InvalidArgumentError(
                f"storage_options are for URLs (s3://, gs://, ...), and this dataset is "
                f"{_describe_source(source)}: leave storage_options out, or give URLs"
            )
        if isinstance(source, pa.Table):
            self._source = _TableSource(source, int(rows_per_partition))
        elif _is_polars_frame(source):
            self._source = _TableSource(_polars_to_arrow(source), int(rows_per_partition))
        elif isinstance(source, TableLog):  # Dataset.from_delta, Dataset.from_iceberg
            from tabloader.sources.snapshot import SnapshotSource

            store = None
            if source.url is not None:
                store = RemoteStore(
                    source.url,
                    source.storage_options,
                    max_concurrent_reads=max_concurrent_reads,
                    retry_seconds=float(retry_seconds),
                    request_timeout=float(request_timeout),
                )
            self._source = SnapshotSource(source, store, filters=checked_filters)
        elif _is_pandas_frame(source):
            self._source = _TableSource(
                pa.Table.from_pandas(source, preserve_index=False), int(rows_per_partition)
            )
        elif _is_dask_frame(source):
            self._source = _DaskSource(source)
        else:
            specs = _as_path_list(source)
            remote = None
            urls = [s for s in specs if _is_url(s)]
            if urls:
                if len(urls) != len(specs):
                    raise InvalidArgumentError(
                        "mixing local paths and URLs in one dataset is not supported; "
                        "use file:// URLs for the local ones"
                    )
                protocols = {_protocol(u) for u in urls}
                if len(protocols) > 1:
                    raise InvalidArgumentError(
                        f"all URLs of one dataset must use the same protocol, got "
                        f"{sorted(protocols)}"
                    )
                if storage_options is not None and not isinstance(storage_options, dict):
                    raise InvalidArgumentError(
                        f"storage_options must be a dict, got {type(storage_options).__name__}"
                    )
                remote = RemoteStore(
                    urls[0],
                    storage_options or {},
                    max_concurrent_reads=max_concurrent_reads,
                    retry_seconds=float(retry_seconds),
                    request_timeout=float(request_timeout),
                )
            self._source = _ParquetSource(
                specs, remote, skip_unreadable=self.refreshes, filters=checked_filters
            )
        if (self.refreshes or on_missing == "skip") and not isinstance(
            self._source, _ParquetSource
        ):
            raise InvalidArgumentError(
                "refresh=True and on_missing='skip' apply to parquet files (paths, "
                f"directories, globs, URLs), not to a {type(self._source).__name__.strip('_')}"
            )
        if checked_filters is not None and not isinstance(self._source, _ParquetSource):
            raise InvalidArgumentError(
                "filters select parquet files by partition key; an in-memory table or a Dask "
                "DataFrame has no partition keys: filter it before passing it"
            )

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

    @classmethod
    def from_delta(
        cls,
        uri: str | os.PathLike[str],
        *,
        version: int | None = None,
        storage_options: dict[str, Any] | None = None,
        filters: Any = None,
        refresh: bool = False,
    ) -> Dataset:
        """The rows of a Delta Lake table: exactly the files active in one version.

        The log is read with the ``deltalake`` package (``pip install
        'tabloader[delta]'``); row counts come from its statistics, checked against the
        footers. Refused at once, naming the feature: deletion vectors on an active
        file, column mapping, and reader features tabloader does not know.

        Args:
            uri: The table's directory: a local path or a URL such as ``s3://bucket/t``.
            version: Load this version (time travel). Default: the latest.
            storage_options: fsspec options for a URL, as for ``Dataset``; for ``s3://``
                their credentials, endpoint and region also open the log.
            filters: Select files by partition value (see ``Dataset``).
            refresh: Load the latest version again when each epoch starts: appended
                files join, files an overwrite or a compaction removed leave. Under
                torch.distributed, rank 0's version is loaded by every rank.

        Examples:
            >>> import pyarrow as pa, tempfile, tabloader
            >>> from deltalake import write_deltalake
            >>> path = tempfile.mkdtemp()
            >>> write_deltalake(path, pa.table({"day": [1, 2], "x": [0.5, 1.5]}),
            ...                 partition_by=["day"])
            >>> ds = tabloader.Dataset.from_delta(path, filters=[("day", "=", 2)])
            >>> len(ds), ds.version, ds.partition_keys
            (1, 0, {'day': DataType(int64)})
        """
        from tabloader.sources.delta import DeltaLog

        log = DeltaLog(uri, version=version, storage_options=storage_options)
        if flag(refresh, "refresh") and version is not None:
            raise InvalidArgumentError(
                f"version={version} loads one version and refresh=True follows the latest; "
                "pass one of them"
            )
        return cls(log, filters=filters, refresh=refresh)

    @classmethod
    def from_iceberg(
        cls,
        table: Any,
        *,
        snapshot_id: int | None = None,
        filters: Any = None,
        refresh: bool = False,
    ) -> Dataset:
        """The rows of an Apache Iceberg table: the data files a snapshot's scan plans.

        ``table`` is a ``pyiceberg`` ``Table`` (``pip install 'tabloader[iceberg]'``), or
        a ``(catalog, identifier)`` pair. Columns are matched by field id: a column
        renamed since a file was written loads under its current name, and a column
        added since is null in that file (``fill_null`` decides, as for any null).
        Delete files (merge-on-read deletes) are refused, not applied.

        Args:
            table: The table, or ``(catalog, "namespace.table")``.
            snapshot_id: Load this snapshot (time travel, under the schema it was
                written with). Default: the current snapshot, under the current schema.
            filters: Select files by identity-partition value (see ``Dataset``).
            refresh: Load the current snapshot again when each epoch starts (rank 0's,
                under torch.distributed).

        Examples:
            >>> import pyarrow as pa, tempfile, tabloader
            >>> from pyiceberg.catalog.sql import SqlCatalog
            >>> where = tempfile.mkdtemp()
            >>> catalog = SqlCatalog("demo", uri=f"sqlite:///{where}/catalog.db",
            ...                      warehouse=f"file://{where}")
            >>> catalog.create_namespace("db")
            >>> t = catalog.create_table("db.events", schema=pa.schema([("x", pa.float64())]))
            >>> t.append(pa.table({"x": [0.5, 1.5, 2.5]}))
            >>> len(tabloader.Dataset.from_iceberg((catalog, "db.events")))
            3
        """
        from tabloader.sources.iceberg import IcebergLog

        log = IcebergLog(table, snapshot_id=snapshot_id)
        if flag(refresh, "refresh") and snapshot_id is not None:
            raise InvalidArgumentError(
                f"snapshot_id={snapshot_id} loads one snapshot and refresh=True follows the "
                "current one; pass one of them"
            )
        return cls(log, filters=filters, refresh=refresh)

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
    def filters(self) -> Filters | None:
        """The filters applied, in disjunctive normal form (None: no filter)."""
        source = self._source
        return source.filters if isinstance(source, _ParquetSource) else None

    @property
    def files_skipped(self) -> int:
        """Files the filters skipped at the last listing."""
        source = self._source
        return source.files_skipped if isinstance(source, _ParquetSource) else 0

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
        source = self._source
        if not isinstance(source, _ParquetSource) or not source.columns.keys:
            return {}
        values = source.columns.values[int(source.part_file[partition])]
        return {k: values.get(k) for k in source.columns.keys}

    def file_columns(self, file_index: int, columns: Sequence[str]) -> FileColumns:
        """How to get ``columns`` from parquet file ``file_index``: the names to read
        from the file, renames (Iceberg columns renamed since the file was written), and
        constant columns (partition keys; null where the file predates a column).

        A reader of the files themselves (the GPU backend) reads ``.read`` and appends
        ``.constants``; [`read_partition`][tabloader.Dataset.read_partition] returns them completed
        already.
        """
        source = self._source
        if not isinstance(source, _ParquetSource):
            raise InvalidArgumentError(
                f"file_columns describes parquet files; this dataset is a {type(source).__name__}"
            )
        return source.columns.file_columns(file_index, columns)

    def refresh(self, *, epoch: int | None = None) -> bool:
        """List the files again (``refresh=True`` datasets); returns whether they changed.

        A loader calls this when an epoch starts, with its number, so the listing is
        done once per epoch; call it yourself (with the same ``epoch``, on every rank)
        to know ``len(loader)`` of the next epoch before it starts. Under an initialised
        ``torch.distributed`` group this is a collective: rank 0 lists, every rank
        builds its partitions from rank 0's list.
        """
        source = self._source
        if not self.refreshes or not isinstance(source, _ParquetSource):
            return False
        if epoch is not None and epoch == self._listed_epoch:
            return False
        self._listed_epoch = epoch
        before = (source.listing(), source.rows.copy(), source.identities())
        _list_on_rank_zero(source)
        # A file rewritten in place (same name, same rows) is a change too: its rows are new.
        return (
            before[0] != source.listing()
            or not np.array_equal(before[1], source.rows)
            or before[2] != source.identities()
        )

    def file_identities(self) -> list[dict[str, Any]]:
        """What each file's content was when it was listed, as JSON-ready dicts: its
        path, size and footer digest, and for objects the ETag, version id or generation
        the store reports. The footer holds every row group's and column chunk's sizes,
        offsets and statistics, so a file rewritten with other data has another
        identity, even with its size and modification time kept. Empty for in-memory
        sources.

        Examples:
            >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os, tabloader
            >>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
            >>> pq.write_table(pa.table({"a": [1, 2]}), path)
            >>> sorted(tabloader.Dataset(path).file_identities()[0])
            ['footer', 'path', 'size']
        """
        source = self._source
        return source.identities() if isinstance(source, _ParquetSource) else []

    def changed_files(self) -> list[str]:
        """The files deleted or rewritten since they were listed (one ``stat`` or metadata
        request each)."""
        source = self._source
        if not isinstance(source, _ParquetSource):
            return []
        return [source._display(f) for i, f in enumerate(source.files) if source.changed(i)]

    def describe_partition(self, index: int) -> str:
        """Where partition ``index`` lives, for messages: ``"train/a.parquet (row group 3)"``."""
        return self._source.describe(index)

    def read_partition(self, index: int, columns: Sequence[str]) -> pa.Table:
        """Read the given columns of one partition into an Arrow table.

        Errors from the storage layer or the parquet decoder are raised as
        [`ReadError`][tabloader.errors.ReadError] naming the file and row group.
        """
        try:
            return self._source.read(index, list(columns))
        except ReadError:
            raise
        except Exception as err:
            raise read_error(self.describe_partition(index), err) from err

    def iter_pieces(
        self, pieces: Sequence[tuple[int, int, int]], columns: Sequence[str]
    ) -> Iterator[pa.Table]:
        """Read ``(partition, first row, stop row)`` slices; yields one table per piece.

        Each piece is read when the previous one has been taken, so a consumer that
        processes and drops each table holds one decoded row group at a time. (Reading
        several row groups of a file in one call was measured slower: the decoded
        memory is larger and fresher.) From object storage, the next
        ``max_concurrent_reads`` pieces are fetched meanwhile.

        With ``on_missing="skip"``, a piece whose file was deleted, truncated or
        rewritten since the listing is replaced by as many rows repeated from the
        pieces read before it (or after it, for the first), so the epoch keeps its
        planned number of batches; [`rows_skipped`][tabloader.Dataset.rows_skipped] counts them.
        """
        results = self._read_pieces(pieces, list(columns))
        if self.on_missing == "raise":
            for _, result in results:
                if isinstance(result, BaseException):
                    raise result
                yield result
            return
        source = self._source
        assert isinstance(source, _ParquetSource)
        gone: set[int] = set()
        waiting: list[int] = []  # rows of missing pieces before the first good one
        last: pa.Table | None = None
        for (partition, first, stop), result in results:
            f = int(source.part_file[partition])
            if isinstance(result, BaseException):
                if f not in gone and not source.changed(f):
                    raise result
                if f not in gone:
                    gone.add(f)
                    self._warn_missing(source.files[f], result)
                self._rows_skipped += stop - first
                if last is None:
                    waiting.append(stop - first)
                    continue
                yield _repeat_rows(last, stop - first)
                continue
            last = result
            for rows in waiting:
                yield _repeat_rows(last, rows)
            waiting.clear()
            yield result
        if waiting:  # nothing read this time: borrow rows from a file still there
            last = self._any_table(list(columns), gone)
            for rows in waiting:
                yield _repeat_rows(last, rows)

    def _any_table(self, columns: list[str], gone: set[int]) -> pa.Table:
        source = self._source
        assert isinstance(source, _ParquetSource)
        for partition in range(len(source.rows)):
            f = int(source.part_file[partition])
            if f in gone:
                continue
            try:
                return self.read_partition(partition, columns)
            except ReadError:
                gone.add(f)
        raise ReadError(
            f"every file of this epoch disappeared during it (first "
            f"{source._display(source.files[min(gone)])}): no rows are left to fill the "
            "epoch's batches with. Check what deletes the files"
        )

    def _warn_missing(self, path: str, error: BaseException) -> None:
        if path in self._missing_warned:
            return
        self._missing_warned.add(path)
        warnings.warn(
            f"{self._source_display(path)} was deleted or changed during the epoch "
            f"({type(error).__name__}); its remaining rows are skipped this epoch and "
            "replaced by repeated rows so every rank keeps the same number of batches "
            "(loader.stats().rows_skipped counts them)",
            stacklevel=2,
        )

    def _source_display(self, path: str) -> str:
        source = self._source
        return source._display(path) if isinstance(source, _ParquetSource) else path

    @property
    def rows_skipped(self) -> int:
        """Rows skipped (and replaced) because their file went away (``on_missing="skip"``)."""
        return self._rows_skipped

    def _read_pieces(
        self, pieces: Sequence[tuple[int, int, int]], columns: list[str]
    ) -> Iterator[tuple[tuple[int, int, int], pa.Table | BaseException]]:
        """Each piece with its table, or the error reading it raised."""
        source = self._source
        if not (isinstance(source, _ParquetSource) and source.remote is not None):
            for piece in pieces:
                partition, first, last = piece
                try:
                    table = self.read_partition(partition, columns)
                except ReadError as err:
                    yield piece, err
                    continue
                yield piece, table.slice(first, last - first)
            return
        # Object storage: the byte ranges of the next pieces are fetched in a bounded
        # pool while this thread decodes, so latency overlaps decoding.

        def fetch(piece: tuple[int, int, int], stop: threading.Event) -> Any:
            try:
                return source.fetch_partition(piece[0], columns, stop=stop)
            except ReadError as err:
                return err
            except Exception as err:
                failure = read_error(self.describe_partition(piece[0]), err)
                failure.__cause__ = err
                return failure

        for piece, handle in source.remote.prefetch(pieces, fetch):
            partition, first, last = piece
            if isinstance(handle, BaseException):
                yield piece, handle
                continue
            try:
                table = self._decode(partition, handle, columns)
            except ReadError as err:
                yield piece, err
                continue
            yield piece, table.slice(first, last - first)

    def _decode(self, partition: int, handle: RangeFile, columns: list[str]) -> pa.Table:
        source = self._source
        assert isinstance(source, _ParquetSource)
        try:
            return source.decode(partition, handle, columns)
        except Exception as err:
            raise read_error(self.describe_partition(partition), err) from err

    def open_row_groups(
        self, file_index: int, row_groups: Sequence[int], columns: Sequence[str]
    ) -> io.IOBase:
        """A binary file-like object from which a parquet reader reads these row groups.

        For object storage, only the footer and the byte ranges of ``columns`` in
        ``row_groups`` are fetched (neighbouring ranges coalesced, failed requests
        retried); other bytes read as zeros, so give the reader the same row groups and
        columns. For local files it is the open file. Close it when done.

        Examples:
            >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os, tabloader
            >>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
            >>> pq.write_table(pa.table({"a": range(6), "b": range(6)}), path, row_group_size=3)
            >>> ds = tabloader.Dataset(path)
            >>> with ds.open_row_groups(0, [1], ["b"]) as f:
            ...     pq.ParquetFile(f).read_row_groups([1], columns=["b"])["b"].to_pylist()
            [3, 4, 5]
        """
        source = self._source
        if not isinstance(source, _ParquetSource):
            raise InvalidArgumentError(
                f"open_row_groups reads parquet files; this dataset is a {type(source).__name__}"
            )
        if source.remote is None:
            return open(source.files[file_index], "rb")
        return source.fetch_row_groups(file_index, list(row_groups), list(columns))

    def parquet_layout(self) -> tuple[NDArray[Any], NDArray[Any], NDArray[np.int64]] | None:
        """For parquet files: each partition's file index, row group and rows (else None).

        Examples:
            >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os, tabloader
            >>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
            >>> pq.write_table(pa.table({"a": range(5)}), path, row_group_size=3)
            >>> [a.tolist() for a in tabloader.Dataset(path).parquet_layout()]
            [[0, 0], [0, 1], [3, 2]]
        """
        source = self._source
        if not isinstance(source, _ParquetSource):
            return None
        return source.part_file, source.part_row_group, source.rows

    def local_paths(self, files: Sequence[int]) -> list[str] | None:
        """The local paths of these files (by index), or None for object storage."""
        source = self._source
        if not isinstance(source, _ParquetSource) or source.remote is not None:
            return None
        return [source.files[f] for f in files]

    def computed_partitions(
        self, pieces: Sequence[tuple[int, int, int]], columns: Sequence[str]
    ) -> list[Any] | None:
        """For a Dask DataFrame: each piece's rows of its partition, computed (pandas, or
        cudf for dask-cudf, whose partitions stay on the GPU); None for other sources."""
        source = self._source
        if not isinstance(source, _DaskSource):
            return None
        frames = []
        for partition, first, last in pieces:
            try:
                frames.append(source.compute_partition(partition, list(columns)).iloc[first:last])
            except Exception as err:
                if isinstance(err, MemoryError) or "out of memory" in str(err).lower():
                    raise
                raise read_error(self.describe_partition(partition), err) from err
        return frames

    def column_types(self, columns: Sequence[str]) -> dict[str, pa.DataType]:
        """Arrow type of each column, checked to be present and of one type in every file.

        Files may store a column with different widths (``int32`` and ``int64``, ``float``
        and ``double``): the type returned then holds them all (see
        `tabloader.columns.common_type`).

        Raises:
            ColumnNotFoundError: a column is missing from some file.
            SchemaMismatchError: files store a column with conflicting types (numbers and
                strings, lists and scalars, integers and floating point).
        """
        types: dict[str, pa.DataType] = {}
        for k, schema in enumerate(self._source.schemas):
            for name in columns:
                index = schema.get_field_index(name)
                found = len(schema.get_all_field_indices(name))
                if found > 1:
                    raise InvalidFileError(
                        f"{self._source.schema_owner(k)} has {found} columns named {name!r}; "
                        "tabloader reads columns by name. Rewrite the file with unique "
                        "column names"
                    )
                if index < 0:
                    where = self._source.schema_owner(k)
                    close = closest_name(name, schema.names)
                    raise ColumnNotFoundError(
                        f"column {name!r} is not in {where}"
                        + (f" (did you mean {close!r}?)" if close else "")
                        + f"; available: {_list_names(schema.names)}. Check the spelling, or "
                        "leave it out of cats/conts/labels."
                    )
                field_type = schema.field(index).type
                if k == 0:
                    types[name] = field_type
                elif (widened := common_type(types[name], field_type)) is not None:
                    types[name] = widened  # widths differ only: one type holds both
                else:
                    first = self._source.schemas[0].field(name).type
                    raise SchemaMismatchError(
                        f"column {name!r} is {field_type} in {self._source.schema_owner(k)} but "
                        f"{first} in {self._source.schema_owner(0)}: files may store a column "
                        "with other widths (int32 and int64, float and double), not with "
                        "conflicting types. Rewrite the odd files with a common schema "
                        "(tabloader convert writes one)."
                    )
        return types

    def check_worker_processes(self, start_method: Any = None) -> None:
        """Refuse worker processes that cannot read this dataset (before they start).

        ``start_method`` is a multiprocessing start method or context, None for the
        default. A Dask DataFrame with a dask.distributed Client cannot be computed in
        forked processes; every other source can.

        Raises:
            InvalidArgumentError: with what to use instead.
        """
        if not isinstance(self._source, _DaskSource) or _distributed_client() is None:
            return
        if start_method is not None and not isinstance(start_method, str):
            start_method = start_method.get_start_method()
        if start_method is None:
            start_method = (
                multiprocessing.get_start_method(allow_none=True)
                or multiprocessing.get_all_start_methods()[0]
            )
        if start_method == "fork":
            raise InvalidArgumentError(forked_dask_message(start_method))

    def cardinalities(self, columns: str | Sequence[str], *, device: Any = None) -> dict[str, int]:
        """Rows each id column's embedding table needs: its largest id + 1 (ids start at 0).

        The ids come from the parquet footers' statistics; a row group whose footer has
        none is read, on ``device`` (as a [`Loader`][tabloader.Loader] picks it: None is
        ``$TABLOADER_DEVICE``, else the GPU when usable). List columns count the ids
        inside their lists. ``tabloader inspect`` shows the same figures, and which
        columns had to be read.

        Raises:
            ColumnNotFoundError: a column is missing (the message suggests the closest).
            ColumnTypeError: a column does not hold integer ids.
            InvalidArgumentError: a column holds negative ids.

        Examples:
            >>> import pyarrow as pa, tabloader
            >>> ds = tabloader.Dataset(pa.table({"user": [3, 0, 7], "item": [1, 1, 2]}))
            >>> ds.cardinalities(["user", "item"])
            {'user': 8, 'item': 3}
        """
        from tabloader.columns import id_ranges

        ranges = id_ranges(self, columns, device=device)
        return {name: found.cardinality for name, found in ranges.items()}

    def embedding_sizes(
        self,
        columns: str | Sequence[str],
        *,
        device: Any = None,
        min_dim: int = 16,
        max_dim: int = 512,
    ) -> dict[str, tuple[int, int]]:
        """``{column: (rows, width)}`` for an embedding table per id column.

        ``rows`` is [`cardinalities`][tabloader.Dataset.cardinalities]' figure; ``width`` follows
        fastai's rule of thumb ``round(1.6 * rows ** 0.56)``, kept within ``[min_dim, max_dim]``, as
        NVTabular's ``get_embedding_sizes`` does.

        Examples:
            >>> import pyarrow as pa, tabloader
            >>> ds = tabloader.Dataset(pa.table({"user": [3, 0, 999]}))
            >>> ds.embedding_sizes(["user"])
            {'user': (1000, 77)}
            >>> import torch  # doctest: +SKIP
            >>> tables = {name: torch.nn.Embedding(rows, width)  # doctest: +SKIP
            ...           for name, (rows, width) in ds.embedding_sizes(["user"]).items()}
        """
        from tabloader.columns import embedding_dim

        min_dim = int_at_least(min_dim, 1, "min_dim")
        max_dim = int_at_least(max_dim, min_dim, "max_dim")
        return {
            name: (rows, embedding_dim(rows, min_dim=min_dim, max_dim=max_dim))
            for name, rows in self.cardinalities(columns, device=device).items()
        }

    def null_partitions(self, column: str) -> NDArray[np.int8]:
        """Per partition: 1 if the footer says the column holds nulls, 0 if none, -1 unknown."""
        return self._source.null_flags(column)

    def value_ranges(self, column: str) -> list[tuple[Any, Any] | None]:
        """Per partition: the smallest and largest value of ``column`` (of its values, for
        a list column) as the footers' statistics say, or None where they do not."""
        return self._source.value_ranges(column)

    def __repr__(self) -> str:
        kind = type(self._source).__name__.strip("_").replace("Source", "").lower()
        if self._source.table_format is not None:
            kind = f"{self._source.table_format}, version={self._source.version}"
        return (
            f"Dataset({kind}, files={len(self._source.files)}, "
            f"partitions={self.num_partitions}, rows={self.num_rows})"
        )


def _list_on_rank_zero(source: _ParquetSource) -> None:
    """List and read new footers; under torch.distributed, every rank takes rank 0's files.

    Rank 0 broadcasts its listing (the files it could read, or a table's version), or
    the error it met, so that no rank waits for a broadcast that never comes; the other
    ranks build exactly that listing.
    """
    dist = sys.modules.get("torch.distributed")
    if (
        dist is None
        or not dist.is_available()
        or not dist.is_initialized()
        or dist.get_world_size() == 1
    ):
        source.build(source.list_files())
        return
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            source.build(source.list_files())
            box[0] = source.listing()
        except Exception as err:
            box[0] = err
            dist.broadcast_object_list(box, src=0)
            raise
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], BaseException):
        raise box[0]
    if dist.get_rank() != 0:
        source.build(source.from_listing(box[0]), skip_unreadable=False)


def _repeat_rows(table: pa.Table, rows: int) -> pa.Table:
    return table.take(np.arange(rows) % table.num_rows)


def forked_dask_message(start_method: str = "fork") -> str:
    return (
        "a Dask DataFrame on a dask.distributed cluster cannot be read in worker processes "
        f"started with {start_method!r}: the forked copy of the Client has no connection to "
        "the scheduler and would wait forever. Use DataLoader(..., "
        "multiprocessing_context='spawn'), or num_workers=0 (tabloader reads in a background "
        "thread already, and the Dask workers do the computing)"
    )


def _distributed_client() -> Any:
    """The default dask.distributed Client, without importing distributed or doing I/O."""
    if "distributed" not in sys.modules:
        return None
    try:
        from distributed import default_client

        return default_client()  # type: ignore[no-untyped-call]
    except (ImportError, ValueError):
        return None


@contextmanager
def _quiet_dask() -> Iterator[None]:
    """Silence what a user of tabloader cannot act on: tabloader builds these graphs."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]ending large graph.*")
        warnings.filterwarnings("ignore", message=".*large graph.*")
        yield


def read_error(where: str, error: BaseException) -> ReadError:
    """The error for a partition that failed to read or decode (any backend)."""
    return ReadError(
        f"could not read {where}: {type(error).__name__}: {error}. The file may be "
        "truncated or corrupt; re-create it or remove it from the dataset."
    )


def _list_names(names: Sequence[str], limit: int = 30) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _is_pandas_frame(obj: object) -> bool:
    return type(obj).__module__.startswith("pandas") and hasattr(obj, "columns")


def _is_polars_frame(obj: object) -> bool:
    return type(obj).__module__.startswith("polars") and hasattr(obj, "collect_schema")


def _polars_to_arrow(frame: Any) -> pa.Table:
    """A polars DataFrame (or LazyFrame, collected) as Arrow: polars hands its buffers
    over without copying them where their layout is Arrow's (numeric columns)."""
    if hasattr(frame, "collect") and not hasattr(frame, "to_arrow"):
        frame = frame.collect()
    table: pa.Table = frame.to_arrow()
    return table


def _is_dask_frame(obj: object) -> bool:
    return type(obj).__module__.startswith("dask") and hasattr(obj, "npartitions")


def _as_path_list(source: object) -> list[str]:
    if isinstance(source, (str, os.PathLike)):
        return [os.fspath(source)]
    if isinstance(source, Iterable) and not isinstance(source, (bytes, dict)):
        paths = []
        for item in source:
            if not isinstance(item, (str, os.PathLike)):
                raise InvalidArgumentError(
                    f"a list of sources must hold paths or URLs, found {type(item).__name__}"
                )
            paths.append(os.fspath(item))
        if not paths:
            raise InvalidArgumentError("the list of sources is empty: give at least one path")
        return paths
    raise InvalidArgumentError(
        f"cannot load from a {type(source).__name__}: pass a path, glob, directory, URL, a list "
        "of those, a pyarrow.Table, a pandas or polars DataFrame, a polars LazyFrame or a Dask "
        "DataFrame (Delta and Iceberg tables: Dataset.from_delta, Dataset.from_iceberg)"
    )


class _Source:
    """Common shape of the partition sources (parquet files, in-memory table, Dask)."""

    rows: NDArray[np.int64]
    schemas: list[pa.Schema]
    files: list[str]
    columns: ColumnSources | None = None
    """Where each column comes from, file by file (parquet sources)."""
    version: int | None = None
    """The table version loaded (Delta and Iceberg sources)."""
    table_format: str | None = None

    def describe(self, index: int) -> str:
        raise NotImplementedError

    def schema_owner(self, schema_index: int) -> str:
        raise NotImplementedError

    def read(self, index: int, columns: list[str]) -> pa.Table:
        raise NotImplementedError

    def null_flags(self, column: str) -> NDArray[np.int8]:
        return np.full(len(self.rows), -1, dtype=np.int8)

    def value_ranges(self, column: str) -> list[tuple[Any, Any] | None]:
        return [None] * len(self.rows)


class _ParquetSource(_Source):
    columns: ColumnSources

    def __init__(
        self,
        specs: list[str],
        remote: RemoteStore | None,
        *,
        skip_unreadable: bool = False,
        filters: Filters | None = None,
    ) -> None:
        self.specs = specs
        self.remote = remote
        self.filters = filters
        self.files_skipped = 0
        self.key_types: dict[str, pa.DataType] = {}
        self._roots: dict[str, str] = {}  # directory or glob spec -> where its keys start
        if remote is not None:
            self.protocol = remote.protocol
        self.skip_unreadable = skip_unreadable
        self._warned: set[str] = set()
        self.files: list[str] = []
        self._sizes: list[int] = []
        self._stamps: list[Any] = []
        self._digests: list[str] = []  # of each file's footer: what its content decides
        self._footers: list[bytes] | None = None  # remote only: pickled instead of re-read
        self._metadata: list[pq.FileMetaData] | None = []
        self.build(self.list_files())

    def list_files(self) -> list[str]:
        """The files the specs name now, in load order."""
        if self.remote is not None:
            self.remote.filesystem.invalidate_cache()
        files: list[str] = []
        for spec in self.specs:
            files.extend(self._expand(spec))
        return list(dict.fromkeys(files))

    def listing(self) -> Any:
        """What rank 0 broadcasts so that every rank builds the same partitions."""
        return list(self.files)

    def from_listing(self, listing: Any) -> list[str]:
        """The files of a listing made by `listing` (on rank 0)."""
        return list(listing)

    def _select(self, files: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
        """The files ``filters`` keep, and their partition values (Hive directories)."""
        texts = [hive_values(self._below_root(p)) for p in files]
        self.key_types = infer_key_types(texts)
        if self.filters is not None:
            check_filters(self.filters, self.key_types, what=", ".join(repr(s) for s in self.specs))
        values = [parse_key_values(t, self.key_types) for t in texts]
        keep = [i for i, v in enumerate(values) if keep_file(self.filters, v)]
        self.files_skipped = len(files) - len(keep)
        if files and not keep:
            raise SourceNotFoundError(
                f"the filters {describe_filters(self.filters)} leave none of the {len(files)} "
                f"files of {', '.join(map(repr, self.specs))}"
            )
        return [files[i] for i in keep], [values[i] for i in keep]

    def _below_root(self, path: str) -> str:
        """``path`` relative to the directory or glob it was found by (its name alone
        for a file named directly): where its ``key=value`` directories are read."""
        for root in sorted(self._roots.values(), key=len, reverse=True):
            if path.startswith(root):
                return path[len(root) :]
        return os.path.basename(path)

    def _set_columns(self, metadata: list[pq.FileMetaData], values: list[dict[str, Any]]) -> None:
        """Where each column comes from: the files, or the directories' key values."""
        keys = self.key_types
        self.columns = ColumnSources.by_name(self.schemas, self.file_schema, keys, values)
        if keys:
            self.schemas = [_with_keys(schema, keys) for schema in self.schemas]

    def build(self, files: list[str], *, skip_unreadable: bool | None = None) -> None:
        """Partitions of ``files``, reusing the footers of files that did not change.

        With ``skip_unreadable``, a file whose footer cannot be read (still being
        written, or deleted since the listing) is left out with one warning, and tried
        again at the next build.
        """
        files, values = self._select(files)
        known = {}
        if self._metadata:
            for f, path in enumerate(self.files):
                footer = self._footers[f] if self._footers is not None else None
                known[path] = (
                    self._stamps[f], self._sizes[f], self._metadata[f], footer, self._digests[f]
                )  # fmt: skip
        stamps = self._file_stamps(files) if known else [None] * len(files)
        fresh = [
            path
            for path, stamp in zip(files, stamps, strict=True)
            if path not in known or stamp is None or known[path][0] != stamp
        ]
        skip = self.skip_unreadable if skip_unreadable is None else skip_unreadable
        read = dict(zip(fresh, self._read_footers(fresh, skip_unreadable=skip), strict=True))
        entries = []
        for path, stamp in zip(files, stamps, strict=True):
            if path in read:
                result = read[path]
                if isinstance(result, InvalidFileError):
                    if path not in self._warned:
                        self._warned.add(path)
                        warnings.warn(
                            f"skipping {self._display(path)} for now: {result}. It is tried "
                            "again when the dataset is listed next (the next epoch)",
                            stacklevel=4,
                        )
                    continue
                self._warned.discard(path)
                entries.append((path, *result))
            else:
                _, size, md, footer, digest = known[path]
                entries.append((path, stamp, size, md, footer, digest))
        if not entries:
            raise SourceNotFoundError(
                f"no readable parquet file in {', '.join(map(repr, self.specs))} yet"
            )
        self.files = [e[0] for e in entries]
        self._stamps = [e[1] for e in entries]
        self._sizes = [e[2] for e in entries]
        metadata = [e[3] for e in entries]
        self._metadata = metadata
        self._footers = [e[4] for e in entries] if self.remote is not None else None
        self._digests = [e[5] for e in entries]

        schema_ids: dict[pa.Schema, int] = {}
        self.schemas = []
        self._schema_first_file: list[int] = []
        file_schema = np.empty(len(self.files), dtype=np.int32)
        file_idx, rg_idx, rows = [], [], []
        for f, md in enumerate(metadata):
            schema = md.schema.to_arrow_schema().remove_metadata()
            sid = schema_ids.setdefault(schema, len(schema_ids))
            if sid == len(self.schemas):
                self.schemas.append(schema)
                self._schema_first_file.append(f)
            file_schema[f] = sid
            for g in range(md.num_row_groups):
                n = md.row_group(g).num_rows
                if n > 0:
                    file_idx.append(f)
                    rg_idx.append(g)
                    rows.append(n)
        self.file_schema = file_schema
        self.part_file = np.asarray(file_idx, dtype=np.int32)
        self.part_row_group = np.asarray(rg_idx, dtype=np.int32)
        self.rows = np.asarray(rows, dtype=np.int64)
        value_of = dict(zip(files, values, strict=True))
        self._set_columns(metadata, [value_of[path] for path in self.files])

    def _file_stamps(self, files: list[str]) -> list[Any]:
        """What tells a changed file from an unchanged one without reading it, or None
        (gone): for local files the size, modification and change times and inode (a
        rewrite changes the change time even when the modification time is put back, as
        ``cp -p`` and ``rsync -t`` do); for objects the size and the ETag, version or
        generation the store reports."""
        stamps: list[Any] = []
        for path in files:
            try:
                if self.remote is None:
                    stamps.append(_local_stamp(os.stat(path)))
                else:
                    stamps.append(self.remote.stamp(path))
            except (OSError, TabloaderError):
                stamps.append(None)
        return stamps

    def changed(self, index: int) -> bool:
        """Whether a file was deleted, truncated or rewritten since it was listed: its
        stamp is the fast path, and a file whose stamp changed (touched, copied back)
        has its footer read again, which its content decides."""
        path = self.files[index]
        stamp = self._file_stamps([path])[0]
        if stamp is None:
            return True
        if stamp == self._stamps[index]:
            return False
        try:
            if self.remote is None:
                stamp, footer = _local_footer(path)
            else:
                footer = self.remote.read_footer(path, stamp[0])
        except (OSError, ValueError, pa.ArrowException, TabloaderError):
            return True
        identity = self._identity(path, stamp, footer_digest(footer))
        return identity != self._identity(path, self._stamps[index], self._digests[index])

    def _identity(self, path: str, stamp: Any, digest: str) -> dict[str, Any]:
        """What a file's content decides: its size and footer digest, and for objects
        the ETag, version or generation the store keeps (the stamp's other parts, such
        as local modification times, only say when to look again)."""
        if self.remote is None:
            return {"path": os.path.abspath(path), "size": stamp[0], "footer": digest}
        return {
            "path": self.remote.display(path),
            "size": stamp[0],
            "version": list(stamp[1:]),
            "footer": digest,
        }

    def identities(self) -> list[dict[str, Any]]:
        """Each file's identity when it was listed (see `_identity`)."""
        return [
            self._identity(path, stamp, digest)
            for path, stamp, digest in zip(self.files, self._stamps, self._digests, strict=True)
        ]

    @property
    def filesystem(self) -> Any:
        """This process's fsspec filesystem (None for local files)."""
        return None if self.remote is None else self.remote.filesystem

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_metadata"] = None  # footers are re-parsed (or re-read) on demand
        return state

    def _expand(self, spec: str) -> list[str]:
        if self.remote is None:
            path = os.path.expanduser(spec)
            # A path that exists is itself, even with glob characters: "a[1].parquet".
            if globlib.has_magic(path) and not os.path.exists(path):
                found = sorted(
                    p
                    for p in globlib.glob(path, recursive=True)
                    if os.path.isfile(p) and not _hidden(p)
                )
                if not found:
                    raise SourceNotFoundError(f"the glob {spec!r} matched no files")
                self._roots[spec] = _glob_root(path)
                return found
            if os.path.isdir(path):
                _refuse_table_directory(spec, _table_markers(path))
                self._roots[spec] = path.rstrip("/") + "/"
                return self._from_directory(spec, _walk_local(path))
            if os.path.isfile(path):
                return [path]
            raise SourceNotFoundError(f"{spec!r} does not exist")
        remote = self.remote
        fs = remote.filesystem
        path = fs._strip_protocol(spec)

        def call(name: str, *args: Any, **kwargs: Any) -> Any:
            try:
                return remote.call(name, *args, what=f"the listing of {spec}", **kwargs)
            except PermissionError as err:
                raise access_denied_error(spec, err) from err
            except FileNotFoundError:
                return None

        literal = call("info", path) if globlib.has_magic(path) else None
        if globlib.has_magic(path) and literal is None:
            listing = call("glob", path, detail=True) or {}
            found = sorted(
                p for p, info in listing.items() if info.get("type") == "file" and not _hidden(p)
            )
            if not found:
                raise SourceNotFoundError(
                    f"the glob {spec!r} matched no files; check the bucket name, the path "
                    "and the endpoint"
                )
            self._roots[spec] = _glob_root(path)
            return found
        info = literal if literal is not None else call("info", path)
        if info is not None and info.get("type") == "directory":
            listing = sorted(call("find", path) or [])
            root = path.rstrip("/") + "/"
            _refuse_table_directory(spec, [p[len(root) :] for p in listing if p.startswith(root)])
            self._roots[spec] = root
            return self._from_directory(spec, listing, root=path)
        if info is not None:
            return [path]
        raise SourceNotFoundError(
            f"{spec!r} does not exist; check the bucket name, the path and the endpoint"
        )

    @staticmethod
    def _from_directory(spec: str, listing: list[str], root: str | None = None) -> list[str]:
        base = root if root is not None else spec
        found = []
        for p in listing:
            rel = p[len(base) :].lstrip("/") if p.startswith(base) else os.path.basename(p)
            if any(part.startswith(("_", ".")) for part in rel.split("/")) or _hidden(p):
                continue
            if p.endswith(PARQUET_SUFFIXES):
                found.append(p)
        if not found:
            raise SourceNotFoundError(
                f"the directory {spec!r} holds no parquet files (looked for "
                f"{', '.join('*' + s for s in PARQUET_SUFFIXES)}); pass the files explicitly"
            )
        refuse_mixed_splits(spec, base, found)
        return sorted(found)

    def _display(self, path: str) -> str:
        return path if self.remote is None else self.remote.display(path)

    def _read_footer(self, path: str) -> tuple[Any, int, pq.FileMetaData, bytes | None, str]:
        """A file's stamp (see `_file_stamps`), size, metadata, footer bytes (kept
        for remote files only) and footer digest, the stamp and the footer from the same
        opened file."""
        shown = self._display(path)
        stamp: tuple[Any, ...]
        try:
            if self.remote is None:
                stamp, footer = _local_footer(path)
                size = stamp[0]
            else:
                stamp = self.remote.stamp(path)
                size = stamp[0]
                footer = self.remote.read_footer(path, size) if size else b""
        except (pa.ArrowException, ValueError) as err:
            if isinstance(err, InvalidFileError):
                raise
            raise InvalidFileError(
                f"{shown} is not a readable parquet file ({err}); it may be truncated, still "
                "being written, or in another format"
            ) from err
        except OSError as err:
            if isinstance(err, ReadError):
                raise
            raise SourceNotFoundError(f"cannot open {shown}: {err}") from err
        if size == 0:
            raise InvalidFileError(
                f"{shown} is empty (0 bytes): remove it, or re-write it as parquet"
            )
        try:
            metadata = footer_metadata(footer)
        except (pa.ArrowException, ValueError, OSError) as err:
            raise InvalidFileError(
                f"{shown} is not a readable parquet file ({err}); it may be truncated, still "
                "being written, or in another format"
            ) from err
        kept = footer if self.remote is not None else None
        return stamp, size, metadata, kept, footer_digest(footer)

    def _read_footers(self, files: list[str], *, skip_unreadable: bool) -> list[Any]:
        """Each file's (stamp, size, metadata, footer bytes), or, with
        ``skip_unreadable``, the [`InvalidFileError`][tabloader.errors.InvalidFileError] that
        reading it raised."""

        def read(path: str) -> Any:
            try:
                return self._read_footer(path)
            except (InvalidFileError, SourceNotFoundError) as err:
                if not skip_unreadable:
                    raise
                return InvalidFileError(str(err))

        if len(files) <= 1:
            return [read(f) for f in files]
        threads = _FOOTER_THREADS if self.remote is None else self.remote.max_concurrent_reads
        with ThreadPoolExecutor(min(threads, len(files))) as pool:
            return list(pool.map(read, files))

    def metadata(self, file_index: int) -> pq.FileMetaData:
        if self._metadata is None:
            if self._footers is not None:
                self._metadata = [footer_metadata(f) for f in self._footers]
            else:
                self._metadata = [pq.read_metadata(path) for path in self.files]
        return self._metadata[file_index]

    def describe(self, index: int) -> str:
        f = int(self.part_file[index])
        return f"{self._display(self.files[f])} (row group {int(self.part_row_group[index])})"

    def schema_owner(self, schema_index: int) -> str:
        return self._display(self.files[self._schema_first_file[schema_index]])

    def open(self, file_index: int) -> pq.ParquetFile:
        path = self.files[file_index]
        md = self.metadata(file_index)
        if self.remote is None:
            return pq.ParquetFile(path, metadata=md)
        return pq.ParquetFile(self.remote.filesystem.open(path, "rb"), metadata=md)

    def fetch_row_groups(
        self,
        file_index: int,
        row_groups: list[int],
        columns: list[str],
        *,
        stop: threading.Event | None = None,
    ) -> RangeFile:
        """The footer and the column chunks of ``row_groups`` of one remote file."""
        assert self.remote is not None
        size = self._sizes[file_index]
        md = self.metadata(file_index)
        footer_start = size - md.serialized_size - 8
        ranges = column_chunk_ranges(md, row_groups, columns)
        ranges.append((footer_start, size))
        return self.remote.open_ranges(
            self.files[file_index], size, merge_ranges(ranges), stop=stop
        )

    def fetch_partition(
        self, index: int, columns: list[str], *, stop: threading.Event | None = None
    ) -> RangeFile:
        f, g = int(self.part_file[index]), int(self.part_row_group[index])
        size = self._sizes[f]
        stored = list(self.columns.file_columns(f, columns).read)
        ranges = merge_ranges(column_chunk_ranges(self.metadata(f), [g], stored))
        assert self.remote is not None
        return self.remote.open_ranges(self.files[f], size, ranges, stop=stop)

    def decode(self, index: int, handle: RangeFile, columns: list[str]) -> pa.Table:
        f, g = int(self.part_file[index]), int(self.part_row_group[index])
        how = self.columns.file_columns(f, columns)
        with pq.ParquetFile(cast(IO[bytes], handle), metadata=self.metadata(f)) as parquet:
            return how.complete(parquet.read_row_group(g, columns=list(how.read)), columns)

    def read(self, index: int, columns: list[str]) -> pa.Table:
        if self.remote is not None:
            return self.decode(index, self.fetch_partition(index, columns), columns)
        f = int(self.part_file[index])
        how = self.columns.file_columns(f, columns)
        with self.open(f) as handle:
            table = handle.read_row_group(int(self.part_row_group[index]), columns=list(how.read))
        return how.complete(table, columns)

    def null_flags(self, column: str) -> NDArray[np.int8]:
        flags = np.full(len(self.rows), -1, dtype=np.int8)
        column_index: dict[int, int] = {}
        for p in range(len(self.rows)):
            f = int(self.part_file[p])
            md = self.metadata(f)
            stored = self.columns.stored_name(f, column)
            if stored is None and column in self.columns.types:  # a constant in this file
                flags[p] = 1 if self.columns.values[f].get(column) is None else 0
                continue
            if f not in column_index:
                names = [md.schema.column(i).path for i in range(md.num_columns)]
                name = column if stored is None else stored
                column_index[f] = names.index(name) if name in names else -1
            c = column_index[f]
            if c < 0:
                continue
            stats = md.row_group(int(self.part_row_group[p])).column(c).statistics
            nulls = stats.null_count if stats is not None else None
            if nulls is not None and getattr(stats, "has_null_count", True):
                flags[p] = 1 if nulls > 0 else 0
        return flags

    def value_ranges(self, column: str) -> list[tuple[Any, Any] | None]:
        leaves: dict[int, int | None] = {}
        ranges = []
        for f, g in zip(self.part_file.tolist(), self.part_row_group.tolist(), strict=True):
            md = self.metadata(f)
            if f not in leaves:
                leaves[f] = footer_leaf(md, column)
            ranges.append(footer_range(md, g, leaves[f]))
        return ranges


def _local_stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _local_footer(path: str) -> tuple[tuple[int, int, int, int], bytes]:
    """A local file's stamp and its footer (metadata, length, magic), read from one
    opened file, so the two belong to the same version of it."""
    with open(path, "rb") as f:
        stamp = _local_stamp(os.fstat(f.fileno()))
        size = stamp[0]
        if size == 0:
            return stamp, b""
        if size < 12:
            raise pa.ArrowInvalid(f"{size} bytes are too few for a parquet file")
        f.seek(size - 8)
        tail = f.read(8)
        if tail[4:] != b"PAR1":
            raise pa.ArrowInvalid("Parquet magic bytes not found in footer")
        length = int.from_bytes(tail[:4], "little")
        if length + 12 > size:
            raise pa.ArrowInvalid("the footer is longer than the file")
        f.seek(size - 8 - length)
        return stamp, f.read(length + 8)


def footer_digest(footer: bytes) -> str:
    """A short hash of a parquet footer: what a file's content decides, at no read cost
    (the footer is read to plan anyway). It holds every row group's and column chunk's
    sizes, offsets and statistics, so rewritten data changes it.

    Examples:
        >>> footer_digest(b"PAR1") == footer_digest(b"PAR1"), len(footer_digest(b""))
        (True, 32)
    """
    return hashlib.sha256(footer).hexdigest()[:32]


TEMPORARY_SUFFIXES = (".tmp", ".inprogress")


def _hidden(path: str) -> bool:
    """Files writers leave beside the data (``_SUCCESS``, ``_metadata``, ``.crc``) or are
    still writing (``*.tmp``, ``*.inprogress``)."""
    name = os.path.basename(path)
    return name.startswith(("_", ".")) or name.endswith(TEMPORARY_SUFFIXES)


def _glob_root(pattern: str) -> str:
    """The directory a glob's matches start below: where their ``key=value`` parts begin."""
    parts = pattern.replace("\\", "/").split("/")
    fixed = []
    for part in parts[:-1]:
        if globlib.has_magic(part):
            break
        fixed.append(part)
    return "/".join(fixed) + "/" if fixed else ""


def _table_markers(directory: str) -> list[str]:
    """The names below ``directory`` that tell a Delta or Iceberg table's directory."""
    found = []
    if os.path.isdir(os.path.join(directory, "_delta_log")):
        found.append("_delta_log/")
    metadata = os.path.join(directory, "metadata")
    if os.path.isdir(metadata):
        found.extend(f"metadata/{name}" for name in os.listdir(metadata))
    return found


def _refuse_table_directory(spec: str, names: Iterable[str]) -> None:
    """A table's directory holds the files of every version: refuse to read them all."""
    for name in names:
        if name.startswith("_delta_log/"):
            raise InvalidArgumentError(
                f"{spec!r} is a Delta Lake table: its directory also holds files that older "
                "versions replaced or deleted, so reading every file would duplicate and "
                f"resurrect rows. Load it with tabloader.Dataset.from_delta({spec!r})"
            )
        if name.startswith("metadata/") and name.endswith(".metadata.json"):
            raise InvalidArgumentError(
                f"{spec!r} is an Apache Iceberg table: its data directory also holds files "
                "that older snapshots replaced or deleted. Load it with "
                "tabloader.Dataset.from_iceberg(catalog.load_table(...)), or for a table "
                "without a catalog pyiceberg.table.StaticTable.from_metadata(...)"
            )


def _with_keys(schema: pa.Schema, keys: dict[str, pa.DataType]) -> pa.Schema:
    """``schema`` with the partition keys it does not store appended."""
    for name, key_type in keys.items():
        if schema.get_field_index(name) < 0:
            schema = schema.append(pa.field(name, key_type))
    return schema


def _walk_local(root: str) -> list[str]:
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(("_", ".")))
        found.extend(os.path.join(dirpath, name) for name in filenames)
    return sorted(found)


def _names_urls(source: object) -> bool:
    """Whether ``source`` is a URL or a list holding one."""
    items = [source] if isinstance(source, (str, os.PathLike)) else source
    if not isinstance(items, (list, tuple)):
        return False
    return any(isinstance(s, (str, os.PathLike)) and _is_url(os.fspath(s)) for s in items)


def _describe_source(source: object) -> str:
    if isinstance(source, (str, os.PathLike)):
        return f"the local path {os.fspath(source)!r}"
    if isinstance(source, (list, tuple)):
        return "local paths"
    return f"a {type(source).__name__}"


def _is_url(spec: str) -> bool:
    return "://" in spec


def _protocol(url: str) -> str:
    return url.split("://", 1)[0]


class _TableSource(_Source):
    def __init__(self, table: pa.Table, rows_per_partition: int) -> None:
        self.table = table.combine_chunks() if table.num_rows else table
        n = table.num_rows
        self.starts = np.arange(0, n, rows_per_partition, dtype=np.int64)
        self.rows = np.minimum(rows_per_partition, n - self.starts).astype(np.int64)
        self.schemas = [table.schema.remove_metadata()]
        self.files = []

    def describe(self, index: int) -> str:
        start = int(self.starts[index])
        return f"in-memory table (rows {start}..{start + int(self.rows[index])})"

    def schema_owner(self, schema_index: int) -> str:
        return "the in-memory table"

    def read(self, index: int, columns: list[str]) -> pa.Table:
        return self.table.slice(int(self.starts[index]), int(self.rows[index])).select(columns)

    def null_flags(self, column: str) -> NDArray[np.int8]:
        if column not in self.table.column_names:
            return super().null_flags(column)
        chunk = self.table.column(column)
        flags = np.empty(len(self.rows), dtype=np.int8)
        for p in range(len(self.rows)):
            part = chunk.slice(int(self.starts[p]), int(self.rows[p]))
            flags[p] = 1 if part.null_count else 0
        return flags

    def value_ranges(self, column: str) -> list[tuple[Any, Any] | None]:
        if column not in self.table.column_names:
            return super().value_ranges(column)
        whole: Any = self.table.column(column).combine_chunks()
        listed = pa.types.is_list(whole.type) or pa.types.is_large_list(whole.type)
        ranges: list[tuple[Any, Any] | None] = []
        for p in range(len(self.rows)):
            part = whole.slice(int(self.starts[p]), int(self.rows[p]))
            values = part.flatten() if listed else part
            extremes = pc.min_max(values)
            low, high = extremes["min"].as_py(), extremes["max"].as_py()
            ranges.append(None if low is None else (low, high))
        return ranges


class _DaskSource(_Source):
    def __init__(self, frame: Any) -> None:
        # Deprecations raised inside dask's own code when tabloader computes partitions:
        # nothing a user of tabloader can change, so not shown.
        warnings.filterwarnings(
            "ignore", message=r"The inplace keyword in DataFrame\.reset_index", module=r"dask\."
        )
        self.frame = frame
        self._pid = os.getpid()  # a copy in another process without unpickling was forked
        with _quiet_dask():
            counts = frame.map_partitions(len).compute()
        rows = np.asarray(counts, dtype=np.int64)
        self.part_index = np.flatnonzero(rows > 0).astype(np.int32)
        self.rows = rows[self.part_index]
        meta = frame._meta
        if hasattr(meta, "to_pandas"):  # dask-cudf
            meta = meta.to_pandas()
        self.schemas = [pa.Schema.from_pandas(meta, preserve_index=False).remove_metadata()]
        self.files = []

    def describe(self, index: int) -> str:
        return f"Dask partition {int(self.part_index[index])}"

    def schema_owner(self, schema_index: int) -> str:
        return "the Dask DataFrame"

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    def compute_partition(self, index: int, columns: list[str]) -> Any:
        if os.getpid() != self._pid and _distributed_client() is not None:
            # The client's connection lives in a thread of the parent process, which a
            # forked child does not have: compute() would wait forever.
            raise TabloaderError(forked_dask_message())
        with _quiet_dask():
            return self.frame[columns].get_partition(int(self.part_index[index])).compute()

    def read(self, index: int, columns: list[str]) -> pa.Table:
        frame = self.compute_partition(index, columns)
        table: pa.Table = (
            frame.to_arrow()  # cudf
            if hasattr(frame, "to_arrow")
            else pa.Table.from_pandas(frame, preserve_index=False)
        )
        return table
