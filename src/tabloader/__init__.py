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

from tabloader.dataset import Dataset
from tabloader.errors import (
    CacheWarning,
    ColumnNotFoundError,
    ColumnTypeError,
    EmptyDatasetError,
    EmptyEpochWarning,
    InvalidArgumentError,
    InvalidFileError,
    NullValuesError,
    PerformanceWarning,
    ReadError,
    SchemaMismatchError,
    SourceNotFoundError,
    TabloaderError,
)
from tabloader.loader import BatchIterator, Loader
from tabloader.stats import LoaderStats

__version__ = "0.1.0"

__all__ = [
    "BatchIterator",
    "CacheWarning",
    "ColumnNotFoundError",
    "ColumnTypeError",
    "Dataset",
    "EmptyDatasetError",
    "EmptyEpochWarning",
    "InvalidArgumentError",
    "InvalidFileError",
    "Loader",
    "LoaderStats",
    "NullValuesError",
    "PerformanceWarning",
    "ReadError",
    "SchemaMismatchError",
    "SourceNotFoundError",
    "TabloaderError",
    "__version__",
]
