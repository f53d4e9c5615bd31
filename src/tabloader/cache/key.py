"""What a decoded cache is keyed by: everything that shapes the rows it stores.

A cache is found again by the hash of its key, so the key must change whenever the rows
would: the files' identities (their paths, sizes and footer digests, which their
content decides, plus the stamps a rewrite changes: modification and change times and
inode locally, ETag or version id on object storage), the row groups' row counts, the
delivered columns with their blocks, dtypes and fill values, and the rank's share.

Examples:
    >>> from tabloader.batches import Block
    >>> import numpy as np
    >>> key = cache_key(files=[{"path": "/d/a.parquet", "size": 10, "footer": "ab"}],
    ...                 partition_rows=np.array([5]), fill_null={},
    ...                 blocks=[Block("x", ("x",), np.dtype("float32"))],
    ...                 global_rank=0, global_size=1)
    >>> key["blocks"], key["share"], len(digest(key))
    ([['x', ['x'], 'float32', False]], [0, 1], 32)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from tabloader.batches import Block
    from tabloader.dataset import Dataset

__all__ = ["FORMAT", "cache_key", "digest", "file_identities", "fill_text", "lineage"]

FORMAT = 3
"""Version of the on-disk layout; part of the key, so a new layout never reads an old one.
2: list columns, footer digests in the key, checksums in the manifest; 3: CRC-32
checksums (`tabloader.cache.files.CHECKSUM`)."""


def file_identities(dataset: Dataset) -> list[dict[str, Any]]:
    """Each file of ``dataset`` as it was listed (see
    [`Dataset.file_identities`][tabloader.Dataset.file_identities]): a file rewritten in
    place, even with its size and modification time kept, has another identity, and so the
    cache another key. A Delta or Iceberg table is keyed by its version too, and by how
    its files are read at that version (an Iceberg schema change makes no new version)."""
    identities = dataset.file_identities()
    if dataset.version is not None:
        table = {
            "path": f"{dataset.table_format} table",
            "version": dataset.version,
            "reading": dataset.source.table_reading,
        }
        return [table, *identities]
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
    """Everything that shapes the rows a cache stores, as JSON-ready values (fill values
    as `fill_text` gives them)."""
    columns = {c for b in blocks for c in b.columns}
    return {
        "format": FORMAT,
        "files": [dict(f) for f in files],
        "partition_rows": [int(n) for n in partition_rows],
        "blocks": [[b.name, list(b.columns), str(b.dtype), b.ragged] for b in blocks],
        "fill_null": {c: fill_text(v) for c, v in sorted(fill_null.items()) if c in columns},
        "share": [global_rank, global_size],
    }


def fill_text(value: Any) -> str:
    """A fill value exactly, as text a key compares: an integer's digits (a float would
    round those beyond 2**53 together), a float's hexadecimal form (NaN equal to itself,
    which as a float it is not).

    Examples:
        >>> fill_text(2**53 + 1), fill_text(np.int64(-1)), fill_text(0.1), fill_text(float("nan"))
        ('9007199254740993', '-1', '0x1.999999999999ap-4', 'nan')
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return str(int(value))
    return float(value).hex()


def digest(value: object) -> str:
    """A short hash of a JSON-ready ``value``: a cache's directory name."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def lineage(key: Mapping[str, Any]) -> str:
    """The key without the files' versions: caches of earlier versions of the same files."""
    return digest({**key, "files": [f["path"] for f in key["files"]], "partition_rows": None})
