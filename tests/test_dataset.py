"""Sources to partitions: what a Dataset finds, from footers only, and how it fails."""

from __future__ import annotations

import os
import pickle
import uuid

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader
from conftest import make_table, write_dataset
from tabloader.cli import main


def test_files_row_groups_and_rows_come_from_footers(dataset_dir):
    paths = dataset_dir([[10, 20], [5], [7, 8, 9]])
    ds = tabloader.Dataset(paths)
    assert len(ds) == ds.num_rows == 59
    assert ds.num_partitions == 6
    assert ds.partition_rows.tolist() == [10, 20, 5, 7, 8, 9]
    assert ds.files == paths
    assert ds.schema.names == ["id", "cat", "x", "label"]
    assert "row group 1" in ds.describe_partition(1)
    assert paths[0] in ds.describe_partition(1)


def test_a_directory_a_glob_a_file_and_a_list_resolve_to_sorted_files(tmp_path):
    paths = write_dataset(tmp_path / "d", [[3], [4], [5]])
    # Files a writer leaves beside the data are skipped.
    (tmp_path / "d" / "_SUCCESS").write_text("")
    (tmp_path / "d" / ".part-000.parquet.crc").write_text("x")
    pq.write_table(make_table(0, 2), tmp_path / "d" / "_common_metadata.parquet")
    assert tabloader.Dataset(str(tmp_path / "d")).files == paths
    assert tabloader.Dataset(tmp_path / "d").files == paths  # os.PathLike
    assert tabloader.Dataset(str(tmp_path / "d" / "*.parquet")).files == paths
    assert tabloader.Dataset(paths[1]).files == [paths[1]]
    assert tabloader.Dataset([paths[2], paths[0], paths[2]]).files == [paths[2], paths[0]]


def test_a_file_named_twice_under_other_spellings_is_read_once(tmp_path, monkeypatch):
    paths = write_dataset(tmp_path / "d", [[3], [4]])
    os.symlink(paths[1], tmp_path / "link.parquet")
    monkeypatch.chdir(tmp_path / "d")
    name = os.path.basename(paths[0])
    spellings = [name, f"./{name}", paths[0], str(tmp_path / "d" / ".." / "d" / name)]
    ds = tabloader.Dataset([*spellings, paths[1], str(tmp_path / "link.parquet")])
    assert ds.files == [name, paths[1]] and ds.num_rows == 7
    loader = tabloader.Loader(ds, cats=["id"], batch_size=7)
    assert sorted(next(iter(loader))["id"].tolist()) == list(range(7))


def test_a_recursive_glob_skips_what_writers_keep_to_themselves_unless_named(tmp_path):
    paths = write_dataset(tmp_path / "out", [[3], [4]])
    attempt = tmp_path / "out" / "_temporary" / "0" / "_temporary" / "attempt_0"
    write_dataset(attempt, [[3]])  # a task's output Spark has not committed (yet)
    assert tabloader.Dataset(str(tmp_path / "out" / "**" / "*.parquet")).files == paths
    assert tabloader.Dataset(str(tmp_path / "out")).files == paths  # as the walk does
    named = tabloader.Dataset(str(tmp_path / "out" / "_temporary" / "**" / "*.parquet"))
    assert len(named.files) == 1  # a glob that names the directory reads it


def test_a_directory_is_searched_recursively(tmp_path):
    write_dataset(tmp_path / "d" / "year=2024", [[3]])
    write_dataset(tmp_path / "d" / "year=2025", [[4]])
    ds = tabloader.Dataset(str(tmp_path / "d"))
    assert len(ds) == 7
    assert [os.path.basename(os.path.dirname(f)) for f in ds.files] == ["year=2024", "year=2025"]


def test_an_arrow_table_and_a_pandas_frame_are_split_into_partitions():
    table = make_table(0, 10)
    ds = tabloader.Dataset(table, rows_per_partition=4)
    assert ds.partition_rows.tolist() == [4, 4, 2]
    assert ds.read_partition(2, ["id"]).column("id").to_pylist() == [8, 9]
    frame = table.to_pandas()
    ds = tabloader.Dataset(frame, rows_per_partition=3)
    assert len(ds) == 10 and ds.num_partitions == 4
    assert ds.files == []


def test_a_memory_url_is_read_through_fsspec(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    root = f"memory://tabloader-{uuid.uuid4().hex}"
    for i, rows in enumerate([6, 4]):
        with fs.open(f"{root}/part-{i}.parquet", "wb") as handle:
            pq.write_table(make_table(i * 6, rows), handle, row_group_size=3)
    ds = tabloader.Dataset(f"{root}/*.parquet")
    assert len(ds) == 10 and ds.num_partitions == 4
    assert ds.files[0].endswith("part-0.parquet")
    assert ds.describe_partition(0).startswith("memory://")
    loader = tabloader.Loader(ds, cats=["id"], batch_size=4)
    ids = np.concatenate([b["id"] for b in loader])
    assert ids.tolist() == list(range(10))
    assert len(tabloader.Dataset(root)) == 10  # a directory URL


@pytest.mark.dask
def test_a_dask_frame_gives_one_partition_per_dask_partition():
    import dask.dataframe as dd

    frame = dd.from_pandas(make_table(0, 20).to_pandas(), npartitions=3)
    ds = tabloader.Dataset(frame)
    assert len(ds) == 20 and ds.num_partitions == 3
    loader = tabloader.Loader(ds, cats=["id"], conts=["x"], batch_size=6, shuffle=True, seed=1)
    ids = np.concatenate([b["id"] for b in loader])
    assert sorted(ids.tolist()) == list(range(20))


def test_pickling_keeps_the_partitions_and_reads_the_same_rows(dataset_dir):
    ds = tabloader.Dataset(dataset_dir([[5, 6], [7]]))
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.partition_rows.tolist() == [5, 6, 7]
    assert clone.read_partition(1, ["id"]).equals(ds.read_partition(1, ["id"]))


def test_partition_rows_cannot_be_modified(dataset_dir):
    ds = tabloader.Dataset(dataset_dir([[5]]))
    with pytest.raises(ValueError, match="read-only"):
        ds.partition_rows[0] = 1


def test_iter_pieces_yields_the_slices_in_order(dataset_dir):
    ds = tabloader.Dataset(dataset_dir([[5, 6, 7], [4]]))
    tables = ds.iter_pieces([(0, 1, 4), (2, 0, 7), (3, 2, 4), (1, 5, 6)], ["id"])
    assert [t.column("id").to_pylist() for t in tables] == [
        [1, 2, 3],
        list(range(11, 18)),
        [20, 21],
        [10],
    ]


# -- errors -------------------------------------------------------------------------


def test_a_missing_path_names_it(tmp_path):
    with pytest.raises(tabloader.SourceNotFoundError, match="does not exist") as info:
        tabloader.Dataset(str(tmp_path / "nope.parquet"))
    assert "nope.parquet" in str(info.value)
    assert isinstance(info.value, FileNotFoundError)


def test_a_glob_matching_nothing_names_the_glob(tmp_path):
    with pytest.raises(tabloader.SourceNotFoundError, match=r"glob .*\*\.parquet.* matched no"):
        tabloader.Dataset(str(tmp_path / "*.parquet"))


def test_a_directory_without_parquet_says_what_was_looked_for(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(tabloader.SourceNotFoundError, match=r"no parquet files.*\*\.parquet"):
        tabloader.Dataset(str(tmp_path))


def test_an_empty_file_is_named(tmp_path):
    paths = write_dataset(tmp_path, [[3]])
    empty = tmp_path / "part-999.parquet"
    empty.write_bytes(b"")
    with pytest.raises(tabloader.InvalidFileError, match=r"part-999\.parquet is empty"):
        tabloader.Dataset([paths[0], str(empty)])


def test_files_of_zero_rows_are_named_by_the_loader_and_inspect(tmp_path, capsys):
    empty = pa.table({"id": pa.array([], pa.int64())})
    paths = [tmp_path / f"part-{i}.parquet" for i in range(5)]
    for path in paths:
        pq.write_table(empty, path)
    with pytest.raises(tabloader.EmptyDatasetError) as info:
        tabloader.Loader(str(paths[0]), cats=["id"], batch_size=2)
    assert str(info.value) == (
        f"the dataset has no rows: its one file, {paths[0]}, holds 0 rows. Write rows to it, "
        "or point the loader at files that hold some"
    )
    with pytest.raises(tabloader.EmptyDatasetError) as info:
        tabloader.Loader(str(tmp_path), cats=["id"], batch_size=2)
    assert str(info.value).startswith(
        f"the dataset has no rows: each of its 5 files ({paths[0]}, {paths[1]}, {paths[2]} "
        "and 2 more) holds 0 rows"
    )
    assert main(["inspect", str(paths[0])]) == 1
    assert (
        f"error: with the suggested columns: the dataset has no rows: its one file, {paths[0]}"
        in (capsys.readouterr().out)
    )


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"this is not parquet at all, just text")
    with pytest.raises(tabloader.InvalidFileError, match=r"bad\.parquet is not a readable parquet"):
        tabloader.Dataset(str(bad))


def test_a_truncated_file_is_named(tmp_path):
    (path,) = write_dataset(tmp_path, [[50]])
    with open(path, "rb") as handle:
        data = handle.read()
    with open(path, "wb") as handle:
        handle.write(data[: len(data) // 2])
    with pytest.raises(tabloader.InvalidFileError, match=r"part-000\.parquet"):
        tabloader.Dataset(path)


def test_bad_sources_are_rejected_with_what_is_accepted():
    with pytest.raises(tabloader.InvalidArgumentError, match="cannot load from a int"):
        tabloader.Dataset(42)
    with pytest.raises(tabloader.InvalidArgumentError, match="list of sources is empty"):
        tabloader.Dataset([])
    with pytest.raises(tabloader.InvalidArgumentError, match="must hold paths"):
        tabloader.Dataset(["a.parquet", 3])
    with pytest.raises(tabloader.InvalidArgumentError, match="engine must be 'parquet'"):
        tabloader.Dataset("x.parquet", engine="csv")
    with pytest.raises(tabloader.InvalidArgumentError, match="rows_per_partition"):
        tabloader.Dataset(pa.table({"a": [1]}), rows_per_partition=0)


def test_a_missing_column_names_the_file_and_lists_the_columns(dataset_dir):
    ds = tabloader.Dataset(dataset_dir([[5]]))
    with pytest.raises(tabloader.ColumnNotFoundError) as info:
        ds.column_types(["id", "C27"])
    message = str(info.value)
    assert "'C27'" in message and "part-000.parquet" in message
    assert "available: id, cat, x, label" in message
    assert isinstance(info.value, KeyError)


def test_a_file_whose_schema_disagrees_names_both_files(tmp_path):
    first = write_dataset(tmp_path / "a", [[5]])[0]
    other = tmp_path / "b.parquet"
    table = make_table(5, 5)
    table = table.set_column(2, "x", pa.array(np.arange(5), pa.int64()))
    pq.write_table(table, other)
    ds = tabloader.Dataset([first, str(other)])
    assert ds.column_types(["id"])["id"] == pa.int64()  # columns that agree are fine
    with pytest.raises(tabloader.SchemaMismatchError) as info:
        ds.column_types(["x"])
    message = str(info.value)
    assert "'x' is int64 in" in message and "b.parquet" in message
    assert "double in" in message and "part-000.parquet" in message


def test_a_column_missing_from_a_later_file_names_that_file(tmp_path):
    first = write_dataset(tmp_path / "a", [[5]])[0]
    other = tmp_path / "b.parquet"
    pq.write_table(make_table(5, 5).drop_columns(["x"]), other)
    ds = tabloader.Dataset([first, str(other)])
    with pytest.raises(tabloader.ColumnNotFoundError, match=r"'x' is not in .*b\.parquet"):
        ds.column_types(["id", "x"])


def test_null_flags_come_from_footer_statistics(tmp_path):
    path = tmp_path / "n.parquet"
    table = pa.table({"a": pa.array([1, None, 3, 4], pa.int64()), "b": [1.0, 2.0, 3.0, 4.0]})
    pq.write_table(table, path, row_group_size=2)
    ds = tabloader.Dataset(str(path))
    assert ds.null_partitions("a").tolist() == [1, 0]
    assert ds.null_partitions("b").tolist() == [0, 0]
    frame = pd.DataFrame({"a": [1.0, None]})
    assert tabloader.Dataset(frame).null_partitions("a").tolist() == [1]


@pytest.mark.dask
def test_a_dask_frame_on_a_distributed_cluster_is_computed_there():
    import dask.dataframe as dd
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        Client(cluster),
    ):
        frame = dd.from_pandas(make_table(0, 30).to_pandas(), npartitions=4)
        loader = tabloader.Loader(frame, cats=["id"], batch_size=8, shuffle=True, seed=2)
        assert len(loader) == 4
        ids = np.concatenate([b["id"] for b in loader])
        assert sorted(ids.tolist()) == list(range(30))


def test_a_fifo_named_like_data_is_never_opened(tmp_path):
    paths = write_dataset(tmp_path / "d", [[3]])
    fifo = tmp_path / "d" / "part-999.parquet"
    os.mkfifo(fifo)  # opening it would block the listing for ever
    assert tabloader.Dataset(str(tmp_path / "d")).files == paths
    assert tabloader.Dataset(str(tmp_path / "d" / "*.parquet")).files == paths
    with pytest.raises(tabloader.InvalidArgumentError, match="not a regular file"):
        tabloader.Dataset(str(fifo))
