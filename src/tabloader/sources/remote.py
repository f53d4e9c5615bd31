"""Parquet on object storage: byte ranges from the footers, bounded prefetch, retries.

An object store answers each request after a first-byte latency of tens of milliseconds
and fails now and then. Reading a row group therefore

- fetches only the byte ranges of the requested column chunks (planned from the footer
  read at construction; ranges closer than ``COALESCE_BYTES`` are merged), never the
  whole object;
- runs ahead: `RemoteStore.prefetch` keeps up to ``max_concurrent_reads`` row
  groups' requests in flight while earlier ones decode, which hides the latency;
- retries transient failures (refused or reset connections, timeouts, 5xx, throttling)
  with exponential backoff and jitter until ``retry_seconds`` have passed, each request
  bounded by ``request_timeout``; then raises a [`ReadError`][tabloader.errors.ReadError] naming the
  object, the byte range and the last cause. Missing objects and denied access are not
  retried.

The fsspec filesystem is made lazily once per process (fsspec's asynchronous
filesystems, s3fs among them, cannot be used in a forked child), so a dataset works in
PyTorch ``DataLoader`` worker processes with either start method.
"""

from __future__ import annotations

import errno
import io
import os
import random
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from tabloader import _deps
from tabloader.errors import (
    InvalidArgumentError,
    InvalidFileError,
    ReadError,
    SourceNotFoundError,
    TabloaderError,
)

__all__ = [
    "COALESCE_BYTES",
    "RangeFile",
    "RemoteStore",
    "access_denied_error",
    "column_chunk_ranges",
    "footer_metadata",
    "merge_ranges",
]

T = TypeVar("T")

COALESCE_BYTES = 1 << 16
"""Byte ranges separated by at most this many bytes are fetched in one request."""
_FOOTER_GUESS = 1 << 16  # the tail fetched first; most footers fit
_FIRST_PAUSE = 0.1
_MAX_PAUSE = 5.0
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
# Configuration errors of the storage clients (by name: botocore and google-auth are
# optional): retrying cannot fix them.
_CREDENTIAL_ERRORS = frozenset(
    {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError"}
)


_VERSION_KEYS = ("ETag", "etag", "VersionId", "version_id", "generation", "md5Hash")
"""Keys of an fsspec ``info()`` that change with every write of an object."""
_TIME_KEYS = ("LastModified", "last_modified", "mtime", "updated", "created")


class _Stopped(Exception):
    """The consumer went away; pending requests give up quietly."""


class RemoteStore:
    """One fsspec filesystem per process, and requests to it with timeouts and retries.

    Args:
        url: Any URL of the dataset; its protocol picks the filesystem.
        storage_options: Keyword arguments of the fsspec filesystem.
        max_concurrent_reads: Requests in flight at most (row groups fetched ahead).
        retry_seconds: How long transient failures of one request are retried.
        request_timeout: Seconds one attempt may take before it counts as failed.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any],
        *,
        max_concurrent_reads: int,
        retry_seconds: float,
        request_timeout: float,
        credentials: str = "storage_options",
    ) -> None:
        self.url = url
        self.credentials = credentials  # where the user gives them, for messages
        self.protocol = url.split("://", 1)[0]
        self.storage_options = _with_connection_pool(
            self.protocol, dict(storage_options), max_concurrent_reads
        )
        self.max_concurrent_reads = max_concurrent_reads
        self.retry_seconds = retry_seconds
        self.request_timeout = request_timeout
        self._fs: Any = None
        self._pid = -1
        self._lock = threading.Lock()
        self.filesystem  # noqa: B018 -- options the filesystem refuses fail here, not later

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fs"], state["_pid"], state["_lock"] = None, -1, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def filesystem(self) -> Any:
        """This process's filesystem object (a forked child makes its own)."""
        pid = os.getpid()
        if self._pid != pid:
            with self._lock:
                if self._pid != pid:
                    self._fs = self._make_filesystem()
                    self._pid = pid
        return self._fs

    def _make_filesystem(self) -> Any:
        fsspec = _deps.require("fsspec")
        try:
            fs, _ = fsspec.core.url_to_fs(
                self.url, skip_instance_cache=True, **self.storage_options
            )
        except TypeError as err:
            raise self._option_error(err) from err
        except (ImportError, ValueError) as err:
            raise InvalidArgumentError(
                f"cannot open {self.url!r}: {err}. Install the fsspec implementation for "
                f"{self.protocol}:// (for example s3fs, gcsfs or adlfs)"
            ) from err
        return fs

    def _option_error(self, err: TypeError) -> InvalidArgumentError:
        match = re.search(r"unexpected keyword argument '([^']+)'", str(err))
        option = match.group(1) if match else None
        named = f"the option {option!r}" if option else "an option"
        hint = (
            " (s3fs takes retry settings as config_kwargs={'retries': {'max_attempts': N}}; "
            "tabloader's own retries are Dataset(retry_seconds=...))"
            if option == "retries" and self.protocol in ("s3", "s3a")
            else ""
        )
        return InvalidArgumentError(
            f"storage_options for {self.protocol}:// has {named} the filesystem does not "
            f"accept ({type(err).__name__}: {err}){hint}. Remove or rename it: see the "
            "filesystem's documentation for its keyword arguments"
        )

    # -- requests -------------------------------------------------------------------

    def display(self, path: str) -> str:
        """The URL of ``path`` for messages (http paths keep their scheme already)."""
        return path if "://" in path else f"{self.protocol}://{path}"

    def call(
        self,
        name: str,
        *args: Any,
        what: str,
        stop: threading.Event | None = None,
        **kwargs: Any,
    ) -> Any:
        """``filesystem.<name>(*args, **kwargs)`` with a timeout per attempt and retries.

        ``what`` names the request in the error raised when the budget runs out.
        """
        fs = self.filesystem
        method = getattr(fs, "_" + name, None)
        asynchronous = method is not None and getattr(fs, "loop", None) is not None

        def attempt() -> Any:
            if asynchronous:
                from fsspec.asyn import sync

                return sync(fs.loop, method, *args, timeout=self.request_timeout, **kwargs)
            return getattr(fs, name)(*args, **kwargs)

        return self._retry(attempt, what, stop)

    def retried(self, attempt: Callable[[], T], what: str) -> T:
        """``attempt()``, retried within ``retry_seconds`` as reads are (a table's
        metadata, read by its own library); tabloader's errors other than a `ReadError`
        say something retrying cannot change, and are raised at once."""
        return self._retry(attempt, what, None)

    def _retry(self, attempt: Callable[[], T], what: str, stop: threading.Event | None) -> T:
        started = time.monotonic()
        deadline = started + self.retry_seconds
        pause = _FIRST_PAUSE
        attempts = 0
        last: Exception | None = None
        while True:
            attempts += 1
            try:
                return attempt()
            except _PERMANENT:
                raise
            except OSError as err:
                if err.errno == errno.EINVAL:  # a request the store refuses (a range past
                    raise  # the end of an object rewritten shorter): retrying cannot help
                last = err
            except TabloaderError as err:
                if not isinstance(err, ReadError):
                    raise
                last = err
            except TypeError as err:
                if "unexpected keyword argument" in str(err):
                    raise self._option_error(err) from err
                raise
            except Exception as err:  # connection errors, timeouts, 5xx: all retried
                if type(err).__name__ in _CREDENTIAL_ERRORS:
                    raise ReadError(
                        f"could not read {what}: {type(err).__name__}: {err}. Give the "
                        + (
                            "credentials in storage_options (for example key/secret for "
                            "s3://, token for gs://, account_key for az://) or in the "
                            "environment, or anon=True for public data"
                            if self.credentials == "storage_options"
                            else f"credentials in {self.credentials}, or in the environment"
                        )
                    ) from err
                last = err
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                cause = f"{type(last).__name__}: {last}" if str(last) else type(last).__name__
                raise ReadError(
                    f"could not read {what}: {attempts} attempt(s) failed over "
                    f"{time.monotonic() - started:.1f}s, the last with {cause}. This is a "
                    "network or storage service failure, not a damaged file: check the "
                    "connection to the endpoint and the credentials, or give the storage "
                    f"longer with Dataset(retry_seconds=...) (now {self.retry_seconds:g}s)"
                ) from last
            wait = min(remaining, random.uniform(pause / 2, pause))
            pause = min(pause * 2, _MAX_PAUSE)
            if stop is None:
                time.sleep(wait)
            elif stop.wait(wait):
                raise _Stopped

    def fetch(
        self, path: str, start: int, stop_byte: int, *, stop: threading.Event | None = None
    ) -> bytes:
        """Bytes ``[start, stop_byte)`` of an object, retried."""
        what = f"bytes {start}..{stop_byte} of {self.display(path)}"
        data: bytes = self.call("cat_file", path, start=start, end=stop_byte, what=what, stop=stop)
        if len(data) > stop_byte - start and len(data) >= stop_byte:
            data = data[start:stop_byte]  # a server that ignores Range sends the whole object
        if len(data) != stop_byte - start:
            raise ReadError(
                f"{self.display(path)} returned {len(data)} bytes for {what}, expected "
                f"{stop_byte - start}: the object changed after the dataset was created. "
                "Create the Dataset again"
            )
        return data

    def size(self, path: str) -> int:
        try:
            return int(self.call("size", path, what=f"the size of {self.display(path)}"))
        except FileNotFoundError as err:
            raise SourceNotFoundError(f"{self.display(path)} does not exist ({err})") from err
        except PermissionError as err:
            raise access_denied_error(self.display(path), err) from err

    def stamp(self, path: str) -> tuple[Any, ...]:
        """``(size, *versions)``: the object's size, and what the store says changes with
        every write of it (ETag, version id, generation; else its modification time)."""
        try:
            info = self.call("info", path, what=f"the metadata of {self.display(path)}")
        except FileNotFoundError as err:
            raise SourceNotFoundError(f"{self.display(path)} does not exist ({err})") from err
        except PermissionError as err:
            raise access_denied_error(self.display(path), err) from err
        versions = [str(info[k]) for k in _VERSION_KEYS if info.get(k) not in (None, "")]
        if not versions:
            versions = [str(info[k]) for k in _TIME_KEYS if info.get(k) not in (None, "")]
        return (int(info.get("size") or 0), *versions)

    def read_footer(self, path: str, size: int) -> bytes:
        """The tail of a parquet object holding its footer (metadata, length, magic)."""
        shown = self.display(path)
        if size < 12:
            raise InvalidFileError(
                f"{shown} is {size} bytes, too short for parquet: remove it, or re-write it"
            )
        tail = self.fetch(path, max(0, size - _FOOTER_GUESS), size)
        if tail[-4:] not in (b"PAR1", b"PARE"):  # (PARE: an encrypted footer, refused later)
            raise InvalidFileError(
                f"{shown} is not a parquet file (it does not end with PAR1); it may be "
                "truncated, still being written, or in another format"
            )
        need = int.from_bytes(tail[-8:-4], "little") + 8
        if need > size:
            raise InvalidFileError(f"{shown} has a footer longer than the file: it is damaged")
        if need > len(tail):
            tail = self.fetch(path, size - need, size - len(tail)) + tail
        return tail[-need:]

    # -- reading row groups -----------------------------------------------------------

    def open_ranges(
        self,
        path: str,
        size: int,
        ranges: Sequence[tuple[int, int]],
        *,
        stop: threading.Event | None = None,
    ) -> RangeFile:
        """A file-like object of ``size`` bytes holding the fetched ``ranges``."""
        parts = [(a, self.fetch(path, a, b, stop=stop)) for a, b in ranges]
        return RangeFile(size, parts)

    def prefetch(
        self, tasks: Iterable[T], fetch: Callable[[T, threading.Event], Any]
    ) -> Iterator[tuple[T, Any]]:
        """``(task, fetch(task, stop))`` in order, up to ``max_concurrent_reads`` run ahead.

        The thread pool lives as long as the iteration; closing the iterator stops the
        pending requests at their next retry and waits for the running ones.
        """
        stop = threading.Event()
        depth = self.max_concurrent_reads
        pool = ThreadPoolExecutor(depth, thread_name_prefix="tabloader-fetch")
        pending: deque[tuple[T, Future[Any]]] = deque()
        todo = iter(tasks)
        try:
            while True:
                while len(pending) < depth:
                    task = next(todo, None)
                    if task is None:
                        break
                    pending.append((task, pool.submit(fetch, task, stop)))
                if not pending:
                    return
                task, future = pending.popleft()
                yield task, future.result()
        finally:
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)


_BOTOCORE_POOL = 10  # botocore's default max_pool_connections


def _with_connection_pool(
    protocol: str, options: dict[str, Any], connections: int
) -> dict[str, Any]:
    """s3fs lets botocore hold 10 connections; more concurrent reads would queue for them."""
    if protocol not in ("s3", "s3a") or connections <= _BOTOCORE_POOL:
        return options
    config = options.get("config_kwargs")
    if config is None:
        config = {}
    elif not isinstance(config, dict) or "max_pool_connections" in config:
        return options
    return {**options, "config_kwargs": {**config, "max_pool_connections": connections}}


def access_denied_error(shown: str, err: BaseException) -> ReadError:
    return ReadError(
        f"access to {shown} was denied ({type(err).__name__}: {err}): check the credentials "
        "(storage_options such as key/secret, token, account_key, or the environment) and "
        "that they may read this bucket"
    )


def column_chunk_ranges(
    metadata: pq.FileMetaData, row_groups: Sequence[int], columns: Sequence[str]
) -> list[tuple[int, int]]:
    """Byte ranges ``[start, stop)`` of the column chunks of ``columns`` in ``row_groups``.

    A column is matched by its top-level name, so every leaf of a nested column is read.
    The leaves are counted field by field (a name may hold a ``.``, which the leaves'
    dotted paths cannot tell from nesting); a leaf whose dotted path is a name asked for
    is read too, as pyarrow reads it for that name.

    Examples:
        >>> import io
        >>> buffer = io.BytesIO()
        >>> table = pa.table({"a.b": [1], "s": [{"x": 1, "y": 2.0}], "c": [3]})
        >>> pq.write_table(table, buffer)
        >>> metadata = pq.ParquetFile(buffer).metadata
        >>> [len(column_chunk_ranges(metadata, [0], [name])) for name in ("a.b", "s", "c")]
        [1, 2, 1]
    """
    wanted = set(columns)
    leaves: set[int] = set()
    first = 0
    for field in metadata.schema.to_arrow_schema():
        count = _leaf_count(field.type)
        if field.name in wanted:
            leaves.update(range(first, first + count))
        first += count
    for i in range(metadata.num_columns):
        path = metadata.schema.column(i).path
        if any(path == name or path.startswith(name + ".") for name in wanted):
            leaves.add(i)
    ranges = []
    for g in row_groups:
        group = metadata.row_group(g)
        for i in sorted(leaves):
            chunk = group.column(i)
            start = int(chunk.data_page_offset)
            dictionary = chunk.dictionary_page_offset if chunk.has_dictionary_page else None
            if dictionary is not None and 0 < dictionary < start:
                start = int(dictionary)
            ranges.append((start, start + chunk.total_compressed_size))
    return ranges


def _leaf_count(kind: pa.DataType) -> int:
    """Parquet leaf columns an Arrow field of type ``kind`` is stored in."""
    if pa.types.is_struct(kind):
        return sum(_leaf_count(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaf_count(kind.key_type) + _leaf_count(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaf_count(kind.value_type)
    return 1


def merge_ranges(
    ranges: Iterable[tuple[int, int]], gap: int = COALESCE_BYTES
) -> list[tuple[int, int]]:
    """Sorted ranges, with those closer than ``gap`` bytes merged.

    Examples:
        >>> merge_ranges([(100, 200), (0, 40), (60, 90), (500, 600)], gap=10)
        [(0, 40), (60, 200), (500, 600)]
    """
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(ranges):
        if merged and start - merged[-1][1] <= gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


class RangeFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only some ranges were fetched.

    Bytes outside the fetched ranges read as zeros, as in ``fsspec.parquet``: parquet
    readers given the footer touch only the column chunks it points them to.

    Examples:
        >>> f = RangeFile(10, [(2, b"abc"), (8, b"yz")])
        >>> f.read(5), f.seek(-2, 2), f.read()
        (b'\\x00\\x00abc', 8, b'yz')
    """

    def __init__(self, size: int, parts: Sequence[tuple[int, bytes]]) -> None:
        super().__init__()
        self._size = size
        self._parts = sorted(parts, key=lambda p: p[0])
        self._pos = 0

    @property
    def fetched_bytes(self) -> int:
        return sum(len(data) for _, data in self._parts)

    def write_sparse(self, fd: int) -> None:
        """Make the open file ``fd`` this file: ``size`` bytes long, the fetched ranges at
        their offsets, the rest a hole (read as zeros, taking no space on a file system
        with sparse files, such as tmpfs and memfd).

        Examples:
            >>> import tempfile
            >>> with tempfile.TemporaryFile() as f:
            ...     RangeFile(6, [(1, b"ab"), (5, b"z")]).write_sparse(f.fileno())
            ...     _ = f.seek(0)
            ...     f.read()
            b'\\x00ab\\x00\\x00z'
        """
        os.ftruncate(fd, self._size)
        for offset, data in self._parts:
            view = memoryview(data)
            while view:
                written = os.pwrite(fd, view, offset)
                view, offset = view[written:], offset + written

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        start = min(self._pos, self._size)
        stop = min(self._size, start + len(view))
        view[: stop - start] = bytes(stop - start)
        for offset, data in self._parts:
            lo, hi = max(start, offset), min(stop, offset + len(data))
            if lo < hi:
                view[lo - start : hi - start] = data[lo - offset : hi - offset]
        self._pos = stop
        return stop - start


def footer_metadata(footer: bytes) -> pq.FileMetaData:
    """Parse a footer fetched by `RemoteStore.read_footer`."""
    return pq.read_metadata(pa.BufferReader(footer))
