"""The exceptions and warnings tabloader raises.

Every error a user can provoke derives from
[`TabloaderError`][tabloader.errors.TabloaderError] and from the builtin exception that
fits, so ``except FileNotFoundError`` keeps working.

Examples:
    >>> import tabloader
    >>> try:
    ...     tabloader.Dataset("no/such/dir/*.parquet")
    ... except tabloader.SourceNotFoundError as err:
    ...     print(type(err).__mro__[2].__name__)
    FileNotFoundError
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

__all__ = [
    "CacheWarning",
    "ColumnNotFoundError",
    "ColumnTypeError",
    "EmbeddingSizeWarning",
    "EmptyDatasetError",
    "EmptyEpochWarning",
    "GPUMemoryError",
    "GPUUnavailableError",
    "InvalidArgumentError",
    "InvalidFileError",
    "NullValuesError",
    "PerformanceWarning",
    "ReadError",
    "SchemaMismatchError",
    "SourceNotFoundError",
    "TabloaderError",
    "UnsupportedTableError",
    "ValueRangeError",
]


class TabloaderError(Exception):
    """Base class of every error raised by tabloader."""


class InvalidArgumentError(TabloaderError, ValueError):
    """An argument has a value tabloader cannot work with (the message says which and why)."""


class SourceNotFoundError(TabloaderError, FileNotFoundError):
    """A path does not exist, or a glob or directory holds no parquet file."""


class InvalidFileError(TabloaderError, ValueError):
    """A file is empty, truncated, or not parquet."""


class ColumnNotFoundError(TabloaderError, KeyError):
    """A requested column is missing from a file or table."""

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0]) if self.args else ""


class ColumnTypeError(TabloaderError, TypeError):
    """A requested column is not numeric (or not integral, for a categorical column)."""


class SchemaMismatchError(TabloaderError, ValueError):
    """A file stores a requested column with another type than the first file does."""


class NullValuesError(TabloaderError, ValueError):
    """A requested column holds nulls and no fill value was given for it."""


class UnsupportedTableError(TabloaderError, ValueError):
    """A Delta or Iceberg table uses a feature tabloader cannot honour (deletion vectors,
    column mapping, delete files): its files do not hold exactly the table's rows."""


class ValueRangeError(TabloaderError, ValueError):
    """A value does not fit the dtype its column is delivered as (it would wrap around,
    lose its fraction or become infinite); the message names the column, the value and
    the dtype."""


class EmptyDatasetError(TabloaderError, ValueError):
    """The loader would yield no batch at all."""


class ReadError(TabloaderError, OSError):
    """Reading or decoding a partition failed while loading; the message names the file."""


class GPUUnavailableError(TabloaderError, ImportError):
    """The GPU backend was asked for, but cudf or cupy is missing or broken, or no GPU is seen."""


class GPUMemoryError(TabloaderError, MemoryError):
    """A chunk did not fit in GPU memory; the message says how to make chunks smaller."""


class EmptyEpochWarning(UserWarning):
    """A rank (or worker) gets fewer rows than a batch with ``drop_last=True``: its epochs
    yield no batch, as a torch ``DataLoader`` with ``drop_last=True`` would."""


class EmbeddingSizeWarning(UserWarning):
    """An embedding table sized for a column would be larger than the memory budget
    (``Dataset.embedding_sizes``); the message says how many distinct ids the column holds
    and how to get a smaller table (``tabloader convert --categorify`` or ``--hash``)."""


class PerformanceWarning(UserWarning):
    """A setup that works but will load slowly (tiny row groups, more ranks than partitions)."""


class CacheWarning(PerformanceWarning):
    """The decoded cache cannot be used (too big for ``cache_max_bytes``, the disk or
    memory; its directory is another user's or writable by others; writing it failed),
    or a published cache was found damaged and is rebuilt.

    The loader then streams from the files, which is correct but slower.
    """


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is a GPU allocation failure from cudf, rmm, cupy or CUDA.

    rmm and cudf raise ``MemoryError`` (``std::bad_alloc: out_of_memory``), cupy its
    ``OutOfMemoryError`` (a ``MemoryError``); some CUDA paths raise ``RuntimeError``.

    Examples:
        >>> is_out_of_memory(MemoryError("std::bad_alloc: out_of_memory: RMM failure"))
        True
        >>> is_out_of_memory(RuntimeError("cudaErrorMemoryAllocation out of memory"))
        True
        >>> is_out_of_memory(ValueError("bad value"))
        False
    """
    if isinstance(error, MemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and (
        "out of memory" in text or "out_of_memory" in text or "memoryallocation" in text
    )


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_caller(message: str, category: type[Warning]) -> None:
    """Warn, attributed to the first caller outside tabloader: the user's line that
    built the loader or started the epoch, however deep in the library (and in which
    adapter) it is said. In a thread of tabloader's own, which has no such caller, it is
    attributed to the line that warns.

    Examples:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_caller("a note", UserWarning)
        >>> caught[0].filename.startswith(_PACKAGE)
        False
    """
    frame = sys._getframe(0)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    if frame is None or frame.f_code.co_filename == threading.__file__:
        level = 2
    warnings.warn(message, category, stacklevel=level)
