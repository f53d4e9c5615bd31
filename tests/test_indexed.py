"""Epochs served by batch index (tabloader.indexed): the bookkeeping under the Keras adapter."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tabloader
from tabloader.indexed import HEAD_BATCHES, IndexedEpochs


def make(rows: int, batch_size: int, **options: object) -> IndexedEpochs:
    table = pa.table({"id": np.arange(rows, dtype=np.int64)})
    return IndexedEpochs(tabloader.Loader(table, cats=["id"], batch_size=batch_size, **options))


def stream(epochs: IndexedEpochs, epoch: int) -> list[list[int]]:
    """The batches the core loader streams for ``epoch``, in order."""
    return [b["id"].tolist() for b in epochs.loader.iter_epoch(epoch)]


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 60),
    batch_size=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_every_index_is_served_once_per_epoch_in_stream_order_whatever_the_order(
    rows, batch_size, seed, data
):
    epochs = make(rows, batch_size, shuffle=True, seed=seed, parts_per_chunk=1)
    for epoch in range(2):
        order = data.draw(st.permutations(range(len(epochs))))
        epochs.on_epoch_begin()
        served = {i: epochs.batch(i)["id"].tolist() for i in order}
        epochs.on_epoch_end()
        # The k-th new index gets the k-th batch of the stream.
        assert [served[i] for i in order] == stream(epochs, epoch)
        assert sorted(r for b in served.values() for r in b) == list(range(rows))
        assert epochs.epoch == epoch + 1


def test_the_first_batches_are_replayed_after_keras_inspects_them():
    epochs = make(10, 3, shuffle=True, seed=4)
    inspected = [epochs.batch(0), epochs.batch(1)]  # before on_epoch_begin, as Keras does
    epochs.on_epoch_begin()
    got = [epochs.batch(i) for i in range(len(epochs))]
    assert got[0] is inspected[0] and got[1] is inspected[1]
    assert [b["id"].tolist() for b in got] == stream(epochs, 0)
    assert epochs.epoch == 0  # not over until the next request or hook
    assert [b["id"].tolist() for b in [epochs.batch(0)]] == stream(epochs, 1)[:1]
    assert epochs.epoch == 1
    assert HEAD_BATCHES == 2


def test_a_finished_epoch_advances_on_the_next_request_with_a_new_order():
    epochs = make(40, 4, shuffle=True, seed=0)
    first = [epochs.batch(i)["id"].tolist() for i in range(len(epochs))]
    second = [epochs.batch(i)["id"].tolist() for i in range(len(epochs))]
    assert epochs.epoch == 1
    assert (first, second) == (stream(epochs, 0), stream(epochs, 1))
    assert first != second


def test_an_index_asked_again_is_the_same_batch_read_again():
    epochs = make(20, 3)
    batches = [epochs.batch(i)["id"].tolist() for i in range(4)]
    with pytest.warns(tabloader.PerformanceWarning, match="batch 3 of epoch 0 was asked for"):
        assert epochs.batch(3)["id"].tolist() == batches[3]
    rest = [epochs.batch(i)["id"].tolist() for i in range(4, len(epochs))]
    assert batches + rest == stream(epochs, 0)


def test_an_unfinished_epoch_is_served_again_from_its_start():
    epochs = make(20, 3)
    epochs.on_epoch_begin()
    cut_short = [epochs.batch(i)["id"].tolist() for i in range(4)]  # steps_per_epoch=4
    epochs.on_epoch_end()
    epochs.on_epoch_begin()
    again = [epochs.batch(i)["id"].tolist() for i in range(len(epochs))]
    assert again == stream(epochs, 0) and again[:4] == cut_short
    assert epochs.epoch == 0


def test_state_dict_resumes_mid_epoch_with_the_batches_still_to_come():
    epochs = make(23, 4, shuffle=True, seed=9)
    [epochs.batch(i) for i in range(2)]
    state = epochs.state_dict()
    assert (state["epoch"], state["batches"]) == (0, 2)
    resumed = make(23, 4, shuffle=True, seed=9)
    resumed.load_state_dict(state)
    assert len(resumed) == len(epochs) - 2
    rest = [resumed.batch(i)["id"].tolist() for i in range(len(resumed))]
    assert rest == stream(epochs, 0)[2:]
    assert resumed.batch(0)["id"].tolist() == stream(epochs, 1)[0]
    assert (resumed.epoch, len(resumed)) == (1, len(epochs))


def test_set_epoch_serves_that_epoch_from_its_start():
    epochs = make(15, 4, shuffle=True, seed=2)
    epochs.batch(0)
    epochs.set_epoch(3)
    assert epochs.epoch == 3
    assert [epochs.batch(i)["id"].tolist() for i in range(len(epochs))] == stream(epochs, 3)


def test_bad_indices_are_refused():
    epochs = make(10, 4)
    with pytest.raises(TypeError, match="batch index must be an integer, got True"):
        epochs.batch(True)
    with pytest.raises(IndexError, match=r"batch index 3 is out of range: this loader has 3 "):
        epochs.batch(3)
