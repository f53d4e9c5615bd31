"""The framework-agnostic loader: a dataset in, an epoch of shuffled batches out."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import numpy as np
import pyarrow as pa

from tabloader.backends import get_backend
from tabloader.batches import (
    Layout,
    lists_as_output,
)
from tabloader.cache import CacheMode, DecodedCache, cache_directory
from tabloader.casting import (
    bounded,
    checked_layout,
    describe_range,
    fits,
    lossless,
    misfit_message,
    stored_dtype,
)
from tabloader.dataset import SMALL_ROW_GROUP_ROWS, Dataset, small_row_groups
from tabloader.device import Device, resolve_device
from tabloader.errors import (
    ColumnTypeError,
    EmptyDatasetError,
    EmptyEpochWarning,
    InvalidArgumentError,
    NullValuesError,
    PerformanceWarning,
    ValueRangeError,
)
from tabloader.memory import release_arrow_memory
from tabloader.options import (
    column_names,
    flag,
    int_at_least,
    is_number,
    keywords_of,
    numeric_dtype,
    one_spelling,
    optional_positive,
    reject_unknown,
)
from tabloader.plan import (
    EpochPlan,
    count_batches,
    plan_cached_epoch,
    plan_epoch,
    rank_rows,
    worker_row_range,
)
from tabloader.stages import Prefetcher, batch_stream, batches_ahead
from tabloader.state import Cursor, Fingerprint, dataset_fingerprint
from tabloader.stats import LoaderStats, StatsRecorder

if TYPE_CHECKING:
    from tabloader.backends import Backend

__all__ = ["LOADER_KEYWORDS", "BatchIterator", "Loader", "LoaderOptions"]

DEFAULT_CHUNK_BYTES = 128 * 2**20
"""Decoded bytes per chunk when neither ``parts_per_chunk`` nor ``chunk_rows`` is given."""


class LoaderOptions(TypedDict, total=False):
    """The [`Loader`][tabloader.Loader] keywords the framework adapters take and pass on.

    ``TorchAsyncItr`` and ``KerasSequenceLoader`` accept every one of these
    (``**options``), with the meaning [`Loader`][tabloader.Loader] documents; they
    document only the keywords of their own. Also a type for options kept in a config:

    ```python
    options: LoaderOptions = {"cats": ["user"], "shuffle": True, "seed": 0}
    ```
    """

    cats: str | Sequence[str] | None
    conts: str | Sequence[str] | None
    labels: str | Sequence[str] | None
    cat_names: str | Sequence[str] | None
    cont_names: str | Sequence[str] | None
    label_names: str | Sequence[str] | None
    cat_dtype: Any
    cont_dtype: Any
    label_dtype: Any
    fill_null: float | Mapping[str, float] | None
    shuffle: bool | Literal["global"]
    shuffle_within_batch: bool
    seed: int | None
    parts_per_chunk: int | None
    chunk_rows: int | None
    drop_last: bool
    prefetch: int
    global_rank: int | None
    global_size: int | None
    cache: CacheMode | None
    cache_dir: str | os.PathLike[str] | None
    cache_max_bytes: int | None
    sparse_names: str | Sequence[str] | None
    sparse_max: Mapping[str, int] | None
    sparse_as_dense: bool
    sparse_pad: float


LOADER_KEYWORDS = tuple(LoaderOptions.__annotations__)
"""The names of [`LoaderOptions`][tabloader.LoaderOptions], for checking an adapter's keywords."""


class Loader:
    """Shuffled batches of whole-column arrays from a parquet dataset, one epoch per ``iter()``.

    Every epoch delivers every row exactly once (per rank when sharded), in batches of
    ``batch_size`` rows; only the epoch's last batch may be shorter. A background thread
    reads and decodes the next chunk of row groups while the current one is shuffled and
    cut, so reading overlaps training.

    Args: What to read
        dataset: A [`Dataset`][tabloader.Dataset], or anything [`Dataset`][tabloader.Dataset]
            accepts (paths, globs, URLs, a table, a DataFrame).
        cats: Categorical columns (integer ids), delivered as ``cat_dtype`` (int64).
        conts: Continuous columns, delivered as ``cont_dtype`` (float32).
        labels: Target columns, delivered as ``label_dtype`` (float32).
        cat_names, cont_names, label_names: NVTabular's names for the same three
            options; give each option under one name. An unknown keyword raises
            ``TypeError`` naming the closest known one.
        fill_null: Value replacing nulls: one number for every column, or a mapping from
            column name to number. Without it, a null in a requested column raises
            [`NullValuesError`][tabloader.errors.NullValuesError] (at construction when the parquet
            footers tell).
        cat_dtype, cont_dtype, label_dtype: The delivered dtypes. Nothing is converted
            silently: a value that does not fit its column's dtype (uint64 ids at or
            above 2**63 as int64, 0.5 as an integer, 1e300 as float32) raises
            [`ValueRangeError`][tabloader.errors.ValueRangeError] naming the column, the value and
            the dtype, at construction when the footers' statistics tell, else when it is read.
            ``fill_null`` and ``sparse_pad`` must fit too.

    Args: How to batch
        batch_size: Rows per batch.
        drop_last: Drop the epoch's last batch if it is short. A rank with fewer rows
            than a batch then gets no batch at all: ``len(loader) == 0``, epochs are empty,
            and an [`EmptyEpochWarning`][tabloader.errors.EmptyEpochWarning] says so once (torch's
            convention).
        layout: ``"columns"`` (default) delivers ``{column: 1-D array}``; ``"stacked"``
            delivers ``{"cats": [B, n_cats], "conts": [B, n_conts], "labels": [B, n_labels]}``
            (groups with no columns are left out), ready for frameworks that take one
            tensor per kind.
        transform: Called on every batch in the background thread; its result is what the
            iterator yields. The place to build framework tensors.

    Args: List (multi-hot) columns
        sparse_names: Columns of lists (parquet ``list<...>``), NVTabular's name. A name
            may also be listed in ``cats`` or ``conts`` (which decides the values' dtype);
            otherwise it counts as a categorical column. A list column is delivered as
            ``(values, offsets)``: ``values`` the batch's list values one row after the
            other (``cat_dtype`` or ``cont_dtype``), ``offsets`` int64 of length ``B + 1``
            (row ``i`` is ``values[offsets[i]:offsets[i + 1]]``). Null lists are empty
            lists; nulls inside lists follow ``fill_null``. In the ``"stacked"`` layout
            each list column is delivered under its own name. Both backends read them,
            with the same batches for a seed.
        sparse_as_dense: Deliver list columns as ``[B, sparse_max[name]]`` arrays instead,
            each row's values then ``sparse_pad``. A list longer than its ``sparse_max``
            raises [`InvalidArgumentError`][tabloader.errors.InvalidArgumentError] (lists are never
            truncated).
        sparse_max: ``{name: most values per row}``; required for every list column with
            ``sparse_as_dense``.
        sparse_pad: The pad value of dense list columns (default 0).

    Args: How to shuffle
        shuffle: ``True``: visit partitions in a new random order every epoch and permute
            rows within each chunk. ``"global"``: permute all of the rank's rows every
            epoch (needs ``cache``). Default ``False``: stored order.
        shuffle_within_batch: With ``False``, a shuffled batch delivers its rows in
            stored order. Which rows share a batch is exactly as random; only the order
            inside the batch, which a loss summed over the batch does not see, is not.
            On the CPU the rows are then written sequentially rather than scattered
            (the measured speed-up is in ``benchmarks/results/cpu.md`` and
            docs/performance.md).
        seed: Seed of all randomness; the same seed and epoch give the same batches on
            every machine. None draws a fresh seed when the loader is created.
        parts_per_chunk: Partitions (row groups) read and shuffled together.
        chunk_rows: Alternatively, the most rows a chunk holds (whole row groups; a
            bigger row group is a chunk of its own). Without either, chunks hold at most
            128 MiB of decoded data. Bigger chunks mix rows from more row groups; memory
            holds at most about ``prefetch + 2`` chunks.
        prefetch: Chunks decoded ahead of the one being cut into batches.

    Args: Caching
        cache: ``None`` (default) decodes the files every epoch. ``"memory"`` or
            ``"disk"``: the first epoch also keeps the rank's decoded rows (cast, nulls
            filled) in RAM or in memory-mapped files, and later epochs read only those,
            several times faster than decoding, with the same batches (see docs/cache.md).
            The CPU backend only (``device="cpu"``).
        cache_dir: Directory of disk caches. Default ``$TABLOADER_CACHE_DIR``, else
            ``$XDG_CACHE_HOME/tabloader`` or ``~/.cache/tabloader``. Created ``0700``
            (its caches' files ``0600``) when the loader is; one that another user owns
            or others can write is not used (a [`CacheWarning`][tabloader.errors.CacheWarning], and
            every epoch streams). A published cache is verified against its checksums when opened
            (see docs/cache.md, "Safety").
        cache_max_bytes: Largest cache to write. A cache that would be bigger, or would
            not fit in the free disk space (or half the available memory), is not
            written: a [`CacheWarning`][tabloader.errors.CacheWarning] says so once and
            every epoch streams.

    Args: Distributed
        global_rank, global_size: This process's rank and the number of ranks (default,
            or None: 0 and 1). Every rank
            gets ``len(dataset) // global_size`` rows and the same number of batches; the
            ranks' rows are disjoint. Pass the same ``seed`` on every rank. With a
            ``cache``, each rank keeps the same rows every epoch (its share of the
            dataset in stored order) and shuffling permutes within that share.
        device: ``"cpu"``, or ``"cuda"``/``"cuda:N"``/an index for the GPU backend
            (``"cuda"`` is the current CUDA device). None (default): ``$TABLOADER_DEVICE``
            if set, else the GPU when cudf and cupy import and a GPU is visible, else
            the CPU (see docs/gpu.md).

    Examples:
        >>> import pyarrow as pa, tabloader
        >>> table = pa.table({"user": [1, 2, 3, 4, 5], "x": [.1, .2, .3, .4, .5],
        ...                   "y": [0, 1, 0, 1, 1]})
        >>> loader = tabloader.Loader(table, cats=["user"], conts=["x"], labels=["y"],
        ...                           batch_size=2, shuffle=True, seed=0)
        >>> len(loader)
        3
        >>> batches = list(loader)
        >>> [len(b["user"]) for b in batches], batches[0]["user"].dtype, batches[0]["x"].dtype
        ([2, 2, 1], dtype('int64'), dtype('float32'))
        >>> sorted(int(u) for b in batches for u in b["user"])
        [1, 2, 3, 4, 5]
    """

    def __init__(
        self,
        dataset: Dataset | Any,
        *,
        batch_size: int,
        cats: str | Sequence[str] | None = None,
        conts: str | Sequence[str] | None = None,
        labels: str | Sequence[str] | None = None,
        shuffle: bool | Literal["global"] = False,
        shuffle_within_batch: bool = True,
        seed: int | None = None,
        parts_per_chunk: int | None = None,
        chunk_rows: int | None = None,
        drop_last: bool = False,
        global_rank: int | None = 0,
        global_size: int | None = 1,
        cat_dtype: Any = "int64",
        cont_dtype: Any = "float32",
        label_dtype: Any = "float32",
        fill_null: float | Mapping[str, float] | None = None,
        layout: Literal["columns", "stacked"] = "columns",
        prefetch: int = 1,
        device: str | int | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        cache: CacheMode | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_max_bytes: int | None = None,
        sparse_names: str | Sequence[str] | None = None,
        sparse_max: Mapping[str, int] | None = None,
        sparse_as_dense: bool = False,
        sparse_pad: float = 0,
        cat_names: str | Sequence[str] | None = None,
        cont_names: str | Sequence[str] | None = None,
        label_names: str | Sequence[str] | None = None,
        **unknown: Any,
    ) -> None:
        if unknown:
            reject_unknown(unknown, keywords_of(Loader.__init__), "Loader")
        self.batch_size = int_at_least(batch_size, 1, "batch_size")
        # NVTabular's names (cat_names, ...) are accepted too, one spelling per option.
        cats = one_spelling({"cats": cats, "cat_names": cat_names})
        conts = one_spelling({"conts": conts, "cont_names": cont_names})
        labels = one_spelling({"labels": labels, "label_names": label_names})
        self.cats = column_names(cats, "cats")
        self.conts = column_names(conts, "conts")
        self.labels = column_names(labels, "labels")
        self.sparse_names, self.sparse_max = self._list_options(
            sparse_names, sparse_max, sparse_as_dense, sparse_pad
        )
        self.sparse_as_dense = bool(sparse_as_dense)
        self.sparse_pad = sparse_pad
        columns = self.cats + self.conts + self.labels
        if not columns:
            raise InvalidArgumentError(
                "no columns selected: pass at least one of cats=, conts=, labels="
            )
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        if repeated:
            raise InvalidArgumentError(
                f"column(s) {repeated} are listed more than once across cats/conts/labels"
            )
        if parts_per_chunk is not None and chunk_rows is not None:
            raise InvalidArgumentError("give parts_per_chunk or chunk_rows, not both")
        self.parts_per_chunk = optional_positive(parts_per_chunk, "parts_per_chunk")
        chunk_rows = optional_positive(chunk_rows, "chunk_rows")
        self.prefetch = int_at_least(prefetch, 1, "prefetch")
        # None (an adapter's "not given") is the default: rank 0 of 1.
        global_rank = 0 if global_rank is None else global_rank
        global_size = 1 if global_size is None else global_size
        self.global_size = int_at_least(global_size, 1, "global_size")
        self.global_rank = int_at_least(global_rank, 0, "global_rank")
        if self.global_rank >= self.global_size:
            raise InvalidArgumentError(
                f"global_rank must be in [0, {self.global_size}) for global_size="
                f"{self.global_size}, got {global_rank!r}"
            )
        if layout not in ("columns", "stacked"):
            raise InvalidArgumentError(f"layout must be 'columns' or 'stacked', got {layout!r}")
        self.layout = layout
        self.global_shuffle = isinstance(shuffle, str) and shuffle == "global"
        """``shuffle="global"``: permute all of the rank's rows every epoch."""
        if isinstance(shuffle, str) and not self.global_shuffle:
            raise InvalidArgumentError(f"shuffle must be True, False or 'global', got {shuffle!r}")
        self.shuffle = True if self.global_shuffle else flag(shuffle, "shuffle")
        if cache not in (None, "memory", "disk"):
            raise InvalidArgumentError(f"cache must be None, 'memory' or 'disk', got {cache!r}")
        if self.global_shuffle and cache is None:
            raise InvalidArgumentError(
                "shuffle='global' permutes all of the rank's rows every epoch, which needs "
                "random access to decoded rows: pass cache='memory' or cache='disk' too, or "
                "use shuffle=True (partitions and rows within chunks)"
            )
        cache_max_bytes = optional_positive(cache_max_bytes, "cache_max_bytes")
        self.shuffle_within_batch = flag(shuffle_within_batch, "shuffle_within_batch")
        self.drop_last = flag(drop_last, "drop_last")
        self._seed_given = seed is not None
        if seed is None:
            if self.shuffle and self.global_size > 1:
                raise InvalidArgumentError(
                    "with shuffle=True and global_size > 1, pass the same seed= on every rank: "
                    "ranks derive their shards from it and would overlap otherwise"
                )
            seed = int(np.random.SeedSequence().entropy)  # type: ignore[arg-type]
        self._next = Cursor(0, int_at_least(seed, 0, "seed"))
        """The epoch and seed the next ``iter()`` delivers; this loader's own cursor."""
        self._resume: Cursor | None = None  # where the next iter() starts, once loaded
        self._live: EpochProgress | None = None  # of the epoch iter() last started
        if transform is not None and not callable(transform):
            raise InvalidArgumentError(f"transform must be callable, got {transform!r}")
        self.transform = transform
        self.dtypes = {
            **dict.fromkeys(self.cats, numeric_dtype(cat_dtype, "cat_dtype", integer=True)),
            **dict.fromkeys(self.conts, numeric_dtype(cont_dtype, "cont_dtype", integer=False)),
            **dict.fromkeys(self.labels, numeric_dtype(label_dtype, "label_dtype", integer=False)),
        }
        self.device: Device = resolve_device(device)
        """Where batches live, decided once here; adapters read it and never decide again."""
        self.backend: Backend = get_backend(self.device)
        if cache is not None and self.device.is_cuda:
            raise InvalidArgumentError(
                f"cache={cache!r} keeps decoded rows in host memory for the CPU backend, and "
                f"device={self.device} reads with the GPU backend. Pass device='cpu' (the "
                "PyTorch adapter still copies batches to its CUDA device), or leave cache out"
            )

        self._check_pad()
        self.dataset = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
        types = self.dataset.column_types(columns)
        self._check_types(types)
        self.fill_null = self._fill_values(fill_null, types)
        self._check_nulls()
        self._range_checks = self._check_ranges(types)
        """Columns whose values are checked to fit their dtype when read (see
        `tabloader.casting`): the footers could not vouch for them."""
        self.layout_plan = self._layout(stacked=layout == "stacked")
        row_bytes = sum(d.itemsize for d in self.dtypes.values())
        if self.parts_per_chunk is None and chunk_rows is None:
            chunk_rows = max(self.batch_size, DEFAULT_CHUNK_BYTES // row_bytes)
        self.chunk_rows = chunk_rows
        self._stats = StatsRecorder()
        self._check_size()
        self.cache: DecodedCache | None = None
        """The decoded cache (``cache=`` given), which also fixes each rank's rows."""
        self._cache_stacked = self.shuffle or layout == "stacked"
        """Whether a cache stores a block per kind (shuffled rows are gathered: stored
        row-major per kind, a row is a few cache lines rather than one random access per
        column), or one per column."""
        if cache_dir is not None:
            cache_directory(cache_dir)  # a path, or a clear error whatever ``cache``
        if cache is not None:
            self._new_cache = partial(
                DecodedCache,
                cache,
                fill_null=self.fill_null,
                global_rank=self.global_rank,
                global_size=self.global_size,
                cache_dir=cache_dir,
                max_bytes=cache_max_bytes,
            )
            self.cache = self._cache_for(self.dataset)

    def _layout(self, *, stacked: bool) -> Layout:
        """How columns are grouped into blocks (``stacked``: one per kind), list columns
        each a ragged block of its own, each block told which columns to check."""
        scalar = {
            kind: tuple(c for c in names if c not in self.sparse_names)
            for kind, names in (("cats", self.cats), ("conts", self.conts), ("labels", self.labels))
        }
        built = Layout.build(
            scalar, self.dtypes, stacked=stacked, grouped=self.backend.groups_columns
        )
        if self.sparse_names:
            built = built.with_lists(self.sparse_names, self.dtypes)
        return checked_layout(built, self._range_checks)

    def _cache_for(self, dataset: Dataset) -> DecodedCache:
        return self._new_cache(
            dataset=dataset,
            blocks=self._layout(stacked=self._cache_stacked).blocks,
            layout=self.layout_plan,
        )

    # -- validation ---------------------------------------------------------------

    def _dtype_option(self, name: str) -> str:
        """The option that chose column ``name``'s delivered dtype."""
        return (
            "cat_dtype"
            if name in self.cats
            else "cont_dtype"
            if name in self.conts
            else "label_dtype"
        )

    def _check_pad(self) -> None:
        """``sparse_pad`` must fit every dense list column's dtype (it is delivered)."""
        if not self.sparse_as_dense:
            return
        for name in self.sparse_names:
            dtype = self.dtypes[name]
            if not fits(self.sparse_pad, dtype):
                raise InvalidArgumentError(
                    f"sparse_pad is {self.sparse_pad!r}, which does not fit "
                    f"{self._dtype_option(name)}={dtype} of the list column {name!r} "
                    f"({describe_range(dtype)}). Pass a sparse_pad that fits, such as 0"
                )

    def _check_ranges(self, types: Mapping[str, pa.DataType]) -> frozenset[str]:
        """The columns to check when read; raises
        [`ValueRangeError`][tabloader.errors.ValueRangeError] when a footer's statistics show a
        value that does not fit the column's delivered dtype.

        A column whose stored type fits its dtype needs no check; otherwise every row
        group's statistics must fit it, and the column is checked as it is read where
        they are missing or cannot tell (an infinite bound, a float delivered as an
        integer).
        """
        checks = set()
        for name, kind in types.items():
            target, source = self.dtypes[name], stored_dtype(kind)
            if lossless(source, target):
                continue
            ranges = self.dataset.value_ranges(name)
            for partition, extremes in enumerate(ranges):
                for value in extremes or ():
                    if not fits(value, target):
                        raise ValueRangeError(
                            misfit_message(
                                name,
                                value,
                                target,
                                where=self.dataset.describe_partition(partition),
                                option=self._dtype_option(name),
                            )
                        )
            if (source.kind == "f" and target.kind in "iu") or not all(map(bounded, ranges)):
                checks.add(name)
        return frozenset(checks)

    def _list_options(
        self,
        sparse_names: str | Sequence[str] | None,
        sparse_max: Mapping[str, int] | None,
        sparse_as_dense: object,
        sparse_pad: object,
    ) -> tuple[tuple[str, ...], dict[str, int]]:
        names = column_names(sparse_names, "sparse_names")
        flag(sparse_as_dense, "sparse_as_dense")
        if not is_number(sparse_pad):
            raise InvalidArgumentError(f"sparse_pad must be a number, got {sparse_pad!r}")
        labelled = [n for n in names if n in self.labels]
        if labelled:
            raise InvalidArgumentError(
                f"list column(s) {labelled} are listed in labels; labels must be scalar "
                "columns. Leave them out of sparse_names or labels"
            )
        # A list column named only in sparse_names is categorical (NVTabular's use).
        self.cats += tuple(n for n in names if n not in self.cats and n not in self.conts)
        if sparse_max is not None and not isinstance(sparse_max, Mapping):
            raise InvalidArgumentError(
                f"sparse_max must be a mapping {{column: max values per row}}, got {sparse_max!r}"
            )
        widths = dict(sparse_max or {})
        unknown = sorted(set(widths) - set(names))
        if unknown:
            raise InvalidArgumentError(
                f"sparse_max names {unknown}, which are not in sparse_names {list(names)}"
            )
        for name, width in widths.items():
            widths[name] = int_at_least(width, 1, f"sparse_max[{name!r}]")
        missing = [n for n in names if n not in widths]
        if sparse_as_dense and missing:
            raise InvalidArgumentError(
                f"sparse_as_dense=True pads every list column to sparse_max[name] values, but "
                f"sparse_max has no entry for {missing}. Pass sparse_max={{{missing[0]!r}: "
                "<longest list>, ...}"
            )
        return names, widths

    def _check_types(self, types: Mapping[str, pa.DataType]) -> None:
        where = self.dataset.files[0] if self.dataset.files else "the table"
        for name, t in types.items():
            is_list = pa.types.is_list(t) or pa.types.is_large_list(t)
            if name in self.sparse_names:
                value = getattr(t, "value_type", None)
                numeric = value is not None and (
                    pa.types.is_integer(value)
                    or pa.types.is_boolean(value)
                    or (pa.types.is_floating(value) and name in self.conts)
                )
                if not numeric:
                    kind = "integer ids" if name in self.cats else "numbers"
                    raise ColumnTypeError(
                        f"list column {name!r} is {t} in {where}; sparse_names must be lists of "
                        f"{kind} (list<int64>, for example)"
                        + ("" if is_list else ". Leave it out of sparse_names")
                    )
                continue
            if is_list:
                raise ColumnTypeError(
                    f"column {name!r} is {t} in {where}, a list column: name it in "
                    f"sparse_names=[{name!r}] to read it as values + offsets (or padded)"
                )
            if name in self.cats:
                if not (pa.types.is_integer(t) or pa.types.is_boolean(t)):
                    raise ColumnTypeError(
                        f"categorical column {name!r} is {t} in {where}; cats must hold integer "
                        "ids. Encode it as integers first (for example with pandas factorize or "
                        "NVTabular Categorify), or list it under conts"
                    )
            elif not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
                kind = "label" if name in self.labels else "continuous column"
                raise ColumnTypeError(
                    f"{kind} {name!r} is {t} in {where}; conts and labels must be numeric "
                    "(integer, floating point or boolean). Convert it, or leave it out"
                )

    def _fill_values(
        self, fill_null: float | Mapping[str, float] | None, types: Mapping[str, pa.DataType]
    ) -> dict[str, float]:
        if fill_null is None:
            return {}
        if isinstance(fill_null, Mapping):
            unknown = sorted(set(fill_null) - set(types))
            if unknown:
                raise InvalidArgumentError(
                    f"fill_null names {unknown}, which are not in cats/conts/labels"
                )
            values = dict(fill_null)
        else:
            values = dict.fromkeys(types, fill_null)
        for name, value in values.items():
            if not is_number(value):
                raise InvalidArgumentError(
                    f"fill_null for {name!r} must be a number, got {value!r}"
                )
            # Nulls are filled in the stored type, then delivered: the value must fit both.
            stored, delivered = stored_dtype(types[name]), self.dtypes[name]
            if not fits(value, stored):
                whole = "a whole number" if stored.kind in "iub" else "a number"
                raise InvalidArgumentError(
                    f"fill_null for {name!r} must be {whole} that fits {stored}, the "
                    f"type the column is stored as ({describe_range(stored)}), got {value!r}"
                )
            if not fits(value, delivered):
                option = self._dtype_option(name)
                raise InvalidArgumentError(
                    f"fill_null for {name!r} is {value!r}, which does not fit {option}="
                    f"{delivered} ({describe_range(delivered)}). Pass a fill value that fits, "
                    f"or another {option}"
                )
        return values

    def _check_nulls(self) -> None:
        for name in self.dtypes:
            if name in self.fill_null or name in self.sparse_names:
                continue  # null lists are empty lists; nulls inside raise when read
            flags = self.dataset.null_partitions(name)
            bad = np.flatnonzero(flags == 1)
            if len(bad):
                more = f" and {len(bad) - 1} more partition(s)" if len(bad) > 1 else ""
                raise NullValuesError(
                    f"column {name!r} has null values in "
                    f"{self.dataset.describe_partition(int(bad[0]))}{more}. Fill them in the "
                    f"data, or pass fill_null={{{name!r}: 0}} (any number) to the loader"
                )

    def _check_size(self) -> None:
        if self.dataset.num_rows == 0:
            raise EmptyDatasetError("the dataset has no rows")
        if len(self) == 0:
            lo, hi = rank_rows(
                self.dataset.num_rows, global_rank=self.global_rank, global_size=self.global_size
            )
            # torch's convention (DataLoader with drop_last=True over too few samples):
            # the loader is empty, not an error.
            why, remedy = (
                (
                    f", fewer than batch_size={self.batch_size} with drop_last=True",
                    "Lower batch_size or set drop_last=False",
                )
                if self.drop_last
                else ("", "Use fewer ranks")
            )
            warnings.warn(
                f"this loader yields no batch: rank {self.global_rank} of "
                f"{self.global_size} gets {hi - lo} of {self.dataset.num_rows} rows{why}, "
                f"so len(loader) == 0 and every epoch is empty. {remedy}",
                EmptyEpochWarning,
                stacklevel=3,
            )
        parts = self.dataset.num_partitions
        if self.global_size > parts:
            warnings.warn(
                f"{self.global_size} ranks share {parts} partitions: every rank decodes whole "
                "row groups to use a fraction of them. Write more, smaller row groups",
                PerformanceWarning,
                stacklevel=3,
            )
        median = small_row_groups(self.dataset.partition_rows)
        if median is not None:
            warnings.warn(
                f"row groups hold {median:,.0f} rows (median); reading is slow below "
                f"{SMALL_ROW_GROUP_ROWS:,} rows per row group. Rewrite the files with a "
                "row_group_size of 64k to 1M rows",
                PerformanceWarning,
                stacklevel=3,
            )

    # -- planning -----------------------------------------------------------------

    @property
    def columns(self) -> tuple[str, ...]:
        """All delivered columns: cats, then conts, then labels."""
        return self.cats + self.conts + self.labels

    def num_batches(self, *, worker: int = 0, num_workers: int = 1) -> int:
        """Batches one epoch delivers to this rank (or to one of its worker processes)."""
        lo, hi = rank_rows(
            self.dataset.num_rows, global_rank=self.global_rank, global_size=self.global_size
        )
        first, last = worker_row_range(
            hi - lo,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            worker=worker,
            num_workers=num_workers,
        )
        return count_batches(last - first, self.batch_size, drop_last=self.drop_last)

    def __len__(self) -> int:
        return self.num_batches()

    def plan(
        self, epoch: int, *, worker: int = 0, num_workers: int = 1, seed: int | None = None
    ) -> EpochPlan:
        """The epoch plan this loader follows (see [`tabloader.plan`][tabloader.plan]);
        ``seed`` defaults to the loader's."""
        if not 0 <= worker < num_workers:
            raise InvalidArgumentError(f"worker must be in [0, {num_workers}), got {worker}")
        plan_for: Callable[..., EpochPlan] = plan_epoch
        shuffle: bool | Literal["global"] = self.shuffle
        if self.cache is not None:
            # Without a usable cache, "global" streams with shuffle=True's chunks.
            global_shuffle = self.global_shuffle and self.cache.usable
            plan_for, shuffle = plan_cached_epoch, "global" if global_shuffle else self.shuffle
        return plan_for(
            self.dataset.partition_rows,
            shuffle=shuffle,
            seed=self.seed if seed is None else seed,
            epoch=epoch,
            worker=worker,
            num_workers=num_workers,
            **self._plan_options(),
        )

    # -- iteration ----------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` delivers."""
        return self._next.epoch

    @property
    def seed(self) -> int:
        """The seed of all randomness (drawn at construction when not given, or taken from
        a loaded state)."""
        return self._next.seed

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` deliver epoch ``epoch`` (like ``DistributedSampler``)."""
        self._next = Cursor(int_at_least(epoch, 0, "epoch"), self.seed)

    def __iter__(self) -> BatchIterator:
        """Start the next epoch: each ``iter()`` advances ``loader.epoch`` by one.

        After [`load_state_dict`][tabloader.Loader.load_state_dict], the first ``iter()`` continues
        the saved epoch.
        """
        start = self._next if self._resume is None else self._resume
        self._resume = None
        iterator = self.iter_epoch(start)
        self._live = iterator.progress
        self._next = Cursor(start.epoch, start.seed).next_epoch()
        return iterator

    def iter_epoch(
        self,
        epoch: int | Cursor,
        *,
        worker: int = 0,
        num_workers: int = 1,
        start_batch: int = 0,
    ) -> BatchIterator:
        """Iterate over one epoch, or one worker process's share of it, without advancing.

        ``epoch`` is the epoch's number (shuffled with the loader's seed), or a
        `tabloader.state.Cursor` saying the epoch, seed, worker share and batches
        already delivered (the keywords then stay at their defaults). ``start_batch``
        skips that many leading batches of the share: the chunks they fill are not
        read, and the batches that follow are those an iteration from the start would
        deliver.
        """
        cursor = (
            epoch
            if isinstance(epoch, Cursor)
            else Cursor(epoch, self.seed, start_batch, worker, num_workers)
        )
        epoch, (worker, num_workers), start_batch = cursor.epoch, cursor.share, cursor.batches
        self.refresh(epoch)
        backend = self.backend
        if self.cache is not None:  # from the cache, into the cache, or (too big) streamed
            backend = self.cache.epoch_backend(self.backend, self._stats)
        plan = self.plan(epoch, worker=worker, num_workers=num_workers, seed=cursor.seed)
        if not 0 <= start_batch <= plan.num_batches:
            raise InvalidArgumentError(
                f"start_batch must be in [0, {plan.num_batches}] (the batches of epoch "
                f"{epoch} for worker {worker} of {num_workers}), got {start_batch!r}"
            )
        plan = plan.resume(start_batch)
        make_batches = partial(
            batch_stream,
            dataset=self.dataset,
            backend=backend,
            plan=plan,
            layout=self.layout_plan,
            fill_null=self.fill_null,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            transform=self._list_output(self.transform),
            prefetch=self.prefetch,
            stats=self._stats,
        )
        return BatchIterator(batches_ahead(make_batches), plan.num_batches, self._stats, cursor)

    def _list_output(
        self, transform: Callable[[dict[str, Any]], Any] | None
    ) -> Callable[[dict[str, Any]], Any] | None:
        """``transform`` after list columns take their delivered form."""
        if not self.sparse_names:
            return transform
        finish = partial(
            lists_as_output,
            dense=self.sparse_max if self.sparse_as_dense else None,
            pad=self.sparse_pad,
        )
        if transform is None:
            return finish
        return lambda batch: transform(finish(batch))

    # -- resuming -----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands, to continue exactly there after a restart.

        A small JSON-serialisable dict: the epoch, the seed, the batches already handed
        out in that epoch, and a fingerprint of the dataset and of the options that
        decide the order of rows. Mid-epoch (an iterator that has not ended) it points
        at the next batch of that epoch; otherwise at the start of the next epoch.
        Batches read ahead in the background but not yet handed out do not count.

        Examples:
            >>> import pyarrow as pa, tabloader
            >>> table = pa.table({"x": list(range(10))})
            >>> loader = tabloader.Loader(table, cats=["x"], batch_size=3, shuffle=True, seed=1)
            >>> epoch = iter(loader)
            >>> first = next(epoch)
            >>> state = loader.state_dict()
            >>> state["epoch"], state["batches"]
            (0, 1)
            >>> again = tabloader.Loader(table, cats=["x"], batch_size=3, shuffle=True, seed=1)
            >>> again.load_state_dict(state)
            >>> [b["x"].tolist() for b in again] == [b["x"].tolist() for b in epoch]
            True
        """
        position = self._resume
        if position is None and self._live is not None and not self._live.finished:
            position = self._live.cursor
        return (position or self._next).to_state(self.fingerprint())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from [`state_dict`][tabloader.Loader.state_dict]): the next
        ``iter()`` delivers the rest of the saved epoch, bit-identical to the run that saved it, and
        later epochs follow as they would have.

        The dataset, columns and order-deciding options must be those of the saved run;
        otherwise [`InvalidArgumentError`][tabloader.errors.InvalidArgumentError] names what
        differs. A loader created without ``seed`` takes the saved one.
        """
        cursor = self.resume_cursor(state, adopt_seed=not self._seed_given)
        self._resume = cursor
        self._next = Cursor(cursor.epoch, cursor.seed)

    def epoch_state(
        self,
        epoch: int,
        batches: int,
        *,
        seed: int | None = None,
        worker: int = 0,
        num_workers: int = 1,
    ) -> dict[str, Any]:
        """The state of ``batches`` batches delivered in ``epoch`` (see
        [`state_dict`][tabloader.Loader.state_dict])."""
        seed = self.seed if seed is None else seed
        return Cursor(epoch, seed, batches, worker, num_workers).to_state(self.fingerprint())

    def check_state(
        self,
        state: Mapping[str, Any],
        *,
        adopt_seed: bool | None = None,
        worker: int = 0,
        num_workers: int = 1,
    ) -> tuple[int, int, int]:
        """``(epoch, batches, seed)`` of a saved state, checked against this loader (see
        `resume_cursor`)."""
        cursor = self.resume_cursor(state, adopt_seed=adopt_seed, share=(worker, num_workers))
        return cursor.epoch, cursor.batches, cursor.seed

    def resume_cursor(
        self,
        state: Mapping[str, Any],
        *,
        seed: int | None = None,
        adopt_seed: bool | None = None,
        share: tuple[int, int] = (0, 1),
    ) -> Cursor:
        """The position a saved state holds, checked against this loader: its data and
        order-deciding options, ``seed`` (default: the loader's) and the worker share.

        Raises [`InvalidArgumentError`][tabloader.errors.InvalidArgumentError] naming the saved and
        the current value of whatever differs. With ``adopt_seed`` a different seed is taken, not
        refused (default: when this loader was created without ``seed``).
        """
        return Cursor.from_state(
            state,
            self.fingerprint(),
            seed=self.seed if seed is None else seed,
            adopt_seed=not self._seed_given if adopt_seed is None else adopt_seed,
            share=share,
            batches_in_epoch=self.num_batches(worker=share[0], num_workers=share[1]),
        )

    def fingerprint(self) -> Fingerprint:
        """What a saved state must match to resume here: the dataset and the options that
        decide the order of rows."""
        return Fingerprint(dataset_fingerprint(self.dataset), self._order_options())

    def _plan_options(self) -> dict[str, Any]:
        """The options that shape every epoch's plan, as the planners take them."""
        return {
            "batch_size": self.batch_size,
            "shuffle_within_batch": self.shuffle_within_batch,
            "drop_last": self.drop_last,
            "global_rank": self.global_rank,
            "global_size": self.global_size,
            "parts_per_chunk": self.parts_per_chunk,
            "chunk_rows": self.chunk_rows,
        }

    def _order_options(self) -> dict[str, Any]:
        """What decides the batches of a saved state, besides the seed and the dataset."""
        return {
            "cats": list(self.cats),
            "conts": list(self.conts),
            "labels": list(self.labels),
            "shuffle": "global" if self.global_shuffle else self.shuffle,
            # With a cache every rank keeps a fixed share: another order than streaming.
            "cache": self.cache is not None,
            **self._plan_options(),
        }

    def stats(self) -> LoaderStats:
        """Counters and timings since the loader was created (see
        [`LoaderStats`][tabloader.LoaderStats])."""
        return dataclasses.replace(self._stats.snapshot(), rows_skipped=self.dataset.rows_skipped)

    def refresh(self, epoch: int) -> None:
        """List a ``refresh=True`` dataset again for ``epoch`` (once per epoch number) and
        check the files that joined; ``len()`` and [`plan`][tabloader.Loader.plan] then describe
        that epoch.

        ``iter()`` calls it; call it before to know the next epoch's ``len()`` (on every
        rank: under torch.distributed, rank 0's listing is broadcast).
        """
        if self.dataset.refresh(epoch=epoch):
            types = self.dataset.column_types(self.columns)
            self._check_types(types)
            self._check_nulls()
            self._range_checks = self._check_ranges(types)
            self.layout_plan = checked_layout(self.layout_plan, self._range_checks)
            self._check_size()
            if self.cache is not None:
                # Other files, or other contents: a cache keyed by them, filled by this
                # epoch's reads (the files are decoded again); the old one's directory goes.
                self.cache.discard()
                self.cache = self._cache_for(self.dataset)

    def __repr__(self) -> str:
        return (
            f"Loader({self.dataset!r}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"columns={len(self.columns)}, rank={self.global_rank}/{self.global_size}, "
            f"device={self.device})"
        )


class EpochProgress:
    """How far one epoch's iterator got: the batches it handed out after its start, and
    whether it ended. Its `BatchIterator` is its only writer."""

    def __init__(self, start: Cursor) -> None:
        self.start = start
        self.served = 0
        self.finished = False

    @property
    def cursor(self) -> Cursor:
        return self.start.at(self.start.batches + self.served)


class BatchIterator:
    """One epoch in progress. Close it (or drop it) to stop its background threads.

    ``len()`` is the number of batches still to come.
    """

    def __init__(
        self,
        stage: Prefetcher[tuple[int, Any]],
        num_batches: int,
        stats: StatsRecorder,
        start: Cursor,
    ):
        self._stage = stage
        self._remaining = num_batches
        self._stats = stats
        self._started: float | None = None
        self.progress = EpochProgress(start)
        """How far this epoch got; written by this iterator only, and kept by its loader
        to say where the epoch stands after the iterator is gone."""

    @property
    def cursor(self) -> Cursor:
        """Where this epoch stands: its epoch, seed and worker share, and the batches of it
        handed out so far (counting any skipped on resume)."""
        return self.progress.cursor

    @property
    def position(self) -> Cursor:
        """The same as `cursor`."""
        return self.progress.cursor

    @property
    def finished(self) -> bool:
        """Whether the epoch ended (its last batch was handed out and asked past)."""
        return self.progress.finished

    def __iter__(self) -> BatchIterator:
        return self

    def __len__(self) -> int:
        return self._remaining

    def __next__(self) -> Any:
        now = time.perf_counter()
        if self._started is None:
            self._started = now
        try:
            rows, batch = next(self._stage)
        except StopIteration:
            self.progress.finished = True
            self._finish()
            release_arrow_memory()  # the epoch's threads have ended
            raise
        except BaseException:
            self._finish()
            raise
        self._stats.wait_seconds += time.perf_counter() - now
        self._stats.rows += rows
        self._stats.batches += 1
        self._remaining -= 1
        self.progress.served += 1
        return batch

    def _finish(self) -> None:
        if self._started is not None:
            self._stats.consume_seconds += time.perf_counter() - self._started
            self._started = None

    def close(self) -> None:
        """Stop the background threads; the iterator yields nothing more."""
        self._finish()
        self._stage.close()
        self._remaining = 0
        release_arrow_memory()

    def __enter__(self) -> BatchIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self._finish()

    @property
    def threads(self) -> list[threading.Thread]:
        """The background thread serving this iterator (for tests and debugging)."""
        return [self._stage.thread]
