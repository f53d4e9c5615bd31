"""Emulated dask_cudf: Dask DataFrames whose partitions are cudf DataFrames.

The real package is dask's ``"cudf"`` DataFrame backend: it registers, for cudf's types,
the dispatch functions dask-expr calls on a collection's metadata (``dask_cudf/
backends.py``: ``get_parallel_type``, ``make_meta_dispatch`` returns ``x.head(0)``,
``meta_nonempty`` builds two rows, ``concat_dispatch`` is ``cudf.concat``;
``dask_cudf/_expr/collection.py``:
``get_collection_type`` gives ``dask_cudf.DataFrame``/``Series``, subclasses of dask's),
and dask imports it lazily the first time it dispatches on a cudf object
(``dask/dataframe/backends.py``, ``register_lazy("cudf")``). This stand-in does the
same for the emulated cudf, with the real dask, so a frame here goes through dask-expr's
own graphs, optimiser and threaded scheduler.

Rules that decide correctness, as in the real library:

- A partition is a cudf DataFrame made by the task that computes it, in whichever thread
  dask runs it: its memory is on that thread's current CUDA device (cudf allocates
  through rmm on the current device). Dask's worker threads start on device 0.
- ``read_parquet`` reads a partition's files in a task of its own (one file per
  partition with ``blocksize=None``; small files aggregated by default), and
  ``from_cudf`` cuts a cudf DataFrame into ``npartitions`` contiguous slices
  (``dask_cudf.from_cudf`` is ``dd.from_pandas`` of a cudf frame).
- ``frame._meta`` is an empty cudf DataFrame; ``to_backend("pandas")`` is not emulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cudf
import dask.dataframe as dd
import numpy as np
import pyarrow.parquet as pq
from dask._dispatch import get_collection_type
from dask.dataframe.dispatch import (
    concat_dispatch,
    get_parallel_type,
    make_meta_dispatch,
    make_meta_obj,
    meta_nonempty,
    tolist_dispatch,
)
from dask.dataframe.utils import _nonempty_scalar, _scalar_from_dtype

__emulated__ = True
__version__ = "26.10.2-emulated"

__all__ = ["DataFrame", "Series", "from_cudf", "read_parquet"]


class DataFrame(dd.DataFrame):
    """dask_cudf.DataFrame: a dask-expr DataFrame collection of cudf partitions."""


class Series(dd.Series):
    """dask_cudf.Series."""


get_collection_type.register(cudf.DataFrame, lambda _: DataFrame)
get_collection_type.register(cudf.Series, lambda _: Series)
get_parallel_type.register(cudf.DataFrame, lambda _: DataFrame)  # (dask_cudf/backends.py)
get_parallel_type.register(cudf.Series, lambda _: Series)


@make_meta_dispatch.register((cudf.DataFrame, cudf.Series))
def _make_meta(x: Any, index: Any = None) -> Any:
    return x.head(0)


@make_meta_obj.register((cudf.DataFrame, cudf.Series))
def _make_meta_object(x: Any, index: Any = None) -> Any:
    # dask_cudf/backends.py make_meta_object_cudf: a collection's _meta, else a scalar of
    # the dtype (what map_partitions(len) and other reductions to scalars produce)
    if hasattr(x, "_meta"):
        return x._meta
    if not hasattr(x, "dtype") and x is not None:
        try:
            return _scalar_from_dtype(np.dtype(x))
        except Exception:
            pass
    if np.isscalar(x):
        return _nonempty_scalar(x)
    raise TypeError(f"Don't know how to create metadata from {x}")


@meta_nonempty.register(cudf.DataFrame)
def _nonempty_frame(x: Any) -> Any:
    return cudf.from_pandas(meta_nonempty(x.to_pandas()))


@concat_dispatch.register((cudf.DataFrame, cudf.Series))
def _concat(dfs: Sequence[Any], axis: int = 0, join: str = "outer", **kwargs: Any) -> Any:
    return cudf.concat(list(dfs), axis=axis, ignore_index=kwargs.get("ignore_index", False))


@tolist_dispatch.register(cudf.Series)
def _tolist(obj: Any) -> list[Any]:
    return list(obj.to_pandas().tolist())


def from_cudf(
    data: Any,
    npartitions: int | None = None,
    chunksize: int | None = None,
    sort: bool = True,
    name: Any = None,
) -> DataFrame:
    """``npartitions`` contiguous row slices of ``data`` (or slices of ``chunksize`` rows)."""
    if (npartitions is None) == (chunksize is None):
        raise ValueError("Exactly one of npartitions and chunksize must be specified.")
    rows = len(data)
    if chunksize is None:
        chunksize = -(-rows // int(npartitions or 1))
    bounds = [(start, min(start + chunksize, rows)) for start in range(0, rows, chunksize)]
    result: DataFrame = dd.from_map(
        lambda span: data.iloc[span[0] : span[1]],
        bounds,
        meta=data.head(0),
        enforce_metadata=False,
    )
    return result


def read_parquet(
    path: str | Sequence[str],
    columns: Sequence[str] | None = None,
    blocksize: int | str | None = "default",
    **kwargs: Any,
) -> DataFrame:
    """Parquet files as a collection of partitions each read by cudf in the task that
    computes it. ``blocksize=None``: one partition per file; otherwise consecutive files
    share a partition up to ``blocksize`` bytes of uncompressed data (``"default"``: 1/32
    of device 0's memory), as ``dask_cudf.read_parquet`` aggregates small files
    (``dask_cudf/io/parquet.py``, ``read_parquet_expr``). Unlike dask-cudf, a file larger
    than ``blocksize`` is not split."""
    paths = [path] if isinstance(path, str) else [str(p) for p in path]
    if blocksize == "default":
        import cupy

        blocksize = int(cupy.cuda.runtime.getDeviceProperties(0)["totalGlobalMem"]) // 32
    groups: list[list[str]] = []
    size = 0
    for file in paths:
        nbytes = sum(
            pq.ParquetFile(file).metadata.row_group(g).total_byte_size
            for g in range(pq.ParquetFile(file).num_row_groups)
        )
        if blocksize is None or not groups or size + nbytes > int(blocksize):
            groups.append([])
            size = 0
        groups[-1].append(file)
        size += nbytes
    names = list(columns) if columns is not None else None

    def read(files: list[str]) -> Any:
        return cudf.read_parquet(files, columns=names)

    meta = cudf.DataFrame.from_arrow(pq.read_schema(paths[0]).empty_table())
    if names is not None:
        meta = meta[names]
    result: DataFrame = dd.from_map(read, groups, meta=meta, enforce_metadata=False)
    return result
