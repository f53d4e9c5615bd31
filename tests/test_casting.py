"""Never convert silently: a value that does not fit its delivered dtype is an error.

The rule (tabloader.casting) is checked against numpy's own casts with hypothesis, then
through the loader: from the footers' statistics at construction, from the data when a
file has none, for option values that end up in the data, and on the GPU backend.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tabloader
from tabloader.casting import check_values, fits, lossless

INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
FLOATS = ["float16", "float32", "float64"]


def _exact_int(value: float | int, target: np.dtype) -> bool:
    """The reference rule for integer targets, in exact Python arithmetic."""
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            return False
        value = int(value)
    info = np.iinfo(target)
    return int(info.min) <= value <= int(info.max)


# -- the rule, against exact arithmetic and numpy ------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    target=st.sampled_from(INTS),
    value=st.one_of(
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([2.0**63, -(2.0**63), 2.0**64, 2.0**63 - 1024, 255.0, 256.0, -129.0]),
    ),
)
def test_a_value_fits_an_integer_dtype_exactly_when_it_is_whole_and_in_range(target, value):
    dtype = np.dtype(target)
    assert fits(value, dtype) == _exact_int(value, dtype)
    if fits(value, dtype):  # and then the cast keeps it
        assert int(np.array([value]).astype(object)[0]) == int(value)
        assert int(np.asarray(int(value)).astype(dtype)) == int(value)


@settings(max_examples=300, deadline=None)
@given(
    target=st.sampled_from(FLOATS),
    value=st.one_of(st.integers(-(2**1100), 2**1100), st.floats()),
)
def test_a_value_fits_a_float_dtype_unless_a_finite_value_would_become_infinite(target, value):
    dtype = np.dtype(target)
    largest = float(np.finfo(dtype).max)
    if fits(value, dtype):  # then the cast keeps it finite (NaN and infinities as stored)
        cast = np.array([float(value)]).astype(dtype)[0]
        assert np.isfinite(cast) or not math.isfinite(float(value))
    else:  # only a finite value beyond the dtype's largest is refused
        assert isinstance(value, int) or math.isfinite(value)
        assert abs(value) > largest


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    source=st.sampled_from(INTS + FLOATS),
    target=st.sampled_from(INTS + FLOATS),
)
def test_check_values_refuses_exactly_the_arrays_holding_a_value_that_does_not_fit(
    data, source, target
):
    values = data.draw(hnp.arrays(np.dtype(source), st.integers(0, 30)))
    target_dtype = np.dtype(target)
    expected_bad = [v for v in values.tolist() if not fits(v, target_dtype)]
    if expected_bad:
        with pytest.raises(tabloader.ValueRangeError) as caught:
            check_values(values, target_dtype, column="c", where="here")
        text = str(caught.value)
        assert "column 'c'" in text and str(target_dtype) in text and "(here)" in text
        assert f"holds {expected_bad[0]!r}" in text or f"holds {expected_bad[0]}" in text
    else:
        check_values(values, target_dtype, column="c")
        if target_dtype.kind in "iu":  # nothing wrapped or was cut off
            with np.errstate(invalid="ignore"):
                cast = values.astype(target_dtype)
            assert [int(v) for v in values.tolist()] == cast.tolist()


@given(source=st.sampled_from(INTS + FLOATS + ["bool"]), target=st.sampled_from(INTS + FLOATS))
def test_a_cast_is_lossless_exactly_when_every_value_of_the_source_fits(source, target):
    src, dst = np.dtype(source), np.dtype(target)
    if src.kind == "b":
        assert lossless(src, dst)
        return
    if src.kind == "f":
        extremes = [float(np.finfo(src).min), float(np.finfo(src).max), 0.5]
    else:
        extremes = [int(np.iinfo(src).min), int(np.iinfo(src).max)]
    assert lossless(src, dst) == all(fits(v, dst) for v in extremes)


# -- through the loader: the probe's cases ----------------------------------------------


def _write(tmp_path: Path, table: pa.Table, *, statistics: bool = True, name: str = "data") -> str:
    path = tmp_path / f"{name}.parquet"
    pq.write_table(table, path, write_statistics=statistics, row_group_size=50)
    return str(path)


@pytest.mark.parametrize("statistics", [True, False])
def test_uint64_ids_at_or_above_2_63_do_not_come_out_negative(tmp_path, statistics):
    ids = np.array([1, 2**63, 2**64 - 1, *range(97)], dtype=np.uint64)
    path = _write(tmp_path, pa.table({"id": ids}), statistics=statistics)
    message = (
        r"column 'id' holds (9223372036854775808|18446744073709551615) .*fit (cat_dtype=)?int64"
    )
    if statistics:  # the footers tell at construction, naming the row group
        with pytest.raises(tabloader.ValueRangeError, match=message) as caught:
            tabloader.Loader(path, cats=["id"], batch_size=10)
        assert "row group 0" in str(caught.value)
    else:  # the data tells, as it is read
        loader = tabloader.Loader(path, cats=["id"], batch_size=10)
        with pytest.raises(tabloader.ValueRangeError, match="9223372036854775808"):
            list(loader)
    delivered = [
        b["id"] for b in tabloader.Loader(path, cats=["id"], batch_size=10, cat_dtype="uint64")
    ]
    assert np.concatenate(delivered).tolist() == ids.tolist()


@pytest.mark.parametrize(
    ("values", "dtype"), [(np.arange(60_000), "int8"), (np.array([0, 2**40]), "int32")]
)
@pytest.mark.usefixtures("quiet_loader_warnings")
@pytest.mark.parametrize("statistics", [True, False])
def test_narrow_cat_dtypes_refuse_ids_they_cannot_hold(tmp_path, values, dtype, statistics):
    path = _write(tmp_path, pa.table({"id": values}), statistics=statistics)
    with pytest.raises(tabloader.ValueRangeError, match=rf"holds (\d+) .*{dtype}") as caught:
        list(tabloader.Loader(path, cats=["id"], batch_size=1000, cat_dtype=dtype))
    named = int(re.search(r"holds (\d+)", str(caught.value)).group(1))
    assert named in values.tolist() and not fits(named, np.dtype(dtype))


@pytest.mark.parametrize("statistics", [True, False])
def test_an_integer_cont_dtype_takes_whole_floats_and_refuses_fractions(tmp_path, statistics):
    whole = _write(
        tmp_path, pa.table({"x": np.array([0.0, 3.0, -7.0, 100.0])}), statistics=statistics
    )
    batches = list(tabloader.Loader(whole, conts=["x"], batch_size=4, cont_dtype="int8"))
    assert batches[0]["x"].tolist() == [0, 3, -7, 100] and batches[0]["x"].dtype == np.int8
    table = pa.table({"x": np.linspace(0.0, 1.0, 101)})
    path = _write(tmp_path, table, statistics=statistics, name="fractions")
    with pytest.raises(
        tabloader.ValueRangeError, match=r"column 'x' holds 0\.\d+ .*lose its fraction"
    ):
        list(tabloader.Loader(path, conts=["x"], batch_size=10, cont_dtype="int8"))


def test_a_float_too_large_for_float32_is_not_delivered_as_infinity(tmp_path):
    for statistics in (True, False):
        table = pa.table({"x": [1.0, 1e300, float("inf"), float("nan")]})
        path = _write(tmp_path, table, statistics=statistics, name=f"big-{statistics}")
        with pytest.raises(tabloader.ValueRangeError, match=r"holds 1e\+300.*become infinite"):
            list(tabloader.Loader(path, conts=["x"], batch_size=2))
    ok = _write(tmp_path, pa.table({"x": [1.0, float("inf"), float("nan")]}), name="ok")
    got = next(iter(tabloader.Loader(ok, conts=["x"], batch_size=3)))["x"]
    assert got[0] == 1.0 and np.isinf(got[1]) and np.isnan(got[2])  # as stored


@pytest.mark.parametrize(
    ("fill", "match"),
    [
        (300, r"fill_null for 'x' must be a whole number that fits int8.*got 300"),
        (float("nan"), r"must be a whole number that fits int8.*got nan"),
        (1e30, r"must be a whole number that fits int8.*got 1e\+30"),
        (2**70, r"must be a whole number that fits int8.*got 1180591620717411303424"),
        (2.5, r"must be a whole number that fits int8.*got 2\.5"),
    ],
)
def test_a_fill_value_must_fit_the_column(fill, match):
    table = pa.table({"x": pa.array([1, None, 3], pa.int8())})
    with pytest.raises(tabloader.InvalidArgumentError, match=match):
        tabloader.Loader(table, cats=["x"], batch_size=2, fill_null=fill)


def test_a_fill_value_must_fit_the_delivered_dtype_too():
    table = pa.table({"x": pa.array([1, None, 3], pa.int64())})
    with pytest.raises(
        tabloader.InvalidArgumentError, match=r"is 300, which does not fit cat_dtype=int8"
    ):
        tabloader.Loader(table, cats=["x"], batch_size=2, fill_null=300, cat_dtype="int8")
    floats = pa.table({"x": pa.array([1.0, None], pa.float32())})
    with pytest.raises(
        tabloader.InvalidArgumentError, match=r"1e\+39, which does not fit cont_dtype=float32"
    ):
        tabloader.Loader(floats, conts=["x"], batch_size=2, fill_null=1e39)
    got = next(iter(tabloader.Loader(floats, conts=["x"], batch_size=2, fill_null=float("nan"))))
    assert np.isnan(got["x"][1])  # NaN is a float: nulls become NaN


@pytest.mark.parametrize("pad", [float("nan"), 1e30, 2.7, 2**63])
def test_a_dense_pad_must_fit_the_list_dtype(pad):
    table = pa.table({"t": pa.array([[1, 2], [3]])})
    with pytest.raises(
        tabloader.InvalidArgumentError, match=r"sparse_pad is .* does not fit cat_dtype=int64"
    ):
        tabloader.Loader(
            table,
            sparse_names=["t"],
            batch_size=2,
            sparse_as_dense=True,
            sparse_max={"t": 2},
            sparse_pad=pad,
        )


def test_list_values_are_checked_like_columns(tmp_path):
    table = pa.table({"t": pa.array([[1, 2], [3, 2**40]])})
    with pytest.raises(tabloader.ValueRangeError, match=r"column 't' holds 1099511627776.*int32"):
        tabloader.Loader(table, sparse_names=["t"], batch_size=2, cat_dtype="int32")
    path = _write(tmp_path, table, statistics=False)
    loader = tabloader.Loader(path, sparse_names=["t"], batch_size=2, cat_dtype="int32")
    with pytest.raises(tabloader.ValueRangeError, match=r"column 't' holds 1099511627776"):
        list(loader)


# -- the GPU backend follows the same rule ------------------------------------------------


def _edit_a_page_value(path: Path, old: int, new: int, dtype: str) -> None:
    """Change one stored value in place (PLAIN encoding, no compression), leaving the
    footer's statistics as they were: a damaged or hand-edited file."""
    data = path.read_bytes()
    was, now = np.array([old], dtype).tobytes(), np.array([new], dtype).tobytes()
    assert data.count(was) == 1
    path.write_bytes(data.replace(was, now))


@pytest.mark.parametrize(
    ("column", "values", "edit", "options"),
    [
        ("id", np.arange(7_000_000, 7_001_000), 2**40 + 5, {"cats": ["id"], "cat_dtype": "int32"}),
        ("x", np.linspace(-1, 1, 1000), 1e300, {"conts": ["x"]}),
    ],
    ids=["int64-as-int32", "float64-as-float32"],
)
def test_a_value_beyond_what_the_statistics_say_is_refused_when_read(
    tmp_path, column, values, edit, options
):
    path = tmp_path / "edited.parquet"
    table = pa.table({column: values})
    pq.write_table(table, path, compression="none", use_dictionary=False)
    _edit_a_page_value(path, values[500].item(), edit, str(values.dtype))
    stats = pq.ParquetFile(path).metadata.row_group(0).column(0).statistics
    assert stats.max == values.max()  # the footer still vouches for the column
    assert pq.read_table(path).column(column)[500].as_py() == edit
    loader = tabloader.Loader(str(path), batch_size=100, **options)
    message = re.escape(f"column '{column}' holds {edit}")
    with pytest.raises(tabloader.ValueRangeError, match=message):
        list(loader)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("table", "options", "match"),
    [
        (
            pa.table({"id": np.array([1, 2**63], np.uint64)}),
            {"cats": ["id"]},
            "9223372036854775808",
        ),
        (pa.table({"x": np.array([0.0, 0.25])}), {"conts": ["x"], "cont_dtype": "int16"}, "0.25"),
        (
            pa.table({"t": pa.array([[1], [2**40]])}),
            {"sparse_names": ["t"], "cat_dtype": "int32"},
            "1099511627776",
        ),
    ],
)
def test_the_gpu_backend_refuses_what_does_not_fit(tmp_path, table, options, match):
    path = _write(tmp_path, table, statistics=False)  # checked as read, on the device
    loader = tabloader.Loader(path, batch_size=2, device="cuda", **options)
    with pytest.raises(tabloader.ValueRangeError, match=match):
        list(loader)
    whole = _write(tmp_path, pa.table({"x": [1.0, -2.0]}), statistics=False, name="whole")
    batch = next(
        iter(tabloader.Loader(whole, conts=["x"], cont_dtype="int16", batch_size=2, device="cuda"))
    )
    assert batch["x"].get().tolist() == [1, -2]


@pytest.mark.gpu
@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    source=st.sampled_from(INTS + FLOATS),
    target=st.sampled_from(INTS + FLOATS),
)
def test_the_check_gives_the_same_verdict_on_device_arrays(data, source, target):
    import cupy

    values = data.draw(hnp.arrays(np.dtype(source), st.integers(1, 20)))
    verdicts = []
    for array in (values, cupy.asarray(values)):
        try:
            check_values(array, np.dtype(target), column="c")
            verdicts.append(None)
        except tabloader.ValueRangeError as err:
            verdicts.append(str(err))
    assert verdicts[0] == verdicts[1]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_value_that_does_not_fit_is_named_with_its_file_and_row_group(tmp_path, device):
    for name in ("a", "b"):
        ids = np.arange(200, dtype=np.int64)
        if name == "b":
            ids[130] = 2**40  # row group 2 of b (row groups of 50 rows)
        pq.write_table(
            pa.table({"id": ids}),
            tmp_path / f"{name}.parquet",
            row_group_size=50,
            write_statistics=False,
        )
    loader = tabloader.Loader(
        str(tmp_path),
        cats=["id"],
        cat_dtype="int32",
        batch_size=50,
        device=device,
        parts_per_chunk=4,  # a chunk of several row groups, read as one on a GPU
    )
    with pytest.raises(tabloader.ValueRangeError, match="holds 1099511627776") as caught:
        list(loader)
    assert "b.parquet (row group 2)" in str(caught.value)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_value_that_does_not_fit_in_rows_another_rank_delivers_is_not_this_ranks_error(
    tmp_path, device
):
    ids = np.arange(300, dtype=np.int64)
    ids[170] = 2**40  # row group 1 (rows 100-199) holds rank 0's last rows and rank 1's first
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"id": ids}), path, row_group_size=100, write_statistics=False)
    options = {"cats": ["id"], "cat_dtype": "int32", "batch_size": 10, "device": device}
    first = tabloader.Loader(str(path), global_rank=0, global_size=2, **options)
    rows = np.concatenate(
        [np.asarray(b["id"].get() if device == "cuda" else b["id"]) for b in first]
    )
    assert rows.tolist() == list(range(150))  # its share, whole, without the misfit
    second = tabloader.Loader(str(path), global_rank=1, global_size=2, **options)
    with pytest.raises(tabloader.ValueRangeError, match=r"data\.parquet \(row group 1\)"):
        list(second)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("statistics", [True, False])
@pytest.mark.parametrize("kind", ["scalar", "list"])
def test_uint64_ids_beside_signed_ones_do_not_wrap(tmp_path, device, statistics, kind):
    """uint64 in one file and int32 in another widen to int64, which does not hold every
    uint64: each file's own type decides what is checked."""

    def column(values, dtype):
        array = pa.array(values, dtype)
        if kind == "list":  # one value a row, as a list
            return pa.ListArray.from_arrays(pa.array(range(len(values) + 1), pa.int32()), array)
        return array

    def write(big: int) -> list[str]:
        a = _write(
            tmp_path,
            pa.table({"id": column([1, big, 3], pa.uint64())}),
            statistics=statistics,
            name=f"a{big}",
        )
        b = _write(
            tmp_path,
            pa.table({"id": column([4, -5, 6], pa.int32())}),
            statistics=statistics,
            name=f"b{big}",
        )
        return [a, b]

    options = {"sparse_names": ["id"]} if kind == "list" else {}

    def load(paths):
        return tabloader.Loader(paths, cats=["id"], batch_size=6, device=device, **options)

    with pytest.raises(tabloader.ValueRangeError, match="holds 9223372036854775813"):
        list(load(write(2**63 + 5)))  # at construction, or as read without statistics
    (batch,) = list(load(write(2**63 - 1)))  # every value fits int64: delivered exactly
    ids = batch["id"][0] if kind == "list" else batch["id"]  # a list column: its values
    ids = ids.get() if hasattr(ids, "get") else ids
    assert sorted(ids.tolist()) == sorted([1, 2**63 - 1, 3, 4, -5, 6])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize(
    ("narrow", "wide", "fill", "options"),
    [
        (pa.int8(), pa.int64(), 1000, {"cats": ["a"]}),
        (pa.float32(), pa.float64(), 1e39, {"conts": ["a"], "cont_dtype": "float64"}),
        (pa.list_(pa.int8()), pa.list_(pa.int64()), 1000, {"cats": ["a"], "sparse_names": ["a"]}),
        (
            pa.list_(pa.int8(), 2), pa.list_(pa.int64(), 2), 1000,
            {"conts": ["a"], "cont_dtype": "float64"},
        ),
    ],
    ids=["int8-int64", "float32-float64", "list", "vector"],
)  # fmt: skip
def test_a_fill_that_only_the_widened_type_holds_is_delivered(
    tmp_path, device, narrow, wide, fill, options
):
    """Files store a column with other widths: the fill was checked against the type
    they widen to, and is delivered as given, not wrapped, infinite or an Arrow error."""
    is_list = pa.types.is_list(narrow) or pa.types.is_fixed_size_list(narrow)
    first = [[1, None], None] if is_list else [1, None]
    second = [[3, 4], [5, 6]] if is_list else [3, 4]
    if pa.types.is_list(narrow):
        first = [[1, None], []]
    pq.write_table(pa.table({"a": pa.array(first, narrow)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"a": pa.array(second, wide)}), tmp_path / "b.parquet")
    loader = tabloader.Loader(
        str(tmp_path), batch_size=4, fill_null={"a": fill}, device=device, **options
    )
    (batch,) = list(loader)
    values = batch["a"][0] if pa.types.is_list(narrow) else batch["a"]
    values = values.get() if hasattr(values, "get") else np.asarray(values)
    assert fill in values.ravel().tolist()
    assert not np.isinf(values).any() or np.isinf(fill)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("cont_dtype", ["float32", "float64"])
def test_a_fill_is_delivered_as_given_whatever_the_files_store(tmp_path, device, cont_dtype):
    """A fill is rounded once, to the delivered dtype: not first to a narrower stored
    type (0.1 in a float16 file became 0.0999755859375 on the CPU), the same on both
    backends and in every file."""
    pq.write_table(pa.table({"h": pa.array([1.5, None], pa.float16())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"h": pa.array([2.5, None], pa.float64())}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"h": pa.array([3.5, None], pa.float32())}), tmp_path / "c.parquet")
    loader = tabloader.Loader(
        str(tmp_path), conts=["h"], batch_size=6, fill_null={"h": 0.1}, device=device,
        cont_dtype=cont_dtype,
    )  # fmt: skip
    (batch,) = list(loader)
    values = batch["h"].get() if hasattr(batch["h"], "get") else batch["h"]
    given = np.dtype(cont_dtype).type(0.1)
    assert values.dtype == np.dtype(cont_dtype)
    assert values.tolist() == [1.5, given, 2.5, given, 3.5, given]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_uint64_fill_beyond_int64_is_delivered(device):
    table = pa.table({"u": pa.array([1, None, 2**64 - 1], pa.uint64())})
    loader = tabloader.Loader(
        table, cats=["u"], cat_dtype="uint64", batch_size=3, fill_null={"u": 2**63},
        device=device,
    )  # fmt: skip
    (batch,) = list(loader)
    values = batch["u"].get() if hasattr(batch["u"], "get") else batch["u"]
    assert values.tolist() == [1, 2**63, 2**64 - 1]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("fill", [0.5, float("nan")])
def test_an_integer_measurement_delivered_as_floats_takes_a_fraction_or_nan(device, fill):
    """Stored as int32, delivered as float32 conts: the fill must fit what is delivered
    (a cat, delivered as integers, must still be filled with a whole number)."""
    table = pa.table({"dwell": pa.array([3, None, 7], pa.int32())})
    loader = tabloader.Loader(
        table, conts=["dwell"], batch_size=3, fill_null={"dwell": fill}, device=device
    )
    (batch,) = list(loader)
    values = batch["dwell"].get() if hasattr(batch["dwell"], "get") else batch["dwell"]
    assert values.dtype == np.float32
    assert values[0] == 3 and values[2] == 7
    assert values[1] == fill or (np.isnan(fill) and np.isnan(values[1]))
