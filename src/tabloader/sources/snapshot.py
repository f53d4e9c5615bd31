"""A table version as a parquet source: the files its log names, nothing else in the directory.

`SnapshotSource` is the parquet source (footers, row groups, object storage,
refresh) over the files of one version of a Delta or Iceberg table, as a
`TableLog` reports them. Its schema is the table's;
each file's columns are matched to it (by Iceberg field id, from the file or the
table's name mapping, or by name), partition keys come from the log, and a column a
file predates reads as its Iceberg ``initial-default``, or null.

Under ``refresh=True`` every listing asks the log for its newest version; under several
ranks, rank 0 asks and broadcasts the version number, and every rank loads exactly that
version (`listing`, `from_listing`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow.parquet as pq

from tabloader.errors import (
    InvalidFileError,
    SchemaMismatchError,
    SourceNotFoundError,
    UnsupportedTableError,
)
from tabloader.sources.iceberg import local_path
from tabloader.sources.parquet import ParquetSource
from tabloader.sources.partitions import (
    ColumnSources,
    Filters,
    TableFile,
    TableLog,
    TableSnapshot,
    check_filters,
    describe_filters,
    keep_file,
)

if TYPE_CHECKING:
    from tabloader.sources.remote import RemoteStore

T = TypeVar("T")

__all__ = ["SnapshotSource"]


class SnapshotSource(ParquetSource):
    """The parquet files of one version of a table, with the table's schema and keys."""

    def __init__(
        self,
        log: TableLog,
        remote: RemoteStore | None,
        *,
        filters: Filters | None,
        verify_checksums: bool = False,
    ) -> None:
        self.log = log
        self.table_format = log.format
        self.snapshot: TableSnapshot | None = None
        self._entries: dict[str, TableFile] = {}
        # A file named by the log that cannot be read is an error, never skipped: the
        # version's rows are what the log says.
        super().__init__(
            [log.name],
            remote,
            skip_unreadable=False,
            filters=filters,
            verify_checksums=verify_checksums,
        )

    @property
    def version(self) -> int | None:  # type: ignore[override]
        """The table version these partitions are built from."""
        return None if self.snapshot is None else self.snapshot.version

    @property
    def table_reading(self) -> dict[str, Any] | None:  # type: ignore[override]
        """How this version's files are read (its schema, field ids, defaults)."""
        return None if self.snapshot is None else self.snapshot.reading()

    def list_files(self) -> list[str]:
        version = (
            self.log.pinned if self.log.pinned is not None else self._from_log(self.log.latest)
        )
        return self.from_listing(version)

    def _from_log(self, read: Callable[[], T]) -> T:
        """``read()`` of the table's metadata; from object storage, retried as the data
        files are (an outage shorter than ``retry_seconds`` only pauses the epoch)."""
        if self.remote is None:
            return read()
        return self.remote.retried(read, f"the metadata of {self.log.name}")

    def listing(self) -> Any:
        assert self.snapshot is not None
        return self.snapshot.version

    def from_listing(self, listing: Any) -> list[str]:
        if self.snapshot is None or self.snapshot.version != listing:
            snapshot = self._from_log(partial(self.log.snapshot, int(listing)))
            self._entries = {self._path(f.path, snapshot): f for f in snapshot.files}
            self.snapshot = snapshot
        if not self.snapshot.files:
            raise SourceNotFoundError(f"{self._where()} has no data files: it holds no rows")
        return list(self._entries)

    def _where(self, snapshot: TableSnapshot | None = None) -> str:
        snapshot = snapshot or self.snapshot
        assert snapshot is not None  # (set by the first listing, before any message)
        what = "version" if snapshot.format == "delta" else "snapshot"
        table = f"the {snapshot.format.capitalize()} table {snapshot.name!r}"
        return f"{table} ({what} {snapshot.version})"

    def _path(self, uri: str, snapshot: TableSnapshot) -> str:
        if self.remote is not None:
            return str(self.remote.filesystem._strip_protocol(uri))
        local = local_path(uri)
        if local is None:
            raise InvalidFileError(
                f"{self._where(snapshot)} names the data file {uri}, a URL, but its metadata "
                "was opened as local files, so tabloader has no storage options to read it "
                "with. Open the table from a catalog or metadata location of the same store "
                "(pyiceberg's load_table, or StaticTable.from_metadata of its s3:// URL), "
                "so that its FileIO reads the data files"
            )
        return local

    def _select(self, files: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
        snapshot = self.snapshot
        assert snapshot is not None
        if self.filters is not None:
            check_filters(
                self.filters, snapshot.keys, what=self._where(), columns=snapshot.schema.names
            )
        entries = [self._entries[p] for p in files]
        keep = [i for i, e in enumerate(entries) if keep_file(self.filters, e.values)]
        self.files_skipped = len(files) - len(keep)
        self.key_types = dict(snapshot.keys)
        if not keep:
            raise SourceNotFoundError(
                f"the filters {describe_filters(self.filters)} leave none of the "
                f"{len(files)} data files of {self._where()}"
            )
        return [files[i] for i in keep], [dict(entries[i].values) for i in keep]

    def _set_columns(self, metadata: list[pq.FileMetaData], values: list[dict[str, Any]]) -> None:
        snapshot = self.snapshot
        assert snapshot is not None
        index: dict[tuple[tuple[str, str], ...], int] = {}
        names: list[dict[str, str]] = []
        file_schema = np.empty(len(metadata), dtype=np.int32)
        for f, md in enumerate(metadata):
            shown = self.display(self.files[f])
            try:
                mapping = snapshot.column_names(md.schema.to_arrow_schema())
            except (SchemaMismatchError, UnsupportedTableError) as err:
                raise type(err)(f"{shown}: {err}") from None
            file_schema[f] = index.setdefault(tuple(mapping.items()), len(names))
            if file_schema[f] == len(names):
                names.append(mapping)
            logged = self._entries[self.files[f]].rows
            if logged is not None and logged != md.num_rows:
                raise InvalidFileError(
                    f"{shown} holds {md.num_rows:,} rows by its footer, but the log of "
                    f"{self._where()} says {logged:,}: the file was replaced after it was "
                    "committed. Restore it, or repair the table"
                )
        self.columns = ColumnSources(
            keys=dict(snapshot.keys),
            values=values,
            file_schema=file_schema,
            names=names,
            types={field.name: field.type for field in snapshot.schema},
            defaults=snapshot.defaults,
        )
        self.schemas = [snapshot.schema]
        self.file_schema = np.zeros(len(metadata), dtype=np.int32)
        self._schema_first_file = [0]
