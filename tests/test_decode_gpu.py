"""Reading on a GPU, the parts that need none: a chunk's read planned, where its pieces lie
in what is read, frames laid out as the CPU backend lays out pieces, and columns a file
should store."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabloader.backends.cpu import CPUBackend
from tabloader.batches import Layout
from tabloader.decode.gpu import delivery_rows, plan_read
from tabloader.decode.gpu_columns import assemble_frames, complete_columns
from tabloader.errors import ReadError
from tabloader.sources.partitions import FileColumns
from tabloader.stages import SplitWork
from tabloader.stats import StatsRecorder


def test_plan_read_reads_each_row_group_once_and_locates_every_piece():
    part_file = np.array([0, 0, 0, 1, 1])
    part_row_group = np.array([0, 1, 2, 0, 1])
    rows = np.array([10, 20, 30, 5, 6])
    pieces = [(0, 2, 10), (1, 0, 20), (2, 0, 4), (4, 1, 6), (3, 0, 5), (1, 3, 9)]
    read = plan_read(pieces, part_file, part_row_group, rows)
    assert read.files == [0, 1]
    assert read.row_groups == [[0, 1, 2], [0, 1]]  # ascending: the row order is plain
    assert read.partitions == [[0, 1, 2], [3, 4]]
    assert read.starts == [0, 60]
    assert read.spans == [
        (0, 0, 2, 10),
        (0, 1, 10, 30),
        (0, 2, 30, 34),
        (1, 4, 66, 71),
        (1, 3, 60, 65),
        (0, 1, 13, 19),  # row group 1 again: read once, located twice
    ]


@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=4).flatmap(
        lambda groups: st.tuples(
            st.just(groups),
            st.lists(
                st.integers(0, sum(groups) - 1).flatmap(
                    lambda p: st.tuples(st.just(p), st.integers(0, 5), st.integers(0, 5))
                ),
                min_size=1,
                max_size=8,
            ),
        )
    )
)
def test_plan_read_spans_hold_exactly_the_pieces_rows(case):
    """Reading the planned row groups and slicing each span gives each piece's rows."""
    groups_per_file, raw = case
    part_file = np.repeat(np.arange(len(groups_per_file)), groups_per_file)
    part_row_group = np.concatenate([np.arange(n) for n in groups_per_file])
    rows = np.arange(len(part_file)) % 3 + 3  # 3..5 rows per row group
    starts = np.concatenate([[0], np.cumsum(rows)])  # global row numbers of each partition
    pieces = []
    for p, a, b in raw:
        first, last = sorted((min(a, rows[p]), min(b, rows[p])))
        pieces.append((p, first, last))
    read = plan_read(pieces, part_file, part_row_group, rows)
    returned = np.concatenate(  # what cudf returns: each file in turn, row groups as listed
        [
            np.arange(starts[p], starts[p] + rows[p])
            for f, groups in zip(read.files, read.row_groups, strict=True)
            for p in (np.flatnonzero((part_file == f) & (part_row_group == g))[0] for g in groups)
        ]
    )
    assert all(g == sorted(set(g)) for g in read.row_groups)
    assert len(set(read.files)) == len(read.files)
    for (p, first, last), (i, partition, start, stop) in zip(pieces, read.spans, strict=True):
        assert partition == p
        assert part_file[p] == read.files[i]
        assert returned[start:stop].tolist() == list(range(starts[p] + first, starts[p] + last))


def _pieces(rows: list[int], seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "a": rng.integers(-1000, 1000, n).astype(np.int32),
            "b": rng.integers(0, 2, n).astype(bool),
            "x": rng.normal(size=n),
            "y": rng.normal(size=n).astype(np.float32),
        }
        for n in rows
    ]


def _layout(stacked: bool, grouped: bool = True) -> Layout:
    i8, f4 = np.dtype("int64"), np.dtype("float32")
    return Layout.build(
        {"cats": ["a", "b"], "conts": ["x", "y"], "labels": []},
        {"a": i8, "b": i8, "x": f4, "y": f4},
        stacked=stacked,
        grouped=grouped,
    )


@pytest.mark.parametrize("stacked", [False, True], ids=["columns", "stacked"])
@settings(max_examples=25, deadline=None)
@given(rows=st.lists(st.integers(1, 40), min_size=1, max_size=4), seed=st.integers(0, 99))
def test_assembly_delivers_the_cpu_backends_columns(stacked, rows, seed):
    """The GPU's blocks (grouped by dtype, column-major) deliver exactly the columns the
    CPU's per-column blocks do, for frames laid end to end."""
    layout = _layout(stacked)
    frames = _pieces(rows, seed)
    segment = assemble_frames(frames, layout.blocks, np)
    delivered = layout.deliver(segment)
    cpu_layout = _layout(stacked, grouped=False)
    cpu, work = CPUBackend(), SplitWork(2, name="tabloader-test")
    try:
        per_frame = [
            cpu._piece_segment(f, cpu_layout.blocks, StatsRecorder(), work) for f in frames
        ]
    finally:
        work.close()
    expected = cpu_layout.deliver(
        {b.name: np.concatenate([s[b.name] for s in per_frame]) for b in cpu_layout.blocks}
    )
    assert delivered.keys() == expected.keys()
    for name, got in delivered.items():
        assert got.dtype == expected[name].dtype, name
        np.testing.assert_array_equal(got, expected[name])
        if not stacked:
            assert got.flags.c_contiguous, name  # a column of a column-major block


@settings(max_examples=50, deadline=None)
@given(
    frame_rows=st.lists(st.integers(1, 20), min_size=1, max_size=4),
    data=st.data(),
)
def test_delivery_rows_point_at_each_pieces_rows_in_order(frame_rows, data):
    spans = []
    for f, n in enumerate(frame_rows):
        start = data.draw(st.integers(0, n - 1))
        stop = data.draw(st.integers(start + 1, n))
        spans.append((f, 10 + f, start, stop))
    spans = data.draw(st.permutations(spans))
    total = sum(stop - start for _, _, start, stop in spans)
    shuffled = data.draw(st.booleans())
    order = np.random.default_rng(0).permutation(total) if shuffled else None
    index, first = delivery_rows(spans, frame_rows, order)
    starts = np.concatenate([[0], np.cumsum(frame_rows)])
    expected = np.concatenate([np.arange(starts[f] + a, starts[f] + b) for f, _, a, b in spans])
    if order is not None:
        expected = expected[order]
    got = np.arange(first, first + total) if index is None else index
    np.testing.assert_array_equal(got, expected)
    if index is None:  # one ascending run: served as slices
        assert np.all(np.diff(expected) == 1)


def test_a_column_a_file_should_store_but_does_not_is_a_read_error():
    """Renamed or constant columns completed after a read: a column the file should store
    and does not (a file rewritten since the table's metadata was read) is a ReadError
    naming the file, not a KeyError from inside."""
    how = [FileColumns(read=("price_v1",), rename={"price_v1": "price"})]
    with pytest.raises(ReadError, match=r"'price' \(stored as 'price_v1'\) is missing"):
        complete_columns({"other": object()}, how, [3], ["price"])
