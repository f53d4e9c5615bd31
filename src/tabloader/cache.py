"""The decoded cache: one rank's rows, decoded, cast and filled once, served every epoch after.

Decoding parquet sets the pace of a streaming loader. With ``cache="memory"`` or
``cache="disk"`` the first epoch reads the files as usual and writes every decoded row
of the rank's share into row-major ``[rows, k]`` arrays (in the delivered dtype, nulls
filled) at the row's place in the share's stored order: one array per kind (cats,
conts, labels) for shuffled or stacked loaders, whose gathers then read whole rows; one
per column for unshuffled ``layout="columns"`` loaders, whose batches are then
zero-copy views. Every epoch, the first one included,
then gathers its batches from those arrays following the same
[`EpochPlan`][tabloader.plan.EpochPlan], so a cached epoch delivers exactly the batches a
streamed one would. Later epochs read nothing but the cache.

On disk, a cache is a directory named by the hash of its key (the files' paths, sizes
and modification times or ETags, the row groups, the delivered columns with their
dtypes, blocks and fill values, and the rank's share) holding one ``.npy`` file per block
and a ``manifest.json``. It is written into a temporary directory and published by one
``os.replace`` once complete, so a crash or an interrupted epoch never leaves a cache
that a later loader would trust.

Examples:
    >>> import pyarrow as pa, tabloader
    >>> table = pa.table({"x": [0.5, 1.5, 2.5, 3.5]})
    >>> loader = tabloader.Loader(table, conts=["x"], batch_size=2, cache="memory")
    >>> [b["x"].tolist() for b in loader], loader.stats().from_cache
    ([[0.5, 1.5], [2.5, 3.5]], False)
    >>> [b["x"].tolist() for b in loader], loader.stats().from_cache
    ([[0.5, 1.5], [2.5, 3.5]], True)
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import mmap
import os
import secrets
import shutil
import socket
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from tabloader.backends.cpu import (
    decode_ahead,
    decode_pieces,
    drawn_ahead,
    interleave,
    populated_empty,
)
from tabloader.batches import empty_segment
from tabloader.errors import CacheWarning, InvalidArgumentError
from tabloader.memory import address
from tabloader.plan import fixed_share
from tabloader.reader import SplitWork, usable_cores

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from tabloader.backends import Backend, ReadRequest
    from tabloader.batches import Block, Layout, Part, Segment
    from tabloader.dataset import Dataset
    from tabloader.plan import EpochPlan
    from tabloader.stats import StatsRecorder

__all__ = ["CacheMode", "DecodedCache", "cache_directory", "cache_key", "file_identities"]

CacheMode = Literal["memory", "disk"]

FORMAT = 1
"""Version of the on-disk layout; part of the key, so a new layout never reads an old one."""
MANIFEST = "manifest.json"
_TEMP_PREFIX = ".tmp-"
_OWNER = "owner.json"
_DISK_RESERVE_BYTES = 1 << 30
_DISK_RESERVE_FRACTION = 0.05
_WRITE_THREADS = 2
"""Threads writing a decoded piece into a cache being filled, the reader's included."""
_GATHER_THREADS = 4
"""Most threads gathering a cached epoch's batches at once."""
_PAGE = 4096
"""Alignment of direct writes: memory, file offsets and sizes (a disk block or page)."""
_DIRECT_WRITE_BYTES = 64 << 20
"""Bytes per system call when a cache file is written directly."""
_WRITE_ROWS = 16384
"""Rows interleaved in a scratch block and written per system call when a cache too
large for memory is written into its files: a few MiB, which stay in the CPU's cache."""
_WRITER_NICENESS = 10
"""Niceness of the thread writing a disk cache out while epochs are served (Linux)."""
_TILE_ROWS = 2048
"""Rows gathered at a time by `take_transposed`: a tile of a wide block (26
int64 columns: 416 KiB) stays in a core's L2 cache."""
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
"""madvise(2) advice that maps a file's pages in, reading them (Linux 5.14 and later)."""
_WRITERS: dict[str, threading.Thread] = {}
"""Background writers of disk caches, by key digest, until a loader waits for one."""
_WRITERS_LOCK = threading.Lock()


def cache_directory(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where disk caches live: ``cache_dir``, else ``$TABLOADER_CACHE_DIR``, else the user's
    cache directory (``$XDG_CACHE_HOME/tabloader`` or ``~/.cache/tabloader``).

    Examples:
        >>> str(cache_directory("/data/cache"))
        '/data/cache'
    """
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("TABLOADER_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tabloader"


def file_identities(dataset: Dataset) -> list[dict[str, Any]]:
    """Path, size and modification time (or ETag) of every file of ``dataset`` (after the
    table version, for a Delta or Iceberg table).

    A file rewritten in place changes its size, its modification time or its ETag, and
    so the cache key.
    """
    # The fsspec filesystem of a remote dataset (None for local files).
    filesystem = getattr(getattr(dataset, "_source", None), "filesystem", None)
    identities: list[dict[str, Any]] = []
    if dataset.version is not None:  # a Delta or Iceberg table: keyed by its version too
        identities.append({"path": f"{dataset.table_format} table", "version": dataset.version})
    for path in dataset.files:
        if filesystem is None:
            st = os.stat(path)
            identities.append(
                {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            )
            continue
        info = filesystem.info(path)
        identity = {"path": f"{getattr(filesystem, 'protocol', '')}:{path}"}
        identity["size"] = info.get("size")
        for name in ("ETag", "etag", "LastModified", "mtime", "last_modified", "created"):
            if info.get(name) is not None:
                identity[name] = str(info[name])
        identities.append(identity)
    return identities


def cache_key(
    *,
    files: Sequence[Mapping[str, Any]],
    partition_rows: NDArray[np.int64],
    blocks: Sequence[Block],
    fill_null: Mapping[str, float],
    global_rank: int,
    global_size: int,
) -> dict[str, Any]:
    """Everything that shapes the rows a cache stores, as JSON-ready values.

    Examples:
        >>> from tabloader.batches import Block
        >>> key = cache_key(files=[{"path": "/d/a.parquet", "size": 10, "mtime_ns": 1}],
        ...                 partition_rows=np.array([5]), fill_null={},
        ...                 blocks=[Block("x", ("x",), np.dtype("float32"))],
        ...                 global_rank=0, global_size=1)
        >>> key["blocks"], key["share"]
        ([['x', ['x'], 'float32']], [0, 1])
    """
    columns = {c for b in blocks for c in b.columns}
    return {
        "format": FORMAT,
        "files": [dict(f) for f in files],
        "partition_rows": [int(n) for n in partition_rows],
        "blocks": [[b.name, list(b.columns), str(b.dtype)] for b in blocks],
        "fill_null": {c: float(v) for c, v in sorted(fill_null.items()) if c in columns},
        "share": [global_rank, global_size],
    }


def _digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _lineage(key: Mapping[str, Any]) -> str:
    """The key without the files' versions: caches of earlier versions of the same files."""
    return _digest({**key, "files": [f["path"] for f in key["files"]], "partition_rows": None})


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


class DecodedCache:
    """One loader's decoded cache: its key, where it lives, and the rows once complete.

    Created by [`Loader`][tabloader.Loader] when ``cache`` is given. Each epoch asks
    `epoch_backend` how to read: from the cache, from the files while writing the
    cache, or from the files alone when the cache does not fit.
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
    ) -> None:
        self.mode = mode
        self.blocks = tuple(blocks)
        """The stored blocks: the layout's, or (for gathers) one row-major block per kind."""
        self.layout = layout
        """How batches are delivered."""
        self.max_bytes = max_bytes
        files = dataset.files
        if mode == "disk" and not files:
            raise InvalidArgumentError(
                "cache='disk' needs a dataset of files: the cache is keyed by their paths, "
                "sizes and modification times, which an in-memory table or Dask DataFrame "
                "does not have. Use cache='memory'"
            )
        self.key = cache_key(
            files=file_identities(dataset),
            partition_rows=dataset.partition_rows,
            blocks=self.blocks,
            fill_null=fill_null,
            global_rank=global_rank,
            global_size=global_size,
        )
        self.digest = _digest(self.key)
        self.root = cache_directory(cache_dir) if mode == "disk" else None
        parts, starts, stops = fixed_share(
            dataset.partition_rows, global_rank=global_rank, global_size=global_size
        )
        lengths = stops - starts
        offsets = np.cumsum(lengths) - lengths
        self.share = (parts, starts, stops, offsets)
        self.rows = int(lengths.sum())
        # Cache row of row j of partition p: base[p] + j.
        self._base = np.full(dataset.num_partitions, -1, dtype=np.int64)
        self._base[parts] = offsets - starts
        self.nbytes = sum(self.rows * len(b.columns) * b.dtype.itemsize for b in self.blocks)
        self.arrays: dict[str, NDArray[Any]] | None = None
        """Block name -> read-only ``[rows, k]`` array, once the cache is complete."""
        self.refused: str | None = None
        """Why the cache is not used (it does not fit), once found out."""

    @property
    def path(self) -> Path | None:
        """The published cache's directory (disk caches)."""
        return None if self.root is None else self.root / self.digest

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes open the published cache themselves (or fill their own).
        return {**self.__dict__, "arrays": None}

    # -- finding, sizing ------------------------------------------------------------

    def discard(self) -> None:
        """Forget this cache, and delete its published directory (a disk cache): a
        refreshing dataset's loader replaces it when the file list changes."""
        self.arrays = None
        if self.root is not None:
            with _WRITERS_LOCK:
                writer = _WRITERS.pop(self.digest, None)
            if writer is not None:
                writer.join()
            shutil.rmtree(self.root / self.digest, ignore_errors=True)

    def lookup(self) -> bool:
        """Whether a complete cache is available (opening a published one from disk)."""
        if self.arrays is not None:
            return True
        if self.root is None:
            return False
        with _WRITERS_LOCK:
            writer = _WRITERS.pop(self.digest, None)
        if writer is not None:
            writer.join()
        arrays = self._open(self.root / self.digest, load=True)
        if arrays is not None:
            self.arrays = arrays
        return self.arrays is not None

    def wait(self) -> None:
        """Wait until this cache's files, written in the background, are published."""
        with _WRITERS_LOCK:
            writer = _WRITERS.get(self.digest)
        if writer is not None:
            writer.join()

    def _open(self, directory: Path, *, load: bool = False) -> dict[str, NDArray[Any]] | None:
        """The published cache in ``directory``, mapped, if it is complete and has this key.

        The files are mapped, not copied: every process serving the cache shares the
        operating system's page cache, which it can reclaim. With ``load``, a cache that
        fits in memory (see `_fits_in_memory`) is read in at once, in large
        sequential reads, rather than page by page as the shuffled gathers first touch
        it. Measured from a cold disk (4M rows, 1 GB): a first shuffled epoch of 0.65 s,
        against 1.5-2.1 s when the files were read into private memory; paging in on
        demand made the gathers alone 1.7x slower than reading in and gathering.
        """
        try:
            manifest = json.loads((directory / MANIFEST).read_text())
        except (OSError, ValueError):
            return None
        if manifest.get("key") != self.key:
            return None
        arrays = {}
        try:
            for b, entry in zip(self.blocks, manifest["blocks"], strict=True):
                array = np.load(directory / entry["file"], mmap_mode="r")
                if array.shape != (self.rows, len(b.columns)) or array.dtype != b.dtype:
                    return None
                arrays[b.name] = array
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if load and self._fits_in_memory():
            for array in arrays.values():
                _read_in(array)
        return {name: np.asarray(array) for name, array in arrays.items()}

    def why_not(self) -> str | None:
        """Why the cache cannot be written now (too big), or None when it fits."""
        need = self.nbytes
        if self.max_bytes is not None and need > self.max_bytes:
            return (
                f"it would take {_mib(need)} ({need} bytes), more than cache_max_bytes="
                f"{self.max_bytes}. Raise cache_max_bytes, or select fewer columns"
            )
        if self.root is None:
            available = _available_memory()
            if available is not None and need > available // 2:
                return (
                    f"it would take {_mib(need)} of memory and only {_mib(available)} is "
                    "available (the cache may use half). Use cache='disk'"
                )
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        usage = shutil.disk_usage(self.root)
        reserve = min(_DISK_RESERVE_BYTES, int(usage.total * _DISK_RESERVE_FRACTION))
        if need > usage.free - reserve:
            return (
                f"it would take {_mib(need)} on {self.root}, which has {_mib(usage.free)} free "
                f"(the cache leaves {_mib(reserve)} free). Free some space, or pass "
                "cache_dir= (or set TABLOADER_CACHE_DIR) to a larger disk"
            )
        return None

    def epoch_backend(self, backend: Backend, stats: StatsRecorder) -> Backend:
        """How this epoch reads: from the cache, from the files into the cache, or from
        the files alone (when the cache does not fit: said once, by a
        [`CacheWarning`][tabloader.errors.CacheWarning]).
        """
        if self.lookup():
            stats.from_cache = True
            stats.cache_epochs += 1
            stats.cache_bytes = self.nbytes
            return _CacheBackend(self, backend, write=False)
        stats.from_cache = False
        if self.refused is None:
            reason = self.why_not()
            if reason is not None:
                self.refuse(reason, stacklevel=5)
                return backend
            self.refused = ""
        if self.refused:
            return backend
        return _CacheBackend(self, backend, write=True)

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

    # -- writing ------------------------------------------------------------------

    def _fits_in_memory(self) -> bool:
        """Whether a disk cache is small enough to be kept in memory too (a quarter of
        the available memory): filled in memory, served from it at once and written out
        in the background; read in at once when a later loader maps it."""
        available = _available_memory()
        return available is not None and self.nbytes <= available // 4

    def _new_arrays(self) -> tuple[dict[str, NDArray[Any]], Path | None, CacheFiles | None]:
        """Empty arrays to fill, the temporary directory of a disk cache, and the files
        being written in it when the cache does not fit in memory.

        A disk cache that fits is filled in memory and written out when complete; one
        that does not is written straight into its ``.npy`` files (`CacheFiles`),
        and the arrays are read-only mappings of them.
        """
        in_memory = self.root is None or self._fits_in_memory()
        arrays: dict[str, NDArray[Any]] = {}
        if in_memory:
            # Mapped in at once: page by page, filling a fresh gigabyte costs a second.
            arrays = {
                b.name: populated_empty((self.rows, len(b.columns)), b.dtype) for b in self.blocks
            }
        if self.root is None:
            return arrays, None, None
        self.root.mkdir(parents=True, exist_ok=True)
        self._remove_abandoned()
        temp = self.root / f"{_TEMP_PREFIX}{self.digest}-{os.getpid()}-{secrets.token_hex(4)}"
        temp.mkdir()
        try:
            owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
            (temp / _OWNER).write_text(json.dumps(owner))
            if in_memory:
                return arrays, temp, None
            files = CacheFiles(temp, self.blocks, self.rows)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        return files.mapped(), temp, files

    def _remove_abandoned(self) -> None:
        """Delete temporary directories whose writer (on this host) is gone."""
        assert self.root is not None
        host = socket.gethostname()
        for temp in self.root.glob(f"{_TEMP_PREFIX}*"):
            try:
                owner = json.loads((temp / _OWNER).read_text())
            except (OSError, ValueError):
                owner = None
            if owner is None:
                # No owner file: crashed before writing it, or being created right now.
                stale = time.time() - temp.stat().st_mtime > 3600
            else:
                stale = owner.get("host") == host and not _pid_alive(int(owner.get("pid", 0)))
            if stale:
                shutil.rmtree(temp, ignore_errors=True)

    def _complete(
        self, arrays: dict[str, NDArray[Any]], temp: Path | None, files: CacheFiles | None
    ) -> None:
        """Make the filled ``arrays`` the cache.

        A disk cache filled in memory is served from memory at once and written out by
        a background thread (``tabloader-cache-writer``), which publishes it when its
        files are on disk; a loader on the same cache waits for that thread first. A
        cache written into its ``files`` is synced and published now, and the next
        epoch maps the published files.
        """
        if temp is not None and files is not None:
            files.sync_and_close()
            self._persist({}, temp)
            return  # the next epoch maps the published files
        for array in arrays.values():
            array.flags.writeable = False
        if self.arrays is None:
            self.arrays = arrays
        if temp is None:
            return
        writer = threading.Thread(
            target=self._persist_or_warn,
            args=(arrays, temp),
            name="tabloader-cache-writer",
            daemon=True,
        )
        with _WRITERS_LOCK:  # started before it is found: join() refuses a thread not started
            writer.start()
            _WRITERS[self.digest] = writer
        # Wait for the files at exit, rather than leave them unpublished.
        weakref.finalize(writer, writer.join)

    def _persist_or_warn(self, arrays: dict[str, NDArray[Any]], temp: Path) -> None:
        if sys.platform.startswith("linux"):
            # Copying a gigabyte into the page cache takes seconds of CPU: on Linux a
            # thread has its own priority, so this one yields to the epochs being served.
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _WRITER_NICENESS)
        try:
            self._persist(arrays, temp)
        except Exception as error:  # the loader goes on from memory; the user is told
            shutil.rmtree(temp, ignore_errors=True)
            warnings.warn(
                f"could not write the decoded cache to {self.root}: "
                f"{type(error).__name__}: {error}. This loader keeps serving it from memory; "
                "the next one will decode the files again",
                CacheWarning,
                stacklevel=1,
            )

    def _persist(self, arrays: dict[str, NDArray[Any]], temp: Path) -> None:
        """Write ``arrays`` (none when they are in ``temp`` already) into ``temp`` and
        publish it atomically as the cache."""
        assert self.root is not None
        for i, array in enumerate(arrays.values()):
            write_npy(temp / f"block{i}.npy", array)
        manifest = {
            "format": FORMAT,
            "key": self.key,
            "lineage": _lineage(self.key),
            "rows": self.rows,
            "bytes": self.nbytes,
            "blocks": [
                {
                    "name": b.name,
                    "columns": list(b.columns),
                    "dtype": str(b.dtype),
                    "file": f"block{i}.npy",
                }
                for i, b in enumerate(self.blocks)
            ],
            "created": time.time(),
        }
        with open(temp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        (temp / _OWNER).unlink()
        target = self.root / self.digest
        try:
            os.replace(temp, target)
        except OSError:
            # Another process published first (or a broken directory is in the way).
            if self._open(target) is None:
                shutil.rmtree(target, ignore_errors=True)
                with contextlib.suppress(OSError):
                    os.replace(temp, target)
            shutil.rmtree(temp, ignore_errors=True)
        self._remove_older_versions()

    def _remove_older_versions(self) -> None:
        """Delete published caches of earlier versions of the same files (now stale)."""
        assert self.root is not None
        lineage = _lineage(self.key)
        for manifest_path in self.root.glob(f"*/{MANIFEST}"):
            directory = manifest_path.parent
            if directory.name == self.digest or directory.name.startswith(_TEMP_PREFIX):
                continue
            try:
                if json.loads(manifest_path.read_text()).get("lineage") == lineage:
                    shutil.rmtree(directory, ignore_errors=True)
            except (OSError, ValueError):
                continue

    def _write(
        self,
        arrays: dict[str, NDArray[Any]],
        files: CacheFiles | None,
        first_row: int,
        piece: dict[str, Any],
        work: SplitWork,
    ) -> None:
        """Cast one decoded piece's columns into their blocks' rows from ``first_row``
        (into ``files`` when given), ``work``'s threads a share of the rows each."""
        n = len(next(iter(piece.values())))
        jobs: list[tuple[int, Callable[[], None]]] = []
        for b in self.blocks:
            rows = arrays[b.name][first_row : first_row + n]
            for share in work.shares(n):
                part = [piece[c][share] for c in b.columns]
                if files is None:
                    job = partial(interleave, part, rows[share])
                else:
                    job = partial(files.write_rows, b.name, first_row + share.start, part)
                jobs.append((len(part[0]) * len(part), job))
        work.run(jobs)

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

    # -- serving --------------------------------------------------------------------

    def delivery_rows(self, plan: EpochPlan, chunk: int) -> NDArray[np.int64] | None:
        """The cache rows of chunk ``chunk`` of ``plan`` in delivery order; None when
        the chunk is served as views of the cache (stored order, stored layout)."""
        order = plan.batch_order(chunk)
        if order is None and self.blocks == self.layout.blocks:
            return None
        pieces = plan.pieces(chunk)
        rows = np.concatenate(
            [np.arange(self._base[p] + s, self._base[p] + e, dtype=np.int64) for p, s, e in pieces]
        )
        return rows if order is None else rows[order]

    def batch_tasks(
        self,
        arrays: Mapping[str, NDArray[Any]],
        plan: EpochPlan,
        chunks: Iterable[tuple[int, NDArray[np.int64] | None]],
        xp: Any,
    ) -> Iterator[Callable[[], list[Part]]]:
        """The parts of ``plan``'s chunks over the cache ``arrays``, as tasks that
        gather them (run in order by `_run_ahead`, several at once); ``chunks``
        gives each chunk's `delivery_rows`, in order.

        Without shuffling, a chunk's pieces are zero-copy views of the cache. With
        shuffling, rows are gathered from the cache in the plan's order one whole batch
        at a time (so memory holds a few batches, not a chunk): a batch that begins at
        the end of one chunk and ends in the next is gathered once, from both, rather
        than in two parts copied together again. Rows are stored row-major per kind, so
        a gathered row is a few contiguous cache lines, not one random access per column.
        """
        carried: list[NDArray[np.int64]] = []  # the rows of a batch begun in a chunk before
        for chunk, rows in chunks:
            if rows is None:
                pieces = plan.pieces(chunk)
                first = [int(self._base[p]) + s for p, s, _ in pieces]
                views: list[Part] = [
                    ({name: a[lo : lo + e - s] for name, a in arrays.items()}, None)
                    for lo, (_, s, e) in zip(first, pieces, strict=True)
                ]
                yield partial(list, views)
                continue
            before = plan.rows_before(chunk)
            last = chunk == plan.num_chunks - 1
            for lo, hi in pairwise(plan.batch_bounds(chunk).tolist()):
                carried.append(rows[lo:hi])
                if (before + hi) % plan.batch_size and not (last and hi == len(rows)):
                    continue  # the batch goes on in the next chunk
                window = carried[0] if len(carried) == 1 else np.concatenate(carried)
                carried = []
                yield partial(self._gather, arrays, window, xp)
        if carried:  # the plan's last chunk was empty
            yield partial(self._gather, arrays, np.concatenate(carried), xp)

    def _gather(
        self, arrays: Mapping[str, NDArray[Any]], rows: NDArray[np.int64], xp: Any
    ) -> list[Part]:
        """The ``rows`` of the cache, in that order, as the layout's blocks."""
        if self.blocks == self.layout.blocks:
            return [({name: xp.take(a, rows, axis=0) for name, a in arrays.items()}, None)]
        # Stored row-major per kind, delivered one contiguous column each: gathered and
        # transposed in one pass into column-major blocks of one allocation.
        shapes = [(b.name, len(b.columns), b.dtype) for b in self.blocks]
        blocks = empty_segment(len(rows), shapes, xp, column_major=True)
        segment: Segment = {}
        for b in self.blocks:
            take_transposed(arrays[b.name], rows, blocks[b.name])
            segment.update((c, blocks[b.name][:, j : j + 1]) for j, c in enumerate(b.columns))
        return [(segment, None)]


def take_transposed(stored: NDArray[Any], rows: NDArray[np.int64], out: NDArray[Any]) -> None:
    """``out[i] = stored[rows[i]]`` for a row-major ``stored`` and a column-major ``out``.

    A tile of `_TILE_ROWS` rows at a time is gathered into a small row-major
    scratch, which stays in the CPU's cache while it is transposed into ``out``: about
    twice as fast as gathering the whole batch and then transposing it from memory.

    Examples:
        >>> stored = np.arange(12).reshape(6, 2)
        >>> out = np.empty((3, 2), order="F", dtype=stored.dtype)
        >>> take_transposed(stored, np.array([5, 0, 2]), out)
        >>> out.tolist(), out.flags.f_contiguous
        ([[10, 11], [0, 1], [4, 5]], True)
    """
    tile = np.empty((min(_TILE_ROWS, len(rows)), stored.shape[1]), stored.dtype)
    for lo in range(0, len(rows), _TILE_ROWS):
        part = rows[lo : lo + _TILE_ROWS]
        # The rows come from the plan, so they are in range: "clip" skips the bounds
        # checks of the default mode (a sixth of the gather).
        np.take(stored, part, axis=0, out=tile[: len(part)], mode="clip")
        out[lo : lo + len(part)] = tile[: len(part)]


class _CacheBackend:
    """The loader's backend for one epoch, reading chunks through the cache."""

    def __init__(self, cache: DecodedCache, backend: Backend, *, write: bool) -> None:
        self.cache = cache
        self.backend = backend
        self.name = backend.name
        self.xp = backend.xp
        self.groups_columns = backend.groups_columns
        self.scope = backend.scope
        self.write = write

    def read_chunks(self, request: ReadRequest) -> Iterator[list[Part]]:
        cache, plan, stats = self.cache, request.plan, request.stats
        # Each chunk's delivery rows, the next chunk's drawn while this one is gathered.
        rows_ahead = partial(drawn_ahead, plan, partial(cache.delivery_rows, plan))
        if not self.write:
            assert cache.arrays is not None
            served = _read_only(cache.arrays)
            with contextlib.closing(rows_ahead()) as orders:
                yield from _run_ahead(cache.batch_tasks(served, plan, enumerate(orders), self.xp))
            return
        try:
            arrays, temp, files = cache._new_arrays()
        except OSError as error:  # the disk filled up since its free space was measured
            cache.refuse(f"its files could not be created ({type(error).__name__}: {error})")
            yield from self.backend.read_chunks(request)
            return
        published = False
        columns = [c for b in cache.blocks for c in b.columns]
        pieces = [p for chunk in range(plan.num_chunks) for p in plan.pieces(chunk)]
        decoded = decode_ahead(request, columns, lists=False)
        served = _read_only(arrays)
        work = SplitWork(min(_WRITE_THREADS, usable_cores()), name="tabloader-cache-fill")

        def written(
            orders: Iterator[NDArray[np.int64] | None],
        ) -> Iterator[tuple[int, NDArray[np.int64] | None]]:
            # A chunk's batches are gathered once its rows are written; meanwhile the
            # gather threads still work on the previous chunk's.
            for chunk, rows in enumerate(orders):
                s = plan.chunk_pieces(chunk)
                for p, a, _ in pieces[s]:
                    piece = next(decoded)
                    started = time.perf_counter()
                    cache._write(arrays, files, int(cache._base[p]) + a, piece, work)
                    stats.assemble_seconds += time.perf_counter() - started
                yield chunk, rows

        try:
            with contextlib.closing(rows_ahead()) as orders:
                yield from _run_ahead(cache.batch_tasks(served, plan, written(orders), self.xp))
            missing = cache.missing_pieces(pieces)
            for (p, a, _), piece in zip(
                missing, decode_pieces(request, missing, columns, lists=False), strict=True
            ):
                cache._write(arrays, files, int(cache._base[p]) + a, piece, work)
            cache._complete(arrays, temp, files)
            published = True
            stats.cache_bytes = cache.nbytes
        finally:
            work.close()
            decoded.close()
            if files is not None:
                files.close()
            if not published and temp is not None:
                shutil.rmtree(temp, ignore_errors=True)


def _run_ahead(tasks: Iterator[Callable[[], list[Part]]]) -> Iterator[list[Part]]:
    """The tasks' results in order, computed by a few threads ahead of the consumer.

    Gathers release the GIL, so windows are gathered on several cores at once; at most
    two per thread are done or in progress, which bounds the memory they hold.
    """
    threads = max(1, min(_GATHER_THREADS, usable_cores()))
    pool = ThreadPoolExecutor(threads, thread_name_prefix="tabloader-gather")
    pending: deque[Future[list[Part]]] = deque()
    try:
        for task in tasks:
            pending.append(pool.submit(task))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class CacheFiles:
    """The ``.npy`` files of a disk cache being written, one per block, in ``directory``.

    Each file is created at its full size (its disk space reserved at once where the
    system allows, so a disk that filled up since it was measured fails here, before
    any row is written) with its data on a page boundary. Rows are written in place
    with `write_rows`, through the operating system's page cache, and read back
    through `mapped`, a read-only mapping of the same files.

    Examples:
        >>> import tempfile
        >>> from tabloader.batches import Block
        >>> block = Block("x", ("a", "b"), np.dtype("int64"))
        >>> files = CacheFiles(Path(tempfile.mkdtemp()), [block], rows=3)
        >>> files.write_rows("x", 1, [np.array([1, 2]), np.array([10, 20])])
        >>> files.write_rows("x", 0, [np.array([0]), np.array([0])])
        >>> files.mapped()["x"].tolist()
        [[0, 0], [1, 10], [2, 20]]
        >>> files.sync_and_close()
        >>> np.load(files.directory / "block0.npy").tolist()
        [[0, 0], [1, 10], [2, 20]]
    """

    def __init__(self, directory: Path, blocks: Sequence[Block], rows: int) -> None:
        self.directory = directory
        self._blocks = {b.name: (i, b) for i, b in enumerate(blocks)}
        self._files: dict[str, tuple[int, int]] = {}
        """Block name -> (open file descriptor, offset of the data)."""
        self._arrays: dict[str, NDArray[Any]] = {}
        """Block name -> its file's read-only mapping (``np.memmap``), ``[rows, k]``."""
        try:
            for name, (i, b) in self._blocks.items():
                path, shape = directory / f"block{i}.npy", (rows, len(b.columns))
                _, offset = self._files[name] = _create_npy(path, shape, b.dtype)
                self._arrays[name] = (
                    np.memmap(path, b.dtype, "r", offset=offset, shape=shape)
                    if rows and b.columns
                    else np.empty(shape, b.dtype)  # nothing to map
                )
        except BaseException:
            self.close()
            raise

    def write_rows(self, name: str, first_row: int, columns: Sequence[NDArray[Any]]) -> None:
        """Write ``columns`` (cast to the block's dtype) as block ``name``'s rows from
        ``first_row`` on: `_WRITE_ROWS` rows at a time interleaved in a scratch
        block that stays in the CPU's cache, then written with one system call."""
        fd, offset = self._files[name]
        dtype = self._blocks[name][1].dtype
        width = len(columns) * dtype.itemsize
        n = len(columns[0])
        if len(columns) == 1:
            _write_at(
                fd, np.ascontiguousarray(columns[0], dtype=dtype).data, offset + first_row * width
            )
        else:
            scratch = np.empty((min(_WRITE_ROWS, n), len(columns)), dtype)
            for start in range(0, n, _WRITE_ROWS):
                block = scratch[: min(_WRITE_ROWS, n - start)]
                interleave([c[start : start + len(block)] for c in columns], block)
                _write_at(fd, block.data, offset + (first_row + start) * width)

    def mapped(self) -> dict[str, NDArray[Any]]:
        """Each block's ``[rows, k]`` array as a read-only mapping of its file."""
        return {name: np.asarray(array) for name, array in self._arrays.items()}

    def sync_and_close(self) -> None:
        """Wait until the files are on disk, then close them."""
        for fd, _ in self._files.values():
            os.fsync(fd)
        self.close()

    def close(self) -> None:
        files, self._files = self._files, {}
        for fd, _ in files.values():
            os.close(fd)


def _create_npy(path: Path, shape: tuple[int, int], dtype: np.dtype[Any]) -> tuple[int, int]:
    """Create ``path`` as an ``.npy`` file of ``shape`` and ``dtype`` whose data is to be
    written in place; its open file descriptor and the offset of its data."""
    header = _npy_header(shape, dtype, _PAGE)
    size = len(header) + shape[0] * shape[1] * dtype.itemsize
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_at(fd, memoryview(header), 0)
        reserved = False
        if hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, size)
                reserved = True
            except OSError as error:
                if error.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise
                # (a file system that cannot reserve space: sized below instead)
        if not reserved:
            os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd, len(header)


def _write_at(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` (C-contiguous) at ``offset`` of the file ``fd``."""
    view = data.cast("B")
    while len(view):
        if hasattr(os, "pwrite"):
            written = os.pwrite(fd, view, offset)
        else:  # (no pwrite: Windows)
            os.lseek(fd, offset, os.SEEK_SET)
            written = os.write(fd, view)
        view, offset = view[written:], offset + written


def write_npy(path: Path, array: NDArray[Any]) -> None:
    """Write ``array`` (C-contiguous) to ``path`` as an ``.npy`` file and sync it.

    Where the system allows (``O_DIRECT``, a page-aligned array such as the decoded
    cache's), the file is written straight from the array's memory to the disk: no copy
    into the page cache, which for a gigabyte costs seconds of CPU in the writer thread,
    taken from the epochs being served meanwhile. The header is padded so the data
    starts on a page boundary, as direct writes require; the last partial page is written
    through the page cache. Anywhere else (no ``O_DIRECT``, a file system that refuses
    it, an unaligned array) the file is written through the page cache.

    Examples:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "a.npy"
        >>> write_npy(path, np.arange(6.0).reshape(3, 2))
        >>> np.load(path).tolist()
        [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    """
    header = _npy_header(array.shape, array.dtype, _PAGE)
    contiguous = np.ascontiguousarray(array)
    data = contiguous.reshape(-1).view(np.uint8).data
    direct = getattr(os, "O_DIRECT", 0)
    whole = len(data) - len(data) % _PAGE
    if direct and whole and address(contiguous) % _PAGE == 0:
        try:
            _write_direct(path, header, data, whole, direct)
            return
        except OSError:
            pass  # not on this file system: the page cache then
    with open(path, "wb") as f:
        f.write(header)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_direct(path: Path, header: bytes, data: memoryview, whole: int, direct: int) -> None:
    """``header`` and the first ``whole`` bytes of ``data`` (full pages) with
    ``O_DIRECT``, the rest through the page cache, then sync."""
    import fcntl  # POSIX only, like O_DIRECT

    page = mmap.mmap(-1, len(header))  # direct writes need page-aligned memory
    page.write(header)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | direct, 0o644)
    try:
        _write_at(fd, memoryview(page), 0)
        for start in range(0, whole, _DIRECT_WRITE_BYTES):
            _write_at(
                fd, data[start : min(start + _DIRECT_WRITE_BYTES, whole)], len(header) + start
            )
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~direct)
        _write_at(fd, data[whole:], len(header) + whole)
        os.fsync(fd)
    finally:
        os.close(fd)
        page.close()


def _npy_header(shape: tuple[int, ...], dtype: np.dtype[Any], align: int) -> bytes:
    """An ``.npy`` (version 1.0) header for ``shape`` and ``dtype``, padded to a multiple
    of ``align``."""
    fields = {
        "descr": np.lib.format.dtype_to_descr(dtype),
        "fortran_order": False,
        "shape": shape,
    }
    text = repr(fields).encode("latin1")
    prefix = len(np.lib.format.MAGIC_PREFIX) + 2 + 2  # magic, version, header length
    size = -(-(prefix + len(text) + 1) // align) * align
    text += b" " * (size - prefix - len(text) - 1) + b"\n"
    return np.lib.format.magic(1, 0) + len(text).to_bytes(2, "little") + text


def _read_in(array: np.memmap[Any, Any]) -> None:
    """Map all of a file-mapped ``array`` in now, in large sequential reads where the
    system allows (``MADV_POPULATE_READ``, Linux 5.14), else ask for it to be read ahead.
    """
    mapping = getattr(array, "_mmap", None)
    if mapping is None or sys.platform != "linux":
        return
    try:
        mapping.madvise(_MADV_POPULATE_READ)
    except OSError:  # an older kernel: read ahead in the background instead
        with contextlib.suppress(OSError):
            mapping.madvise(mmap.MADV_WILLNEED)


def _read_only(arrays: Mapping[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
    """Read-only views: a batch that is a view of the cache cannot change it."""
    views = {}
    for name, array in arrays.items():
        view = array.view()
        view.flags.writeable = False
        views[name] = view
    return views
