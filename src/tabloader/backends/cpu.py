"""CPU backend: numpy lays out a chunk's decoded pieces, shuffles them and slices batches.

Decoding is `tabloader.decode.host`'s, host memory `tabloader.hostmem`'s. A decoded column
is a 1-D numpy array, a list column a `Ragged`, and a vector column (a fixed-size list) a
``[rows, k]`` array taking ``k`` places of its block.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np

from tabloader.batches import Ragged, empty_segment
from tabloader.decode.host import INTERLEAVE_ROWS, decode_pieces, interleave, put_column
from tabloader.hostmem import BufferPool, PooledNumpy
from tabloader.permutation import inverse_permutation
from tabloader.stages import Reading, SplitWork, read_in_stages

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from tabloader.batches import Block, Part, Segment
    from tabloader.plan import EpochPlan
    from tabloader.stages import ReadRequest
    from tabloader.stats import StatsRecorder

__all__ = ["CPUBackend"]

# How often a reader waiting for an older chunk to be let go looks again.
_ROOM_POLL_SECONDS = 0.002


class CPUBackend:
    """Chunks in host memory as numpy arrays."""

    name = "cpu"
    groups_columns = False
    """Each column is a block of its own: unshuffled batches are views of decoded data."""

    def __init__(self) -> None:
        self.xp = PooledNumpy(BufferPool())

    def scope(self) -> contextlib.AbstractContextManager[None]:
        """Nothing to set up in a thread that works on host arrays."""
        return contextlib.nullcontext()

    def read_chunks(self, request: ReadRequest) -> Iterator[list[Part]]:
        plan = request.plan
        columns = [c for b in request.blocks for c in b.columns]
        decode = partial(
            decode_pieces, request.dataset, columns=columns, blocks=request.blocks,
            fill_null=request.fill_null, stats=request.stats,
        )  # fmt: skip
        reading = Reading(
            partial(self._lay_out, request),
            decode=decode,
            order=partial(_chunk_places, plan),
            helpers=request.threads.layout,
        )
        return read_in_stages(plan, reading)

    def _lay_out(
        self,
        request: ReadRequest,
        decoded: Iterator[dict[str, NDArray[Any]]] | None,
        places: Iterator[tuple[NDArray[np.int64], NDArray[np.int64]] | None] | None,
        work: SplitWork,
    ) -> Iterator[list[Part]]:
        """The reader: each chunk's decoded pieces laid out, in stored order or each row
        at its place in the chunk's delivery order."""
        assert decoded is not None
        assert places is not None
        plan, blocks, stats = request.plan, request.blocks, request.stats
        held: deque[weakref.ref[Any]] = deque()  # the memory of the chunks laid out
        for chunk, chunk_places in zip(range(plan.num_chunks), places, strict=True):
            s = plan.chunk_pieces(chunk)
            arrays = islice(decoded, s.stop - s.start)
            if chunk_places is None:
                yield [(self._piece_segment(a, blocks, stats, work), None) for a in arrays]
                continue
            _wait_for_room(held, request)
            segment = self._ordered_segment(arrays, *chunk_places, blocks, stats, work)
            held.append(weakref.ref(_owner(next(iter(segment.values())))))
            yield [(segment, None)]
            del segment

    def _ordered_segment(
        self,
        pieces: Iterable[dict[str, NDArray[Any]]],
        order: NDArray[np.int64],
        places: NDArray[np.int64],
        blocks: Sequence[Block],
        stats: StatsRecorder,
        work: SplitWork,
    ) -> Segment:
        """A chunk with row ``i`` written at ``places[i]``: the rows of ``order`` (all of
        the chunk's, or those a resumed plan delivers) in that order, so that every batch
        is a slice of it; a row left out is written to a spare row after them.

        Every decoded value is written once, straight to its place: one scatter per
        column, into a column of a few MiB that stays in the CPU's cache (rows dealt
        into batches in stored order, ``shuffle_within_batch=False``, are written in
        one sequential run per batch). Columns of a stacked block are interleaved a few
        thousand rows at a time and written out a whole row at a time. List columns
        stay where they are and are reordered lazily, as each batch is cut.
        """
        spare = int(len(order) < len(places))
        segment = empty_segment(
            len(order) + spare,
            [(b.name, b.width, b.dtype) for b in blocks if not b.ragged],
            self.xp,
        )
        lists: dict[str, list[Ragged]] = {b.name: [] for b in blocks if b.ragged}
        offset = 0
        for arrays in pieces:
            started = time.perf_counter()
            n = len(next(iter(arrays.values())))
            rows = places[offset : offset + n]
            jobs: list[tuple[int, Callable[[], None]]] = []
            for b in blocks:
                if b.ragged:
                    ragged: Any = arrays[b.columns[0]]
                    lists[b.name].append(ragged)
                    continue
                out = segment[b.name]
                if len(b.columns) == 1 and arrays[b.columns[0]].ndim == 1:
                    # scatter and cast in one pass
                    jobs.append((n, partial(out[:, 0].__setitem__, rows, arrays[b.columns[0]])))
                    continue
                for share in work.shares(n):
                    cols = [arrays[c][share] for c in b.columns]
                    job = partial(self._scatter_rows, cols, rows[share], out)
                    jobs.append((len(cols[0]) * b.width, job))
            work.run(jobs)
            offset += n
            stats.assemble_seconds += time.perf_counter() - started
        if spare:
            segment = {name: array[: len(order)] for name, array in segment.items()}
        if lists:
            # Lists stay where they are, reordered lazily: each batch gathers its rows'
            # values once, when it is cut.
            started = time.perf_counter()
            for b in blocks:
                if b.ragged:
                    whole = Ragged.concatenate(lists[b.name])
                    values = whole.values.astype(b.dtype, copy=False)
                    segment[b.name] = Ragged(values, whole.offsets, rows=order)
            stats.assemble_seconds += time.perf_counter() - started
        return segment

    def _scatter_rows(
        self, arrays: Sequence[NDArray[Any]], rows: NDArray[np.int64], out: NDArray[Any]
    ) -> None:
        """``out[rows[i], j] = arrays[j][i]``: columns interleaved, rows scattered.

        Some thousands of rows at a time are interleaved in a scratch block, then
        written out row by row: every row of ``out`` is written once, whole, where a
        column-by-column scatter would sweep all of ``out`` once per column. Each row
        moves as one opaque item of its width (faster than numpy's copy of a row of
        items, which sets up a strided copy per row; see docs/performance.md); the whole
        stacked layout then costs what the column layout's scatters cost.
        """
        step = INTERLEAVE_ROWS
        scratch = np.empty((min(step, len(rows)), out.shape[1]), out.dtype)
        row = np.dtype((np.void, scratch.strides[0]))
        whole_rows = out.view(row)[:, 0]
        for start in range(0, len(rows), step):
            stop = min(start + step, len(rows))
            block = scratch[: stop - start]
            j = 0
            for array in arrays:
                j = put_column(block, j, array[start:stop])
            whole_rows[rows[start:stop]] = block.view(row)[:, 0]

    def _piece_segment(
        self,
        piece: dict[str, NDArray[Any]],
        blocks: Sequence[Block],
        stats: StatsRecorder,
        work: SplitWork,
    ) -> Segment:
        """One piece as a segment: zero-copy where a block is one column of its dtype;
        stacked blocks are interleaved by ``work``'s threads, a share of the rows each."""
        started = time.perf_counter()
        segment: Segment = {}
        jobs: list[tuple[int, Callable[[], None]]] = []
        for b in blocks:
            cols = [piece[c] for c in b.columns]
            if b.ragged:
                decoded: Any = cols[0]
                values = decoded.values.astype(b.dtype, copy=False)
                segment[b.name] = Ragged(values, decoded.offsets)
                continue
            n = len(cols[0])
            if len(cols) == 1 and cols[0].dtype == b.dtype:
                segment[b.name] = cols[0].reshape(n, -1)  # zero-copy view of the decoded data
                continue
            out = self.xp.empty((n, b.width), b.dtype)
            for share in work.shares(n):
                part = [c[share] for c in cols]
                jobs.append((len(part[0]) * b.width, partial(interleave, part, out[share])))
            segment[b.name] = out
        work.run(jobs)
        stats.assemble_seconds += time.perf_counter() - started
        return segment


def _owner(array: Any) -> Any:
    """The object that owns ``array``'s memory (a pooled buffer's memoryview)."""
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array


def _wait_for_room(held: deque[weakref.ref[Any]], request: ReadRequest) -> None:
    """Wait until at most ``request.chunks_ahead`` of the chunks laid out before are
    still held downstream (their batches are views), or the consumer runs out of chunks.

    Without it a new chunk's memory was mapped while the one before the last was still
    held by its last few batches, and the pool kept three chunks instead of two.
    """
    waiting = request.consumer_waiting
    while waiting is not None:
        for ref in [r for r in held if r() is None]:
            held.remove(ref)
        if len(held) <= request.chunks_ahead or waiting.wait(_ROOM_POLL_SECONDS):
            return  # room, or the consumer keeps batches: lay out the next chunk anyway


def _chunk_places(
    plan: EpochPlan, chunk: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]] | None:
    """The chunk's delivery order and each of its rows' place in it (a row the plan does
    not deliver: the place after the last); None without shuffling."""
    order = plan.batch_order(chunk)
    if order is None:
        return None
    rows = plan.stored_rows(chunk)
    if len(order) == rows:
        return order, inverse_permutation(order)
    places = np.full(rows, len(order), dtype=np.int64)
    places[order] = np.arange(len(order), dtype=np.int64)
    return order, places
