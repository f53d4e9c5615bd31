"""Delta Lake: the active files of a table version, read from its log with ``deltalake``.

A Delta table is a directory of parquet files and a ``_delta_log`` saying which of them
make up each version: files added, and files removed by an overwrite, a delete or a
compaction. `DeltaLog` asks delta-rs (the ``deltalake`` package, imported only
here) for a version's add actions: each file's path, partition values and row count.

Refused, with an error naming the feature, because the files would not hold the rows
the table does: deletion vectors on any active file, column mapping in use (a
``delta.columnMapping.mode`` other than ``"none"``: files store columns under physical
names), and reader features this module does not know.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from tabloader import _deps
from tabloader.errors import (
    InvalidArgumentError,
    ReadError,
    SourceNotFoundError,
    TabloaderError,
    UnsupportedTableError,
)
from tabloader.options import int_at_least
from tabloader.sources.partitions import TableFile, TableLog, TableSnapshot, in_load_order

__all__ = ["HONOURED_READER_FEATURES", "DeltaLog", "delta_storage_options", "import_deltalake"]

HONOURED_READER_FEATURES = frozenset(
    {
        "columnMapping",  # honoured while delta.columnMapping.mode is "none"; checked
        "deletionVectors",  # honoured while no active file has one; checked per version
        "timestampNtz",
        "typeWidening",  # a file's narrower type reads as the table's (checked per file)
        "typeWidening-preview",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "variantType",
        "variantType-preview",
    }
)
"""Delta reader features under which a version's files hold exactly its rows."""
MAX_READER_VERSION = 3


def import_deltalake() -> Any:
    """The ``deltalake`` module, or an ImportError saying what to install."""
    return _deps.require("deltalake")


def delta_storage_options(protocol: str, options: dict[str, Any]) -> dict[str, str]:
    """delta-rs's options for the log, from the fsspec ``storage_options`` of the files.

    For ``s3://``, s3fs's ``key``, ``secret``, ``token``, ``anon``, ``profile``,
    ``endpoint_url`` and ``client_kwargs`` (``endpoint_url``, ``region_name``) become
    delta-rs's ``AWS_*`` settings; other protocols pass none (delta-rs then reads the
    environment's credentials, as it does by default).

    Examples:
        >>> delta_storage_options("s3", {"key": "k", "secret": "s",
        ...     "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}})["AWS_ALLOW_HTTP"]
        'true'
    """
    if protocol not in ("s3", "s3a"):
        return {}
    client = options.get("client_kwargs") or {}
    pairs = {
        "AWS_ACCESS_KEY_ID": options.get("key"),
        "AWS_SECRET_ACCESS_KEY": options.get("secret"),
        "AWS_SESSION_TOKEN": options.get("token"),
        "AWS_PROFILE": options.get("profile"),
        "AWS_ENDPOINT_URL": options.get("endpoint_url") or client.get("endpoint_url"),
        "AWS_REGION": client.get("region_name") or options.get("region_name"),
    }
    out = {k: str(v) for k, v in pairs.items() if v is not None}
    if options.get("anon"):
        out["AWS_SKIP_SIGNATURE"] = "true"
    if out.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        out["AWS_ALLOW_HTTP"] = "true"
    return out


def _plain(err: Exception) -> str:
    """delta-rs's message without the terminal colours it adds."""
    return re.sub(r"\x1b\[[0-9;]*m", "", str(err))


_DENIED = re.compile(
    r"lacked the necessary privileges|AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch"
    r"|\b(401 Unauthorized|403 Forbidden)\b"
)
"""What delta-rs (object_store) says of denied access, whose retries cannot succeed."""
_NO_BUCKET = re.compile(r"NoSuchBucket|ContainerNotFound|bucket does not exist")
"""... and of a bucket (container) that does not exist."""


class DeltaLog(TableLog):
    """The log of one Delta table: its latest version, and the files of a version.

    Args:
        uri: the table's directory: a local path or a URL (``s3://bucket/table``).
        version: the version to load (time travel); None follows the latest.
        storage_options: fsspec options for a URL's files; the log gets their delta-rs
            equivalent (`delta_storage_options`).
    """

    format = "delta"

    def __init__(
        self, uri: str | os.PathLike[str], *, version: int | None, storage_options: Any
    ) -> None:
        if not isinstance(uri, (str, os.PathLike)):
            raise InvalidArgumentError(
                f"from_delta takes the table's path or URL, got {type(uri).__name__}"
            )
        self.name = os.fspath(uri)
        if storage_options is not None and not isinstance(storage_options, dict):
            raise InvalidArgumentError(
                f"storage_options must be a dict, got {type(storage_options).__name__}"
            )
        self.pinned = None if version is None else int_at_least(version, 0, "version")
        remote = "://" in self.name and not self.name.startswith("file://")
        self.url = self.name.rstrip("/") if remote else None
        self.storage_options = dict(storage_options or {})
        protocol = self.name.split("://", 1)[0] if remote else "file"
        self._log_options = delta_storage_options(protocol, self.storage_options)
        if not remote:
            self.name = os.path.expanduser(self.name.removeprefix("file://"))
        self._latest: Any = None  # the DeltaTable at the newest version seen
        import_deltalake()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_latest"] = None  # delta-rs objects do not pickle; a copy reopens the log
        return state

    def _open(self, version: int | None) -> Any:
        deltalake = import_deltalake()
        from deltalake.exceptions import TableNotFoundError

        try:
            return deltalake.DeltaTable(
                self.name, version=version, storage_options=self._log_options or None
            )
        except TableNotFoundError as err:
            if version is not None:  # (delta-rs says so of a version cleaned up, too)
                self._refuse_version(version, err)
            raise SourceNotFoundError(
                f"{self.name!r} is not a Delta table: it has no readable _delta_log ({err}). "
                "Check the path (the table's directory, the parent of _delta_log) and, for "
                "a URL, the storage_options"
            ) from err
        except Exception as err:
            if version is not None and "version" in str(err).lower():
                self._refuse_version(version, err)
            text = str(err)
            if _DENIED.search(text):  # retrying cannot change these: said at once
                raise InvalidArgumentError(
                    f"access to the log of the Delta table {self.name!r} was denied "
                    f"({_plain(err)}): check the credentials (storage_options, or the "
                    "environment) and that they may read this bucket"
                ) from err
            if _NO_BUCKET.search(text):
                raise SourceNotFoundError(
                    f"the bucket of the Delta table {self.name!r} does not exist "
                    f"({_plain(err)}): check the bucket's name and the endpoint"
                ) from err
            raise ReadError(
                f"cannot read the log of the Delta table {self.name!r}: {_plain(err)}"
            ) from err

    def _refuse_version(self, version: int, err: Exception) -> None:
        """Raise the error of a version that cannot be loaded, naming those that can, if
        the table itself loads (else return: the caller says what is wrong with it)."""
        try:
            latest = self.latest()
        except TabloaderError:
            return
        first = self.first_version(latest)
        if version > latest:
            raise InvalidArgumentError(
                f"the Delta table {self.name!r} has no version {version} yet: its versions "
                f"run from {first} up to {latest}"
            ) from err
        raise InvalidArgumentError(
            f"version {version} of the Delta table {self.name!r} is no longer in its log: "
            "versions before a checkpoint are deleted once older than the table's "
            f"delta.logRetentionDuration. Its versions run from {first} up to {latest}; "
            f"load one of them ({err})"
        ) from err

    def first_version(self, latest: int) -> int:
        """The oldest version the log still holds: versions from it up to ``latest`` load
        (a version loads from the commits after it back to a checkpoint, or to version 0,
        and cleaning up deletes the oldest first), found by bisection."""
        deltalake = import_deltalake()
        low, high = 0, latest
        while low < high:
            middle = (low + high) // 2
            try:
                deltalake.DeltaTable(
                    self.name, version=middle, storage_options=self._log_options or None
                )
            except Exception:
                low = middle + 1
            else:
                high = middle
        return low

    def latest(self) -> int:
        if self._latest is None:
            self._latest = self._open(None)
        else:
            try:
                self._latest.update_incremental()
            except Exception as err:
                raise ReadError(
                    f"cannot read the log of the Delta table {self.name!r}: {_plain(err)}"
                ) from err
        return int(self._latest.version())

    def snapshot(self, version: int) -> TableSnapshot:
        table = self._latest
        if table is None or int(table.version()) != version:
            table = self._open(version)
        where = f"the Delta table {self.name!r} (version {version})"
        self._check_protocol(table, where)
        schema = pa.schema(table.schema().to_arrow())
        keys_names = list(table.metadata().partition_columns)
        keys = {k: schema.field(k).type for k in keys_names}
        actions = pa.table(table.get_add_actions(flatten=True))
        uris = table.file_uris()
        if len(uris) != actions.num_rows:
            raise TabloaderError(
                f"deltalake listed {len(uris)} file URIs but {actions.num_rows} add actions "
                f"for {where}; report this with your deltalake version"
            )
        paths = actions.column("path").to_pylist()
        counts = (
            actions.column("num_records").to_pylist()
            if "num_records" in actions.column_names
            else [None] * len(paths)
        )
        values = {k: actions.column(f"partition.{k}").to_pylist() for k in keys_names}
        files = []
        for i, (uri, path) in enumerate(zip(uris, paths, strict=True)):
            path = str(path)
            if not uri.endswith(unquote(path).lstrip("/")) and not uri.endswith(path):
                raise TabloaderError(
                    f"deltalake listed the file URIs of {where} in another order than its add "
                    "actions; report this with your deltalake version"
                )
            rows = counts[i]
            files.append(
                TableFile(
                    path=self._location(path),
                    values={k: values[k][i] for k in keys_names},
                    rows=None if rows is None else int(rows),
                )
            )
        # Delta: columns under the table's names, partition values from the log alone
        return TableSnapshot("delta", self.name, version, in_load_order(files), schema, keys)

    def _location(self, path: str) -> str:
        """Where an add action's ``path`` is: the log holds it URI-encoded (RFC 2396),
        relative to the table or absolute; decoded once (a partition directory named
        ``s=a%20b`` on disk is ``s=a%2520b`` in the log). deltalake's ``file_uris()``
        keeps the table's own location encoded (a space as ``%20``), which no file
        system has."""
        if "://" not in path and not path.startswith("/"):
            root = self.url if self.url is not None else os.path.abspath(self.name)
            return f"{root.rstrip('/')}/{unquote(path)}"
        location = unquote(path)
        return location.removeprefix("file://") if location.startswith("file://") else location

    def _check_protocol(self, table: Any, where: str) -> None:
        protocol = table.protocol()
        if protocol.min_reader_version > MAX_READER_VERSION:
            raise UnsupportedTableError(
                f"{where} needs a reader of protocol version {protocol.min_reader_version}; "
                f"tabloader reads up to version {MAX_READER_VERSION}"
            )
        # Reader version 2 (or the columnMapping feature) allows column mapping; only a
        # mode other than "none" uses it (Databricks writes version 2 with mode "none").
        mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
        if mode != "none":
            raise UnsupportedTableError(
                f"{where} uses column mapping (delta.columnMapping.mode={mode!r}): its files "
                "store columns under physical names that tabloader does not map. Rewrite the "
                "table without column mapping (for example with a CREATE TABLE ... AS "
                "SELECT), or load it through another reader"
            )
        features = set(protocol.reader_features or ())
        unknown = sorted(features - HONOURED_READER_FEATURES)
        if unknown:
            raise UnsupportedTableError(
                f"{where} uses the reader feature(s) {', '.join(unknown)}, which tabloader "
                "does not know how to honour: it could deliver rows the table does not hold. "
                f"Features it honours: {', '.join(sorted(HONOURED_READER_FEATURES))}"
            )
        if "deletionVectors" in features:
            try:
                vectors = pa.table(table.deletion_vectors())
            except Exception as err:  # deltalake's DeltaError: a vector's file is missing
                raise UnsupportedTableError(
                    deletion_vector_message(where, f"on its files, and reading them failed ({err})")
                ) from err
            if vectors.num_rows:
                first = vectors.column(0)[0].as_py()
                raise UnsupportedTableError(
                    deletion_vector_message(
                        where, f"on {vectors.num_rows} file(s) (first: {first})"
                    )
                )


def deletion_vector_message(where: str, which: str) -> str:
    """The refusal of a version whose files carry deletion vectors (``which`` says on
    which files).

    Examples:
        >>> deletion_vector_message("the Delta table 't' (version 4)", "on 2 file(s)")[:62]
        "the Delta table 't' (version 4) has deletion vectors on 2 file"
    """
    return (
        f"{where} has deletion vectors {which}: rows were "
        "deleted without rewriting the files, and tabloader does not apply deletion "
        "vectors, so it would deliver deleted rows. Purge them first (REORG TABLE ... APPLY "
        "(PURGE) in Spark or Databricks, or an OPTIMIZE that rewrites those files), or "
        "disable delta.enableDeletionVectors before deleting"
    )
