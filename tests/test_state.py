"""The cursor, the job's position and its state dict (tabloader.state): resume rules checked
without a loader."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tabloader
from tabloader.elastic import Leg
from tabloader.state import (
    STATE_FORMAT,
    Cursor,
    Fingerprint,
    Position,
    agreed_state,
    merge_worker_states,
)

DATA = {"files": 2, "partitions": 5, "rows": 100, "digest": "0123456789abcdef"}
OPTIONS = {"cats": ["id"], "shuffle": True, "batch_size": 8, "global_rank": 0, "global_size": 1}
HERE = Fingerprint(DATA, OPTIONS)


def resume(state, fingerprint=HERE, *, seed=7, **keywords):
    return Position.from_state(state, fingerprint, seed=seed, **keywords)


def format_3(state, *, global_rank=0, worker=None):
    """``state`` as tabloader 0.1 wrote it (state format 3): one rank's (its options name
    it) and one worker share's."""
    counts = state["worker_batches"]
    if worker is None:
        worker = next(w for w, b in enumerate(counts) if b is not None)
    options = {**state["options"], "global_rank": global_rank, "global_size": state["global_size"]}
    return {
        "format": 3,
        "tabloader": "0.1.0",
        "epoch": state["epoch"],
        "seed": state["seed"],
        "batches": counts[worker],
        "worker": worker,
        "num_workers": state["num_workers"],
        "dataset": state["dataset"],
        "options": options,
    }


legs = st.lists(
    st.tuples(st.integers(1, 9), st.lists(st.integers(0, 50), min_size=1, max_size=4)).map(
        lambda t: Leg(t[0], len(t[1]), tuple(t[1]))
    ),
    max_size=3,
)


@given(
    epoch=st.integers(0, 10**6),
    seed=st.integers(0, 2**63 - 1),
    batches=st.lists(st.integers(0, 13), min_size=1, max_size=8),
    global_size=st.integers(1, 64),
    earlier=legs,
    data=st.data(),
)
def test_a_job_state_resumes_exactly_where_it_was_saved(
    epoch, seed, batches, global_size, earlier, data
):
    workers = len(batches)
    position = Position(epoch, seed, global_size, workers, tuple(batches), tuple(earlier))
    state = json.loads(json.dumps(position.to_state(HERE)))  # what a checkpoint keeps
    assert state["format"] == STATE_FORMAT
    assert state["tabloader"] == tabloader.__version__
    assert state["batches"] == sum(batches)
    assert "global_rank" not in state["options"] and "global_size" not in state["options"]
    assert resume(state, seed=seed) == position
    worker = data.draw(st.integers(0, workers - 1))
    here = position.cursor(global_size=global_size, worker=worker, num_workers=workers)
    assert here == Cursor(epoch, seed, batches[worker], worker, workers, tuple(earlier))


@given(
    batches=st.lists(st.integers(0, 13), min_size=1, max_size=4),
    saved_size=st.integers(1, 8),
    size=st.integers(1, 8),
    workers=st.integers(1, 4),
    earlier=legs,
)
def test_on_another_world_the_saved_one_becomes_a_leg_of_the_epoch(
    batches, saved_size, size, workers, earlier
):
    position = Position(3, 7, saved_size, len(batches), tuple(batches), tuple(earlier))
    cursor = position.cursor(global_size=size, worker=workers - 1, num_workers=workers)
    if (size, workers) == (saved_size, len(batches)):
        assert cursor.legs == tuple(earlier) and cursor.batches == batches[-1]
    elif not earlier and not any(batches):  # nothing delivered: a fresh epoch
        assert cursor == Cursor(3, 7, 0, workers - 1, workers)
    else:
        assert cursor.legs == (*earlier, Leg(saved_size, len(batches), tuple(batches)))
        assert (cursor.epoch, cursor.seed, cursor.batches) == (3, 7, 0)


def test_a_cursor_never_changes_moving_on_makes_a_new_one():
    leg = Leg(4, 1, (3,))
    cursor = Cursor(3, seed=1, batches=4, worker=1, num_workers=2, legs=(leg,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cursor.epoch = 4  # type: ignore[misc]
    assert cursor.at(6) == Cursor(3, 1, 6, 1, 2, (leg,))
    assert cursor.next_epoch() == Cursor(4, 1, 0, 1, 2)  # a new epoch: no earlier worlds
    assert cursor == Cursor(3, 1, 4, 1, 2, (leg,)) and cursor.share == (1, 2)


@pytest.mark.parametrize(
    ("fingerprint", "message"),
    [
        (
            Fingerprint({**DATA, "rows": 99}, OPTIONS),
            r"the dataset \(saved: 100 rows in 5 partitions of 2 files, digest 0123456789abcdef;"
            r" now: 99 rows",
        ),
        (
            Fingerprint(DATA, {**OPTIONS, "batch_size": 16}),
            r"batch_size \(saved: 8; now: 16\)",
        ),
        (Fingerprint(DATA, {**OPTIONS, "shuffle": False}), r"shuffle \(saved: True; now: False\)"),
    ],
)
def test_a_state_of_other_data_or_options_is_refused_naming_what_differs(fingerprint, message):
    state = Cursor(1, 7, 3).position(global_size=1).to_state(HERE)
    with pytest.raises(tabloader.InvalidArgumentError, match=message):
        resume(state, fingerprint)
    with pytest.raises(tabloader.InvalidArgumentError, match=message):  # format 3 alike
        resume(format_3(state), fingerprint)


def test_a_job_state_is_every_ranks_and_resumes_on_any_world():
    state = Cursor(1, 7, 3).position(global_size=2).to_state(HERE)
    elsewhere = Fingerprint(DATA, {**OPTIONS, "global_rank": 2, "global_size": 3})
    assert resume(state, elsewhere) == Position(1, 7, 2, 1, (3,))


def test_another_seed_is_refused_unless_adopted():
    state = Cursor(1, 7, 3).position(global_size=1).to_state(HERE)
    with pytest.raises(tabloader.InvalidArgumentError, match=r"seed \(saved: 7; now: 8\)"):
        resume(state, seed=8)
    assert resume(state, seed=8, adopt_seed=True) == Position(1, 7, 1, 1, (3,))


def test_a_state_of_one_worker_resumes_only_that_worker_on_its_world():
    state = Cursor(1, 7, 3, worker=1, num_workers=2).position(global_size=1).to_state(HERE)
    assert state["worker_batches"] == [None, 3]
    position = resume(state)
    assert position.cursor(global_size=1, worker=1, num_workers=2) == Cursor(1, 7, 3, 1, 2)
    with pytest.raises(
        tabloader.InvalidArgumentError,
        match="saved mid-epoch by worker 1 of 2 and cannot continue in worker 0 of 2",
    ):
        position.cursor(global_size=1, worker=0, num_workers=2)
    with pytest.raises(
        tabloader.InvalidArgumentError,
        match="worker 1 of 2 and cannot continue in worker 0 of 1 on 3 ranks: it says only",
    ):
        position.cursor(global_size=3, worker=0, num_workers=1)


def test_a_state_of_the_previous_format_belongs_to_its_rank_and_worker():
    """Format 3 states (tabloader 0.1) named the rank that saved them: the same rank and
    worker share resume them exactly; any other is refused, as before."""
    job = Cursor(1, 7, 3, worker=1, num_workers=2).position(global_size=2).to_state(HERE)
    old = format_3(job, global_rank=1)
    rank_1 = Fingerprint(DATA, {**OPTIONS, "global_rank": 1, "global_size": 2})
    assert resume(old, rank_1).cursor(global_size=2, worker=1, num_workers=2) == Cursor(
        1, 7, 3, 1, 2
    )
    for fingerprint, message in (
        (Fingerprint(DATA, {**OPTIONS, "global_size": 2}), r"global_rank \(saved: 1; now: 0\)"),
        (Fingerprint(DATA, {**OPTIONS, "global_rank": 1, "global_size": 3}), "global_size"),
        (HERE, r"global_rank \(saved: 1; now: 0\), global_size \(saved: 2; now: 1\)"),
    ):
        with pytest.raises(tabloader.InvalidArgumentError, match=message):
            resume(old, fingerprint)
    with pytest.raises(
        tabloader.InvalidArgumentError,
        match="saved mid-epoch by worker 1 of 2 and cannot continue in worker 0 of 1",
    ):
        resume(old, rank_1).cursor(global_size=2, worker=0, num_workers=1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"format": 1},
            rf"saved by tabloader 0\.0\.1 \(state format 1\).*reads format {STATE_FORMAT}",
        ),
        (
            {"format": 2},
            r"saved by tabloader 0\.0\.1 \(state format 2\), which shuffled chunks in another",
        ),
        (
            {"format": STATE_FORMAT + 1},
            rf"it has state format {STATE_FORMAT + 1} .*reads format {STATE_FORMAT}",
        ),
        ({"epoch": "1"}, r"its 'epoch' must be an integer, got '1'"),
        ({"options": []}, r"its 'options' must be a dict"),
        ({"global_size": 0}, r"its 'global_size' must be at least 1, got 0"),
        ({"worker_batches": [3, 1]}, r"'worker_batches' must be a list of 1 non-negative"),
        ({"worker_batches": [-1]}, r"'worker_batches' must be a list of 1 non-negative"),
        ({"batches": 4}, r"its 'batches' \(4\) is not the sum of its 'worker_batches' \(\[3\]\)"),
        ({"earlier": {}}, r"its 'earlier' must be a list of dicts"),
        (
            {"earlier": [{"global_size": 2, "num_workers": 1, "worker_batches": [None]}]},
            r"its earlier world 0's 'worker_batches' must be a list of 1 non-negative integers",
        ),
    ],
)
def test_a_state_of_another_format_says_what_it_is(change, message):
    state = {**Cursor(1, 7, 3).position(global_size=1).to_state(HERE), "tabloader": "0.0.1"}
    state.update(change)
    with pytest.raises(tabloader.InvalidArgumentError, match=message):
        resume(state)
    with pytest.raises(tabloader.InvalidArgumentError, match="not a tabloader loader state"):
        resume({"epoch": 1})


def test_the_ranks_states_agree_or_are_refused_naming_the_ranks():
    states = [Cursor(0, 7, 5).position(global_size=3).to_state(HERE) for _ in range(3)]
    assert agreed_state(states) == states[0]
    behind = [*states[:2], {**states[2], "batches": 4, "worker_batches": [4]}]
    with pytest.raises(
        tabloader.InvalidArgumentError,
        match=r"rank 2's batches is 4, rank 0's 5\. The ranks were not in step",
    ):
        agreed_state(behind)
    other_data = [*states[:2], {**states[2], "dataset": {**DATA, "rows": 99}}]
    with pytest.raises(tabloader.InvalidArgumentError, match=r"rank 2's dataset is .*Every rank"):
        agreed_state(other_data)
    # a copy of the data on each rank's node: the same rows, another place and stamps
    copies = [{**st_, "dataset": {**DATA, "place": f"p{r}", "stamps": f"s{r}"}}
              for r, st_ in enumerate(states)]  # fmt: skip
    assert agreed_state(copies)["batches"] == 5
    # unshuffled, each rank's own seed (drawn where none was given) decides nothing
    in_order = [
        Cursor(0, seed, 5)
        .position(global_size=3)
        .to_state(Fingerprint(DATA, {**OPTIONS, "shuffle": False}))
        for seed in (1, 2, 3)
    ]
    assert agreed_state(in_order)["batches"] == 5
    with pytest.raises(tabloader.InvalidArgumentError, match=r"rank 1's seed is 8, rank 0's 7"):
        agreed_state([states[0], {**states[1], "seed": 8}, states[2]])
    with pytest.raises(tabloader.InvalidArgumentError, match=r"2 state\(s\) for a job of 3"):
        agreed_state(states[:2])
    with pytest.raises(tabloader.InvalidArgumentError, match="no states"):
        agreed_state([])
    one_worker = Cursor(0, 7, 5, 1, 2).position(global_size=1).to_state(HERE)
    with pytest.raises(tabloader.InvalidArgumentError, match="saved inside a worker process"):
        agreed_state([one_worker])
    with pytest.raises(tabloader.InvalidArgumentError, match=r"has format 3 .* belong to their"):
        agreed_state([format_3(states[0])])


def test_worker_states_merge_into_the_state_of_their_rank():
    shares = [Cursor(2, 7, b, w, 3).position(global_size=4).to_state(HERE) for w, b in
              ((2, 1), (0, 2), (1, 2))]  # fmt: skip
    merged = merge_worker_states(shares)
    assert (merged["worker_batches"], merged["batches"]) == ([2, 2, 1], 5)
    assert resume(merged) == Position(2, 7, 4, 3, (2, 2, 1))
    with pytest.raises(tabloader.InvalidArgumentError, match=r"no state of worker\(s\) \[1\]"):
        merge_worker_states([shares[0], shares[1]])
    later = Cursor(3, 7, 0, 1, 3).position(global_size=4).to_state(HERE)
    with pytest.raises(tabloader.InvalidArgumentError, match="their epoch differs"):
        merge_worker_states([*shares[:2], later])
