"""The decoded cache: one rank's rows, decoded, cast and filled once, served every epoch after.

Decoding parquet sets the pace of a streaming loader. With ``cache="memory"`` or
``cache="disk"`` the first epoch reads the files as usual and writes every decoded row
of the rank's share into row-major ``[rows, k]`` arrays (in the delivered dtype, nulls
filled) at the row's place in the share's stored order: one array per kind (cats,
conts, labels) for shuffled or stacked loaders, whose gathers then read whole rows; one
per column for unshuffled ``layout="columns"`` loaders, whose batches are then
zero-copy views; a list column as its values and each row's span. Every epoch, the
first one included, then gathers its batches from those arrays following the same
[`EpochPlan`][tabloader.plan.EpochPlan], so a cached epoch delivers exactly the batches a
streamed one would. Later epochs read nothing but the cache.

The parts:

- `key`: what a cache is keyed by (the files' content-decided
  identities, the blocks, the share);
- `files`: the files on disk (private, ``.npy``, checksummed);
- `store`: the directory of disk caches (one per key, published by one rename, cleaned
  up by owner record);
- `fill`: filling a cache from an epoch, and publishing it;
- `serve`: gathering an epoch's batches from the cached rows;
- `device`: a GPU loader's cache, placed in GPU or pinned host memory;
- `policy`: `DecodedCache`, which decides each epoch
  between memory, disk and streaming.

Examples:
    >>> import pyarrow as pa, tabloader
    >>> table = pa.table({"x": [0.5, 1.5, 2.5, 3.5]})
    >>> loader = tabloader.Loader(table, conts=["x"], batch_size=2, cache="memory")
    >>> [b["x"].tolist() for b in loader], loader.stats().from_cache
    ([[0.5, 1.5], [2.5, 3.5]], False)
    >>> [b["x"].tolist() for b in loader], loader.stats().from_cache
    ([[0.5, 1.5], [2.5, 3.5]], True)
"""

from tabloader.cache.files import CacheFiles, FileSpec, write_npy
from tabloader.cache.fill import CachedList, Fill
from tabloader.cache.key import FORMAT, cache_key, file_identities
from tabloader.cache.policy import CacheMode, DecodedCache, cache_directory
from tabloader.cache.serve import CacheBackend, take_transposed
from tabloader.cache.store import MANIFEST

__all__ = [
    "FORMAT",
    "MANIFEST",
    "CacheBackend",
    "CacheFiles",
    "CacheMode",
    "CachedList",
    "DecodedCache",
    "FileSpec",
    "Fill",
    "cache_directory",
    "cache_key",
    "file_identities",
    "take_transposed",
    "write_npy",
]
