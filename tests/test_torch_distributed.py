"""TorchAsyncItr across real torch.distributed processes (gloo, on this machine)."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import socket
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

import tabloader  # noqa: E402
from tabloader.torch import DLDataLoader, TorchAsyncItr  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.distributed]

ROOT = Path(__file__).resolve().parents[1]
WORLD = 2
LAYOUT = [[37, 101, 5], [64], [1, 90, 33]]  # 331 rows: one row sits out every epoch
TOTAL = sum(map(sum, LAYOUT))
TIMEOUT = 120


def _identity(batch: Any) -> Any:
    return batch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(
    rank: int, port: int, target: Callable[..., Any], args: tuple[Any, ...], results: Any
) -> None:
    try:
        torch.set_num_threads(1)
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(WORLD),
        )
        results.put((rank, target(rank, *args), None))
    except BaseException:
        results.put((rank, None, traceback.format_exc()))


def _run_ranks(target: Callable[..., Any], *args: Any) -> list[Any]:
    """Run ``target(rank, *args)`` in WORLD fresh processes; return what each returned.

    The ranks are spawned, not forked: a fork of the test process copies whatever locks
    its other threads (earlier tests' loaders, TensorFlow, torch's pools) hold at that
    moment, and a rank can hang on one of them.
    """
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    processes = [
        context.Process(target=_entry, args=(rank, port, target, args, results))
        for rank in range(WORLD)
    ]
    for p in processes:
        p.start()
    try:
        outcome = dict.fromkeys(range(WORLD))
        for _ in range(WORLD):
            rank, value, error = results.get(timeout=TIMEOUT)
            assert error is None, f"rank {rank} failed:\n{error}"
            outcome[rank] = value
    finally:
        for p in processes:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [outcome[rank] for rank in range(WORLD)]


def _shard_epochs(rank: int, paths: list[str], workers: int) -> dict[str, Any]:
    """In one rank: two epochs, gathered from every rank with all_gather."""
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tabloader.PerformanceWarning)
            explicit = TorchAsyncItr(
                tabloader.Dataset(paths),
                cats=["id", "cat"],
                labels=["label"],
                batch_size=16,
                shuffle=True,
                seed=11,
                global_size=WORLD,
                global_rank=rank,
                device="cpu",
            )
            defaulted = TorchAsyncItr(  # rank and size from the process group
                tabloader.Dataset(paths),
                cats=["id", "cat"],
                labels=["label"],
                batch_size=16,
                shuffle=True,
                seed=11,
                device="cpu",
            )
        loader = DLDataLoader(explicit, collate_fn=_identity, num_workers=workers)
        epochs = []
        for _ in range(2):
            batches = list(loader)
            ids = np.concatenate([x_cat[:, 0].numpy() for x_cat, _, _ in batches])
            gathered: list[Any] = [None] * WORLD
            dist.all_gather_object(gathered, (len(batches), len(loader), ids))
            epochs.append(gathered)
        default_ids = np.concatenate([x_cat[:, 0].numpy() for x_cat, _, _ in defaulted])
        return {
            "epochs": epochs,
            "defaulted": (defaulted.global_rank, defaulted.global_size),
            "same_as_defaulted": bool(np.array_equal(epochs[0][rank][2], default_ids)),
        }
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_get_equal_batches_and_disjoint_rows(dataset_dir, workers):
    paths = dataset_dir(LAYOUT)
    reports = _run_ranks(_shard_epochs, paths, workers)
    # Both ranks gathered the same picture.
    for a, b in zip(reports[0]["epochs"], reports[1]["epochs"], strict=True):
        for (batches_a, len_a, ids_a), (batches_b, len_b, ids_b) in zip(a, b, strict=True):
            assert (batches_a, len_a) == (batches_b, len_b)
            np.testing.assert_array_equal(ids_a, ids_b)
    epochs = reports[0]["epochs"]
    for gathered in epochs:
        counts = {(batches, length) for batches, length, _ in gathered}
        assert counts == {(-(-(TOTAL // WORLD) // 16),) * 2}  # equal, and len() is exact
        per_rank = [ids for _, _, ids in gathered]
        assert [len(ids) for ids in per_rank] == [TOTAL // WORLD] * WORLD
        union = np.concatenate(per_rank)
        assert len(np.unique(union)) == len(union)  # disjoint
        assert set(union.tolist()) <= set(range(TOTAL))
        assert TOTAL - len(union) == TOTAL % WORLD  # the documented remainder sits out
    assert not np.array_equal(epochs[0][0][2], epochs[1][0][2])  # reshuffled per epoch
    assert [r["defaulted"] for r in reports] == [(0, WORLD), (1, WORLD)]
    if workers == 0:
        assert all(r["same_as_defaulted"] for r in reports)


def _train_ddp_example(rank: int, data: str) -> list[float]:
    path = ROOT / "examples" / "criteo" / "train_torch_ddp.py"
    spec = importlib.util.spec_from_file_location("criteo_train_torch_ddp", path)
    assert spec is not None
    assert spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    history: list[float] = example.main(
        [
            "--data",
            data,
            "--epochs",
            "2",
            "--batch-size",
            "500",
            "--buckets",
            "100",
            "--threads",
            "1",
        ]
    )
    return history


def test_ddp_example_trains_in_step_on_two_ranks(tmp_path):
    from tabloader.synthetic import write_criteo_like

    # Written up front (with --synthetic, rank 0 would write while rank 1 waits).
    write_criteo_like(tmp_path / "train", rows=16_000, files=4, row_group_size=4000, seed=0)
    write_criteo_like(tmp_path / "valid", rows=1600, files=1, row_group_size=1600, seed=1)
    histories = _run_ranks(_train_ddp_example, str(tmp_path))
    assert histories[0] == histories[1]  # the loss is all-reduced: the ranks agree
    assert len(histories[0]) == 2
    assert histories[0][1] < histories[0][0]
