"""The loader's options, declared once: an immutable config, checked where it is built.

`LoaderConfig` holds every option of a [`Loader`][tabloader.Loader] (batch size,
columns and dtypes, shuffling, chunks, ranks, cache, list columns), each declared
once, as a field with its default. `LoaderConfig.build` checks the values and
normalises them (one spelling of the column options, a dict of fill values, the
delivered dtypes, the chunk size), so a config that exists is valid; which fields shape
an epoch's plan and decide the order of rows is said by the fields themselves
(`LoaderConfig.plan_options`, `LoaderConfig.order_options`). What can be checked
only against the data (the columns' types, nulls, values that do not fit their dtype,
a loader that would yield nothing) is checked by one function,
`tabloader.checks.check_dataset`.

The keywords the framework adapters pass on to the loader, `LOADER_KEYWORDS`, are the
config's fields marked as options, with NVTabular's names for the column options;
[`LoaderOptions`][tabloader.LoaderOptions] types them for type checkers and is tested
against them.

Examples:
    >>> config = LoaderConfig.build(batch_size=4, cat_names=["user"], fill_null=0)
    >>> config.cats, config.fill_null, config.dtypes["user"]
    (('user',), {'user': 0}, dtype('int64'))
    >>> config.plan_options()["chunk_rows"]  # 128 MiB of int64 rows
    16777216
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypedDict

import numpy as np

from tabloader.batches import Layout, lists_as_output
from tabloader.cache import CacheMode, cache_directory
from tabloader.cache.device import CachePlacement
from tabloader.casting import (
    checked_layout,
    delivered_fill,
    describe_range,
    fits,
)
from tabloader.device import Device
from tabloader.errors import (
    CacheWarning,
    InvalidArgumentError,
)
from tabloader.options import (
    column_names,
    flag,
    int_at_least,
    is_number,
    numeric_dtype,
    one_spelling,
    optional_positive,
)
from tabloader.plan import DEFAULT_CHUNK_BYTES, count_batches, rank_rows, worker_row_range

__all__ = [
    "ALIASES",
    "LOADER_KEYWORDS",
    "ConfigAttributes",
    "LoaderConfig",
    "LoaderOptions",
    "list_widths_given",
]

ALIASES = {"cat_names": "cats", "cont_names": "conts", "label_names": "labels"}
"""NVTabular's names of the column options; every entry point takes both spellings."""


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
    threads: int | None
    global_rank: int | None
    global_size: int | None
    cache: CacheMode | None
    cache_dir: str | os.PathLike[str] | None
    cache_max_bytes: int | None
    cache_placement: CachePlacement
    sparse_names: str | Sequence[str] | None
    sparse_max: Mapping[str, int] | None
    sparse_as_dense: bool
    sparse_pad: float


_OPTION = {"option": True}
"""A field that is a loader option: the framework adapters pass it on."""
_PLAN = {"option": True, "plan": True}
"""An option that shapes every epoch's plan (so it decides the order of rows too)."""


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """A loader's options, checked and normalised (build one with `build`).

    The fields are the [`Loader`][tabloader.Loader] keywords of the same names (see its
    documentation), as `build` leaves them: column options as tuples under one
    spelling, ``shuffle`` True, False or ``"global"``, the seed
    drawn when not given (``seed_given`` says which), ``fill_null`` a dict over the
    columns, ``chunk_rows`` the chunk size used (about 128 MiB of decoded rows when
    neither it nor ``parts_per_chunk`` is given), and ``dtypes`` each column's
    delivered dtype.
    """

    cats: tuple[str, ...] = field(default=(), metadata=_OPTION)
    conts: tuple[str, ...] = field(default=(), metadata=_OPTION)
    labels: tuple[str, ...] = field(default=(), metadata=_OPTION)
    shuffle: bool | Literal["global"] = field(default=False, metadata=_OPTION)
    """``"global"``: permute all of the rank's rows every epoch (from a cache); True:
    partitions and rows within chunks."""
    cache_mode: CacheMode | None = field(default=None, metadata={**_OPTION, "keyword": "cache"})
    """The ``cache`` option (a loader's ``cache`` is its `DecodedCache`)."""
    batch_size: int = field(default=1, metadata={"plan": True})
    shuffle_within_batch: bool = field(default=True, metadata=_PLAN)
    drop_last: bool = field(default=False, metadata=_PLAN)
    global_rank: int = field(default=0, metadata=_PLAN)
    global_size: int = field(default=1, metadata=_PLAN)
    parts_per_chunk: int | None = field(default=None, metadata=_PLAN)
    chunk_rows: int | None = field(default=None, metadata=_PLAN)
    cat_dtype: np.dtype[Any] = field(default=np.dtype("int64"), metadata=_OPTION)
    cont_dtype: np.dtype[Any] = field(default=np.dtype("float32"), metadata=_OPTION)
    label_dtype: np.dtype[Any] = field(default=np.dtype("float32"), metadata=_OPTION)
    fill_null: Mapping[str, float] = field(default_factory=dict, metadata=_OPTION)
    seed: int = field(default=0, metadata=_OPTION)
    prefetch: int = field(default=1, metadata=_OPTION)
    threads: int | None = field(default=None, metadata=_OPTION)
    cache_dir: str | os.PathLike[str] | None = field(default=None, metadata=_OPTION)
    cache_max_bytes: int | None = field(default=None, metadata=_OPTION)
    cache_placement: CachePlacement = field(default="auto", metadata=_OPTION)
    sparse_names: tuple[str, ...] = field(default=(), metadata=_OPTION)
    sparse_max: Mapping[str, int] = field(default_factory=dict, metadata=_OPTION)
    sparse_as_dense: bool = field(default=False, metadata=_OPTION)
    sparse_pad: float = field(default=0, metadata=_OPTION)
    layout: Literal["columns", "stacked"] = "columns"
    seed_given: bool = False
    """Whether the seed was given (a loaded state's seed is adopted only when not)."""
    dtypes: Mapping[str, np.dtype[Any]] = dataclasses.field(default_factory=dict)
    """Each column's delivered dtype."""
    widths: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Each vector column (a fixed-size list, not in ``sparse_names``) and its values a
    row, from the data (`with_widths`); empty until the data was checked."""
    chunk_given: bool = False
    """Whether ``parts_per_chunk`` or ``chunk_rows`` was given (else ``chunk_rows`` holds
    about ``DEFAULT_CHUNK_BYTES`` of decoded rows)."""

    @property
    def columns(self) -> tuple[str, ...]:
        """All delivered columns: cats, then conts, then labels."""
        return self.cats + self.conts + self.labels

    @property
    def fills(self) -> dict[str, float]:
        """The values nulls are filled with: each ``fill_null`` value as its column's
        delivered dtype gives it (a float rounded once, whatever type a file stores the
        column in: see `tabloader.casting.delivered_fill`)."""
        return {c: delivered_fill(v, self.dtypes[c]) for c, v in self.fill_null.items()}

    def dtype_option(self, name: str) -> str:
        """The option that chose column ``name``'s delivered dtype."""
        if name in self.cats:
            return "cat_dtype"
        return "cont_dtype" if name in self.conts else "label_dtype"

    def block_layout(
        self,
        *,
        stacked: bool,
        grouped: bool,
        checks: frozenset[str],
        vectors_apart: bool = False,
    ) -> Layout:
        """How columns are grouped into blocks (``stacked``: one per kind; ``grouped``:
        columns of one dtype share one, for a backend that wants that; vector columns
        their ``k`` places of it, or blocks of their own when delivered alone or
        ``vectors_apart``), list columns each a ragged block of its own, each block told
        which of ``checks`` to check."""
        scalar = {
            kind: tuple(c for c in names if c not in self.sparse_names)
            for kind, names in (("cats", self.cats), ("conts", self.conts), ("labels", self.labels))
        }
        built = Layout.build(
            scalar,
            self.dtypes,
            stacked=stacked,
            grouped=grouped,
            widths=self.widths,
            vectors_apart=vectors_apart,
        )
        if self.sparse_names:
            built = built.with_lists(self.sparse_names, self.dtypes)
        return checked_layout(built, checks)

    def delivered(
        self, transform: Callable[[dict[str, Any]], Any] | None
    ) -> Callable[[dict[str, Any]], Any] | None:
        """``transform``, after list columns take their delivered form."""
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

    def with_widths(
        self, widths: Mapping[str, int], list_values: Mapping[str, float] | None = None
    ) -> LoaderConfig:
        """This config for data whose vector columns hold ``widths`` values a row, and
        whose list columns ``list_values`` on average: a default chunk size is counted in
        their values, so that a chunk of embeddings or of long lists holds about
        ``DEFAULT_CHUNK_BYTES`` too.

        Examples:
            >>> config = LoaderConfig.build(batch_size=4, conts=["emb"])
            >>> config.with_widths({"emb": 8}).chunk_rows == config.chunk_rows // 8
            True
            >>> lists = LoaderConfig.build(batch_size=4, cats=["h"], sparse_names=["h"])
            >>> lists.with_widths({}, {"h": 99.0}).chunk_rows  # 128 MiB / (99 ids, an offset)
            167772
        """
        list_values = dict(list_values or {})
        if dict(widths) == dict(self.widths) and not list_values:
            return self
        chunk_rows = self.chunk_rows
        if not self.chunk_given:
            chunk_rows = _default_chunk_rows(self.dtypes, widths, self.batch_size, list_values)
        return dataclasses.replace(self, widths=dict(widths), chunk_rows=chunk_rows)

    def check_device(self, device: Device) -> None:
        """Refuse options the loader's (resolved) device cannot serve."""
        if self.cache_placement == "device" and not device.is_cuda:
            raise InvalidArgumentError(
                f"cache_placement='device' keeps the cache in GPU memory, and device="
                f"{device} is the CPU. Pass device='cuda', or leave cache_placement out"
            )

    def cache_stacked(self, device: Device) -> bool:
        """Whether a cache stores a block per kind: when shuffled rows are gathered from it
        on the host (a row is then a few cache lines rather than one random access per
        column). Otherwise it stores the layout's blocks: on a GPU a gather costs the same
        either way, and the cache then holds the blocks batches are cut from."""
        return self.layout == "stacked" or (self.shuffle and not device.is_cuda)

    def plan_options(self) -> dict[str, Any]:
        """The options that shape every epoch's plan, as the planners take them."""
        return {f.name: getattr(self, f.name) for f in _FIELDS if f.metadata.get("plan")}

    def order_options(self) -> dict[str, Any]:
        """What decides the batches of a saved state, besides the seed and the dataset."""
        return {
            "cats": list(self.cats),
            "conts": list(self.conts),
            "labels": list(self.labels),
            "shuffle": self.shuffle,
            # With a cache every rank keeps a fixed share: another order than streaming.
            "cache": self.cache_mode is not None,
            **self.plan_options(),
        }

    def batches_per_epoch(self, rows: int, *, worker: int = 0, num_workers: int = 1) -> int:
        """Batches one epoch of a dataset of ``rows`` rows delivers to this rank (or to
        one of its worker processes)."""
        lo, hi = rank_rows(rows, global_rank=self.global_rank, global_size=self.global_size)
        first, last = worker_row_range(
            hi - lo,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            worker=worker,
            num_workers=num_workers,
        )
        return count_batches(last - first, self.batch_size, drop_last=self.drop_last)

    @classmethod
    def build(cls, *, batch_size: int, **given: Any) -> LoaderConfig:
        """A config of the options ``given`` (the [`Loader`][tabloader.Loader] keywords
        but ``dataset`` and ``device``), checked: an
        [`InvalidArgumentError`][tabloader.errors.InvalidArgumentError] names a value
        that is not allowed, the constraint, and what to do."""
        options = {**_DEFAULTS, **given}
        batch_size = int_at_least(batch_size, 1, "batch_size")
        # NVTabular's names (cat_names, ...) are accepted too, one spelling per option.
        named = {
            kind: column_names(one_spelling({kind: options[kind], alias: options.get(alias)}), kind)
            for alias, kind in ALIASES.items()
        }
        cats, conts, labels = named["cats"], named["conts"], named["labels"]
        sparse_names, sparse_max = _list_options(options, labels)
        # A list column named only in sparse_names is categorical (NVTabular's use).
        cats += tuple(n for n in sparse_names if n not in cats and n not in conts)
        columns = cats + conts + labels
        if not columns:
            raise InvalidArgumentError(
                "no columns selected: pass at least one of cats=, conts=, labels="
            )
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        if repeated:
            raise InvalidArgumentError(
                f"column(s) {repeated} are listed more than once across cats/conts/labels"
            )
        parts_per_chunk, chunk_rows = options["parts_per_chunk"], options["chunk_rows"]
        if parts_per_chunk is not None and chunk_rows is not None:
            raise InvalidArgumentError("give parts_per_chunk or chunk_rows, not both")
        parts_per_chunk = optional_positive(parts_per_chunk, "parts_per_chunk")
        chunk_rows = optional_positive(chunk_rows, "chunk_rows")
        prefetch = int_at_least(options["prefetch"], 1, "prefetch")
        threads = optional_positive(options["threads"], "threads")
        # None (an adapter's "not given") is the default: rank 0 of 1.
        rank = 0 if options["global_rank"] is None else options["global_rank"]
        size = 1 if options["global_size"] is None else options["global_size"]
        global_size = int_at_least(size, 1, "global_size")
        global_rank = int_at_least(rank, 0, "global_rank")
        if global_rank >= global_size:
            raise InvalidArgumentError(
                f"global_rank must be in [0, {global_size}) for global_size="
                f"{global_size}, got {rank!r}"
            )
        layout = options["layout"]
        if layout not in ("columns", "stacked"):
            raise InvalidArgumentError(f"layout must be 'columns' or 'stacked', got {layout!r}")
        shuffle, cache = options["shuffle"], options["cache"]
        if isinstance(shuffle, str) and shuffle != "global":
            raise InvalidArgumentError(f"shuffle must be True, False or 'global', got {shuffle!r}")
        shuffle_as: bool | Literal["global"] = (
            "global" if shuffle == "global" else flag(shuffle, "shuffle")
        )
        if cache not in (None, "memory", "disk"):
            raise InvalidArgumentError(f"cache must be None, 'memory' or 'disk', got {cache!r}")
        if shuffle == "global" and cache is None:
            raise InvalidArgumentError(
                "shuffle='global' permutes all of the rank's rows every epoch, which needs "
                "random access to decoded rows: pass cache='memory' or cache='disk' too, or "
                "use shuffle=True (partitions and rows within chunks)"
            )
        cache_max_bytes = optional_positive(options["cache_max_bytes"], "cache_max_bytes")
        cache_placement = options["cache_placement"]
        if cache_placement not in ("auto", "device", "host"):
            raise InvalidArgumentError(
                f"cache_placement must be 'auto', 'device' or 'host', got {cache_placement!r}"
            )
        seed = options["seed"]
        if seed is None:
            if shuffle and global_size > 1:
                raise InvalidArgumentError(
                    "with shuffle=True and global_size > 1, pass the same seed= on every rank: "
                    "ranks derive their shards from it and would overlap otherwise"
                )
            seed = int(np.random.SeedSequence().entropy)  # type: ignore[arg-type]
        kind_dtypes = {
            option: numeric_dtype(options[option], option, integer=option == "cat_dtype")
            for option in ("cat_dtype", "cont_dtype", "label_dtype")
        }
        dtypes = {
            **dict.fromkeys(cats, kind_dtypes["cat_dtype"]),
            **dict.fromkeys(conts, kind_dtypes["cont_dtype"]),
            **dict.fromkeys(labels, kind_dtypes["label_dtype"]),
        }
        chunk_given = parts_per_chunk is not None or chunk_rows is not None
        if not chunk_given:
            chunk_rows = _default_chunk_rows(dtypes, {}, batch_size)
        if options["cache_dir"] is not None:
            cache_directory(options["cache_dir"])  # a path, or a clear error whatever cache
        given_for_a_cache = [
            f"{name}={options[name]!r}"
            for name in ("cache_dir", "cache_max_bytes", "cache_placement")
            if options[name] != _DEFAULTS[name]
        ]
        if cache is None and given_for_a_cache:
            warnings.warn(
                f"{', '.join(given_for_a_cache)} configure the decoded cache, but cache= is "
                "not given, so nothing is cached and every epoch reads the files. Pass "
                "cache='disk' (or 'memory') to cache, or leave these out",
                CacheWarning,
                stacklevel=3,
            )
        config = cls(
            batch_size=batch_size,
            cats=cats,
            conts=conts,
            labels=labels,
            shuffle=shuffle_as,
            cache_mode=cache,
            shuffle_within_batch=flag(options["shuffle_within_batch"], "shuffle_within_batch"),
            drop_last=flag(options["drop_last"], "drop_last"),
            global_rank=global_rank,
            global_size=global_size,
            parts_per_chunk=parts_per_chunk,
            chunk_rows=chunk_rows,
            cat_dtype=kind_dtypes["cat_dtype"],
            cont_dtype=kind_dtypes["cont_dtype"],
            label_dtype=kind_dtypes["label_dtype"],
            fill_null=_fill_option(options["fill_null"], columns),
            seed=int_at_least(seed, 0, "seed"),
            seed_given=options["seed"] is not None,
            prefetch=prefetch,
            threads=threads,
            cache_dir=options["cache_dir"],
            cache_max_bytes=cache_max_bytes,
            cache_placement=cache_placement,
            sparse_names=sparse_names,
            sparse_max=sparse_max,
            sparse_as_dense=bool(options["sparse_as_dense"]),
            sparse_pad=options["sparse_pad"],
            layout=layout,
            dtypes=dtypes,
            chunk_given=chunk_given,
        )
        config._check_pad()
        return config

    def _check_pad(self) -> None:
        """``sparse_pad`` must fit every dense list column's dtype (it is delivered)."""
        if not self.sparse_as_dense:
            return
        for name in self.sparse_names:
            dtype = self.dtypes[name]
            if not fits(self.sparse_pad, dtype):
                raise InvalidArgumentError(
                    f"sparse_pad is {self.sparse_pad!r}, which does not fit "
                    f"{self.dtype_option(name)}={dtype} of the list column {name!r} "
                    f"({describe_range(dtype)}). Pass a sparse_pad that fits, such as 0"
                )


_FIELDS = dataclasses.fields(LoaderConfig)
_DEFAULTS: dict[str, Any] = {
    **{f.name: f.default for f in _FIELDS if f.default is not dataclasses.MISSING},
    **{f.name: None for f in _FIELDS if f.default is dataclasses.MISSING},
    "seed": None,  # drawn by build
    "cache": None,
    "cats": None,  # not given (the other spelling may be)
    "conts": None,
    "labels": None,
    "fill_null": None,
    "sparse_max": None,
    "cat_dtype": "int64",
    "cont_dtype": "float32",
    "label_dtype": "float32",
}
LOADER_KEYWORDS = (
    *(f.metadata.get("keyword", f.name) for f in _FIELDS if f.metadata.get("option")),
    *ALIASES,
)
"""The options the framework adapters take and pass on (the keys of
[`LoaderOptions`][tabloader.LoaderOptions]), for checking an adapter's keywords."""


def _default_chunk_rows(
    dtypes: Mapping[str, np.dtype[Any]],
    widths: Mapping[str, int],
    batch_size: int,
    list_values: Mapping[str, float] | None = None,
) -> int:
    """Rows of about ``DEFAULT_CHUNK_BYTES`` of decoded columns (a vector column's row
    holds its ``widths`` values, a list column's its ``list_values`` and an offset), at
    least a batch."""
    lists = list_values or {}
    row_bytes = sum(
        d.itemsize * lists[c] + 8 if c in lists else d.itemsize * widths.get(c, 1)
        for c, d in dtypes.items()
    )
    return max(batch_size, int(DEFAULT_CHUNK_BYTES // row_bytes))


def list_widths_given(sparse_max: object) -> dict[str, Any]:
    """``sparse_max`` as a dict of the widths given (none when None), or refused.

    Examples:
        >>> list_widths_given({"genres": 4}), list_widths_given(None)
        ({'genres': 4}, {})
    """
    if sparse_max is not None and not isinstance(sparse_max, Mapping):
        raise InvalidArgumentError(
            f"sparse_max must be a mapping {{column: max values per row}}, got {sparse_max!r}"
        )
    return dict(sparse_max or {})


def _list_options(
    options: Mapping[str, Any], labels: tuple[str, ...]
) -> tuple[tuple[str, ...], dict[str, int]]:
    names = column_names(options["sparse_names"], "sparse_names")
    sparse_as_dense, sparse_max = options["sparse_as_dense"], options["sparse_max"]
    flag(sparse_as_dense, "sparse_as_dense")
    if not is_number(options["sparse_pad"]):
        raise InvalidArgumentError(f"sparse_pad must be a number, got {options['sparse_pad']!r}")
    labelled = [n for n in names if n in labels]
    if labelled:
        raise InvalidArgumentError(
            f"list column(s) {labelled} are listed in labels; labels must be scalar "
            "columns. Leave them out of sparse_names or labels"
        )
    widths = list_widths_given(sparse_max)
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


def _fill_option(fill_null: Any, columns: tuple[str, ...]) -> dict[str, Any]:
    """``fill_null`` as a dict over the columns it names (its values are checked against
    the columns' types by `check_dataset`)."""
    if fill_null is None:
        return {}
    if isinstance(fill_null, Mapping):
        unknown = sorted(set(fill_null) - set(columns))
        if unknown:
            raise InvalidArgumentError(
                f"fill_null names {unknown}, which are not in cats/conts/labels"
            )
        return dict(fill_null)
    return dict.fromkeys(columns, fill_null)


class ConfigAttributes:
    """The options of the `LoaderConfig` an object holds as ``self.config``, as its
    read-only attributes: ``loader.cats`` is ``loader.config.cats``."""

    def __getattr__(self, name: str) -> Any:
        config = self.__dict__.get("config")
        if config is None or name not in _NAMES:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(config, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _NAMES:
            raise AttributeError(
                f"{name} is fixed when the {type(self).__name__} is built (see its config): "
                f"build another one with {name}={value!r}"
            )
        super().__setattr__(name, value)


_NAMES = frozenset([*(f.name for f in _FIELDS), "columns"])
