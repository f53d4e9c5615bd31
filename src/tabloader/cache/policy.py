"""The cache's policy: memory, disk or streaming, decided each epoch.

`DecodedCache` ties the key (`key`), the store (`store`), the filling (`fill`) and the
serving (`serve`, `device`) together: every epoch it decides whether to serve the
complete cache, to fill one while streaming, or to stream alone (it does not fit, its
directory is not safe, writing failed). It is the `CacheHandle` of the epochs it serves,
and the one owner of what they find out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from tabloader.cache.device import CachePlacement, Placements, serving_backend
from tabloader.cache.files import CacheDamaged, CacheRefused, read_in, shrunk
from tabloader.cache.fill import CachedList, Fill, Publisher, StoredBlocks, read_only
from tabloader.cache.key import cache_key, digest, file_identities
from tabloader.cache.serve import CachedRows
from tabloader.cache.store import CacheStore
from tabloader.errors import CacheWarning, InvalidArgumentError, warn_caller
from tabloader.plan import fixed_share

if TYPE_CHECKING:
    from tabloader.batches import Block, Layout
    from tabloader.dataset import Dataset
    from tabloader.stages import Backend
    from tabloader.stats import StatsRecorder

__all__ = ["CacheMode", "DecodedCache", "cache_directory"]

CacheMode = Literal["memory", "disk"]

DISK_RESERVE_BYTES = 1 << 30
DISK_RESERVE_FRACTION = 0.05


def cache_directory(cache_dir: object = None) -> Path:
    """Where disk caches live: ``cache_dir``, else ``$TABLOADER_CACHE_DIR``, else the user's
    cache directory (``$XDG_CACHE_HOME/tabloader`` or ``~/.cache/tabloader``); a relative
    path is taken from the current directory now (a later ``os.chdir`` does not move it).

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
        return Path(path).expanduser().absolute()
    env = os.environ.get("TABLOADER_CACHE_DIR")
    if env and not env.strip():
        raise InvalidArgumentError(
            f"$TABLOADER_CACHE_DIR must name a directory, got {env!r}; unset it for "
            "~/.cache/tabloader, or pass cache_dir="
        )
    if env:
        return Path(env).expanduser().absolute()
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
        list_values: Mapping[str, float] | None = None,
    ) -> None:
        self.mode = mode
        self.placement: CachePlacement = placement
        """Where a GPU loader serves the complete cache from (see `tabloader.cache.device`)."""
        self.placements = Placements()
        """The complete cache placed for each GPU."""
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
        self.publisher = (
            None if self.store is None else Publisher(self.store, self.digest, self.key)
        )
        """Where a disk cache is published (None: a memory cache)."""
        share = fixed_share(
            dataset.partition_rows, global_rank=global_rank, global_size=global_size
        )
        self.rows = CachedRows(self.blocks, layout, share, dataset.num_partitions)
        """Where each cached row lives, and how batches are gathered from them."""
        self.num_rows = self.rows.num_rows
        self.stored = StoredBlocks(self.blocks, self.num_rows)
        """The blocks as the cache's files."""
        # A list column's spans are known now, its values from the footers' counts where
        # they tell (``list_values``: values a row on average); all counted once read.
        values = list_values or {}
        self.nbytes = int(
            sum(
                self.num_rows
                * (
                    16 + values.get(b.columns[0], 0.0) * b.dtype.itemsize
                    if b.ragged
                    else b.width * b.dtype.itemsize
                )
                for b in self.blocks
            )
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
        return {**self.__dict__, "arrays": None, "placements": Placements()}

    @property
    def complete(self) -> bool:
        """Whether every row is cached (and served from the cache)."""
        return self.arrays is not None

    # -- finding, sizing ------------------------------------------------------------

    def unplace(self) -> None:
        """Let go of the copies placed for GPUs (in GPU or pinned host memory): a GPU
        loader that closes gives their memory back; an epoch through the cache places it
        again."""
        self.placements.clear()

    def discard(self) -> None:
        """Forget this cache, and delete its published directory (a disk cache): a
        refreshing dataset's loader replaces it when the files change."""
        self.arrays = None
        self.placements.clear()
        if self.store is not None:
            self.wait()
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
            warn_caller(
                f"the decoded cache in {self.path} was cut short while in use ({cut}): it "
                "is deleted and written again; this epoch reads the files",
                CacheWarning,
            )
            self.arrays = None
            self.placements.clear()
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
            files = self.store.open(self.digest, self.key, self.stored.specs())
        except CacheRefused as error:
            self.refuse(
                f"the published cache may not be used: {error}. It stays until it is deleted "
                f"(tabloader never deletes what it cannot trust as this user's own): delete "
                f"{self.path} (rm -r, as its owner or root), or pass cache_dir= (or set "
                "TABLOADER_CACHE_DIR) to a directory of your own",
            )
            return False
        except CacheDamaged as error:
            warn_caller(
                f"the decoded cache in {self.path} is damaged or was altered ({error}): it "
                "is deleted and written again; this epoch reads the files",
                CacheWarning,
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
        self.adopt(self.stored.arrays({n: np.asarray(a) for n, a in files.items()}))
        return True

    def wait(self) -> None:
        """Wait until this cache's files, written in the background, are published."""
        if self.publisher is not None:
            self.publisher.wait()

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
        try:
            free, total = self.store.disk_usage()
        except FileNotFoundError:  # deleted since the loader was built: made again
            try:
                reason = self.store.prepare()
                free, total = self.store.disk_usage()
            except (OSError, InvalidArgumentError) as error:
                return (
                    f"its directory {self.store.root} was deleted and cannot be made again: {error}"
                )
            if reason is not None:
                return reason
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
        if not self.decide():
            return backend
        return serve(write=True)

    def decide(self) -> bool:
        """Whether this cache is used: a published or complete one is; else one that
        fits (found out now, once: one that does not is refused and said)."""
        if self.refused is None and self.arrays is None:
            reason = self.why_not()
            if reason is not None:
                self.refuse(reason)
                return False
            self.refused = ""
        return self.usable

    def refuse(self, reason: str) -> None:
        """Stop caching (every epoch streams from now on), and say why, once."""
        self.refused = reason
        warn_caller(
            f"not caching the decoded rows: {reason}. Every epoch reads and decodes the "
            "files instead",
            CacheWarning,
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

    def start_fill(self, dataset: Dataset) -> Fill | None:
        """A new `Fill` for an epoch over ``dataset``, or None (said once, and every
        epoch streams) when its files cannot be made."""
        in_memory = self.store is None or self.fits_in_memory()
        try:
            return Fill(
                self.stored, self.publisher, in_memory=in_memory, skipped=dataset.rows_skipped
            )
        except OSError as error:  # the disk filled up since its free space was measured
            self.refuse(
                f"its files could not be created ({type(error).__name__}: {error})",
            )
            return None

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
