"""Directories that hold several splits: refused, so that training never reads validation rows.

A directory is searched recursively, which is what Hive-partitioned layouts need
(``data/date=2024-01-01/part-0.parquet``). The same search over ``data/`` holding
``data/train/`` and ``data/valid/`` would silently train on both; sibling subdirectories
named like splits are therefore an error that names them and says how to pick one.

Examples:
    >>> split_siblings(["train/a.parquet", "valid/b.parquet", "valid/c.parquet"])
    ('', {'train': 1, 'valid': 2})
    >>> split_siblings(["date=1/a.parquet", "date=2/b.parquet"]) is None  # Hive keys
    True
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from tabloader.errors import InvalidArgumentError

__all__ = ["SPLIT_NAMES", "refuse_mixed_splits", "split_siblings"]

SPLIT_NAMES = frozenset(
    {"train", "training", "valid", "validation", "val", "test", "testing", "eval", "evaluation"}
)
"""Directory names taken for splits (compared without regard to case)."""


def split_siblings(relative_files: Sequence[str]) -> tuple[str, dict[str, int]] | None:
    """The first directory (relative, ``""`` for the top) with two or more subdirectories
    named like splits, and the files under each; None when there is none.

    ``relative_files`` are the files found, relative to the directory searched, with
    ``/`` between parts.
    """
    children: dict[str, dict[str, int]] = {}
    for path in relative_files:
        parts = path.split("/")[:-1]
        for depth, name in enumerate(parts):
            if name.lower() in SPLIT_NAMES:
                parent = "/".join(parts[:depth])
                counts = children.setdefault(parent, {})
                counts[name] = counts.get(name, 0) + 1
    for parent in sorted(children, key=lambda p: (p.count("/"), p)):
        if len(children[parent]) >= 2:
            return parent, dict(sorted(children[parent].items()))
    return None


def refuse_mixed_splits(spec: str, root: str, files: Sequence[str]) -> None:
    """Raise when the directory ``spec`` (listed from ``root``) holds sibling splits.

    Raises:
        InvalidArgumentError: naming the split directories, with how to load one.
    """
    relative = [
        p[len(root) :].lstrip("/") if p.startswith(root) else posixpath.basename(p) for p in files
    ]
    found = split_siblings(relative)
    if found is None:
        return
    parent, counts = found
    where = posixpath.join(spec.rstrip("/"), parent) if parent else spec.rstrip("/")
    listed = ", ".join(f"{name}/ ({n:,} file{'' if n == 1 else 's'})" for name, n in counts.items())
    first, *others = (posixpath.join(where, name) for name in counts)
    raise InvalidArgumentError(
        f"the directory {spec!r} holds sibling directories that look like splits, in "
        f"{where!r}: {listed}. Reading it would mix them in one dataset. Pass the one to "
        f"load, e.g. Dataset({first!r}), or list them to mix them on purpose: "
        f"Dataset([{first!r}, {others[0]!r}{', ...' if len(others) > 1 else ''}])"
    )
