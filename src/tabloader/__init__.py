"""tabloader: keep accelerators fed with tabular training data.

Parquet row groups are read in large chunks in a background thread, shuffled and cut
into whole batches with vectorised array code, and handed to the framework without
per-row Python.

Examples:
    >>> import pyarrow as pa, tabloader
    >>> ds = tabloader.Dataset(pa.table({"item": [3, 1, 2], "label": [1.0, 0.0, 1.0]}))
    >>> loader = tabloader.Loader(ds, cats=["item"], labels=["label"], batch_size=2)
    >>> [batch["item"].tolist() for batch in loader]
    [[3, 1], [2]]
"""

from tabloader import errors
from tabloader._version import __version__
from tabloader.config import LoaderOptions
from tabloader.dataset import Dataset
from tabloader.errors import *  # noqa: F403  (the exceptions and warnings: errors.__all__)
from tabloader.iterator import BatchIterator
from tabloader.loader import Loader
from tabloader.progress import Progress
from tabloader.state import agreed_state
from tabloader.stats import LoaderStats

__all__ = [
    "BatchIterator",
    "Dataset",
    "Loader",
    "LoaderOptions",
    "LoaderStats",
    "Progress",
    "__version__",
    "agreed_state",
]
__all__ += errors.__all__
