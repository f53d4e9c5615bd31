"""Chunk to batches: cut a chunk's rows into whole batches, carry the rest.

The code here is written once against the array operations numpy and cupy share
(``take``, ``concatenate``, ``empty``, basic slicing) and receives the array namespace as
``xp``, so the CPU tests exercise the same path the GPU backend runs.

A chunk arrives as a list of *segments*. A segment maps each block name to a 2-D
row-major array ``[rows, k]``; all arrays of a segment have the same row count. A
segment comes with an index array (its rows' delivery order, gathered batch by batch)
or with None (rows already in delivery order, so full batches are zero-copy slices).
A `Layout` says which columns share a block and how batches are delivered:

- By default every column is its own block, and a batch is a dict of 1-D arrays.
- The ``"stacked"`` layout keeps cats, conts and labels in three blocks and delivers
  them whole (``[B, k]``), the shape frameworks want, without a further copy.

A *vector* column (a parquet ``fixed_size_list`` of ``k`` numbers a row, an embedding)
takes ``k`` places of its block where a scalar takes one: a block of its own delivered
whole as ``[B, k]``, or ``k`` consecutive places of its kind's stacked block. Decoded, it
is a ``[rows, k]`` array where a scalar column is a 1-D one.
"""

from __future__ import annotations

import sys
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Block",
    "Layout",
    "column_width",
    "Part",
    "Ragged",
    "host_int",
    "value_rows",
    "Segment",
    "cut_batches",
    "detached",
    "empty_segment",
    "lists_as_output",
    "segment_rows",
]

_ALIGN = 64

Segment = dict[str, Any]
"""Block name -> 2-D array ``[rows, k]`` (numpy or cupy), all with the same row count."""


@dataclass(frozen=True)
class Block:
    """Columns stored side by side in one row-major 2-D array of one dtype."""

    name: str
    columns: tuple[str, ...]
    dtype: np.dtype[Any]
    ragged: bool = False
    """A list column (one column, held as `Ragged` rather than a 2-D array)."""
    column_major: bool = False
    """Each column contiguous (a Fortran-ordered ``[rows, k]`` array): a delivered column
    of a wide block is then a contiguous array, and one gather serves all ``k``."""
    checked: tuple[str, ...] = ()
    """Columns whose values must be checked to fit ``dtype`` when read (the footers'
    statistics could not tell): see `tabloader.casting`."""
    vectors: tuple[tuple[str, int], ...] = ()
    """The vector columns among ``columns``, each with its ``k``: the places it takes
    (a scalar column takes one)."""

    @property
    def width(self) -> int:
        """The block's places a row: ``[rows, width]``."""
        return len(self.columns) + sum(k - 1 for _, k in self.vectors)

    def spans(self) -> list[tuple[str, int, int]]:
        """Each column with the places it takes: ``(column, first, stop)``.

        Examples:
            >>> f4 = np.dtype("float32")
            >>> Block("conts", ("x", "emb", "y"), f4, vectors=(("emb", 3),)).spans()
            [('x', 0, 1), ('emb', 1, 4), ('y', 4, 5)]
        """
        k = dict(self.vectors)
        widths = [k.get(c, 1) for c in self.columns]
        stops = np.cumsum(widths).tolist()
        return [(c, stop - w, stop) for c, w, stop in zip(self.columns, widths, stops, strict=True)]


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
        grouped: bool = False,
        widths: Mapping[str, int] | None = None,
        vectors_apart: bool = False,
    ) -> Layout:
        """Layout for columns grouped by kind (``cats``/``conts``/``labels``).

        Without ``stacked``, each column is delivered alone; ``grouped`` then keeps the
        columns of one dtype side by side in one column-major block (the GPU's layout:
        one gather a batch per dtype instead of one per column), else each column is a
        block of its own (the CPU's: zero-copy views of the decoded columns).

        ``widths`` names the vector columns and their ``k``: each takes ``k``
        consecutive places of its kind's stacked block, or, delivered alone, a
        row-major block of its own (a row's ``k`` values side by side), delivered whole.
        ``vectors_apart`` keeps them in blocks of their own when stacked too (a cache
        stacked for gathering, whose vectors are delivered alone).

        Examples:
            >>> f4 = np.dtype("float32")
            >>> kinds, dtypes = {"conts": ["x", "emb"]}, {"x": f4, "emb": f4}
            >>> Layout.build(kinds, dtypes, stacked=True, widths={"emb": 4}).blocks[0].width
            5
            >>> Layout.build(kinds, dtypes, stacked=False, widths={"emb": 4}).outputs
            (('x', 'x', 0), ('emb', 'emb', None))

        Examples:
            >>> i8, f4 = np.dtype("int64"), np.dtype("float32")
            >>> kinds = {"cats": ["a", "b"], "conts": ["x"], "labels": ["y"]}
            >>> dtypes = {"a": i8, "b": i8, "x": f4, "y": f4}
            >>> [b.columns for b in Layout.build(kinds, dtypes, stacked=False).blocks]
            [('a',), ('b',), ('x',), ('y',)]
            >>> Layout.build(kinds, dtypes, stacked=True).outputs
            (('cats', 'cats', None), ('conts', 'conts', None), ('labels', 'labels', None))
            >>> grouped = Layout.build(kinds, dtypes, stacked=False, grouped=True)
            >>> [(b.name, b.columns) for b in grouped.blocks], grouped.outputs[2]
            ([('<int64>', ('a', 'b')), ('<float32>', ('x', 'y'))], ('x', '<float32>', 0))
        """
        widths = dict(widths or {})

        def places(cols: Sequence[str]) -> tuple[tuple[str, int], ...]:
            return tuple((c, widths[c]) for c in cols if c in widths)

        columns = [c for cols in kinds.values() for c in cols]
        vectors = tuple(
            Block(c, (c,), dtypes[c], vectors=((c, widths[c]),)) for c in columns if c in widths
        )
        if stacked:
            kept = {
                kind: [c for c in cols if not (vectors_apart and c in widths)]
                for kind, cols in kinds.items()
            }
            blocks = tuple(
                Block(kind, tuple(cols), dtypes[cols[0]], vectors=places(cols))
                for kind, cols in kept.items()
                if cols
            ) + (vectors if vectors_apart else ())
            return cls(blocks, tuple((b.name, b.name, None) for b in blocks))
        whole = tuple((b.name, b.name, None) for b in vectors)
        scalars = [c for c in columns if c not in widths]
        if not grouped:
            blocks = tuple(Block(c, (c,), dtypes[c]) for c in scalars)
            where: dict[str, tuple[str, str, int | None]] = {o[0]: o for o in whole}
            where |= {c: (c, c, 0) for c in scalars}
            return cls(blocks + vectors, tuple(where[c] for c in columns))
        by_dtype: dict[np.dtype[Any], list[str]] = {}
        for c in scalars:
            by_dtype.setdefault(np.dtype(dtypes[c]), []).append(c)
        blocks = tuple(
            Block(f"<{dtype}>", tuple(cols), dtype, column_major=True)
            for dtype, cols in by_dtype.items()
        )
        outputs: dict[str, tuple[str, str, int | None]] = {o[0]: o for o in whole}
        outputs |= {c: (c, b.name, j) for b in blocks for j, c in enumerate(b.columns)}
        return cls(blocks + vectors, tuple(outputs[c] for c in columns))

    def with_lists(self, names: Sequence[str], dtypes: Mapping[str, np.dtype[Any]]) -> Layout:
        """This layout plus list columns ``names``, each its own ragged block, delivered
        whole under its own name.

        Examples:
            >>> layout = Layout.build({"cats": ["a"]}, {"a": np.dtype("int64")}, stacked=True)
            >>> layout.with_lists(["g"], {"g": np.dtype("int64")}).outputs
            (('cats', 'cats', None), ('g', 'g', None))
        """
        blocks = tuple(Block(n, (n,), dtypes[n], ragged=True) for n in names)
        return Layout(
            self.blocks + blocks, self.outputs + tuple((b.name, b.name, None) for b in blocks)
        )

    def deliver(self, segment: Segment) -> dict[str, Any]:
        return {
            key: segment[block] if j is None else segment[block][:, j]
            for key, block, j in self.outputs
        }


def column_width(array: Any) -> int:
    """The places a decoded column takes in its block: 1 for a 1-D array, ``k`` for a
    vector column's ``[rows, k]``."""
    return 1 if array.ndim == 1 else int(array.shape[1])


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
    lists = {name: a for name, a in segment.items() if isinstance(a, Ragged)}
    shapes = [(name, a.shape[1], a.dtype) for name, a in segment.items() if name not in lists]
    out = empty_segment(len(rows), shapes, xp, column_major=_column_major(segment))
    for name, array in out.items():
        xp.take(segment[name], rows, axis=0, out=array)
    out.update({name: ragged.take(rows) for name, ragged in lists.items()})
    return out


def _column_major(segment: Segment) -> set[str]:
    """The blocks of ``segment`` laid out column-major (Fortran-ordered, several columns)."""
    return {
        name
        for name, a in segment.items()
        if not isinstance(a, Ragged) and a.shape[1] > 1 and not a.flags.c_contiguous
    }


def empty_segment(
    rows: int,
    shapes: Iterable[tuple[str, int, Any]],
    xp: Any,
    *,
    column_major: bool | Container[str] = False,
) -> Segment:
    """A segment of ``(name, columns, dtype)`` blocks carved out of one allocation.

    One allocation per segment keeps a pooled allocator's buffers few and large, so they
    are reused rather than mapped afresh. Every block starts 64-byte aligned. With
    ``column_major`` (all blocks, or the names of some) a block's columns are contiguous
    (a Fortran-ordered 2-D array).

    Examples:
        >>> segment = empty_segment(3, [("a", 2, "int64"), ("x", 1, "float32")], np)
        >>> {name: (array.shape, str(array.dtype)) for name, array in segment.items()}
        {'a': ((3, 2), 'int64'), 'x': ((3, 1), 'float32')}
        >>> empty_segment(3, [("a", 2, "int64")], np, column_major=True)["a"].strides
        (8, 24)
    """
    shapes = [(name, k, np.dtype(dtype)) for name, k, dtype in shapes]
    sizes = [rows * k * dtype.itemsize for _, k, dtype in shapes]
    spans = [-(-size // _ALIGN) * _ALIGN for size in sizes]
    memory = xp.empty((sum(spans),), np.uint8)
    segment: Segment = {}
    offset = 0
    for (name, k, dtype), size, span in zip(shapes, sizes, spans, strict=True):
        block = memory[offset : offset + size].view(dtype)
        by_column = column_major if isinstance(column_major, bool) else name in column_major
        segment[name] = block.reshape(k, rows).T if by_column else block.reshape(rows, k)
        offset += span
    return segment


def _concat(parts: Sequence[Segment], xp: Any) -> Segment:
    if len(parts) == 1:
        return parts[0]
    rows = sum(segment_rows(p) for p in parts)
    lists = [name for name, a in parts[0].items() if isinstance(a, Ragged)]
    shapes = [(name, a.shape[1], a.dtype) for name, a in parts[0].items() if name not in lists]
    out = empty_segment(rows, shapes, xp, column_major=_column_major(parts[0]))
    for name, array in out.items():
        xp.concatenate([p[name] for p in parts], axis=0, out=array)
    out.update({name: Ragged.concatenate([p[name] for p in parts]) for name in lists})
    return out


def cut_batches(
    parts: Iterable[Part],
    *,
    batch_size: int,
    layout: Layout,
    xp: Any,
) -> Iterator[dict[str, Any]]:
    """Cut a stream of parts into batches of exactly ``batch_size`` rows.

    Rows left at the end of a part are carried into the next one; only the very last
    batch may be short (with ``drop_last`` the plan holds no such rows: a rank keeps
    whole batches' worth, see `tabloader.plan`). Without an index, full batches
    inside a segment are views of it (no copy); a batch that straddles parts is
    concatenated. On a GPU the gathers are only issued: the loader orders its consumer
    after them once the batch is finished (``xp.hand_over()``).
    """

    def complete(segment: Segment) -> dict[str, Any]:
        return layout.deliver(segment)

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
                yield complete(_concat(pending, xp))
                pending, pending_rows = [], 0
        if not pending_rows:
            while rows - pos >= batch_size:
                yield complete(_cut(part, pos, pos + batch_size, xp))
                pos += batch_size
            if pos < rows:
                pending, pending_rows = [_cut(part, pos, rows, xp)], rows - pos
        # Let go of a finished chunk before waiting for the next one.
        del part
    if pending_rows:
        yield complete(_concat(pending, xp))


def detached(batch: Mapping[str, Any]) -> dict[str, Any]:
    """``batch`` with every array that is a view into a larger buffer copied out of it.

    The loader delivers an epoch's last batch detached: a training loop's loop variable
    keeps that batch past the end of the epoch, and as a view it would keep its whole
    chunk in memory while the next epoch fills its first chunks. One batch's copy an
    epoch costs little; list columns (gathered afresh) are left as they are.

    Examples:
        >>> chunk = np.arange(10)
        >>> batch = detached({"a": chunk[8:], "b": np.arange(2)})
        >>> batch["a"].base is None, batch["a"].tolist()
        (True, [8, 9])
    """
    return {
        key: value.copy() if getattr(value, "base", None) is not None else value
        for key, value in batch.items()
    }


# -- list columns -----------------------------------------------------------------------


def _module(array: Any) -> Any:
    """numpy or cupy, whichever ``array`` belongs to."""
    return sys.modules[type(array).__module__.split(".")[0]]


def host_int(value: Any) -> int:
    """A 0-d array (numpy or cupy) as a Python int: an explicit copy to the host, where
    a size must be known to allocate."""
    get = getattr(value, "get", None)
    return int(get() if callable(get) else value)


def value_rows(offsets: Any, total: int) -> Any:
    """The row each of the ``total`` values laid out by ``offsets`` (from 0) belongs to.

    A ``searchsorted`` over the row ends, not ``repeat(arange(rows), lengths)``: cupy
    before v14 refuses an array of repeats.

    Examples:
        >>> value_rows(np.array([0, 2, 2, 5]), 5).tolist()
        [0, 0, 2, 2, 2]
    """
    xp = _module(offsets)
    return xp.searchsorted(offsets[1:], xp.arange(total, dtype=np.int64), side="right")


@dataclass(frozen=True)
class Ragged:
    """A list column: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``.

    Rows are selected like a 2-D block's (slices are views, `take` gathers), so
    a list column travels through chunks and batches next to the dense blocks. Works
    on numpy and cupy arrays alike. ``offsets`` need not start at 0 (a slice of rows
    shares its parent's values).

    Examples:
        >>> r = Ragged(np.array([1, 2, 3, 4, 5, 6]), np.array([0, 2, 2, 5, 6]))
        >>> len(r), r[1:3].offsets.tolist()
        (4, [2, 2, 5])
        >>> t = r.take(np.array([3, 0, 2]))
        >>> t.values.tolist(), t.offsets.tolist()
        ([6, 1, 2, 3, 4, 5], [0, 1, 3, 6])
    """

    values: Any
    offsets: Any
    rows: Any = None
    """If set, row ``i`` is row ``rows[i]`` of ``(values, offsets)``: a reordering not
    carried out yet, so that a shuffled chunk's lists are gathered once, batch by
    batch, rather than reordered whole first."""

    @property
    def shape(self) -> tuple[int]:
        return (len(self),)

    @property
    def dtype(self) -> Any:
        return self.values.dtype

    def __len__(self) -> int:
        return len(self.offsets) - 1 if self.rows is None else len(self.rows)

    def __getitem__(self, rows: slice) -> Ragged:
        start, stop, step = rows.indices(len(self))
        if step != 1:
            raise ValueError("Ragged rows can only be sliced with step 1")
        if self.rows is not None:
            return Ragged(self.values, self.offsets, self.rows[start:stop])
        return Ragged(self.values, self.offsets[start : max(stop, start) + 1])

    def lengths(self) -> Any:
        if self.rows is not None:
            return self.offsets[1:][self.rows] - self.offsets[:-1][self.rows]
        return self.offsets[1:] - self.offsets[:-1]

    def take(self, rows: Any) -> Ragged:
        """Rows ``rows`` (an index array), gathered into fresh, compact arrays.

        Vectorised: each output value's source is its row's start plus its place in
        the row (see `value_rows`).
        """
        if self.rows is not None:
            rows = self.rows[rows]
        xp = _module(self.offsets)
        starts = self.offsets[:-1][rows]
        lengths = self.offsets[1:][rows] - starts
        offsets = xp.zeros(len(rows) + 1, dtype=np.int64)
        xp.cumsum(lengths, out=offsets[1:])
        total = host_int(offsets[-1])
        row = value_rows(offsets, total)
        source = starts[row] + (xp.arange(total, dtype=np.int64) - offsets[:-1][row])
        return Ragged(self.values[source], offsets)

    def compact(self) -> Ragged:
        """The same rows with offsets starting at 0 and values holding only them."""
        if self.rows is not None:
            return self.take(_module(self.rows).arange(len(self.rows)))
        first, last = host_int(self.offsets[0]), host_int(self.offsets[-1])
        if first == 0 and last == len(self.values):
            return self
        return Ragged(self.values[first:last], self.offsets - first)

    @staticmethod
    def concatenate(parts: Sequence[Ragged]) -> Ragged:
        """The rows of ``parts`` one after the other."""
        if len(parts) == 1:
            return parts[0].compact()
        compact = [p.compact() for p in parts]
        xp = _module(compact[0].offsets)
        shifts = np.cumsum([0] + [len(p.values) for p in compact[:-1]])
        offsets = xp.concatenate(
            [compact[0].offsets[:1]]
            + [p.offsets[1:] + int(shift) for p, shift in zip(compact, shifts, strict=True)]
        )
        return Ragged(xp.concatenate([p.values for p in compact]), offsets)

    def to_dense(self, width: int, pad: float, name: str) -> Any:
        """A ``[rows, width]`` array, each row's values then ``pad``.

        Raises [`InvalidArgumentError`][tabloader.errors.InvalidArgumentError] if a row is longer
        than ``width``: values are never dropped silently.
        """
        from tabloader.errors import InvalidArgumentError

        xp = _module(self.offsets)
        ragged = self.compact()
        lengths = ragged.lengths()
        longest = host_int(lengths.max()) if len(lengths) else 0
        if longest > width:
            raise InvalidArgumentError(
                f"list column {name!r} has a row of {longest} values, longer than "
                f"sparse_max[{name!r}]={width}. Raise sparse_max for it (tabloader never "
                "truncates lists); the core Loader, PyTorch and Keras on TensorFlow also "
                "take the values ragged (sparse_as_dense off), JAX padded only"
            )
        out = xp.full((len(ragged), width), pad, dtype=ragged.values.dtype)
        rows = value_rows(ragged.offsets, len(ragged.values))
        columns = xp.arange(len(ragged.values), dtype=np.int64) - ragged.offsets[rows]
        out[rows, columns] = ragged.values
        return out


def lists_as_output(
    batch: dict[str, Any], dense: Mapping[str, int] | None, pad: float
) -> dict[str, Any]:
    """A batch with its list columns as delivered: ``(values, offsets)`` with offsets of
    length ``B + 1`` starting at 0, or, with ``dense`` (column -> width), padded
    ``[B, width]`` arrays.

    Examples:
        >>> batch = {"a": Ragged(np.array([7, 8, 9]), np.array([1, 1, 3]))}
        >>> values, offsets = lists_as_output(batch, None, 0)["a"]
        >>> values.tolist(), offsets.tolist()
        ([8, 9], [0, 0, 2])
        >>> lists_as_output(batch, {"a": 3}, -1)["a"].tolist()
        [[-1, -1, -1], [8, 9, -1]]
    """
    out = {}
    for name, value in batch.items():
        if isinstance(value, Ragged):
            if dense is not None:
                value = value.to_dense(dense[name], pad, name)
            else:
                compact = value.compact()
                value = (compact.values, compact.offsets)
        out[name] = value
    return out
