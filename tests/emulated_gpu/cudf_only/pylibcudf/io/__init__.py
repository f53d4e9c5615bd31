"""Emulated ``pylibcudf.io``: sources and the parquet reader."""

from __future__ import annotations

import errno
import os
from typing import Any

from . import parquet

__emulated__ = True

__all__ = ["SourceInfo", "TableWithMetadata", "parquet"]


class SourceInfo:
    """Paths to read (pylibcudf/io/types.pyx SourceInfo: a path must name a file, checked
    with ``os.path.isfile``, else FileNotFoundError)."""

    def __init__(self, sources: list[Any]) -> None:
        if not sources:
            raise ValueError("Need to pass at least one source")
        for source in sources:
            if not isinstance(source, (str, os.PathLike)):
                raise ValueError(
                    "the emulated pylibcudf reads paths only (bytes and buffers are not emulated)"
                )
            if not os.path.isfile(source):
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), source)
        self.sources = [os.fspath(s) for s in sources]


class TableWithMetadata:
    def __init__(self, columns: list[Any], names: list[str]) -> None:
        self._columns, self._names = columns, names

    @property
    def columns(self) -> list[Any]:
        return list(self._columns)

    def column_names(self, include_children: bool = False) -> list[str]:
        return list(self._names)
