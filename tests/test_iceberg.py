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
from collections.abc import Iterator
from dataclasses import dataclass
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
from pyiceberg.table import StaticTable
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
)

from table_formats import (
    check_every_rank_loads_rank_zeros_version,
    check_refresh_follows_appends_overwrites_and_deletes,
    epoch,
    host,
    loader,
    rows,
)
from tabloader.cli import main

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "day", IntegerType(), required=False),
    NestedField(3, "x", DoubleType(), required=False),
)
BY_DAY = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "day"))


def truth(table: Any, snapshot_id: int | None = None) -> np.ndarray:
    """The ids pyiceberg's own scan finds (in ``snapshot_id``)."""
    scanned = table.scan(snapshot_id=snapshot_id, selected_fields=("id",)).to_arrow()
    return np.sort(scanned.column("id").to_numpy())


def open_catalog(where: Path) -> SqlCatalog:
    return SqlCatalog("test", uri=f"sqlite:///{where}/catalog.db", warehouse=f"file://{where}")


@dataclass(frozen=True)
class IcebergUnderTest:
    """Table ``db.t`` of the catalog in ``where`` (whose namespace ``db`` exists), for the
    scenarios every format passes (`table_formats`); the catalog is opened where used."""

    where: Path
    partitioned: bool = True

    def _table(self) -> Any:
        return open_catalog(self.where).load_table("db.t")

    def create(self, table: pa.Table) -> None:
        spec = {"partition_spec": BY_DAY} if self.partitioned else {}
        open_catalog(self.where).create_table("db.t", schema=SCHEMA, **spec).append(table)

    def append(self, table: pa.Table) -> None:
        self._table().append(table)

    def overwrite(self, table: pa.Table) -> None:
        self._table().overwrite(table)

    def delete(self, predicate: str) -> None:
        self._table().delete(predicate)

    def dataset(self, **options: Any) -> tabloader.Dataset:
        return tabloader.Dataset.from_iceberg((open_catalog(self.where), "db.t"), **options)

    def version(self) -> int:
        return int(self._table().current_snapshot().snapshot_id)

    def truth(self, version: int | None = None) -> np.ndarray:
        return truth(self._table(), version)


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
    location = Path(table.location().removeprefix("file://"))
    with pytest.raises(tabloader.InvalidArgumentError, match="is an Apache Iceberg table"):
        tabloader.Dataset(str(location))
    # its data directory, a glob over it, the warehouse above it: refused as well
    for spec in (location / "data", location / "data" / "**" / "*.parquet", location.parent.parent):
        with pytest.raises(tabloader.InvalidArgumentError, match="an Apache Iceberg table"):
            tabloader.Dataset(str(spec))


def test_bad_arguments_are_clear_errors(history, catalog):
    table, snapshots = history
    with pytest.raises(tabloader.InvalidArgumentError, match="has no snapshot 12345"):
        tabloader.Dataset.from_iceberg(table, snapshot_id=12345)
    with pytest.raises(tabloader.InvalidArgumentError, match="pass one of them"):
        tabloader.Dataset.from_iceberg(table, snapshot_id=snapshots[0], refresh=True)
    static = StaticTable.from_metadata(table.metadata_location)
    with pytest.raises(tabloader.InvalidArgumentError, match="is a StaticTable"):
        tabloader.Dataset.from_iceberg(static, refresh=True)  # it never sees a new snapshot
    assert len(tabloader.Dataset.from_iceberg(static)) == len(truth(table))
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
def test_refresh_follows_appends_overwrites_and_deletes(catalog, tmp_path, device):
    check_refresh_follows_appends_overwrites_and_deletes(IcebergUnderTest(tmp_path), device)


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


def test_a_decoded_cache_is_never_served_under_another_schema(catalog, tmp_path):
    """A schema change makes no snapshot, and a pinned snapshot is read under the schema
    it was written with: the same files and version read other values, so they are other
    caches. (A column dropped and added again under its name is another field, null in
    the old files, where the cache had kept the dropped field's values.)"""
    table = catalog.create_table(
        "db.s", schema=pa.schema([("id", pa.int64()), ("score", pa.float64())])
    )
    table.append(pa.table({"id": np.arange(6), "score": np.arange(6) * 1.5}))
    first = int(table.current_snapshot().snapshot_id)
    cache_dir = tmp_path / "cache"

    def scores(**pinned: Any) -> list[float]:
        ds = tabloader.Dataset.from_iceberg((catalog, "db.s"), **pinned)
        load = tabloader.Loader(
            ds, cats=["id"], conts=["score"], batch_size=6, fill_null={"score": -1.0},
            cache="disk", cache_dir=cache_dir,
        )  # fmt: skip
        scored = [float(s) for b in load for s in b["score"]]
        assert load.cache is not None
        load.cache.wait()
        return scored

    assert scores() == [0.0, 1.5, 3.0, 4.5, 6.0, 7.5]  # fills a cache
    with table.update_schema() as update:
        update.delete_column("score")
    with table.update_schema() as update:
        update.add_column("score", DoubleType())
    table = catalog.load_table("db.s")
    assert table.scan().to_arrow()["score"].null_count == 6
    assert int(table.current_snapshot().snapshot_id) == first
    assert scores() == [-1.0] * 6  # not the dropped field's, from the cache
    assert scores(snapshot_id=first) == [0.0, 1.5, 3.0, 4.5, 6.0, 7.5]
    assert scores() == [-1.0] * 6


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


# -- files without field ids: the name mapping ----------------------------------------------


def _added_without_field_ids(catalog: SqlCatalog, where: Path) -> Any:
    """A table whose one data file was written without field ids and added by
    ``add_files`` (pyiceberg then sets the name mapping), its column x dropped and added
    again: the new x is another field (id 3)."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "x", DoubleType(), required=False),
    )
    table = catalog.create_table("db.mapped", schema=schema)
    path = where / "plain.parquet"
    pq.write_table(pa.table({"id": np.arange(100, dtype=np.int64), "x": np.arange(100) / 4}), path)
    assert pq.read_schema(path).field("x").metadata is None  # no field ids
    table.add_files([str(path)])
    with table.update_schema() as update:
        update.delete_column("x")
    with table.update_schema() as update:
        update.add_column("x", DoubleType())
    assert table.schema().find_field("x").field_id == 3
    return table


def _reference(table: Any, column: str) -> list[Any]:
    scanned = table.scan().to_arrow().sort_by("id")
    return scanned.column(column).to_pylist()


@pytest.mark.parametrize("device", DEVICES)
def test_a_file_without_field_ids_is_read_through_the_name_mapping(catalog, tmp_path, device):
    table = _added_without_field_ids(catalog, tmp_path)
    # pyiceberg's schema update moved the name x to the new field: its values are x's
    assert {f.field_id: f.names for f in table.name_mapping()}[3] == ["x"]
    expected = _reference(table, "x")
    assert expected == [i / 4 for i in range(100)]
    batches = list(loader(tabloader.Dataset.from_iceberg(table), device, conts=["x"]))
    got = dict(
        zip(
            np.concatenate([host(b["id"]) for b in batches]).tolist(),
            np.concatenate([host(b["x"]) for b in batches]).tolist(),
            strict=True,
        )
    )
    assert [got[i] for i in range(100)] == expected


@pytest.mark.parametrize("device", DEVICES)
def test_a_name_mapped_to_a_dropped_field_reads_as_null(catalog, tmp_path, device):
    table = _added_without_field_ids(catalog, tmp_path)
    # A mapping that keeps the file's x as the dropped field 2, as engines that do not
    # move names on schema updates leave it: the new field x is null in that file.
    mapping = '[{"names":["id"],"field-id":1},{"names":["x"],"field-id":2}]'
    with table.transaction() as transaction:
        transaction.set_properties({"schema.name-mapping.default": mapping})
    assert _reference(table, "x") == [None] * 100  # pyiceberg's read
    ds = tabloader.Dataset.from_iceberg(table)
    with pytest.raises(tabloader.NullValuesError, match="null values and no fill value: 'x'"):
        tabloader.Loader(ds, conts=["x"], batch_size=8, device=device)
    batches = list(loader(ds, device, conts=["x"], fill_null={"x": -1}))
    np.testing.assert_array_equal(np.concatenate([host(b["x"]) for b in batches]), -1)
    assert sorted(np.concatenate([host(b["id"]) for b in batches]).tolist()) == list(range(100))


def test_a_file_without_field_ids_and_no_name_mapping_is_refused(catalog, tmp_path):
    table = _added_without_field_ids(catalog, tmp_path)
    with table.transaction() as transaction:
        transaction.remove_properties("schema.name-mapping.default")
    assert table.name_mapping() is None
    with pytest.raises(ValueError, match="does not have field-ids"):
        table.scan().to_arrow()  # pyiceberg refuses it too
    with pytest.raises(tabloader.UnsupportedTableError) as info:
        tabloader.Dataset.from_iceberg(table)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'plain.parquet'}: a data file of the iceberg table")
    assert "stores no field ids and the table has no name mapping" in message
    assert "Set the table's name mapping" in message


# -- defaults: initial-default -------------------------------------------------------------


def _with_defaults(catalog: SqlCatalog, where: Path) -> Any:
    """A table with rows written before three columns were added with an initial-default
    (an int, a boolean, the smallest long), as the spec writes them (format version 3)
    into metadata of its own (pyiceberg writes no defaults yet): a static table."""
    table = catalog.create_table("db.defaults", schema=SCHEMA)
    table.append(rows(0, 40))
    metadata = json.loads(Path(table.metadata_location.removeprefix("file://")).read_text())
    metadata["format-version"] = 3
    metadata["next-row-id"] = 0
    metadata["schemas"][-1]["fields"] += [
        {"id": 4, "name": "n", "required": False, "type": "int", "initial-default": 342342},
        {"id": 5, "name": "b", "required": False, "type": "boolean", "initial-default": True},
        {"id": 6, "name": "l", "required": False, "type": "long", "initial-default": -(2**63)},
    ]
    metadata["last-column-id"] = 6
    path = where / "defaults.metadata.json"
    path.write_text(json.dumps(metadata))
    from pyiceberg.table import StaticTable

    return StaticTable.from_metadata(str(path))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache", [None, "memory"])
def test_an_initial_default_is_delivered_in_files_written_before(catalog, tmp_path, device, cache):
    table = _with_defaults(catalog, tmp_path)
    scanned = table.scan().to_arrow().sort_by("id")
    assert scanned.column("n").to_pylist() == [342342] * 40  # pyiceberg's read
    ds = tabloader.Dataset.from_iceberg(table)
    load = loader(ds, device, cats=["id", "n", "b", "l"], cache=cache)
    for _ in range(2):
        batches = list(load)
        ids = np.concatenate([host(b["id"]) for b in batches])
        order = np.argsort(ids)
        for column in ("n", "b", "l"):
            got = np.concatenate([host(b[column]) for b in batches])[order]
            assert got.dtype == np.int64
            assert got.tolist() == [int(v) for v in scanned.column(column).to_pylist()]
    assert main(["inspect", str(tmp_path / "defaults.metadata.json")]) == 0


# -- what goes wrong, in tabloader's words ---------------------------------------------------


def test_data_files_named_by_urls_under_local_metadata_are_a_clear_error(catalog):
    table = catalog.create_table("db.urls", schema=SCHEMA)
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path="s3://bucket/t/data/a.parquet",
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=10,
        file_size_in_bytes=1000,
    )
    data_file.spec_id = table.spec().spec_id
    with table.transaction() as transaction, transaction.update_snapshot().fast_append() as add:
        add.append_data_file(data_file)
    with pytest.raises(tabloader.InvalidFileError) as info:
        tabloader.Dataset.from_iceberg(table)
    assert str(info.value).startswith(
        "the Iceberg table 'db.urls' (snapshot "
    ) and "names the data file s3://bucket/t/data/a.parquet, a URL" in str(info.value)


def test_a_missing_manifest_list_is_a_clear_error(history):
    table, snapshots = history
    manifests = table.snapshot_by_id(snapshots[1]).manifest_list
    os.remove(manifests.removeprefix("file://"))
    with pytest.raises(tabloader.SourceNotFoundError) as info:
        tabloader.Dataset.from_iceberg(table, snapshot_id=snapshots[1])
    assert str(info.value).startswith(
        f"the Iceberg table db.events (snapshot {snapshots[1]}): its manifest list {manifests}"
    )
    assert "load another snapshot (snapshot_id=)" in str(info.value)


def test_metadata_pyiceberg_cannot_parse_is_named_by_inspect(history, tmp_path, capsys):
    table, _ = history
    metadata = json.loads(Path(table.metadata_location.removeprefix("file://")).read_text())
    for snapshot in metadata["snapshots"]:  # a version 1 writer's manifests, listed inline
        snapshot["manifests"] = [snapshot.pop("manifest-list")]
    path = tmp_path / "legacy.metadata.json"
    path.write_text(json.dumps(metadata))
    assert main(["inspect", str(path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"tabloader: error: {path} is Iceberg metadata pyiceberg ")
    assert "manifest-list" in error and error.count("\n") == 1 and "Traceback" not in error
    assert main(["inspect", str(tmp_path / "none.metadata.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_relative_locations_resolve_from_where_the_table_was_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    relative = SqlCatalog("rel", uri="sqlite:///catalog.db", warehouse="warehouse")
    relative.create_namespace("db")
    table = relative.create_table("db.t", schema=SCHEMA)
    table.append(rows(0, 30))
    assert table.location() == "warehouse/db/t"  # and so are its files' paths
    directory = str(tmp_path / "warehouse" / "db" / "t")
    assert main(["inspect", directory, "--json"]) == 0  # from where it was written
    assert json.loads(capsys.readouterr().out)["rows"] == 30
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["inspect", directory]) == 2
    error = capsys.readouterr().err
    assert error.startswith("tabloader: error: the Iceberg table ")
    assert error.endswith(
        "names its files by paths relative to the directory it was written from (its "
        f"location is 'warehouse/db/t'), and they do not resolve from the current "
        f"directory, {elsewhere}: run from {tmp_path}, or rewrite its metadata with absolute "
        "locations\n"
    )
    with pytest.raises(tabloader.SourceNotFoundError, match=f"run from {tmp_path}"):
        tabloader.Dataset.from_iceberg(table)


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


@pytest.mark.parametrize("top_level_day", [True, False])
def test_a_partition_of_a_nested_field_is_no_partition_key(catalog, top_level_day):
    """``identity(info.day)`` partitions by a field inside a struct: its values are not a
    top-level column's. Taken by the leaf's name, they were the values of another column
    ``day`` (filters on it picked files by ``info.day``), or a pyarrow KeyError."""
    from pyiceberg.types import StructType

    info = StructType(
        NestedField(4, "day", IntegerType(), required=False),
        NestedField(5, "w", DoubleType(), required=False),
    )
    fields = [NestedField(1, "id", LongType(), required=False)]
    if top_level_day:
        fields.append(NestedField(2, "day", IntegerType(), required=False))
    schema = Schema(*fields, NestedField(3, "info", info, required=False))
    spec = PartitionSpec(PartitionField(4, 1000, IdentityTransform(), "info_day"))
    table = catalog.create_table("db.nested", schema=schema, partition_spec=spec)
    data = {"id": pa.array([1, 2, 3, 4], pa.int64())}
    if top_level_day:
        data["day"] = pa.array([10, 20, 30, 40], pa.int32())
    struct = pa.struct([("day", pa.int32()), ("w", pa.float64())])
    days = [{"day": d, "w": float(i)} for i, d in enumerate([1, 1, 2, 2])]
    table.append(pa.table({**data, "info": pa.array(days, struct)}))
    ds = tabloader.Dataset.from_iceberg(table)
    assert ds.partition_keys == {}
    assert sorted(epoch(loader(ds, "cpu"))) == [1, 2, 3, 4]
    if top_level_day:
        with pytest.raises(tabloader.InvalidArgumentError, match="not a partition key"):
            tabloader.Dataset.from_iceberg(table, filters=[("day", "=", 1)])
        loaded = tabloader.Loader(ds, cats=["id", "day"], batch_size=4, shuffle=False)
        batch = next(iter(loaded))
        assert dict(zip(batch["id"].tolist(), batch["day"].tolist(), strict=True)) == {
            1: 10,
            2: 20,
            3: 30,
            4: 40,
        }


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


@pytest.mark.torch
@pytest.mark.distributed
@pytest.mark.slow
def test_every_rank_loads_rank_zeros_snapshot(catalog, tmp_path):
    check_every_rank_loads_rank_zeros_version(IcebergUnderTest(tmp_path, partitioned=False))


# -- object storage ------------------------------------------------------------------------


@pytest.fixture
def warehouse_endpoint() -> Iterator[str]:
    """moto's S3 server with an empty ``warehouse`` bucket; yields its URL."""
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
        yield endpoint
    finally:
        server.stop()


@pytest.mark.parametrize("prefix", ["s3", "client"])
def test_a_table_on_s3_reads_its_files_with_the_file_ios_credentials(
    tmp_path, prefix, warehouse_endpoint
):
    """The data files are read through fsspec with the options of the table's FileIO:
    ``s3.*`` credentials, or the ``client.*`` ones every client of the table shares."""
    properties = {
        "s3.endpoint": warehouse_endpoint,
        f"{prefix}.access-key-id": "testing",
        f"{prefix}.secret-access-key": "testing",
        f"{prefix}.region": "us-east-1",
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


def test_a_manifest_list_throttled_on_s3_is_retried_as_data_files_are(tmp_path, warehouse_endpoint):
    """A refreshing epoch meets 503 SlowDown reading the new snapshot's manifest list: it
    waits within retry_seconds (it was refused at once as an incomplete table)."""
    from netproxy import NetProxy

    def catalog_at(url: str) -> SqlCatalog:
        return SqlCatalog(
            "s3", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse="s3://warehouse/",
            **{"s3.endpoint": url, "s3.access-key-id": "testing",
               "s3.secret-access-key": "testing", "s3.region": "us-east-1"},
        )  # fmt: skip

    writer = catalog_at(warehouse_endpoint)
    writer.create_namespace("db")
    writer.create_table("db.t", schema=SCHEMA, partition_spec=BY_DAY).append(rows(0, 100))
    host_, port = warehouse_endpoint.removeprefix("http://").split(":")
    with NetProxy((host_, int(port))) as proxy:
        ds = tabloader.Dataset.from_iceberg(
            (catalog_at(proxy.url), "db.t"), refresh=True, retry_seconds=60
        )
        load = loader(ds, "cpu")
        np.testing.assert_array_equal(np.sort(epoch(load)), np.arange(100))
        writer.load_table("db.t").append(rows(100, 50))
        proxy.throttle(6, only=b"snap-")  # the new snapshot's manifest list
        np.testing.assert_array_equal(np.sort(epoch(load)), np.arange(150))
        assert proxy.throttled > 0
