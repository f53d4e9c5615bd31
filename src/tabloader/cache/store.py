"""Where disk caches live: private files, owner records, publishing, checksums, cleanup.

A decoded cache is training data, as sensitive as the model trained on it, so the cache
directory is kept like an ssh key directory:

- every directory is created ``0700`` and every file ``0600``, whatever the umask;
- a cache directory, published cache or file that another user owns, or that others
  can write, is refused (`CacheRefused`: the loader warns and streams);
- only regular files are read (never a link, a FIFO or a device), opened without
  following links, and a manifest names exactly the files the loader expects, so no
  entry can point out of the cache;
- every file's data is checksummed (SHA-256 per `SEGMENT_BYTES`) when the cache is
  published and verified when it is opened: a mismatch is `CacheDamaged` (the
  loader warns, deletes it, streams and writes it again);
- temporary directories carry an owner record (user, host, boot id, PID namespace, PID
  and process start time), and cleanup deletes only directories of this user whose
  record shows a writer that has ended.

Examples:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp()) / "cache"
    >>> store = CacheStore(root)
    >>> store.prepare() is None, oct(root.stat().st_mode & 0o777)
    (True, '0o700')
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
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tabloader.batches import column_width
from tabloader.decode.host import interleave
from tabloader.errors import InvalidArgumentError
from tabloader.memory import address
from tabloader.stages import usable_cores

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "MANIFEST",
    "OWNER",
    "SEGMENT_BYTES",
    "TEMP_PREFIX",
    "AppendFile",
    "CacheDamaged",
    "CacheFiles",
    "CacheRefused",
    "CacheStore",
    "FileSpec",
    "TempVanished",
    "checksums",
    "file_checksums",
    "owner_record",
    "read_npy",
    "shrunk",
    "writer_gone",
    "write_npy",
]

MANIFEST = "manifest.json"
OWNER = "owner.json"
TEMP_PREFIX = ".tmp-"
SEGMENT_BYTES = 64 << 20
"""Bytes of a file's data per checksum: segments are hashed on several threads."""
PAGE = 4096
"""Alignment of direct writes: memory, file offsets and sizes (a disk block or page)."""
DIRECT_WRITE_BYTES = 64 << 20
"""Bytes per system call when a cache file is written directly."""
WRITE_ROWS = 16384
"""Rows interleaved in a scratch block and written per system call when a cache too
large for memory is written into its files: a few MiB, which stay in the CPU's cache."""
UNVERIFIABLE_AFTER = 7 * 24 * 3600
"""Seconds after which a temporary directory of this user whose writer cannot be
checked (another machine, PID namespace or boot) counts as abandoned."""
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


def _user() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None


def _refusal(st: os.stat_result, path: Path | str) -> str | None:
    """Why ``path`` (its ``stat``) may not be trusted: owned by another user, or writable
    by group or others; None when it is this user's own."""
    user = _user()
    if user is None:  # (Windows: no POSIX owners or modes to check)
        return None
    if st.st_uid != user:
        return f"{path} is owned by user id {st.st_uid}, not by this user (id {user})"
    if st.st_mode & 0o022:
        return f"{path} can be written by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _make_private_dir(path: Path) -> None:
    """Create ``path`` as a ``0700`` directory whatever the umask."""
    os.mkdir(path, _DIR_MODE)
    os.chmod(path, _DIR_MODE)


def _open_private(path: Path) -> int:
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
        reason = _refusal(st, path.name)
        if reason is not None:
            raise CacheDamaged(reason)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_record(path: Path) -> dict[str, Any]:
    """A small JSON file (a manifest or owner record), read as `_open_private` says."""
    fd = _open_private(path)
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


def _write_record(path: Path, record: Mapping[str, Any]) -> None:
    """Write a small JSON file, ``0600``, synced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        if hasattr(os, "fchmod"):
            os.fchmod(f.fileno(), _FILE_MODE)
        json.dump(record, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


# -- owner records ------------------------------------------------------------------------


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _boot_id() -> str | None:
    text = _read_text("/proc/sys/kernel/random/boot_id")
    return None if text is None else text.strip()


def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, ``/proc/PID/stat`` field
    22), None when there is no such process here."""
    text = _read_text(f"/proc/{pid}/stat")
    if text is None:
        return None
    try:
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def owner_record() -> dict[str, Any]:
    """Who writes a temporary cache directory: enough to tell, later and from another
    process, whether that writer still runs (PIDs are reused and repeat across PID
    namespaces, so the namespace and the process start time are part of it)."""
    pid = os.getpid()
    return {
        "writer": "tabloader",
        "uid": _user(),
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "pid_namespace": _pid_namespace(),
        "pid": pid,
        "start_ticks": _start_ticks(pid),
        "started": time.time(),
    }


def writer_gone(record: Mapping[str, Any]) -> bool | None:
    """Whether the writer of an owner record has ended: True or False where this process
    can tell (same host, boot and PID namespace), None where it cannot (another machine
    or container, or a reboot: its processes are not visible here).

    Examples:
        >>> writer_gone(owner_record())
        False
    """
    if record.get("writer") != "tabloader" or record.get("host") != socket.gethostname():
        return None
    pid = record.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    boot, namespace = _boot_id(), _pid_namespace()
    if boot is None or namespace is None:  # no /proc: same host, so the PID says
        return not _pid_alive(pid)
    if record.get("boot_id") != boot or record.get("pid_namespace") != namespace:
        return None
    started = _start_ticks(pid)
    return started is None or started != record.get("start_ticks")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- the store ----------------------------------------------------------------------------


class CacheStore:
    """The directory of disk caches: one directory per cache, named by its key's digest.

    Every method that deletes checks first that what it deletes is this user's and was
    written by tabloader (a manifest or an owner record).
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, digest: str) -> Path:
        return self.root / digest

    def prepare(self) -> str | None:
        """Create the cache directory (``0700``, missing parents too) if needed; why it
        may not be used (another user's, or writable by others), or None.

        Raises [`InvalidArgumentError`][tabloader.errors.InvalidArgumentError] if it is not a
        directory or cannot be created or written.
        """
        root, missing = self.root, []
        probe = root
        while True:
            try:
                st = os.stat(probe)
                break
            except FileNotFoundError:
                missing.append(probe)
                if probe.parent == probe:
                    raise InvalidArgumentError(
                        f"cache_dir {str(root)!r} cannot be created"
                    ) from None
                probe = probe.parent
            except OSError as error:
                raise self._unusable(error) from None
        if not stat.S_ISDIR(st.st_mode):
            raise InvalidArgumentError(
                f"cache_dir {str(root)!r} cannot be a cache directory: {str(probe)!r} is a "
                "file, not a directory. Pass another cache_dir= (or set TABLOADER_CACHE_DIR)"
            )
        for directory in reversed(missing):
            try:
                _make_private_dir(directory)
            except FileExistsError:
                pass  # made meanwhile by another process: checked below
            except OSError as error:
                raise self._unusable(error) from None
        try:
            st = os.stat(root)
        except OSError as error:
            raise self._unusable(error) from None
        if not stat.S_ISDIR(st.st_mode):
            raise InvalidArgumentError(f"cache_dir {str(root)!r} is not a directory")
        reason = _refusal(st, root)
        if reason is not None:
            return reason
        try:  # writable? (also where permissions do not say: read-only or immutable)
            os.rmdir(tempfile.mkdtemp(prefix=".probe-", dir=root))
        except OSError as error:
            raise self._unusable(error) from None
        return None

    def _unusable(self, error: OSError) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"cache_dir {str(self.root)!r} cannot be used: {type(error).__name__}: "
            f"{error.strerror or error}. Pass a cache_dir= you can write to (or set "
            "TABLOADER_CACHE_DIR), or leave cache='disk' out"
        )

    def disk_usage(self) -> tuple[int, int]:
        """``(free, total)`` bytes of the cache directory's file system."""
        usage = shutil.disk_usage(self.root)
        return usage.free, usage.total

    # -- reading -------------------------------------------------------------------

    def open(
        self,
        digest: str,
        key: Mapping[str, Any],
        specs: Sequence[FileSpec],
        *,
        verify: bool = True,
    ) -> dict[str, NDArray[Any]] | None:
        """The published cache ``digest``'s files as read-only mappings, by name; None
        when there is none.

        Raises `CacheRefused` if it is not this user's own, `CacheDamaged`
        if it is incomplete, altered (its checksums, verified here unless ``verify`` is
        false) or not the cache of ``key``.
        """
        directory = self.path(digest)
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            raise CacheDamaged(f"{directory} is not a directory")
        reason = _refusal(st, directory)
        if reason is not None:
            raise CacheRefused(reason)
        manifest = _read_record(directory / MANIFEST)
        if manifest.get("format") != key.get("format") or manifest.get("key") != key:
            raise CacheDamaged("its manifest is of another cache")
        entries = manifest.get("files")
        if not isinstance(entries, list) or [
            e.get("file") if isinstance(e, dict) else None for e in entries
        ] != [s.name for s in specs]:
            raise CacheDamaged("its manifest lists other files than the cache's own")
        segment = manifest.get("segment_bytes")
        if not isinstance(segment, int) or segment <= 0:
            raise CacheDamaged("its manifest has no checksum segment size")
        arrays: dict[str, NDArray[Any]] = {}
        sums: list[list[str]] = []
        for spec, entry in zip(specs, entries, strict=True):
            shape = spec.shape if spec.shape is not None else _length(entry.get("shape"))
            arrays[spec.name] = read_npy(directory / spec.name, shape, spec.dtype)
            listed = entry.get("sha256")
            if not isinstance(listed, list) or not all(isinstance(s, str) for s in listed):
                raise CacheDamaged(f"its manifest has no checksums of {spec.name}")
            sums.append(listed)
        if verify:
            got = file_checksums(
                [(directory / s.name, arrays[s.name].nbytes) for s in specs], segment
            )
            for spec, expected, actual in zip(specs, sums, got, strict=True):
                if expected != actual:
                    raise CacheDamaged(f"{spec.name} does not match its checksum")
        return arrays

    # -- writing -------------------------------------------------------------------

    def new_temp(self, digest: str) -> Path:
        """A fresh temporary directory (``0700``) for cache ``digest``, with its owner
        record."""
        temp = self.root / f"{TEMP_PREFIX}{digest}-{os.getpid()}-{secrets.token_hex(4)}"
        _make_private_dir(temp)
        try:
            _write_record(temp / OWNER, owner_record())
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        return temp

    def publish(
        self,
        temp: Path,
        digest: str,
        manifest: Mapping[str, Any],
        valid: Callable[[], bool],
    ) -> None:
        """Write ``manifest`` into ``temp`` and make it cache ``digest`` by one rename.

        If another process published the same cache first (``valid()`` says its copy
        is sound), ``temp`` is dropped; a damaged copy of this user's is replaced.
        Raises `TempVanished` if ``temp`` was deleted meanwhile.
        """
        if not temp.is_dir():
            raise TempVanished(errno.ENOENT, f"the temporary directory {temp} vanished")
        try:
            _write_record(temp / MANIFEST, manifest)
            (temp / OWNER).unlink()
        except FileNotFoundError as error:
            raise TempVanished(errno.ENOENT, f"the temporary directory {temp} vanished") from error
        target = self.path(digest)
        try:
            os.replace(temp, target)
        except FileNotFoundError as error:
            raise TempVanished(errno.ENOENT, f"the temporary directory {temp} vanished") from error
        except OSError:
            # Another process published first (or a broken directory is in the way).
            if not valid() and self.remove(digest):
                with contextlib.suppress(OSError):
                    os.replace(temp, target)
            shutil.rmtree(temp, ignore_errors=True)

    # -- deleting ------------------------------------------------------------------

    def _own_directory(self, path: Path) -> bool:
        try:
            st = os.lstat(path)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and _refusal(st, path) is None

    def remove(self, digest: str) -> bool:
        """Delete published cache ``digest`` if it is this user's; whether it is gone."""
        path = self.path(digest)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return True
        if not stat.S_ISDIR(st.st_mode):
            if _user() is not None and st.st_uid != _user():
                return False
            with contextlib.suppress(OSError):
                path.unlink()  # a link or file planted in its place, in this user's directory
            return not os.path.lexists(path)
        if _refusal(st, path) is not None:
            return False
        shutil.rmtree(path, ignore_errors=True)
        return not os.path.lexists(path)

    def remove_temp(self, temp: Path) -> None:
        """Delete a temporary directory this process made."""
        if self._own_directory(temp):
            shutil.rmtree(temp, ignore_errors=True)

    def remove_abandoned(self) -> None:
        """Delete this user's temporary directories whose writer has ended (by its owner
        record), or which could not be checked for `UNVERIFIABLE_AFTER` seconds.
        Other users' directories, and anything else, are left alone."""
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return
        now = time.time()
        for entry in entries:
            if not entry.name.startswith(TEMP_PREFIX):
                continue
            path = Path(entry.path)
            if not self._own_directory(path):
                continue
            try:
                record: dict[str, Any] | None = _read_record(path / OWNER)
            except CacheDamaged:
                record = None
            age = now - _newest_change(path)
            if record is None:
                # Made, and its writer gone before its record was written: empty.
                if age > 3600:
                    with contextlib.suppress(OSError):
                        os.rmdir(path)
                continue
            if record.get("uid") != _user() and _user() is not None:
                continue
            gone = writer_gone(record)
            if gone or (gone is None and age > UNVERIFIABLE_AFTER):
                shutil.rmtree(path, ignore_errors=True)

    def remove_older_versions(self, digest: str, lineage: str) -> None:
        """Delete this user's published caches of earlier versions of the same files."""
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return
        for entry in entries:
            if entry.name == digest or entry.name.startswith((".", TEMP_PREFIX)):
                continue
            path = Path(entry.path)
            if not self._own_directory(path):
                continue
            try:
                if _read_record(path / MANIFEST).get("lineage") == lineage:
                    shutil.rmtree(path, ignore_errors=True)
            except CacheDamaged:
                continue


def _newest_change(path: Path) -> float:
    """The latest modification time of ``path`` and of the entries in it."""
    newest = 0.0
    with contextlib.suppress(OSError):
        newest = os.lstat(path).st_mtime
        for entry in os.scandir(path):
            with contextlib.suppress(OSError):
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest


def _length(shape: object) -> tuple[int]:
    if (
        not isinstance(shape, list)
        or len(shape) != 1
        or not isinstance(shape[0], int)
        or shape[0] < 0
    ):
        raise CacheDamaged("its manifest gives a list column's values no length")
    return (shape[0],)


# -- checksums ----------------------------------------------------------------------------


def _segments(array: NDArray[Any], segment: int) -> list[memoryview]:
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
    return [data[lo : lo + segment] for lo in range(0, len(data), segment)]


def checksums(arrays: Sequence[NDArray[Any]], segment: int | None = None) -> list[list[str]]:
    """The SHA-256 of each ``segment`` bytes of each array's data, hashed on several
    threads (hashlib releases the GIL).

    Examples:
        >>> [len(c) for c in checksums([np.zeros(10), np.zeros(0)], segment=16)]
        [5, 0]
    """
    segment = segment or SEGMENT_BYTES
    jobs = [(i, view) for i, array in enumerate(arrays) for view in _segments(array, segment)]
    threads = max(1, min(usable_cores(), len(jobs)))

    def digest(view: memoryview) -> str:
        return hashlib.sha256(view).hexdigest()

    if threads == 1:
        digests = [digest(view) for _, view in jobs]
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="tabloader-checksum") as pool:
            digests = list(pool.map(digest, [view for _, view in jobs]))
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
        fd = _open_private(path)
        try:
            hasher = hashlib.sha256()
            buffer = bytearray(min(length, 4 << 20))
            done = 0
            while done < length:
                with memoryview(buffer) as view:
                    n = os.preadv(fd, [view[: min(len(buffer), length - done)]], start + done)
                    if n <= 0:
                        raise CacheDamaged(f"{path.name} is shorter than its header says")
                    hasher.update(view[:n])
                done += n
            return hasher.hexdigest()
        finally:
            os.close(fd)

    threads = max(1, min(usable_cores(), len(jobs)))
    if threads == 1:
        digests = [digest(job) for job in jobs]
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="tabloader-checksum") as pool:
            digests = list(pool.map(digest, jobs))
    out: list[list[str]] = [[] for _ in files]
    for job, d in zip(jobs, digests, strict=True):
        out[job[0]].append(d)
    return out


# -- .npy files ---------------------------------------------------------------------------


def read_npy(path: Path, shape: tuple[int, ...], dtype: np.dtype[Any]) -> NDArray[Any]:
    """The ``.npy`` file ``path`` as a read-only mapping, which must hold exactly an
    array of ``shape`` and ``dtype`` (and nothing else: no pickled objects, no trailing
    bytes); raises `CacheDamaged` otherwise."""
    fd = _open_private(path)
    with os.fdopen(fd, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                header = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                header = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"version {version}")
        except (ValueError, EOFError, OSError) as error:
            raise CacheDamaged(f"{path.name} is not a valid .npy file ({error})") from None
        found, fortran, found_dtype = header
        if tuple(found) != tuple(shape) or fortran or found_dtype != np.dtype(dtype):
            raise CacheDamaged(
                f"{path.name} holds a {found_dtype} array of shape {found}, not the cache's"
            )
        offset = f.tell()
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
