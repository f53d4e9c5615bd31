"""Apache Iceberg tables written by pyiceberg (SQL catalog on SQLite, local warehouse):
Dataset.from_iceberg.

Expected rows come from pyiceberg's own scan of the same snapshot. Tests taking
``device`` run on the CPU backend and, marked ``gpu``, on the GPU backend (the emulated
device in CI).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader

pytest.importorskip("pyiceberg")
pytest.importorskip("sqlalchemy")
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
)

from tabloader.cli import main

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "day", IntegerType(), required=False),
    NestedField(3, "x", DoubleType(), required=False),
)
BY_DAY = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "day"))


def rows(start: int, n: int, *, days: int = 3) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {"id": ids, "day": (ids % days).astype(np.int32), "x": ids.astype(np.float64) / 4.0}
    )


def host(array: Any) -> np.ndarray:
    return array.get() if hasattr(array, "get") else np.asarray(array)


def epoch(loader: tabloader.Loader, column: str = "id") -> np.ndarray:
    return np.concatenate([host(b[column]) for b in loader])


def loader(ds: tabloader.Dataset, device: str, **options: Any) -> tabloader.Loader:
    defaults: dict[str, Any] = {"cats": ["id"], "batch_size": 32, "shuffle": True, "seed": 7}
    return tabloader.Loader(ds, device=device, **{**defaults, **options})


def truth(table: Any, snapshot_id: int | None = None) -> np.ndarray:
    """The ids pyiceberg's own scan finds (in ``snapshot_id``)."""
    scanned = table.scan(snapshot_id=snapshot_id, selected_fields=("id",)).to_arrow()
    return np.sort(scanned.column("id").to_numpy())


def open_catalog(where: Path) -> SqlCatalog:
    return SqlCatalog("test", uri=f"sqlite:///{where}/catalog.db", warehouse=f"file://{where}")


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    found = open_catalog(tmp_path)
    found.create_namespace("db")
    return found


@pytest.fixture
def history(catalog: SqlCatalog) -> tuple[Any, list[int]]:
    """A table partitioned by day with five snapshots: append, append, overwrite, delete
    (copy-on-write), append. Returns the table and its snapshot ids in order."""
    table = catalog.create_table("db.events", schema=SCHEMA, partition_spec=BY_DAY)
    table.append(rows(0, 300))
    table.append(rows(300, 150))
    table.overwrite(rows(1000, 100))
    table.delete("id < 1050")
    table.append(rows(1100, 60))
    return table, [s.snapshot_id for s in table.snapshots()]


# -- exactly once per epoch, time travel ---------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_every_snapshot_loads_exactly_its_rows_once_per_epoch(history, device):
    table, snapshots = history
    assert len(snapshots) >= 5
    for snapshot_id in snapshots:
        expected = truth(table, snapshot_id)
        if not len(expected):
            continue  # an overwrite commits a delete snapshot first
        ds = tabloader.Dataset.from_iceberg(table, snapshot_id=snapshot_id)
        assert ds.version == snapshot_id and ds.table_format == "iceberg"
        assert len(ds) == len(expected)
        load = loader(ds, device)
        for _ in range(2):
            np.testing.assert_array_equal(np.sort(epoch(load)), expected)


def test_the_current_snapshot_by_default_from_a_table_or_a_catalog(history, catalog):
    table, snapshots = history
    for source in (table, (catalog, "db.events"), (catalog, ("db", "events"))):
        ds = tabloader.Dataset.from_iceberg(source)
        assert ds.version == snapshots[-1]
        np.testing.assert_array_equal(np.sort(epoch(loader(ds, "cpu"))), truth(table))
    on_disk = {str(p) for p in Path(table.location().removeprefix("file://")).rglob("*.parquet")}
    assert set(ds.files) < on_disk  # the overwritten and deleted files are not read
    with pytest.raises(tabloader.InvalidArgumentError, match="is an Apache Iceberg table"):
        tabloader.Dataset(table.location().removeprefix("file://"))


def test_bad_arguments_are_clear_errors(history, catalog):
    table, snapshots = history
    with pytest.raises(tabloader.InvalidArgumentError, match="has no snapshot 12345"):
        tabloader.Dataset.from_iceberg(table, snapshot_id=12345)
    with pytest.raises(tabloader.InvalidArgumentError, match="pass one of them"):
        tabloader.Dataset.from_iceberg(table, snapshot_id=snapshots[0], refresh=True)
    with pytest.raises(tabloader.SourceNotFoundError, match=r"has no table 'db\.nope'"):
        tabloader.Dataset.from_iceberg((catalog, "db.nope"))
    with pytest.raises(tabloader.InvalidArgumentError, match="takes a pyiceberg Table"):
        tabloader.Dataset.from_iceberg("db.events")
    empty = catalog.create_table("db.empty", schema=SCHEMA)
    with pytest.raises(tabloader.SourceNotFoundError, match="has no snapshot yet"):
        tabloader.Dataset.from_iceberg(empty)


def test_missing_pyiceberg_is_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyiceberg", None)
    with pytest.raises(ImportError, match=r"pip install 'tabloader\[iceberg\]'"):
        tabloader.Dataset.from_iceberg(object())


# -- growing tables ------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_refresh_follows_appends_overwrites_and_deletes(catalog, device):
    table = catalog.create_table("db.t", schema=SCHEMA, partition_spec=BY_DAY)
    table.append(rows(0, 100))
    ds = tabloader.Dataset.from_iceberg((catalog, "db.t"), refresh=True)
    load = loader(ds, device)
    np.testing.assert_array_equal(np.sort(epoch(load)), np.arange(100))

    table.append(rows(100, 60))  # this table object commits; the dataset's own reloads
    load.refresh(1)
    assert len(load) == -(-160 // 32) and ds.version == table.current_snapshot().snapshot_id
    np.testing.assert_array_equal(np.sort(epoch(load)), np.arange(160))

    table.overwrite(rows(500, 40))
    np.testing.assert_array_equal(np.sort(epoch(load)), np.arange(500, 540))

    table.delete("id >= 520")
    np.testing.assert_array_equal(np.sort(epoch(load)), np.arange(500, 520))
    np.testing.assert_array_equal(truth(table), np.arange(500, 520))


# -- schema evolution: matched by field id -------------------------------------------------


@pytest.fixture
def evolved(catalog: SqlCatalog) -> tuple[Any, int]:
    """x renamed to price and a column extra added after the first append."""
    table = catalog.create_table("db.evolved", schema=SCHEMA, partition_spec=BY_DAY)
    table.append(rows(0, 90))
    first = table.current_snapshot().snapshot_id
    with table.update_schema() as update:
        update.rename_column("x", "price")
        update.add_column("extra", LongType())
    later = rows(90, 60).rename_columns(["id", "day", "price"])
    table.append(later.append_column("extra", pa.array(np.arange(90, 150) * 10)))
    return table, first


@pytest.mark.parametrize("device", DEVICES)
def test_a_renamed_column_loads_under_its_current_name(evolved, device):
    table, first = evolved
    ds = tabloader.Dataset.from_iceberg(table)
    assert ds.schema.names == ["id", "day", "price", "extra"]
    load = loader(ds, device, cats=["id"], conts=["price"], parts_per_chunk=4)
    batches = list(load)
    ids = np.concatenate([host(b["id"]) for b in batches])
    np.testing.assert_array_equal(np.sort(ids), np.arange(150))
    np.testing.assert_allclose(np.concatenate([host(b["price"]) for b in batches]), ids / 4)
    with pytest.raises(tabloader.ColumnNotFoundError, match="'x'"):
        tabloader.Loader(ds, conts=["x"], batch_size=8)
    # time travel reads the snapshot under the schema it was written with
    old = tabloader.Dataset.from_iceberg(table, snapshot_id=first)
    assert old.schema.names == ["id", "day", "x"]
    batches = list(loader(old, device, conts=["x"]))
    ids = np.concatenate([host(b["id"]) for b in batches])
    np.testing.assert_allclose(np.concatenate([host(b["x"]) for b in batches]), ids / 4)


@pytest.mark.parametrize("device", DEVICES)
def test_an_added_column_is_null_in_older_files_and_fill_null_decides(evolved, device):
    table, _ = evolved
    ds = tabloader.Dataset.from_iceberg(table)
    with pytest.raises(tabloader.NullValuesError, match="'extra'"):
        tabloader.Loader(ds, cats=["extra"], batch_size=8, device=device)
    batches = list(loader(ds, device, cats=["id", "extra"], fill_null={"extra": -1}))
    ids = np.concatenate([host(b["id"]) for b in batches])
    extra = np.concatenate([host(b["extra"]) for b in batches])
    np.testing.assert_array_equal(extra, np.where(ids < 90, -1, ids * 10))


def test_a_dataset_travels_to_another_process_without_its_catalog(evolved):
    table, _ = evolved
    ds = tabloader.Dataset.from_iceberg(table, refresh=True)
    copy = pickle.loads(pickle.dumps(ds))
    columns = ["id", "price", "extra"]
    for p in range(ds.num_partitions):
        assert copy.read_partition(p, columns).equals(ds.read_partition(p, columns))
    with pytest.raises(tabloader.UnsupportedTableError, match="without its catalog"):
        copy.refresh(epoch=5)


def test_a_promoted_type_reads_from_files_written_before(catalog):
    schema = Schema(NestedField(1, "id", IntegerType(), required=False))
    table = catalog.create_table("db.promoted", schema=schema)
    table.append(pa.table({"id": pa.array(range(20), pa.int32())}))
    with table.update_schema() as update:
        update.update_column("id", LongType())
    table.append(pa.table({"id": pa.array(range(20, 30), pa.int64())}))
    ds = tabloader.Dataset.from_iceberg(table)
    assert ds.schema.field("id").type == pa.int64()
    np.testing.assert_array_equal(np.sort(epoch(loader(ds, "cpu"))), np.arange(30))


# -- partitions ----------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_filters_on_identity_partitions_skip_whole_files(catalog, device):
    table = catalog.create_table("db.t", schema=SCHEMA, partition_spec=BY_DAY)
    table.append(rows(0, 500, days=5))
    ds = tabloader.Dataset.from_iceberg(table, filters=[[("day", "<", 2)], [("day", "=", 4)]])
    ids = np.arange(500)
    expected = ids[(ids % 5 < 2) | (ids % 5 == 4)]
    assert len(ds) == len(expected) and ds.files_skipped == 2
    assert ds.partition_keys == {"day": pa.int32()}
    batches = list(loader(ds, device, cats=["id", "day"]))
    got = np.concatenate([host(b["id"]) for b in batches])
    np.testing.assert_array_equal(np.sort(got), expected)
    np.testing.assert_array_equal(np.concatenate([host(b["day"]) for b in batches]), got % 5)
    with pytest.raises(tabloader.InvalidArgumentError, match="'x' is a column stored"):
        tabloader.Dataset.from_iceberg(table, filters=[("x", "<", 3.0)])


def test_a_column_partitioned_by_a_transform_is_not_a_filterable_key(catalog):
    spec = PartitionSpec(PartitionField(1, 1000, BucketTransform(4), "id_bucket"))
    table = catalog.create_table("db.bucketed", schema=SCHEMA, partition_spec=spec)
    table.append(rows(0, 40))
    ds = tabloader.Dataset.from_iceberg(table)
    assert ds.partition_keys == {}
    with pytest.raises(tabloader.InvalidArgumentError, match="not a partition key"):
        tabloader.Dataset.from_iceberg(table, filters=[("id", "=", 3)])


# -- delete files: refused -----------------------------------------------------------------


def _commit_delete_file(
    table: Any, content: DataFileContent, data: pa.Table, **fields: Any
) -> None:
    """Commit a delete file through pyiceberg's own snapshot producer, as a merge-on-read
    writer (Spark, Flink) would leave one: the snapshot is valid and pyiceberg's scan
    applies it."""
    location = table.location().removeprefix("file://")
    path = f"{location}/data/delete-{content.name.lower()}.parquet"
    pq.write_table(data, path)
    delete_file = DataFile.from_args(
        content=content,
        file_path=f"file://{path}",
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=data.num_rows,
        file_size_in_bytes=os.path.getsize(path),
        **fields,
    )
    delete_file.spec_id = table.spec().spec_id
    with table.transaction() as transaction, transaction.update_snapshot().fast_append() as add:
        add.append_data_file(delete_file)


def test_position_deletes_are_refused_naming_them(catalog):
    table = catalog.create_table("db.pos", schema=SCHEMA, properties={"format-version": "2"})
    table.append(rows(0, 10))
    data_file = next(iter(table.scan().plan_files())).file.file_path
    schema = pa.schema(
        [
            pa.field("file_path", pa.string(), False, {"PARQUET:field_id": "2147483546"}),
            pa.field("pos", pa.int64(), False, {"PARQUET:field_id": "2147483545"}),
        ]
    )
    deletes = pa.table({"file_path": [data_file], "pos": [3]}, schema=schema)
    _commit_delete_file(table, DataFileContent.POSITION_DELETES, deletes)
    assert len(truth(table)) == 9  # pyiceberg applies it
    with pytest.raises(tabloader.UnsupportedTableError, match="has position delete files") as info:
        tabloader.Dataset.from_iceberg(table)
    assert "does not apply delete files" in str(info.value)
    assert "copy-on-write" in str(info.value)


def test_equality_deletes_are_refused_naming_them(catalog):
    table = catalog.create_table("db.eq", schema=SCHEMA, properties={"format-version": "2"})
    table.append(rows(0, 10))
    deletes = pa.table({"id": pa.array([3], pa.int64())})
    _commit_delete_file(table, DataFileContent.EQUALITY_DELETES, deletes, equality_ids=[1])
    with pytest.raises(tabloader.UnsupportedTableError, match="has equality delete files"):
        tabloader.Dataset.from_iceberg(table)


# -- inspect -------------------------------------------------------------------------------


def test_inspect_reads_a_table_without_its_catalog(history, capsys):
    table, snapshots = history
    location = table.location().removeprefix("file://")
    assert main(["inspect", location, "--filter", "day<2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["partitions"] == {
        "format": "iceberg",
        "version": snapshots[-1],
        "keys": {"day": "int32"},
        "filters": ["day < 2"],
        "files_skipped": sum(t.file.partition[0] >= 2 for t in table.scan().plan_files()),
    }
    ids = truth(table)
    assert report["rows"] == int(np.sum(ids % 3 < 2))
    assert main(["inspect", table.metadata_location, "--version", str(snapshots[0])]) == 0
    text = capsys.readouterr().out
    assert f"iceberg table, snapshot {snapshots[0]}" in text and "300 rows" in text


# -- ranks ---------------------------------------------------------------------------------


def _rank_snapshots(rank: int, where: str) -> list[Any]:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        catalog = open_catalog(Path(where))
        ds = tabloader.Dataset.from_iceberg((catalog, "db.t"), refresh=True)
        load = tabloader.Loader(
            ds, cats=["id"], batch_size=16, shuffle=True, seed=3, global_rank=rank, global_size=2
        )
        seen = []
        for e in range(2):
            dist.barrier()
            if rank == 1:
                # Rank 0 loads the current snapshot at once; this rank commits another
                # before it asks: it must still load rank 0's.
                time.sleep(1.0)
                catalog.load_table("db.t").append(rows(1000 * (e + 1), 40))
            ids = epoch(load)
            seen.append((ds.version, len(load), ids.tolist()))
        return seen
    finally:
        dist.destroy_process_group()


@pytest.mark.torch
@pytest.mark.distributed
@pytest.mark.slow
def test_every_rank_loads_rank_zeros_snapshot(catalog, tmp_path):
    from test_torch_distributed import _run_ranks

    table = catalog.create_table("db.t", schema=SCHEMA)
    table.append(rows(0, 100))
    ranks = _run_ranks(_rank_snapshots, str(tmp_path))
    table.refresh()
    for e in range(2):
        (v0, n0, ids0), (v1, n1, ids1) = ranks[0][e], ranks[1][e]
        assert v0 == v1 and n0 == n1
        assert not set(ids0) & set(ids1)
        np.testing.assert_array_equal(np.sort(ids0 + ids1), truth(table, v0))
    assert ranks[0][1][0] != ranks[0][0][0]  # the second epoch saw the first append


# -- object storage ------------------------------------------------------------------------


def test_a_table_on_s3_reads_its_files_with_the_file_ios_credentials(tmp_path):
    """The data files are read through fsspec with the options of the table's FileIO."""
    pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host_, port = server.get_host_and_port()
        endpoint = f"http://{host_}:{port}"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket="warehouse")
        properties = {
            "s3.endpoint": endpoint,
            "s3.access-key-id": "testing",
            "s3.secret-access-key": "testing",
            "s3.region": "us-east-1",
        }
        catalog = SqlCatalog(
            "s3", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse="s3://warehouse/", **properties
        )
        catalog.create_namespace("db")
        table = catalog.create_table("db.t", schema=SCHEMA, partition_spec=BY_DAY)
        table.append(rows(0, 300))
        table.overwrite(rows(1000, 90))
        ds = tabloader.Dataset.from_iceberg(table, filters=[("day", "!=", 0)])
        assert all(f.startswith("warehouse/db/t/data/") for f in ds.files)
        assert ds.describe_partition(0).startswith("s3://warehouse/")
        ids = np.arange(1000, 1090)
        np.testing.assert_array_equal(np.sort(epoch(loader(ds, "cpu"))), ids[ids % 3 != 0])
    finally:
        server.stop()
