"""The cache's policy: memory, disk or streaming, and filling a cache from an epoch.

`DecodedCache` ties the key (`key`), the files
(`store`) and the serving (`serve`)
together: every epoch it decides whether to serve the complete cache, to fill one while
streaming, or to stream alone (it does not fit, its directory is not safe, writing
failed). `Fill` is the cache being filled by one epoch.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from tabloader.cache import store as _store
from tabloader.cache.device import CachePlacement, serving_backend
from tabloader.cache.key import FORMAT, cache_key, digest, file_identities, lineage
from tabloader.cache.serve import CachedList, CachedRows, FillFailed, read_only
from tabloader.cache.store import (
    AppendFile,
    CacheDamaged,
    CacheFiles,
    CacheRefused,
    CacheStore,
    FileSpec,
    TempVanished,
    file_checksums,
    read_in,
    shrunk,
    write_npy,
)
from tabloader.decode.host import interleave
from tabloader.errors import CacheWarning, InvalidArgumentError
from tabloader.hostmem import map_in, populated_empty
from tabloader.plan import fixed_share

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from tabloader.backends import Backend, ReadRequest
    from tabloader.batches import Block, Layout
    from tabloader.dataset import Dataset
    from tabloader.stages import SplitWork
    from tabloader.stats import StatsRecorder

__all__ = ["CacheMode", "DecodedCache", "Fill", "cache_directory"]

CacheMode = Literal["memory", "disk"]

DISK_RESERVE_BYTES = 1 << 30
DISK_RESERVE_FRACTION = 0.05
WRITER_NICENESS = 10
"""Niceness of the thread writing a disk cache out while epochs are served (Linux)."""
_WRITERS: dict[str, threading.Thread] = {}
"""Background writers of disk caches, by key digest, until a loader waits for one."""
_WRITERS_LOCK = threading.Lock()


def cache_directory(cache_dir: object = None) -> Path:
    """Where disk caches live: ``cache_dir``, else ``$TABLOADER_CACHE_DIR``, else the user's
    cache directory (``$XDG_CACHE_HOME/tabloader`` or ``~/.cache/tabloader``).

    Examples:
        >>> str(cache_directory("/data/cache"))
        '/data/cache'
        >>> cache_directory(123)
        Traceback (most recent call last):
        ...
        tabloader.errors.InvalidArgumentError: cache_dir must be a path (str or ...), got 123
    """
    if cache_dir is not None:
        if not isinstance(cache_dir, (str, os.PathLike)):
            raise InvalidArgumentError(
                f"cache_dir must be a path (str or os.PathLike), got {cache_dir!r}"
            )
        path = os.fspath(cache_dir)
        if not isinstance(path, str) or not path.strip():
            raise InvalidArgumentError(
                f"cache_dir must name a directory, got {cache_dir!r}; leave it out for "
                "$TABLOADER_CACHE_DIR or ~/.cache/tabloader, or pass '.' for the current "
                "directory"
            )
        return Path(path).expanduser()
    env = os.environ.get("TABLOADER_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tabloader"


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _file_names(index: int, block: Block) -> list[str]:
    """The files block ``index`` is stored in: its ``[rows, k]`` array, or a list
    column's spans and values."""
    if block.ragged:
        return [f"block{index}.spans.npy", f"block{index}.values.npy"]
    return [f"block{index}.npy"]


class DecodedCache:
    """One loader's decoded cache: its key, where it lives, and the rows once complete.

    Created by [`Loader`][tabloader.Loader] when ``cache`` is given. Each epoch asks
    `epoch_backend` how to read: from the cache, from the files while writing the
    cache, or from the files alone when the cache does not fit or may not be used.
    """

    def __init__(
        self,
        mode: CacheMode,
        *,
        dataset: Dataset,
        blocks: Sequence[Block],
        layout: Layout,
        fill_null: Mapping[str, float],
        global_rank: int,
        global_size: int,
        cache_dir: str | os.PathLike[str] | None = None,
        max_bytes: int | None = None,
        placement: CachePlacement = "auto",
    ) -> None:
        self.mode = mode
        self.placement: CachePlacement = placement
        """Where a GPU loader serves the complete cache from (see `tabloader.cache.device`)."""
        self.placed: dict[int, Any] = {}
        """The complete cache placed for each GPU (device index -> its arrays)."""
        self.blocks = tuple(blocks)
        """The stored blocks: the layout's, or (for gathers) one row-major block per kind;
        each list column a block of its own."""
        self.layout = layout
        """How batches are delivered."""
        self.max_bytes = max_bytes
        if mode == "disk" and not dataset.files:
            raise InvalidArgumentError(
                "cache='disk' needs a dataset of files: the cache is keyed by their paths, "
                "sizes and contents, which an in-memory table or Dask DataFrame does not "
                "have. Use cache='memory'"
            )
        self.key = cache_key(
            files=file_identities(dataset),
            partition_rows=dataset.partition_rows,
            blocks=self.blocks,
            fill_null=fill_null,
            global_rank=global_rank,
            global_size=global_size,
        )
        self.digest = digest(self.key)
        self.store = CacheStore(cache_directory(cache_dir)) if mode == "disk" else None
        parts, starts, stops = fixed_share(
            dataset.partition_rows, global_rank=global_rank, global_size=global_size
        )
        lengths = stops - starts
        offsets = np.cumsum(lengths) - lengths
        self.share = (parts, starts, stops, offsets)
        self.num_rows = int(lengths.sum())
        # Cache row of row j of partition p: base[p] + j.
        base = np.full(dataset.num_partitions, -1, dtype=np.int64)
        base[parts] = offsets - starts
        self.rows = CachedRows(self.blocks, layout, base)
        """Where each cached row lives, and how batches are gathered from them."""
        # List columns' values are counted once read; their spans are known now.
        self.nbytes = sum(
            self.num_rows * (16 if b.ragged else b.width * b.dtype.itemsize) for b in self.blocks
        )
        self.arrays: dict[str, Any] | None = None
        """Block name -> read-only ``[rows, k]`` array (a list column: a
        `CachedList`), once the cache is complete."""
        self.refused: str | None = None
        """Why the cache is not used (it does not fit, its directory may not be used,
        writing it failed), once found out; "" once found usable."""
        if self.store is not None:
            reason = self.store.prepare()
            if reason is not None:
                self.refuse(
                    f"the cache directory may not be used: {reason}. Make it yours and "
                    f"private (chmod 700), or pass cache_dir= (or set TABLOADER_CACHE_DIR) "
                    "to a directory of your own",
                    stacklevel=4,
                )

    @property
    def root(self) -> Path | None:
        """The directory of disk caches (None for a memory cache)."""
        return None if self.store is None else self.store.root

    @property
    def path(self) -> Path | None:
        """The published cache's directory (disk caches)."""
        return None if self.store is None else self.store.path(self.digest)

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes open the published cache themselves (or fill their own).
        return {**self.__dict__, "arrays": None, "placed": {}}

    def file_specs(self, lengths: Mapping[str, int] | None = None) -> list[FileSpec]:
        """The files of a disk cache, in order; a list column's values of ``lengths[name]``
        values (of any length without)."""
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

    def blocks_of(self, files: Mapping[str, Any]) -> dict[str, Any]:
        """Block name -> array (or `CachedList`) of a cache's files by name."""
        arrays: dict[str, Any] = {}
        for i, b in enumerate(self.blocks):
            names = _file_names(i, b)
            arrays[b.name] = (
                CachedList(files[names[1]], files[names[0]]) if b.ragged else files[names[0]]
            )
        return arrays

    # -- finding, sizing ------------------------------------------------------------

    def unplace(self) -> None:
        """Let go of the copies placed for GPUs (in GPU or pinned host memory): a GPU
        loader that closes gives their memory back; an epoch through the cache places it
        again."""
        self.placed = {}

    def discard(self) -> None:
        """Forget this cache, and delete its published directory (a disk cache): a
        refreshing dataset's loader replaces it when the files change."""
        self.arrays = None
        self.placed = {}
        if self.store is not None:
            with _WRITERS_LOCK:
                writer = _WRITERS.pop(self.digest, None)
            if writer is not None:
                writer.join()
            self.store.remove(self.digest)

    def lookup(self) -> bool:
        """Whether a complete cache is available (opening a published one from disk, its
        checksums verified). A damaged one is said, deleted and written again; one
        that may not be used is said, and the loader streams."""
        if self.arrays is not None:
            parts = (
                p
                for a in self.arrays.values()
                for p in ((a.values, a.spans) if isinstance(a, CachedList) else (a,))
            )
            cut = next(filter(None, map(shrunk, parts)), None)
            if cut is None:
                return True
            # Served from a file cut short since it was mapped: reading past its new
            # end would kill the process (SIGBUS), so it is not read again.
            warnings.warn(
                f"the decoded cache in {self.path} was cut short while in use ({cut}): it "
                "is deleted and written again; this epoch reads the files",
                CacheWarning,
                stacklevel=5,
            )
            self.arrays, self.placed = None, {}
            if self.store is not None:
                self.store.remove(self.digest)
            return False
        if self.store is None or self.refused:
            return False
        self.wait()
        # What writers killed mid-write left behind goes, not only when a cache is
        # written again (a published cache may be found for months).
        self.store.remove_abandoned()
        try:
            files = self.store.open(self.digest, self.key, self.file_specs())
        except CacheRefused as error:
            self.refuse(
                f"the published cache may not be used: {error}. It stays until it is deleted "
                f"(tabloader never deletes what it cannot trust as this user's own): delete "
                f"{self.path} (rm -r, as its owner or root), or pass cache_dir= (or set "
                "TABLOADER_CACHE_DIR) to a directory of your own",
                stacklevel=5,
            )
            return False
        except CacheDamaged as error:
            warnings.warn(
                f"the decoded cache in {self.path} is damaged or was altered ({error}): it "
                "is deleted and written again; this epoch reads the files",
                CacheWarning,
                stacklevel=5,
            )
            self.store.remove(self.digest)
            return False
        if files is None:
            return False
        if self.fits_in_memory():
            # Read in at once, in large sequential reads, rather than page by page as
            # the shuffled gathers first touch it (verifying the checksums read it too).
            for array in files.values():
                read_in(array)
        self.adopt(self.blocks_of({n: np.asarray(a) for n, a in files.items()}))
        return True

    def wait(self) -> None:
        """Wait until this cache's files, written in the background, are published."""
        with _WRITERS_LOCK:
            writer = _WRITERS.pop(self.digest, None)
        if writer is not None:
            writer.join()

    def served(self) -> dict[str, Any]:
        """The complete cache, read-only (a batch that is a view cannot change it)."""
        assert self.arrays is not None
        return read_only(self.arrays)

    def why_not(self) -> str | None:
        """Why the cache cannot be written now (too big), or None when it fits."""
        need = self.nbytes
        if self.max_bytes is not None and need > self.max_bytes:
            return (
                f"it would take {_mib(need)} ({need} bytes), more than cache_max_bytes="
                f"{self.max_bytes}. Raise cache_max_bytes, or select fewer columns"
            )
        if self.store is None:
            available = _available_memory()
            if available is not None and need > available // 2:
                return (
                    f"it would take {_mib(need)} of memory and only {_mib(available)} is "
                    "available (the cache may use half). Use cache='disk'"
                )
            return None
        free, total = self.store.disk_usage()
        reserve = min(DISK_RESERVE_BYTES, int(total * DISK_RESERVE_FRACTION))
        if need > free - reserve:
            return (
                f"it would take {_mib(need)} on {self.store.root}, which has {_mib(free)} "
                f"free (the cache leaves {_mib(reserve)} free). Free some space, or pass "
                "cache_dir= (or set TABLOADER_CACHE_DIR) to a larger disk"
            )
        return None

    def epoch_backend(self, backend: Backend, stats: StatsRecorder) -> Backend:
        """How this epoch reads: from the cache, from the files into the cache, or from
        the files alone (when the cache does not fit or may not be used: said once, by
        a [`CacheWarning`][tabloader.errors.CacheWarning]).
        """
        serve = partial(serving_backend, self, backend, placement=self.placement, stats=stats)
        if self.lookup():
            stats.from_cache = True
            stats.cache_epochs += 1
            stats.cache_bytes = self.nbytes
            return serve(write=False)
        stats.from_cache = False
        if not self.decide(stacklevel=5):
            return backend
        return serve(write=True)

    def decide(self, *, stacklevel: int = 2) -> bool:
        """Whether this cache is used: a published or complete one is; else one that
        fits (found out now, once: one that does not is refused and said)."""
        if self.refused is None and self.arrays is None:
            reason = self.why_not()
            if reason is not None:
                self.refuse(reason, stacklevel=stacklevel + 1)
                return False
            self.refused = ""
        return self.usable

    def refuse(self, reason: str, *, stacklevel: int = 2) -> None:
        """Stop caching (every epoch streams from now on), and say why, once."""
        self.refused = reason
        warnings.warn(
            f"not caching the decoded rows: {reason}. Every epoch reads and decodes the "
            "files instead",
            CacheWarning,
            stacklevel=stacklevel,
        )

    @property
    def usable(self) -> bool:
        """False once the cache was found not to fit (the loader then streams)."""
        return not self.refused

    def fits_in_memory(self) -> bool:
        """Whether a disk cache is small enough to be kept in memory too (a quarter of
        the available memory): filled in memory, served from it at once and written out
        in the background; read in at once when a later loader maps it."""
        available = _available_memory()
        return available is not None and self.nbytes <= available // 4

    # -- filling --------------------------------------------------------------------

    def start_fill(self, request: ReadRequest) -> Fill | None:
        """A new `Fill` for the epoch of ``request``, or None (said once, and
        every epoch streams) when its files cannot be made."""
        in_memory = self.store is None or self.fits_in_memory()
        try:
            return Fill(self, in_memory=in_memory, skipped=request.dataset.rows_skipped)
        except OSError as error:  # the disk filled up since its free space was measured
            self.refuse(
                f"its files could not be created ({type(error).__name__}: {error})",
                stacklevel=1,
            )
            return None

    def missing_pieces(self, written: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        """The share's rows not in ``written`` pieces, as ``(partition, start, stop)``.

        An epoch leaves rows out with ``drop_last`` or when a worker process reads only
        its part: the cache must hold them all the same.

        Examples are in the tests (they need a dataset).
        """
        by_partition: dict[int, list[tuple[int, int]]] = {}
        for p, a, b in written:
            by_partition.setdefault(p, []).append((a, b))
        missing = []
        parts, starts, stops, _ = self.share
        for p, lo, hi in zip(parts.tolist(), starts.tolist(), stops.tolist(), strict=True):
            at = lo
            for a, b in sorted(by_partition.get(p, [])):
                if a > at:
                    missing.append((p, at, a))
                at = max(at, b)
            if at < hi:
                missing.append((p, at, hi))
        return missing

    def adopt(self, arrays: Mapping[str, Any]) -> None:
        """Serve ``arrays`` (block name -> complete rows) from now on."""
        if self.arrays is None:
            self.arrays = read_only(arrays)
            # Now that list columns' values are counted too.
            self.nbytes = sum(
                int(a.values.nbytes) + int(a.spans.nbytes)
                if isinstance(a, CachedList)
                else int(a.nbytes)
                for a in self.arrays.values()
            )

    def manifest(
        self, files: Mapping[str, NDArray[Any]], sums: Sequence[list[str]]
    ) -> dict[str, Any]:
        """What a published cache says of itself: its key, blocks and files with their
        checksums."""
        return {
            "format": FORMAT,
            "key": self.key,
            "lineage": lineage(self.key),
            "rows": self.num_rows,
            "bytes": int(sum(a.nbytes for a in files.values())),
            "blocks": [
                {
                    "name": b.name,
                    "columns": list(b.columns),
                    "dtype": str(b.dtype),
                    "ragged": b.ragged,
                    "files": _file_names(i, b),
                }
                for i, b in enumerate(self.blocks)
            ],
            "files": [
                {
                    "file": name,
                    "shape": list(array.shape),
                    "dtype": str(array.dtype),
                    "sha256": digests,
                }
                for (name, array), digests in zip(files.items(), sums, strict=True)
            ],
            "segment_bytes": _store.SEGMENT_BYTES,
            "created": time.time(),
        }

    def publish(
        self, temp: Path, files: Mapping[str, NDArray[Any]], sums: Sequence[list[str]]
    ) -> None:
        """Publish the cache written into ``temp`` (its ``files`` and their checksums),
        then delete the caches of earlier versions of the same files."""
        assert self.store is not None
        self.store.publish(temp, self.digest, self.manifest(files, sums), self._published_sound)
        self.store.remove_older_versions(self.digest, lineage(self.key))

    def _published_sound(self) -> bool:
        assert self.store is not None
        try:
            return self.store.open(self.digest, self.key, self.file_specs()) is not None
        except (CacheRefused, CacheDamaged):
            return False

    def write_in_background(self, files: Mapping[str, NDArray[Any]], temp: Path) -> None:
        """Write ``files`` into ``temp`` and publish them, in a thread of their own
        (``tabloader-cache-writer``); a loader on the same cache waits for it first."""
        writer = threading.Thread(
            target=self._persist_or_warn,
            args=(dict(files), temp),
            name="tabloader-cache-writer",
            daemon=True,
        )
        with _WRITERS_LOCK:  # started before it is found: join() refuses a thread not started
            writer.start()
            _WRITERS[self.digest] = writer
        # Wait for the files at exit, rather than leave them unpublished.
        weakref.finalize(writer, writer.join)

    def _persist_or_warn(self, files: dict[str, NDArray[Any]], temp: Path) -> None:
        assert self.store is not None
        if sys.platform.startswith("linux"):
            # Copying a gigabyte into the page cache takes seconds of CPU: on Linux a
            # thread has its own priority, so this one yields to the epochs being served.
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICENESS)
        try:
            sums = [write_npy(temp / name, array) for name, array in files.items()]
            self.publish(temp, files, sums)
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

    def __init__(self, cache: DecodedCache, *, in_memory: bool, skipped: int) -> None:
        self.cache = cache
        self.skipped = skipped
        """Rows the dataset had skipped before this epoch (``on_missing="skip"``)."""
        self.temp: Path | None = None
        self.files: CacheFiles | None = None
        self.arrays: dict[str, Any] = {}
        """File name -> its array being filled (in memory)."""
        self.lists: dict[str, Any] = {}
        """File name of a list column's values -> its `_Growing` or `AppendFile`."""
        self.done = False
        self._served: dict[str, Any] | None = None
        store = cache.store
        specs = cache.file_specs()
        fixed = [s for s in specs if s.shape is not None]
        if store is not None:
            store.remove_abandoned()
            self.temp = store.new_temp(cache.digest)
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
            for i, b in enumerate(self.cache.blocks):
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
        names = [s.name for s in self.cache.file_specs()]
        merged = {**fixed, **values}
        return {name: merged[name] for name in names}

    def served(self) -> dict[str, Any]:
        """Block name -> the rows written so far (read-only), for gathering."""
        if self._served is None:
            self._served = read_only(self.cache.blocks_of(self._files()))
        return self._served

    def complete(self, dataset: Dataset) -> None:
        """Make the filled arrays the cache, unless the epoch did not read what the key
        says (files skipped, or changed since they were listed): then it is dropped, with
        a warning, and the next epoch reads the files and fills it again.

        A disk cache filled in memory is served from memory at once and written out in
        the background; one written into its files is synced and published now.
        """
        cache = self.cache
        skipped = dataset.rows_skipped - self.skipped
        changed = dataset.changed_files()
        if skipped or changed:
            why = (
                f"{skipped} rows of files deleted or changed during the epoch were replaced "
                "by repeats"
                if skipped
                else f"{changed[0]} changed since it was listed"
                + (f" (and {len(changed) - 1} more files)" if len(changed) > 1 else "")
            )
            warnings.warn(
                f"not keeping the decoded rows of this epoch: {why}. The next epoch reads "
                "the files again",
                CacheWarning,
                stacklevel=1,
            )
            return
        try:
            if self.files is None:
                files = {
                    name: self.lists[name].final() if name in self.lists else array
                    for name, array in self._files().items()
                }
                for array in files.values():
                    array.flags.writeable = False
                cache.adopt(cache.blocks_of(files))
                if self.temp is not None:
                    cache.write_in_background(files, self.temp)
                    self.temp = None  # the writer's now
                self.done = True
                return
            self.files.sync_and_close()
            for arena in self.lists.values():
                arena.finish()
            files = self._files()
            temp = self.temp
            assert temp is not None
            try:
                sums = file_checksums([(temp / name, a.nbytes) for name, a in files.items()])
                cache.publish(temp, {n: np.asarray(a) for n, a in files.items()}, sums)
            except OSError as error:
                if temp.exists():
                    raise
                # Deleted under this writer (its mappings still hold every row).
                warnings.warn(
                    f"could not publish the decoded cache in {cache.root}: its temporary "
                    f"directory {temp} vanished (deleted by another process?) "
                    f"({type(error).__name__}). This loader keeps serving the rows it wrote; "
                    "the next one will decode the files again",
                    CacheWarning,
                    stacklevel=1,
                )
            self.temp = None
            cache.adopt(cache.blocks_of(files))
            self.done = True
        except OSError as error:
            raise FillFailed(str(error)) from error

    def close(self) -> None:
        """Close the files; an incomplete fill's temporary directory is deleted."""
        if self.files is not None:
            self.files.close()
        for arena in self.lists.values():
            if isinstance(arena, AppendFile):
                arena.close()
        if self.temp is not None and self.cache.store is not None:
            self.cache.store.remove_temp(self.temp)
            self.temp = None
