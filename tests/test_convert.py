"""tabloader.convert: CSV, TSV, JSON lines and parquet in; one schema, sized row groups,
seeded splits and rows in = rows out."""

from __future__ import annotations

import gzip
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tabloader
from tabloader.convert import (
    column_hashes,
    convert,
    parse_schema,
    parse_split,
    row_group_rows_for,
    row_hashes,
    split_rows,
)
from tabloader.convert import inputs as convert_inputs

pytestmark = pytest.mark.smoke


def write_csv(path: Path, rows: list[list[object]], header: list[str] | None, sep: str = ","):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [] if header is None else [sep.join(header)]
    lines += [sep.join("" if v is None else str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def sample_rows(n: int, seed: int = 0) -> list[list[object]]:
    """``user`` int, ``price`` float with nulls, ``city`` text, ``label`` 0/1."""
    rng = np.random.default_rng(seed)
    return [
        [
            int(rng.integers(0, 500)),
            None if rng.random() < 0.1 else round(float(rng.exponential(3)), 3),
            f"city{int(rng.integers(0, 5))}",
            int(rng.random() < 0.3),
        ]
        for _ in range(n)
    ]


HEADER = ["user", "price", "city", "label"]


def read(directory: Path) -> pa.Table:
    return pq.read_table(sorted(str(p) for p in directory.glob("*.parquet")))


def test_a_csv_with_a_header_becomes_typed_parquet(tmp_path):
    rows = sample_rows(1_000)
    src = write_csv(tmp_path / "clicks.csv", rows, HEADER)
    result = convert(src, tmp_path / "out")
    assert result.rows_in == 1_000 and result.rows_out == {"": 1_000}
    table = read(tmp_path / "out")
    assert table.schema == pa.schema(
        [
            ("user", pa.int64()),
            ("price", pa.float32()),
            ("city", pa.string()),
            ("label", pa.int64()),
        ]
    )
    assert table.column("user").to_pylist() == [r[0] for r in rows]
    expected_price = [None if r[1] is None else np.float32(r[1]) for r in rows]
    assert table.column("price").to_pylist() == expected_price  # empty fields are nulls
    assert table.column("city").to_pylist() == [r[2] for r in rows]
    # the loader reads it, and the nulls are where the footers say
    ds = tabloader.Dataset(str(tmp_path / "out"))
    assert ds.null_partitions("price").tolist() == [1]


def test_headerless_tsv_gets_names_or_numbered_columns(tmp_path):
    rows = [[1, 0.5, 7], [0, 1.5, 9]]
    src = write_csv(tmp_path / "day_0.tsv", rows, None, sep="\t")
    convert(src, tmp_path / "numbered")  # a first line of numbers is data, not a header
    assert read(tmp_path / "numbered").column_names == ["f0", "f1", "f2"]
    convert(src, tmp_path / "named", names=["label", "I1", "C1"])
    table = read(tmp_path / "named")
    assert table.to_pydict() == {"label": [1, 0], "I1": [0.5, 1.5], "C1": [7, 9]}
    with pytest.raises(tabloader.InvalidArgumentError, match="2 names given, but the first line"):
        convert(src, tmp_path / "bad", names=["a", "b"])


def test_names_replace_a_header_and_header_can_be_forced(tmp_path):
    src = write_csv(tmp_path / "a.csv", [["x", "y"], ["z", "w"]], ["p", "q"])
    convert(src, tmp_path / "renamed", names=["first", "second"], header=True)
    assert read(tmp_path / "renamed").to_pydict() == {"first": ["x", "z"], "second": ["y", "w"]}
    convert(src, tmp_path / "no-header", header=False)
    assert read(tmp_path / "no-header").column("f0").to_pylist() == ["p", "x", "z"]


def test_json_lines_and_compressed_csv(tmp_path):
    records = [{"user": i, "score": i / 2, "tag": f"t{i % 3}"} for i in range(50)]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    convert(str(tmp_path / "events.jsonl"), tmp_path / "json")
    table = read(tmp_path / "json")
    assert table.schema.types == [pa.int64(), pa.float32(), pa.string()]
    assert table.column("user").to_pylist() == list(range(50))
    with gzip.open(tmp_path / "clicks.csv.gz", "wt") as f:
        f.write("a,b\n1,2.5\n3,4.5\n")
    convert(str(tmp_path / "clicks.csv.gz"), tmp_path / "gz")
    assert read(tmp_path / "gz").to_pydict() == {"a": [1, 3], "b": [2.5, 4.5]}


def test_files_of_several_widths_and_formats_get_one_schema(tmp_path):
    a = tmp_path / "in" / "a.parquet"
    a.parent.mkdir()
    pq.write_table(
        pa.table({"user": pa.array([1, 2], pa.int32()), "x": pa.array([0.5, 1.5], pa.float64())}),
        a,
    )
    write_csv(tmp_path / "in" / "b.csv", [[3, 2]], ["user", "x"])  # x looks like an int here
    result = convert([str(a), str(tmp_path / "in" / "b.csv")], tmp_path / "out")
    assert result.schema == pa.schema([("user", pa.int64()), ("x", pa.float32())])
    assert read(tmp_path / "out").to_pydict() == {"user": [1, 2, 3], "x": [0.5, 1.5, 2.0]}
    assert result.inputs == [str(a), str(tmp_path / "in" / "b.csv")]  # in the order given


def test_columns_that_do_not_mix_or_do_not_match_are_named(tmp_path):
    a = write_csv(tmp_path / "a.csv", [[1, 2]], ["user", "x"])
    b = write_csv(tmp_path / "b.csv", [["bob", 2]], ["user", "x"])
    with pytest.raises(tabloader.SchemaMismatchError) as info:
        convert([a, b], tmp_path / "out")
    assert "column 'user' has types that do not mix (int64 in" in str(info.value)
    assert "--schema user=TYPE" in str(info.value)
    convert([a, b], tmp_path / "forced", schema={"user": "string"})
    assert read(tmp_path / "forced").column("user").to_pylist() == ["1", "bob"]
    c = write_csv(tmp_path / "c.csv", [[1, 2]], ["usr", "x"])
    with pytest.raises(
        tabloader.ColumnNotFoundError, match=r"has no column 'user' \(it has 'usr'\)"
    ):
        convert([a, c], tmp_path / "out2")


def test_schema_forces_types_and_checks_its_names(tmp_path):
    src = write_csv(tmp_path / "a.csv", [[1, 2.5, 3]], ["user", "price", "item"])
    convert(src, tmp_path / "out", schema="user=int32, price:float64")
    assert read(tmp_path / "out").schema.types == [pa.int32(), pa.float64(), pa.int64()]
    with pytest.raises(tabloader.ColumnNotFoundError, match=r"'usr'.*did you mean 'user'\?"):
        convert(src, tmp_path / "bad", schema={"usr": "int32"})
    with pytest.raises(tabloader.InvalidArgumentError, match=r"unknown type 'flaot32'.*'float32'"):
        convert(src, tmp_path / "bad", schema={"price": "flaot32"})
    template = tmp_path / "template.parquet"
    pq.write_table(pa.table({"user": pa.array([1], pa.int16())}), template)
    assert parse_schema(str(template)) == {"user": pa.int16()}


def test_a_value_that_does_not_fit_is_an_error_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(convert_inputs, "BLOCK_BYTES", 64)  # types from the first rows only
    rows = [[i] for i in range(40)] + [["1.5"]]
    src = write_csv(tmp_path / "a.csv", rows, ["user"])
    with pytest.raises(tabloader.InvalidFileError) as info:
        convert(src, tmp_path / "out")
    message = str(info.value)
    assert "a.csv: column 'user' holds '1.5' at row 41, which is not int64" in message
    assert "--schema user=TYPE" in message and "float32" in message
    assert not list((tmp_path / "out").rglob("*.parquet"))  # nothing half-written is left
    convert(src, tmp_path / "out", schema={"user": "float32"})
    assert read(tmp_path / "out").column("user").to_pylist()[-1] == 1.5
    text = write_csv(tmp_path / "t.csv", [[i] for i in range(40)] + [["abc"]], ["user"])
    with pytest.raises(tabloader.InvalidFileError, match=r"holds 'abc'.* e\.g\. string") as info:
        convert(text, tmp_path / "t")
    assert "float32" not in str(info.value)  # advice that would fail again
    convert(text, tmp_path / "t", schema={"user": "string"})
    assert read(tmp_path / "t").column("user").to_pylist()[-1] == "abc"


def test_narrowing_never_overflows_silently(tmp_path):
    big = tmp_path / "big.parquet"
    pq.write_table(pa.table({"x": pa.array([1.5, 1e300])}), big)
    with pytest.raises(
        tabloader.InvalidFileError, match=r"'x' holds 1e\+300 at row 2, beyond the range of float"
    ):
        convert(str(big), tmp_path / "out")
    convert(str(big), tmp_path / "out", schema={"x": "float64"})
    huge = tmp_path / "huge.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2**63], pa.uint64())}), huge)
    with pytest.raises(
        tabloader.InvalidFileError,
        match=r"column 'id' holds 9223372036854775808 at row 2, beyond the range of int64",
    ):
        convert(str(huge), tmp_path / "out2")


def test_row_groups_and_files_are_sized(tmp_path):
    src = write_csv(tmp_path / "a.csv", [[i, i / 2] for i in range(1_000)], ["id", "x"])
    result = convert(src, tmp_path / "out", row_group_rows=300, rows_per_file=600)
    assert result.row_group_rows == 300
    files = sorted((tmp_path / "out").glob("*.parquet"))
    assert [f.name for f in files] == ["part-00000.parquet", "part-00001.parquet"]
    groups = [
        pq.ParquetFile(f).metadata.row_group(g).num_rows
        for f in files
        for g in range(pq.ParquetFile(f).metadata.num_row_groups)
    ]
    assert groups == [300, 300, 300, 100]
    assert read(tmp_path / "out").column("id").to_pylist() == list(range(1_000))
    assert row_group_rows_for(pa.schema([("x", pa.float32())] * 40)) == 131_072


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 700), group=st.integers(1, 300), per_file=st.integers(1, 400))
def test_every_file_holds_rows_per_file_rows_whatever_the_row_groups(
    tmp_path_factory, rows, group, per_file
):
    tmp_path = tmp_path_factory.mktemp("sized")
    src = write_csv(tmp_path / "a.csv", [[i] for i in range(rows)], ["id"])
    convert(src, tmp_path / "out", row_group_rows=group, rows_per_file=per_file)
    files = sorted((tmp_path / "out").glob("*.parquet"))
    sizes = [pq.ParquetFile(f).metadata.num_rows for f in files]
    assert sizes == [per_file] * (rows // per_file) + ([rows % per_file] if rows % per_file else [])
    for f in files:
        meta = pq.ParquetFile(f).metadata
        assert all(meta.row_group(g).num_rows <= group for g in range(meta.num_row_groups))
    assert read(tmp_path / "out").column("id").to_pylist() == list(range(rows))


def test_input_without_rows_keeps_its_schema_and_every_split_has_a_file(tmp_path):
    header_only = tmp_path / "h.csv"
    header_only.write_text("id,x\n")
    convert(str(header_only), tmp_path / "out", schema="id=int64,x=float32")
    files = list((tmp_path / "out").glob("*.parquet"))
    assert len(files) == 1
    table = pq.read_table(files[0])
    assert table.num_rows == 0 and table.schema.names == ["id", "x"]
    two = write_csv(tmp_path / "two.csv", [[1, 0.5], [2, 1.5]], ["id", "x"])
    result = convert(two, tmp_path / "split", split={"valid": 0.01, "test": 0.01}, seed=0)
    for split in ("train", "valid", "test"):
        found = list((tmp_path / "split" / split).glob("*.parquet"))
        assert len(found) == 1, split
    assert sum(result.rows_out.values()) == 2


def test_splits_come_from_a_seeded_hash_of_each_row(tmp_path):
    rows = sample_rows(4_000)
    rows += rows[:500]  # duplicates: a row and its copy must land in the same split
    src = write_csv(tmp_path / "all.csv", rows, HEADER)
    result = convert(src, tmp_path / "out", split={"valid": 0.1, "test": 0.05}, seed=3)
    assert list(result.files) == ["train", "valid", "test"]
    assert result.rows_in == 4_500 == sum(result.rows_out.values())
    tables = {name: read(tmp_path / "out" / name) for name in result.files}
    assert {n: t.num_rows for n, t in tables.items()} == result.rows_out
    assert 0.07 < result.rows_out["valid"] / 4_500 < 0.13
    assert 0.03 < result.rows_out["test"] / 4_500 < 0.07

    def keys(table: pa.Table) -> list[tuple]:
        return list(zip(*(table.column(c).to_pylist() for c in HEADER), strict=True))

    everything = Counter(k for t in tables.values() for k in keys(t))
    assert everything == Counter(read_csv_keys(src))  # every row once, none lost or made up
    owner = {}
    for name, table in tables.items():
        for key in keys(table):
            assert owner.setdefault(key, name) == name  # duplicates never straddle splits
    # The same seed splits the same rows the same way, however the files are cut.
    half = len(rows) // 2
    a = write_csv(tmp_path / "parts" / "a.csv", rows[:half], HEADER)
    b = write_csv(tmp_path / "parts" / "b.csv", rows[half:], HEADER)
    again = convert([a, b], tmp_path / "again", split="valid=0.1,test=0.05", seed=3)
    assert again.rows_out == result.rows_out
    assert Counter(keys(read(tmp_path / "again" / "valid"))) == Counter(keys(tables["valid"]))
    convert(src, tmp_path / "other", split={"valid": 0.1, "test": 0.05}, seed=4)
    assert Counter(keys(read(tmp_path / "other" / "valid"))) != Counter(keys(tables["valid"]))


def read_csv_keys(path: str) -> list[tuple]:
    import pyarrow.csv as pacsv

    table = pacsv.read_csv(path)
    price = table.column("price").cast(pa.float32())
    table = table.set_column(1, "price", price)
    return list(zip(*(table.column(c).to_pylist() for c in HEADER), strict=True))


def test_split_options_are_checked():
    assert parse_split("valid=0.1") == {"valid": 0.1}
    for bad, message in [
        ("valid", "NAME=FRACTION"),
        ("valid=x", "must be a number"),
        ("valid=0.6,test=0.6", "add up to 1.2, more than 1"),
        ("train=0.5,valid=0.2", "with 'train' named they must add up to 1"),
        ("../up=0.1", "letters, digits"),
        ("valid=0", r"in \(0, 1\]"),
    ]:
        with pytest.raises(tabloader.InvalidArgumentError, match=message):
            parse_split(bad)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=200), st.floats(0.01, 0.99))
def test_split_rows_puts_every_row_in_exactly_one_split(hashes, fraction):
    array = np.array(hashes, dtype=np.uint64)
    rows = split_rows(array, {"valid": fraction})
    together = np.sort(np.concatenate(list(rows.values())))
    assert together.tolist() == list(range(len(hashes)))
    unit = (array >> np.uint64(11)).astype(np.float64) * 2.0**-53
    assert (unit[rows["valid"]] < fraction).all() and (unit[rows["train"]] >= fraction).all()


def test_hashes_depend_on_values_only():
    table = pa.table(
        {
            "i": pa.array([1, None, 1, 2], pa.int64()),
            "f": pa.array([0.0, -0.0, 0.0, float("nan")], pa.float32()),
            "s": ["ab", None, "ab", "ba"],
            "l": pa.array([[1, 2], [], [1, 2], [2, 1]], pa.list_(pa.int64())),
        }
    )
    hashes = row_hashes(table, seed=0)
    assert hashes[0] == hashes[2] and len(set(hashes.tolist())) == 3
    sliced = row_hashes(table.slice(2), seed=0)  # offsets of a slice do not matter
    assert sliced.tolist() == hashes[2:].tolist()
    strings = column_hashes(pa.array(["ab", "ba", "", None]))
    assert len(set(strings.tolist())) == 4
    lists = column_hashes(pa.array([[1, 2], [2, 1], [], None], pa.list_(pa.int64())))
    assert len(set(lists.tolist())) == 4


@given(
    ticks=st.lists(st.integers(-(2**33), 2**33), min_size=1, max_size=20),  # within ns
    zone=st.sampled_from([None, "UTC", "Europe/Paris"]),
)
def test_a_timestamp_hashes_by_its_instant_whatever_its_unit(ticks, zone):
    # A text file's timestamps are read in the unit its own values need: the same
    # instant must land in the same split however the file was read.
    seconds = pa.array(ticks, pa.timestamp("s", tz=zone))
    hashes = column_hashes(seconds).tolist()
    for unit in ("ms", "us", "ns"):
        assert column_hashes(seconds.cast(pa.timestamp(unit, tz=zone))).tolist() == hashes
    later = pa.array([t * 1000 + 1 for t in ticks], pa.timestamp("ms", tz=zone))
    assert not set(column_hashes(later).tolist()) & set(hashes)  # another instant


def test_a_destination_that_is_not_empty_is_refused_unless_overwritten(tmp_path):
    src = write_csv(tmp_path / "a.csv", [[1]], ["x"])
    convert(src, tmp_path / "out")
    with pytest.raises(tabloader.InvalidArgumentError, match=r"is not empty .*overwrite=True"):
        convert(src, tmp_path / "out")
    write_csv(tmp_path / "b.csv", [[2], [3]], ["x"])
    convert(str(tmp_path / "b.csv"), tmp_path / "out", overwrite=True)
    assert read(tmp_path / "out").column("x").to_pylist() == [2, 3]
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(tabloader.InvalidArgumentError, match=r"not empty \('notes.txt'\)"):
        convert(src, tmp_path / "out", overwrite=True)


def test_progress_is_one_line_off_a_terminal(tmp_path):
    src = write_csv(tmp_path / "a.csv", sample_rows(2_000), HEADER)
    out = io.StringIO()
    convert(src, tmp_path / "out", progress=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("converting: ") and " MiB in " in lines[0]


def test_a_transform_encodes_columns_on_the_way(tmp_path):
    import pyarrow.compute as pc

    src = write_csv(tmp_path / "a.csv", [["x", 1], ["y", 2], ["x", 3], [None, 4]], ["c", "n"])

    def encode(table: pa.Table) -> pa.Table:
        ids = column_hashes(table.column("c")) % np.uint64(100) + np.uint64(1)
        ids = pa.array(ids.astype(np.int64), mask=np.asarray(pc.is_null(table.column("c"))))
        return pa.table({"c": pc.fill_null(ids, 0)})

    result = convert(src, tmp_path / "out", transform=encode)
    assert result.schema == pa.schema([("c", pa.int64())])
    ids = read(tmp_path / "out").column("c").to_pylist()
    assert ids[0] == ids[2] != ids[1] and ids[3] == 0


# -- nothing changed silently ---------------------------------------------------------------


def test_whole_floats_become_int64_as_pandas_writes_integer_ids_with_nulls(tmp_path):
    import pandas as pd

    ids = [2**40 + i for i in range(1_000)]
    frame = pd.DataFrame({"id": pd.array([*ids, None], dtype="Int64").astype("float64")})
    frame["label"] = [i % 2 for i in range(1_001)]
    frame.to_csv(tmp_path / "export.csv", index=False)  # ids as "1099511627776.0"
    assert "1099511627776.0" in (tmp_path / "export.csv").read_text()
    result = convert(str(tmp_path / "export.csv"), tmp_path / "csv")
    assert result.schema.field("id").type == pa.int64()
    written = read(tmp_path / "csv").column("id").to_pylist()
    assert written == [*ids, None]  # 1,000 distinct ids stay 1,000 distinct ids
    # in parquet the doubles are the file's chosen type: kept floating point, so the ids
    # that float32 would merge are refused, and --schema says what they are
    frame.to_parquet(tmp_path / "export.parquet")
    with pytest.raises(tabloader.InvalidFileError) as info:
        convert(str(tmp_path / "export.parquet"), tmp_path / "pq")
    assert "column 'id' holds 1099511627777 at row 2, a whole number float cannot hold" in str(
        info.value
    )
    assert "--schema id=int64 for ids" in str(info.value)
    convert(str(tmp_path / "export.parquet"), tmp_path / "pq", schema="id=int64")
    assert read(tmp_path / "pq").column("id").to_pylist() == [*ids, None]


def test_a_lossy_column_is_refused_with_its_value_and_row_unless_the_schema_says(tmp_path):
    src = tmp_path / "ids.csv"
    lines = [f"{2**40 + i},{i}" for i in range(999)] + ["0.5,999"]
    src.write_text("id,n\n" + "\n".join(lines) + "\n")
    with pytest.raises(tabloader.InvalidFileError) as info:
        convert(str(src), tmp_path / "out")
    message = str(info.value)
    assert "ids.csv: column 'id' holds 1099511627777 at row 2" in message
    assert "a whole number float cannot hold exactly (it would become 1099511627776)" in message
    assert "id=float64" in message
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.parquet"))
    convert(str(src), tmp_path / "f64", schema="id=float64")
    assert read(tmp_path / "f64").column("id").to_pylist()[:2] == [2.0**40, 2.0**40 + 1]
    convert(str(src), tmp_path / "f32", schema="id=float32")  # rounding asked for
    assert len(set(read(tmp_path / "f32").column("id").to_pylist())) < 1_000


def test_a_fraction_after_whole_numbers_and_values_beyond_int64_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(convert_inputs, "BLOCK_BYTES", 64)  # the first block: whole numbers
    src = tmp_path / "late.csv"
    src.write_text("x\n" + "".join(f"{i}.0\n" for i in range(40)) + "2.5\n")
    with pytest.raises(tabloader.InvalidFileError) as info:
        convert(str(src), tmp_path / "out")
    assert "column 'x' holds 2.5 at row 41, which is not a whole number" in str(info.value)
    assert "--schema x=TYPE" in str(info.value) and "float32, float64" in str(info.value)
    convert(str(src), tmp_path / "fixed", schema="x=float32")
    assert read(tmp_path / "fixed").column("x").to_pylist()[-1] == 2.5
    big = tmp_path / "big.csv"
    big.write_text("id\n1\n99999999999999999999\n")
    with pytest.raises(tabloader.InvalidFileError) as info:
        convert(str(big), tmp_path / "big")
    assert "column 'id' holds 100000000000000000000 at row 2, beyond the range of int64" in str(
        info.value
    )
    convert(str(big), tmp_path / "text", schema="id=string")
    assert read(tmp_path / "text").column("id").to_pylist() == ["1", "99999999999999999999"]


def test_whole_numbers_beyond_what_floating_point_holds_exactly_are_never_changed(tmp_path):
    # Text ids beyond int64 are read as floating point, which rounds whole numbers above
    # 2**53: written as integers they would silently be other ids.
    ids = tmp_path / "ids.csv"
    ids.write_text("id,x\n1,1\n9223372036854775809,2\n10000000000000000001,3\n")
    for schema, why in [
        (None, "beyond the range of int64"),
        ("id=int64", "beyond the range of int64"),
        ("id=uint64", r"exactly only up to 2\*\*53"),
    ]:
        with pytest.raises(tabloader.InvalidFileError, match=why):
            convert(str(ids), tmp_path / f"out-{schema}", schema=schema)
    convert(str(ids), tmp_path / "text", schema="id=string")
    assert read(tmp_path / "text").column("id").to_pylist() == [
        "1",
        "9223372036854775809",
        "10000000000000000001",
    ]
    floats = tmp_path / "floats.csv"
    floats.write_text("id\n1.0\n12345678901234567.0\n")
    with pytest.raises(tabloader.InvalidFileError, match="holds 12345678901234568 at row 2"):
        convert(str(floats), tmp_path / "f")
    exact = tmp_path / "exact.csv"
    exact.write_text(f"id\n1.0\n{2**53}.0\n")  # still exact: kept as int64
    convert(str(exact), tmp_path / "e")
    assert read(tmp_path / "e").column("id").to_pylist() == [1, 2**53]


def test_a_forced_uint64_keeps_a_parquet_uint64_column(tmp_path):
    src = tmp_path / "u.parquet"
    pq.write_table(pa.table({"u": pa.array([1, 2**64 - 1], pa.uint64())}), src)
    convert(str(src), tmp_path / "out", schema="u=uint64")
    column = read(tmp_path / "out").column("u")
    assert column.type == pa.uint64() and column.to_pylist() == [1, 2**64 - 1]


def test_sources_skip_underscore_and_dot_directories_and_files_named_twice(tmp_path, monkeypatch):
    data = tmp_path / "data"
    write_csv(data / "a.csv", [[1, 0.5], [2, 1.5]], ["id", "x"])
    write_csv(data / "_vocabulary" / "id.csv", [["v", 3]], ["value", "count"])
    write_csv(data / ".staging" / "b.csv", [[9, 9.5]], ["id", "x"])
    monkeypatch.chdir(tmp_path)
    convert(["data", "data/a.csv", "./data/a.csv", str(data / "a.csv")], tmp_path / "out")
    assert sorted(read(tmp_path / "out").column("id").to_pylist()) == [1, 2]


def test_a_schema_file_that_is_not_parquet_is_a_clear_error(tmp_path):
    src = write_csv(tmp_path / "a.csv", [[1]], ["id"])
    with pytest.raises(tabloader.InvalidArgumentError, match="not a parquet file"):
        convert(src, tmp_path / "out", schema=src)


def test_duplicate_header_names_are_named_with_the_file(tmp_path, capsys):
    from tabloader.cli import main

    src = tmp_path / "dup.csv"
    src.write_text("user,price,user\n1,2.5,3\n")
    with pytest.raises(tabloader.InvalidFileError) as info:
        convert(str(src), tmp_path / "out")
    assert f"{src}: the header names 'user' (columns 1, 3) more than once" in str(info.value)
    assert "--names" in str(info.value)
    convert(str(src), tmp_path / "named", names=["user", "price", "user2"])
    assert read(tmp_path / "named").column_names == ["user", "price", "user2"]
    assert main(["convert", str(src), str(tmp_path / "cli"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tabloader: error: ") and "Traceback" not in err


@pytest.mark.parametrize("damage", ["truncated", "trailing garbage"])
def test_a_damaged_gzip_file_is_named(tmp_path, damage, capsys):
    from tabloader.cli import main

    data = ("a,b\n" + "".join(f"{i},{i * 2}\n" for i in range(200_000))).encode()
    packed = gzip.compress(data)
    src = tmp_path / "day.csv.gz"
    src.write_bytes(packed[: len(packed) // 2] if damage == "truncated" else packed + b"junk!!")
    with pytest.raises(tabloader.InvalidFileError) as info:
        convert(str(src), tmp_path / "out")
    assert f"{src}: the gzip stream is damaged" in str(info.value)
    assert "gzip -t" in str(info.value)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.parquet"))
    assert main(["convert", str(src), str(tmp_path / "cli"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the gzip stream is damaged" in err and "Traceback" not in err


def test_bytes_that_are_not_utf8_in_a_number_column_are_refused(tmp_path):
    src = tmp_path / "latin.csv"
    src.write_bytes(b"price,label\n1.5,1\n2.5\xe9,0\n3.0,1\n")
    with pytest.raises(tabloader.InvalidFileError) as info:
        convert(str(src), tmp_path / "out")
    message = str(info.value)
    assert f"{src}: column 'price' holds bytes that are not UTF-8 text, at row 2" in message
    assert "iconv" in message


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_a_value_that_does_not_parse_deep_in_a_file_is_named_with_its_row(
    tmp_path, monkeypatch, compressed
):
    monkeypatch.setattr(convert_inputs, "BLOCK_BYTES", 256)  # many blocks before it
    lines = ["note,user"]  # quoted line breaks: rows are not lines
    lines += [f'"line one\nline two {i}",{i}' for i in range(500)]
    lines[-1] = '"x\ny",oops'  # row 500
    lines.append('"last",oops')  # the same text again, later
    data = ("\n".join(lines) + "\n").encode()
    path = tmp_path / ("a.csv.gz" if compressed else "a.csv")
    path.write_bytes(gzip.compress(data) if compressed else data)
    with pytest.raises(tabloader.InvalidFileError) as info:
        convert(str(path), tmp_path / "out", schema={"user": "int64"})
    assert "column 'user' holds 'oops' at row 500, which is not int64" in str(info.value)


def test_quoted_values_holding_line_breaks_are_converted_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(convert_inputs, "BLOCK_BYTES", 128)  # blocks end inside quotes
    notes = [f"first line {i}\nsecond, with a comma\n" for i in range(300)]
    path = tmp_path / "notes.csv"
    pa.csv.write_csv(pa.table({"note": notes, "user": list(range(300))}), path)
    convert(str(path), tmp_path / "out")
    table = read(tmp_path / "out")
    assert table.column("note").to_pylist() == notes
    assert table.column("user").to_pylist() == list(range(300))


def test_spark_int96_timestamps_keep_dates_beyond_the_nanosecond_range(tmp_path):
    import datetime

    times = [datetime.datetime(2024, 3, 1, 12), datetime.datetime(9999, 12, 31),
             datetime.datetime(1500, 1, 1)]  # fmt: skip
    src = tmp_path / "part-00000.snappy.parquet"
    table = pa.table({"valid_to": pa.array(times, pa.timestamp("us")), "v": [1, 2, 3]})
    pq.write_table(table, src, use_deprecated_int96_timestamps=True)  # as Spark writes
    convert(str(src), tmp_path / "kept")
    assert read(tmp_path / "kept").column("valid_to").to_pylist() == times
    convert(str(src), tmp_path / "parts", time_parts={"valid_to": ["year"]})
    assert read(tmp_path / "parts").column("valid_to_year").to_pylist() == [2024, 9999, 1500]


def test_only_an_empty_cell_is_a_null_in_csv(tmp_path):
    src = tmp_path / "a.csv"
    src.write_text('country,user,price\nNA,null,NaN\nfr,"",1.5\nN/A,NULL,\nde,n/a,2.5\n')
    convert(str(src), tmp_path / "out")
    table = read(tmp_path / "out")
    assert table.column("country").to_pylist() == ["NA", "fr", "N/A", "de"]
    assert table.column("user").to_pylist() == ["null", None, "NULL", "n/a"]
    price = table.column("price").to_pylist()
    assert np.isnan(price[0]) and price[1:] == [1.5, None, 2.5]


def test_files_named_themselves_are_converted_whatever_their_names(tmp_path):
    a = write_csv(tmp_path / "a.csv", [[1], [2]], ["id"])
    b = write_csv(tmp_path / "_b.csv", [[3], [4]], ["id"])
    c = write_csv(tmp_path / ".c.csv", [[5]], ["id"])
    convert([a, b, c], tmp_path / "out")
    assert sorted(read(tmp_path / "out").column("id").to_pylist()) == [1, 2, 3, 4, 5]
    only = tmp_path / "only"
    write_csv(only / "_hidden.csv", [[1]], ["id"])
    for spec in (only, only / "*.csv"):
        with pytest.raises(tabloader.SourceNotFoundError, match="name such a file itself"):
            convert(str(spec), tmp_path / "out2")


def test_a_value_that_does_not_parse_in_the_first_block_is_a_clear_error(tmp_path):
    src = write_csv(tmp_path / "a.csv", [[1, "x"], [2, "3"]], ["id", "price"])
    with pytest.raises(tabloader.InvalidFileError, match=r"'price' holds 'x' at row 1, which"):
        convert(src, tmp_path / "out", schema={"price": "int64"})


def test_a_txt_file_is_told_by_its_text(tmp_path):
    src = tmp_path / "train.txt"  # Criteo's: tab-separated, no header
    src.write_text("1\t51\t\t5487ce1e\n0\t2\t3\t68fd1e64\n")
    convert(str(src), tmp_path / "out")
    table = read(tmp_path / "out")
    assert table.num_rows == 2 and table.num_columns == 4
    assert table.column(3).to_pylist() == ["5487ce1e", "68fd1e64"]


def test_key_value_directories_and_table_directories_are_refused_not_dropped(tmp_path):
    import pandas as pd

    frame = pd.DataFrame({"user": np.arange(12), "day": np.arange(12) % 3})
    frame.to_parquet(tmp_path / "hive", partition_cols=["day"])  # pandas', Spark's layout
    for spec in (tmp_path / "hive", tmp_path / "hive" / "**" / "*.parquet"):
        with pytest.raises(tabloader.InvalidArgumentError, match=r"key=value.*\(day\)"):
            convert(str(spec), tmp_path / "out")
    # the way the message gives: a directory each, into the same layout
    for day in range(3):
        convert(str(tmp_path / "hive" / f"day={day}"), tmp_path / "out" / f"day={day}")
    loader = tabloader.Loader(str(tmp_path / "out"), cats=["user", "day"], batch_size=12)
    (batch,) = list(loader)
    assert sorted(zip(batch["user"].tolist(), batch["day"].tolist(), strict=True)) == [
        (u, u % 3) for u in range(12)
    ]

    deltalake = pytest.importorskip("deltalake")
    table = tmp_path / "delta"
    deltalake.write_deltalake(str(table), pa.table({"user": np.arange(10)}))
    deltalake.write_deltalake(str(table), pa.table({"user": np.arange(10)}), mode="overwrite")
    with pytest.raises(tabloader.InvalidArgumentError, match="a Delta Lake table"):
        convert(str(table), tmp_path / "delta_out")


def test_ids_all_beyond_int64_are_refused_not_rounded_to_floating_point(tmp_path):
    ids = ["18446744073709551615", "12345678901234567891", "12345678901234567892"]
    src = tmp_path / "ids.csv"
    src.write_text("id,click\n" + "".join(f"{i},1\n" for i in ids))
    with pytest.raises(
        tabloader.InvalidFileError,
        match=r"column 'id' holds \d+ at row 1, beyond the range of int64 .* string for ids",
    ):
        convert(str(src), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    convert(str(src), tmp_path / "text", schema="id=string")
    assert read(tmp_path / "text").column("id").to_pylist() == ids
    lines = tmp_path / "ids.jsonl"
    lines.write_text("".join(f'{{"id": {i}}}\n' for i in ids))
    with pytest.raises(
        tabloader.InvalidFileError,
        match=r"column 'id' holds \d+ at row 1, beyond the range of int64 .* JSON strings",
    ):
        convert(str(lines), tmp_path / "json")


def test_json_columns_read_as_text_and_values_that_do_not_fit_are_named(tmp_path, monkeypatch):
    from tabloader.cli import main

    src = tmp_path / "ids.jsonl"
    src.write_text('{"id": 1, "click": 1}\n{"id": -22, "click": 0}\n')
    convert(str(src), tmp_path / "text", schema="id=string")
    assert read(tmp_path / "text").to_pydict() == {"id": ["1", "-22"], "click": [1, 0]}
    src.write_text('{"id": 1, "click": 1}\n{"id": 99999999999999999999, "click": 0}\n')
    with pytest.raises(
        tabloader.InvalidFileError,
        match=r"column 'id' holds 100000000000000000000 at row 2, .*JSON strings",
    ):
        convert(str(src), tmp_path / "big", schema="id=string")
    monkeypatch.setattr(convert_inputs, "BLOCK_BYTES", 64)
    late = tmp_path / "late.jsonl"
    for last, wanted in (
        ('{"x": 3.5}', r"column 'x' holds 3.5 at row 21, which is not int64.*--schema x=.*float32"),
        ('{"x": "abc"}', r"column 'x' holds 'abc' at row 21, which is not int64.*string"),
        ('{"x": 3, "y": 1}', r"row 21 has a field 'y' that the first rows of the files have not"),
    ):
        late.write_text("".join(f'{{"x": {i}}}\n' for i in range(20)) + last + "\n")
        with pytest.raises(tabloader.InvalidFileError, match=wanted):
            convert(str(late), tmp_path / "late")
    late.write_text("".join(f'{{"x": {i}}}\n' for i in range(20)) + '{"x": "abc"}\n')
    with pytest.raises(
        tabloader.InvalidFileError,
        match=r"column 'x' holds 'abc' at row 21 after numbers.*all as JSON strings",
    ):
        convert(str(late), tmp_path / "late", schema="x=string")
    assert main(["convert", str(late), str(tmp_path / "cli"), "--schema", "x=string"]) == 2


def test_numbers_written_with_leading_zeros_stay_text(tmp_path):
    src = tmp_path / "log.csv"
    src.write_text("zip,item,click\n02134,007,1\n2134,7,0\n02134,07,1\n")
    result = convert(str(src), tmp_path / "out", categorify="item")
    assert result.schema.field("zip").type == pa.string()
    table = read(tmp_path / "out")
    assert table.column("zip").to_pylist() == ["02134", "2134", "02134"]
    assert sorted(table.column("item").to_pylist()) == [2, 3, 4]  # three ids, one each
    vocabulary = pq.read_table(tmp_path / "out" / "_vocabulary" / "item.parquet")
    assert sorted(vocabulary.column("value").to_pylist()) == ["007", "07", "7"]
    src.write_text("n,click\n0,1\n10,0\n-3,1\n")
    convert(str(src), tmp_path / "numbers")
    assert read(tmp_path / "numbers").to_pydict() == {"n": [0, 10, -3], "click": [1, 0, 1]}


def test_names_for_a_first_line_of_text_need_header_said(tmp_path):
    src = tmp_path / "users.csv"
    src.write_text("alice,fr\nbob,de\ncarol,us\n")
    with pytest.raises(
        tabloader.InvalidArgumentError,
        match=r"users.csv: its first line \('alice', 'fr'\) may be a header.*--no-header",
    ):
        convert(str(src), tmp_path / "out", names=["user", "country"])
    convert(str(src), tmp_path / "kept", names=["user", "country"], header=False)
    assert read(tmp_path / "kept").to_pydict() == {
        "user": ["alice", "bob", "carol"],
        "country": ["fr", "de", "us"],
    }
    src.write_text("name,age\nalice,31\n")  # a line of numbers after it: a header
    convert(str(src), tmp_path / "renamed", names=["user", "years"])
    assert read(tmp_path / "renamed").to_pydict() == {"user": ["alice"], "years": [31]}


def test_a_transform_keeps_its_rows_and_their_splits(tmp_path):
    import pyarrow.compute as pc

    src = tmp_path / "log.csv"
    src.write_text(
        "user,price,click\n" + "".join(f"u{i % 50},{i * 0.5},{i % 2}\n" for i in range(1000))
    )
    drop = lambda t: t.filter(pc.not_equal(t.column("user"), "u0"))  # noqa: E731
    for split in (None, "valid=0.3"):
        with pytest.raises(
            tabloader.InvalidArgumentError,
            match=r"transform returned [\d,]+ rows for a batch of [\d,]+ rows \(rows 1 to 1,000 of",
        ):
            convert(str(src), tmp_path / "dropped", transform=drop, split=split)
        assert not (tmp_path / "dropped").exists()

    def log_price(t: pa.Table) -> pa.Table:
        return t.append_column(
            "log_price", pa.array(np.log1p(t.column("price").to_numpy()).tolist())
        )

    with pytest.raises(
        tabloader.InvalidArgumentError,
        match=r"transform makes column 'log_price' double, but null for a batch without rows",
    ):
        convert(str(src), tmp_path / "typed", transform=log_price)
    convert(str(src), tmp_path / "plain", split="valid=0.3", split_key="user")
    convert(
        str(src),
        tmp_path / "sorted",
        split="valid=0.3",
        split_key="user",
        transform=lambda t: t.sort_by([("click", "ascending")]),
    )
    for name in ("train", "valid"):
        plain = read(tmp_path / "plain" / name).to_pylist()
        ordered = read(tmp_path / "sorted" / name).to_pylist()
        assert sorted(ordered, key=str) == sorted(plain, key=str)
