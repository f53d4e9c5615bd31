"""Where disk caches live: one private directory per cache, owner records, publishing, cleanup.

A decoded cache is training data, as sensitive as the model trained on it, so the cache
directory is kept like an ssh key directory:

- every directory is created ``0700`` and every file ``0600``, whatever the umask;
- a cache directory, published cache or file that another user owns, or that others
  can write, is refused (`CacheRefused`: the loader warns and streams);
- only regular files are read (never a link, a FIFO or a device), opened without
  following links, and a manifest names exactly the files the loader expects, so no
  entry can point out of the cache;
- every file's data is checksummed (a CRC-32 per segment, `tabloader.cache.files`) when
  the cache is published and verified when it is opened: a mismatch is `CacheDamaged`
  (the loader warns, deletes it, streams and writes it again);
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
import os
import secrets
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tabloader.cache.files import (
    CHECKSUM,
    CacheDamaged,
    CacheRefused,
    FileSpec,
    TempVanished,
    file_checksums,
    make_private_dir,
    read_npy,
    read_record,
    refusal,
    this_user,
    write_record,
)
from tabloader.errors import InvalidArgumentError

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "MANIFEST",
    "OWNER",
    "TEMP_PREFIX",
    "CacheStore",
    "owner_record",
    "writer_gone",
]

MANIFEST = "manifest.json"
OWNER = "owner.json"
TEMP_PREFIX = ".tmp-"
UNVERIFIABLE_AFTER = 7 * 24 * 3600
"""Seconds after which a temporary directory of this user whose writer cannot be
checked (another machine, PID namespace or boot) counts as abandoned."""


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
        "uid": this_user(),
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
                make_private_dir(directory)
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
        reason = refusal(st, root)
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
        reason = refusal(st, directory)
        if reason is not None:
            raise CacheRefused(reason)
        manifest = read_record(directory / MANIFEST)
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
            listed = entry.get(CHECKSUM)
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
        make_private_dir(temp)
        try:
            write_record(temp / OWNER, owner_record())
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
            write_record(temp / MANIFEST, manifest)
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
        return stat.S_ISDIR(st.st_mode) and refusal(st, path) is None

    def remove(self, digest: str) -> bool:
        """Delete published cache ``digest`` if it is this user's; whether it is gone."""
        path = self.path(digest)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return True
        if not stat.S_ISDIR(st.st_mode):
            if this_user() is not None and st.st_uid != this_user():
                return False
            with contextlib.suppress(OSError):
                path.unlink()  # a link or file planted in its place, in this user's directory
            return not os.path.lexists(path)
        if refusal(st, path) is not None:
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
                record: dict[str, Any] | None = read_record(path / OWNER)
            except CacheDamaged:
                record = None
            age = now - _newest_change(path)
            if record is None:
                # Made, and its writer gone before its record was written: empty.
                if age > 3600:
                    with contextlib.suppress(OSError):
                        os.rmdir(path)
                continue
            if record.get("uid") != this_user() and this_user() is not None:
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
                if read_record(path / MANIFEST).get("lineage") == lineage:
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
