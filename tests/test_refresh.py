"""A dataset that grows between epochs: Dataset(directory, refresh=True)."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

import tabloader
from conftest import make_table


def write(directory: Path, name: str, start: int, rows: int, row_groups: int = 1) -> Path:
    """Write ids start..start+rows-1 as ``name`` (atomically: a temporary name, then rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f"{name}.inprogress"
    pq.write_table(make_table(start, rows), temporary, row_group_size=-(-rows // row_groups))
    final = directory / name
    os.replace(temporary, final)
    return final


def ids_of(loader: Any) -> np.ndarray:
    return np.concatenate([b["id"] for b in loader])


def test_every_epoch_reads_the_files_there_when_it_starts(tmp_path):
    data = tmp_path / "data"
    write(data, "a.parquet", 0, 100)
    ds = tabloader.Dataset(str(data), refresh=True)
    loader = tabloader.Loader(ds, cats=["id"], batch_size=32, shuffle=True, seed=1)
    assert len(loader) == 4
    np.testing.assert_array_equal(np.sort(ids_of(loader)), np.arange(100))

    write(data, "b.parquet", 100, 60)  # a new file joins...
    # ...at the next epoch: len() tells the epoch the loader last listed until then.
    assert len(loader) == 4
    loader.refresh(loader.epoch)  # what iter() does first; len() now describes that epoch
    assert len(loader) == 5
    np.testing.assert_array_equal(np.sort(ids_of(loader)), np.arange(160))

    os.remove(data / "a.parquet")  # the oldest is evicted
    write(data, "c.parquet", 160, 40)
    epoch = ids_of(loader)
    np.testing.assert_array_equal(np.sort(epoch), np.arange(100, 200))
    assert len(loader) == 4 and ds.files == [str(data / "b.parquet"), str(data / "c.parquet")]


def test_without_refresh_the_files_are_listed_once(tmp_path):
    data = tmp_path / "data"
    write(data, "a.parquet", 0, 100)
    loader = tabloader.Loader(str(data), cats=["id"], batch_size=32)
    write(data, "b.parquet", 100, 60)
    assert len(ids_of(loader)) == 100


def test_temporary_hidden_and_unfinished_files_are_skipped_and_tried_again(tmp_path):
    data = tmp_path / "data"
    write(data, "a.parquet", 0, 50)
    pq.write_table(make_table(1000, 5), data / "b.parquet.tmp")
    pq.write_table(make_table(1000, 5), data / ".b.parquet")
    pq.write_table(make_table(1000, 5), data / "_b.parquet")
    (data / "c.parquet").write_bytes(b"PAR1 half written")  # a writer not done yet
    with pytest.warns(UserWarning, match=r"skipping .*c\.parquet for now") as caught:
        ds = tabloader.Dataset(str(data / "*"), refresh=True)
    assert len(caught) == 1
    assert ds.files == [str(data / "a.parquet")]
    loader = tabloader.Loader(ds, cats=["id"], batch_size=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, not every epoch
        assert len(ids_of(loader)) == 50
    write(data, "c.parquet", 50, 30)  # finished
    np.testing.assert_array_equal(np.sort(ids_of(loader)), np.arange(80))


def test_a_file_rewritten_between_epochs_is_read_again(tmp_path):
    data = tmp_path / "data"
    write(data, "a.parquet", 0, 50)
    loader = tabloader.Loader(
        tabloader.Dataset(str(data), refresh=True), cats=["id"], batch_size=16
    )
    assert len(ids_of(loader)) == 50
    time.sleep(0.01)
    write(data, "a.parquet", 500, 70)
    np.testing.assert_array_equal(np.sort(ids_of(loader)), np.arange(500, 570))


def test_a_file_deleted_mid_epoch_is_an_error_naming_it(tmp_path):
    data = tmp_path / "data"
    write(data, "a.parquet", 0, 400, row_groups=4)
    write(data, "b.parquet", 400, 400, row_groups=4)
    ds = tabloader.Dataset(str(data), refresh=True)
    loader = tabloader.Loader(ds, cats=["id"], batch_size=50, parts_per_chunk=1, prefetch=1)
    batches = iter(loader)
    next(batches)
    os.remove(data / "b.parquet")
    with pytest.raises(tabloader.ReadError, match=r"b\.parquet \(row group \d\)") as info:
        list(batches)
    assert "deleted or rewritten since the dataset listed it" in str(info.value)


def test_skip_replaces_the_rows_of_a_vanished_file_and_keeps_batch_counts(tmp_path):
    data = tmp_path / "data"
    write(data, "a.parquet", 0, 400, row_groups=4)
    write(data, "b.parquet", 400, 400, row_groups=4)
    ds = tabloader.Dataset(str(data), refresh=True, on_missing="skip")
    loaders = [
        tabloader.Loader(
            ds,
            cats=["id"],
            batch_size=50,
            parts_per_chunk=1,
            prefetch=1,
            global_rank=r,
            global_size=2,
        )
        for r in range(2)
    ]
    planned = [len(x) for x in loaders]
    assert planned == [8, 8]
    first = iter(loaders[0])
    delivered = [next(first)["id"]]
    os.remove(data / "b.parquet")  # rank 0 already listed; rank 1 planned the same epoch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        delivered.extend(b["id"] for b in first)
        other = list(loaders[1].iter_epoch(0))
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages  # once per file
    assert "b.parquet was deleted or changed" in messages[0]
    assert len(delivered) == len(other) == 8  # equal batch counts on every rank
    ids = np.concatenate(delivered + [b["id"] for b in other])
    assert len(ids) == 800
    assert set(ids.tolist()) <= set(range(400))  # the lost rows were replaced by read ones
    assert loaders[0].stats().rows_skipped == 400
    # The next epoch lists the directory again and plans without the file.
    assert len(ids_of(loaders[0])) == 200


def test_refresh_options_are_checked(tmp_path):
    write(tmp_path, "a.parquet", 0, 10)
    with pytest.raises(tabloader.InvalidArgumentError, match="refresh must be True or False"):
        tabloader.Dataset(str(tmp_path), refresh="yes")
    with pytest.raises(tabloader.InvalidArgumentError, match="on_missing must be 'raise' or"):
        tabloader.Dataset(str(tmp_path), on_missing="ignore")
    with pytest.raises(tabloader.InvalidArgumentError, match="apply to parquet files"):
        tabloader.Dataset(make_table(0, 5), refresh=True)


# -- ranks and worker processes ----------------------------------------------------------


def _rank_epochs(rank: int, data: str) -> list[Any]:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        ds = tabloader.Dataset(data, refresh=True)
        loader = tabloader.Loader(
            ds, cats=["id"], batch_size=20, shuffle=True, seed=3, global_rank=rank, global_size=2
        )
        epochs = []
        for epoch in range(2):
            dist.barrier()
            if rank == 1:
                # Rank 0 lists at once; this rank lists (if it did) only after a new file
                # appeared: it must still deal rank 0's list.
                time.sleep(1.0)
                write(Path(data), f"late-{epoch}.parquet", 1000 * (epoch + 1), 40)
            ids = ids_of(loader)
            epochs.append((len(loader), sorted(ds.files), ids.tolist()))
        return epochs
    finally:
        dist.destroy_process_group()


@pytest.mark.torch
@pytest.mark.distributed
@pytest.mark.slow
def test_every_rank_deals_rank_zeros_listing(tmp_path):
    from test_torch_distributed import _run_ranks

    data = tmp_path / "data"
    write(data, "a.parquet", 0, 100)
    ranks = _run_ranks(_rank_epochs, str(data))
    for epoch in range(2):
        (n0, files0, ids0), (n1, files1, ids1) = ranks[0][epoch], ranks[1][epoch]
        assert files0 == files1 and n0 == n1
        ids = np.array(ids0 + ids1)
        assert len(set(ids0) & set(ids1)) == 0
        expected = [np.arange(100)] + [
            np.arange(1000 * (e + 1), 1000 * (e + 1) + 40) for e in range(epoch)
        ]
        np.testing.assert_array_equal(np.sort(ids), np.sort(np.concatenate(expected)))


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_processes_share_the_listing_of_the_training_process(tmp_path, context):
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    data = tmp_path / "data"
    write(data, "a.parquet", 0, 100, row_groups=4)
    itr = TorchAsyncItr(
        tabloader.Dataset(str(data), refresh=True), cats=["id"], batch_size=10, device="cpu"
    )
    loader = DLDataLoader(itr, collate_fn=_identity, num_workers=2, multiprocessing_context=context)
    sizes = []
    for epoch in range(2):
        ids = np.concatenate([b[0][:, 0].numpy() for b in loader])
        sizes.append(len(ids))
        np.testing.assert_array_equal(np.sort(ids), np.arange(100 + 60 * epoch))
        write(data, f"new-{epoch}.parquet", 100 + 60 * epoch, 60, row_groups=2)
    assert sizes == [100, 160]
    with pytest.raises(tabloader.InvalidArgumentError, match="persistent_workers"):
        DLDataLoader(itr, collate_fn=_identity, num_workers=2, persistent_workers=True)


def _identity(batch: Any) -> Any:
    return batch
