"""tabloader convert's encodings: vocabularies fitted on the training split (ids by
frequency, a minimum count, unknown values and nulls), reused for later data, hashed ids,
the parts of timestamps, a split that no encoding moves, and the same on a Dask cluster."""

from __future__ import annotations

import datetime as dt
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tabloader
from tabloader.cli import main
from tabloader.convert import categories, column_hashes, convert
from tabloader.convert.categories import ValueCounter, build_index
from tabloader.vocabulary import read_vocabulary, vocabulary_rows


def click_log(path: Path, rows: int = 3_000, seed: int = 0, *, users: int = 400) -> Path:
    """A raw click log: string ids (a few frequent users, many rare ones), a country with
    empty cells, numbers with empty cells, ISO times, a 0/1 label, and ``row``, which
    tells every raw row apart."""
    rng = np.random.default_rng(seed)
    user = rng.zipf(1.3, rows) % users
    times = dt.datetime(2024, 3, 1, tzinfo=dt.timezone.utc).timestamp() + rng.integers(
        0, 3 * 86_400, rows
    )
    table = pa.table(
        {
            "row": np.arange(rows),
            "user_id": [f"u{u}" for u in user],
            "item_id": [f"i{i}" for i in rng.integers(0, 50, rows)],
            "country": pa.array(
                [None if c == 3 else ["fr", "de", "us"][c] for c in rng.integers(0, 4, rows)]
            ),
            "price": pa.array(np.round(rng.exponential(3, rows), 2), mask=rng.random(rows) < 0.1),
            "event_time": [
                dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
                for t in times
            ],
            "label": (rng.random(rows) < 0.3).astype(np.int64),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pacsv.write_csv(table, path, pacsv.WriteOptions(quoting_style="none"))
    return path


def raw_rows(path: Path) -> pa.Table:
    return pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(strings_can_be_null=True))


def read_split(directory: Path) -> pa.Table:
    return pq.read_table(sorted(str(p) for p in directory.glob("*.parquet"))).sort_by("row")


def expected_ids(training_values: list, min_count: int) -> dict:
    """The rule: by descending count, equal counts in the order of the values' hash."""
    counts = Counter(v for v in training_values if v is not None)
    kept = [v for v, n in counts.items() if n >= min_count]
    hashes = dict(zip(kept, column_hashes(pa.array(kept, pa.string())).tolist(), strict=True))
    ordered = sorted(kept, key=lambda v: (-counts[v], hashes[v]))
    return {v: 2 + k for k, v in enumerate(ordered)}, counts


def test_categorify_counts_the_training_split_and_gives_ids_by_frequency(tmp_path):
    src = click_log(tmp_path / "clicks.csv")
    result = convert(
        src,
        tmp_path / "data",
        split={"valid": 0.2},
        categorify=["user_id", "country"],
        min_count=2,
        seed=1,
    )
    raw = raw_rows(src)
    train = read_split(tmp_path / "data" / "train")
    valid = read_split(tmp_path / "data" / "valid")
    assert train.num_rows + valid.num_rows == raw.num_rows
    in_train = train.column("row").to_pylist()
    for column in ("user_id", "country"):
        values = raw.column(column).to_pylist()
        ids, counts = expected_ids([values[r] for r in in_train], min_count=2)
        vocabulary = read_vocabulary(tmp_path / "data" / "_vocabulary", column)
        assert vocabulary.column("value").to_pylist() == sorted(ids, key=ids.get)
        assert vocabulary.column("count").to_pylist() == [
            counts[v] for v in sorted(ids, key=ids.get)
        ]
        assert (
            result.vocabulary[column]
            == len(ids) + 2
            == vocabulary_rows(tmp_path / "data" / "_vocabulary", column)
        )
        for table in (train, valid):
            wanted = [
                1 if values[r] is None else ids.get(values[r], 0)
                for r in table.column("row").to_pylist()
            ]
            assert table.column(column).to_pylist() == wanted
            assert table.schema.field(column).type == pa.int64()
    # the vocabulary knows nothing of the validation rows: users seen only there are unknown
    valid_only = {raw.column("user_id")[r].as_py() for r in valid.column("row").to_pylist()}
    valid_only -= {raw.column("user_id")[r].as_py() for r in in_train}
    assert valid_only  # the data has such users
    users = raw.column("user_id").to_pylist()
    assert all(
        i == 0
        for r, i in zip(
            valid.column("row").to_pylist(), valid.column("user_id").to_pylist(), strict=True
        )
        if users[r] in valid_only
    )
    rare = [v for v, n in Counter(users[r] for r in in_train).items() if n == 1]
    assert rare  # seen once in training: below min_count 2, so unknown
    assert any("values seen fewer than 2 times" in note for note in result.notes)
    assert any(note.startswith("country: ") and "nulls (" in note for note in result.notes)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.text(max_size=3)), max_size=300),
    st.integers(1, 3),
    st.integers(1, 50),
)
def test_ids_follow_the_rule_however_the_counts_spill(values, min_count, spill):
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        counter = ValueCounter("c", pa.string(), work)
        old = categories.SPILL_ENTRIES
        categories.SPILL_ENTRIES = spill  # many runs, merged bucket by bucket
        try:
            for start in range(0, len(values), 7):
                counter.add(pa.array(values[start : start + 7], pa.string()))
            index = build_index(counter, min_count=min_count)
        finally:
            categories.SPILL_ENTRIES = old
        ids, _ = expected_ids(values, min_count)
        probe = [*values, "not there", None]
        wanted = [1 if v is None else ids.get(v, 0) for v in probe]
        assert index.lookup(pa.array(probe, pa.string())).tolist() == wanted
        assert index.rows == len(ids) + 2
        by_id = [v for chunk, _ in index.values_by_id(chunk=5) for v in chunk.to_pylist()]
        assert by_id == sorted(ids, key=ids.get)


def test_values_whose_hashes_collide_keep_their_own_ids(tmp_path, monkeypatch):
    def weak(column):  # every value hashes to its remainder by 4: 1, 5 and 9 collide
        values = pa.compute.fill_null(column, 0).to_numpy(zero_copy_only=False)
        return (values % 4).astype(np.uint64)

    monkeypatch.setattr(categories, "column_hashes", weak)
    counter = ValueCounter("c", pa.int64(), str(tmp_path))
    counter.add(pa.array([5, 5, 5, 1, 1, 2, 9, 9]))
    monkeypatch.setattr(categories, "SPILL_ENTRIES", 2)
    counter.add(pa.array([13, 1]))
    index = build_index(counter, min_count=1)
    # counts: 5 x3, 1 x3, 9 x2, 2 x1, 13 x1; equal counts in hash order (1, 5, 9, 13 alike)
    by_id = [v for chunk, _ in index.values_by_id() for v in chunk.to_pylist()]
    assert sorted(by_id[:2]) == [1, 5] and by_id[2] == 9 and sorted(by_id[3:]) == [2, 13]
    ids = {v: 2 + k for k, v in enumerate(by_id)}
    probe = [5, 1, 9, 13, 2, 17, 21, None, 6]  # 17 and 21 collide with 1, 5, 9, 13: unknown
    assert index.lookup(pa.array(probe)).tolist() == [
        ids[5],
        ids[1],
        ids[9],
        ids[13],
        ids[2],
        0,
        0,
        1,
        0,
    ]


def test_the_same_rows_give_the_same_files_on_the_command_line_and_in_python(tmp_path):
    src = click_log(tmp_path / "clicks.csv", rows=2_000)
    options = {
        "split": {"valid": 0.1},
        "split_key": ["user_id"],
        "categorify": ["user_id", "country"],
        "min_count": 2,
        "hash_buckets": {"item_id": 64},
        "time_parts": {"event_time": ["hour", "dow", "day", "epoch"]},
        "time_zone": "Europe/Paris",
        "seed": 7,
    }
    convert(src, tmp_path / "python", **options)
    argv = [
        "convert", str(src), str(tmp_path / "cli"), "--quiet", "--split", "valid=0.1",
        "--split-key", "user_id", "--categorify", "user_id,country", "--min-count", "2",
        "--hash", "item_id=64", "--time-parts", "event_time=hour,dow,day,epoch",
        "--time-zone", "Europe/Paris", "--seed", "7",
    ]  # fmt: skip
    assert main(argv) == 0
    python_files = sorted(
        p.relative_to(tmp_path / "python") for p in (tmp_path / "python").rglob("*.parquet")
    )
    cli_files = sorted(
        p.relative_to(tmp_path / "cli") for p in (tmp_path / "cli").rglob("*.parquet")
    )
    assert python_files == cli_files and len(python_files) == 4
    for rel in python_files:
        assert (tmp_path / "python" / rel).read_bytes() == (tmp_path / "cli" / rel).read_bytes()


def test_no_encoding_or_transform_moves_a_row_to_another_split(tmp_path):
    src = click_log(tmp_path / "clicks.csv", rows=2_000)

    def rows_per_split(dest: Path) -> dict[str, list[int]]:
        return {s: read_split(dest / s).column("row").to_pylist() for s in ("train", "valid")}

    convert(src, tmp_path / "plain", split="valid=0.2", seed=3)
    plain = rows_per_split(tmp_path / "plain")
    convert(
        src,
        tmp_path / "encoded",
        split="valid=0.2",
        seed=3,
        categorify="user_id",
        hash_buckets="item_id=10",
        time_parts="event_time=hour",
        transform=lambda t: t.drop_columns(["price"]),
    )
    assert rows_per_split(tmp_path / "encoded") == plain
    assert 0.15 < len(plain["valid"]) / 2_000 < 0.25


def test_a_split_key_keeps_each_users_rows_in_one_split(tmp_path):
    src = click_log(tmp_path / "clicks.csv", rows=2_000)
    convert(src, tmp_path / "data", split="valid=0.3", split_key="user_id", seed=0)
    raw = raw_rows(src).column("user_id").to_pylist()
    owners: dict[str, set[str]] = {}
    for split in ("train", "valid"):
        for r in read_split(tmp_path / "data" / split).column("row").to_pylist():
            owners.setdefault(raw[r], set()).add(split)
    assert all(len(s) == 1 for s in owners.values())
    assert {s for v in owners.values() for s in v} == {"train", "valid"}
    with pytest.raises(tabloader.InvalidArgumentError, match=r"split_key.*needs split"):
        convert(src, tmp_path / "no-split", split_key="user_id")
    with pytest.raises(tabloader.ColumnNotFoundError, match="split_key names column 'usr'"):
        convert(src, tmp_path / "bad", split="valid=0.1", split_key="usr")


def test_a_second_day_takes_the_first_days_ids(tmp_path, capsys):
    day1 = click_log(tmp_path / "day1.csv", rows=2_000, seed=1)
    assert main(["convert", str(day1), str(tmp_path / "d1"), "--quiet", "--split",
                 "valid=0.1", "--categorify", "user_id,country"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"--vocabulary {tmp_path / 'd1' / '_vocabulary'}" in out
    day2 = click_log(tmp_path / "day2.csv", rows=1_000, seed=2)
    assert main(["convert", str(day1), str(tmp_path / "d1b"), "--quiet", "--vocabulary",
                 str(tmp_path / "d1")]) == 0  # fmt: skip
    assert main(["convert", str(day2), str(tmp_path / "d2"), "--quiet", "--vocabulary",
                 str(tmp_path / "d1" / "_vocabulary")]) == 0  # fmt: skip
    vocabulary = read_vocabulary(tmp_path / "d1" / "_vocabulary", "user_id")
    ids = {v: 2 + k for k, v in enumerate(vocabulary.column("value").to_pylist())}
    # day 1 again with its own vocabulary: every id as before
    before = pq.read_table(tmp_path / "d1" / "train").sort_by("row")
    again = pq.read_table(tmp_path / "d1b").sort_by("row")
    picked = again.filter(pa.compute.is_in(again.column("row"), before.column("row")))
    assert picked.column("user_id").to_pylist() == before.column("user_id").to_pylist()
    # day 2: known users keep their ids, new ones are unknown (0)
    raw2 = raw_rows(day2)
    users2 = raw2.column("user_id").to_pylist()
    got = pq.read_table(tmp_path / "d2").sort_by("row")
    assert got.column("user_id").to_pylist() == [ids.get(u, 0) for u in users2]
    assert set(users2) & set(ids) and set(users2) - set(ids)
    for name in ("user_id.parquet", "country.parquet"):  # the same vocabulary beside day 2
        first = (tmp_path / "d1" / "_vocabulary" / name).read_bytes()
        assert (tmp_path / "d2" / "_vocabulary" / name).read_bytes() == first
    # ids made of digits are read as text when the vocabulary holds text: "007" stays "007"
    (tmp_path / "a.csv").write_text("user,x\n007,1\nx,2\n007,3\n")
    (tmp_path / "b.csv").write_text("user,x\n7,1\n007,2\n")
    convert(str(tmp_path / "a.csv"), tmp_path / "a", categorify="user")
    convert(str(tmp_path / "b.csv"), tmp_path / "b", vocabulary=tmp_path / "a")
    assert read_split_plain(tmp_path / "b")["user"] == [0, 2]


def test_encoding_options_are_checked(tmp_path):
    src = str(click_log(tmp_path / "clicks.csv", rows=200))
    argument, column = tabloader.InvalidArgumentError, tabloader.ColumnNotFoundError
    kind = tabloader.ColumnTypeError
    cases = [
        ({"categorify": "usr_id"}, column, r"'usr_id'.*did you mean 'user_id'"),
        ({"categorify": "price"}, kind, "floating point column is a measurement"),
        ({"categorify": "user_id", "hash_buckets": "user_id=10"}, argument, "encode it once"),
        ({"hash_buckets": "item_id=1"}, argument, "at least 2"),
        ({"time_parts": "event_time=hours"}, argument, "did you mean 'hour'"),
        ({"time_parts": "price=hour"}, kind, "time parts are taken from"),
        ({"time_zone": "Mars/Olympus"}, argument, "unknown time zone"),
        ({"min_count": 0, "categorify": "user_id"}, argument, "min_count must be a positive"),
        ({"vocabulary": str(tmp_path / "none")}, tabloader.SourceNotFoundError, "does not exist"),
    ]
    for options, error, message in cases:
        with pytest.raises(error, match=message):
            convert(src, tmp_path / "out", **options)
        assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())
    convert(src, tmp_path / "fitted", categorify="user_id")
    with pytest.raises(tabloader.InvalidArgumentError, match="min_count applies when"):
        convert(src, tmp_path / "out", vocabulary=tmp_path / "fitted", min_count=2)
    with pytest.raises(tabloader.InvalidArgumentError, match="has no column 'country'"):
        convert(src, tmp_path / "out", vocabulary=tmp_path / "fitted", categorify="country")


def test_a_changed_vocabulary_file_is_refused(tmp_path):
    src = str(click_log(tmp_path / "clicks.csv", rows=300))
    convert(src, tmp_path / "fitted", categorify="country")
    path = tmp_path / "fitted" / "_vocabulary" / "country.parquet"
    table = pq.read_table(path)
    doubled = pa.concat_tables([table, table.slice(0, 1)]).replace_schema_metadata(
        {
            **table.schema.metadata,
            b"tabloader.vocabulary": table.schema.metadata[b"tabloader.vocabulary"].replace(
                b'"values": 3', b'"values": 4'
            ),
        }
    )
    pq.write_table(doubled, path)
    with pytest.raises(
        tabloader.InvalidFileError,
        match=r"holds? .* is in the vocabulary twice|is in the vocabulary twice",
    ):
        convert(src, tmp_path / "out", vocabulary=tmp_path / "fitted")


def test_hashed_ids_are_the_values_hash_and_zero_for_nulls(tmp_path):
    src = click_log(tmp_path / "clicks.csv", rows=500)
    convert(src, tmp_path / "data", hash_buckets={"country": 8, "user_id": 1_000})
    raw = raw_rows(src)
    got = read_split(tmp_path / "data")
    for column, buckets in (("country", 8), ("user_id", 1_000)):
        values = raw.column(column)
        wanted = (column_hashes(values) % np.uint64(buckets - 1)).astype(np.int64) + 1
        wanted[np.asarray(values.is_null())] = 0
        assert got.column(column).to_pylist() == wanted.tolist()
        assert min(wanted) >= 0 and max(wanted) < buckets
    assert got.column("country").null_count == 0


def test_time_parts_in_utc_or_a_zone_and_the_conversion_is_reported(tmp_path, capsys):
    src = tmp_path / "t.csv"
    src.write_text(
        "row,ts\n0,2024-03-31 00:30:00\n1,2024-03-31T23:15:00Z\n2,2024-03-31T12:00:00+02:00\n"
        "3,\n4,1970-01-01 00:00:00\n"
    )
    rows = {
        0: dt.datetime(2024, 3, 31, 0, 30, tzinfo=dt.timezone.utc),
        1: dt.datetime(2024, 3, 31, 23, 15, tzinfo=dt.timezone.utc),
        2: dt.datetime(2024, 3, 31, 10, 0, tzinfo=dt.timezone.utc),
        4: dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc),
    }
    # times without an offset are mixed with times with one in the file: not parseable as one
    with pytest.raises(tabloader.InvalidFileError, match="mixes times with and without an offset"):
        convert(str(src), tmp_path / "mixed", time_parts={"ts": ["hour"]})
    src.write_text(
        "row,ts\n0,2024-03-31T00:30:00Z\n1,2024-03-31T23:15:00Z\n2,2024-03-31T12:00:00+02:00\n"
        "3,\n4,1970-01-01T00:00:00Z\n"
    )
    parts = ["epoch", "year", "month", "day", "dow", "hour", "minute"]
    for zone in ("UTC", "Europe/Paris"):
        dest = tmp_path / zone.replace("/", "-")
        assert main(["convert", str(src), str(dest), "--quiet", "--time-parts",
                     f"ts={','.join(parts)}", "--time-zone", zone]) == 0  # fmt: skip
        printed = capsys.readouterr().out
        assert f"ts: times without an offset read in {zone}, parts counted in {zone}" in printed
        assert "1970-01-01 00:00:00 to 2024-03-31 23:15:00 UTC (1 nulls)" in printed
        got = read_split(dest)
        assert got.column_names == ["row", *(f"ts_{p}" for p in parts)]
        import zoneinfo

        local_zone = zoneinfo.ZoneInfo(zone)
        for r, when in rows.items():
            local = when.astimezone(local_zone)
            want = [int(when.timestamp()), local.year, local.month, local.day,
                    local.weekday(), local.hour, local.minute]  # fmt: skip
            assert [got.column(f"ts_{p}")[r].as_py() for p in parts] == want
        assert all(got.column(f"ts_{p}")[3].as_py() is None for p in parts)
    # Paris is UTC+2 after 2024-03-31 01:00 UTC: 23:15 UTC is 01:15 on April 1st there
    assert read_split(tmp_path / "Europe-Paris").column("ts_day")[1].as_py() == 1
    naive = tmp_path / "naive.csv"
    naive.write_text("ts\n2024-01-15 08:00:00\n")
    convert(
        str(naive), tmp_path / "naive", time_parts="ts=epoch,hour", time_zone="America/New_York"
    )
    got = read_split_plain(tmp_path / "naive")
    assert got["ts_hour"] == [8]  # a time without an offset is a time in the zone given
    assert got["ts_epoch"] == [
        int(dt.datetime(2024, 1, 15, 13, tzinfo=dt.timezone.utc).timestamp())
    ]


def read_split_plain(directory: Path) -> dict:
    return pq.read_table(sorted(str(p) for p in directory.glob("*.parquet"))).to_pydict()


def test_bad_times_are_errors_naming_the_value_and_row(tmp_path):
    src = tmp_path / "t.csv"
    src.write_text("ts\n2024-03-01 10:00:00\n01/03/2024 10:00\n")
    with pytest.raises(
        tabloader.InvalidFileError,
        match=r"holds '01/03/2024 10:00' at row 2, which is not an ISO 8601",
    ):
        convert(str(src), tmp_path / "out", time_parts="ts=hour")
    seconds = tmp_path / "s.csv"
    seconds.write_text("ts\n1709287200\n1709287200000\n")
    with pytest.raises(
        tabloader.InvalidFileError, match=r"holds 1709287200000 at row 2.*milliseconds"
    ):
        convert(str(seconds), tmp_path / "out2", time_parts="ts=hour")
    seconds.write_text("n,ts\n1,1709287200\n2,\n")
    convert(str(seconds), tmp_path / "out3", time_parts="ts=hour,epoch")
    assert read_split_plain(tmp_path / "out3") == {
        "n": [1, 2],
        "ts_hour": [10, None],
        "ts_epoch": [1709287200, None],
    }


def test_timestamps_are_written_in_a_unit_inspect_reads_back(tmp_path, capsys):
    src = tmp_path / "t.csv"
    src.write_text("user,ts\n1,2024-03-01 12:34:56\n2,2024-03-01 13:00:00\n")
    result = convert(str(src), tmp_path / "out")
    assert str(result.schema.field("ts").type) == "timestamp[ms]"
    assert str(tabloader.Dataset(str(tmp_path / "out")).schema.field("ts").type) == "timestamp[ms]"


@pytest.mark.dask
@pytest.mark.distributed
@pytest.mark.slow
def test_a_dask_cluster_gives_the_same_vocabulary_ids_and_splits(tmp_path):
    from distributed import Client, LocalCluster

    days = [click_log(tmp_path / "raw" / f"day{d}.csv", rows=1_500, seed=d) for d in range(4)]
    options = {
        "split": "valid=0.2",
        "categorify": "user_id,country",
        "min_count": 2,
        "hash_buckets": "item_id=32",
        "time_parts": "event_time=hour,dow",
    }
    here = convert([str(d) for d in days], tmp_path / "here", **options)
    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        there = convert([str(d) for d in days], tmp_path / "there", cluster=client, **options)
        workers = {w for w in client.run(os.getpid).values()}
    assert len(workers) == 3
    assert there.rows_out == here.rows_out and there.vocabulary == here.vocabulary
    for name in ("user_id", "country"):
        ours = pq.read_table(tmp_path / "here" / "_vocabulary" / f"{name}.parquet")
        theirs = pq.read_table(tmp_path / "there" / "_vocabulary" / f"{name}.parquet")
        assert theirs.equals(ours)
    for split in ("train", "valid"):
        files = sorted((tmp_path / "there" / split).glob("*.parquet"))
        assert [f.name for f in files][:2] == [
            "part-00000-00000.parquet",
            "part-00001-00000.parquet",
        ]
        ours = pq.read_table(tmp_path / "here" / split)
        theirs = pq.read_table([str(f) for f in files])
        assert theirs.equals(ours)  # the same rows, in the same order, with the same ids
    assert there.notes == here.notes


PEAK_MEMORY = """
import sys, threading, time
from tabloader.convert import convert

def anonymous():  # the process's own memory; memory-mapped files are the page cache's
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))

peak, done = [anonymous()], []
def watch():
    while not done:
        peak[0] = max(peak[0], anonymous())
        time.sleep(0.005)
threading.Thread(target=watch, daemon=True).start()
result = convert(sys.argv[1], sys.argv[2], categorify=["user"])
done.append(True)
print(result.vocabulary["user"], peak[0])
"""


@pytest.mark.slow
def test_a_vocabulary_of_ten_million_values_needs_no_more_memory_than_one_of_a_thousand(
    tmp_path,
):
    """Converting 10M rows of 10M distinct users takes about the memory of converting 10M
    rows of 1,000 users: what the vocabulary needs is on disk, never in memory (its
    values and counts alone would take about 200 MiB, a Python dict of them gigabytes)."""
    import subprocess
    import sys

    import pyarrow.compute as pc

    rows = 10_000_000
    order = np.random.default_rng(0).permutation(rows)
    peaks = {}
    for name, ids in (("distinct", order), ("few", order % 1_000)):
        text = pc.binary_join_element_wise("u", pa.array(ids + 10_000_000).cast(pa.string()), "")
        src = tmp_path / f"{name}.csv"
        pacsv.write_csv(pa.table({"user": text, "n": pa.array(ids % 7)}), src)
        del text
        done = subprocess.run(
            [sys.executable, "-c", PEAK_MEMORY, str(src), str(tmp_path / name)],
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")},
        )
        assert done.returncode == 0, done.stderr
        size, peak = map(int, done.stdout.split())
        assert size == (rows if name == "distinct" else 1_000) + 2
        peaks[name] = peak
        src.unlink()
    extra = peaks["distinct"] - peaks["few"]
    assert extra < 100 * 2**20, f"{extra / 2**20:.0f} MiB more for 10M distinct values"
    assert peaks["distinct"] < 1 * 2**30
    got = pq.read_table(tmp_path / "distinct", columns=["user"]).column("user")
    assert pc.min_max(got).as_py() == {"min": 2, "max": rows + 1}


def test_json_times_with_an_offset_are_converted_once_and_a_mix_is_refused(tmp_path):
    lines = tmp_path / "log.jsonl"
    lines.write_text(
        '{"t": "2024-03-01T12:00:00+02:00", "x": 1}\n{"t": "2024-03-01T12:00:00Z", "x": 2}\n'
    )
    table = tmp_path / "log.csv"
    table.write_text("t,x\n2024-03-01T12:00:00+02:00,1\n2024-03-01T12:00:00Z,2\n")
    wanted = {"t_epoch": [1709287200, 1709294400], "t_hour": [11, 13], "x": [1, 2]}
    for src in (lines, table):
        convert(
            str(src),
            tmp_path / f"out-{src.suffix}",
            time_parts="t=epoch,hour",
            time_zone="Europe/Paris",
        )
        assert read_split_plain(tmp_path / f"out-{src.suffix}") == wanted
    convert(str(lines), tmp_path / "kept")
    assert read_split_plain(tmp_path / "kept")["t"] == [
        dt.datetime(2024, 3, 1, 10, tzinfo=dt.timezone.utc),
        dt.datetime(2024, 3, 1, 12, tzinfo=dt.timezone.utc),
    ]
    lines.write_text('{"t": "2024-03-01 12:00:00", "x": 1}\n{"t": "2024-03-01T12:00:00+02:00"}\n')
    with pytest.raises(tabloader.InvalidFileError, match="mixes times with and without an offset"):
        convert(str(lines), tmp_path / "mixed", time_parts="t=hour")


def test_a_hashed_value_gets_one_id_whatever_type_a_days_files_are_read_as(tmp_path):
    days = {"day1": "item,click\n123,1\n456,0\n", "day2": "item,click\n123,1\nA17,0\n"}
    ids = {}
    for day, text in days.items():
        (tmp_path / f"{day}.csv").write_text(text)
        convert(str(tmp_path / f"{day}.csv"), tmp_path / day, hash_buckets="item=1000")
        ids[day] = read_split_plain(tmp_path / day)["item"]
    text_hash = column_hashes(pa.array(["123", "456", "A17"]))
    expected = [int(h % np.uint64(999)) + 1 for h in text_hash]
    assert ids == {"day1": expected[:2], "day2": [expected[0], expected[2]]}


def test_hash_buckets_beyond_int64_ids_are_refused_before_converting(tmp_path):
    src = str(click_log(tmp_path / "clicks.csv", rows=50))
    for buckets in (2**63 + 10, 10**20):
        with pytest.raises(tabloader.InvalidArgumentError, match=r"at most 2\*\*63"):
            convert(src, tmp_path / "out", hash_buckets={"item_id": buckets})
        assert main(["convert", src, str(tmp_path / "cli"), "--hash", f"item_id={buckets}"]) == 2
    assert not (tmp_path / "out").exists() and not (tmp_path / "cli").exists()


def test_text_times_after_2262_with_fractions_of_a_second_are_read(tmp_path):
    src = tmp_path / "t.csv"
    src.write_text("t,y\n9999-12-31T00:00:00.5,1\n2024-03-01 12:00:00.25,2\n")
    convert(str(src), tmp_path / "out", schema="t=string", time_parts="t=year,epoch")
    assert read_split_plain(tmp_path / "out") == {
        "t_year": [9999, 2024],
        "t_epoch": [253402214400, 1709294400],
        "y": [1, 2],
    }
