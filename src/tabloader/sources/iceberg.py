"""Apache Iceberg: the data files a snapshot's scan plans, read with ``pyiceberg``.

An Iceberg table's metadata names, per snapshot, manifests that list its data files with
their partition tuples and record counts. `IcebergLog` asks pyiceberg (imported
only here) to plan a scan of a snapshot and keeps what tabloader needs: each parquet
file's path, identity-partition values and row count, and the schema's field ids, by
which a file's columns are matched (a column renamed after the file was written loads
under its current name; one added later is its ``initial-default`` there, or null). A
file written without field ids (``add_files`` of plain parquet) is matched through the
table's name mapping, as Iceberg's readers do, and refused without one.

Delete files are refused, not applied: position deletes and equality deletes (from
merge-on-read writers) mean a file holds rows the snapshot does not, and how many only
reading them tells. Compact the table, or write it copy-on-write.
"""

from __future__ import annotations

import datetime
import os
import re
from typing import Any

import pyarrow as pa

from tabloader import _deps
from tabloader.errors import (
    InvalidArgumentError,
    ReadError,
    SourceNotFoundError,
    UnsupportedTableError,
)
from tabloader.options import int_at_least
from tabloader.sources.partitions import TableFile, TableLog, TableSnapshot, in_load_order

__all__ = ["IcebergLog", "fsspec_options", "import_pyiceberg", "local_path", "static_table"]

_IO_OPTIONS = {
    "key": ("s3.access-key-id", "client.access-key-id"),
    "secret": ("s3.secret-access-key", "client.secret-access-key"),
    "token": ("s3.session-token", "client.session-token"),
}
"""s3fs's option, and the FileIO properties that give it (``s3.*`` first, then the
``client.*`` ones every client of the table shares, as pyiceberg reads them)."""


def import_pyiceberg() -> Any:
    """The ``pyiceberg`` module, or an ImportError saying what to install."""
    return _deps.require("pyiceberg")


def fsspec_options(properties: dict[str, str]) -> dict[str, Any]:
    """s3fs options for the data files, from a pyiceberg FileIO's properties.

    Examples:
        >>> options = fsspec_options({"s3.endpoint": "http://127.0.0.1:9000",
        ...     "s3.access-key-id": "k", "s3.secret-access-key": "s", "s3.region": "eu-west-1"})
        >>> options["key"], options["client_kwargs"]["region_name"]
        ('k', 'eu-west-1')
        >>> fsspec_options({"client.access-key-id": "k2", "client.secret-access-key": "s2"})
        {'key': 'k2', 'secret': 's2'}
    """
    out: dict[str, Any] = {}
    for ours, theirs in _IO_OPTIONS.items():
        given = next((properties[t] for t in theirs if t in properties), None)
        if given is not None:
            out[ours] = given
    client = {}
    if "s3.endpoint" in properties:
        client["endpoint_url"] = properties["s3.endpoint"]
    region = properties.get("s3.region") or properties.get("client.region")
    if region:
        client["region_name"] = region
    if client:
        out["client_kwargs"] = client
    return out


def static_table(location: str) -> Any:
    """The pyiceberg ``StaticTable`` of a metadata file, or of a local table directory (the
    metadata file its ``metadata/version-hint.text`` names, else the one with the highest
    version number), with tabloader's errors for metadata that is missing or that
    pyiceberg cannot parse."""
    if not location.endswith(".metadata.json") and "://" not in location:
        location = _newest_metadata(location)
    pyiceberg = import_pyiceberg()
    from pyiceberg.table import StaticTable

    try:
        return StaticTable.from_metadata(location)
    except FileNotFoundError as err:
        raise SourceNotFoundError(
            f"the Iceberg metadata {location} does not exist ({err}); give the table's "
            "*.metadata.json file, or a directory holding metadata/"
        ) from None
    except Exception as err:
        if type(err).__name__ != "ValidationError":  # pydantic's, through pyiceberg
            raise
        found = str(err).splitlines()
        detail = "; ".join(line.strip() for line in found[1:3]) or found[0]
        raise UnsupportedTableError(
            f"{location} is Iceberg metadata pyiceberg {pyiceberg.__version__} cannot read "
            f"({detail}). Metadata written by an early Iceberg writer (format version 1, "
            "snapshots listing manifests instead of a manifest list) must be rewritten: "
            "any commit by a current Iceberg writer (Spark, Trino, pyiceberg) writes "
            "metadata that reads"
        ) from None


def _newest_metadata(table_directory: str) -> str:
    """The metadata file of an Iceberg table directory with the highest version number."""
    folder = os.path.join(table_directory, "metadata")
    hint = os.path.join(folder, "version-hint.text")
    if os.path.isfile(hint):
        return table_directory  # pyiceberg follows the hint itself
    names = [n for n in os.listdir(folder) if n.endswith(".metadata.json")]
    if not names:
        raise SourceNotFoundError(f"{folder} holds no *.metadata.json file")

    def number(name: str) -> int:
        digits = re.match(r"v?(\d+)", name)
        return int(digits[1]) if digits else -1

    return os.path.join(folder, max(names, key=lambda n: (number(n), n)))


def local_path(uri: str) -> str | None:
    """The local path of a ``file:`` URI or a plain path; None for other URLs.

    Examples:
        >>> local_path("file:///tmp/wh/t/data/a.parquet"), local_path("s3://b/a.parquet")
        ('/tmp/wh/t/data/a.parquet', None)
    """
    if uri.startswith("file://"):
        return uri.removeprefix("file://")
    if uri.startswith("file:"):
        return uri.removeprefix("file:")
    return None if "://" in uri else uri


class IcebergLog(TableLog):
    """The metadata of one Iceberg table: its current snapshot, and a snapshot's files.

    Args:
        table: a ``pyiceberg.table.Table``, or a ``(catalog, identifier)`` pair.
        snapshot_id: the snapshot to load (time travel, under the schema it was written
            with); None follows the current snapshot, under the current schema.
    """

    format = "iceberg"
    credentials = (
        "the table's FileIO properties (s3.access-key-id and s3.secret-access-key, or "
        "client.access-key-id and client.secret-access-key)"
    )

    def __init__(self, table: Any, *, snapshot_id: int | None) -> None:
        import_pyiceberg()
        from pyiceberg.table import StaticTable, Table

        if isinstance(table, tuple) and len(table) == 2:
            catalog, identifier = table
            if not hasattr(catalog, "load_table"):
                raise InvalidArgumentError(
                    f"from_iceberg takes a pyiceberg Table or a (catalog, identifier) pair; "
                    f"{type(catalog).__name__} is not a pyiceberg catalog"
                )
            try:
                table = catalog.load_table(identifier)
            except Exception as err:
                if type(err).__name__ in ("NoSuchTableError", "NoSuchNamespaceError"):
                    raise SourceNotFoundError(
                        f"the Iceberg catalog {getattr(catalog, 'name', catalog)!r} has no "
                        f"table {identifier!r} ({err})"
                    ) from err
                raise
        if not isinstance(table, Table):
            raise InvalidArgumentError(
                "from_iceberg takes a pyiceberg Table (catalog.load_table(...)) or a "
                f"(catalog, identifier) pair, got {type(table).__name__}"
            )
        self._table: Any = table
        self.static = isinstance(table, StaticTable)
        """A metadata file's table alone: it never learns of a newer snapshot."""
        self.name = ".".join(table.name())
        self.pinned = None if snapshot_id is None else int_at_least(snapshot_id, 0, "snapshot_id")
        if self.pinned is not None and table.snapshot_by_id(self.pinned) is None:
            known = [s.snapshot_id for s in table.snapshots()]
            raise InvalidArgumentError(
                f"the Iceberg table {self.name} has no snapshot {self.pinned}; its snapshots: "
                f"{known[-10:]}{' (the last 10)' if len(known) > 10 else ''}"
            )
        location = str(table.location())
        _refuse_unresolved(self.name, location, str(table.metadata_location))
        self.url = None if local_path(location) is not None else location
        self.storage_options = fsspec_options(dict(table.io.properties))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_table"] = None  # a catalog's connection does not pickle
        return state

    def _live(self) -> Any:
        if self._table is None:
            raise UnsupportedTableError(
                f"the Iceberg table {self.name} was copied into another process without its "
                "catalog; only the process that created the Dataset reads new snapshots"
            )
        return self._table

    def latest(self) -> int:
        from pyiceberg.table import StaticTable

        table = self._live()
        if not isinstance(table, StaticTable):  # a metadata file alone has no newer version
            table.refresh()
        current = table.current_snapshot()
        if current is None:
            raise SourceNotFoundError(
                f"the Iceberg table {self.name} has no snapshot yet: append data first"
            )
        return int(current.snapshot_id)

    def snapshot(self, version: int) -> TableSnapshot:
        from pyiceberg.io.pyarrow import schema_to_pyarrow
        from pyiceberg.manifest import FileFormat
        from pyiceberg.table import StaticTable
        from pyiceberg.transforms import IdentityTransform

        table = self._live()
        where = f"the Iceberg table {self.name} (snapshot {version})"
        if table.snapshot_by_id(version) is None and not isinstance(table, StaticTable):
            table.refresh()  # committed since this process last looked (another rank's)
        if table.snapshot_by_id(version) is None:
            raise SourceNotFoundError(
                f"{where} does not exist (any more): snapshots expire, and a snapshot id is "
                "only meaningful for its own table"
            )
        scan = table.scan(snapshot_id=version)
        try:
            tasks = list(scan.plan_files())
        except ValueError as err:
            if "equality delete" in str(err).lower():
                raise UnsupportedTableError(_deletes_message(where, "equality")) from err
            raise
        except OSError as err:
            if not isinstance(err, (FileNotFoundError, PermissionError)):
                # a storage service failure (a 503, a cut connection): the caller retries
                # it within retry_seconds, as it does reading the data files
                raise ReadError(f"could not read the manifests of {where}: {err}") from err
            manifests = table.snapshot_by_id(version).manifest_list
            raise SourceNotFoundError(
                f"{where}: its manifest list {manifests}, or a manifest it names, cannot be "
                f"read ({err}). The table's metadata directory is incomplete: copied without "
                "all of its files, or cleaned up by something other than the table's own "
                "snapshot expiry. Restore the files, or load another snapshot (snapshot_id=)"
            ) from None
        # Time travel reads a snapshot under the schema it was written with; the current
        # snapshot under the current schema, so renamed columns load under their new names.
        iceberg_schema = scan.projection() if self.pinned is not None else table.schema()
        schema = schema_to_pyarrow(iceberg_schema, include_field_ids=False)
        specs = table.specs()
        # A partition of a nested field (identity of info.day) is no column of the
        # table's: only a top-level field's values are a partition key.
        top_level = {f.field_id for f in iceberg_schema.fields}
        files: list[TableFile] = []
        key_sets: list[set[str]] = []
        for task in tasks:
            data = task.file
            if task.delete_files:
                raise UnsupportedTableError(_deletes_message(where, "position", data.file_path))
            if data.file_format != FileFormat.PARQUET:
                raise UnsupportedTableError(
                    f"{where} holds the {data.file_format.name} data file {data.file_path}; "
                    "tabloader reads parquet data files only"
                )
            values: dict[str, Any] = {}
            for i, part in enumerate(specs[data.spec_id].fields):
                if not isinstance(part.transform, IdentityTransform):
                    continue
                if part.source_id not in top_level:
                    continue  # a nested field's, or a partition source column since dropped
                source = iceberg_schema.find_field(part.source_id)
                arrow_type = schema.field(source.name).type
                values[source.name] = _python_value(data.partition[i], arrow_type)
            key_sets.append(set(values))
            files.append(TableFile(path=data.file_path, values=values, rows=data.record_count))
        if key_sets:
            common = set.intersection(*key_sets)
        else:
            common = {
                iceberg_schema.find_field(p.source_id).name
                for p in table.spec().fields
                if isinstance(p.transform, IdentityTransform) and p.source_id in top_level
            }
        keys = {f.name: f.type for f in schema if f.name in common}
        field_ids = {f.name: f.field_id for f in iceberg_schema.fields}
        defaults = {
            f.name: _python_value(f.initial_default, schema.field(f.name).type)
            for f in iceberg_schema.fields
            if getattr(f, "initial_default", None) is not None
        }
        mapping = table.name_mapping()
        name_ids = (
            None
            if mapping is None
            else {name: f.field_id for f in mapping for name in f.names if f.field_id is not None}
        )
        return TableSnapshot(
            "iceberg", self.name, version, in_load_order(files), schema, keys,
            field_ids=field_ids,
            stored_keys=True,
            name_ids=name_ids,
            defaults=defaults,
        )  # fmt: skip


def _refuse_unresolved(name: str, location: str, metadata: str) -> None:
    """Refuse a table whose metadata names its files by relative paths (a table written
    with a relative warehouse) when they do not resolve from the current directory, as
    pyiceberg resolves them, naming the directory they resolve from where the metadata
    file's own path tells it.

    Examples:
        >>> _refuse_unresolved("db.t", "s3://b/t", "s3://b/t/metadata/v1.metadata.json")
    """
    if "://" in location or location.startswith("file:") or os.path.isabs(location):
        return
    if os.path.isdir(location):
        return
    table_dir = os.path.dirname(os.path.dirname(os.path.abspath(local_path(metadata) or ".")))
    base = table_dir.removesuffix(location.rstrip("/")) if table_dir.endswith(location) else ""
    where = (
        f"run from {base.rstrip('/') or '/'}"
        if base
        else "run from the directory it was written from"
    )
    raise SourceNotFoundError(
        f"the Iceberg table {name} names its files by paths relative to the directory it "
        f"was written from (its location is {location!r}), and they do not resolve from the "
        f"current directory, {os.getcwd()}: {where}, or rewrite its metadata with "
        "absolute locations"
    )


def _python_value(value: Any, arrow_type: pa.DataType) -> Any:
    """A partition tuple's value (or a column's default) as Python: Iceberg keeps dates
    as days and timestamps as microseconds since the epoch in manifests."""
    if value is None or not isinstance(value, int) or isinstance(value, bool):
        return value
    if pa.types.is_date32(arrow_type):
        return datetime.date(1970, 1, 1) + datetime.timedelta(days=value)
    if pa.types.is_timestamp(arrow_type) or pa.types.is_time(arrow_type):
        storage = pa.int64() if arrow_type.bit_width == 64 else pa.int32()
        return pa.array([value], storage).cast(arrow_type)[0].as_py()
    return value


def _deletes_message(where: str, kind: str, path: str | None = None) -> str:
    """The refusal of a snapshot with delete files.

    Examples:
        >>> _deletes_message("the Iceberg table db.t (snapshot 1)", "position", "a.parquet")[:61]
        'the Iceberg table db.t (snapshot 1) has position delete files'
    """
    on = f" (on {path})" if path else ""
    return (
        f"{where} has {kind} delete files{on}: rows were deleted without rewriting the data "
        "files, and tabloader does not apply delete files, so it would deliver deleted rows. "
        "Rewrite the affected files first (Spark: CALL system.rewrite_data_files with "
        "delete-file-threshold, or rewrite_position_delete_files), or write the table with "
        "write.delete.mode=copy-on-write"
    )
