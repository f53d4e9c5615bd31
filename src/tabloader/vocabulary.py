"""A categorical column's vocabulary on disk: the file ``tabloader convert`` writes, and its size.

``tabloader convert ... --categorify user_id`` writes ``DEST/_vocabulary/user_id.parquet``
beside the data (a directory whose name starts with ``_``, so that reading ``DEST`` never
takes it for data). It holds one row per value kept, in id order, with two columns:

- ``value``: the value, with the column's type (text, integers, ...);
- ``count``: how often it occurred in the rows the vocabulary was fitted on.

The ids are fixed by the file: id ``OOV_ID`` (0) is every value that is not in it,
``NULL_ID`` (1) a null, and the value on row ``k`` has id ``FIRST_ID + k``. An embedding
table for the column therefore has `vocabulary_rows` rows: the values plus the two
reserved ids. The file's metadata (``METADATA_KEY``) names the column and says how the
vocabulary was fitted.

Examples:
    >>> import os, tempfile
    >>> directory = tempfile.mkdtemp()
    >>> path = write_vocabulary(directory, "city", pa.array(["paris", "oslo"]), pa.array([5, 2]),
    ...                         {"min_count": 1})
    >>> vocabulary_rows(directory, "city"), os.path.basename(vocabulary_path(directory, "city"))
    (4, 'city.parquet')
    >>> read_vocabulary(directory, "city").column("value").to_pylist()
    ['paris', 'oslo']
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tabloader.errors import InvalidArgumentError, InvalidFileError, SourceNotFoundError

__all__ = [
    "FIRST_ID",
    "METADATA_KEY",
    "NULL_ID",
    "OOV_ID",
    "VOCABULARY_DIR",
    "find_vocabulary_dir",
    "read_vocabulary",
    "vocabulary_columns",
    "vocabulary_metadata",
    "vocabulary_path",
    "vocabulary_rows",
    "write_vocabulary",
]

VOCABULARY_DIR = "_vocabulary"
"""The directory beside the data that holds the vocabularies."""
OOV_ID = 0
"""The id of a value that is not in the vocabulary (unseen, or rarer than the minimum count)."""
NULL_ID = 1
"""The id of a null."""
FIRST_ID = 2
"""The id of the vocabulary's first (most frequent) value."""
METADATA_KEY = b"tabloader.vocabulary"
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def _file_name(column: str) -> str:
    """``column`` as a file name: other characters than letters, digits, ``_-.`` as
    ``%XX`` of their UTF-8 bytes, so that every column name gets its own file."""
    name = "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in column)
    return f"{name}.parquet"


def vocabulary_path(directory: str | os.PathLike[str], column: str) -> str:
    """The file of ``column``'s vocabulary in ``directory``."""
    return os.path.join(os.fspath(directory), _file_name(column))


def find_vocabulary_dir(path: str | os.PathLike[str]) -> str:
    """The vocabulary directory ``path`` names: itself, or the ``_vocabulary`` directory
    inside it (a converted dataset's destination).

    Raises:
        SourceNotFoundError: neither holds a vocabulary file.
    """
    path = os.path.expanduser(os.fspath(path))
    for candidate in (os.path.join(path, VOCABULARY_DIR), path):
        if os.path.isdir(candidate) and vocabulary_columns(candidate):
            return candidate
    if not os.path.exists(path):
        raise SourceNotFoundError(f"the vocabulary directory {path!r} does not exist")
    raise SourceNotFoundError(
        f"{path!r} holds no vocabulary: give the {VOCABULARY_DIR} directory that "
        "tabloader convert --categorify wrote, or the destination it wrote it in"
    )


def vocabulary_columns(directory: str | os.PathLike[str]) -> dict[str, str]:
    """``{column: file}`` of every vocabulary in ``directory``, from the files' metadata."""
    found: dict[str, str] = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(os.fspath(directory), name)
        if not name.endswith(".parquet") or not os.path.isfile(path):
            continue
        try:
            meta = vocabulary_metadata(path)
        except InvalidFileError:
            continue
        found[meta["column"]] = path
    return found


def vocabulary_metadata(path: str) -> dict[str, Any]:
    """What a vocabulary file says about itself: ``column``, ``values``, ``min_count``, ...

    Raises:
        InvalidFileError: the file is not a vocabulary tabloader wrote.
    """
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as err:
        raise InvalidFileError(f"{path} is not a readable vocabulary file ({err})") from None
    raw = (schema.metadata or {}).get(METADATA_KEY)
    if raw is None or schema.names != ["value", "count"]:
        raise InvalidFileError(
            f"{path} is not a vocabulary tabloader convert wrote (it needs the columns value "
            "and count, and tabloader's metadata)"
        )
    try:
        meta: dict[str, Any] = json.loads(raw)
    except ValueError:
        raise InvalidFileError(f"{path}: its vocabulary metadata is not JSON") from None
    if not isinstance(meta.get("column"), str) or not isinstance(meta.get("values"), int):
        raise InvalidFileError(f"{path}: its vocabulary metadata lacks the column or its size")
    return meta


def vocabulary_rows(directory: str | os.PathLike[str], column: str) -> int:
    """Rows of an embedding table for ``column``'s vocabulary in ``directory``: its
    values and the two reserved ids (unknown values, nulls).

    Raises:
        SourceNotFoundError: ``directory`` holds no vocabulary of ``column``.
        InvalidFileError: the file is damaged or not a vocabulary.
    """
    path = vocabulary_path(directory, column)
    if not os.path.isfile(path):
        held = sorted(vocabulary_columns(directory)) if os.path.isdir(directory) else []
        raise SourceNotFoundError(
            f"{os.fspath(directory)!r} holds no vocabulary of column {column!r}"
            + (f"; it holds {', '.join(map(repr, held))}" if held else "")
        )
    meta = vocabulary_metadata(path)
    rows = pq.read_metadata(path).num_rows
    if meta["column"] != column or meta["values"] != rows:
        raise InvalidFileError(
            f"{path} says it holds {meta['values']:,} values of column {meta['column']!r}, "
            f"but holds {rows:,} rows: it was changed after tabloader wrote it. Convert again"
        )
    return FIRST_ID + rows


def read_vocabulary(directory: str | os.PathLike[str], column: str) -> pa.Table:
    """``column``'s vocabulary: ``value`` and ``count``, in id order (id = 2 + row)."""
    vocabulary_rows(directory, column)  # checks the file
    return pq.read_table(vocabulary_path(directory, column))


def write_vocabulary(
    directory: str | os.PathLike[str],
    column: str,
    values: Any,
    counts: Any,
    about: Mapping[str, Any],
) -> str:
    """Write ``column``'s vocabulary: ``values`` in id order with their ``counts`` (one
    array each, or matching sequences of arrays written as row groups); ``about`` goes
    into the metadata beside the column's name and size. Returns the file's path."""
    value_parts = [values] if isinstance(values, (pa.Array, pa.ChunkedArray)) else list(values)
    count_parts = [counts] if isinstance(counts, (pa.Array, pa.ChunkedArray)) else list(counts)
    if len(value_parts) != len(count_parts):
        raise InvalidArgumentError("values and counts must come in as many parts")
    size = sum(len(v) for v in value_parts)
    value_type = value_parts[0].type if value_parts else pa.string()
    meta = {**about, "column": column, "values": size, "oov_id": OOV_ID, "null_id": NULL_ID}
    schema = pa.schema([("value", value_type), ("count", pa.int64())]).with_metadata(
        {METADATA_KEY: json.dumps(meta, sort_keys=True)}
    )
    os.makedirs(directory, exist_ok=True)
    path = vocabulary_path(directory, column)
    with pq.ParquetWriter(path, schema) as writer:
        for v, c in zip(value_parts, count_parts, strict=True):
            count = c if isinstance(c, (pa.Array, pa.ChunkedArray)) else pa.array(c)
            writer.write_table(pa.table([v, count.cast(pa.int64())], schema=schema))
        if not value_parts:
            writer.write_table(schema.empty_table())
    return path
