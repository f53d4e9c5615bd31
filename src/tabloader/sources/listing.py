"""Listing what a user names: paths, directories, globs and URLs, as parquet files.

`expand` turns one spec into the files it names now, sorted: directories searched
recursively for ``*.parquet``, ``*.parq`` and ``*.pq``, skipping names that start with
``_`` or ``.`` and files still being written (``*.tmp``, ``*.inprogress``); a path that
exists is itself, even with glob characters; a Delta or Iceberg table's files are
refused however they are named (its directory, one above it, one of its partitions, a
glob over them: the directory holds the files of every version). It records where
each directory's or glob's ``key=value`` directories start (`below_root`).
"""

from __future__ import annotations

import glob as globlib
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from tabloader.errors import InvalidArgumentError, SourceNotFoundError
from tabloader.sources.remote import access_denied_error
from tabloader.splits import refuse_mixed_splits

if TYPE_CHECKING:
    from tabloader.sources.remote import RemoteStore

__all__ = [
    "PARQUET_SUFFIXES",
    "TEMPORARY_SUFFIXES",
    "below_root",
    "expand",
    "glob_root",
    "refuse_table_files",
]

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
TEMPORARY_SUFFIXES = (".tmp", ".inprogress")


def expand(spec: str, remote: RemoteStore | None, roots: dict[str, str]) -> list[str]:
    """The files a path, directory, glob or URL names now, sorted; ``roots`` records
    where each directory's or glob's ``key=value`` parts start."""
    if remote is None:
        path = os.path.expanduser(spec)
        # A path that exists is itself, even with glob characters: "a[1].parquet".
        if globlib.has_magic(path) and not os.path.exists(path):
            root = glob_root(path)
            named = set(path.replace("\\", "/").split("/"))
            found = sorted(
                p
                for p in globlib.glob(path, recursive=True)
                if os.path.isfile(p) and not _hidden(p) and not _left_by_writers(p, root, named)
            )
            if not found:
                raise SourceNotFoundError(f"the glob {spec!r} matched no files")
            refuse_table_files(spec, found)
            roots[spec] = root
            return found
        if os.path.isdir(path):
            _refuse_table_directory(spec, _table_markers(path))
            roots[spec] = path.rstrip("/") + "/"
            found = _from_directory(spec, _walk_local(path), root=path)
            refuse_table_files(spec, found)
            return found
        if os.path.isfile(path):
            refuse_table_files(spec, [path])
            return [path]
        if os.path.exists(path):
            raise InvalidArgumentError(f"{spec!r} is not a regular file (a FIFO, a device)")
        raise SourceNotFoundError(f"{spec!r} does not exist")
    store = remote
    path = store.filesystem._strip_protocol(spec)

    def call(name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return store.call(name, *args, what=f"the listing of {spec}", **kwargs)
        except PermissionError as err:
            raise access_denied_error(spec, err) from err
        except FileNotFoundError:
            return None

    literal = call("info", path) if globlib.has_magic(path) else None
    if globlib.has_magic(path) and literal is None:
        listing = call("glob", path, detail=True) or {}
        root = glob_root(path)
        named = set(path.split("/"))
        found = sorted(
            p
            for p, info in listing.items()
            if info.get("type") == "file"
            and not _hidden(p)
            and not _left_by_writers(p, root, named)
        )
        if not found:
            raise SourceNotFoundError(
                f"the glob {spec!r} matched no files; check the bucket name, the path "
                "and the endpoint"
            )
        if root:  # the tables below the glob's fixed part, and those it lies in
            _refuse_remote_tables(spec, root, call("find", root.rstrip("/")) or [], call)
        roots[spec] = root
        return found
    info = literal if literal is not None else call("info", path)
    if info is not None and info.get("type") == "directory":
        listing = sorted(call("find", path) or [])
        root = path.rstrip("/") + "/"
        _refuse_table_directory(spec, [p[len(root) :] for p in listing if p.startswith(root)])
        _refuse_remote_tables(spec, root, listing, call)
        roots[spec] = root
        return _from_directory(spec, listing, root=path)
    if info is not None:
        return [path]
    raise SourceNotFoundError(
        f"{spec!r} does not exist; check the bucket name, the path and the endpoint"
    )


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


def below_root(path: str, roots: dict[str, str]) -> str:
    """``path`` relative to the directory or glob it was found by (``roots``, from
    `expand`; its name alone for a file named directly): where its ``key=value``
    directories are read.

    Examples:
        >>> below_root("data/day=3/a.parquet", {"data/": "data/"})
        'day=3/a.parquet'
    """
    for root in sorted(roots.values(), key=len, reverse=True):
        if path.startswith(root):
            return path[len(root) :]
    return os.path.basename(path)


def _hidden(path: str) -> bool:
    """Files writers leave beside the data (``_SUCCESS``, ``_metadata``, ``.crc``) or are
    still writing (``*.tmp``, ``*.inprogress``)."""
    name = os.path.basename(path)
    return name.startswith(("_", ".")) or name.endswith(TEMPORARY_SUFFIXES)


def glob_root(pattern: str) -> str:
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


def _refuse_table_directory(spec: str, names: Iterable[str], table: str | None = None) -> None:
    """A table's directory holds the files of every version: refuse to read them all.
    ``names``: what is below the table's directory, ``table`` (by default ``spec``)."""
    where = f"{spec!r} is" if table is None else f"{spec!r} holds files of the table {table!r},"
    table = spec if table is None else table
    for name in names:
        if name.startswith("_delta_log/"):
            raise InvalidArgumentError(
                f"{where} a Delta Lake table: its directory also holds files that older "
                "versions replaced or deleted, so reading every file would duplicate and "
                f"resurrect rows. Load it with tabloader.Dataset.from_delta({table!r}) "
                "(filters= selects partitions)"
            )
        if name.startswith("metadata/") and name.endswith(".metadata.json"):
            raise InvalidArgumentError(
                f"{where} an Apache Iceberg table: its data directory also holds files "
                "that older snapshots replaced or deleted. Load it with "
                "tabloader.Dataset.from_iceberg(catalog.load_table(...)), or for a table "
                "without a catalog pyiceberg.table.StaticTable.from_metadata(...)"
            )


def refuse_table_files(spec: str, files: Sequence[str]) -> None:
    """Refuse local ``files`` that lie in a Delta or Iceberg table's directory (at any
    depth: a partition's directory, ``data/``, a glob over them, a directory above): the
    table decides which of them hold its rows."""
    table_of: dict[str, str | None] = {}  # directory -> the table it lies in, if any

    def table_above(directory: str) -> str | None:
        chain = []
        found: str | None = None
        while directory not in table_of:
            chain.append(directory)
            if _table_markers(directory):
                found = directory
                break
            parent = os.path.dirname(directory)
            if parent == directory:
                break
            directory = parent
        else:
            found = table_of[directory]
        for d in chain:
            table_of[d] = found
        return found

    for directory in sorted({os.path.dirname(os.path.abspath(f)) for f in files}):
        table = table_above(directory)
        if table is not None:
            _refuse_table_directory(spec, _table_markers(table), table=table)


def _refuse_remote_tables(spec: str, root: str, listing: Sequence[str], call: Any) -> None:
    """Refuse a listing of objects below ``root`` that holds a Delta or Iceberg table's
    files (its names say where), or a ``root`` inside a table's directory (one request
    for each directory above it: a partition's, ``data/``)."""
    protocol = spec.split("://", 1)[0] + "://" if "://" in spec else ""
    for name in (p[len(root) :] for p in listing if p.startswith(root)):
        parts = name.split("/")
        for i, part in enumerate(parts[:-1]):
            if part == "_delta_log" or (part == "metadata" and i == len(parts) - 2):
                table = protocol + (root + "/".join(parts[:i])).rstrip("/")
                _refuse_table_directory(spec, ["/".join(parts[i:])], table=table)
    above = root.rstrip("/").split("/")[:-1]  # the bucket, then each directory down
    for depth in range(len(above), 1, -1):
        directory = "/".join(above[:depth])
        markers = []
        if call("info", f"{directory}/_delta_log") is not None:
            markers.append("_delta_log/")
        markers += [
            f"metadata/{p.rsplit('/', 1)[-1]}"
            for p in call("glob", f"{directory}/metadata/*.metadata.json") or []
        ]
        _refuse_table_directory(spec, markers, table=protocol + directory)


def _left_by_writers(path: str, root: str, named: set[str]) -> bool:
    """Whether a glob's match lies in a directory writers keep to themselves (``_`` or
    ``.`` names, as Spark's ``_temporary/``) that the glob does not name itself."""
    below = path[len(root) :] if path.startswith(root) else path
    parts = below.replace("\\", "/").split("/")[:-1]
    return any(p.startswith(("_", ".")) and p not in named for p in parts)


def _walk_local(root: str) -> list[str]:
    """The regular files below ``root`` (links to them too), but in directories whose
    names start with ``_`` or ``.``: a FIFO named like data is not opened (it would
    block the listing for ever)."""
    found: list[str] = []
    below = [root]
    while below:
        with os.scandir(below.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):  # (as os.walk: links not walked)
                    if not entry.name.startswith(("_", ".")):
                        below.append(entry.path)
                elif entry.is_file():
                    found.append(entry.path)
    return sorted(found)
