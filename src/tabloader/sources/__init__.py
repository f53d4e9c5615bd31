"""Where rows come from: the storage behind a [`Dataset`][tabloader.Dataset], one module per kind.

Every kind implements one protocol, `tabloader.sources.base.Source` (rows, schema,
reading pieces, footer statistics, file identities, listing again), and `open_source`
picks the kind for what a user gives ``Dataset``
(`table_format_at` recognises a Delta or Iceberg table by its layout):

- `tabloader.sources.parquet`: parquet files, directories, globs and URLs, Hive keys,
  listing again (``refresh=True``);
- `tabloader.sources.snapshot`: the files of one version of a Delta or Iceberg table
  (its log read by `tabloader.sources.delta` or `tabloader.sources.iceberg`);
- `tabloader.sources.table`: a pyarrow, pandas or polars table in memory;
- `tabloader.sources.dask`: a Dask DataFrame (dask or dask-cudf).

Below them: `tabloader.sources.remote` reads parquet from object storage through
fsspec (byte ranges planned from the footers, a bounded number of requests in flight,
retries with backoff, one filesystem object per process); `tabloader.sources.footers`
reads the footers' statistics, in one place; `tabloader.sources.partitions` holds the
pure rules of partition keys and filters. Nothing outside this package names a source
class.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Literal

import pyarrow as pa

from tabloader.errors import InvalidArgumentError
from tabloader.sources.base import Source
from tabloader.sources.dask import DaskSource, is_dask_frame
from tabloader.sources.parquet import ParquetSource
from tabloader.sources.partitions import Filters, TableLog
from tabloader.sources.remote import RemoteStore
from tabloader.sources.table import TableSource, is_pandas_frame, is_polars_frame, table_of

__all__ = ["Source", "open_source", "table_format_at"]


def open_source(
    source: Any,
    *,
    rows_per_partition: int,
    storage_options: dict[str, Any] | None,
    remote: dict[str, Any],
    filters: Filters | None,
    refreshes: bool,
    verify_checksums: bool = False,
) -> Source:
    """The `Source` for what a user gave a [`Dataset`][tabloader.Dataset] (see its
    ``source`` argument); ``remote`` holds the object store's request options."""
    if storage_options and not _names_urls(source):
        raise InvalidArgumentError(
            f"storage_options are for URLs (s3://, gs://, ...), and this dataset is "
            f"{_describe_source(source)}: leave storage_options out, or give URLs"
        )
    if isinstance(source, pa.Table) or is_polars_frame(source) or is_pandas_frame(source):
        return TableSource(table_of(source), rows_per_partition)
    if isinstance(source, TableLog):  # Dataset.from_delta, Dataset.from_iceberg
        from tabloader.sources.snapshot import SnapshotSource

        store = None
        if source.url is not None:
            store = RemoteStore(
                source.url, source.storage_options, credentials=source.credentials, **remote
            )
        return SnapshotSource(source, store, filters=filters, verify_checksums=verify_checksums)
    if is_dask_frame(source):
        return DaskSource(source)
    specs = _as_path_list(source)
    urls = [s for s in specs if _is_url(s)]
    store = None
    if urls:
        if len(urls) != len(specs):
            raise InvalidArgumentError(
                "mixing local paths and URLs in one dataset is not supported; "
                "use file:// URLs for the local ones"
            )
        protocols = {_protocol(u) for u in urls}
        if len(protocols) > 1:
            raise InvalidArgumentError(
                f"all URLs of one dataset must use the same protocol, got {sorted(protocols)}"
            )
        if storage_options is not None and not isinstance(storage_options, dict):
            raise InvalidArgumentError(
                f"storage_options must be a dict, got {type(storage_options).__name__}"
            )
        store = RemoteStore(urls[0], storage_options or {}, **remote)
    return ParquetSource(
        specs,
        store,
        skip_unreadable=refreshes,
        filters=filters,
        verify_checksums=verify_checksums,
    )


def table_format_at(path: str) -> Literal["delta", "iceberg"] | None:
    """The table format whose layout ``path`` has: ``"delta"`` for a local directory
    holding ``_delta_log``, ``"iceberg"`` for a ``*.metadata.json`` file or a local
    directory holding ``metadata/``; None for anything else (files, globs, other URLs).

    Examples:
        >>> table_format_at("s3://bucket/t/metadata/v3.metadata.json"), table_format_at("s3://b/t")
        ('iceberg', None)
    """
    local = path.removeprefix("file://") if "://" not in path.removeprefix("file://") else ""
    if path.endswith(".metadata.json"):
        return "iceberg"
    if local and os.path.isdir(os.path.join(local, "_delta_log")):
        return "delta"
    if local and os.path.isdir(os.path.join(local, "metadata")):
        return "iceberg"
    return None


def _as_path_list(source: object) -> list[str]:
    if isinstance(source, (str, os.PathLike)):
        return [os.fspath(source)]
    if type(source).__module__.split(".")[0] == "tabloader":  # a loader, an adapter
        raise InvalidArgumentError(
            f"cannot load from a {type(source).__name__}: pass its dataset "
            "(loader.dataset) or the paths it reads"
        )
    # Lists of paths only: an iterable of another kind (a loader of another library, a
    # DataLoader) is not run through to find out what it holds.
    if isinstance(source, (Sequence, AbstractSet, Iterator)) and not isinstance(source, bytes):
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
