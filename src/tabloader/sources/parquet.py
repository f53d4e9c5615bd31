"""Parquet files as a source: paths, directories, globs and URLs, one partition per row group.

`ParquetSource` lists what the user named (directories recursively, skipping names
that start with ``_`` or ``.`` and files still being written; Hive ``key=value``
directories become partition keys, which ``filters`` select files by), reads every
file's footer once (in parallel: local files on a few threads, objects with
``max_concurrent_reads`` requests in flight, see `tabloader.sources.remote`) and splits
the files into row groups. A file's identity is its footer digest with what a rewrite
cannot keep: locally its size, modification and change times and inode (no user can set
a change time back), an object's ETag or version; so a file rewritten in place is told
from an unchanged one even when its footer comes out byte for byte the same.
`ParquetSource.relist` lists again for ``refresh=True``, reading only the footers of
files that are new or changed.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tabloader.errors import (
    InvalidFileError,
    ReadError,
    SourceNotFoundError,
)
from tabloader.sources.base import Piece, PieceResult, Source
from tabloader.sources.footers import (
    ColumnStats,
    Leaves,
    column_leaves,
    column_stats,
    constant_stats,
    digest,
    encrypted_footer_message,
    refuse_encrypted,
)
from tabloader.sources.formats import RowGroups
from tabloader.sources.listing import below_root, expand
from tabloader.sources.partitions import (
    ColumnSources,
    Filters,
    check_filters,
    describe_filters,
    hive_values,
    infer_key_types,
    keep_file,
    parse_key_values,
)
from tabloader.sources.remote import (
    RangeFile,
    RemoteStore,
    column_chunk_ranges,
    footer_metadata,
    merge_ranges,
)

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "ParquetSource",
    "identity",
    "read_footer",
    "read_footers",
]

_FOOTER_THREADS = 16


class ParquetSource(Source):
    """Parquet files (paths, directories, globs, URLs), one partition per row group.

    Args:
        specs: What to list: paths, directories, globs or URLs (all of one kind).
        remote: The object store of URLs (None for local files).
        skip_unreadable: Leave out, with a warning, files whose footer cannot be read
            yet (``refresh=True``: still being written); tried again at the next listing.
        filters: Select files by their Hive partition values.
        verify_checksums: Check every page read against the CRC-32 its header carries
            (pyarrow's ``page_checksum_verification``): a damaged page is a
            `ReadError` naming the file and row group, not values.
    """

    kind = "parquet"
    refreshable = True
    columns: ColumnSources
    schemas: list[pa.Schema]
    file_schema: NDArray[np.int32]
    """Per file, the index of its schema in ``schemas``."""
    part_file: NDArray[np.int32]
    """Per partition, the index of its file."""
    part_row_group: NDArray[np.int32]
    """Per partition, its row group in its file."""

    def __init__(
        self,
        specs: list[str],
        remote: RemoteStore | None,
        *,
        skip_unreadable: bool = False,
        filters: Filters | None = None,
        verify_checksums: bool = False,
    ) -> None:
        self.specs = specs
        self.verify_checksums = verify_checksums
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
            files.extend(expand(spec, self.remote, self._roots))
        if self.remote is not None:
            return list(dict.fromkeys(files))
        # a file named twice, under any spelling ("a.parquet", "./a.parquet", its
        # absolute path, a link to it), is read once, as first named
        first: dict[str, str] = {}
        for path in files:
            first.setdefault(os.path.realpath(path), path)
        return list(first.values())

    def listing(self) -> Any:
        """What rank 0 broadcasts so that every rank builds the same partitions."""
        return list(self.files)

    def from_listing(self, listing: Any) -> list[str]:
        """The files of a listing made by `listing` (on rank 0)."""
        return list(listing)

    def relist(self, listing: Any = None) -> None:
        """List again and rebuild: the files listed now, or (``listing``, from rank 0) the
        files it names, none of them skipped."""
        if listing is None:
            self.build(self.list_files())
        else:
            self.build(self.from_listing(listing), skip_unreadable=False)

    def _select(self, files: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
        """The files ``filters`` keep, and their partition values (Hive directories)."""
        texts = [hive_values(below_root(p, self._roots)) for p in files]
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
        stamps = file_stamps(files, self.remote) if known else [None] * len(files)
        fresh = [
            path
            for path, stamp in zip(files, stamps, strict=True)
            if path not in known or stamp is None or known[path][0] != stamp
        ]
        skip = self.skip_unreadable if skip_unreadable is None else skip_unreadable
        read = dict(zip(fresh, read_footers(fresh, self.remote, skip_unreadable=skip), strict=True))
        entries = []
        for path, stamp in zip(files, stamps, strict=True):
            if path in read:
                result = read[path]
                if isinstance(result, InvalidFileError):
                    if path not in self._warned:
                        self._warned.add(path)
                        warnings.warn(
                            f"skipping {self.display(path)} for now: {result}. It is tried "
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

        self.schemas, self._schema_first_file, self.file_schema = _schemas(metadata)
        self.part_file, self.part_row_group, self.rows = _row_groups(metadata)
        value_of = dict(zip(files, values, strict=True))
        self._set_columns(metadata, [value_of[path] for path in self.files])

    def changed(self, index: int) -> bool:
        """Whether a file was deleted, truncated or rewritten since it was listed: its
        stamp is part of its identity, so one ``stat`` (or metadata request, not answered
        from a listing cached earlier) tells. What keeps the stamp from being read (an
        outage, access denied) is raised: it tells nothing of the file."""
        if self.remote is not None:
            self.remote.filesystem.invalidate_cache(self.files[index])
        stamp = file_stamps([self.files[index]], self.remote)[0]
        return stamp is None or stamp != self._stamps[index]

    def identities(self) -> list[dict[str, Any]]:
        """Each file's identity when it was listed (see `identity`)."""
        return [
            identity(path, stamp, footer, self.remote)
            for path, stamp, footer in zip(self.files, self._stamps, self._digests, strict=True)
        ]

    @property
    def filesystem(self) -> Any:
        """This process's fsspec filesystem (None for local files)."""
        return None if self.remote is None else self.remote.filesystem

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_metadata"] = None  # footers are re-parsed (or re-read) on demand
        return state

    def display(self, path: str) -> str:
        return path if self.remote is None else self.remote.display(path)

    def metadata(self, file_index: int) -> pq.FileMetaData:
        if self._metadata is None:
            if self._footers is not None:
                self._metadata = [footer_metadata(f) for f in self._footers]
            else:
                self._metadata = [pq.read_metadata(path) for path in self.files]
        return self._metadata[file_index]

    def describe(self, index: int) -> str:
        f = int(self.part_file[index])
        return f"{self.display(self.files[f])} (row group {int(self.part_row_group[index])})"

    def schema_owner(self, schema_index: int) -> str:
        return self.display(self.files[self._schema_first_file[schema_index]])

    def open(self, file_index: int) -> pq.ParquetFile:
        path = self.files[file_index]
        md = self.metadata(file_index)
        verify = self.verify_checksums
        if self.remote is None:
            return pq.ParquetFile(path, metadata=md, page_checksum_verification=verify)
        handle = self.remote.filesystem.open(path, "rb")
        return pq.ParquetFile(handle, metadata=md, page_checksum_verification=verify)

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
        with pq.ParquetFile(
            cast(IO[bytes], handle),
            metadata=self.metadata(f),
            page_checksum_verification=self.verify_checksums,
        ) as parquet:
            return how.complete(parquet.read_row_group(g, columns=list(how.read)), columns)

    def read(self, index: int, columns: list[str]) -> pa.Table:
        if self.remote is not None:
            return self.decode(index, self.fetch_partition(index, columns), columns)
        f = int(self.part_file[index])
        how = self.columns.file_columns(f, columns)
        with self.open(f) as handle:
            table = handle.read_row_group(int(self.part_row_group[index]), columns=list(how.read))
        return how.complete(table, columns)

    def read_pieces(self, pieces: Sequence[Piece], columns: list[str]) -> Iterator[PieceResult]:
        if self.remote is None:
            yield from super().read_pieces(pieces, columns)
            return
        # Object storage: the byte ranges of the next pieces are fetched in a bounded
        # pool while this thread decodes, so latency overlaps decoding.

        def fetch(piece: Piece, stop: threading.Event) -> Any:
            try:
                return self.fetch_partition(piece[0], columns, stop=stop)
            except ReadError as err:
                return err
            except Exception as err:
                return self.read_failure(piece[0], err)

        for piece, handle in self.remote.prefetch(pieces, fetch):
            partition, first, last = piece
            if isinstance(handle, BaseException):
                yield piece, handle
                continue
            try:
                table = self.decode(partition, handle, columns)
            except Exception as err:
                yield piece, self.read_failure(partition, err)
                continue
            yield piece, table.slice(first, last - first)

    # -- footer statistics, walked here only -----------------------------------------------

    def footer_statistics(self, column: str) -> list[ColumnStats | None]:
        """Per partition, what its footer records about ``column`` (by the name the file
        stores it under), a partition key's constant, or None where the file lacks it."""
        found: list[ColumnStats | None] = []
        leaves: dict[int, Leaves | None] = {}
        columns = self.columns
        layout = zip(self.part_file.tolist(), self.part_row_group.tolist(), strict=True)
        for p, (f, g) in enumerate(layout):
            stored = columns.stored_name(f, column)
            if stored is None and column in columns.types:  # a constant in this file
                found.append(constant_stats(columns.constant(f, column), int(self.rows[p])))
                continue
            metadata = self.metadata(f)
            if f not in leaves:
                leaves[f] = column_leaves(metadata, column if stored is None else stored)
            found.append(None if leaves[f] is None else column_stats(metadata, g, leaves[f]))
        return found

    def null_flags(self, column: str) -> NDArray[np.int8]:
        flags = np.full(len(self.rows), -1, dtype=np.int8)
        for p, stats in enumerate(self.footer_statistics(column)):
            if stats is not None and stats.nulls is not None and not stats.nested:
                flags[p] = 1 if stats.nulls > 0 else 0
        return flags

    def value_ranges(self, column: str) -> list[tuple[Any, Any] | None]:
        return [None if s is None else s.extremes for s in self.footer_statistics(column)]

    def partition_bytes(self) -> NDArray[np.int64]:
        layout = zip(self.part_file.tolist(), self.part_row_group.tolist(), strict=True)
        sizes = [self.metadata(f).row_group(g).total_byte_size for f, g in layout]
        return np.array(sizes, dtype=np.int64)

    # -- files ------------------------------------------------------------------------------

    def schema_files(self, schema_index: int) -> list[str]:
        return [self.files[f] for f in np.flatnonzero(self.file_schema == schema_index)]

    def file_of(self, partition: int) -> int:
        return int(self.part_file[partition])

    def partition_values(self, partition: int) -> dict[str, Any]:
        if not self.columns.keys:
            return {}
        values = self.columns.values[int(self.part_file[partition])]
        return {k: values.get(k) for k in self.columns.keys}

    @property
    def format(self) -> RowGroups:
        return RowGroups(self)


def _schemas(metadata: list[pq.FileMetaData]) -> tuple[list[pa.Schema], list[int], Any]:
    """The distinct Arrow schemas of the files' footers, the first file of each, and each
    file's schema (its index among them)."""
    ids: dict[pa.Schema, int] = {}
    schemas: list[pa.Schema] = []
    first_file: list[int] = []
    file_schema = np.empty(len(metadata), dtype=np.int32)
    for f, md in enumerate(metadata):
        schema = md.schema.to_arrow_schema().remove_metadata()
        sid = ids.setdefault(schema, len(ids))
        if sid == len(schemas):
            schemas.append(schema)
            first_file.append(f)
        file_schema[f] = sid
    return schemas, first_file, file_schema


def _row_groups(metadata: list[pq.FileMetaData]) -> tuple[Any, Any, Any]:
    """Each non-empty row group of the files, a partition: its file, its index in the file
    and its rows."""
    file_idx, rg_idx, rows = [], [], []
    for f, md in enumerate(metadata):
        for g in range(md.num_row_groups):
            n = md.row_group(g).num_rows
            if n > 0:
                file_idx.append(f)
                rg_idx.append(g)
                rows.append(n)
    return (
        np.asarray(file_idx, dtype=np.int32),
        np.asarray(rg_idx, dtype=np.int32),
        np.asarray(rows, dtype=np.int64),
    )


def file_stamps(files: list[str], remote: RemoteStore | None) -> list[Any]:
    """What tells a changed file from an unchanged one without reading it, or None
    (gone): for local files the size, modification and change times and inode (a
    rewrite changes the change time even when the modification time is put back, as
    ``cp -p`` and ``rsync -t`` do); for objects the size and the ETag, version or
    generation the store reports."""

    def stamp(path: str) -> Any:
        try:
            return _local_stamp(os.stat(path)) if remote is None else remote.stamp(path)
        except (FileNotFoundError, NotADirectoryError, SourceNotFoundError):
            return None  # gone; what else fails (an outage, access denied) is raised

    if remote is None or len(files) < 2:
        return [stamp(path) for path in files]
    # objects: one metadata request each, max_concurrent_reads at a time (a table of
    # thousands of files is checked at every refreshing epoch)
    with ThreadPoolExecutor(min(remote.max_concurrent_reads, len(files))) as pool:
        return list(pool.map(stamp, files))


def identity(path: str, stamp: Any, digest: str, remote: RemoteStore | None) -> dict[str, Any]:
    """A file's identity: its footer digest and its whole stamp (see `file_stamps`).

    The footer alone is not enough: a file rewritten with one column's values
    permuted against the others can have a footer identical byte for byte (same
    sizes, same statistics). A rewrite cannot keep a local file's change time or
    inode, nor an object's ETag or version, so those are part of it too.
    """
    if remote is None:
        size, mtime_ns, ctime_ns, inode = stamp
        return {
            "path": os.path.abspath(path),
            "size": size,
            "mtime_ns": mtime_ns,
            "ctime_ns": ctime_ns,
            "inode": inode,
            "footer": digest,
        }
    return {
        "path": remote.display(path),
        "size": stamp[0],
        "version": list(stamp[1:]),
        "footer": digest,
    }


def read_footer(
    path: str, remote: RemoteStore | None
) -> tuple[Any, int, pq.FileMetaData, bytes | None, str]:
    """A file's stamp (see `file_stamps`), size, metadata, footer bytes (kept
    for remote files only) and footer digest, the stamp and the footer from the same
    opened file."""
    shown = path if remote is None else remote.display(path)
    stamp: tuple[Any, ...]
    try:
        if remote is None:
            stamp, footer = _local_footer(path)
            size = stamp[0]
        else:
            stamp = remote.stamp(path)
            size = stamp[0]
            footer = remote.read_footer(path, size) if size else b""
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
        raise InvalidFileError(f"{shown} is empty (0 bytes): remove it, or re-write it as parquet")
    if footer.endswith(b"PARE"):
        raise InvalidFileError(encrypted_footer_message(shown))
    try:
        metadata = footer_metadata(footer)
    except (pa.ArrowException, ValueError, OSError) as err:
        raise InvalidFileError(
            f"{shown} is not a readable parquet file ({err}); it may be truncated, still "
            "being written, or in another format"
        ) from err
    refuse_encrypted(shown, footer, metadata)
    kept = footer if remote is not None else None
    return stamp, size, metadata, kept, digest(footer)


def read_footers(
    files: list[str], remote: RemoteStore | None, *, skip_unreadable: bool
) -> list[Any]:
    """Each file's `read_footer`, read in parallel, or, with
    ``skip_unreadable``, the [`InvalidFileError`][tabloader.errors.InvalidFileError] that
    reading it raised."""

    def read(path: str) -> Any:
        try:
            return read_footer(path, remote)
        except (InvalidFileError, SourceNotFoundError) as err:
            if not skip_unreadable:
                raise
            return InvalidFileError(str(err))

    if len(files) <= 1:
        return [read(f) for f in files]
    threads = _FOOTER_THREADS if remote is None else remote.max_concurrent_reads
    with ThreadPoolExecutor(min(threads, len(files))) as pool:
        return list(pool.map(read, files))


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
        if tail[4:] not in (b"PAR1", b"PARE"):  # (PARE: an encrypted footer)
            raise pa.ArrowInvalid("Parquet magic bytes not found in footer")
        length = int.from_bytes(tail[:4], "little")
        if length + 12 > size:
            raise pa.ArrowInvalid("the footer is longer than the file")
        f.seek(size - 8 - length)
        return stamp, f.read(length + 8)


def _with_keys(schema: pa.Schema, keys: dict[str, pa.DataType]) -> pa.Schema:
    """``schema`` with the partition keys it does not store appended."""
    for name, key_type in keys.items():
        if schema.get_field_index(name) < 0:
            schema = schema.append(pa.field(name, key_type))
    return schema
