"""Serving a cache: an epoch's batches gathered from the cached rows, in plan order.

Every epoch follows an [`EpochPlan`][tabloader.plan.EpochPlan]; `CachedRows` turns
its chunks into tasks that gather each batch's rows from the cached blocks (or, without
shuffling, views of them), and `tabloader.stages.run_ahead` runs those tasks on a few
threads ahead of the consumer. `CacheBackend` is the loader's backend for one epoch:
served from a complete cache, or filled from the files while serving them (see
`Fill`), or, when writing fails, streamed from where the
cache left off.

The code takes the array module ``xp`` (numpy here; cupy for a cache in GPU memory)
and the cached arrays as values, so the same gathers can serve from either. What an
epoch asks of the cache itself is `CacheHandle`: the policy's decisions stay the policy's.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tabloader.batches import Ragged, empty_segment, host_int, segment_rows
from tabloader.cache.fill import CachedList, FillFailed
from tabloader.decode.host import decode_pieces
from tabloader.errors import CacheWarning, ReadError, SourceNotFoundError
from tabloader.stages import Reading, SplitWork, read_in_stages

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from tabloader.batches import Block, Layout, Part, Segment
    from tabloader.cache.fill import Fill
    from tabloader.dataset import Dataset
    from tabloader.plan import EpochPlan
    from tabloader.sources.base import Piece
    from tabloader.stages import Backend, ReadRequest

__all__ = [
    "CacheBackend",
    "CacheHandle",
    "CachedRows",
    "gather_list",
    "stream_rest",
    "take_transposed",
]

TILE_ROWS = 2048
"""Rows gathered at a time by `take_transposed`: a tile of a wide block (26
int64 columns: 416 KiB) stays in a core's L2 cache."""


def gather_list(cached: CachedList, rows: Any) -> Ragged:
    """The lists of ``rows`` (an index array) of a cached list column, in that order, as
    compact values and offsets from 0.

    Examples:
        >>> cached = CachedList(np.array([7, 8, 9, 5]), np.array([[3, 4], [0, 2], [2, 2]]))
        >>> r = gather_list(cached, np.array([1, 2, 0]))
        >>> r.values.tolist(), r.offsets.tolist()
        ([7, 8, 5], [0, 2, 2, 3])
    """
    xp = _module(cached.spans)
    rows = xp.asarray(rows)  # on the spans' device
    spans = cached.spans[rows]
    starts = spans[:, 0]
    offsets = xp.zeros(len(rows) + 1, dtype=np.int64)
    xp.cumsum(spans[:, 1] - starts, out=offsets[1:])
    total = host_int(offsets[-1])
    if total == 0:
        return Ragged(cached.values[:0], offsets)
    row = xp.searchsorted(offsets[1:], xp.arange(total, dtype=np.int64), side="right")
    source = starts[row] + (xp.arange(total, dtype=np.int64) - offsets[:-1][row])
    return Ragged(cached.values[source], offsets)


def _module(array: Any) -> Any:
    import sys

    return sys.modules[type(array).__module__.split(".")[0]]


class CachedRows:
    """Where each cached row lives, and how an epoch's batches are gathered from them.

    Args:
        blocks: The stored blocks (one per kind, or one per column; list columns each
            a `CachedList`).
        layout: How batches are delivered.
        share: The rank's share, as ``(partitions, first rows, stop rows)`` in stored
            order (`tabloader.plan.fixed_share`): the cache holds these rows, in order.
        partitions: Partitions of the dataset.
    """

    def __init__(
        self,
        blocks: tuple[Block, ...],
        layout: Layout,
        share: tuple[NDArray[Any], NDArray[np.int64], NDArray[np.int64]],
        partitions: int,
    ) -> None:
        self.blocks = blocks
        self.layout = layout
        self.share = share
        parts, starts, stops = share
        lengths = stops - starts
        offsets = np.cumsum(lengths) - lengths
        self.num_rows = int(lengths.sum())
        """Rows the cache holds."""
        self.base = np.full(partitions, -1, dtype=np.int64)
        """Per partition, the cache row of its row 0 (-1 outside the rank's share): row
        ``j`` of partition ``p`` is cache row ``base[p] + j``."""
        self.base[parts] = offsets - starts

    def missing(self, written: Sequence[Piece]) -> list[Piece]:
        """The share's rows not in ``written`` pieces, as ``(partition, start, stop)``.

        An epoch leaves rows out with ``drop_last`` or when a worker process reads only
        its part: the cache must hold them all the same.

        Examples:
            >>> rows = CachedRows((), None, (np.array([0, 2]), np.array([0, 5]),
            ...                   np.array([10, 8])), partitions=3)
            >>> rows.missing([(0, 2, 6), (2, 5, 8)])
            [(0, 0, 2), (0, 6, 10)]
        """
        by_partition: dict[int, list[tuple[int, int]]] = {}
        for p, a, b in written:
            by_partition.setdefault(p, []).append((a, b))
        missing = []
        parts, starts, stops = self.share
        for p, lo, hi in zip(parts.tolist(), starts.tolist(), stops.tolist(), strict=True):
            at = lo
            for a, b in sorted(by_partition.get(p, [])):
                if a > at:
                    missing.append((p, at, a))
                at = max(at, b)
            if at < hi:
                missing.append((p, at, hi))
        return missing

    def delivery_rows(self, plan: EpochPlan, chunk: int, *, xp: Any = np, order: Any = None) -> Any:
        """The cache rows of chunk ``chunk`` of ``plan`` in delivery order, an array of
        ``xp`` (numpy, or cupy: worked out on the device); None when the chunk is served as
        views of the cache (stored order, stored layout). ``order`` is the chunk's
        `EpochPlan.batch_order` when drawn already (it is then offset in place)."""
        if order is None:
            order = plan.batch_order(chunk, xp=xp)
        if order is None and self.blocks == self.layout.blocks:
            return None
        runs = [(int(self.base[p]) + s, e - s) for p, s, e in plan.pieces(chunk) if e > s]
        if all(a + n == b for (a, n), (b, _) in pairwise(runs)):  # one run of the cache
            first = runs[0][0] if runs else 0
            if order is not None:
                order += first  # one pass over the order, in place (it is this call's)
                return order
            return xp.arange(first, first + sum(n for _, n in runs), dtype=np.int64)
        if order is None:
            return xp.concatenate([xp.arange(a, a + n, dtype=np.int64) for a, n in runs])
        if xp is np:
            # each position's cache row written out once, then looked up: on a CPU twice
            # as fast as searching every position's run below (a GPU pays for the kernels
            # of one arange a run instead)
            by_position = np.concatenate([np.arange(a, a + n, dtype=np.int64) for a, n in runs])
            return np.take(by_position, order, out=order, mode="clip")
        # a position's run is found among the runs' first positions, and the run's first
        # cache row less its first position added to it: in place, two arrays of the
        # order's length whatever the number of runs (not one per run, and a gather)
        firsts = np.cumsum([0] + [n for _, n in runs[:-1]])
        table = xp.asarray(np.concatenate([firsts[1:], [a for a, _ in runs] - firsts]))
        which = xp.searchsorted(table[: len(runs) - 1], order, side="right")
        order += xp.take(table[len(runs) - 1 :], which, out=which)
        return order

    def batch_tasks(
        self,
        arrays: Callable[[], Mapping[str, Any]],
        plan: EpochPlan,
        chunks: Iterable[tuple[int, NDArray[np.int64] | None]],
        xp: Any,
    ) -> Iterator[Callable[[], list[Part]]]:
        """The parts of ``plan``'s chunks over the cached arrays, as tasks that gather
        them (run in order by `tabloader.stages.run_ahead`, several at once); ``chunks`` gives each
        chunk's `delivery_rows`, in order, and ``arrays()`` the cached arrays as
        they stand once the chunk's rows are in them (a cache being filled grows).

        Without shuffling, a chunk's pieces are zero-copy views of the cache. With
        shuffling, rows are gathered from the cache in the plan's order one whole batch
        at a time (so memory holds a few batches, not a chunk): a batch that begins at
        the end of one chunk and ends in the next is gathered once, from both, rather
        than in two parts copied together again. Rows are stored row-major per kind, so
        a gathered row is a few contiguous cache lines, not one random access per column.
        """
        carried: list[NDArray[np.int64]] = []  # the rows of a batch begun in a chunk before
        for chunk, rows in chunks:
            now = arrays()
            if rows is None:
                pieces = plan.pieces(chunk)
                first = [int(self.base[p]) + s for p, s, _ in pieces]
                views: list[Part] = [
                    (self.view(now, lo, lo + e - s), None)
                    for lo, (_, s, e) in zip(first, pieces, strict=True)
                ]
                yield partial(list, views)
                continue
            before = plan.rows_before(chunk)
            last = chunk == plan.num_chunks - 1
            for lo, hi in pairwise(plan.batch_bounds(chunk).tolist()):
                carried.append(rows[lo:hi])
                if (before + hi) % plan.batch_size and not (last and hi == len(rows)):
                    continue  # the batch goes on in the next chunk
                window = carried[0] if len(carried) == 1 else np.concatenate(carried)
                carried = []
                yield partial(self.gather, now, window, xp)
        if carried:  # the plan's last chunk was empty
            yield partial(self.gather, arrays(), np.concatenate(carried), xp)

    @staticmethod
    def view(arrays: Mapping[str, Any], lo: int, hi: int) -> Segment:
        """Rows ``lo:hi`` of the cache: views, and each list column's rows gathered."""
        return {
            name: gather_list(a, np.arange(lo, hi, dtype=np.int64))
            if isinstance(a, CachedList)
            else a[lo:hi]
            for name, a in arrays.items()
        }

    def gather(self, arrays: Mapping[str, Any], rows: NDArray[np.int64], xp: Any) -> list[Part]:
        """The ``rows`` of the cache, in that order, as the layout's blocks."""
        lists = {
            name: gather_list(a, rows) for name, a in arrays.items() if isinstance(a, CachedList)
        }
        if self.blocks == self.layout.blocks:
            dense = {
                name: xp.take(a, rows, axis=0) for name, a in arrays.items() if name not in lists
            }
            return [({**dense, **lists}, None)]
        # Stored row-major per kind, delivered one contiguous column each: gathered and
        # transposed in one pass into column-major blocks of one allocation. A block
        # stored as delivered (a vector column's [rows, k]) is gathered as it is.
        delivered = {(b.name, b.columns) for b in self.layout.blocks}
        kept = [b for b in self.blocks if not b.ragged and (b.name, b.columns) in delivered]
        scalar = [b for b in self.blocks if not b.ragged and b not in kept]
        shapes = [(b.name, b.width, b.dtype) for b in scalar]
        blocks = empty_segment(len(rows), shapes, xp, column_major=True)
        segment: Segment = {b.name: xp.take(arrays[b.name], rows, axis=0) for b in kept}
        for b in scalar:
            take_transposed(arrays[b.name], rows, blocks[b.name])
            segment.update((c, blocks[b.name][:, a:stop]) for c, a, stop in b.spans())
        segment.update(lists)
        return [(segment, None)]


def take_transposed(stored: NDArray[Any], rows: NDArray[np.int64], out: NDArray[Any]) -> None:
    """``out[i] = stored[rows[i]]`` for a row-major ``stored`` and a column-major ``out``.

    A tile of `TILE_ROWS` rows at a time is gathered into a small row-major
    scratch, which stays in the CPU's cache while it is transposed into ``out``: faster
    than gathering the whole batch and then transposing it from memory (by how much:
    docs/performance.md, "Measured choices inside the loader").

    Examples:
        >>> stored = np.arange(12).reshape(6, 2)
        >>> out = np.empty((3, 2), order="F", dtype=stored.dtype)
        >>> take_transposed(stored, np.array([5, 0, 2]), out)
        >>> out.tolist(), out.flags.f_contiguous
        ([[10, 11], [0, 1], [4, 5]], True)
    """
    tile = np.empty((min(TILE_ROWS, len(rows)), stored.shape[1]), stored.dtype)
    for lo in range(0, len(rows), TILE_ROWS):
        part = rows[lo : lo + TILE_ROWS]
        # The rows come from the plan, so they are in range: "clip" skips the bounds
        # checks of the default mode.
        np.take(stored, part, axis=0, out=tile[: len(part)], mode="clip")
        out[lo : lo + len(part)] = tile[: len(part)]


class CacheHandle(Protocol):
    """What an epoch through the cache asks of it (the `DecodedCache` that chose the
    epoch's backend): where its rows live, the complete rows, a new `Fill` for an epoch
    that writes them, and the verdicts such an epoch reaches: its rows complete (`adopt`)
    or writing them failed (`refuse`)."""

    rows: CachedRows
    nbytes: int
    """The cache's bytes (list columns' values counted once read)."""

    def served(self) -> dict[str, Any]:
        """The complete cache, read-only."""
        ...

    def start_fill(self, dataset: Dataset) -> Fill | None:
        """A new fill of the cache for an epoch over ``dataset``, or None (said) when its
        files cannot be made."""
        ...

    def adopt(self, arrays: Mapping[str, Any]) -> None:
        """Serve ``arrays`` (block name -> complete rows) from now on."""
        ...

    def refuse(self, reason: str) -> None:
        """Stop caching (every epoch streams from now on), and say why, once."""
        ...


class CacheBackend:
    """The loader's backend for one epoch, reading chunks through the cache.

    ``write=False``: every batch is gathered from the complete cache. ``write=True``:
    the epoch's pieces are decoded, written into a new `Fill`
    and each chunk's batches gathered from it once written; the rows the epoch leaves
    out are written at its end and the fill completed. If writing fails, a
    [`CacheWarning`][tabloader.errors.CacheWarning] says so, the cache is given up and the rest of
    the epoch is streamed from the files, from the first row not delivered yet.
    """

    def __init__(self, cache: CacheHandle, backend: Backend, *, write: bool) -> None:
        self.cache = cache
        self.backend = backend
        self.name = backend.name
        self.xp = backend.xp
        self.groups_columns = backend.groups_columns
        self.scope = backend.scope
        self.write = write

    def read_chunks(self, request: ReadRequest) -> Iterator[list[Part]]:
        cache, plan, rows = self.cache, request.plan, self.cache.rows
        # Each chunk's delivery rows, the next chunk's drawn while this one is gathered.
        order = partial(rows.delivery_rows, plan)
        gathers = request.threads.gather
        if not self.write:
            served = cache.served()

            def gather(
                _: Iterator[Any] | None, orders: Iterator[Any] | None, __: SplitWork
            ) -> Iterator[Any]:
                assert orders is not None
                return rows.batch_tasks(lambda: served, plan, enumerate(orders), self.xp)

            yield from read_in_stages(plan, Reading(gather, order=order, gathers=gathers))
            return
        fill = cache.start_fill(request.dataset)
        if fill is None:  # its files could not be made (said once): stream
            yield from self.backend.read_chunks(request)
            return
        delivered = 0  # rows of the plan's delivery order handed on
        failure: FillFailed | None = None
        try:
            for parts in read_in_stages(plan, self._filling(request, fill, order, gathers)):
                delivered += sum(segment_rows(segment) for segment, _ in parts)
                yield parts
        except FillFailed as error:
            failure = error
        finally:
            fill.close()
        if failure is not None:
            cause = failure.__cause__
            cache.refuse(
                f"writing it failed ({type(cause).__name__}: {cause}); this epoch goes on "
                "from the files",
            )
            yield from stream_rest(self.backend, request, delivered)

    def _filling(
        self,
        request: ReadRequest,
        fill: Fill,
        order: Callable[[int], Any],
        gathers: int,
    ) -> Reading[dict[str, Any], Any]:
        """An epoch that fills the cache: the decoder decodes the plan's pieces, the
        reader writes each chunk's into the fill (helpers taking a share of the rows),
        and the gather threads gather its batches once they are written; then the rows the
        epoch left out are written and the fill completed."""
        cache, plan, stats, rows = self.cache, request.plan, request.stats, self.cache.rows
        columns = [c for b in rows.blocks for c in b.columns]
        pieces = [p for chunk in range(plan.num_chunks) for p in plan.pieces(chunk)]
        decode = partial(
            decode_pieces, request.dataset, columns=columns, blocks=request.blocks,
            fill_null=request.fill_null, stats=stats,
        )  # fmt: skip

        def written(
            decoded: Iterator[dict[str, Any]], orders: Iterator[Any], work: SplitWork
        ) -> Iterator[tuple[int, NDArray[np.int64] | None]]:
            # A chunk's batches are gathered once its rows are written; meanwhile the
            # gather threads still work on the previous chunk's.
            for chunk, chunk_rows in enumerate(orders):
                s = plan.chunk_pieces(chunk)
                for p, a, _ in pieces[s]:
                    piece = next(decoded)
                    started = time.perf_counter()
                    fill.write(int(rows.base[p]) + a, piece, work)
                    stats.assemble_seconds += time.perf_counter() - started
                yield chunk, chunk_rows

        def lay_out(
            decoded: Iterator[dict[str, Any]] | None,
            orders: Iterator[Any] | None,
            work: SplitWork,
        ) -> Iterator[Any]:
            assert decoded is not None
            assert orders is not None
            return rows.batch_tasks(fill.served, plan, written(decoded, orders, work), self.xp)

        def finish(work: SplitWork) -> None:
            missing = rows.missing(pieces)
            try:
                for (p, a, _), piece in zip(missing, decode(missing), strict=True):
                    fill.write(int(rows.base[p]) + a, piece, work)
            except (ReadError, SourceNotFoundError) as err:
                # rows this epoch did not deliver (drop_last, another worker's share): the
                # epoch is whole without them, only the cache is not
                warnings.warn(
                    "not keeping the decoded rows of this epoch: the rows it left out, "
                    f"which the cache holds too, could not be read ({err}). The next epoch "
                    "reads the files again",
                    CacheWarning,
                    stacklevel=1,
                )
                return
            complete = fill.complete(request.dataset)
            if complete is not None:
                cache.adopt(complete)
            stats.cache_bytes = cache.nbytes

        return Reading(
            lay_out,
            decode=decode,
            order=order,
            helpers=request.threads.fill,
            helper_name="tabloader-cache-fill",
            gathers=gathers,
            finish=finish,
        )


def stream_rest(backend: Backend, request: ReadRequest, rows: int) -> Iterator[list[Part]]:
    """The chunks of ``request``'s plan from row ``rows`` of its delivery order on, read
    from the files by ``backend``: exactly what the cache would have delivered."""
    rest = request.plan.after_rows(rows)
    yield from backend.read_chunks(replace(request, plan=rest))
