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
    rank: int,
    world: int,
    port: int,
    target: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
) -> None:
    try:
        torch.set_num_threads(1)
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
        )
        results.put((rank, target(rank, *args), None))
    except BaseException:
        results.put((rank, None, traceback.format_exc()))


def _run_ranks(target: Callable[..., Any], *args: Any, world: int = WORLD) -> list[Any]:
    """Run ``target(rank, *args)`` in ``world`` fresh processes (``WORLD_SIZE`` and the
    rest set for a process group); return what each returned.

    The ranks are spawned, not forked: a fork of the test process copies whatever locks
    its other threads (earlier tests' loaders, TensorFlow, torch's pools) hold at that
    moment, and a rank can hang on one of them.
    """
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = _free_port()
    processes = [
        context.Process(target=_entry, args=(rank, world, port, target, args, results))
        for rank in range(world)
    ]
    for p in processes:
        p.start()
    try:
        outcome = dict.fromkeys(range(world))
        for _ in range(world):
            rank, value, error = results.get(timeout=TIMEOUT)
            assert error is None, f"rank {rank} failed:\n{error}"
            outcome[rank] = value
    finally:
        for p in processes:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [outcome[rank] for rank in range(world)]


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


# -- pre-empted on one number of ranks, resumed on another -----------------------------------

ELASTIC_OPTIONS: dict[str, Any] = {
    "cats": ["id", "cat"],
    "labels": ["label"],
    "batch_size": 8,
    "shuffle": True,
    "seed": 11,
    "chunk_rows": 60,
    "device": "cpu",
}


def _loader_of(itr: TorchAsyncItr, workers: int, kind: str) -> Any:
    if kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(itr, batch_size=None, num_workers=workers, collate_fn=_identity)
    return DLDataLoader(itr, collate_fn=_identity, num_workers=workers)


def _preempted(rank: int, paths: list[str], workers: int, kind: str, stop: int) -> dict[str, Any]:
    """In one rank of the old job: ``stop`` batches of epoch 0, then the job's state, agreed
    by every rank through the process group."""
    dist.init_process_group("gloo")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            itr = TorchAsyncItr(tabloader.Dataset(paths), **ELASTIC_OPTIONS)
            loader = _loader_of(itr, workers, kind)
            if kind == "stateful":
                itr.set_epoch(0)
            ids = []
            for x_cat, _, _ in loader:
                ids.append(x_cat[:, 0].numpy().copy())
                if len(ids) == stop:
                    break
            state = tabloader.torch.agreed_state(loader)
        return {"ids": ids, "state": state, "rank": itr.global_rank, "size": itr.global_size}
    finally:
        dist.destroy_process_group()


def _resumed(rank: int, paths: list[str], workers: int, kind: str, state: Any) -> dict[str, Any]:
    """In one rank of the new job: the rest of epoch 0 from ``state``, then epoch 1."""
    dist.init_process_group("gloo")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            itr = TorchAsyncItr(tabloader.Dataset(paths), **ELASTIC_OPTIONS)
            itr.load_state_dict(state)
            loader = _loader_of(itr, workers, kind)
            epochs = []
            for epoch in (0, 1):
                if kind == "stateful":
                    itr.set_epoch(epoch)
                epochs.append([x_cat[:, 0].numpy().copy() for x_cat, _, _ in loader])
        return {"epochs": epochs, "len": len(itr), "size": itr.global_size}
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sizes", "workers", "kind"),
    [
        ((4, 2), (2, 0), "dl"),
        ((2, 3), (0, 2), "dl"),
        ((3, 1), (2, 0), "stateful"),
        ((2, 3), (0, 2), "stateful"),
    ],
    ids=["4-ranks-to-2", "2-ranks-to-3", "3-ranks-to-1", "2-ranks-to-3-torchdata"],
)
def test_a_job_pre_empted_mid_epoch_resumes_on_another_number_of_ranks(
    dataset_dir, sizes, workers, kind
):
    """Real gloo ranks: the old job is pre-empted mid-epoch and saves one state (agreed by
    every rank), the new job, on another number of ranks and worker processes, loads it
    on every rank. The rows delivered before and after are the epoch's rows, each once
    (at most ``new - 1`` of those left sitting out), every new rank delivers the same
    number of batches, and the next epoch is a fresh job's on the new ranks."""
    if kind == "stateful":
        pytest.importorskip("torchdata")
    paths = dataset_dir(LAYOUT)
    (old_size, new_size), (old_workers, new_workers) = sizes, workers
    stop = 5  # batches per old rank before the pre-emption (an epoch has 10 on 4 ranks)
    before = _run_ranks(_preempted, paths, old_workers, kind, stop, world=old_size)
    assert [(r["rank"], r["size"]) for r in before] == [(r, old_size) for r in range(old_size)]
    state = before[0]["state"]
    assert all(r["state"] == state for r in before)  # one state, the same on every rank
    assert (state["global_size"], state["num_workers"], state["batches"]) == (
        old_size, max(old_workers, 1), stop,
    )  # fmt: skip
    after = _run_ranks(_resumed, paths, new_workers, kind, state, world=new_size)

    # the epoch's rows: those its first ranks were dealt
    options = {k: v for k, v in ELASTIC_OPTIONS.items() if k != "device"}
    epoch_rows = np.concatenate(
        [
            np.concatenate([b["id"] for b in tabloader.Loader(paths, **options, global_rank=r,
                                                               global_size=old_size)])
            for r in range(old_size)
        ]
    )  # fmt: skip
    old_ids = np.concatenate([i for r in before for i in r["ids"]])
    assert len(old_ids) == old_size * stop * ELASTIC_OPTIONS["batch_size"]
    new_ids = np.concatenate([i for r in after for i in r["epochs"][0]])
    union = np.concatenate([old_ids, new_ids])
    assert len(np.unique(union)) == len(union)  # none twice
    assert set(union.tolist()) <= set(epoch_rows.tolist())  # none from outside the epoch
    left = len(epoch_rows) - len(old_ids)
    assert len(epoch_rows) - len(union) == left % new_size  # at most new_size - 1 sit out
    assert len({len(r["epochs"][0]) for r in after}) == 1  # every new rank in step
    # the next epoch: a fresh job's on the new ranks (every row once, equal batches)
    fresh = [
        np.concatenate(
            [b["id"] for b in tabloader.Loader(paths, **options, global_rank=r,
                                               global_size=new_size).iter_epoch(1)]
        )
        for r in range(new_size)
    ]  # fmt: skip
    for r, report in enumerate(after):
        assert len(report["epochs"][1]) == report["len"]
        assert sorted(np.concatenate(report["epochs"][1]).tolist()) == sorted(fresh[r].tolist())
