"""Emulated pylibcudf: the parquet reader and fixed-width columns tabloader uses.

Columns hold device buffers made through cupy's current allocator (rmm's, once cudf is
imported), exposed as pylibcudf exposes them: ``Column.data()`` and ``null_mask()`` are
``gpumemoryview`` objects with a ``__cuda_array_interface__`` (one byte per element;
the mask one bit a row, least significant first, as libcudf and Arrow store it), and
``size()``/``offset()``/``null_count()`` say which rows are the column's. Reading runs on
the stream given (an ``rmm.pylibrmm.stream.Stream``), else on the legacy default stream
(libcudf's default), never on cupy's current stream.
"""

from __future__ import annotations

import enum
from typing import Any

from . import io

__emulated__ = True
__version__ = "26.10-emulated"

__all__ = ["Column", "DataType", "TypeId", "gpumemoryview", "io"]


class TypeId(enum.Enum):
    BOOL8 = "bool"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    FLOAT32 = "float32"
    FLOAT64 = "float64"


class DataType:
    def __init__(self, type_id: TypeId) -> None:
        self._id = type_id

    def id(self) -> TypeId:
        return self._id


class gpumemoryview:
    """Device memory of another object, by its ``__cuda_array_interface__``."""

    def __init__(self, owner: Any) -> None:
        self.obj = owner
        self.__cuda_array_interface__ = owner.__cuda_array_interface__


class Column:
    """A fixed-width column: ``size`` rows from row ``offset`` of its buffers."""

    def __init__(
        self, data_type: DataType, size: int, data: Any, mask: Any, null_count: int, offset: int
    ) -> None:
        self._type, self._size, self._data = data_type, int(size), data
        self._mask, self._null_count, self._offset = mask, int(null_count), int(offset)

    def type(self) -> DataType:
        return self._type

    def size(self) -> int:
        return self._size

    def offset(self) -> int:
        return self._offset

    def null_count(self) -> int:
        return self._null_count

    def data(self) -> gpumemoryview | None:
        return self._data

    def null_mask(self) -> gpumemoryview | None:
        return self._mask

    def children(self) -> list[Column]:
        return []
