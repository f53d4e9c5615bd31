"""Partition keys and filters on Hive-style directories, the filter rules themselves, and
polars input.

Tests taking ``device`` run on the CPU backend and, marked ``gpu``, on the GPU backend
(the emulated device in CI).
"""

from __future__ import annotations

import datetime
import decimal
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tabloader
from tabloader.sources.partitions import (
    FileColumns,
    check_filters,
    hive_values,
    infer_key_types,
    keep_file,
    normalize_filters,
    widens,
)

pytestmark = pytest.mark.usefixtures("quiet_loader_warnings")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
REGIONS = ["eu west", "us", "ap"]


def host(array: Any) -> np.ndarray:
    return array.get() if hasattr(array, "get") else np.asarray(array)


def write_hive(root: Path, *, days: int = 4, per_file: int = 25) -> np.ndarray:
    """``day=D/region=R/part-0.parquet`` files with ids numbered across them; returns, per
    id, its (day, region index)."""
    keys = []
    start = 0
    for day in range(days):
        for r, region in enumerate(REGIONS):
            folder = root / f"day={day}" / f"region={region.replace(' ', '%20')}"
            folder.mkdir(parents=True)
            ids = np.arange(start, start + per_file, dtype=np.int64)
            pq.write_table(
                pa.table({"id": ids, "x": ids / 2.0}), folder / "part-0.parquet", row_group_size=10
            )
            keys.extend([(day, r)] * per_file)
            start += per_file
    return np.array(keys)


@pytest.fixture
def hive(tmp_path: Path) -> tuple[Path, np.ndarray]:
    root = tmp_path / "data"
    return root, write_hive(root)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("filters", "keep"),
    [
        ([("day", "<", 2)], lambda d, r: d < 2),
        ([("region", "=", "eu west")], lambda d, r: r == 0),
        ([("day", ">=", 1), ("region", "in", ["us", "ap"])], lambda d, r: (d >= 1) & (r > 0)),
        (
            [[("day", "=", 0)], [("region", "not in", ["us", "eu west"])]],
            lambda d, r: (d == 0) | (r == 2),
        ),
    ],
)
def test_filters_on_hive_directories_skip_whole_files(hive, device, filters, keep):
    root, keys = hive
    ds = tabloader.Dataset(str(root), filters=filters)
    expected = np.flatnonzero(keep(keys[:, 0], keys[:, 1]))
    assert len(ds) == len(expected)
    assert ds.files_skipped == 12 - len(ds.files)
    assert ds.partition_keys == {"day": pa.int64(), "region": pa.string()}
    loader = tabloader.Loader(
        ds, cats=["id", "day"], batch_size=16, shuffle=True, seed=4, device=device
    )
    for _ in range(2):
        batches = list(loader)
        ids = np.concatenate([host(b["id"]) for b in batches])
        np.testing.assert_array_equal(np.sort(ids), expected)
        days = np.concatenate([host(b["day"]) for b in batches])
        np.testing.assert_array_equal(days, keys[ids, 0])  # each row has its file's key


@pytest.mark.parametrize("device", DEVICES)
def test_keys_are_features_typed_from_the_values(tmp_path, device):
    root = tmp_path / "d"
    for day, weight in ((3, "0.5"), (10, "2.5")):
        folder = root / f"day={day}" / f"w={weight}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"id": np.arange(day, day + 5)}), folder / "p.parquet")
    ds = tabloader.Dataset(str(root))
    assert ds.partition_keys == {"day": pa.int64(), "w": pa.float64()}
    assert ds.schema.names == ["id", "day", "w"]
    loader = tabloader.Loader(ds, cats=["id", "day"], conts=["w"], batch_size=4, device=device)
    batches = list(loader)
    ids = np.concatenate([host(b["id"]) for b in batches])
    day = np.where(ids < 10, 3, 10)
    np.testing.assert_array_equal(np.concatenate([host(b["day"]) for b in batches]), day)
    w = np.concatenate([host(b["w"]) for b in batches])
    np.testing.assert_array_equal(w, np.where(day == 3, 0.5, 2.5).astype(np.float32))


def test_keys_beyond_int64_or_float64_are_strings_not_wrapped_or_infinite(tmp_path):
    root = tmp_path / "d"
    for shard, w in (("1", "0.5"), ("18446744073709551616", "1e400")):
        folder = root / f"shard={shard}" / f"w={w}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"id": np.arange(3)}), folder / "p.parquet")
    ds = tabloader.Dataset(str(root))
    assert ds.partition_keys == {"shard": pa.string(), "w": pa.string()}
    with pytest.raises(tabloader.ColumnTypeError, match="'shard'"):
        tabloader.Loader(ds, cats=["shard"], batch_size=2)
    with pytest.raises(tabloader.ColumnTypeError, match="'w'"):
        tabloader.Loader(ds, conts=["w"], batch_size=2)


def test_a_string_key_filters_but_is_not_a_feature(hive):
    root, _ = hive
    ds = tabloader.Dataset(str(root))
    assert {ds.partition_values(p)["region"] for p in range(ds.num_partitions)} == set(REGIONS)
    with pytest.raises(tabloader.ColumnTypeError, match="'region'"):
        tabloader.Loader(ds, cats=["region"], batch_size=8)


def test_a_null_key_is_null_and_passes_no_filter(tmp_path):
    for value, start in (("__HIVE_DEFAULT_PARTITION__", 0), ("7", 10)):
        folder = tmp_path / f"day={value}"
        folder.mkdir()
        pq.write_table(pa.table({"id": np.arange(start, start + 10)}), folder / "p.parquet")
    ds = tabloader.Dataset(str(tmp_path))
    with pytest.raises(tabloader.NullValuesError, match="'day'"):
        tabloader.Loader(ds, cats=["day"], batch_size=4)
    batches = list(tabloader.Loader(ds, cats=["id", "day"], batch_size=4, fill_null={"day": -1}))
    ids = np.concatenate([b["id"] for b in batches])
    days = np.concatenate([b["day"] for b in batches])
    np.testing.assert_array_equal(days, np.where(ids < 10, -1, 7))
    assert len(tabloader.Dataset(str(tmp_path), filters=[("day", "!=", 3)])) == 10
    assert len(tabloader.Dataset(str(tmp_path), filters=[("day", "not in", [7])])) == 10


def test_a_column_the_files_store_wins_over_the_directory(tmp_path):
    folder = tmp_path / "day=1"
    folder.mkdir()
    pq.write_table(pa.table({"id": [0, 1], "day": [5, 6]}), folder / "p.parquet")
    ds = tabloader.Dataset(str(tmp_path), filters=[("day", "=", 1)])  # the directory selects
    assert [b["day"].tolist() for b in tabloader.Loader(ds, cats=["day"], batch_size=2)] == [[5, 6]]


def test_keys_start_below_a_glob_and_a_file_named_directly_has_none(hive):
    root, _ = hive
    ds = tabloader.Dataset(str(root / "day=2" / "*" / "*.parquet"))
    assert ds.partition_keys == {"region": pa.string()}
    ds = tabloader.Dataset(
        str(root / "day=*" / "region=us" / "*.parquet"), filters=[("day", "=", 3)]
    )
    assert len(ds) == 25
    one = str(root / "day=2" / "region=us" / "part-0.parquet")
    assert tabloader.Dataset(one).partition_keys == {}
    with pytest.raises(tabloader.InvalidArgumentError, match="none: its files are not in key="):
        tabloader.Dataset(one, filters=[("day", "=", 2)])


def test_a_skipped_file_is_never_read(hive):
    root, keys = hive
    (root / "day=3" / "region=us" / "part-0.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(tabloader.InvalidFileError, match="not a readable parquet file"):
        tabloader.Dataset(str(root))
    assert len(tabloader.Dataset(str(root), filters=[("day", "<", 3)])) == int(
        np.sum(keys[:, 0] < 3)
    )


def test_a_skipped_object_is_never_fetched():
    import fsspec

    fs = fsspec.filesystem("memory")
    base = f"/{uuid.uuid4().hex}"
    for day in range(3):
        with fs.open(f"{base}/day={day}/p.parquet", "wb") as f:
            pq.write_table(pa.table({"id": np.arange(day * 10, day * 10 + 10)}), f)
    with fs.open(f"{base}/day=9/p.parquet", "wb") as f:
        f.write(b"truncated")
    ds = tabloader.Dataset(f"memory://{base}/", filters=[("day", "<=", 2)])
    assert len(ds) == 30 and ds.files_skipped == 1
    ids = np.concatenate([b["id"] for b in tabloader.Loader(ds, cats=["id"], batch_size=7)])
    np.testing.assert_array_equal(np.sort(ids), np.arange(30))


def test_refresh_applies_the_filters_to_new_partitions(hive):
    root, _ = hive
    ds = tabloader.Dataset(str(root), filters=[("day", ">=", 3)], refresh=True)
    loader = tabloader.Loader(ds, cats=["id", "day"], batch_size=16)
    assert len(ds) == 75
    for day in (4, 1):
        folder = root / f"day={day + 10}" / "region=us"
        folder.mkdir(parents=True)
        pq.write_table(
            pa.table({"id": np.arange(5000 + day, 5001 + day), "x": [0.0]}), folder / "p.parquet"
        )
    days = np.concatenate([b["day"] for b in loader])
    assert sorted(set(days.tolist())) == [3, 11, 14] and len(days) == 77


def test_filters_are_checked(hive):
    root, _ = hive
    with pytest.raises(tabloader.InvalidArgumentError, match="'x' is not a column of"):
        tabloader.Dataset(str(root), filters=[("x", "<", 1)])
    with pytest.raises(tabloader.InvalidArgumentError, match="with str '1'"):
        tabloader.Dataset(str(root), filters=[("day", "=", "1")])
    with pytest.raises(tabloader.SourceNotFoundError, match="leave none of the 12 files"):
        tabloader.Dataset(str(root), filters=[("day", ">", 10)])
    with pytest.raises(tabloader.InvalidArgumentError, match="no partition keys"):
        tabloader.Dataset(pa.table({"day": [1]}), filters=[("day", "=", 1)])


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ("day < 3", "must be a list of"),
        ([], "must be a list of"),
        ([("day", "~", 1)], "the operator '~'"),
        ([("day", "in", 1)], "takes a list of values"),
        ([("day", "in", "ab")], "takes a list of values"),
        ([("day", "=", None)], "compares with None"),
        ([[("day", "=", 1)], []], "must be a list of"),
        ([("day", "=")], "is not a (column, operator, value) tuple"),
    ],
)
def test_malformed_filters_are_refused(filters, message):
    with pytest.raises(
        tabloader.InvalidArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        normalize_filters(filters)


# -- the rules, against pyarrow's ----------------------------------------------------------

OPS = ["=", "==", "!=", "<", "<=", ">", ">=", "in", "not in"]
term = st.tuples(
    st.sampled_from(OPS), st.integers(-3, 3), st.lists(st.integers(-3, 3), min_size=1, max_size=3)
).map(lambda t: ("k", t[0], t[2] if t[0] in ("in", "not in") else t[1]))
dnf = st.lists(st.lists(term, min_size=1, max_size=3), min_size=1, max_size=3)


@given(
    filters=dnf, values=st.lists(st.one_of(st.none(), st.integers(-4, 4)), min_size=1, max_size=12)
)
def test_keep_file_agrees_with_pyarrow_on_every_value(filters, values):
    table = pa.table({"k": pa.array(values, pa.int64())})
    kept = table.filter(pq.filters_to_expression(filters)).column("k").to_pylist()
    ours = [v for v in values if keep_file(normalize_filters(filters), {"k": v})]
    assert ours == kept


decimal_term = st.tuples(
    st.sampled_from(OPS),
    st.sampled_from([0.1, 0.3, 1.1, 2.5, 1.105, 7.0]),
    st.lists(st.sampled_from([0.1, 1.1, 2.5, 3.0]), min_size=1, max_size=3),
).map(lambda t: ("k", t[0], t[2] if t[0] in ("in", "not in") else t[1]))


@given(
    filters=st.lists(st.lists(decimal_term, min_size=1, max_size=2), min_size=1, max_size=2),
    values=st.lists(
        st.one_of(st.none(), st.sampled_from(["0.10", "0.30", "1.10", "2.50", "1.11", "7.00"])),
        min_size=1,
        max_size=8,
    ),
)
def test_a_decimal_key_compares_with_floats_as_pyarrow_does(filters, values):
    """Decimal("1.10") == 1.1 is False in Python; pyarrow compares them as floats, and
    a file of rate=1.10 was skipped by ("rate", "in", [1.1])."""
    decimals = [None if v is None else decimal.Decimal(v) for v in values]
    table = pa.table({"k": pa.array(decimals, pa.decimal128(10, 2))})
    kept = table.filter(pq.filters_to_expression(filters)).column("k").to_pylist()
    check_filters(normalize_filters(filters), {"k": pa.decimal128(10, 2)}, what="data/")
    ours = [v for v in decimals if keep_file(normalize_filters(filters), {"k": v})]
    assert ours == kept


@pytest.mark.parametrize(
    ("key_type", "good", "bad"),
    [
        (pa.binary(), b"a", "a"),
        (pa.time64("us"), datetime.time(1, 30), "01:30"),
        (pa.decimal128(10, 2), decimal.Decimal("1.10"), "1.10"),
    ],
)
def test_a_filter_value_of_another_type_is_refused_for_every_key_type(key_type, good, bad):
    """A binary or time key took any value: compared later, a str was a TypeError from
    inside the comparison, or matched nothing."""
    keys = {"k": key_type}
    for op in ("=", "<", "in"):
        value = [good] if op == "in" else good
        check_filters(normalize_filters([("k", op, value)]), keys, what="data/")
        refused = normalize_filters([("k", op, [bad] if op == "in" else bad)])
        with pytest.raises(tabloader.InvalidArgumentError, match="give a value of the key's type"):
            check_filters(refused, keys, what="data/")
    with pytest.raises(tabloader.InvalidArgumentError, match="which filters cannot compare"):
        check_filters(normalize_filters([("k", "=", 1)]), {"k": pa.list_(pa.int8())}, what="d")


def test_hive_values_and_key_types():
    assert hive_values("a=1/b=x%2Fy/c=/file.parquet") == {"a": "1", "b": "x/y", "c": ""}
    assert hive_values("notakey/a=1/f.parquet") == {"a": "1"}
    types = infer_key_types([{"a": "1", "b": "1.5", "c": "x"}, {"a": "-2", "b": "2", "c": None}])
    assert types == {"a": pa.int64(), "b": pa.float64(), "c": pa.string()}
    assert infer_key_types([{"a": "nan"}, {"a": "1.0"}]) == {"a": pa.string()}
    assert infer_key_types([{"a": None}]) == {"a": pa.string()}
    # Python's float() reads these as numbers; written so, they are names, not numbers
    for odd in ("1_000", " 5", "5 ", "1e_3"):
        assert infer_key_types([{"a": odd}, {"a": "2.5"}]) == {"a": pa.string()}, odd


def test_lossless_widening_only():
    assert widens(pa.int8(), pa.int64()) and widens(pa.uint16(), pa.int32())
    assert not widens(pa.uint32(), pa.int32()) and not widens(pa.int64(), pa.float64())
    assert widens(pa.float32(), pa.float64()) and not widens(pa.float64(), pa.float32())
    assert widens(pa.decimal128(10, 2), pa.decimal128(12, 2))
    assert not widens(pa.decimal128(10, 2), pa.decimal128(12, 3))
    assert widens(pa.list_(pa.int32()), pa.large_list(pa.int64()))
    assert widens(pa.string_view(), pa.large_string()) and not widens(pa.string(), pa.int32())


def test_file_columns_complete_renamed_and_constant_columns():
    how = FileColumns(
        ("b_old",), {"b_old": "b"}, {"k": 2, "n": None}, {"k": pa.int32(), "n": pa.float64()}
    )
    out = how.complete(pa.table({"b_old": [1, 2, 3]}), ["n", "b", "k"])
    assert out.schema == pa.schema([("n", pa.float64()), ("b", pa.int64()), ("k", pa.int32())])
    assert out.to_pydict() == {"n": [None] * 3, "b": [1, 2, 3], "k": [2, 2, 2]}
    plain = FileColumns(("a", "b"))
    table = pa.table({"a": [1], "b": [2]})
    assert plain.complete(table, ["a", "b"]) is table


# -- polars --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_polars_frames_load_like_the_arrow_table(device):
    pl = pytest.importorskip("polars")
    frame = pl.DataFrame({"id": np.arange(500), "x": np.arange(500) / 8.0, "s": ["a"] * 500})
    options: dict[str, Any] = {
        "cats": ["id"],
        "conts": ["x"],
        "batch_size": 64,
        "shuffle": True,
        "seed": 2,
        "device": device,
    }
    reference = list(
        tabloader.Loader(tabloader.Dataset(frame.to_arrow(), rows_per_partition=90), **options)
    )
    for source in (frame, frame.lazy()):
        batches = list(
            tabloader.Loader(tabloader.Dataset(source, rows_per_partition=90), **options)
        )
        assert len(batches) == len(reference)
        for got, want in zip(batches, reference, strict=True):
            for key in want:
                np.testing.assert_array_equal(host(got[key]), host(want[key]))


def test_a_polars_frame_is_not_copied():
    pl = pytest.importorskip("polars")
    frame = pl.DataFrame({"id": np.arange(100_000)})
    ds = tabloader.Dataset(frame)
    arrow = ds.read_partition(0, ["id"]).column("id").chunks[0]
    assert arrow.buffers()[1].address == frame["id"].to_numpy().ctypes.data


def test_filters_never_drop_rows_of_a_partition_key_stored_in_a_frame():
    pl = pytest.importorskip("polars")
    frame = pl.DataFrame({"day": [1, 2]})
    with pytest.raises(tabloader.InvalidArgumentError, match="filter it before"):
        tabloader.Dataset(frame, filters=[("day", "=", 1)])
    ds = tabloader.Dataset(frame.filter(pl.col("day") == 1))
    assert len(ds) == 1 and pc.sum(ds.read_partition(0, ["day"])["day"]).as_py() == 1


def test_a_time_filter_must_say_a_zone_exactly_when_its_key_has_one():
    import datetime

    from tabloader.sources.partitions import check_filters, normalize_filters

    naive = datetime.datetime(2024, 1, 1, 2)
    aware = naive.replace(tzinfo=datetime.timezone.utc)
    zoned, plain = {"ts": pa.timestamp("us", tz="UTC")}, {"ts": pa.timestamp("us")}
    check_filters(normalize_filters([("ts", "<", aware)]), zoned, what="t")
    check_filters(normalize_filters([("ts", "in", [naive])]), plain, what="t")
    for keys, value, said in [(zoned, naive, "without a time zone"), (plain, aware, "naive")]:
        for op in ("<", "=", "in"):
            term = ("ts", op, [value] if op == "in" else value)
            with pytest.raises(tabloader.InvalidArgumentError, match=said):
                check_filters(normalize_filters([term]), keys, what="t")
