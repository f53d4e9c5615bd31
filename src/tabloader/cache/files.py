"""A decoded cache's files: private, written in place or in one go, checksummed.

Every file is created ``0600`` (every directory ``0700``) whatever the umask, and read
only if it is a regular file of this user's that others cannot write, opened without
following a link and without blocking (`open_private`: a FIFO planted as a file cannot
hang it). Arrays are ``.npy`` files: written in one go, straight from memory to the disk
where the system allows (`write_npy`), or created at their full size and written in
place row by row (`CacheFiles`), or appended to (`AppendFile`: a list column's values);
read back as read-only mappings (`read_npy`) that must hold exactly the array expected.
Their data is checksummed, a CRC-32 per `SEGMENT_BYTES`, on several threads
(`checksums`, `file_checksums`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import stat
import sys
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tabloader.batches import column_width
from tabloader.decode.host import interleave
from tabloader.memory import address
from tabloader.stages import map_on_threads
from tabloader.threads import usable_cores

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "PAGE",
    "SEGMENT_BYTES",
    "AppendFile",
    "CacheDamaged",
    "CacheFiles",
    "CacheRefused",
    "CHECKSUM",
    "FileSpec",
    "TempVanished",
    "checksums",
    "file_checksums",
    "make_private_dir",
    "open_private",
    "read_in",
    "read_npy",
    "read_record",
    "refusal",
    "shrunk",
    "this_user",
    "write_npy",
    "write_record",
]

SEGMENT_BYTES = 64 << 20
"""Bytes of a file's data per checksum: segments are hashed on several threads."""
PAGE = 4096
"""Alignment of direct writes: memory, file offsets and sizes (a disk block or page)."""
DIRECT_WRITE_BYTES = 64 << 20
"""Bytes per system call when a cache file is written directly."""
WRITE_ROWS = 16384
"""Rows interleaved in a scratch block and written per system call when a cache too
large for memory is written into its files: a few MiB, which stay in the CPU's cache."""
_RECORD_LIMIT = 64 << 20
"""Largest manifest or owner record read."""
_DIR_MODE, _FILE_MODE = 0o700, 0o600
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO planted as a file must not block the open
    | getattr(os, "O_CLOEXEC", 0)
)


class CacheRefused(Exception):
    """The cache directory, or a cache in it, is not safe to use (another user owns it,
    or others can write it): the loader warns and streams."""


class CacheDamaged(Exception):
    """A published cache is incomplete, altered or not what its manifest says: the
    loader warns, deletes it and writes it again."""


class TempVanished(OSError):
    """A cache's temporary directory was deleted while its writer was running."""


@dataclass(frozen=True)
class FileSpec:
    """One file of a cache: its name, and the shape and dtype of its array (``shape``
    None: one dimension of any length, the values of a list column)."""

    name: str
    shape: tuple[int, ...] | None
    dtype: np.dtype[Any]


# -- ownership and permissions ----------------------------------------------------------


def this_user() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None


def refusal(st: os.stat_result, path: Path | str) -> str | None:
    """Why ``path`` (its ``stat``) may not be trusted: owned by another user, or writable
    by group or others; None when it is this user's own."""
    user = this_user()
    if user is None:  # (Windows: no POSIX owners or modes to check)
        return None
    if st.st_uid != user:
        return f"{path} is owned by user id {st.st_uid}, not by this user (id {user})"
    if st.st_mode & 0o022:
        return f"{path} can be written by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def make_private_dir(path: Path) -> None:
    """Create ``path`` as a ``0700`` directory whatever the umask."""
    os.mkdir(path, _DIR_MODE)
    os.chmod(path, _DIR_MODE)


def open_private(path: Path) -> int:
    """Open ``path`` for reading: a regular file of this user's that others cannot
    write, opened without following a link; raises `CacheDamaged` otherwise."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise CacheDamaged(f"{path.name} is a symbolic link") from None
        raise CacheDamaged(f"{path.name} cannot be opened ({error.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheDamaged(f"{path.name} is not a regular file")
        reason = refusal(st, path.name)
        if reason is not None:
            raise CacheDamaged(reason)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_record(path: Path) -> dict[str, Any]:
    """A small JSON file (a manifest or owner record), read as `open_private` says."""
    fd = open_private(path)
    with os.fdopen(fd, "rb") as f:
        data = f.read(_RECORD_LIMIT + 1)
    if len(data) > _RECORD_LIMIT:
        raise CacheDamaged(f"{path.name} is larger than any record tabloader writes")
    try:
        record = json.loads(data)
    except ValueError:
        raise CacheDamaged(f"{path.name} is not valid JSON") from None
    if not isinstance(record, dict):
        raise CacheDamaged(f"{path.name} does not hold a record")
    return record


def write_record(path: Path, record: Mapping[str, Any]) -> None:
    """Write a small JSON file, ``0600``, synced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        if hasattr(os, "fchmod"):
            os.fchmod(f.fileno(), _FILE_MODE)
        json.dump(record, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


# -- checksums ----------------------------------------------------------------------------


def _segments(array: NDArray[Any], segment: int) -> list[memoryview]:
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
    return [data[lo : lo + segment] for lo in range(0, len(data), segment)]


CHECKSUM = "crc32"
"""The checksum of each segment of a cache's files, by the name its manifest lists them
under: zlib's CRC-32 (as parquet's page checksums), which finds every change of up to 32
bits in a row, and any other change but once in 2^32. The cache is its user's alone
(see docs/cache.md), so what the checksums guard against is damage (a disk, a copy, a
file cut short or swapped for another), not a writer who could rewrite the manifest too.
SHA-256, which would, took 2.7 times as long to verify a cache (docs/cache.md)."""


def checksum(data: Any, running: int = 0) -> int:
    """The `CHECKSUM` of ``data`` (any buffer) following ``running``, that of the bytes
    before it (zlib releases the GIL while it runs).

    Examples:
        >>> whole = checksum(b"abcdef")
        >>> checksum(b"def", checksum(b"abc")) == whole, f"{checksum(b''):08x}"
        (True, '00000000')
    """
    return zlib.crc32(data, running)


def checksums(arrays: Sequence[NDArray[Any]], segment: int | None = None) -> list[list[str]]:
    """The `CHECKSUM` of each ``segment`` bytes of each array's data (as 8 hex digits),
    on several threads.

    Examples:
        >>> [len(c) for c in checksums([np.zeros(10), np.zeros(0)], segment=16)]
        [5, 0]
    """
    segment = segment or SEGMENT_BYTES
    jobs = [(i, view) for i, array in enumerate(arrays) for view in _segments(array, segment)]

    def digest(view: memoryview) -> str:
        return f"{checksum(view):08x}"

    views = [view for _, view in jobs]
    digests = map_on_threads(digest, views, usable_cores(), name="tabloader-checksum")
    out: list[list[str]] = [[] for _ in arrays]
    for (i, _), d in zip(jobs, digests, strict=True):
        out[i].append(d)
    return out


def file_checksums(
    files: Sequence[tuple[Path, int]], segment: int | None = None
) -> list[list[str]]:
    """`checksums` of the data of ``.npy`` files, each given with the bytes of its
    data (the end of the file), read in large reads rather than through a mapping: a
    cache larger than memory is not made resident by its check."""
    segment = segment or SEGMENT_BYTES
    jobs: list[tuple[int, Path, int, int]] = []
    for i, (path, nbytes) in enumerate(files):
        size = os.stat(path).st_size
        if size < nbytes:
            raise CacheDamaged(f"{path.name} is shorter than its header says")
        jobs.extend(
            (i, path, size - nbytes + lo, min(segment, nbytes - lo))
            for lo in range(0, nbytes, segment)
        )

    def digest(job: tuple[int, Path, int, int]) -> str:
        _, path, start, length = job
        fd = open_private(path)
        try:
            running = 0
            buffer = bytearray(min(length, 4 << 20))
            done = 0
            while done < length:
                with memoryview(buffer) as view:
                    n = os.preadv(fd, [view[: min(len(buffer), length - done)]], start + done)
                    if n <= 0:
                        raise CacheDamaged(f"{path.name} is shorter than its header says")
                    running = checksum(view[:n], running)
                done += n
            return f"{running:08x}"
        finally:
            os.close(fd)

    digests = map_on_threads(digest, jobs, usable_cores(), name="tabloader-checksum")
    out: list[list[str]] = [[] for _ in files]
    for job, d in zip(jobs, digests, strict=True):
        out[job[0]].append(d)
    return out


# -- .npy files ---------------------------------------------------------------------------


def read_npy(path: Path, shape: tuple[int, ...], dtype: np.dtype[Any]) -> NDArray[Any]:
    """The ``.npy`` file ``path`` as a read-only mapping, which must hold exactly an
    array of ``shape`` and ``dtype`` (and nothing else: no pickled objects, no trailing
    bytes); raises `CacheDamaged` otherwise.

    The header must be byte for byte the one tabloader writes for that array
    (`npy_header`): compared, not parsed, so that a damaged header is never handed to
    numpy's parser, which evaluates it as Python literals (one flipped bit in its
    padding costs the tokenizer minutes).
    """
    expected = npy_header(tuple(shape), np.dtype(dtype), PAGE)
    fd = open_private(path)
    with os.fdopen(fd, "rb") as f:
        if f.read(len(expected)) != expected:
            raise CacheDamaged(
                f"{path.name} does not start with the header of the cache's "
                f"{np.dtype(dtype)} array of shape {tuple(shape)}"
            )
        offset = len(expected)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        size = os.fstat(f.fileno()).st_size
        if size != offset + nbytes:
            raise CacheDamaged(f"{path.name} has {size} bytes, not {offset + nbytes}")
        if nbytes == 0:
            return np.empty(shape, dtype)
        return np.memmap(f, dtype=dtype, mode="r", offset=offset, shape=shape)


def write_npy(path: Path, array: NDArray[Any]) -> list[str]:
    """Write ``array`` (C-contiguous) to ``path`` as a ``0600`` ``.npy`` file and sync it;
    the checksums of its data (see `checksums`).

    Where the system allows (``O_DIRECT``, a page-aligned array such as the decoded
    cache's), the file is written straight from the array's memory to the disk: no copy
    into the page cache, which for a gigabyte costs seconds of CPU in the writer thread,
    taken from the epochs being served meanwhile. The header is padded so the data
    starts on a page boundary, as direct writes require; the last partial page is written
    through the page cache. Anywhere else (no ``O_DIRECT``, a file system that refuses
    it, an unaligned array) the file is written through the page cache. A full disk
    raises ``OSError`` (``ENOSPC``).

    Examples:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "a.npy"
        >>> sums = write_npy(path, np.arange(6.0).reshape(3, 2))
        >>> np.load(path).tolist(), oct(path.stat().st_mode & 0o777), len(sums)
        ([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], '0o600', 1)
    """
    header = npy_header(array.shape, array.dtype, PAGE)
    contiguous = np.ascontiguousarray(array)
    sums = checksums([contiguous])[0]
    data = contiguous.reshape(-1).view(np.uint8).data
    direct = getattr(os, "O_DIRECT", 0)
    whole = len(data) - len(data) % PAGE
    if direct and whole and address(contiguous) % PAGE == 0:
        try:
            _write_direct(path, header, data, whole, direct)
            return sums
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.ENOENT):
                raise  # the page cache would fail the same way
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # not on this file system: the page cache then
    fd = _create(path, os.O_WRONLY)
    with os.fdopen(fd, "wb") as f:
        f.write(header)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return sums


def _create(path: Path, flags: int) -> int:
    """Create ``path`` (which must not exist) ``0600`` and open it with ``flags``."""
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), _FILE_MODE)
    if hasattr(os, "fchmod"):
        os.fchmod(fd, _FILE_MODE)
    return fd


def _write_direct(path: Path, header: bytes, data: memoryview, whole: int, direct: int) -> None:
    """``header`` and the first ``whole`` bytes of ``data`` (full pages) with
    ``O_DIRECT``, the rest through the page cache, then sync."""
    import fcntl  # POSIX only, like O_DIRECT

    page = mmap.mmap(-1, len(header))  # direct writes need page-aligned memory
    page.write(header)
    fd = _create(path, os.O_WRONLY | direct)
    try:
        with memoryview(page) as head:
            write_at(fd, head, 0)
        for start in range(0, whole, DIRECT_WRITE_BYTES):
            write_at(fd, data[start : min(start + DIRECT_WRITE_BYTES, whole)], len(header) + start)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~direct)
        write_at(fd, data[whole:], len(header) + whole)
        os.fsync(fd)
    finally:
        os.close(fd)
        # A failed write's traceback may still hold a view of the page: closing it would
        # raise BufferError in place of the error that matters. It is freed with them.
        with contextlib.suppress(BufferError):
            page.close()


def write_at(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` (C-contiguous) at ``offset`` of the file ``fd``."""
    with data.cast("B") as whole:
        view = whole
        while len(view):
            if hasattr(os, "pwrite"):
                written = os.pwrite(fd, view, offset)
            else:  # (no pwrite: Windows)
                os.lseek(fd, offset, os.SEEK_SET)
                written = os.write(fd, view)
            view, offset = view[written:], offset + written
        del view


def npy_header(shape: tuple[int, ...], dtype: np.dtype[Any], align: int) -> bytes:
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


class CacheFiles:
    """The ``.npy`` files of a disk cache being written, in ``directory``.

    Each file is created ``0600`` at its full size (its disk space reserved at once
    where the system allows, so a disk that filled up since it was measured fails here,
    before any row is written) with its data on a page boundary. Rows are written in
    place with `write_rows`, through the operating system's page cache, and read
    back through `mapped`, a read-only mapping of the same files.

    Examples:
        >>> import tempfile
        >>> spec = FileSpec("x.npy", (3, 2), np.dtype("int64"))
        >>> files = CacheFiles(Path(tempfile.mkdtemp()), [spec])
        >>> files.write_rows("x.npy", 1, [np.array([1, 2]), np.array([10, 20])])
        >>> files.write_rows("x.npy", 0, [np.array([0]), np.array([0])])
        >>> files.mapped()["x.npy"].tolist()
        [[0, 0], [1, 10], [2, 20]]
        >>> files.sync_and_close()
        >>> np.load(files.directory / "x.npy").tolist()
        [[0, 0], [1, 10], [2, 20]]
    """

    def __init__(self, directory: Path, specs: Iterable[FileSpec]) -> None:
        self.directory = directory
        self._specs = {s.name: s for s in specs}
        self._files: dict[str, tuple[int, int]] = {}
        """File name -> (open file descriptor, offset of the data)."""
        self._arrays: dict[str, NDArray[Any]] = {}
        """File name -> its read-only mapping (``np.memmap``)."""
        try:
            for name, spec in self._specs.items():
                assert spec.shape is not None
                path = directory / name
                _, offset = self._files[name] = _create_npy(path, spec.shape, spec.dtype)
                self._arrays[name] = (
                    np.memmap(path, spec.dtype, "r", offset=offset, shape=spec.shape)
                    if int(np.prod(spec.shape))
                    else np.empty(spec.shape, spec.dtype)  # nothing to map
                )
        except BaseException:
            self.close()
            raise

    def write_rows(self, name: str, first_row: int, columns: Sequence[NDArray[Any]]) -> None:
        """Write ``columns`` (cast to the file's dtype) as rows of file ``name`` from
        ``first_row`` on: `WRITE_ROWS` rows at a time interleaved in a scratch
        block that stays in the CPU's cache, then written with one system call."""
        fd, offset = self._files[name]
        dtype = self._specs[name].dtype
        places = sum(column_width(c) for c in columns)  # (a vector column takes k)
        width = places * dtype.itemsize
        n = len(columns[0])
        if len(columns) == 1:
            write_at(
                fd, np.ascontiguousarray(columns[0], dtype=dtype).data, offset + first_row * width
            )
            return
        scratch = np.empty((min(WRITE_ROWS, n), places), dtype)
        for start in range(0, n, WRITE_ROWS):
            block = scratch[: min(WRITE_ROWS, n - start)]
            interleave([c[start : start + len(block)] for c in columns], block)
            write_at(fd, block.data, offset + (first_row + start) * width)

    def mapped(self) -> dict[str, NDArray[Any]]:
        """Each file's array as a read-only mapping of it."""
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


def _create_npy(path: Path, shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[int, int]:
    """Create ``path`` as an ``.npy`` file of ``shape`` and ``dtype`` whose data is to be
    written in place; its open file descriptor and the offset of its data."""
    header = npy_header(shape, dtype, PAGE)
    size = len(header) + int(np.prod(shape)) * dtype.itemsize
    fd = _create(path, os.O_RDWR)
    try:
        write_at(fd, memoryview(header), 0)
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


class AppendFile:
    """A one-dimensional ``.npy`` file of unknown length, written by appending: the values
    of a list column, which arrive piece by piece. Its header (one page, rewritten when
    it is finished) leaves room for any length.

    Examples:
        >>> import tempfile
        >>> f = AppendFile(Path(tempfile.mkdtemp()) / "v.npy", np.dtype("int32"))
        >>> f.append(np.array([1, 2])), f.append(np.array([3]))
        (0, 2)
        >>> f.mapped().tolist()
        [1, 2, 3]
        >>> f.finish()
        >>> np.load(f.path).tolist()
        [1, 2, 3]
    """

    def __init__(self, path: Path, dtype: np.dtype[Any]) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.length = 0
        self._fd: int | None = _create(path, os.O_RDWR)
        try:
            write_at(self._fd, memoryview(npy_header((0,), self.dtype, PAGE)), 0)
        except BaseException:
            self.close()
            raise

    def append(self, values: NDArray[Any]) -> int:
        """Write ``values`` (cast to the file's dtype) after those before; where they start."""
        assert self._fd is not None
        start = self.length
        data = np.ascontiguousarray(values, dtype=self.dtype)
        write_at(self._fd, data.data, PAGE + start * self.dtype.itemsize)
        self.length += len(data)
        return start

    def mapped(self) -> NDArray[Any]:
        """The values so far, as a read-only mapping of the file."""
        if not self.length:
            return np.empty(0, self.dtype)
        return np.asarray(np.memmap(self.path, self.dtype, "r", offset=PAGE, shape=(self.length,)))

    def finish(self) -> None:
        """Give the header the final length; sync and close the file."""
        assert self._fd is not None
        write_at(self._fd, memoryview(npy_header((self.length,), self.dtype, PAGE)), 0)
        os.ftruncate(self._fd, PAGE + self.length * self.dtype.itemsize)
        os.fsync(self._fd)
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _memmap_of(array: Any) -> Any:
    """The ``np.memmap`` an array is a view of, or None."""
    while isinstance(array, np.ndarray) and not isinstance(array, np.memmap):
        array = array.base
    return array if isinstance(array, np.memmap) else None


def shrunk(array: Any) -> str | None:
    """Why a file-mapped ``array`` can no longer be read whole, or None: its file was
    cut short since it was mapped, and reading the pages past its new end would kill
    the process (``SIGBUS``). One ``fstat`` of the mapping's own descriptor."""
    mapped = _memmap_of(array)
    mapping = getattr(mapped, "_mmap", None)
    if mapping is None:
        return None
    try:
        size = mapping.size()
    except (OSError, ValueError) as error:
        return f"its mapping cannot be looked at ({error})"
    need = int(mapped.offset) + int(mapped.nbytes)
    if size < need:
        return f"one of its files has {size} bytes, not {need}"
    return None


def read_in(array: Any) -> None:
    """Map all of a file-mapped ``array`` in now, in large sequential reads where the
    system allows (``MADV_POPULATE_READ``, Linux 5.14), else ask for it to be read ahead.
    """
    mapping = getattr(_memmap_of(array), "_mmap", None)
    if mapping is None or sys.platform != "linux":
        return
    try:
        mapping.madvise(getattr(mmap, "MADV_POPULATE_READ", 22))
    except OSError:  # an older kernel: read ahead in the background instead
        with contextlib.suppress(OSError):
            mapping.madvise(mmap.MADV_WILLNEED)
