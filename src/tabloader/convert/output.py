"""Writing a conversion: split files sized for the loader, put in place whole or not at all.

Every file is written into a hidden staging directory inside the destination first.
Only when all of them are written and their footers counted are they moved into place,
and the files a previous conversion wrote (listed in the destination's manifest,
``.tabloader-convert.json``) moved out, while SIGINT and SIGTERM wait: an interrupted
or failed conversion leaves the destination as it was, and the new set never mixes
with the old. A file the manifest does not list (``mydata.parquet``, ``notes.txt``) is
never deleted: a destination holding one is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tabloader.convert.inputs import shorten
from tabloader.errors import InvalidArgumentError

__all__ = ["MANIFEST", "Destination", "SplitWriter"]

MANIFEST = ".tabloader-convert.json"
"""The file in a destination that lists the files a conversion wrote there."""
STAGING_PREFIX = ".tabloader-convert-"


class SplitWriter:
    """One split's files: row groups of ``row_group_rows`` rows, files of
    ``rows_per_file`` rows (a file's last group shorter where the two do not divide),
    written as the rows arrive."""

    def __init__(
        self, directory: str, schema: pa.Schema, row_group_rows: int, rows_per_file: int
    ) -> None:
        self.directory = directory
        self.schema = schema
        self.row_group_rows = row_group_rows
        self.rows_per_file = rows_per_file
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.writer: pq.ParquetWriter | None = None
        self.file_rows = 0
        self.files: list[str] = []
        self.rows = 0

    def add(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        self.pending.append(table)
        self.pending_rows += table.num_rows
        while self.pending_rows >= self._group_rows():
            self._write(self._group_rows())

    def _group_rows(self) -> int:
        """Rows of the next row group: a whole group, or what the file has room for."""
        return min(self.row_group_rows, self.rows_per_file - self.file_rows)

    def _write(self, rows: int) -> None:
        whole = pa.concat_tables(self.pending)
        group, rest = whole.slice(0, rows), whole.slice(rows)
        self.pending = [rest] if rest.num_rows else []
        self.pending_rows = rest.num_rows
        if self.writer is None:
            os.makedirs(self.directory, exist_ok=True)
            path = os.path.join(self.directory, self.file_name(len(self.files)))
            self.writer = pq.ParquetWriter(path, self.schema)
            self.files.append(path)
        self.writer.write_table(group, row_group_size=rows)
        self.rows += rows
        self.file_rows += rows
        if self.file_rows >= self.rows_per_file:
            self.writer.close()
            self.writer = None
            self.file_rows = 0

    def file_name(self, number: int) -> str:
        """The name of the split's file ``number`` (from 0)."""
        return f"part-{number:05d}.parquet"

    def close(self) -> None:
        while self.pending_rows:
            self._write(min(self.pending_rows, self._group_rows()))
        if not self.files:  # no row came: a file of none keeps the split and its schema
            os.makedirs(self.directory, exist_ok=True)
            path = os.path.join(self.directory, self.file_name(0))
            pq.write_table(self.schema.empty_table(), path)
            self.files.append(path)
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def abandon(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class Destination:
    """The destination directory: what a previous conversion left there, a staging
    directory for this one, and the swap of one set of files for the other."""

    def __init__(self, root: str, *, overwrite: bool) -> None:
        self.root = root
        if os.path.exists(root) and not os.path.isdir(root):
            raise InvalidArgumentError(f"the destination {root!r} is a file; give a directory")
        self.previous = self._previous_files()
        present = self._files()
        foreign = [p for p in present if p not in self.previous]
        if present and (foreign or not overwrite):
            shown = shorten(foreign or present, 5)
            raise InvalidArgumentError(
                f"the destination {root!r} is not empty ({shown}): give a new directory"
                + (
                    ", or overwrite=True (--overwrite) to replace the files a previous "
                    "conversion wrote"
                    if not foreign
                    else "; convert writes only into a directory that is empty or holds "
                    "nothing but a previous conversion's files, which --overwrite replaces "
                    "(it never deletes another file)"
                )
            )
        self.staging = os.path.join(root, f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}")
        # the directories this conversion makes (the destination, its missing parents),
        # deepest first: a conversion that fails leaves none of them
        self._made: list[str] = []
        missing = os.path.abspath(root)
        while not os.path.exists(missing):
            self._made.append(missing)
            missing = os.path.dirname(missing)
        self._remove_abandoned()
        os.makedirs(self.staging)
        with open(os.path.join(self.staging, ".owner"), "w") as f:
            f.write(str(os.getpid()))

    def _remove_abandoned(self) -> None:
        """Staging directories of conversions that were killed (their process is gone)."""
        if not os.path.isdir(self.root):
            return
        for name in os.listdir(self.root):
            if not name.startswith(STAGING_PREFIX):
                continue
            path = os.path.join(self.root, name)
            try:
                with open(os.path.join(path, ".owner")) as f:
                    owner = int(f.read())
            except (OSError, ValueError):
                continue  # not one of ours, or its owner has not written it yet
            if not _alive(owner):
                shutil.rmtree(path, ignore_errors=True)

    def _files(self) -> list[str]:
        """Every file under the destination (relative), hidden ones left out."""
        found: list[str] = []
        if not os.path.isdir(self.root):
            return found
        for directory, subdirectories, names in os.walk(self.root):
            subdirectories[:] = sorted(d for d in subdirectories if not d.startswith("."))
            found += [
                os.path.relpath(os.path.join(directory, name), self.root)
                for name in sorted(names)
                if not name.startswith(".")
            ]
        return found

    def _previous_files(self) -> list[str]:
        path = os.path.join(self.root, MANIFEST)
        try:
            with open(path) as f:
                listed = json.load(f).get("files", [])
        except (OSError, ValueError, AttributeError):
            return []
        inside = [
            os.path.normpath(p)
            for p in listed
            if isinstance(p, str) and not os.path.isabs(p) and not p.startswith("..")
        ]
        return [p for p in inside if os.path.isfile(os.path.join(self.root, p))]

    def staged(self, *parts: str) -> str:
        """A path in the staging directory."""
        return os.path.join(self.staging, *parts)

    def swap(self, written: list[str], about: Mapping[str, Any]) -> None:
        """Move the staged files ``written`` (relative) into place and the previous
        conversion's files out, then record the new set; SIGINT and SIGTERM wait until
        it is done, and a failure part-way puts the previous files back."""
        trash = os.path.join(self.root, f"{STAGING_PREFIX}old-{uuid.uuid4().hex[:12]}")
        moved_out: list[str] = []
        moved_in: list[str] = []
        with _signals_held():
            try:
                for rel in self.previous:
                    _move(os.path.join(self.root, rel), os.path.join(trash, rel))
                    moved_out.append(rel)
                for rel in written:
                    _move(os.path.join(self.staging, rel), os.path.join(self.root, rel))
                    moved_in.append(rel)
                manifest = os.path.join(self.root, MANIFEST)
                with open(manifest + ".tmp", "w") as f:
                    json.dump({**about, "files": written}, f, indent=1, sort_keys=True)
                os.replace(manifest + ".tmp", manifest)
            except BaseException:
                for rel in reversed(moved_in):
                    _move(os.path.join(self.root, rel), os.path.join(self.staging, rel))
                for rel in reversed(moved_out):
                    _move(os.path.join(trash, rel), os.path.join(self.root, rel))
                raise
            # Still held: a SIGINT that waited is raised as the block ends, and would
            # leave the previous files behind in a hidden directory.
            shutil.rmtree(trash, ignore_errors=True)
            for rel in self.previous:  # directories the previous set alone used
                parent = os.path.dirname(rel)
                while parent:
                    with contextlib.suppress(OSError):
                        os.rmdir(os.path.join(self.root, parent))
                    parent = os.path.dirname(parent)

    def discard(self) -> None:
        """Remove the staging directory (a SIGINT waits: it would leave half of it)."""
        with _signals_held():
            shutil.rmtree(self.staging, ignore_errors=True)
            for made in self._made:  # nothing was moved into them: as they were, absent
                with contextlib.suppress(OSError):
                    os.rmdir(made)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _move(source: str, target: str) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(source, target)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back until the block is done, then delivered.

    Their handlers are set aside rather than the signals blocked: a signal blocked in the
    main thread is delivered to another thread of the process (pyarrow's, the loader's),
    and Python then runs its handler in the main thread all the same, inside the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def defer(signum: int, frame: Any) -> None:
        caught.append(signum)

    previous = {s: signal.signal(s, defer) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        if caught:
            signal.raise_signal(caught[0])
