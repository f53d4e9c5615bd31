"""The framework-agnostic loader: a dataset in, an epoch of shuffled batches out.

[`Loader`][tabloader.Loader] wires the parts together: its options
(`tabloader.config`, checked when built and against the dataset), the device and its
backend, the decoded cache, and the pipeline's threads (`tabloader.stages`) that
deliver each epoch its plan (`tabloader.plan`) says. Where the epochs stand is a cursor
(`tabloader.state`) the loader keeps for itself.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from tabloader.backends import get_backend
from tabloader.batches import Layout
from tabloader.cache import DecodedCache
from tabloader.cache.device import device_reserve, device_share
from tabloader.casting import checked_layout
from tabloader.checks import check_dataset
from tabloader.config import LOADER_KEYWORDS, ConfigAttributes, LoaderConfig, LoaderOptions
from tabloader.dataset import Dataset
from tabloader.device import Device, resolve_device
from tabloader.elastic import Planner, plan_rest
from tabloader.errors import InvalidArgumentError, SchemaMismatchError
from tabloader.iterator import BatchIterator, EpochProgress
from tabloader.options import int_at_least, keywords_of, reject_unknown
from tabloader.plan import EpochPlan, plan_cached_epoch, plan_epoch
from tabloader.stages import batch_stream, batches_ahead
from tabloader.state import (
    STATE_EPOCH,
    WORLD_OPTIONS,
    Cursor,
    Fingerprint,
    Position,
    dataset_fingerprint,
)
from tabloader.stats import LoaderStats, StatsRecorder
from tabloader.threads import Threads

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from tabloader.backends import Backend

    # Type checkers see the options as attributes (``loader.cats``), typed as the config
    # declares them; at run time ConfigAttributes reads them from ``loader.config``.
    _Options = LoaderConfig
else:
    _Options = ConfigAttributes

__all__ = ["LOADER_KEYWORDS", "Loader", "LoaderOptions"]


class _Standing(_Options):
    """Where a loader's epochs stand, its own: the epoch and seed the next ``iter()``
    delivers, the epoch in progress, a loaded state to continue; saving and checking
    states (see `tabloader.state`)."""

    config: LoaderConfig
    dataset: Dataset
    cache: DecodedCache | None
    _next: Cursor
    _resume: Cursor | None
    _live: EpochProgress | None
    _listing_before: tuple[int, Fingerprint] | None

    if TYPE_CHECKING:

        def refresh(self, epoch: int) -> None: ...  # the loader's

    def num_batches(self, *, worker: int = 0, num_workers: int = 1) -> int:
        """Batches one epoch delivers to this rank (or to one of its worker processes)."""
        return self.config.batches_per_epoch(
            self.dataset.num_rows, worker=worker, num_workers=num_workers
        )

    def __len__(self) -> int:
        return self.num_batches()

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
        """Make the next ``iter()`` deliver epoch ``epoch`` (like ``DistributedSampler``):
        from its start, unless a loaded state continues that epoch (a state of another
        epoch is dropped). An epoch left unfinished is given up: `state_dict` points
        where the next ``iter()`` starts."""
        self._next = Cursor(int_at_least(epoch, 0, "epoch"), self.seed)
        self._live = None
        if self._resume is not None and self._resume.epoch != epoch:
            self._resume = None

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands, to continue exactly there after a restart.

        A small JSON-serialisable dict: the epoch, the seed, the batches already handed
        out in that epoch, the number of ranks (``global_size``), and a fingerprint of
        the dataset and of the options that decide the order of rows. Mid-epoch (an
        iterator that has not ended) it points at the next batch of that epoch;
        otherwise (an epoch whose every batch was taken has ended, asked past its last
        or not) at the start of the next epoch. Batches read ahead in the background
        but not yet handed out do not count.

        Every rank of a job delivers the same number of batches, so every rank's state
        is the same (see `tabloader.agreed_state`): keep one, and resume every rank from
        it, on this number of ranks or another (see
        [`load_state_dict`][tabloader.Loader.load_state_dict]).

        Examples:
            >>> import pyarrow as pa, tabloader
            >>> table = pa.table({"x": list(range(10))})
            >>> loader = tabloader.Loader(table, cats=["x"], batch_size=3, shuffle=True, seed=1)
            >>> epoch = iter(loader)
            >>> first = next(epoch)
            >>> state = loader.state_dict()
            >>> state["epoch"], state["batches"], state["global_size"]
            (0, 1, 1)
            >>> again = tabloader.Loader(table, cats=["x"], batch_size=3, shuffle=True, seed=1)
            >>> again.load_state_dict(state)
            >>> [b["x"].tolist() for b in again] == [b["x"].tolist() for b in epoch]
            True
        """
        cursor = self._resume
        if cursor is None and self._live is not None and not self._live.over:
            cursor = self._live.cursor
        cursor = cursor or self._next
        position = cursor.position(global_size=self.config.global_size)
        return position.to_state(self.fingerprint(cursor.epoch))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from [`state_dict`][tabloader.Loader.state_dict]): the next
        ``iter()`` delivers the rest of the saved epoch, and later epochs follow as they would
        have.

        On the number of ranks (``global_size``) the state was saved on, the rest of the
        epoch is bit-identical to the run that saved it. On another, it is exactly the
        rows no rank of the saved run delivered, dealt to the new ranks as a fresh
        epoch's rows are: every rank the same number of batches, at most
        ``global_size - 1`` of those rows sitting out (see docs/torch.md, "Resume on
        another number of ranks"); later epochs are those of a fresh run on the new
        ranks.

        The dataset, columns and order-deciding options must be those of the saved run;
        otherwise [`InvalidArgumentError`][tabloader.errors.InvalidArgumentError] names what
        differs. A loader created without ``seed`` takes the saved one.
        """
        cursor = self.resume_cursor(state)
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
        """The state of ``batches`` batches delivered in ``epoch`` by worker share
        ``worker`` of ``num_workers`` (see [`state_dict`][tabloader.Loader.state_dict])."""
        seed = self.seed if seed is None else seed
        cursor = Cursor(epoch, seed, batches, worker, num_workers)
        position = cursor.position(global_size=self.config.global_size)
        return position.to_state(self.fingerprint(epoch))

    def check_state(
        self,
        state: Mapping[str, Any],
        *,
        adopt_seed: bool | None = None,
        worker: int = 0,
        num_workers: int = 1,
    ) -> tuple[int, int, int]:
        """``(epoch, batches, seed)`` where worker share ``worker`` of ``num_workers``
        continues a saved state (see `resume_cursor`)."""
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
        """Where worker share ``share`` of this rank continues a saved state (see
        `saved_position` and `resume_at`)."""
        position = self.saved_position(state, seed=seed, adopt_seed=adopt_seed)
        return self.resume_at(position, worker=share[0], num_workers=share[1])

    def saved_position(
        self, state: Mapping[str, Any], *, seed: int | None = None, adopt_seed: bool | None = None
    ) -> Position:
        """The position a saved state holds, checked against this loader: its data and
        order-deciding options, ``seed`` (default: the loader's), and batch counts that
        the saved epoch had.

        Raises [`InvalidArgumentError`][tabloader.errors.InvalidArgumentError] naming the saved and
        the current value of whatever differs. With ``adopt_seed`` a different seed is taken, not
        refused (default: when this loader was created without ``seed``).
        """
        if self.cache is not None and self.config.shuffle == "global":
            # Whether this loader's epochs are shuffled globally depends on whether its
            # cache is used: found out now, as the first epoch would.
            _ = self.cache.lookup() or self.cache.decide()
        epoch = state.get(STATE_EPOCH) if isinstance(state, Mapping) else None
        if self.dataset.refreshes and isinstance(epoch, int) and epoch >= 0:
            # The listing the saved epoch goes on with: checked now, and kept for that
            # epoch (iter() does not list again), so no file that joins meanwhile can
            # change the rest of it.
            self.refresh(epoch)
        position = Position.from_state(
            state,
            self.fingerprint(),
            seed=self.seed if seed is None else seed,
            adopt_seed=not self.config.seed_given if adopt_seed is None else adopt_seed,
            listing_changes=self.dataset.refreshes,
        )
        for w, done in enumerate(position.worker_batches):
            if done is None:
                continue
            share = Cursor(position.epoch, position.seed, 0, w, position.num_workers, position.legs)
            have = self.world_plan(share, global_size=position.global_size).num_batches
            if done > have:
                by = "" if position.num_workers == 1 else f" by worker {w}"
                raise InvalidArgumentError(
                    f"the state says {done} batches of epoch {position.epoch} were delivered"
                    f"{by}, but an epoch has {have} here; was it saved by another version of "
                    "the data?"
                )
        return position

    def resume_at(self, position: Position, *, worker: int = 0, num_workers: int = 1) -> Cursor:
        """Where worker share ``worker`` of ``num_workers`` of this rank continues
        ``position`` (from `saved_position`)."""
        return position.cursor(
            global_size=self.config.global_size, worker=worker, num_workers=num_workers
        )

    def fingerprint(self, epoch: int | None = None) -> Fingerprint:
        """What a saved state must match to resume here: the dataset and the options that
        decide the order of rows; for ``epoch``, the listing that epoch was dealt from
        (a ``refresh=True`` dataset listed for a later epoch while it ran: its state is
        of the files it reads, not of the new listing)."""
        before = self._listing_before
        if before is not None and epoch == before[0]:
            return before[1]
        options = self.config.order_options()
        notes = {}
        if self.config.shuffle == "global" and self.cache is not None and not self.cache.usable:
            # Its epochs stream with shuffle=True's chunks: what a state must say.
            options["shuffle"] = True
            notes["shuffle"] = (
                f"this loader's cache is not used ({self.cache.refused}), and without it "
                "shuffle='global' shuffles chunks. Resume where the cache can be used, or "
                "start the epoch over"
            )
        elif self.config.shuffle == "global" and self.cache is not None:
            notes["shuffle"] = (
                "a run given shuffle='global' whose cache could not be used shuffles chunks "
                "and saves shuffle=True: to go on with that epoch, pass shuffle=True (the "
                "same cache, the same batches), or start the epoch over"
            )
        return Fingerprint(dataset_fingerprint(self.dataset), options, notes)

    def cursor_plan(self, cursor: Cursor) -> EpochPlan:
        """What this rank's worker share of ``cursor`` reads for the rest of its epoch."""
        config = self.config
        if not 0 <= cursor.worker < cursor.num_workers:
            raise InvalidArgumentError(
                f"worker must be in [0, {cursor.num_workers}), got {cursor.worker}"
            )
        plan = self.world_plan(
            cursor, global_size=config.global_size, global_rank=config.global_rank
        )
        if not 0 <= cursor.batches <= plan.num_batches:
            raise InvalidArgumentError(
                f"start_batch must be in [0, {plan.num_batches}] (the batches of epoch "
                f"{cursor.epoch} for worker {cursor.worker} of {cursor.num_workers}), got "
                f"{cursor.batches!r}"
            )
        return plan.resume(cursor.batches)

    def world_plan(self, cursor: Cursor, *, global_size: int, global_rank: int = 0) -> EpochPlan:
        """The plan of ``cursor``'s worker share of rank ``global_rank`` of ``global_size``
        ranks in ``cursor``'s epoch (the rest of it, after the worlds of ``cursor.legs``),
        from its start."""
        planner = self.planner(cursor.epoch, cursor.seed)
        if not cursor.legs:
            return planner(global_rank, global_size, cursor.worker, cursor.num_workers)
        try:
            return plan_rest(
                planner,
                cursor.legs,
                global_rank=global_rank,
                global_size=global_size,
                worker=cursor.worker,
                num_workers=cursor.num_workers,
                batch_size=self.config.batch_size,
                drop_last=self.config.drop_last,
            )
        except ValueError as error:
            raise InvalidArgumentError(
                f"the state's earlier worlds do not fit epoch {cursor.epoch} here ({error}); "
                "was it saved by another version of the data?"
            ) from None

    def planner(self, epoch: int, seed: int) -> Planner:
        """Plans of ``epoch``, shuffled with ``seed``, for any rank and worker share."""
        raise NotImplementedError


class Loader(_Standing):
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
            A column stored as a fixed-size list of ``k`` numbers a row (an embedding)
            is a vector column in any of the three, delivered as a dense ``[B, k]``
            array (in the ``"stacked"`` layout: ``k`` consecutive places of its kind's
            block, where it is named).
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
        threads: CPU threads the loader may keep busy at once laying out chunks, filling
            a decoded cache and gathering from it (Arrow decodes on a pool of its own).
            Default: the cores this process may run on (``os.sched_getaffinity``).
            [`LoaderStats.threads`][tabloader.LoaderStats] says which was taken.

    Args: Caching
        cache: ``None`` (default) decodes the files every epoch. ``"memory"`` or
            ``"disk"``: the first epoch also keeps the rank's decoded rows (cast, nulls
            filled) in RAM or in memory-mapped files, and later epochs read only those,
            several times faster than decoding, with the same batches (see docs/cache.md).
            Both backends; a GPU loader serves the complete cache from GPU memory or
            pinned host memory (``cache_placement``).
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
        cache_placement: Where a GPU loader keeps its complete cache. ``"auto"``
            (default): in GPU memory when it fits in a share of the device's free memory
            (``$TABLOADER_GPU_CACHE_FRACTION``, 0.5 by default), else in pinned host
            memory, each batch copied to the device as it is served; ``"device"`` or
            ``"host"`` decide. `LoaderStats.cache_placement` says which was taken.
            ``"device"`` needs a GPU device.

    Args: Distributed
        global_rank, global_size: This process's rank and the number of ranks (default,
            or None: 0 and 1). Every rank gets ``len(dataset) // global_size`` rows and the
            same number of batches; the ranks' rows are disjoint. Pass the same ``seed`` on
            every rank. With a ``cache``, each rank keeps the same rows every epoch (its
            share of the dataset in stored order) and shuffling permutes within that share.
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
        layout: Literal["columns", "stacked"] = "columns",
        device: str | int | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        **options: Unpack[LoaderOptions],
    ) -> None:
        reject_unknown(options, (*keywords_of(Loader.__init__), *LOADER_KEYWORDS), "Loader")
        config = LoaderConfig.build(batch_size=batch_size, layout=layout, **options)
        self.config = config
        """The options, checked; each is also an attribute (``loader.cats``)."""
        if transform is not None and not callable(transform):
            raise InvalidArgumentError(f"transform must be callable, got {transform!r}")
        self.transform = transform
        """Called on every batch in the background thread (see ``transform`` above)."""
        self.device: Device = resolve_device(device)
        """Where batches live, decided once here; adapters read it and never decide again."""
        self.backend: Backend = get_backend(self.device)
        config.check_device(self.device)
        self.dataset = dataset if isinstance(dataset, Dataset) else Dataset(dataset)
        checks = check_dataset(config, self.dataset, stacklevel=2)
        self._range_checks = checks.read_checks(self.device)
        """Columns whose values are checked to fit their dtype when read (see
        `tabloader.checks.DatasetChecks.read_checks`)."""
        # vectors' k and lists' values a row, from the data: what a default chunk holds
        config = self.config = config.with_widths(checks.widths, checks.list_values)
        self._list_values = checks.list_values
        self.layout_plan = self._layout(config.layout == "stacked")
        self._next = Cursor(0, config.seed)  # the next iter()'s epoch and seed
        self._resume: Cursor | None = None  # where the next iter() starts, once loaded
        self._live: EpochProgress | None = None  # of the epoch iter() last started
        self._epochs_running: weakref.WeakSet[BatchIterator] = weakref.WeakSet()
        self._listing_before: tuple[int, Fingerprint] | None = None
        """An epoch still in progress when the listing changed for a later one (a
        ``refresh=True`` dataset), and the fingerprint of the listing it was dealt from."""
        self._threads = Threads.sized(config.threads)
        self._stats = StatsRecorder()
        self._stats.threads = self._threads.cores
        self.cache: DecodedCache | None = None
        """The decoded cache (``cache=`` given), which also fixes each rank's rows."""
        self._cache_stacked = config.cache_stacked(self.device)
        if config.cache_mode is not None:
            if self.device.is_cuda:  # the settings of a cache in GPU memory, checked now
                device_share(), device_reserve()
            self.cache = self._cache_for(self.dataset)

    def _layout(self, stacked: bool, *, vectors_apart: bool = False) -> Layout:
        grouped = self.backend.groups_columns
        return self.config.block_layout(
            stacked=stacked,
            grouped=grouped,
            checks=self._range_checks,
            vectors_apart=vectors_apart,
        )

    def _cache_for(self, dataset: Dataset) -> DecodedCache:
        config = self.config
        assert config.cache_mode is not None  # a loader with a cache
        return DecodedCache(
            config.cache_mode,
            dataset=dataset,
            # (stacked to gather whole rows; vectors delivered alone stay row-major apart)
            blocks=self._layout(
                self._cache_stacked, vectors_apart=config.layout != "stacked"
            ).blocks,
            layout=self.layout_plan,
            fill_null=config.fills,
            global_rank=config.global_rank,
            global_size=config.global_size,
            cache_dir=config.cache_dir,
            max_bytes=config.cache_max_bytes,
            placement=config.cache_placement,
            list_values=self._list_values,
        )

    def plan(
        self, epoch: int, *, worker: int = 0, num_workers: int = 1, seed: int | None = None
    ) -> EpochPlan:
        """The epoch plan this loader follows (see [`tabloader.plan`][tabloader.plan]);
        ``seed`` defaults to the loader's."""
        if not 0 <= worker < num_workers:
            raise InvalidArgumentError(f"worker must be in [0, {num_workers}), got {worker}")
        planner = self.planner(epoch, self.seed if seed is None else seed)
        return planner(self.config.global_rank, self.config.global_size, worker, num_workers)

    def planner(self, epoch: int, seed: int) -> Planner:
        plan_for: Callable[..., EpochPlan] = plan_epoch
        shuffle = self.config.shuffle
        if self.cache is not None:
            plan_for = plan_cached_epoch
            if shuffle == "global" and not self.cache.usable:
                shuffle = True  # without a usable cache, "global" streams shuffled chunks
        options = {k: v for k, v in self.config.plan_options().items() if k not in WORLD_OPTIONS}
        return partial(
            _plan_of_share, plan_for, self.dataset.partition_rows,
            shuffle=shuffle, seed=seed, epoch=epoch, **options,
        )  # fmt: skip

    def __iter__(self) -> BatchIterator:
        """Start the next epoch: each ``iter()`` advances ``loader.epoch`` by one.

        After [`load_state_dict`][tabloader.Loader.load_state_dict], the first ``iter()`` continues
        the saved epoch.
        """
        start = self._next if self._resume is None else self._resume
        self._resume = None
        self._listing_before = None
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
        reopen = getattr(self.backend, "reopen", None)  # a GPU's pool and streams, if closed
        if reopen is not None:
            reopen()
        for running in list(self._epochs_running):
            if len(running) == 0 and not running.finished:
                # Every batch of it was taken (a loop counting len() steps): its end
                # comes first, and with it a cache it fills, which this epoch then reads
                # rather than filling it again.
                for _ in running:
                    pass
        cursor = (
            epoch
            if isinstance(epoch, Cursor)
            else Cursor(epoch, self.seed, start_batch, worker, num_workers)
        )
        self.refresh(cursor.epoch)
        backend = self.backend
        if self.cache is not None and not cursor.legs:
            # from the cache, into the cache, or (too big) streamed; an epoch dealt anew to
            # this number of ranks holds other ranks' rows, so it is streamed
            backend = self.cache.epoch_backend(self.backend, self._stats)
        plan = self.cursor_plan(cursor)
        make_batches = partial(
            batch_stream,
            dataset=self.dataset,
            backend=backend,
            plan=plan,
            layout=self.layout_plan,
            fill_null=self.config.fills,
            transform=self.config.delivered(self.transform),
            prefetch=self.config.prefetch,
            threads=self._threads,
            stats=self._stats,
        )
        iterator = BatchIterator(batches_ahead(make_batches), plan.num_batches, self._stats, cursor)
        self._epochs_running.add(iterator)
        return iterator

    def stats(self) -> LoaderStats:
        """Counters and timings since the loader was created (see
        [`LoaderStats`][tabloader.LoaderStats])."""
        return dataclasses.replace(self._stats.snapshot(), rows_skipped=self.dataset.rows_skipped)

    def close(self) -> None:
        """Give back the memory the loader holds for its epochs: on a GPU, its memory
        pool (once no other loader on the device uses it; memory the consumer let go of
        after its work on it is done) and its decoded cache's copy in GPU or pinned
        memory (the cache itself stays, and the next epoch places it again). Epochs in
        progress end first (their iterators yield nothing more, and a cache they were
        filling is not published); batches still held stay valid. Also done when the
        loader is collected.

        Examples:
            >>> import pyarrow as pa, tabloader
            >>> loader = tabloader.Loader(pa.table({"x": [1, 2, 3]}), cats=["x"], batch_size=2)
            >>> [len(b["x"]) for b in loader]
            [2, 1]
            >>> loader.close()
        """
        for iterator in list(self._epochs_running):
            iterator.close()
        if self.cache is not None:
            self.cache.unplace()
        close = getattr(self.backend, "close", None)  # a GPU backend's memory and streams
        if close is not None:
            close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def refresh(self, epoch: int) -> None:
        """List a ``refresh=True`` dataset again for ``epoch`` (once per epoch number) and
        check the files that joined; ``len()`` and [`plan`][tabloader.Loader.plan] then describe
        that epoch.

        ``iter()`` calls it; call it before to know the next epoch's ``len()`` (on every
        rank: under torch.distributed, rank 0's listing is broadcast).
        """
        before = None
        if self.dataset.refreshes and self._listing_before is None:
            # an epoch still running when the listing may change for another: its own
            running = [
                it.cursor.epoch
                for it in self._epochs_running
                if not it.over and it.cursor.epoch != epoch
            ]
            before = (running[0], self.fingerprint()) if running else None
        if self.dataset.refresh(epoch=epoch):
            if before is not None:
                self._listing_before = before
            checks = check_dataset(self.config, self.dataset, stacklevel=2)
            if checks.widths != dict(self.config.widths):
                raise SchemaMismatchError(
                    f"the vector columns hold {checks.widths} values a row in the files "
                    f"listed for epoch {epoch}, {dict(self.config.widths)} before: a "
                    "loader's batches keep their shape. Rewrite the new files with the "
                    "vectors' length, or build a new loader"
                )
            self._range_checks = checks.read_checks(self.device)
            self.layout_plan = checked_layout(self.layout_plan, self._range_checks)
            if self.cache is not None:
                # Other files, or other contents: a cache keyed by them, filled by this
                # epoch's reads (the files are decoded again); the old one's directory goes.
                self.cache.discard()
                self.cache = self._cache_for(self.dataset)

    def __repr__(self) -> str:
        config = self.config
        return (
            f"Loader({self.dataset!r}, batch_size={config.batch_size}, shuffle={config.shuffle!r}, "
            f"columns={len(config.columns)}, rank={config.global_rank}/{config.global_size}, "
            f"device={self.device})"
        )


def _plan_of_share(
    plan_for: Callable[..., EpochPlan],
    partition_rows: Any,
    global_rank: int,
    global_size: int,
    worker: int,
    num_workers: int,
    **options: Any,
) -> EpochPlan:
    """``plan_for``'s plan for a rank's worker share (a `tabloader.elastic.Planner`)."""
    return plan_for(
        partition_rows, global_rank=global_rank, global_size=global_size, worker=worker,
        num_workers=num_workers, **options,
    )  # fmt: skip
