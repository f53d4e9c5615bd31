"""A Dask DataFrame as a source (dask or dask-cudf): one partition per Dask partition.

Row counts are computed once, at construction; a partition's columns are computed when
it is read. dask-cudf partitions stay on the GPU for the GPU backend (the source's
format, `tabloader.sources.formats.ComputedPartitions`). A dask.distributed Client
cannot be used from a forked process: worker processes started with ``fork`` are
refused before they start, and a forked copy refuses to compute rather than wait
forever.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa

from tabloader.errors import (
    InvalidArgumentError,
    ReadError,
    SchemaMismatchError,
    TabloaderError,
)
from tabloader.sources.base import Piece, Source
from tabloader.sources.formats import ComputedPartitions
from tabloader.sources.partitions import widens

__all__ = ["DaskSource", "forked_dask_message", "is_dask_frame"]


def is_dask_frame(obj: object) -> bool:
    return type(obj).__module__.startswith("dask") and hasattr(obj, "npartitions")


def forked_dask_message(start_method: str = "fork") -> str:
    return (
        "a Dask DataFrame on a dask.distributed cluster cannot be read in worker processes "
        f"started with {start_method!r}: the forked copy of the Client has no connection to "
        "the scheduler and would wait forever. Use DataLoader(..., "
        "multiprocessing_context='spawn'), or num_workers=0 (tabloader reads in a background "
        "thread already, and the Dask workers do the computing)"
    )


def _distributed_client() -> Any:
    """The default dask.distributed Client, without importing distributed or doing I/O."""
    if "distributed" not in sys.modules:
        return None
    try:
        from distributed import default_client

        return default_client()  # type: ignore[no-untyped-call]
    except (ImportError, ValueError):
        return None


@contextmanager
def _quiet_dask() -> Iterator[None]:
    """Silence what a user of tabloader cannot act on: tabloader builds these graphs."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]ending large graph.*")
        warnings.filterwarnings("ignore", message=".*large graph.*")
        yield


_KEPT_DATASET = ("_dataset_info_cache", "_pq_length_stats")
"""Operands of dask's parquet reads that hold what was found reading the files (a pyarrow
dataset object, row counts): told by the read's checksum instead."""


def _arrow_types(frame: Any) -> dict[str, pa.DataType]:
    """The Arrow type of each column of a computed partition: a pandas frame's as pyarrow
    reads it, a cudf frame's from its dtypes (numbers; nothing copied to the host)."""
    if not hasattr(frame, "to_pandas"):  # pandas
        schema = pa.Schema.from_pandas(frame.head(0), preserve_index=False)
        return {f.name: f.type for f in schema}
    types = {}
    for name, dtype in frame.dtypes.items():
        try:
            types[str(name)] = pa.from_numpy_dtype(dtype)
        except (TypeError, NotImplementedError, pa.ArrowException):
            continue  # not a number: its own checks are the reader's
    return types


def _is_expression(value: Any) -> bool:
    return hasattr(value, "operands") and hasattr(value, "_parameters")


def _expression_token(expression: Any) -> str:
    """A token of a dask expression tree the same in every process (see
    `DaskSource.content_digest`): dask's own for a part that reads no parquet file; above
    a parquet read, each node's type and operands, the read's by its checksum of the
    files rather than the dataset object it keeps."""
    from itertools import zip_longest

    from dask.base import tokenize

    tokens: dict[int, str] = {}
    reading: dict[int, bool] = {}

    def reads(node: Any) -> bool:
        key = id(node)
        if key not in reading:
            here = any(name in node._parameters for name in _KEPT_DATASET)
            reading[key] = here or any(reads(o) for o in _expressions(node.operands))
        return reading[key]

    def token(node: Any) -> str:
        key = id(node)
        if key not in tokens:
            if not reads(node):
                tokens[key] = str(tokenize(node))
                return tokens[key]
            read = any(name in node._parameters for name in _KEPT_DATASET)
            parts: list[Any] = [type(node).__module__, type(node).__qualname__]
            if read:
                parts.append(node.checksum)
            for name, operand in zip_longest(node._parameters, node.operands):
                if read and name in _KEPT_DATASET:
                    continue
                parts.append(value(operand))
            tokens[key] = tokenize(*parts)
        return tokens[key]

    def value(operand: Any) -> Any:
        if _is_expression(operand):
            return token(operand)
        if isinstance(operand, list | tuple):
            return type(operand).__name__, [value(o) for o in operand]
        return operand

    return token(expression)


def _expressions(operands: Any) -> list[Any]:
    """The expressions among ``operands`` (in lists and tuples too)."""
    found = []
    for operand in operands:
        if _is_expression(operand):
            found.append(operand)
        elif isinstance(operand, list | tuple):
            found += _expressions(operand)
    return found


class DaskSource(Source):
    """The non-empty partitions of a Dask DataFrame."""

    kind = "dask"

    def __init__(self, frame: Any) -> None:
        # Deprecations raised inside dask's own code when tabloader computes partitions:
        # nothing a user of tabloader can change, so not shown.
        warnings.filterwarnings(
            "ignore", message=r"The inplace keyword in DataFrame\.reset_index", module=r"dask\."
        )
        self.frame = frame
        self._pid = os.getpid()  # a copy in another process without unpickling was forked
        with _quiet_dask():
            counts = frame.map_partitions(len).compute()
        rows = np.asarray(counts, dtype=np.int64)
        self.part_index = np.flatnonzero(rows > 0).astype(np.int32)
        self.rows = rows[self.part_index]
        meta = frame._meta
        if hasattr(meta, "to_pandas"):  # dask-cudf
            meta = meta.to_pandas()
        self.schemas = [pa.Schema.from_pandas(meta, preserve_index=False).remove_metadata()]
        # the frame's own labels (dask.dataframe.read_csv(header=None) names them 0, 1, ...)
        # by the names the schema gives them
        self._labels = {str(label): label for label in frame.columns}
        self.files = []

    def content_digest(self) -> str | None:
        """A deterministic token of the frame (the files it reads and their checksums, or
        the data it was made from), the same in every process; None when dask cannot
        give one.

        Dask's own token of a frame from ``read_parquet`` hashes the pyarrow dataset
        object it keeps, which differs from one process to the next: the frame's
        expression is tokenized here instead, a parquet read by its checksum of the
        files (their sizes and modification times) and its options."""
        import dask
        from dask.base import tokenize

        try:
            with dask.config.set({"tokenize.ensure-deterministic": True}):
                expression = getattr(self.frame, "expr", None)
                if expression is not None and _is_expression(expression):
                    return str(_expression_token(expression))
                return str(tokenize(self.frame))
        except Exception:  # dask raises its own error types for objects it cannot hash
            return None

    def _persisted(self) -> bool:
        """Whether the frame's graph holds dask.distributed futures (``persist()``)."""
        if "distributed" not in sys.modules:
            return False
        from distributed import Future

        graph = self.frame.__dask_graph__()
        return any(
            isinstance(task, Future) or isinstance(getattr(task, "value", None), Future)
            for task in graph.values()
        )

    def describe(self, index: int) -> str:
        return f"Dask partition {int(self.part_index[index])}"

    def schema_owner(self, schema_index: int) -> str:
        return "the Dask DataFrame"

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    def compute_partition(
        self, index: int, columns: list[str], scheduler: Mapping[str, Any] | None = None
    ) -> Any:
        if os.getpid() != self._pid and _distributed_client() is not None:
            # The client's connection lives in a thread of the parent process, which a
            # forked child does not have: compute() would wait forever.
            raise TabloaderError(forked_dask_message())
        labels = [self._labels.get(c, c) for c in columns]
        partition = self.frame[labels].get_partition(int(self.part_index[index]))
        with _quiet_dask():
            computed = partition.compute(**(scheduler or {}))
        if labels != list(columns):
            computed.columns = list(columns)
        self._check_computed(index, computed)
        return computed

    def _check_computed(self, index: int, computed: Any) -> None:
        """Refuse a computed partition that is not what the dataset was built from: other
        rows than counted then (a file the frame reads rewritten since, a random
        computation), or a column of a type that does not read as the frame's ``meta``
        says without loss (files of other types; a ``map_partitions`` whose ``meta``
        is wrong), which would be cast, truncated or wrapped."""
        rows, counted = len(computed), int(self.rows[index])
        if rows != counted:
            raise ReadError(
                f"{self.describe(index)} computed to {rows:,} rows, and to {counted:,} when "
                "the Dataset was built: the frame's data changed since (a file it reads was "
                "rewritten, or it draws random rows). Build the Dataset again, or persist() "
                "the frame first so that every epoch reads the same rows"
            )
        wanted = self.schemas[0]
        for name, computed_type in _arrow_types(computed).items():
            if wanted.get_field_index(name) < 0:
                continue
            meant = wanted.field(name).type
            if computed_type != meant and not widens(computed_type, meant):
                raise SchemaMismatchError(
                    f"{self.describe(index)} computes column {name!r} as {computed_type}, "
                    f"and the frame's meta says {meant}: it would be cast with loss "
                    "(fractions cut, large ids wrapped). Give the frame a meta its "
                    "partitions match, or cast the column in the frame "
                    f"(frame.astype({{{name!r}: ...}}))"
                )

    def read(self, index: int, columns: list[str]) -> pa.Table:
        frame = self.compute_partition(index, columns)
        table: pa.Table = (
            frame.to_arrow()  # cudf
            if hasattr(frame, "to_arrow")
            else pa.Table.from_pandas(frame, preserve_index=False)
        )
        return table

    @property
    def format(self) -> ComputedPartitions:
        return ComputedPartitions(self.computed_partitions)

    def computed_partitions(
        self,
        pieces: Sequence[Piece],
        columns: Sequence[str],
        scheduler: Mapping[str, Any] | None = None,
    ) -> list[Any]:
        """Each piece's rows of its partition, computed (pandas, or cudf for dask-cudf;
        ``scheduler``: dask's ``compute`` keywords for these computations only, not
        dask's configuration)."""
        frames = []
        for partition, first, last in pieces:
            try:
                computed = self.compute_partition(partition, list(columns), scheduler)
                frames.append(computed.iloc[first:last])
            except Exception as err:
                if isinstance(err, (MemoryError, ReadError, SchemaMismatchError)):
                    raise
                if "out of memory" in str(err).lower():
                    raise
                raise ReadError(
                    f"could not compute {self.describe(partition)}: {type(err).__name__}: {err}"
                ) from err
        return frames

    def check_worker_processes(self, start_method: Any) -> None:
        if self._persisted():
            raise InvalidArgumentError(
                "this Dask DataFrame was persisted: its partitions live in the dask.distributed "
                "cluster's memory, which worker processes cannot reach (they have no Client). "
                "Use num_workers=0 (tabloader reads in a background thread already, and the "
                "cluster holds the data), or do not persist the frame"
            )
        if _distributed_client() is None:
            return
        if start_method is not None and not isinstance(start_method, str):
            start_method = start_method.get_start_method()
        if start_method is None:
            start_method = (
                multiprocessing.get_start_method(allow_none=True)
                or multiprocessing.get_all_start_methods()[0]
            )
        if start_method == "fork":
            raise InvalidArgumentError(forked_dask_message(start_method))
