"""Synthetic data with the Criteo click-log schema, for trying tabloader out and benchmarks.

The data is **synthetic**: ``label``, 13 continuous ``I1..I13`` (float32) and 26
categorical ``C1..C26`` (int64 ids) with Criteo-like cardinalities, Zipf-skewed ids, and
a label that depends on a few features so that a model has something to learn. It is
not Criteo data and says nothing about real click behaviour.

Examples:
    >>> import tempfile, tabloader
    >>> from tabloader.synthetic import write_criteo_like, CATS, CONTS
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     files = write_criteo_like(tmp, rows=1000, files=2, row_group_size=250, seed=0)
    ...     ds = tabloader.Dataset(files)
    ...     len(files), len(ds), ds.num_partitions, len(CATS), len(CONTS)
    (2, 1000, 4, 26, 13)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["CARDINALITIES", "CATS", "CONTS", "LABELS", "criteo_like_table", "write_criteo_like"]

CONTS = [f"I{i}" for i in range(1, 14)]
"""The 13 continuous columns, ``I1``..``I13`` (float32)."""
CATS = [f"C{i}" for i in range(1, 27)]
"""The 26 categorical columns, ``C1``..``C26`` (int64 ids)."""
LABELS = ["label"]
"""The label column (float32, 0 or 1)."""

CARDINALITIES = dict(
    zip(
        CATS,
        [
            1_460,
            580,
            1_000_000,
            800_000,
            305,
            24,
            12_517,
            633,
            3,
            93_145,
            5_683,
            1_000_000,
            3_194,
            27,
            14_992,
            1_000_000,
            10,
            5_652,
            2_173,
            4,
            1_000_000,
            18,
            15,
            286_181,
            105,
            142_572,
        ],
        strict=True,
    )
)
"""Number of distinct ids per categorical column, close to the Criteo day logs'
(the largest ones capped at one million)."""


def _zipf_ids(rng: np.random.Generator, rows: int, cardinality: int) -> NDArray[np.int64]:
    # Zipf-like: a few ids are very frequent, most are rare; ids stay below cardinality.
    ranks = rng.zipf(1.15, rows) - 1
    return (ranks % cardinality).astype(np.int64)


def criteo_like_table(rows: int, *, seed: int = 0) -> pa.Table:
    """``rows`` rows of synthetic Criteo-like data as an Arrow table (see module docstring)."""
    rng = np.random.default_rng(seed)
    columns: dict[str, NDArray[Any]] = {}
    for name in CONTS:
        columns[name] = np.log1p(rng.exponential(3.0, rows)).astype(np.float32)
    for name in CATS:
        columns[name] = _zipf_ids(rng, rows, CARDINALITIES[name])
    # The learnable signal: a logit from two continuous features and the parity of
    # two categorical ids, so both embeddings and dense layers have work to do.
    logit = (
        1.5 * (columns["I1"] - 1.3)
        - 1.0 * (columns["I2"] - 1.3)
        + 1.2 * (columns["C1"] % 2 == 0)
        - 1.2 * (columns["C9"] == 1)
        - 0.9
    )
    probability = 1.0 / (1.0 + np.exp(-logit))
    label = (rng.random(rows) < probability).astype(np.float32)
    return pa.table({"label": label, **columns})


def write_criteo_like(
    directory: str | os.PathLike[str],
    *,
    rows: int,
    files: int = 4,
    row_group_size: int = 131_072,
    seed: int = 0,
) -> list[str]:
    """Write ``rows`` synthetic rows as ``files`` parquet files in ``directory``.

    Returns the file paths, in order. Each file gets its own slice of one random stream,
    so the same ``seed`` always writes the same data.
    """
    if rows < files or files < 1:
        raise ValueError(f"need at least one row per file, got rows={rows}, files={files}")
    os.makedirs(directory, exist_ok=True)
    paths = []
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for i in range(files):
        table = criteo_like_table(int(bounds[i + 1] - bounds[i]), seed=seed * 1_000_003 + i)
        path = os.path.join(os.fspath(directory), f"part-{i:05d}.parquet")
        pq.write_table(table, path, row_group_size=row_group_size)
        paths.append(path)
    return paths
