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
