"""Chunk to batches: permute a chunk's rows, cut them into whole batches, carry the rest.

The code here is written once against the array operations numpy and cupy share
(``take``, ``concatenate``, ``empty``, basic slicing) and receives the array namespace as
``xp``, so the CPU tests exercise the same path the GPU backend runs.

A chunk arrives as a list of *segments*. A segment maps each block name to a 2-D
row-major array ``[rows, k]``; all arrays of a segment have the same row count. A
:class:`Layout` says which columns share a block and how batches are delivered:

- When shuffling, columns of one dtype share a block: a shuffled gather then fetches
  each row's values with one memory access instead of one per column, several times
  faster than gathering column by column.
- Without shuffling, every column is its own block, so batches are zero-copy views of
  the decoded data.
- The ``"stacked"`` layout keeps cats, conts and labels in three blocks and delivers
  them whole (``[B, k]``), the shape frameworks want, without a further copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Block", "Layout", "Part", "Segment", "cut_batches", "segment_rows"]

Segment = dict[str, Any]
"""Block name -> 2-D array ``[rows, k]`` (numpy or cupy), all with the same row count."""


@dataclass(frozen=True)
class Block:
    """Columns stored side by side in one row-major 2-D array of one dtype."""

    name: str
    columns: tuple[str, ...]
    dtype: np.dtype[Any]


@dataclass(frozen=True)
class Layout:
    """How columns are grouped into blocks, and how a batch is delivered from them.

    ``outputs`` maps each key of a delivered batch to ``(block name, column index)``;
    a column index of ``None`` delivers the whole 2-D block.
    """

    blocks: tuple[Block, ...]
    outputs: tuple[tuple[str, str, int | None], ...]

    @classmethod
    def build(
        cls,
        kinds: Mapping[str, Sequence[str]],
        dtypes: Mapping[str, np.dtype[Any]],
        *,
        stacked: bool,
        shuffle: bool,
    ) -> Layout:
        """Layout for columns grouped by kind (``cats``/``conts``/``labels``).

        Examples:
            >>> i8, f4 = np.dtype("int64"), np.dtype("float32")
            >>> kinds = {"cats": ["a", "b"], "conts": ["x"], "labels": ["y"]}
            >>> dtypes = {"a": i8, "b": i8, "x": f4, "y": f4}
            >>> shuffled = Layout.build(kinds, dtypes, stacked=False, shuffle=True)
            >>> [b.columns for b in shuffled.blocks]
            [('a', 'b'), ('x', 'y')]
            >>> ordered = Layout.build(kinds, dtypes, stacked=False, shuffle=False)
            >>> [b.columns for b in ordered.blocks]
            [('a',), ('b',), ('x',), ('y',)]
            >>> Layout.build(kinds, dtypes, stacked=True, shuffle=True).outputs
            (('cats', 'cats', None), ('conts', 'conts', None), ('labels', 'labels', None))
        """
        if stacked:
            blocks = tuple(
                Block(kind, tuple(cols), dtypes[cols[0]]) for kind, cols in kinds.items() if cols
            )
            return cls(blocks, tuple((b.name, b.name, None) for b in blocks))
        columns = [c for cols in kinds.values() for c in cols]
        if not shuffle:
            blocks = tuple(Block(c, (c,), dtypes[c]) for c in columns)
            return cls(blocks, tuple((c, c, 0) for c in columns))
        by_dtype: dict[np.dtype[Any], list[str]] = {}
        for c in columns:
            by_dtype.setdefault(dtypes[c], []).append(c)
        blocks = tuple(Block(str(dtype), tuple(cols), dtype) for dtype, cols in by_dtype.items())
        where = {c: (b.name, j) for b in blocks for j, c in enumerate(b.columns)}
        return cls(blocks, tuple((c, *where[c]) for c in columns))

    def deliver(self, segment: Segment) -> dict[str, Any]:
        return {
            key: segment[block] if j is None else segment[block][:, j]
            for key, block, j in self.outputs
        }


def segment_rows(segment: Segment) -> int:
    return int(next(iter(segment.values())).shape[0])


Part = tuple[Segment, Any]
"""A segment and the order to deliver its rows in: an index array (a shuffled chunk),
or None (rows in stored order)."""


def _rows(part: Part) -> int:
    segment, index = part
    return segment_rows(segment) if index is None else len(index)


def _cut(part: Part, start: int, stop: int, xp: Any) -> Segment:
    """Rows ``start:stop`` of a part: a view in stored order, a gather when indexed.

    Gathering batch by batch, rather than permuting the whole chunk first, keeps only
    the batches in flight in memory besides the chunk, and a row-major block fetches
    each row's values together.
    """
    segment, index = part
    if index is None:
        return {name: array[start:stop] for name, array in segment.items()}
    rows = index[start:stop]
    return {name: xp.take(array, rows, axis=0) for name, array in segment.items()}


def _concat(parts: Sequence[Segment], xp: Any) -> Segment:
    if len(parts) == 1:
        return parts[0]
    return {name: xp.concatenate([p[name] for p in parts], axis=0) for name in parts[0]}


def cut_batches(
    parts: Iterable[Part],
    *,
    batch_size: int,
    drop_last: bool,
    layout: Layout,
    xp: Any,
) -> Iterator[dict[str, Any]]:
    """Cut a stream of parts into batches of exactly ``batch_size`` rows.

    Rows left at the end of a part are carried into the next one; only the very last
    batch may be short, and ``drop_last`` drops it. Without an index, full batches
    inside a segment are views of it (no copy); a batch that straddles parts is
    concatenated.
    """
    pending: list[Segment] = []
    pending_rows = 0
    source = iter(parts)
    while (part := next(source, None)) is not None:
        rows = _rows(part)
        pos = 0
        if pending_rows:
            pos = min(batch_size - pending_rows, rows)
            pending.append(_cut(part, 0, pos, xp))
            pending_rows += pos
            if pending_rows == batch_size:
                yield layout.deliver(_concat(pending, xp))
                pending, pending_rows = [], 0
        if not pending_rows:
            while rows - pos >= batch_size:
                yield layout.deliver(_cut(part, pos, pos + batch_size, xp))
                pos += batch_size
            if pos < rows:
                pending, pending_rows = [_cut(part, pos, rows, xp)], rows - pos
        # Let go of a finished chunk before waiting for the next one.
        del part
    if pending_rows and not drop_last:
        yield layout.deliver(_concat(pending, xp))
