"""The dataset: what the user points at, as partitions of rows, from footers alone.

A [`Dataset`][tabloader.Dataset] turns what the user points at (paths, globs, directories, fsspec
URLs, an in-memory table, a Dask DataFrame, a Delta or Iceberg table) into an ordered list of
*partitions*: for parquet, one partition per row group. Each partition knows its row count
without any data being read; the loader plans an epoch from these counts and reads only the
partitions and columns it needs.

The kinds of source live in `tabloader.sources`, behind one protocol
(`tabloader.sources.base.Source`). A dataset takes the source that
`tabloader.sources.open_source` picks for what it is given; it lists a ``refresh=True``
dataset again when an epoch starts (rank 0 lists under torch.distributed), and replaces
the rows of files that went away (``on_missing="skip"``).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa

from tabloader.errors import InvalidArgumentError, ReadError
from tabloader.options import flag, int_at_least, is_number
from tabloader.partitioned import Partitioned
from tabloader.sources import open_source
from tabloader.sources.base import PieceResult, Source, read_error
from tabloader.sources.partitions import normalize_filters

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["Dataset", "read_error", "small_row_groups"]

DEFAULT_ROWS_PER_PARTITION = 131_072
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


class Dataset(Partitioned):
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

    Args: Integrity
        verify_checksums: Check every page read against the CRC-32 checksum its header
            carries (pyarrow's ``page_checksum_verification``), so that a page damaged on
            disk or in transit is a [`ReadError`][tabloader.errors.ReadError] naming the
            file and row group rather than wrong values. Pages written without a checksum
            (pyarrow writes them only with ``write_page_checksum=True``) are read as they
            are. It costs one CRC-32 pass over each page's stored bytes; the GPU backend
            then decodes with pyarrow (cudf does not verify checksums). Parquet files
            only. Default False.

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
        verify_checksums: bool = False,
    ) -> None:
        if engine != "parquet":
            raise InvalidArgumentError(
                f"engine must be 'parquet', got {engine!r}: convert other formats to parquet first"
            )
        if not isinstance(rows_per_partition, (int, np.integer)) or rows_per_partition < 1:
            raise InvalidArgumentError(
                f"rows_per_partition must be a positive integer, got {rows_per_partition!r}"
            )
        remote = _remote_options(max_concurrent_reads, retry_seconds, request_timeout)
        self.refreshes = flag(refresh, "refresh")
        if on_missing not in ("raise", "skip"):
            raise InvalidArgumentError(f"on_missing must be 'raise' or 'skip', got {on_missing!r}")
        self.on_missing = on_missing
        self._skipped = _Skipped()
        self._listed_epoch: int | None = None
        checked_filters = normalize_filters(filters)
        self._source: Source = open_source(
            source,
            rows_per_partition=int(rows_per_partition),
            storage_options=storage_options,
            remote=remote,
            filters=checked_filters,
            refreshes=self.refreshes,
            verify_checksums=flag(verify_checksums, "verify_checksums"),
        )
        if not self._source.refreshable:
            _refuse_file_options(
                self._source,
                lists_again=self.refreshes or on_missing == "skip",
                filters=checked_filters is not None,
                verify_checksums=bool(verify_checksums),
            )

    @classmethod
    def from_delta(
        cls,
        uri: str | os.PathLike[str],
        *,
        version: int | None = None,
        storage_options: dict[str, Any] | None = None,
        filters: Any = None,
        refresh: bool = False,
        verify_checksums: bool = False,
        max_concurrent_reads: int = 16,
        retry_seconds: float = 60.0,
        request_timeout: float = 30.0,
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
            verify_checksums: Check the pages read against their checksums (see
                ``Dataset``).
            max_concurrent_reads, retry_seconds, request_timeout: How the data files
                are read from object storage (see ``Dataset``).

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
        pinned = None if version is None else f"version={version} loads one version"
        _refuse_pinned_and_refresh(refresh, pinned, follows="latest")
        return cls(
            log, filters=filters, refresh=refresh, verify_checksums=verify_checksums,
            max_concurrent_reads=max_concurrent_reads, retry_seconds=retry_seconds,
            request_timeout=request_timeout,
        )  # fmt: skip

    @classmethod
    def from_iceberg(
        cls,
        table: Any,
        *,
        snapshot_id: int | None = None,
        filters: Any = None,
        refresh: bool = False,
        verify_checksums: bool = False,
        max_concurrent_reads: int = 16,
        retry_seconds: float = 60.0,
        request_timeout: float = 30.0,
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
            verify_checksums: Check the pages read against their checksums (see
                ``Dataset``).
            max_concurrent_reads, retry_seconds, request_timeout: How the data files
                are read from object storage (see ``Dataset``).

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
        pinned = None if snapshot_id is None else f"snapshot_id={snapshot_id} loads one snapshot"
        _refuse_pinned_and_refresh(refresh, pinned, follows="current one")
        if refresh and log.static:
            raise InvalidArgumentError(
                f"refresh=True follows new snapshots, and the Iceberg table {log.name} is a "
                "StaticTable (one metadata file, which never names a newer snapshot): open "
                "it from its catalog, (catalog, identifier), or leave refresh out"
            )
        return cls(
            log, filters=filters, refresh=refresh, verify_checksums=verify_checksums,
            max_concurrent_reads=max_concurrent_reads, retry_seconds=retry_seconds,
            request_timeout=request_timeout,
        )  # fmt: skip

    def refresh(self, *, epoch: int | None = None) -> bool:
        """List the files again (``refresh=True`` datasets); returns whether they changed.

        A loader calls this when an epoch starts, with its number, so the listing is
        done once per epoch; call it yourself (with the same ``epoch``, on every rank)
        to know ``len(loader)`` of the next epoch before it starts. Under an initialised
        ``torch.distributed`` group this is a collective: rank 0 lists, every rank
        builds its partitions from rank 0's list.
        """
        source = self._source
        if not self.refreshes or (epoch is not None and epoch == self._listed_epoch):
            return False
        self._listed_epoch = epoch
        return _list_again(source)

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
        results = self._source.read_pieces(pieces, list(columns))
        if self.on_missing == "skip":
            yield from self._skipped.replace(self._source, results, list(columns))
            return
        for _, result in results:
            if isinstance(result, BaseException):
                raise result
            yield result

    @property
    def rows_skipped(self) -> int:
        """Rows skipped (and replaced) because their file went away (``on_missing="skip"``)."""
        return self._skipped.rows

    def cardinalities(self, columns: str | Sequence[str], *, device: Any = None) -> dict[str, int]:
        """Rows each id column's embedding table needs: its largest id + 1 (ids start at 0).

        The ids come from the parquet footers' statistics; a row group whose footer has
        none is read, on ``device`` (as a [`Loader`][tabloader.Loader] picks it: None is
        ``$TABLOADER_DEVICE``, else the GPU when usable). List columns count the ids
        inside their lists. ``tabloader inspect`` shows the same figures, and which
        columns had to be read. A loader's ``fill_null`` value for a column with nulls is
        delivered as an id too, and is not counted here (``tabloader inspect
        --fill-null`` counts it).

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
        from tabloader.embeddings import id_ranges

        ranges = id_ranges(self, columns, device=device)
        return {name: found.cardinality for name, found in ranges.items()}

    def embedding_sizes(
        self,
        columns: str | Sequence[str],
        *,
        device: Any = None,
        min_dim: int = 16,
        max_dim: int = 512,
        vocabulary: str | os.PathLike[str] | None = None,
        budget_bytes: int = 2**30,
    ) -> dict[str, tuple[int, int]]:
        """``{column: (rows, width)}`` for an embedding table per id column.

        ``rows`` is [`cardinalities`][tabloader.Dataset.cardinalities]' figure (the
        largest id + 1), or, for a column ``vocabulary`` holds (the ``_vocabulary``
        directory ``tabloader convert --categorify`` writes, or its destination), the
        vocabulary's size: its values and the ids of unknown values and nulls. ``width``
        follows fastai's rule of thumb ``round(1.6 * rows ** 0.56)``, kept within
        ``[min_dim, max_dim]``, as NVTabular's ``get_embedding_sizes`` does.

        A table whose float32 weights exceed ``budget_bytes`` (1 GiB) gets a
        [`EmbeddingSizeWarning`][tabloader.errors.EmbeddingSizeWarning] saying how many
        distinct ids the column holds (its ids are read to count them) and how to make
        the table smaller: ``--categorify`` for sparse ids, ``--hash`` otherwise.

        Examples:
            >>> import pyarrow as pa, tabloader
            >>> ds = tabloader.Dataset(pa.table({"user": [3, 0, 999]}))
            >>> ds.embedding_sizes(["user"])
            {'user': (1000, 77)}
            >>> import torch  # doctest: +SKIP
            >>> tables = {name: torch.nn.Embedding(rows, width)  # doctest: +SKIP
            ...           for name, (rows, width) in ds.embedding_sizes(["user"]).items()}
        """
        from tabloader.embeddings import embedding_sizes

        return embedding_sizes(
            self,
            columns,
            device=device,
            min_dim=min_dim,
            max_dim=max_dim,
            vocabulary=vocabulary,
            budget_bytes=budget_bytes,
        )

    def __repr__(self) -> str:
        source = self._source
        kind = source.kind
        if source.table_format is not None:
            kind = f"{source.table_format}, version={source.version}"
        return (
            f"Dataset({kind}, files={len(source.files)}, "
            f"partitions={self.num_partitions}, rows={self.num_rows})"
        )


def _refuse_pinned_and_refresh(refresh: bool, pinned: str | None, *, follows: str) -> None:
    """Refuse a table's version pinned (``pinned`` says which; None: none) with
    ``refresh=True``, which follows the ``follows`` version."""
    if flag(refresh, "refresh") and pinned is not None:
        raise InvalidArgumentError(
            f"{pinned} and refresh=True follows the {follows}; pass one of them"
        )


def _remote_options(
    max_concurrent_reads: int, retry_seconds: float, request_timeout: float
) -> dict[str, Any]:
    """The object store's request options, checked."""
    if not is_number(retry_seconds) or not 0 <= retry_seconds < float("inf"):
        raise InvalidArgumentError(
            f"retry_seconds must be a number of seconds >= 0, got {retry_seconds!r}"
        )
    if not is_number(request_timeout) or not 0 < request_timeout < float("inf"):
        raise InvalidArgumentError(
            f"request_timeout must be a positive number of seconds, got {request_timeout!r}"
        )
    return {
        "max_concurrent_reads": int_at_least(max_concurrent_reads, 1, "max_concurrent_reads"),
        "retry_seconds": float(retry_seconds),
        "request_timeout": float(request_timeout),
    }


def _refuse_file_options(
    source: Source, *, lists_again: bool, filters: bool, verify_checksums: bool
) -> None:
    """Refuse the options that only parquet files take, given for another ``source``."""
    if lists_again:
        raise InvalidArgumentError(
            "refresh=True and on_missing='skip' apply to parquet files (paths, "
            f"directories, globs, URLs), not to a {source.kind} source"
        )
    if filters:
        raise InvalidArgumentError(
            "filters select parquet files by partition key; an in-memory table or a Dask "
            "DataFrame has no partition keys: filter it before passing it"
        )
    if verify_checksums:
        raise InvalidArgumentError(
            "verify_checksums checks the pages of parquet files as they are read; a "
            f"{source.kind} source is not read from parquet pages here"
        )


def _list_again(source: Source) -> bool:
    """List ``source`` again (rank 0's listing, under torch.distributed); returns whether
    anything changed."""
    before = (source.listing(), source.rows.copy(), source.identities())
    _list_on_rank_zero(source)
    # A file rewritten in place (same name, same rows) is a change too: its rows are new.
    return (
        before[0] != source.listing()
        or not np.array_equal(before[1], source.rows)
        or before[2] != source.identities()
    )


def _list_on_rank_zero(source: Source) -> None:
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
        source.relist()
        return
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            source.relist()
            box[0] = source.listing()
        except Exception as err:
            box[0] = err
            dist.broadcast_object_list(box, src=0)
            raise
    dist.broadcast_object_list(box, src=0)
    if isinstance(box[0], BaseException):
        raise box[0]
    if dist.get_rank() != 0:
        source.relist(box[0])


class _Skipped:
    """``on_missing="skip"``: the rows of files that went away during an epoch, replaced."""

    def __init__(self) -> None:
        self.rows = 0
        self.warned: set[str] = set()

    def replace(
        self, source: Source, results: Iterator[PieceResult], columns: list[str]
    ) -> Iterator[pa.Table]:
        """Each piece's table; a piece whose file was deleted, truncated or rewritten since
        the listing is replaced by as many rows repeated from the pieces read before it
        (or after it, for the first)."""
        gone: set[int] = set()
        waiting: list[int] = []  # rows of missing pieces before the first good one
        last: pa.Table | None = None
        for (partition, first, stop), result in results:
            f = source.file_of(partition)
            if isinstance(result, BaseException):
                if f not in gone and not source.known_changed(f):
                    raise result
                if f not in gone:
                    gone.add(f)
                    self._warn(source.display(source.files[f]), result)
                self.rows += stop - first
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
            last = _any_table(source, columns, gone)
            for rows in waiting:
                yield _repeat_rows(last, rows)

    def _warn(self, path: str, error: BaseException) -> None:
        if path in self.warned:
            return
        self.warned.add(path)
        warnings.warn(
            f"{path} was deleted or changed during the epoch "
            f"({type(error).__name__}); its remaining rows are skipped this epoch and "
            "replaced by repeated rows so every rank keeps the same number of batches "
            "(loader.stats().rows_skipped counts them)",
            stacklevel=3,
        )


def _any_table(source: Source, columns: list[str], gone: set[int]) -> pa.Table:
    for partition in range(len(source.rows)):
        f = source.file_of(partition)
        if f in gone:
            continue
        try:
            return source.read(partition, columns)
        except Exception:
            gone.add(f)
    raise ReadError(
        f"every file of this epoch disappeared during it (first "
        f"{source.display(source.files[min(gone)])}): no rows are left to fill the "
        "epoch's batches with. Check what deletes the files"
    )


def _repeat_rows(table: pa.Table, rows: int) -> pa.Table:
    return table.take(np.arange(rows) % table.num_rows)
