"""A hand-written GPU loop: what a user writes with cudf and cupy alone, as a yardstick.

Each epoch visits the files in a random order; each file is read whole with
``cudf.read_parquet``, its rows are put in a random order with one gather per column
(a cupy permutation), and batches are slices of the shuffled columns, which cost no
kernel. Rows never cross a file, the last batch of each file is short, and nothing is
read ahead: the loop is as simple as it gets, not a loader.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np


def epoch(
    files: list[str], columns: list[str], batch_size: int, *, seed: int, epoch: int
) -> Iterator[dict[str, Any]]:
    """One epoch's batches: dictionaries of cupy arrays, one per column."""
    import cudf
    import cupy

    cupy.random.seed(seed * 1_000_003 + epoch)
    for i in np.random.default_rng([seed, epoch]).permutation(len(files)):
        frame = cudf.read_parquet(files[i], columns=columns)
        order = cupy.random.permutation(len(frame))
        shuffled = {name: frame[name].values[order] for name in columns}
        del frame
        for start in range(0, len(order), batch_size):
            yield {name: array[start : start + batch_size] for name, array in shuffled.items()}
