"""Filling a decoded cache from one epoch, and publishing it.

The cache's blocks are stored as files (`StoredBlocks`): each block a row-major
``[rows, k]`` array, a list column its values and each row's span into them
(`CachedList`). `Fill` is the cache being filled by one epoch: its arrays in memory, or
the files of a disk cache being written (`tabloader.cache.files`), each decoded piece's
rows written at their place. Once complete, a disk cache is published (`Publisher`): its
manifest written and its temporary directory renamed into place in one step, at once for
a cache written into its files, or by a thread of its own, ``tabloader-cache-writer``,
for one filled in memory, which is served from memory meanwhile.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tabloader.cache import files as _files
from tabloader.cache.files import (
    AppendFile,
    CacheDamaged,
    CacheFiles,
    CacheRefused,
    FileSpec,
    TempVanished,
    file_checksums,
    write_npy,
)
from tabloader.cache.key import FORMAT, lineage
from tabloader.decode.host import interleave
from tabloader.errors import CacheWarning
from tabloader.hostmem import map_in, populated_empty
from tabloader.stages import start_thread

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from tabloader.batches import Block
    from tabloader.cache.store import CacheStore
    from tabloader.dataset import Dataset
    from tabloader.stages import SplitWork

__all__ = [
    "WRITER_NICENESS",
    "CachedList",
    "Fill",
    "FillFailed",
    "Publisher",
    "StoredBlocks",
    "read_only",
]

WRITER_NICENESS = 10
"""Niceness of the thread writing a disk cache out while epochs are served (Linux):
copying a gigabyte into the page cache takes seconds of CPU, and this thread yields to
the epochs being served."""
_WRITERS: dict[str, threading.Thread] = {}
"""Background writers of disk caches, by key digest, until a loader waits for one."""
_WRITERS_LOCK = threading.Lock()


class FillFailed(Exception):
    """Writing a cache being filled failed (the cause is ``__cause__``): the epoch goes on
    streaming from the files."""


@dataclass(frozen=True)
class CachedList:
    """A cached list column: row ``i`` is ``values[spans[i, 0]:spans[i, 1]]``.

    The values are stored in the order they were decoded (the first epoch's), each row's
    span pointing at its own, so a cache is filled piece by piece in any order.
    """

    values: Any
    spans: Any
    """``[rows, 2]`` int64: where each row's values start and stop."""

    def __len__(self) -> int:
        return int(self.spans.shape[0])


def read_only(arrays: Mapping[str, Any]) -> dict[str, Any]:
    """Read-only views: a batch that is a view of the cache cannot change it."""
    views: dict[str, Any] = {}
    for name, array in arrays.items():
        if isinstance(array, CachedList):
            views[name] = CachedList(_read_only(array.values), _read_only(array.spans))
        else:
            views[name] = _read_only(array)
    return views


def _read_only(array: Any) -> Any:
    view = array.view()
    view.flags.writeable = False
    return view


def _file_names(index: int, block: Block) -> list[str]:
    """The files block ``index`` is stored in: its ``[rows, k]`` array, or a list
    column's spans and values."""
    if block.ragged:
        return [f"block{index}.spans.npy", f"block{index}.values.npy"]
    return [f"block{index}.npy"]


@dataclass(frozen=True)
class StoredBlocks:
    """A cache's blocks as files, by name: ``block{i}.npy`` (``[rows, k]``), or for a list
    column ``block{i}.spans.npy`` and ``block{i}.values.npy``."""

    blocks: tuple[Block, ...]
    num_rows: int

    def specs(self, lengths: Mapping[str, int] | None = None) -> list[FileSpec]:
        """The files, in order; a list column's values of ``lengths[name]`` values (of
        any length without)."""
        specs = []
        for i, b in enumerate(self.blocks):
            names = _file_names(i, b)
            if not b.ragged:
                specs.append(FileSpec(names[0], (self.num_rows, b.width), b.dtype))
                continue
            length = None if lengths is None else (lengths[names[1]],)
            specs.append(FileSpec(names[0], (self.num_rows, 2), np.dtype(np.int64)))
            specs.append(FileSpec(names[1], length, b.dtype))
        return specs

    def arrays(self, files: Mapping[str, Any]) -> dict[str, Any]:
        """Block name -> array (or `CachedList`) of a cache's files by name."""
        arrays: dict[str, Any] = {}
        for i, b in enumerate(self.blocks):
            names = _file_names(i, b)
            arrays[b.name] = (
                CachedList(files[names[1]], files[names[0]]) if b.ragged else files[names[0]]
            )
        return arrays

    def described(self) -> list[dict[str, Any]]:
        """The blocks as a manifest describes them."""
        return [
            {
                "name": b.name,
                "columns": list(b.columns),
                "dtype": str(b.dtype),
                "ragged": b.ragged,
                "files": _file_names(i, b),
            }
            for i, b in enumerate(self.blocks)
        ]


@dataclass(frozen=True)
class Publisher:
    """Where a disk cache is published: its store (`tabloader.cache.store.CacheStore`),
    the digest of its key that names it there, and the key itself."""

    store: CacheStore
    digest: str
    key: Mapping[str, Any]

    def manifest(
        self, stored: StoredBlocks, files: Mapping[str, NDArray[Any]], sums: Sequence[list[str]]
    ) -> dict[str, Any]:
        """What a published cache says of itself: its key, blocks and files with their
        checksums."""
        return {
            "format": FORMAT,
            "key": self.key,
            "lineage": lineage(self.key),
            "rows": stored.num_rows,
            "bytes": int(sum(a.nbytes for a in files.values())),
            "blocks": stored.described(),
            "files": [
                {
                    "file": name,
                    "shape": list(array.shape),
                    "dtype": str(array.dtype),
                    _files.CHECKSUM: digests,
                }
                for (name, array), digests in zip(files.items(), sums, strict=True)
            ],
            "segment_bytes": _files.SEGMENT_BYTES,
            "created": time.time(),
        }

    def publish(
        self,
        stored: StoredBlocks,
        temp: Path,
        files: Mapping[str, NDArray[Any]],
        sums: Sequence[list[str]],
    ) -> None:
        """Publish the cache written into ``temp`` (its ``files`` and their checksums),
        then delete the caches of earlier versions of the same files."""
        manifest = self.manifest(stored, files, sums)
        self.store.publish(temp, self.digest, manifest, partial(self._sound, stored))
        self.store.remove_older_versions(self.digest, lineage(self.key))

    def _sound(self, stored: StoredBlocks) -> bool:
        try:
            return self.store.open(self.digest, self.key, stored.specs()) is not None
        except (CacheRefused, CacheDamaged):
            return False

    def write_in_background(
        self, stored: StoredBlocks, files: Mapping[str, NDArray[Any]], temp: Path
    ) -> None:
        """Write ``files`` into ``temp`` and publish them, in a thread of their own
        (``tabloader-cache-writer``); a loader on the same cache waits for it first.

        In a child process (a ``DataLoader`` worker, a multiprocessing pool) they are
        written before this returns: such a process ends without running the exit
        handlers that would wait for a writer thread, which died unfinished."""
        if multiprocessing.parent_process() is not None:
            self._persist_or_warn(stored, dict(files), temp)
            return
        with _WRITERS_LOCK:  # started before it is found: join() refuses a thread not started
            writer = start_thread(
                self._persist_or_warn, stored, dict(files), temp,
                name="tabloader-cache-writer", niceness=WRITER_NICENESS,
            )  # fmt: skip
            _WRITERS[self.digest] = writer
        # Wait for the files at exit, rather than leave them unpublished.
        weakref.finalize(writer, writer.join)

    def wait(self) -> None:
        """Wait until this cache's files, written in the background, are published."""
        with _WRITERS_LOCK:
            writer = _WRITERS.pop(self.digest, None)
        if writer is not None:
            writer.join()

    def _persist_or_warn(
        self, stored: StoredBlocks, files: dict[str, NDArray[Any]], temp: Path
    ) -> None:
        try:
            sums = [write_npy(temp / name, array) for name, array in files.items()]
            self.publish(stored, temp, files, sums)
        except Exception as error:  # the loader goes on from memory; the user is told
            vanished = isinstance(error, TempVanished) or not temp.exists()
            self.store.remove_temp(temp)
            what = (
                f"its temporary directory {temp} vanished (deleted by another process?)"
                if vanished
                else f"{type(error).__name__}: {error}"
            )
            warnings.warn(
                f"could not write the decoded cache to {self.store.root}: {what}. This "
                "loader keeps serving it from memory; the next one will decode the files "
                "again",
                CacheWarning,
                stacklevel=1,
            )


class _Growing:
    """A one-dimensional array appended to, in memory: the values of a list column."""

    def __init__(self, dtype: np.dtype[Any]) -> None:
        self.array: NDArray[Any] = np.empty(1024, dtype)
        self.length = 0

    def append(self, values: NDArray[Any]) -> int:
        start, stop = self.length, self.length + len(values)
        if stop > len(self.array):
            # Gathers of earlier chunks may still read the old array: it is replaced, not
            # changed, and lives on as long as they hold it.
            grown = np.empty(max(stop, 2 * len(self.array)), self.array.dtype)
            grown[:start] = self.array[:start]
            self.array = grown
        self.array[start:stop] = values
        self.length = stop
        return start

    def mapped(self) -> NDArray[Any]:
        return self.array[: self.length]

    def final(self) -> NDArray[Any]:
        """The values, in an array of their own size."""
        values: NDArray[Any] = self.array[: self.length].copy()
        return values


def _fill_rows(columns: Sequence[NDArray[Any]], rows: NDArray[Any]) -> None:
    """Write ``columns`` into ``rows`` of a cache filled in memory, their pages mapped in
    first (the cache's arrays are made without: see `Fill`)."""
    map_in(rows)
    interleave(columns, rows)


class Fill:
    """A cache being filled by one epoch: its arrays (in memory, or mappings of its files
    being written), its temporary directory (a disk cache), and how it is completed.

    A disk cache that fits in memory (a quarter of the available memory) is filled in
    memory, served from it at once and written out in the background when complete;
    a larger one is written straight into its ``.npy`` files (`CacheFiles`),
    and its arrays are read-only mappings of them. A list column's values are appended
    as they come (`AppendFile` on disk) and each row's span written at its place.
    """

    def __init__(
        self,
        stored: StoredBlocks,
        publisher: Publisher | None,
        *,
        in_memory: bool,
        skipped: int,
    ) -> None:
        self.stored = stored
        self.publisher = publisher
        """Where the cache is published once complete (None: a memory cache)."""
        self.skipped = skipped
        """Rows the dataset had skipped before this epoch (``on_missing="skip"``)."""
        self.temp: Path | None = None
        self.files: CacheFiles | None = None
        self.arrays: dict[str, Any] = {}
        """File name -> its array being filled (in memory)."""
        self.lists: dict[str, Any] = {}
        """File name of a list column's values -> its `_Growing` or `AppendFile`."""
        self._served: dict[str, Any] | None = None
        specs = stored.specs()
        fixed = [s for s in specs if s.shape is not None]
        if publisher is not None:
            publisher.store.remove_abandoned()
            self.temp = publisher.store.new_temp(publisher.digest)
        try:
            if in_memory:
                # Mapped in a piece's rows at a time, by the threads writing them
                # (`_fill_rows`): page by page on first touch, filling a fresh gigabyte
                # cost a second; all at once, it held up the epoch's first piece.
                self.arrays = {
                    s.name: populated_empty(s.shape, s.dtype, populate=False)
                    for s in fixed
                    if s.shape is not None
                }
                self.lists = {s.name: _Growing(s.dtype) for s in specs if s.shape is None}
            else:
                assert self.temp is not None
                self.files = CacheFiles(self.temp, fixed)
                self.lists = {
                    s.name: AppendFile(self.temp / s.name, s.dtype)
                    for s in specs
                    if s.shape is None
                }
        except BaseException:
            self.close()
            raise

    def write(self, first_row: int, piece: Mapping[str, Any], work: SplitWork) -> None:
        """Cast one decoded piece's columns into their blocks' rows from ``first_row``,
        ``work``'s threads a share of the rows each. Raises `FillFailed` if
        writing a file fails."""
        n = len(next(iter(piece.values())))
        jobs: list[tuple[int, Callable[[], None]]] = []
        self._served = None
        try:
            for i, b in enumerate(self.stored.blocks):
                names = _file_names(i, b)
                if b.ragged:
                    ragged = piece[b.columns[0]].compact()
                    start = self.lists[names[1]].append(ragged.values.astype(b.dtype, copy=False))
                    spans = [start + ragged.offsets[:-1], start + ragged.offsets[1:]]
                    self._write_rows(names[0], first_row, spans)
                    continue
                for share in work.shares(n):
                    part = [piece[c][share] for c in b.columns]
                    if self.files is None:
                        rows = self.arrays[names[0]][
                            first_row + share.start : first_row + share.stop
                        ]
                        job = partial(_fill_rows, part, rows)
                    else:
                        job = partial(
                            self.files.write_rows, names[0], first_row + share.start, part
                        )
                    jobs.append((len(part[0]) * b.width, job))
            work.run(jobs)
        except OSError as error:
            raise FillFailed(str(error)) from error

    def _write_rows(self, name: str, first_row: int, columns: Sequence[NDArray[Any]]) -> None:
        if self.files is None:
            _fill_rows(columns, self.arrays[name][first_row : first_row + len(columns[0])])
        else:
            self.files.write_rows(name, first_row, columns)

    def _files(self) -> dict[str, Any]:
        """File name -> its array as it stands (the values written so far)."""
        fixed = self.arrays if self.files is None else self.files.mapped()
        values = {name: arena.mapped() for name, arena in self.lists.items()}
        names = [s.name for s in self.stored.specs()]
        merged = {**fixed, **values}
        return {name: merged[name] for name in names}

    def served(self) -> dict[str, Any]:
        """Block name -> the rows written so far (read-only), for gathering."""
        if self._served is None:
            self._served = read_only(self.stored.arrays(self._files()))
        return self._served

    def complete(self, dataset: Dataset) -> dict[str, Any] | None:
        """The filled arrays, complete (block name -> array), unless the epoch did not
        read what the key says (files skipped, or changed since they were listed): then
        None, with a warning, and the next epoch reads the files and fills it again.

        A disk cache filled in memory is served from memory at once and written out in
        the background; one written into its files is synced and published now.
        """
        publisher = self.publisher
        skipped = dataset.rows_skipped - self.skipped
        unchecked = None
        try:
            changed = dataset.changed_files()
        except Exception as err:  # an outage, access denied: whether they changed is unknown
            changed, unchecked = [], f"the files could not be checked ({type(err).__name__}: {err})"
        if skipped or changed or unchecked:
            why = (
                f"{skipped} rows of files deleted or changed during the epoch were replaced "
                "by repeats"
                if skipped
                else unchecked
                or f"{changed[0]} changed since it was listed"
                + (f" (and {len(changed) - 1} more files)" if len(changed) > 1 else "")
            )
            warnings.warn(
                f"not keeping the decoded rows of this epoch: {why}. The next epoch reads "
                "the files again",
                CacheWarning,
                stacklevel=1,
            )
            return None
        try:
            if self.files is None:
                files = {
                    name: self.lists[name].final() if name in self.lists else array
                    for name, array in self._files().items()
                }
                for array in files.values():
                    array.flags.writeable = False
                if publisher is not None and self.temp is not None:
                    publisher.write_in_background(self.stored, files, self.temp)
                    self.temp = None  # the writer's now
                return self.stored.arrays(files)
            self.files.sync_and_close()
            for arena in self.lists.values():
                arena.finish()
            files = self._files()
            temp = self.temp
            assert temp is not None
            assert publisher is not None
            try:
                sums = file_checksums([(temp / name, a.nbytes) for name, a in files.items()])
                arrays = {n: np.asarray(a) for n, a in files.items()}
                publisher.publish(self.stored, temp, arrays, sums)
            except OSError as error:
                if temp.exists():
                    raise
                # Deleted under this writer (its mappings still hold every row).
                warnings.warn(
                    f"could not publish the decoded cache in {publisher.store.root}: its "
                    f"temporary directory {temp} vanished (deleted by another process?) "
                    f"({type(error).__name__}). This loader keeps serving the rows it wrote; "
                    "the next one will decode the files again",
                    CacheWarning,
                    stacklevel=1,
                )
            self.temp = None
            return self.stored.arrays(files)
        except OSError as error:
            raise FillFailed(str(error)) from error

    def close(self) -> None:
        """Close the files; an incomplete fill's temporary directory is deleted."""
        if self.files is not None:
            self.files.close()
        for arena in self.lists.values():
            if isinstance(arena, AppendFile):
                arena.close()
        if self.temp is not None and self.publisher is not None:
            self.publisher.store.remove_temp(self.temp)
            self.temp = None
