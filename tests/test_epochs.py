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
    resumed.load_state_dict(run.state_dict())
    assert resumed.start(1, 2) is not None  # its own share continues
    resumed.load_state_dict(run.state_dict())
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
        return iter("workers")

    assert list(epochs.hand_to_workers(start_workers, num_workers=2)) == list("workers")
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
    managed.hand_to_workers(
        lambda: iter(()), num_workers=2
    )  # the training process hands it each epoch
    set_epoch.set_epoch(0)
    for told in (managed, set_epoch):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ids(told.start(0, 2, in_worker=True))


def test_persistent_workers_cannot_follow_an_epoch_set_after_they_started():
    epochs = make()
    assert list(epochs.hand_to_workers(lambda: iter("started"), num_workers=2)) == list("started")
    assert epochs.epoch == 1
    assert list(epochs.hand_to_workers(lambda: iter("in step"), num_workers=2, started=True))
    epochs.set_epoch(5)
    with pytest.raises(tabloader.TabloaderError, match="persistent worker processes will run "
                       r"epoch 2, but the dataset was moved to epoch 5"):  # fmt: skip
        epochs.hand_to_workers(lambda: iter("never"), num_workers=2, started=True)


def _in_turn(runs) -> list[list[int]]:
    """The batches of worker shares taken in turn, as a DataLoader takes them from its
    worker processes (in order), passing over those that ended."""
    runs, out = [iter(r) for r in runs], []
    while runs:
        for run in list(runs):
            batch = next(run, None)
            if batch is None:
                runs.remove(run)
            else:
                out.append(batch["id"].tolist())
    return out


def _workers_epoch(epochs: Epochs, workers: int):
    """The next epoch of ``epochs`` run by ``workers`` copies of it, as DLDataLoader's
    worker processes run it, their batches taken in turn."""

    def start_workers():
        copies = [pickle.loads(pickle.dumps(epochs)) for _ in range(workers)]
        for copy in copies:
            copy.attach(epochs.loader)
        runs = [copy.start(w, workers, in_worker=True) for w, copy in enumerate(copies)]
        return iter(_in_turn(runs))

    return epochs.hand_to_workers(start_workers, num_workers=workers)


@settings(max_examples=25, deadline=None)
@given(saved_workers=st.integers(1, 4), resumed_workers=st.integers(1, 4), data=st.data())
def test_the_training_process_counts_the_batches_of_its_worker_processes(
    saved_workers, resumed_workers, data
):
    """With worker processes, the training process's state says how many batches each
    worker share handed out (taken in turn), so the job resumes on any number of workers
    with every row of the epoch exactly once."""
    epochs = make()
    whole = sorted(r for b in ids(epochs.loader.iter_epoch(0)) for r in b)
    batches = _workers_epoch(epochs, saved_workers)
    stop = data.draw(st.integers(0, len(epochs.loader)))
    head = [next(batches) for _ in range(stop)]
    state = epochs.state_dict()
    if stop == len(epochs.loader):  # every batch taken: the epoch is over (its end not asked)
        assert (state["epoch"], state["batches"]) == (1, 0)
        resumed = make()
        resumed.load_state_dict(state)
        assert resumed.epoch == 1 and sorted(r for b in head for r in b) == whole
        return
    assert (state["epoch"], state["batches"], state["num_workers"]) == (0, stop, saved_workers)
    resumed = make()
    resumed.load_state_dict(state)
    rest = list(_workers_epoch(resumed, resumed_workers))
    assert sorted(r for b in head + rest for r in b) == whole  # every row exactly once
    if resumed_workers == saved_workers:
        # the batches of a run never pre-empted (the resumed DataLoader takes them from
        # its first worker again, so they may come in another order)
        assert sorted(head + rest) == sorted(_workers_epoch(make(), saved_workers))
    assert resumed.epoch == 1 and resumed.state_dict()["batches"] == 0


def test_set_epoch_continues_a_loaded_state_of_that_epoch_and_drops_another():
    """StatefulDataLoader's pattern: load a state, then set_epoch() before each epoch."""
    epochs = make()
    run = epochs.start()
    head = [next(run)["id"].tolist() for _ in range(3)]
    state = epochs.state_dict()
    whole = ids(make().start())
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(0)  # the saved epoch: it goes on where it stopped
    assert head + ids(resumed.start()) == whole
    moved = make()
    moved.load_state_dict(state)
    moved.set_epoch(1)  # another epoch: from its start
    assert ids(moved.start()) == ids(make().loader.iter_epoch(1))
    core = make().loader
    core.load_state_dict(state)
    core.set_epoch(2)
    assert ids(iter(core)) == ids(make().loader.iter_epoch(2))


@pytest.mark.parametrize("epoch", [0, 1, 4])
def test_a_state_saved_after_set_epoch_points_where_the_next_epoch_starts(epoch):
    """A loop that leaves each epoch early (a fixed number of steps) and checkpoints
    after set_epoch(): the unfinished epoch is given up, and resuming the state delivers
    the epoch the uninterrupted loop went on with."""
    for whose in ("epochs", "loader"):
        epochs = make()
        core = epochs.loader
        run = epochs.start() if whose == "epochs" else iter(core)
        next(run)
        (epochs if whose == "epochs" else core).set_epoch(epoch)
        state = (epochs if whose == "epochs" else core).state_dict()
        assert (state["epoch"], state["batches"]) == (epoch, 0), whose
        resumed = make()
        resumed.load_state_dict(state)
        assert ids(resumed.start()) == ids(make().loader.iter_epoch(epoch)), whose
