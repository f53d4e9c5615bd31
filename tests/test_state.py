"""The cursor and its state dict (tabloader.state): resume rules checked without a loader."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tabloader
from tabloader.state import STATE_FORMAT, Cursor, Fingerprint

DATA = {"files": 2, "partitions": 5, "rows": 100, "digest": "0123456789abcdef"}
OPTIONS = {"cats": ["id"], "shuffle": True, "batch_size": 8}
HERE = Fingerprint(DATA, OPTIONS)


def resume(state, fingerprint=HERE, *, seed=7, batches_in_epoch=13, **keywords):
    return Cursor.from_state(
        state, fingerprint, seed=seed, batches_in_epoch=batches_in_epoch, **keywords
    )


@given(
    epoch=st.integers(0, 10**6),
    seed=st.integers(0, 2**63 - 1),
    batches=st.integers(0, 13),
    num_workers=st.integers(1, 8),
    data=st.data(),
)
def test_a_state_resumes_exactly_where_it_was_saved(epoch, seed, batches, num_workers, data):
    worker = data.draw(st.integers(0, num_workers - 1))
    cursor = Cursor(epoch, seed, batches, worker, num_workers)
    state = json.loads(json.dumps(cursor.to_state(HERE)))  # what a checkpoint keeps
    assert state["format"] == STATE_FORMAT
    assert state["tabloader"] == tabloader.__version__
    assert resume(state, seed=seed, share=(worker, num_workers)) == cursor


def test_a_cursor_never_changes_moving_on_makes_a_new_one():
    cursor = Cursor(3, seed=1, batches=4, worker=1, num_workers=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cursor.epoch = 4  # type: ignore[misc]
    assert cursor.at(6) == Cursor(3, 1, 6, 1, 2)
    assert cursor.next_epoch() == Cursor(4, 1, 0, 1, 2)
    assert cursor == Cursor(3, 1, 4, 1, 2) and cursor.share == (1, 2)


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
    state = Cursor(1, 7, 3).to_state(HERE)
    with pytest.raises(tabloader.InvalidArgumentError, match=message):
        resume(state, fingerprint)


def test_another_seed_is_refused_unless_adopted():
    state = Cursor(1, 7, 3).to_state(HERE)
    with pytest.raises(tabloader.InvalidArgumentError, match=r"seed \(saved: 7; now: 8\)"):
        resume(state, seed=8)
    assert resume(state, seed=8, adopt_seed=True) == Cursor(1, 7, 3)


def test_a_state_belongs_to_its_worker_share():
    state = Cursor(1, 7, 3, worker=1, num_workers=2).to_state(HERE)
    with pytest.raises(
        tabloader.InvalidArgumentError, match=r"worker \(saved: 1; now: 0\), num_workers"
    ):
        resume(state)
    assert resume(state, share=(1, 2)).share == (1, 2)


def test_more_batches_than_an_epoch_has_are_refused():
    state = Cursor(1, 7, 14).to_state(HERE)
    with pytest.raises(tabloader.InvalidArgumentError, match="14 batches of epoch 1 were"):
        resume(state)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"format": 1},
            rf"saved by tabloader 0\.0\.1 \(state format 1\).*reads format {STATE_FORMAT}",
        ),
        (
            {"format": STATE_FORMAT + 1},
            rf"it has state format {STATE_FORMAT + 1} .*reads format {STATE_FORMAT}",
        ),
        ({"epoch": "1"}, r"its 'epoch' must be an integer, got '1'"),
        ({"options": []}, r"its 'options' must be a dict"),
    ],
)
def test_a_state_of_another_format_says_what_it_is(change, message):
    state = {**Cursor(1, 7, 3).to_state(HERE), "tabloader": "0.0.1", **change}
    with pytest.raises(tabloader.InvalidArgumentError, match=message):
        resume(state)
    with pytest.raises(tabloader.InvalidArgumentError, match="not a tabloader loader state"):
        resume({"epoch": 1})
