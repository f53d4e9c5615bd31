"""Dask DataFrames computed on a real process-based dask.distributed cluster."""

from __future__ import annotations

import os
import signal
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import tabloader
from conftest import make_table

pytestmark = [pytest.mark.dask, pytest.mark.slow]

ROWS = 8_000
PARTITIONS = 16


def _mark(part: pd.DataFrame, directory: str) -> pd.DataFrame:
    """Leave a file per computed partition (the cluster's workers are other processes)."""
    if len(part):
        Path(directory, f"{int(part['id'].iloc[0])}-{time.monotonic_ns()}").touch()
        time.sleep(0.02)
    return part


@pytest.fixture(autouse=True)
def _small_partitions_are_intended() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tabloader.PerformanceWarning)
        yield


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            processes=True, n_workers=2, threads_per_worker=1, dashboard_address=":0"
        ) as local,
        Client(local) as client,
    ):
        yield client


@pytest.fixture
def marked(tmp_path: Path) -> tuple[Any, Path]:
    """A Dask frame of ``PARTITIONS`` partitions that records each partition computed."""
    import dask.dataframe as dd

    directory = tmp_path / "computed"
    directory.mkdir()
    frame = dd.from_pandas(make_table(0, ROWS).to_pandas(), npartitions=PARTITIONS)
    return frame.map_partitions(_mark, str(directory), meta=frame._meta), directory


def test_every_row_once_per_epoch_computed_on_the_cluster(cluster, marked):
    frame, directory = marked
    loader = tabloader.Loader(frame, cats=["id"], conts=["x"], batch_size=256, shuffle=True, seed=4)
    assert len(loader) == -(-ROWS // 256)
    epochs = []
    for _ in range(2):
        ids = np.concatenate([b["id"] for b in loader])
        np.testing.assert_array_equal(np.sort(ids), np.arange(ROWS))
        epochs.append(ids)
    assert not np.array_equal(epochs[0], epochs[1])
    assert {p.parent for p in directory.iterdir()} == {directory}


def test_partitions_are_computed_one_chunk_ahead_never_the_whole_frame(cluster, marked):
    frame, directory = marked
    loader = tabloader.Loader(frame, cats=["id"], batch_size=100, parts_per_chunk=2, prefetch=1)
    for path in directory.iterdir():  # counting rows at construction computed each once
        path.unlink()
    batches = iter(loader)
    next(batches)
    time.sleep(1.0)  # give the reader every chance to run ahead
    computed = len(list(directory.iterdir()))
    # Chunks: the one being cut, `prefetch` queued, one being laid out (2 partitions
    # each); partitions: one queued by the decoder thread and one it holds.
    assert 2 <= computed <= (1 + 2) * 2 + 2 < PARTITIONS
    assert sum(len(b["id"]) for b in batches) == ROWS - 100
    assert len(list(directory.iterdir())) == PARTITIONS


def test_a_worker_killed_mid_epoch_is_replaced_and_every_row_arrives(cluster, marked):
    frame, _ = marked
    loader = tabloader.Loader(frame, cats=["id"], batch_size=200, shuffle=True, seed=9)
    batches = iter(loader)
    ids = [next(batches)["id"]]
    pids = cluster.run(os.getpid)
    os.kill(pids[min(pids)], signal.SIGKILL)
    ids.extend(b["id"] for b in batches)
    np.testing.assert_array_equal(np.sort(np.concatenate(ids)), np.arange(ROWS))
    victim = min(pids)
    deadline = time.monotonic() + 60
    while True:  # the nanny starts a new worker process in the victim's place
        workers = cluster.scheduler_info()["workers"]
        if victim not in workers and len(workers) == 2:
            break
        assert time.monotonic() < deadline, "the killed worker was not replaced"
        time.sleep(0.2)


def _identity(batch: Any) -> Any:
    return batch


@pytest.mark.torch
def test_forked_torch_workers_are_refused_at_construction(cluster, marked):
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    frame, _ = marked
    itr = TorchAsyncItr(frame, cats=["id"], batch_size=500, device="cpu")
    for context in (None, "fork"):
        extra = {} if context is None else {"multiprocessing_context": context}
        with pytest.raises(tabloader.InvalidArgumentError, match="multiprocessing_context='spawn'"):
            DLDataLoader(itr, collate_fn=_identity, num_workers=2, **extra)
    assert len(list(DLDataLoader(itr, collate_fn=_identity, num_workers=0))) == len(itr)


@pytest.mark.torch
def test_a_persisted_frame_is_refused_for_worker_processes_of_any_kind(cluster, marked):
    """Its partitions are futures in the cluster's memory: a spawned worker, without a
    Client, failed every read, blamed on the files."""
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    frame, _ = marked
    itr = TorchAsyncItr(frame.persist(), cats=["id"], batch_size=500, device="cpu")
    with pytest.raises(tabloader.InvalidArgumentError, match="was persisted"):
        DLDataLoader(itr, collate_fn=_identity, num_workers=2, multiprocessing_context="spawn")
    assert len(list(DLDataLoader(itr, collate_fn=_identity, num_workers=0))) == len(itr)


@pytest.mark.torch
def test_a_plain_torch_dataloader_with_fork_fails_instead_of_hanging(cluster, marked):
    import torch

    from tabloader.torch import TorchAsyncItr

    frame, _ = marked
    itr = TorchAsyncItr(frame, cats=["id"], batch_size=500, device="cpu")
    itr.set_epoch(0)
    loader = torch.utils.data.DataLoader(
        itr, batch_size=None, num_workers=1, multiprocessing_context="fork"
    )
    started = time.monotonic()
    with pytest.raises(Exception, match="cannot be read in worker processes"):
        list(loader)
    assert time.monotonic() - started < 60


@pytest.mark.torch
def test_spawned_torch_workers_read_every_row_once(cluster, marked):
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    frame, _ = marked
    itr = TorchAsyncItr(frame, cats=["id"], batch_size=500, shuffle=True, seed=1, device="cpu")
    loader = DLDataLoader(itr, collate_fn=_identity, num_workers=2, multiprocessing_context="spawn")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing a user cannot act on
        warnings.simplefilter("ignore", tabloader.PerformanceWarning)
        batches = list(loader)
    assert len(batches) == len(loader)
    ids = np.concatenate([b[0][:, 0].numpy() for b in batches])
    np.testing.assert_array_equal(np.sort(ids), np.arange(ROWS))


def test_a_partition_that_is_not_what_the_dataset_counted_is_refused(tmp_path):
    """A partition is computed again each epoch: a file the frame reads rewritten since the
    Dataset was built (or random rows) gave other rows than counted (uninitialised memory
    delivered, rows twice, or an "internal error"), and a partition whose types the
    frame's meta does not say was cast with loss (fractions cut, ids wrapped)."""
    import dask.dataframe as dd
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i in range(2):
        pq.write_table(pa.table({"id": np.arange(100) + 100 * i}), tmp_path / f"p{i}.parquet")
    ds = tabloader.Dataset(dd.read_parquet(str(tmp_path / "p*.parquet")))
    loader = tabloader.Loader(ds, cats=["id"], batch_size=50, shuffle=True, seed=0)
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(200))
    pq.write_table(pa.table({"id": np.arange(40) + 100}), tmp_path / "p1.parquet")
    with pytest.raises(tabloader.ReadError, match="computed to 40 rows, and to 100 when"):
        list(loader)

    other = tmp_path / "types"
    other.mkdir()
    pq.write_table(pa.table({"x": pa.array([0, 1], pa.int64())}), other / "a.parquet")
    pq.write_table(pa.table({"x": pa.array([0.25, 2**40 + 0.5])}), other / "b.parquet")
    frame = dd.read_parquet(str(other / "*.parquet"))
    assert str(frame._meta.dtypes["x"]) == "int64"  # the first file's, whatever the next
    loader = tabloader.Loader(tabloader.Dataset(frame), cats=["x"], batch_size=4)
    with pytest.raises(tabloader.SchemaMismatchError, match="computes column 'x' as double"):
        list(loader)
    widened = pd.DataFrame({"x": np.arange(4, dtype=np.int32)})
    frame = dd.from_pandas(widened, npartitions=2).map_partitions(
        lambda part: part.astype("int16"),
        meta=widened,  # narrower than meta: no loss
    )
    assert [b["x"].tolist() for b in tabloader.Loader(frame, cats=["x"], batch_size=4)] == [
        [0, 1, 2, 3]
    ]


def test_a_frame_with_column_labels_that_are_no_strings_loads(tmp_path):
    """dask.dataframe.read_csv(header=None) names its columns 0, 1, ...: the schema names
    them "0", "1", and the partitions were selected by those names, a KeyError mid-epoch
    said to be a corrupt file."""
    import dask.dataframe as dd

    frame = dd.from_pandas(pd.DataFrame({0: np.arange(6), 1: np.arange(6) * 2.0}), npartitions=2)
    loader = tabloader.Loader(frame, cats=["0"], conts=["1"], batch_size=6)
    (batch,) = list(loader)
    assert batch["0"].tolist() == list(range(6)) and batch["1"].tolist() == list(range(0, 12, 2))
