"""Epochs handed out one iteration at a time (tabloader.epochs): the bookkeeping under the
PyTorch adapter, without PyTorch."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tabloader
from tabloader.epochs import Epochs, seed_value

TABLE = pa.table({"id": np.arange(50, dtype=np.int64)})


def make(seed_fn=None, seed=3, **options) -> Epochs:
    loader = tabloader.Loader(
        TABLE, cats=["id"], batch_size=4, shuffle=True, seed=seed, parts_per_chunk=1, **options
    )
    return Epochs(loader, seed_fn=seed_fn, seed_given=seed_fn is None)


def ids(run) -> list[list[int]]:
    return [b["id"].tolist() for b in run]


def test_each_start_delivers_the_next_epoch_and_advances():
    epochs = make()
    first, second = ids(epochs.start()), ids(epochs.start())
    assert epochs.epoch == 2
    assert first == ids(epochs.loader.iter_epoch(0)) and second == ids(epochs.loader.iter_epoch(1))
    epochs.set_epoch(0)
    assert ids(epochs.start()) == first


def test_seed_fn_is_called_once_per_epoch_and_seeds_it():
    calls = []

    def seed_fn():
        calls.append(len(calls))
        return 100 + len(calls)

    epochs = make(seed_fn=seed_fn)
    assert epochs.prepare() == epochs.prepare() == 101  # chosen once, kept until it starts
    run = epochs.start()
    assert (run.seed, calls) == (101, [0])
    assert epochs.start().seed == 102
    with pytest.raises(tabloader.InvalidArgumentError, match=r"seed_fn\(\) must be a non-neg"):
        make(seed_fn=lambda: -1).start()


@settings(max_examples=20, deadline=None)
@given(num_workers=st.integers(1, 5), epoch=st.integers(0, 3))
def test_the_workers_shares_of_an_epoch_hold_every_row_once(num_workers, epoch):
    rows = []
    for worker in range(num_workers):
        epochs = make()
        epochs.set_epoch(epoch)
        rows += [r for b in ids(epochs.start(worker, num_workers)) for r in b]
    assert sorted(rows) == list(range(50))


def test_a_state_saved_mid_epoch_continues_there():
    epochs = make()
    run = epochs.start()
    head = [next(run)["id"].tolist() for _ in range(3)]
    state = epochs.state_dict()
    assert (state["epoch"], state["batches"]) == (0, 3)
    rest = ids(run)
    resumed = make()
    resumed.load_state_dict(state)
    assert ids(resumed.start()) == rest and head + rest == ids(make().start())
    assert resumed.epoch == 1 and resumed.state_dict()["batches"] == 0


def test_a_running_epoch_loads_a_saved_one_in_place():
    saved = make()
    run = saved.start()
    next(run)
    state = run.state_dict()
    other = make()
    live = other.start()
    live.load_state_dict(state)
    assert ids(live) == ids(run) and other.epoch == 1


def test_a_mid_epoch_state_belongs_to_its_worker():
    epochs = make()
    run = epochs.start(1, 2)
    next(run)
    resumed = make()
    resumed.load_state_dict(run.state_dict(), 1, 2)
    with pytest.raises(
        tabloader.InvalidArgumentError,
        match="saved mid-epoch by worker 1 of 2 and cannot continue in worker 0 of 1",
    ):
        resumed.start()


def test_handing_an_epoch_to_workers_chooses_its_seed_first_and_advances_after():
    seen = []
    epochs = make(seed_fn=lambda: 7)
    epochs.load_state_dict(make().state_dict())

    def start_workers():
        seen.append((epochs.epoch_seed, epochs.epoch, epochs.resume))
        return "workers"

    assert epochs.hand_to_workers(start_workers) == "workers"
    assert seen[0][:2] == (7, 0) and seen[0][2] is not None  # the copies take the resume
    assert (epochs.epoch, epochs.resume, epochs.managed) == (1, None, True)


def test_a_copy_leaves_the_loader_and_the_running_epoch_behind():
    epochs = make()
    epochs.start()
    copy = pickle.loads(pickle.dumps(epochs))
    assert not hasattr(copy, "loader") and copy.live is None


def test_seed_value_takes_only_non_negative_integers():
    assert seed_value(np.int64(5), "seed") == 5
    for bad in (True, -1, 1.5, "3"):
        with pytest.raises(tabloader.InvalidArgumentError, match="seed must be a non-negative"):
            seed_value(bad, "seed")


def test_persistent_workers_are_refused_a_seed_fn():
    make(seed_fn=lambda: 1).check_workers(persistent=False)  # fresh copies every epoch: fine
    with pytest.raises(
        tabloader.InvalidArgumentError, match="seed_fn cannot be used with persistent_workers"
    ):
        make(seed_fn=lambda: 1).check_workers(persistent=True)


def test_a_copy_in_a_worker_process_warns_that_it_would_repeat_one_epoch():
    copy = make()
    with pytest.warns(UserWarning, match="every epoch repeats epoch 0"):
        ids(copy.start(0, 2, in_worker=True))
    managed, set_epoch = make(), make()
    managed.hand_to_workers(lambda: None)  # the training process hands it each epoch
    set_epoch.set_epoch(0)
    for told in (managed, set_epoch):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ids(told.start(0, 2, in_worker=True))


def test_persistent_workers_cannot_follow_an_epoch_set_after_they_started():
    epochs = make()
    assert epochs.hand_to_workers(lambda: "started") == "started"
    assert epochs.epoch == 1
    assert epochs.hand_to_workers(lambda: "in step", started=True) == "in step"
    epochs.set_epoch(5)
    with pytest.raises(tabloader.TabloaderError, match="persistent worker processes will run "
                       r"epoch 2, but the dataset was moved to epoch 5"):  # fmt: skip
        epochs.hand_to_workers(lambda: "never", started=True)
