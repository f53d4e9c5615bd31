"""Delta Lake tables written by deltalake (delta-rs): Dataset.from_delta.

Every expected row set comes from deltalake's own reader of the same version, so the
tests check that tabloader loads exactly what the table holds, version by version.
Tests taking ``device`` run on the CPU backend and, marked ``gpu``, on the GPU backend
(the emulated device in CI).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader

deltalake = pytest.importorskip("deltalake")
from deltalake import DeltaTable, WriterProperties, write_deltalake  # noqa: E402
from deltalake.exceptions import DeltaError  # noqa: E402

from table_formats import (  # noqa: E402
    check_every_rank_loads_rank_zeros_version,
    check_refresh_follows_appends_overwrites_and_deletes,
    epoch,
    host,
    loader,
    rows,
)
from tabloader.cli import main  # noqa: E402
from tabloader.sources.delta import deletion_vector_message  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SMALL_GROUPS = WriterProperties(max_row_group_size=40)


def truth(path: str, version: int | None = None, **options: Any) -> np.ndarray:
    """The ids deltalake's own reader finds in the table (at ``version``)."""
    table = DeltaTable(path, version=version, **options).to_pyarrow_table(columns=["id"])
    return np.sort(table.column("id").to_numpy())


@dataclass(frozen=True)
class DeltaUnderTest:
    """A Delta table at ``path`` for the scenarios every format passes (`table_formats`)."""

    path: str
    partitioned: bool = True

    def _write(self, table: pa.Table, mode: str) -> None:
        by = ["day"] if self.partitioned else None
        write_deltalake(self.path, table, mode=mode, partition_by=by)

    def create(self, table: pa.Table) -> None:
        self._write(table, "error")

    def append(self, table: pa.Table) -> None:
        self._write(table, "append")

    def overwrite(self, table: pa.Table) -> None:
        self._write(table, "overwrite")

    def delete(self, predicate: str) -> None:
        DeltaTable(self.path).delete(predicate)

    def dataset(self, **options: Any) -> tabloader.Dataset:
        return tabloader.Dataset.from_delta(self.path, **options)

    def version(self) -> int:
        return int(DeltaTable(self.path).version())

    def truth(self, version: int | None = None) -> np.ndarray:
        return truth(self.path, version)


@pytest.fixture
def history(tmp_path: Path) -> tuple[str, list[np.ndarray]]:
    """A table with six versions: create, append, overwrite, append, delete, compact.

    Returns its path and the ids of each version, from deltalake's reader.
    """
    path = str(tmp_path / "events")
    write_deltalake(path, rows(0, 300), partition_by=["day"], writer_properties=SMALL_GROUPS)
    write_deltalake(path, rows(300, 150), mode="append", partition_by=["day"])
    write_deltalake(path, rows(1000, 100), mode="overwrite", partition_by=["day"])
    write_deltalake(path, rows(1100, 100), mode="append", partition_by=["day"])
    DeltaTable(path).delete("id < 1050")  # copy-on-write: the files are rewritten
    DeltaTable(path).optimize.compact()
    versions = [truth(path, v) for v in range(6)]
    assert DeltaTable(path).version() == 5
    return path, versions


# -- exactly once per epoch, time travel ---------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_every_version_loads_exactly_its_rows_once_per_epoch(history, device):
    path, versions = history
    for version, expected in enumerate(versions):
        ds = tabloader.Dataset.from_delta(path, version=version)
        assert ds.version == version and ds.table_format == "delta"
        assert len(ds) == len(expected)
        load = loader(ds, device)
        for _ in range(2):
            np.testing.assert_array_equal(np.sort(epoch(load)), expected)


def test_the_latest_version_by_default_and_the_same_order_for_a_seed(history):
    path, versions = history
    ds = tabloader.Dataset.from_delta(path)
    assert ds.version == 5
    first, second = epoch(loader(ds, "cpu")), epoch(loader(ds, "cpu"))
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(np.sort(first), versions[5])
    assert not np.array_equal(first, np.sort(first))  # shuffled


def test_only_the_active_files_are_read_never_the_directory(history):
    path, _ = history
    on_disk = sorted(str(p) for p in Path(path).rglob("*.parquet"))
    ds = tabloader.Dataset.from_delta(path)
    assert set(ds.files) < set(on_disk)
    assert sorted(ds.files) == sorted(u for u in DeltaTable(path).file_uris())
    with pytest.raises(tabloader.InvalidArgumentError, match="is a Delta Lake table") as info:
        tabloader.Dataset(path)
    assert "Dataset.from_delta" in str(info.value)


def test_row_counts_come_from_the_log_and_match_the_footers(history):
    path, _ = history
    actions = pa.table(DeltaTable(path).get_add_actions(flatten=True))
    ds = tabloader.Dataset.from_delta(path)
    assert len(ds) == sum(actions.column("num_records").to_pylist())
    assert ds.num_partitions > len(ds.files) - 1


def test_a_data_file_replaced_after_its_commit_is_refused(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, rows(0, 50))
    victim = DeltaTable(path).file_uris()[0]
    pq.write_table(rows(0, 10), victim)  # same name, other rows
    with pytest.raises(tabloader.InvalidFileError, match="says 50") as info:
        tabloader.Dataset.from_delta(path)
    assert "replaced after it was committed" in str(info.value)


def test_a_tables_files_read_as_plain_parquet_are_refused_from_above_inside_or_by_glob(
    tmp_path,
):
    table = tmp_path / "lake" / "events"
    write_deltalake(str(table), rows(0, 60), partition_by=["day"])
    write_deltalake(str(table), rows(0, 60), partition_by=["day"], mode="overwrite")
    (day,) = [d for d in sorted(table.iterdir()) if d.name.startswith("day=")][:1]
    (file,) = sorted(day.glob("*.parquet"))[:1]
    for spec in (tmp_path / "lake", tmp_path, day, table / "*" / "*.parquet", file):
        with pytest.raises(tabloader.InvalidArgumentError, match="a Delta Lake table") as info:
            tabloader.Dataset(str(spec))
        assert f"from_delta({str(table)!r})" in str(info.value)
    pq.write_table(rows(0, 5), tmp_path / "elsewhere.parquet")
    assert tabloader.Dataset(str(tmp_path / "elsewhere.parquet")).num_rows == 5
    with pytest.raises(tabloader.InvalidArgumentError, match="a Delta Lake table"):
        tabloader.Dataset([str(tmp_path / "elsewhere.parquet"), str(file)])
    assert tabloader.Dataset.from_delta(str(table)).num_rows == 60


def test_time_travel_errors_name_the_versions(history):
    path, _ = history
    with pytest.raises(tabloader.InvalidArgumentError) as info:
        tabloader.Dataset.from_delta(path, version=9)
    assert str(info.value) == (
        f"the Delta table {path!r} has no version 9 yet: its versions run from 0 up to 5"
    )
    with pytest.raises(tabloader.InvalidArgumentError, match="version must be a non-negative"):
        tabloader.Dataset.from_delta(path, version=-1)
    with pytest.raises(tabloader.InvalidArgumentError, match="pass one of them"):
        tabloader.Dataset.from_delta(path, version=1, refresh=True)
    with pytest.raises(tabloader.SourceNotFoundError, match="is not a Delta table"):
        tabloader.Dataset.from_delta(str(Path(path).parent / "nothing"))


# -- growing tables ------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_refresh_follows_appends_overwrites_deletes_and_compactions(tmp_path, device):
    path = str(tmp_path / "t")
    ds, load = check_refresh_follows_appends_overwrites_and_deletes(DeltaUnderTest(path), device)
    assert ds.version == 3  # create, append, overwrite, delete

    write_deltalake(path, rows(520, 20), mode="append", partition_by=["day"])
    np.testing.assert_array_equal(np.sort(epoch(load)), np.arange(500, 540))
    files_before = len(ds.files)
    DeltaTable(path).optimize.compact()
    ids = epoch(load)
    np.testing.assert_array_equal(np.sort(ids), np.arange(500, 540))  # no stale duplicate
    assert len(ds.files) < files_before and ds.version == 5


def test_without_refresh_the_version_is_fixed(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, rows(0, 50))
    load = loader(tabloader.Dataset.from_delta(path), "cpu")
    write_deltalake(path, rows(50, 50), mode="append")
    np.testing.assert_array_equal(np.sort(epoch(load)), np.arange(50))


@pytest.mark.parametrize("device", DEVICES)
def test_a_file_vacuumed_after_the_version_was_loaded_is_said_to_be_removed(tmp_path, device):
    path = str(tmp_path / "t")
    write_deltalake(path, rows(0, 50))
    load = loader(tabloader.Dataset.from_delta(path), device)
    write_deltalake(path, rows(50, 50), mode="overwrite")
    DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(tabloader.ReadError) as info:
        epoch(load)
    message = str(info.value)
    assert "deleted or rewritten since the dataset listed it" in message
    assert "refresh=True" in message and "corrupt" not in message


def test_the_decoded_cache_is_keyed_by_the_table_version(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, rows(0, 64))
    load = loader(tabloader.Dataset.from_delta(path, refresh=True), "cpu", cache="memory")
    np.testing.assert_array_equal(np.sort(epoch(load)), np.arange(64))
    assert load.cache is not None
    table = load.cache.key["files"][0]
    assert (table["path"], table["version"], table["reading"]["schema"][0]) == (
        "delta table",
        0,
        ["id", "int64"],
    )
    write_deltalake(path, rows(64, 64), mode="append")
    np.testing.assert_array_equal(np.sort(epoch(load)), np.arange(128))
    table = load.cache.key["files"][0]
    assert (table["path"], table["version"], table["reading"]["schema"][0]) == (
        "delta table",
        1,
        ["id", "int64"],
    )
    np.testing.assert_array_equal(np.sort(epoch(load)), np.arange(128))  # from the cache


# -- partitions ----------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("filters", "keep"),
    [
        ([("day", "<", 2)], lambda d: d < 2),
        ([("day", "in", [0, 4])], lambda d: (d == 0) | (d == 4)),
        ([[("day", "=", 1)], [("day", ">=", 4)]], lambda d: (d == 1) | (d >= 4)),
        ([("day", "!=", 3), ("day", ">", 0)], lambda d: (d != 3) & (d > 0)),
    ],
)
def test_filters_skip_whole_files_and_len_is_exact(tmp_path, device, filters, keep):
    path = str(tmp_path / "t")
    write_deltalake(path, rows(0, 500, days=5), partition_by=["day"])
    ds = tabloader.Dataset.from_delta(path, filters=filters)
    ids = np.arange(500)
    expected = ids[keep(ids % 5)]
    assert len(ds) == len(expected)
    assert ds.files_skipped == 5 - len(ds.files)
    load = loader(ds, device, cats=["id", "day"])
    for _ in range(2):
        batches = list(load)
        got = np.concatenate([host(b["id"]) for b in batches])
        days = np.concatenate([host(b["day"]) for b in batches])
        np.testing.assert_array_equal(np.sort(got), expected)
        np.testing.assert_array_equal(days, got % 5)  # the key, delivered, belongs to its row


@pytest.mark.parametrize("device", DEVICES)
def test_partition_keys_are_delivered_as_features_with_the_tables_type(tmp_path, device):
    path = str(tmp_path / "t")
    write_deltalake(path, rows(0, 300), partition_by=["day"], writer_properties=SMALL_GROUPS)
    ds = tabloader.Dataset.from_delta(path)
    assert ds.partition_keys == {"day": pa.int32()}
    assert ds.schema.field("day").type == pa.int32()
    load = loader(ds, device, cats=["id"], conts=["day"], labels=["x"], parts_per_chunk=3)
    batches = list(load)
    ids = np.concatenate([host(b["id"]) for b in batches])
    np.testing.assert_array_equal(np.concatenate([host(b["day"]) for b in batches]), ids % 3)
    np.testing.assert_array_equal(np.concatenate([host(b["x"]) for b in batches]), ids / 4)
    assert host(batches[0]["day"]).dtype == np.float32  # a cont, delivered as one
    part = int(np.flatnonzero(ds.partition_rows)[0])
    assert ds.partition_values(part) == {"day": ds.read_partition(part, ["day"])["day"][0].as_py()}


def test_a_null_partition_value_needs_fill_null(tmp_path):
    path = str(tmp_path / "t")
    table = rows(0, 30).set_column(1, "day", pa.array([None, 1, 2] * 10, pa.int32()))
    write_deltalake(path, table, partition_by=["day"])
    ds = tabloader.Dataset.from_delta(path)
    with pytest.raises(tabloader.NullValuesError, match="fill_null"):
        tabloader.Loader(ds, cats=["day"], batch_size=8)
    load = tabloader.Loader(ds, cats=["id", "day"], batch_size=8, fill_null={"day": -1})
    batches = list(load)
    ids = np.concatenate([b["id"] for b in batches])
    days = np.concatenate([b["day"] for b in batches])
    np.testing.assert_array_equal(days, np.array([-1, 1, 2])[ids % 3])
    # a null key fails every comparison on it, as a null compares in pyarrow
    assert len(tabloader.Dataset.from_delta(path, filters=[("day", "!=", 1)])) == 10


def test_string_and_escaped_partition_values(tmp_path):
    path = str(tmp_path / "t")
    table = pa.table({"id": np.arange(6), "city": ["a b", "x/y", "é", "a b", "x/y", "é"]})
    write_deltalake(path, table, partition_by=["city"])
    ds = tabloader.Dataset.from_delta(path, filters=[("city", "in", ["x/y", "é"])])
    assert len(ds) == 4
    got = sorted(ds.partition_values(p)["city"] for p in range(ds.num_partitions))
    assert got == ["x/y", "é"]
    with pytest.raises(tabloader.ColumnTypeError):
        tabloader.Loader(ds, cats=["city"], batch_size=2)


@pytest.mark.parametrize("where", ["my table", "café", "100% sure"])
def test_a_table_under_a_directory_whose_name_must_be_escaped_loads(tmp_path, where):
    # The log holds paths URI-encoded, and deltalake's file URIs keep the table's own
    # location encoded: a space, a non-ASCII letter or a % is decoded once, no more.
    path = str(tmp_path / where / "t")
    table = pa.table({"id": np.arange(12), "city": ["a b", "100%", "x%20y"] * 4})
    write_deltalake(path, table, partition_by=["city"])
    ds = tabloader.Dataset.from_delta(path)
    got = {}
    for p in range(ds.num_partitions):
        for piece in ds.iter_pieces([(p, 0, ds.partition_rows[p])], ["id"]):
            got.update(
                dict.fromkeys(piece.column("id").to_pylist(), ds.partition_values(p)["city"])
            )
    truth = DeltaTable(path).to_pyarrow_table()
    ids, cities = truth.column("id").to_pylist(), truth.column("city").to_pylist()
    assert got == dict(zip(ids, cities, strict=True))


def test_filters_are_checked_against_the_partition_keys(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, rows(0, 30), partition_by=["day"])
    with pytest.raises(tabloader.InvalidArgumentError, match="not a partition key") as info:
        tabloader.Dataset.from_delta(path, filters=[("x", "<", 3.0)])
    message = str(info.value)
    assert "'x' is a column stored in the files" in message and "partition keys: day" in message
    assert "filter the batches yourself" in message
    with pytest.raises(tabloader.InvalidArgumentError, match="not a column of"):
        tabloader.Dataset.from_delta(path, filters=[("nope", "=", 1)])
    with pytest.raises(tabloader.InvalidArgumentError, match="with str '1'"):
        tabloader.Dataset.from_delta(path, filters=[("day", "=", "1")])
    with pytest.raises(tabloader.SourceNotFoundError, match="leave none of the 3 data files"):
        tabloader.Dataset.from_delta(path, filters=[("day", ">", 9)])


# -- schema evolution and refused features -------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_a_column_added_later_is_null_in_older_files(tmp_path, device):
    path = str(tmp_path / "t")
    write_deltalake(path, rows(0, 40))
    later = rows(40, 40).append_column("extra", pa.array(np.arange(40, 80) * 10))
    write_deltalake(path, later, mode="append", schema_mode="merge")
    ds = tabloader.Dataset.from_delta(path)
    with pytest.raises(tabloader.NullValuesError, match="'extra'"):
        tabloader.Loader(ds, cats=["extra"], batch_size=8, device=device)
    load = loader(ds, device, cats=["id", "extra"], fill_null={"extra": -1})
    batches = list(load)
    ids = np.concatenate([host(b["id"]) for b in batches])
    extra = np.concatenate([host(b["extra"]) for b in batches])
    np.testing.assert_array_equal(extra, np.where(ids < 40, -1, ids * 10))


def test_column_mapping_is_refused_naming_it(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, rows(0, 10), configuration={"delta.columnMapping.mode": "name"})
    with pytest.raises(tabloader.UnsupportedTableError, match="uses column mapping") as info:
        tabloader.Dataset.from_delta(path)
    assert "delta.columnMapping.mode='name'" in str(info.value)


def test_reader_version_2_without_column_mapping_loads_as_deltalake_reads_it(tmp_path):
    path = str(tmp_path / "t")
    settings = {
        "delta.columnMapping.mode": "none",
        "delta.minReaderVersion": "2",
        "delta.minWriterVersion": "5",
    }
    write_deltalake(path, rows(0, 30), configuration=settings)
    write_deltalake(path, rows(30, 20), mode="append")
    assert DeltaTable(path).protocol().min_reader_version == 2
    ds = tabloader.Dataset.from_delta(path)
    np.testing.assert_array_equal(np.sort(epoch(loader(ds, "cpu"))), truth(path))


def test_a_version_cleaned_up_after_a_checkpoint_names_the_versions_that_load(tmp_path):
    path = str(tmp_path / "t")
    retention = {"delta.logRetentionDuration": "interval 0 seconds"}
    write_deltalake(path, rows(0, 10), configuration=retention)
    for start in range(10, 50, 10):
        write_deltalake(path, rows(start, 10), mode="append")
    DeltaTable(path).create_checkpoint()  # at version 4
    write_deltalake(path, rows(50, 10), mode="append")
    DeltaTable(path).cleanup_metadata()  # versions 0..3 leave the log
    with pytest.raises(DeltaError):
        DeltaTable(path, version=2)
    with pytest.raises(tabloader.InvalidArgumentError) as info:
        tabloader.Dataset.from_delta(path, version=2)
    assert str(info.value).startswith(
        f"version 2 of the Delta table {path!r} is no longer in its log: versions before a "
        "checkpoint are deleted once older than the table's delta.logRetentionDuration. Its "
        "versions run from 4 up to 5; load one of them"
    )
    for version in (4, 5):
        ds = tabloader.Dataset.from_delta(path, version=version)
        np.testing.assert_array_equal(np.sort(epoch(loader(ds, "cpu"))), truth(path, version))
    assert main(["inspect", path, "--version", "3"]) == 2


def test_deletion_vectors_enabled_but_unused_load_and_used_ones_are_refused(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, rows(0, 20), configuration={"delta.enableDeletionVectors": "true"})
    DeltaTable(path).delete("id < 5")  # delta-rs rewrites the file: no vector is written
    assert "deletionVectors" in DeltaTable(path).protocol().reader_features
    ds = tabloader.Dataset.from_delta(path)  # (deltalake's own reader refuses this table)
    np.testing.assert_array_equal(np.sort(epoch(loader(ds, "cpu"))), np.arange(5, 20))
    # delta-rs cannot write deletion vectors; the refusal a table with them gets:
    message = deletion_vector_message(
        "the Delta table 't' (version 3)", "on 2 file(s) (first: part-0.parquet)"
    )
    assert "deletion vectors on 2 file(s) (first: part-0.parquet)" in message
    assert "would deliver deleted rows" in message and "PURGE" in message


def test_a_version_whose_deletion_vector_file_is_missing_is_refused_naming_it(tmp_path):
    """A log that names a deletion vector whose file is gone (vacuumed, or not copied):
    tabloader's refusal, not deltalake's error."""
    path = tmp_path / "t"
    write_deltalake(str(path), rows(0, 20), configuration={"delta.enableDeletionVectors": "true"})
    (commit,) = sorted((path / "_delta_log").glob("*.json"))
    actions = [json.loads(line) for line in commit.read_text().splitlines()]
    for action in actions:
        if "add" in action:  # the spec's example of a vector stored in its own file
            action["add"]["deletionVector"] = {
                "storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 4,
                "sizeInBytes": 40, "cardinality": 6,
            }  # fmt: skip
    commit.write_text("".join(json.dumps(a) + "\n" for a in actions))
    with pytest.raises(tabloader.UnsupportedTableError, match="has deletion vectors") as info:
        tabloader.Dataset.from_delta(str(path))
    message = str(info.value)
    assert "reading them failed" in message and "deletion_vector_" in message
    assert "would deliver deleted rows" in message


def test_missing_deltalake_is_an_install_hint(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "deltalake", None)
    with pytest.raises(ImportError, match=r"pip install 'tabloader\[delta\]'"):
        tabloader.Dataset.from_delta(str(tmp_path))


def test_importing_tabloader_imports_no_table_library():
    code = (
        "import sys, tabloader; "
        "print([m for m in ('deltalake', 'pyiceberg', 'polars') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- inspect -------------------------------------------------------------------------------


def test_inspect_shows_version_files_partitions_and_filters(history, capsys):
    path, versions = history
    assert main(["inspect", path, "--version", "1", "--filter", "day<2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["partitions"] == {
        "format": "delta",
        "version": 1,
        "keys": {"day": "int32"},
        "filters": ["day < 2"],
        "files_skipped": 2,
    }
    assert report["rows"] == int(np.sum(versions[1] % 3 < 2))
    assert main(["inspect", path, "--filter", "day in 0,1"]) == 0
    text = capsys.readouterr().out
    assert "delta table, version 5" in text
    assert "partition keys (types from the table's schema): day int32" in text
    assert "filters: day in (0, 1);" in text
    assert main(["inspect", path, "--filter", "x<1"]) == 2
    assert "not a partition key" in capsys.readouterr().err


# -- object storage ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3-compatible server on a free loopback port, as in test_remote."""
    pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host_, port = server.get_host_and_port()
    endpoint = f"http://{host_}:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket="tables")
    yield endpoint
    server.stop()


def test_a_table_on_s3_loads_with_the_usual_storage_options(s3_endpoint):
    uri = f"s3://tables/{uuid.uuid4().hex[:8]}"
    writer = {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
    }
    write_deltalake(uri, rows(0, 200), partition_by=["day"], storage_options=writer)
    write_deltalake(uri, rows(1000, 100), mode="overwrite", storage_options=writer)
    fsspec_options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    }
    ds = tabloader.Dataset.from_delta(uri, storage_options=fsspec_options)
    assert ds.version == 1 and all(f.startswith("tables/") for f in ds.files)
    np.testing.assert_array_equal(np.sort(epoch(loader(ds, "cpu"))), np.arange(1000, 1100))
    old = tabloader.Dataset.from_delta(
        uri, version=0, storage_options=fsspec_options, filters=[("day", "=", 2)]
    )
    ids = np.arange(200)
    np.testing.assert_array_equal(np.sort(epoch(loader(old, "cpu"))), ids[ids % 3 == 2])
    assert "s3://tables/" in old.describe_partition(0)
    # the object store's request options, as Dataset takes them (its errors name them)
    tuned = tabloader.Dataset.from_delta(
        uri, storage_options=fsspec_options, retry_seconds=5, request_timeout=10,
        max_concurrent_reads=2,
    )  # fmt: skip
    np.testing.assert_array_equal(np.sort(epoch(loader(tuned, "cpu"))), np.arange(1000, 1100))
    with pytest.raises(tabloader.InvalidArgumentError, match="retry_seconds"):
        tabloader.Dataset.from_delta(uri, storage_options=fsspec_options, retry_seconds=-1)
    # the directory above the table, read as plain parquet, is refused as the table is
    parent = uri.rsplit("/", 1)[0]
    for spec in (parent, f"{uri}/*/*.parquet", f"{parent}/**/*.parquet"):
        with pytest.raises(tabloader.InvalidArgumentError, match="a Delta Lake table") as info:
            tabloader.Dataset(spec, storage_options=fsspec_options)
        assert f"from_delta({uri!r})" in str(info.value)
    old_version = tabloader.Dataset.from_delta(uri, version=0, storage_options=fsspec_options)
    day = old_version.files[0].rsplit("/", 1)[0]  # a partition's directory, inside the table
    with pytest.raises(tabloader.InvalidArgumentError, match="a Delta Lake table"):
        tabloader.Dataset(f"s3://{day}/", storage_options=fsspec_options)


def test_a_missing_bucket_is_said_at_once_not_retried(s3_endpoint):
    import time

    fsspec_options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    }
    started = time.monotonic()
    with pytest.raises(tabloader.SourceNotFoundError, match=r"bucket .* does not exist"):
        tabloader.Dataset.from_delta(
            "s3://no-such-bucket/t", storage_options=fsspec_options, retry_seconds=30
        )
    assert time.monotonic() - started < 10  # not the 30 s a network failure gets


def test_the_log_on_s3_is_retried_as_the_data_files_are(s3_endpoint):
    """An outage shorter than retry_seconds pauses a refreshing epoch, as it does reading
    data files; what retrying cannot change (a version the table does not have) is said
    at once."""
    import threading
    import time

    from netproxy import NetProxy

    uri = f"s3://tables/{uuid.uuid4().hex[:8]}"
    writer = {
        "AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true", "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
    }  # fmt: skip
    write_deltalake(uri, rows(0, 200), storage_options=writer)
    host, port = s3_endpoint.rsplit("/", 1)[1].split(":")
    proxy = NetProxy((host, int(port)))
    try:
        options = {
            "key": "testing", "secret": "testing",
            "client_kwargs": {"endpoint_url": proxy.url, "region_name": "us-east-1"},
        }  # fmt: skip
        ds = tabloader.Dataset.from_delta(
            uri, storage_options=options, refresh=True, retry_seconds=60
        )
        reading = loader(ds, "cpu")
        assert len(epoch(reading)) == 200
        write_deltalake(uri, rows(1000, 50), mode="append", storage_options=writer)
        proxy.outage()  # as the next epoch lists the table again
        threading.Timer(6.0, proxy.restore).start()  # longer than delta-rs retries alone
        assert len(epoch(reading)) == 250
        started = time.monotonic()
        with pytest.raises(tabloader.InvalidArgumentError, match="has no version 9"):
            tabloader.Dataset.from_delta(uri, version=9, storage_options=options)
        assert time.monotonic() - started < 20
    finally:
        proxy.close()


# -- ranks and worker processes ------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.distributed
@pytest.mark.slow
def test_every_rank_loads_rank_zeros_version(tmp_path):
    table = DeltaUnderTest(str(tmp_path / "t"), partitioned=False)
    assert check_every_rank_loads_rank_zeros_version(table) == [0, 1]


def _identity(batch: Any) -> Any:
    return batch


@pytest.mark.torch
@pytest.mark.slow
def test_worker_processes_read_the_version_of_the_training_process(tmp_path):
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    path = str(tmp_path / "t")
    write_deltalake(path, rows(0, 120), partition_by=["day"], writer_properties=SMALL_GROUPS)
    itr = TorchAsyncItr(
        tabloader.Dataset.from_delta(path, refresh=True),
        cats=["id", "day"],
        batch_size=10,
        device="cpu",
    )
    torch_loader = DLDataLoader(
        itr, collate_fn=_identity, num_workers=2, multiprocessing_context="spawn"
    )
    for e in range(2):
        cats = np.concatenate([b[0].numpy() for b in torch_loader])
        np.testing.assert_array_equal(np.sort(cats[:, 0]), truth(path))
        np.testing.assert_array_equal(cats[:, 1], cats[:, 0] % 3)
        write_deltalake(path, rows(500 + 100 * e, 30), mode="append", partition_by=["day"])
    assert os.path.isdir(os.path.join(path, "_delta_log"))
