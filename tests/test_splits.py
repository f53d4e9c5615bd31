"""A directory that holds several splits is refused; Hive-partitioned directories still load."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader
from tabloader.splits import split_siblings


def write(path: Path, rows: int = 4) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": list(range(rows))}), path)


def test_sibling_splits_are_refused_with_their_names_and_how_to_pick_one(tmp_path):
    data = tmp_path / "data"
    write(data / "train" / "a.parquet")
    write(data / "train" / "b.parquet")
    write(data / "valid" / "c.parquet")
    with pytest.raises(tabloader.InvalidArgumentError) as info:
        tabloader.Dataset(str(data))
    message = str(info.value)
    assert f"the directory {str(data)!r} holds sibling directories that look like splits" in message
    assert "train/ (2 files), valid/ (1 file)" in message
    assert f"Dataset({str(data / 'train')!r})" in message
    assert f"Dataset([{str(data / 'train')!r}, {str(data / 'valid')!r}])" in message
    # What the message proposes works: one split, or both on purpose.
    assert len(tabloader.Dataset(str(data / "train"))) == 8
    assert len(tabloader.Dataset([str(data / "train"), str(data / "valid")])) == 12
    assert len(tabloader.Dataset(str(data / "*" / "*.parquet"))) == 12  # a glob is explicit


def test_a_directory_named_from_home_is_listed_as_any_other(tmp_path, monkeypatch):
    """``~/data`` was listed relative to the unexpanded "~/data": every file seemed to lie
    outside it, so sibling splits were mixed into one dataset, and a writer's ``_temporary``
    directory was read as data."""
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path / "data" / "train" / "a.parquet")
    write(tmp_path / "data" / "valid" / "b.parquet")
    with pytest.raises(tabloader.InvalidArgumentError, match="look like splits"):
        tabloader.Dataset("~/data")
    write(tmp_path / "one" / "a.parquet")
    write(tmp_path / "one" / "_temporary" / "0" / "part-0.parquet")  # a writer's, not done
    assert tabloader.Dataset("~/one").files == [str(tmp_path / "one" / "a.parquet")]


def test_splits_deeper_down_are_found_and_named(tmp_path):
    write(tmp_path / "criteo" / "Train" / "a.parquet")
    write(tmp_path / "criteo" / "test" / "b.parquet")
    write(tmp_path / "criteo" / "eval" / "c.parquet")
    with pytest.raises(tabloader.InvalidArgumentError) as info:
        tabloader.Dataset(str(tmp_path))
    assert f"in {str(tmp_path / 'criteo')!r}: Train/ (1 file), eval/ (1 file), test/" in str(
        info.value
    )
    assert ", ...])" in str(info.value)


def test_hive_partitions_and_a_lone_split_directory_still_load(tmp_path):
    hive = tmp_path / "hive"
    for day in ("2024-01-01", "2024-01-02"):
        for split in ("train", "valid"):
            write(hive / f"date={day}" / f"split={split}" / "part-0.parquet")
    assert len(tabloader.Dataset(str(hive))) == 16
    lone = tmp_path / "lone"
    write(lone / "part-0.parquet")
    write(lone / "test" / "part-1.parquet")
    assert len(tabloader.Dataset(str(lone))) == 8


def test_split_siblings_is_pure():
    assert split_siblings([]) is None
    assert split_siblings(["a.parquet", "x/valid/b.parquet", "y/valid/c.parquet"]) is None
    assert split_siblings(["x/train/a.parquet", "x/val/b.parquet"]) == (
        "x",
        {"train": 1, "val": 1},
    )


def test_object_storage_directories_are_checked_too():
    fs = fsspec.filesystem("memory")
    for split in ("train", "valid"):
        with fs.open(f"/splits-check/{split}/part-0.parquet", "wb") as f:
            pq.write_table(pa.table({"id": [1, 2]}), f)
    try:
        with pytest.raises(tabloader.InvalidArgumentError, match=r"train/ .*valid/"):
            tabloader.Dataset("memory://splits-check/")
        assert len(tabloader.Dataset("memory://splits-check/train/")) == 2
    finally:
        fs.rm("/splits-check", recursive=True)
