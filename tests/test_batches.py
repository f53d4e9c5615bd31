"""Cutting segments into batches: sizes, order, and the carried remainder."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tabloader.batches import Block, Layout, cut_batches
from tabloader.hostmem import BufferPool, PooledNumpy

XP = PooledNumpy(BufferPool())
I8, F4 = np.dtype("int64"), np.dtype("float32")


def segments_of(sizes: list[int]) -> list[dict[str, np.ndarray]]:
    out, start = [], 0
    for n in sizes:
        ids = np.arange(start, start + n, dtype=np.int64)
        segment = {"int64": np.stack([ids, ids * 2], axis=1), "float32": ids[:, None] / 2}
        out.append((segment, None))
        start += n
    return out


# Two columns share a block, as in the stacked layout, but are delivered one by one.
LAYOUT = Layout(
    blocks=(Block("int64", ("a", "b"), I8), Block("float32", ("x",), F4)),
    outputs=(("a", "int64", 0), ("b", "int64", 1), ("x", "float32", 0)),
)


@given(
    sizes=st.lists(st.integers(0, 50), max_size=12),
    batch_size=st.integers(1, 40),
)
def test_batches_are_full_in_order_and_carry_the_remainder(sizes, batch_size):
    total = sum(sizes)
    batches = list(cut_batches(segments_of(sizes), batch_size=batch_size, layout=LAYOUT, xp=XP))
    lengths = [len(b["a"]) for b in batches]
    assert all(n == batch_size for n in lengths[:-1])
    assert sum(lengths) == total
    a = np.concatenate([b["a"] for b in batches]) if batches else np.empty(0)
    np.testing.assert_array_equal(a, np.arange(total))
    for b in batches:
        np.testing.assert_array_equal(b["b"], b["a"] * 2)
        np.testing.assert_array_equal(b["x"], b["a"] / 2)


def test_full_batches_inside_a_segment_are_views():
    (part,) = segments_of([100])
    batches = list(cut_batches([part], batch_size=25, layout=LAYOUT, xp=XP))
    assert all(np.shares_memory(b["a"], part[0]["int64"]) for b in batches)


@given(
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=6),
    batch_size=st.integers(1, 50),
    seed=st.integers(0, 1000),
)
def test_indexed_parts_deliver_whole_rows_in_index_order(sizes, batch_size, seed):
    rng = np.random.default_rng(seed)
    parts = [(segment, rng.permutation(len(segment["int64"]))) for segment, _ in segments_of(sizes)]
    expected = np.concatenate([segment["int64"][index, 0] for segment, index in parts])
    batches = list(cut_batches(parts, batch_size=batch_size, layout=LAYOUT, xp=XP))
    np.testing.assert_array_equal(np.concatenate([b["a"] for b in batches]), expected)
    for b in batches:
        np.testing.assert_array_equal(b["b"], b["a"] * 2)
        assert not np.shares_memory(b["a"], parts[0][0]["int64"])
