"""Exact mid-epoch resume: state_dict / load_state_dict on the core loader and adapters."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tabloader
from conftest import write_dataset
from tabloader.plan import plan_epoch

LAYOUT = [[37, 101, 5], [64], [1, 90, 33]]  # 331 rows, ragged row groups
TOTAL = sum(map(sum, LAYOUT))
COLS = {"cats": ["id", "cat"], "conts": ["x"], "labels": ["label"]}
FAST = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(autouse=True)
def _quiet(quiet_loader_warnings: None) -> None:
    """Every test here runs with the loader's advice silenced (see conftest)."""


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_dataset(tmp_path_factory.mktemp("resume"), LAYOUT)


# -- the plan: pure position arithmetic ------------------------------------------------


def _stream(plan: Any, partition_begins: np.ndarray) -> np.ndarray:
    """Global row ids of a plan's stream, in delivery order."""
    out = [np.arange(0)]
    for chunk in range(plan.num_chunks):
        ids = np.concatenate(
            [np.arange(p_lo, p_hi) + partition_begins[p] for p, p_lo, p_hi in plan.pieces(chunk)]
            or [np.arange(0)]
        )
        order = plan.batch_order(chunk)
        out.append(ids if order is None else ids[order])
    return np.concatenate(out)


@given(
    rows=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    batch_size=st.integers(1, 17),
    chunking=st.one_of(
        st.integers(1, 3).map(lambda n: {"parts_per_chunk": n}),
        st.integers(1, 50).map(lambda n: {"chunk_rows": n}),
    ),
    shuffle=st.booleans(),
    shuffle_within_batch=st.booleans(),
    drop_last=st.booleans(),
    ranks=st.sampled_from([(0, 1), (0, 2), (1, 2)]),
    workers=st.sampled_from([(0, 1), (0, 2), (1, 2)]),
    fraction=st.floats(0, 1),
    extra=st.integers(0, 16),
)
@settings(max_examples=300, deadline=None)
def test_a_resumed_plan_delivers_exactly_the_rest_of_the_stream(
    rows,
    batch_size,
    chunking,
    shuffle,
    shuffle_within_batch,
    drop_last,
    ranks,
    workers,
    fraction,
    extra,
):
    partition_rows = np.array(rows, dtype=np.int64)
    begins = np.concatenate([[0], np.cumsum(partition_rows)[:-1]])
    plan = plan_epoch(
        partition_rows,
        batch_size=batch_size,
        shuffle=shuffle,
        shuffle_within_batch=shuffle_within_batch,
        seed=7,
        epoch=3,
        global_rank=ranks[0],
        global_size=ranks[1],
        worker=workers[0],
        num_workers=workers[1],
        drop_last=drop_last,
        **chunking,
    )
    done = round(fraction * plan.num_batches)
    rest = plan.resume(done)
    full = _stream(plan, begins)
    assert _stream(rest, begins).tolist() == full[done * batch_size :].tolist()
    assert rest.num_batches == plan.num_batches - done
    assert rest.rows_before(0) == min(done * batch_size, plan.num_rows)
    # Chunks wholly before the resume point are not in the resumed plan: every chunk
    # delivers rows, and an unshuffled chunk reads only the rows it delivers.
    assert all(rest.chunk_rows(c) > 0 for c in range(rest.num_chunks))
    if not shuffle:
        assert all(rest.stored_rows(c) == rest.chunk_rows(c) for c in range(rest.num_chunks))
    # Any row, not only a batch's first: the rest of the stream (a cache that failed
    # mid-way streams the rest of its epoch so), twice over.
    cut = min(done * batch_size + extra, plan.num_rows)
    after = rest.after_rows(cut - min(done * batch_size, plan.num_rows))
    assert _stream(after, begins).tolist() == full[cut:].tolist()
    assert after.num_rows == plan.num_rows - cut


# -- the core loader ---------------------------------------------------------------------


def _loader(paths: list[str], **options: Any) -> tabloader.Loader:
    settings_: dict[str, Any] = {**COLS, "batch_size": 32, "seed": 5}
    settings_.update(options)
    return tabloader.Loader(paths, **settings_)


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys()
        and all(x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


def _copy(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: np.array(v) for k, v in batch.items()}


OPTIONS = st.fixed_dictionaries(
    {
        "batch_size": st.integers(7, 70),
        "shuffle": st.booleans(),
        "shuffle_within_batch": st.booleans(),
        "drop_last": st.booleans(),
        "ranks": st.sampled_from([(0, 1), (0, 2), (1, 2)]),
        "chunking": st.sampled_from(
            [{"parts_per_chunk": 1}, {"parts_per_chunk": 3}, {"chunk_rows": 100}, {}]
        ),
    }
)


def _options(drawn: dict[str, Any]) -> dict[str, Any]:
    rank, size = drawn["ranks"]
    return {
        "batch_size": drawn["batch_size"],
        "shuffle": drawn["shuffle"],
        "shuffle_within_batch": drawn["shuffle_within_batch"],
        "drop_last": drawn["drop_last"],
        "global_rank": rank,
        "global_size": size,
        **drawn["chunking"],
    }


@given(drawn=OPTIONS, fraction=st.floats(0, 1))
@FAST
def test_resume_continues_bit_identically_and_every_row_comes_once(paths, drawn, fraction):
    options = _options(drawn)
    reference = _loader(paths, **options)
    epochs = [[_copy(b) for b in reference] for _ in range(2)]

    first = _loader(paths, **options)
    stop = round(fraction * len(first))
    iterator = iter(first)
    before = [_copy(next(iterator)) for _ in range(stop)]
    state = json.loads(json.dumps(first.state_dict()))
    iterator.close()

    resumed = _loader(paths, **options)
    resumed.load_state_dict(state)
    after = [_copy(b) for b in resumed]
    assert _same(before + after, epochs[0])
    assert _same([_copy(b) for b in resumed], epochs[1])
    rows = np.concatenate([b["id"] for b in before + after] or [np.arange(0)])
    assert len(np.unique(rows)) == len(rows)  # every row at most once ...
    expected = sum(len(b["id"]) for b in epochs[0])
    assert len(rows) == expected  # ... and every row of the epoch exactly once


def test_state_is_small_json_and_says_where_the_epoch_stands(paths):
    loader = _loader(paths, shuffle=True)
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["batches"] == 0
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    time.sleep(0.2)  # the background thread has read ahead by now
    state = loader.state_dict()
    assert (state["epoch"], state["batches"], state["seed"]) == (0, 3, 5)
    assert set(state) == {
        "format",
        "tabloader",
        "epoch",
        "seed",
        "batches",
        "worker",
        "num_workers",
        "dataset",
        "options",
    }
    assert len(json.dumps(state)) < 1000
    list(iterator)  # the epoch ends: the state points at the next one
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches"]) == (1, 0)


def test_resume_does_not_read_chunks_before_the_resume_point(paths):
    loader = _loader(paths, parts_per_chunk=1, batch_size=10)  # 7 chunks, in stored order
    state = loader.epoch_state(0, 30)  # 300 rows delivered: only the last chunk is left
    resumed = _loader(paths, parts_per_chunk=1, batch_size=10)
    resumed.load_state_dict(state)
    ids = np.concatenate([b["id"] for b in resumed])
    assert ids.tolist() == list(range(300, TOTAL))
    assert resumed.stats().chunks == 1  # the 33-row group only


def test_a_loader_without_seed_takes_the_saved_one(paths):
    first = _loader(paths, seed=None, shuffle=True)
    it = iter(first)
    before = [_copy(next(it)) for _ in range(2)]
    state = first.state_dict()
    resumed = _loader(paths, seed=None, shuffle=True)
    resumed.load_state_dict(state)
    assert resumed.seed == first.seed
    again = _loader(paths, seed=first.seed, shuffle=True)
    assert _same(before + [_copy(b) for b in resumed], [_copy(b) for b in again])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"batch_size": 16}, "batch_size (saved: 32; now: 16)"),
        ({"seed": 6}, "seed (saved: 5; now: 6)"),
        ({"global_size": 2, "global_rank": 1}, "global_size (saved: 1; now: 2)"),
        ({"cats": ["id"]}, "cats (saved: ['id', 'cat']; now: ['id'])"),
        ({"shuffle": False}, "shuffle (saved: True; now: False)"),
    ],
)
def test_a_state_of_another_setup_is_refused_naming_what_differs(paths, change, message):
    state = _loader(paths, shuffle=True).state_dict()
    other = _loader(paths, **{"shuffle": True, **change})
    with pytest.raises(tabloader.InvalidArgumentError, match="cannot resume") as caught:
        other.load_state_dict(state)
    assert message in str(caught.value)


def test_a_state_of_another_dataset_is_refused(paths, tmp_path):
    state = _loader(paths).state_dict()
    other = _loader(write_dataset(tmp_path, [[37, 101, 5], [64], [1, 90, 34]]))
    with pytest.raises(tabloader.InvalidArgumentError) as caught:
        other.load_state_dict(state)
    text = str(caught.value)
    assert "the dataset (saved: 331 rows in 7 partitions of 3 files" in text
    assert "now: 332 rows in 7 partitions of 3 files" in text


def test_something_else_than_a_state_is_refused(paths):
    loader = _loader(paths)
    with pytest.raises(tabloader.InvalidArgumentError, match="not a tabloader loader state"):
        loader.load_state_dict({"epoch": 1})
    state = loader.state_dict()
    with pytest.raises(tabloader.InvalidArgumentError, match="reads format 3"):
        loader.load_state_dict({**state, "format": 99})
    with pytest.raises(tabloader.InvalidArgumentError, match="an epoch has 11 here"):
        loader.load_state_dict({**state, "batches": 12})


# -- torch: TorchAsyncItr, DLDataLoader, torchdata's StatefulDataLoader ------------------


def _torch_options(drawn: dict[str, Any]) -> dict[str, Any]:
    options = _options(drawn)
    return {**COLS, "seed": 5, "device": "cpu", **options}


def _as_numpy(batch: Any) -> tuple[np.ndarray, ...]:
    return tuple(t.numpy().copy() for t in batch)


def _same_tensors(a: list[tuple[np.ndarray, ...]], b: list[tuple[np.ndarray, ...]]) -> bool:
    return len(a) == len(b) and all(
        all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(p, q, strict=True))
        for p, q in zip(a, b, strict=True)
    )


def _identity(batch: Any) -> Any:
    return batch


def _stateful_run(
    paths: list[str], options: dict[str, Any], workers: int, stop: int | None
) -> tuple[list[Any], list[Any], dict[str, Any] | None]:
    """Epochs 0 and 1 through a StatefulDataLoader; with ``stop``, epoch 0 is cut there
    and the rest comes from a fresh dataset and loader restored from the saved state."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from tabloader.torch import TorchAsyncItr

    def make() -> tuple[Any, Any]:
        itr = TorchAsyncItr(paths, **options)
        return itr, StatefulDataLoader(
            itr, batch_size=None, num_workers=workers, collate_fn=_identity
        )

    itr, loader = make()
    itr.set_epoch(0)
    first: list[Any] = []
    state = loader.state_dict() if stop == 0 else None
    for batch in loader if stop != 0 else ():
        first.append(_as_numpy(batch))
        if stop is not None and len(first) == stop:
            state = loader.state_dict()
            break
    if stop is not None:
        del loader, itr
        state = torch_roundtrip(state)
        itr, loader = make()
        loader.load_state_dict(state)
        itr.set_epoch(0)
        first += [_as_numpy(b) for b in loader]
    itr.set_epoch(1)
    second = [_as_numpy(b) for b in loader]
    return first, second, state


def torch_roundtrip(state: Any) -> Any:
    """Through torch.save / torch.load, as a checkpoint would."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _check_torch_resume(paths: list[str], drawn: dict[str, Any], fraction: float, workers: int):
    options = _torch_options(drawn)
    ref_first, ref_second, _ = _stateful_run(paths, options, workers, None)
    stop = round(fraction * len(ref_first))
    first, second, _ = _stateful_run(paths, options, workers, stop)
    assert _same_tensors(first, ref_first)
    assert _same_tensors(second, ref_second)
    ids = np.concatenate([b[0][:, 0] for b in first] or [np.arange(0)])
    assert len(np.unique(ids)) == len(ids)


@pytest.mark.torch
@given(drawn=OPTIONS, fraction=st.floats(0, 1))
@FAST
def test_torch_stateful_dataloader_resumes_exactly_in_process(paths, drawn, fraction):
    pytest.importorskip("torchdata")
    _check_torch_resume(paths, drawn, fraction, workers=0)


@pytest.mark.torch
@pytest.mark.slow
@given(drawn=OPTIONS, fraction=st.floats(0, 1))
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_torch_stateful_dataloader_resumes_exactly_with_worker_processes(paths, drawn, fraction):
    pytest.importorskip("torchdata")
    _check_torch_resume(paths, drawn, fraction, workers=2)


@pytest.mark.torch
def test_torch_async_itr_state_dict_in_a_plain_loop(paths):
    pytest.importorskip("torch")
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    options = {**COLS, "batch_size": 32, "shuffle": True, "seed": 3, "device": "cpu"}
    reference = TorchAsyncItr(paths, **options)
    epochs = [[_as_numpy(b) for b in reference] for _ in range(2)]

    itr = TorchAsyncItr(paths, **options)
    loader = DLDataLoader(itr, collate_fn=_identity)
    before = []
    for batch in loader:
        before.append(_as_numpy(batch))
        if len(before) == 4:
            break
    state = torch_roundtrip(itr.state_dict())
    assert (state["epoch"], state["batches"]) == (0, 4)

    again = TorchAsyncItr(paths, **options)
    again.load_state_dict(state)
    loader = DLDataLoader(again, collate_fn=_identity)
    assert _same_tensors(before + [_as_numpy(b) for b in loader], epochs[0])
    assert (again.state_dict()["epoch"], again.state_dict()["batches"]) == (1, 0)
    assert _same_tensors([_as_numpy(b) for b in loader], epochs[1])


@pytest.mark.torch
def test_torch_refuses_a_state_of_another_setup(paths):
    pytest.importorskip("torch")
    from tabloader.torch import TorchAsyncItr

    state = TorchAsyncItr(paths, **COLS, batch_size=32, seed=1, device="cpu").state_dict()
    other = TorchAsyncItr(paths, **COLS, batch_size=64, seed=1, device="cpu")
    with pytest.raises(tabloader.InvalidArgumentError, match=r"batch_size \(saved: 32; now: 64\)"):
        other.load_state_dict(state)


# -- Keras ---------------------------------------------------------------------------------


def _keras(paths: list[str], **options: Any) -> Any:
    from tabloader.tensorflow import KerasSequenceLoader

    settings_: dict[str, Any] = {
        "batch_size": 32,
        "cat_names": ["id", "cat"],
        "cont_names": ["x"],
        "label_names": ["label"],
        "seed": 5,
    }
    settings_.update(options)
    return KerasSequenceLoader(paths, **settings_)


def _keras_batch(item: Any) -> tuple[np.ndarray, ...]:
    features, labels = item
    return (*(features[k].numpy() for k in sorted(features)), labels.numpy())


@pytest.mark.tensorflow
@given(drawn=OPTIONS, fraction=st.floats(0, 1))
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_keras_loader_resumes_exactly(paths, drawn, fraction):
    pytest.importorskip("tensorflow")
    rank, size = drawn["ranks"]
    options = {
        "batch_size": drawn["batch_size"],
        "shuffle": drawn["shuffle"],
        "shuffle_within_batch": drawn["shuffle_within_batch"],
        "drop_last": drawn["drop_last"],
        "global_rank": rank,
        "global_size": size,
        **drawn["chunking"],
    }
    options.pop("chunk_rows", None)  # Keras sizes chunks with buffer_size
    reference = _keras(paths, **options)
    epochs = [[_keras_batch(b) for b in reference] for _ in range(2)]

    first = _keras(paths, **options)
    stop = round(fraction * len(first))
    before = [_keras_batch(first[i]) for i in range(stop)]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()

    resumed = _keras(paths, **options)
    resumed.load_state_dict(state)
    if stop == len(first):  # every batch served: the epoch is over, the state says so
        assert (state["epoch"], state["batches"]) == (1, 0)
        after = []
    else:
        assert len(resumed) == len(first) - stop
        after = [_keras_batch(b) for b in resumed]
    assert _same_tensors(before + after, epochs[0])
    assert len(resumed) == len(first)
    assert _same_tensors([_keras_batch(b) for b in resumed], epochs[1])


@pytest.mark.tensorflow
def test_keras_fit_after_a_resume_trains_on_the_rest_of_the_epoch(paths):
    pytest.importorskip("tensorflow")
    import keras

    seen: list[int] = []

    class Record(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            seen.append(batch)

    def model() -> Any:
        inputs = {
            n: keras.Input(shape=(), name=n, dtype=d)
            for n, d in (("id", "int64"), ("cat", "int64"), ("x", "float32"))
        }
        out = keras.layers.Dense(1)(keras.ops.expand_dims(inputs["x"], -1))
        m = keras.Model(inputs, out)
        m.compile("sgd", "mse")
        return m

    first = _keras(paths, shuffle=True)
    for i in range(4):
        first[i]
    state = first.state_dict()
    assert (state["epoch"], state["batches"]) == (0, 4)
    resumed = _keras(paths, shuffle=True)
    resumed.load_state_dict(state)
    # Keras fixes the steps per epoch when fit starts: the rest of the resumed epoch is
    # one fit call, the later epochs another.
    net = model()
    net.fit(resumed, epochs=1, verbose=0, callbacks=[Record()])
    assert (resumed.state_dict()["epoch"], resumed.state_dict()["batches"]) == (1, 0)
    net.fit(resumed, initial_epoch=1, epochs=2, verbose=0, callbacks=[Record()])
    per_epoch = len(first)
    assert seen == list(range(per_epoch - 4)) + list(range(per_epoch))
    assert (resumed.state_dict()["epoch"], resumed.state_dict()["batches"]) == (2, 0)


@pytest.mark.tensorflow
def test_keras_refuses_a_state_of_another_setup(paths):
    pytest.importorskip("tensorflow")
    state = _keras(paths).state_dict()
    with pytest.raises(tabloader.InvalidArgumentError, match=r"seed \(saved: 5; now: 9\)"):
        _keras(paths, seed=9).load_state_dict(state)


def test_a_cached_loader_resumes_exactly_and_refuses_a_streaming_state(tmp_path):
    import pyarrow as pa

    table = pa.table({"id": np.arange(500, dtype=np.int64)})
    options = {
        "cats": ["id"],
        "batch_size": 32,
        "shuffle": "global",
        "seed": 4,
        "cache": "memory",
        "global_rank": 1,
        "global_size": 2,
    }
    whole = tabloader.Loader(table, **options)
    list(whole)  # the first epoch fills the cache
    expected = [b["id"].tolist() for b in whole]
    cut = tabloader.Loader(table, **options)
    list(cut)
    iterator = iter(cut)
    head = [next(iterator)["id"].tolist() for _ in range(5)]
    state = cut.state_dict()
    iterator.close()
    resumed = tabloader.Loader(table, **options)
    resumed.load_state_dict(state)
    assert head + [b["id"].tolist() for b in resumed] == expected
    streaming = tabloader.Loader(table, **{**options, "shuffle": True, "cache": None})
    with pytest.raises(tabloader.InvalidArgumentError, match=r"shuffle \(saved: 'global'"):
        streaming.load_state_dict(state)
