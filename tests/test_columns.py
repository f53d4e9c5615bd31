"""What a column holds across files: widths that differ, typos."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tabloader
from tabloader.columns import common_type, type_difference

INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32()]
FLOATS = [pa.float16(), pa.float32(), pa.float64()]


def write(path: Path, table: pa.Table, **kwargs) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **kwargs)
    return str(path)


# -- widths ---------------------------------------------------------------------------------


@given(st.sampled_from(INTS), st.sampled_from(INTS))
def test_integers_of_any_width_widen_to_one_that_holds_both(a, b):
    common = common_type(a, b)
    assert common == common_type(b, a)
    for t in (a, b):
        info = np.iinfo(t.to_pandas_dtype())
        values = pa.array([info.min, info.max], t)
        assert values.cast(common).cast(t).equals(values)  # nothing lost either way


@given(st.sampled_from(FLOATS), st.sampled_from(FLOATS))
def test_floats_widen_to_the_wider(a, b):
    assert common_type(a, b) == max(a, b, key=lambda t: t.bit_width)


def test_real_conflicts_have_no_common_type():
    assert common_type(pa.int64(), pa.string()) is None
    assert common_type(pa.int64(), pa.float64()) is None
    assert common_type(pa.list_(pa.int64()), pa.int64()) is None
    assert common_type(pa.bool_(), pa.int8()) is None
    assert common_type(pa.uint64(), pa.int32()) == pa.int64()
    assert common_type(pa.list_(pa.int8()), pa.list_(pa.int32())) == pa.list_(pa.int32())
    assert type_difference(pa.int32(), pa.int64()) == "widened to int64"
    assert type_difference(pa.list_(pa.int64()), pa.int64()) == "conflict"


@pytest.fixture
def mixed_widths(tmp_path):
    """Three files: cats int32/int64/uint16, conts float64/float32/float16."""
    files = []
    for k, (cat, cont) in enumerate(
        [(pa.int32(), pa.float64()), (pa.int64(), pa.float32()), (pa.uint16(), pa.float16())]
    ):
        ids = np.arange(k * 10, k * 10 + 10)
        table = pa.table(
            {
                "user": pa.array(ids, cat),
                "x": pa.array(ids / 2, pa.float64()).cast(cont),
                "label": pa.array(ids % 2, pa.int8()),
            }
        )
        files.append(write(tmp_path / f"part-{k}.parquet", table, row_group_size=5))
    return files


@pytest.mark.parametrize("cache", [None, "memory"])
def test_files_that_differ_only_in_width_load_as_one_dtype(mixed_widths, cache):
    ds = tabloader.Dataset(mixed_widths)
    assert ds.column_types(["user", "x"]) == {"user": pa.int64(), "x": pa.float64()}
    loader = tabloader.Loader(
        ds, cats=["user"], conts=["x"], labels=["label"], batch_size=7, cache=cache, device="cpu"
    )
    for _ in range(2):  # the second epoch from the cache, when there is one
        batches = list(loader)
        user = np.concatenate([b["user"] for b in batches])
        x = np.concatenate([b["x"] for b in batches])
        assert user.dtype == np.int64 and x.dtype == np.float32
        assert user.tolist() == list(range(30))
        np.testing.assert_array_equal(x, (np.arange(30) / 2).astype(np.float32))


def test_a_real_conflict_is_refused_and_names_both_files(tmp_path):
    a = write(tmp_path / "a.parquet", pa.table({"user": pa.array([1, 2], pa.int64())}))
    b = write(tmp_path / "b.parquet", pa.table({"user": ["x", "y"]}))
    with pytest.raises(tabloader.SchemaMismatchError) as info:
        tabloader.Loader([a, b], cats=["user"], batch_size=2)
    message = str(info.value)
    assert "column 'user' is string in" in message and "b.parquet" in message
    assert "int64 in" in message and "a.parquet" in message
    assert "not with conflicting types" in message and "tabloader convert" in message


# -- a wrong column name --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wrong", "suggested"), [("c1", "C1"), ("C27", "C2"), ("lable", "label"), ("zzzz", None)]
)
def test_a_wrong_column_name_suggests_the_closest(wrong, suggested):
    table = pa.table({"label": [0.0], "C1": [1], "C2": [2], "I1": [0.5]})
    with pytest.raises(tabloader.ColumnNotFoundError) as info:
        tabloader.Loader(table, cats=[wrong], batch_size=1)
    message = str(info.value)
    assert f"column {wrong!r} is not in the in-memory table" in message
    if suggested:
        assert f"(did you mean {suggested!r}?); available: label, C1, C2, I1" in message
    else:
        assert "did you mean" not in message


@pytest.mark.gpu
def test_files_that_differ_only_in_width_load_on_the_gpu(mixed_widths):
    loader = tabloader.Loader(
        mixed_widths, cats=["user"], conts=["x"], batch_size=7, chunk_rows=20, device="cuda"
    )
    batches = list(loader)
    user = np.concatenate([b["user"].get() for b in batches])
    x = np.concatenate([b["x"].get() for b in batches])
    assert user.dtype == np.int64 and x.dtype == np.float32
    assert user.tolist() == list(range(30))
    np.testing.assert_array_equal(x, (np.arange(30) / 2).astype(np.float32))
