"""The `Source` protocol: what a [`Dataset`][tabloader.Dataset] needs from where its rows live.

A source splits its rows into partitions (parquet row groups, slices of a table, Dask
partitions), says how many rows each holds and what schema its columns have, reads any
partition's columns into an Arrow table, and tells what it knows without reading (footer
statistics, file identities). Each kind is one module of `tabloader.sources`:
``parquet.py`` (files, directories, globs, URLs, Hive keys, refresh), ``snapshot.py``
(a Delta or Iceberg table version over the parquet source), ``table.py`` (pyarrow,
pandas, polars) and ``dask.py``. Adding a kind is one more module implementing this
protocol; nothing outside `tabloader.sources` names a source class.

Members a kind does not have keep the defaults here: no files, no footers, nothing to
refresh, read as Arrow tables alone. What a reader needs beyond Arrow tables (a parquet
reader on a GPU, a Dask partition computed there) is the source's `format`
(`tabloader.sources.formats`), which the readers read through without asking what kind
of source they read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from tabloader.columns import closest_name, common_type
from tabloader.errors import (
    ColumnNotFoundError,
    InvalidArgumentError,
    InvalidFileError,
    ReadError,
    SchemaMismatchError,
)
from tabloader.sources.formats import Format, Piece

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from tabloader.sources.footers import ColumnStats
    from tabloader.sources.partitions import ColumnSources, Filters

__all__ = ["Piece", "PieceResult", "Source", "read_error"]

PieceResult = tuple[Piece, "pa.Table | BaseException"]
"""A piece with its rows, or the error reading it raised."""


def read_error(where: str, error: BaseException, *, changed: str | None = None) -> ReadError:
    """The error for a partition that failed to read or decode (any backend); ``changed``
    names what a file deleted or rewritten since it was listed belongs to (``"dataset"``
    or the table format), which is then said instead of damage."""
    if changed is None and isinstance(error, PermissionError):
        return ReadError(
            f"could not read {where}: access was denied ({type(error).__name__}: {error}). "
            "Check the credentials (storage_options, or the environment) and that they may "
            "read it"
        )
    if changed is None:
        return ReadError(
            f"could not read {where}: {type(error).__name__}: {error}. The file may be "
            "truncated or corrupt; re-create it or remove it from the dataset."
        )
    remedy = (
        "a later version of the table removed it and a vacuum or expiry deleted it"
        if changed in ("delta", "iceberg")
        else "a file the dataset holds must stay as it was while it is read"
    )
    return ReadError(
        f"could not read {where}: the file was deleted or rewritten since the dataset "
        f"listed it ({remedy}; {type(error).__name__}: {error}). Create the Dataset again, "
        "or pass refresh=True to list the files at each epoch (a file listed must then "
        "stay until its epoch ends), or on_missing='skip' to go on without its rows."
    )


class Source(Protocol):
    """Where a dataset's rows come from, split into partitions.

    Attributes:
        rows: Rows of every partition (int64), in dataset order.
        schemas: The distinct Arrow schemas, the first file's first.
        files: The files, in load order (empty for in-memory sources).
        kind: What the source is, for ``repr(dataset)``: ``"parquet"``, ``"table"``, ...
        refreshable: Whether `relist` can list it again (``refresh=True``,
            ``on_missing="skip"``, ``filters`` and ``verify_checksums`` apply only then).
        verify_checksums: Whether pages are checked against the checksums their
            headers carry when read (parquet files).
    """

    rows: NDArray[np.int64]
    schemas: list[pa.Schema]
    files: list[str]
    kind: str
    refreshable: bool = False
    verify_checksums: bool = False
    columns: ColumnSources | None = None
    """Where each column comes from, file by file (parquet sources)."""
    filters: Filters | None = None
    """The filters applied, in disjunctive normal form (parquet sources)."""
    files_skipped: int = 0
    """Files the filters skipped at the last listing."""
    version: int | None = None
    """The table version loaded (Delta and Iceberg sources)."""
    table_format: str | None = None
    """``"delta"`` or ``"iceberg"`` for a table's source."""
    table_reading: dict[str, Any] | None = None
    """How a table's files are read at the version loaded (see
    `tabloader.sources.partitions.TableSnapshot.reading`); None for other sources."""
    filesystem: Any = None
    """This process's fsspec filesystem (object storage only)."""

    # -- what every source does ------------------------------------------------------------

    def describe(self, index: int) -> str:
        """Where partition ``index`` lives, for messages."""
        ...

    def schema_owner(self, schema_index: int) -> str:
        """Where schema ``schema_index`` was found (its first file), for messages."""
        ...

    def read(self, index: int, columns: list[str]) -> pa.Table:
        """Partition ``index``'s ``columns`` as an Arrow table."""
        ...

    def schema_files(self, schema_index: int) -> list[str]:
        """The files of schema ``schema_index`` (none for in-memory sources)."""
        return []

    def column_types(self, columns: Sequence[str]) -> dict[str, pa.DataType]:
        """Arrow type of each column, checked to be present and of one type in every schema
        (widths that differ widen; see `tabloader.columns.common_type`)."""
        types: dict[str, pa.DataType] = {}
        for k, schema in enumerate(self.schemas):
            for name in columns:
                index = schema.get_field_index(name)
                found = len(schema.get_all_field_indices(name))
                if found > 1:
                    raise InvalidFileError(
                        f"{self.schema_owner(k)} has {found} columns named {name!r}; "
                        "tabloader reads columns by name. Rewrite the file with unique "
                        "column names"
                    )
                if index < 0:
                    close = closest_name(name, schema.names)
                    raise ColumnNotFoundError(
                        f"column {name!r} is not in {self.schema_owner(k)}"
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
                    first = self.schemas[0].field(name).type
                    raise SchemaMismatchError(
                        f"column {name!r} is {field_type} in {self.schema_owner(k)} but "
                        f"{first} in {self.schema_owner(0)}: files may store a column "
                        "with other widths (int32 and int64, float and double), not with "
                        "conflicting types. Rewrite the odd files with a common schema "
                        "(tabloader convert writes one)."
                    )
        return types

    def read_pieces(self, pieces: Sequence[Piece], columns: list[str]) -> Iterator[PieceResult]:
        """Each piece with its rows, or the [`ReadError`][tabloader.errors.ReadError] reading
        it raised, in order; a source on object storage fetches the next ones meanwhile."""
        for piece in pieces:
            partition, first, stop = piece
            try:
                table = self.read(partition, columns)
            except (ReadError, SchemaMismatchError) as err:  # said in tabloader's words
                yield piece, err
                continue
            except Exception as err:
                yield piece, self.read_failure(partition, err)
                continue
            yield piece, table.slice(first, stop - first)

    # -- what the footers say (nothing, without footers) ------------------------------------

    def footer_statistics(self, column: str) -> list[ColumnStats | None] | None:
        """Per partition, what its footer records about ``column`` (None where the file
        does not store it); None for a source without footers."""
        return None

    def null_flags(self, column: str) -> NDArray[np.int8]:
        """Per partition: 1 if ``column`` holds nulls, 0 if none, -1 unknown."""
        return np.full(len(self.rows), -1, dtype=np.int8)

    def value_ranges(self, column: str) -> list[tuple[Any, Any] | None]:
        """Per partition: the smallest and largest value of ``column``, None unknown."""
        return [None] * len(self.rows)

    def partition_bytes(self) -> NDArray[np.int64] | None:
        """Per partition, its decoded size as the footer records it (None: no footers)."""
        return None

    # -- files: what they are, whether they changed, how to list them again -----------------

    def identities(self) -> list[dict[str, Any]]:
        """What each file's content was when it was listed (see
        [`Dataset.file_identities`][tabloader.Dataset.file_identities])."""
        return []

    def content_digest(self) -> str | None:
        """For a source without files, a digest of its rows that another source with
        other rows does not share (None: a source of files, which their identities
        describe)."""
        return None

    def file_of(self, partition: int) -> int:
        """The index of the file partition ``partition`` is in (-1: not from a file)."""
        return -1

    def changed(self, file_index: int) -> bool:
        """Whether file ``file_index`` was deleted or rewritten since it was listed."""
        return False

    def known_changed(self, file_index: int) -> bool:
        """Whether file ``file_index`` is known to have been deleted or rewritten since
        it was listed: not when its stamp cannot be read (an outage, access denied),
        which says nothing of the file."""
        try:
            return file_index >= 0 and self.changed(file_index)
        except Exception:
            return False

    def read_failure(self, partition: int, error: BaseException, where: str = "") -> ReadError:
        """The [`ReadError`][tabloader.errors.ReadError] for ``partition`` failing to read
        (``where``: its description, by default `describe`'s), caused by ``error``: a
        file deleted or rewritten since it was listed is said to be so, not damaged."""
        changed = self.known_changed(self.file_of(partition))
        failure = read_error(
            where or self.describe(partition),
            error,
            changed=(self.table_format or "dataset") if changed else None,
        )
        failure.__cause__ = error
        return failure

    def display(self, path: str) -> str:
        """``path`` as messages show it (a URL for object storage)."""
        return path

    def listing(self) -> Any:
        """What rank 0 broadcasts so that every rank builds the same partitions."""
        raise InvalidArgumentError(f"a {self.kind} source is not listed again")

    def relist(self, listing: Any = None) -> None:
        """List again and rebuild the partitions (from rank 0's ``listing`` if given)."""
        raise InvalidArgumentError(f"a {self.kind} source is not listed again")

    def partition_values(self, partition: int) -> dict[str, Any]:
        """The partition keys' values for every row of ``partition``."""
        return {}

    # -- how the readers read it ------------------------------------------------------------

    @property
    def format(self) -> Format:
        """How the readers read the partitions besides `read`: the format object a GPU
        reads through (see `tabloader.sources.formats`)."""
        return Format()

    def check_worker_processes(self, start_method: Any) -> None:
        """Raise [`InvalidArgumentError`][tabloader.errors.InvalidArgumentError] when worker
        processes started with ``start_method`` (a start method or context, None for the
        default) could not read this source."""
        return None


def _list_names(names: Sequence[str], limit: int = 30) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")
