"""Chunk to batches: cut a chunk's rows into whole batches, carry the rest.

The code here is written once against the array operations numpy and cupy share
(``take``, ``concatenate``, ``empty``, basic slicing) and receives the array namespace as
``xp``, so the CPU tests exercise the same path the GPU backend runs.

A chunk arrives as a list of *segments*. A segment maps each block name to a 2-D
row-major array ``[rows, k]``; all arrays of a segment have the same row count. A
segment comes with an index array (its rows' delivery order, gathered batch by batch)
or with None (rows already in delivery order, so full batches are zero-copy slices).
A :class:`Layout` says which columns share a block and how batches are delivered:

- By default every column is its own block, and a batch is a dict of 1-D arrays.
- The ``"stacked"`` layout keeps cats, conts and labels in three blocks and delivers
  them whole (``[B, k]``), the shape frameworks want, without a further copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Block", "Layout", "Part", "Segment", "cut_batches", "empty_segment", "segment_rows"]

_ALIGN = 64

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
    ) -> Layout:
        """Layout for columns grouped by kind (``cats``/``conts``/``labels``).

        Examples:
            >>> i8, f4 = np.dtype("int64"), np.dtype("float32")
            >>> kinds = {"cats": ["a", "b"], "conts": ["x"], "labels": ["y"]}
            >>> dtypes = {"a": i8, "b": i8, "x": f4, "y": f4}
            >>> [b.columns for b in Layout.build(kinds, dtypes, stacked=False).blocks]
            [('a',), ('b',), ('x',), ('y',)]
            >>> Layout.build(kinds, dtypes, stacked=True).outputs
            (('cats', 'cats', None), ('conts', 'conts', None), ('labels', 'labels', None))
        """
        if stacked:
            blocks = tuple(
                Block(kind, tuple(cols), dtypes[cols[0]]) for kind, cols in kinds.items() if cols
            )
            return cls(blocks, tuple((b.name, b.name, None) for b in blocks))
        columns = [c for cols in kinds.values() for c in cols]
        blocks = tuple(Block(c, (c,), dtypes[c]) for c in columns)
        return cls(blocks, tuple((c, c, 0) for c in columns))

    def deliver(self, segment: Segment) -> dict[str, Any]:
        return {
            key: segment[block] if j is None else segment[block][:, j]
            for key, block, j in self.outputs
        }


def segment_rows(segment: Segment) -> int:
    return int(next(iter(segment.values())).shape[0])


Part = tuple[Segment, Any]
"""A segment and the order to deliver its rows in: an index array, or None (rows
already in delivery order)."""


def _rows(part: Part) -> int:
    segment, index = part
    return segment_rows(segment) if index is None else len(index)


def _cut(part: Part, start: int, stop: int, xp: Any) -> Segment:
    """Rows ``start:stop`` of a part: a view without an index, a gather with one.

    Gathering batch by batch, rather than reordering the whole chunk first, keeps only
    the batches in flight in memory besides the chunk.
    """
    segment, index = part
    if index is None:
        return {name: array[start:stop] for name, array in segment.items()}
    rows = index[start:stop]
    shapes = [(name, array.shape[1], array.dtype) for name, array in segment.items()]
    out = empty_segment(len(rows), shapes, xp)
    for name, array in out.items():
        xp.take(segment[name], rows, axis=0, out=array)
    return out


def empty_segment(rows: int, shapes: Iterable[tuple[str, int, Any]], xp: Any) -> Segment:
    """A segment of ``(name, columns, dtype)`` blocks carved out of one allocation.

    One allocation per segment keeps a pooled allocator's buffers few and large, so they
    are reused rather than mapped afresh. Every block starts 64-byte aligned.

    Examples:
        >>> segment = empty_segment(3, [("a", 2, "int64"), ("x", 1, "float32")], np)
        >>> {name: (array.shape, str(array.dtype)) for name, array in segment.items()}
        {'a': ((3, 2), 'int64'), 'x': ((3, 1), 'float32')}
    """
    shapes = [(name, k, np.dtype(dtype)) for name, k, dtype in shapes]
    sizes = [rows * k * dtype.itemsize for _, k, dtype in shapes]
    spans = [-(-size // _ALIGN) * _ALIGN for size in sizes]
    memory = xp.empty((sum(spans),), np.uint8)
    segment: Segment = {}
    offset = 0
    for (name, k, dtype), size, span in zip(shapes, sizes, spans, strict=True):
        block = memory[offset : offset + size].view(dtype)
        segment[name] = block.reshape(rows, k)
        offset += span
    return segment


def _concat(parts: Sequence[Segment], xp: Any) -> Segment:
    if len(parts) == 1:
        return parts[0]
    rows = sum(segment_rows(p) for p in parts)
    shapes = [(name, array.shape[1], array.dtype) for name, array in parts[0].items()]
    out = empty_segment(rows, shapes, xp)
    for name, array in out.items():
        xp.concatenate([p[name] for p in parts], axis=0, out=array)
    return out


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
