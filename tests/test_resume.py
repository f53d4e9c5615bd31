"""Exact mid-epoch resume: state_dict / load_state_dict on the core loader and adapters."""

from __future__ import annotations

import json
import time
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tabloader
from conftest import write_dataset
from tabloader.plan import plan_epoch
from test_state import format_3

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
    """The batch's arrays, copied to the host (from a GPU, too)."""
    return {k: v.get() if hasattr(v, "get") else np.array(v) for k, v in batch.items()}


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
    if stop and stop == len(epochs[0]):  # every batch taken: the epoch is over
        assert (state["epoch"], state["batches"]) == (1, 0)
        assert _same([_copy(b) for b in resumed], epochs[1])
        return
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
        "global_size",
        "num_workers",
        "worker_batches",
        "earlier",
        "dataset",
        "options",
    }
    assert (state["global_size"], state["num_workers"], state["worker_batches"]) == (1, 1, [3])
    assert "global_rank" not in state["options"]  # every rank's state is the same
    assert len(json.dumps(state)) < 1000
    list(iterator)  # the epoch ends: the state points at the next one
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches"]) == (1, 0)


def test_an_epoch_whose_every_batch_was_taken_is_over_before_its_end_is_asked(paths):
    """A loop counting ``len()`` steps (``zip(range(n), loader)``) never asks past the last
    batch: the epoch is over all the same (``loader.epoch`` says so), and its state
    points at the next epoch, which a resume then delivers whole."""
    pytest.importorskip("torch")
    from tabloader.torch import TorchAsyncItr

    loader = _loader(paths, shuffle=True)
    reference = _loader(paths, shuffle=True)
    epochs = [[b["id"].tolist() for b in reference] for _ in range(2)]
    iterator = iter(loader)
    taken = [next(iterator)["id"].tolist() for _ in range(len(loader))]
    assert taken == epochs[0] and loader.epoch == 1
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 0)
    resumed = _loader(paths, shuffle=True)
    resumed.load_state_dict(state)
    assert [b["id"].tolist() for b in resumed] == epochs[1]

    options = {**COLS, "batch_size": 32, "shuffle": True, "seed": 3, "device": "cpu"}
    itr = TorchAsyncItr(paths, **options)
    steps = iter(itr)
    for _ in range(len(itr)):
        next(steps)
    assert (itr.state_dict()["epoch"], itr.state_dict()["batches"]) == (1, 0)
    # the same with worker processes, which hand the epoch's batches over in turn (or as
    # they come): the state said epoch 0 with every batch taken (a resume ran an empty
    # epoch first), or, taken as they come, refused to be saved "mid-epoch"
    from tabloader.torch import DLDataLoader

    for in_order in (True, False):
        itr = TorchAsyncItr(paths, **options)
        workers = DLDataLoader(itr, collate_fn=lambda b: b, num_workers=2, in_order=in_order)
        steps = iter(workers)
        for _ in range(len(workers)):
            next(steps)
        state = itr.state_dict()
        assert (itr.epoch, state["epoch"], state["batches"]) == (1, 1, 0)
        del steps


def test_an_epoch_with_no_batch_for_this_rank_is_not_over_before_it_is_asked_for_one():
    """With ``drop_last`` a rank may get no batch: started and saved before it was asked
    for one, its epoch is not over (on fewer ranks its rows are some rank's batches)."""
    import pyarrow as pa

    table = pa.table({"id": np.arange(30, dtype=np.int64)})
    options = {"cats": ["id"], "batch_size": 8, "drop_last": True, "seed": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the rank gets fewer rows than a batch
        loader = tabloader.Loader(table, **options, global_rank=0, global_size=4)
    epoch = iter(loader)
    assert len(loader) == 0
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (0, 0)
    assert list(epoch) == [] and loader.state_dict()["epoch"] == 1  # asked: over


def test_an_epoch_that_failed_or_was_closed_is_not_finished_however_often_it_is_asked(
    tmp_path,
):
    """Asked past a failure or a close(), the iterator ends, and the state stays at the
    next batch not handed out: it was taken for the epoch's end, and a resume skipped
    the rest of the epoch."""
    import os

    paths = write_dataset(tmp_path / "d", [[100, 100], [100, 100]])
    options = {"cats": ["id"], "batch_size": 50, "parts_per_chunk": 1, "prefetch": 1}
    loader = tabloader.Loader(paths, **options)
    iterator = iter(loader)
    next(iterator)
    os.remove(paths[1])
    with pytest.raises(tabloader.ReadError):
        list(iterator)
    served = iterator.cursor.batches
    assert served < 8 and list(iterator) == [] and not iterator.finished
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches"]) == (0, served)

    whole = write_dataset(tmp_path / "e", [[100, 100]])
    loader = tabloader.Loader(whole, **options)
    iterator = iter(loader)
    next(iterator)
    iterator.close()
    assert list(iterator) == [] and not iterator.finished
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches"]) == (0, 1)


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
        ({"drop_last": True}, "drop_last (saved: False; now: True)"),
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
    with pytest.raises(tabloader.InvalidArgumentError, match=r"reads format 4 \(and 3\)"):
        loader.load_state_dict({**state, "format": 99})
    with pytest.raises(tabloader.InvalidArgumentError, match="an epoch has 11 here"):
        loader.load_state_dict({**state, "batches": 12, "worker_batches": [12]})
    with pytest.raises(tabloader.InvalidArgumentError, match="an epoch has 11 here"):
        loader.load_state_dict(format_3({**state, "batches": 12, "worker_batches": [12]}))


def test_a_state_of_the_previous_format_resumes_its_own_rank_exactly(paths):
    """A state tabloader 0.1 saved (format 3: one rank's) resumes that rank bit-identically,
    and is refused on another rank or number of ranks, naming what differs."""
    options = {"shuffle": True, "global_rank": 1, "global_size": 2}
    whole = [_copy(b) for b in _loader(paths, **options)]
    first = _loader(paths, **options)
    iterator = iter(first)
    head = [_copy(next(iterator)) for _ in range(3)]
    old = format_3(first.state_dict(), global_rank=1)
    iterator.close()
    resumed = _loader(paths, **options)
    resumed.load_state_dict(old)
    assert _same(head + [_copy(b) for b in resumed], whole)
    for other, message in (
        ({"global_rank": 0}, r"global_rank \(saved: 1; now: 0\)"),
        ({"global_rank": 1, "global_size": 3}, r"global_size \(saved: 2; now: 3\)"),
    ):
        with pytest.raises(tabloader.InvalidArgumentError, match=message):
            _loader(paths, **{**options, **other}).load_state_dict(old)


# -- another number of ranks: the rows no old rank delivered, each once ---------------------


def _rows_of(batches: list[dict[str, Any]]) -> np.ndarray:
    return np.concatenate([b["id"] for b in batches] or [np.arange(0, dtype=np.int64)])


def _elastic_run(
    make: Any, old_size: int, new_size: int, stop: int
) -> tuple[list[list[dict[str, Any]]], list[list[dict[str, Any]]], dict[str, Any], list[Any]]:
    """Epoch 0 on ``old_size`` ranks, each pre-empted after ``stop`` batches, rank 0's state
    kept (checked against every rank's); the rest on ``new_size`` ranks loaded from it.
    ``make(rank, size)`` builds a rank's loader. Returns each old rank's batches, each new
    rank's, the state and the new ranks' loaders."""
    old = [make(rank, old_size) for rank in range(old_size)]
    before, states = [], []
    for loader in old:
        iterator = iter(loader)
        before.append([_copy(next(iterator)) for _ in range(stop)])
        states.append(json.loads(json.dumps(loader.state_dict())))
        iterator.close()
    state = tabloader.agreed_state(states)
    new = [make(rank, new_size) for rank in range(new_size)]
    after = []
    for loader in new:
        loader.load_state_dict(state)
        after.append([_copy(b) for b in loader])
    return before, after, state, new


ELASTIC = st.fixed_dictionaries(
    {
        "batch_size": st.integers(7, 70),
        "shuffle": st.sampled_from([False, True, "global"]),
        "shuffle_within_batch": st.booleans(),
        "drop_last": st.booleans(),
        "chunking": st.sampled_from(
            [{"parts_per_chunk": 1}, {"parts_per_chunk": 3}, {"chunk_rows": 100}, {}]
        ),
        "sizes": st.tuples(st.integers(1, 5), st.integers(1, 5)),
    }
)


@given(drawn=ELASTIC, fraction=st.floats(0, 1))
@FAST
def test_an_epoch_resumed_on_another_number_of_ranks_delivers_every_row_left_once(
    paths, drawn, fraction
):
    """4 ranks pre-empted mid-epoch go on on 2, 2 on 3, 3 on 1, ...: the rows delivered
    before and after are the epoch's rows, each once (at most ``new_size - 1`` of those
    left sitting out, besides drop_last's short batches); every new rank gets the same
    number of batches; the next epoch is the new world's own."""
    old_size, new_size = drawn["sizes"]
    shuffle = drawn["shuffle"]
    options = {
        "batch_size": drawn["batch_size"],
        "shuffle": shuffle,
        "shuffle_within_batch": drawn["shuffle_within_batch"],
        "drop_last": drawn["drop_last"],
        "cache": "memory" if shuffle == "global" else None,
        **drawn["chunking"],
    }

    def make(rank: int, size: int) -> tabloader.Loader:
        return _loader(paths, **options, global_rank=rank, global_size=size)

    epoch = [[_copy(b) for b in make(r, old_size)] for r in range(old_size)]
    epoch_rows = np.concatenate([_rows_of(batches) for batches in epoch])
    stop = round(fraction * len(epoch[0]))
    before, after, state, new = _elastic_run(make, old_size, new_size, stop)
    if stop and stop == len(epoch[0]):  # every batch taken: the new job's next epoch
        assert (state["epoch"], state["batches"]) == (1, 0)
        fresh = [make(r, new_size) for r in range(new_size)]
        for loader in fresh:
            loader.set_epoch(1)
        assert all(_same(a, [_copy(b) for b in f]) for a, f in zip(after, fresh, strict=True))
        return
    assert (state["global_size"], state["batches"]) == (old_size, stop)
    for rank, batches in enumerate(before):  # the old run, as it would have been
        assert _same(batches, epoch[rank][:stop])
    assert len({len(batches) for batches in after}) == 1  # every new rank in step
    delivered = np.concatenate([_rows_of(b) for b in before + after])
    assert len(np.unique(delivered)) == len(delivered)  # none twice
    if stop == 0:  # nothing of the epoch delivered: it starts afresh on the new ranks
        fresh = [[_copy(b) for b in make(r, new_size)] for r in range(new_size)]
        assert all(_same(a, b) for a, b in zip(after, fresh, strict=True))
    else:  # the epoch's rows (those its first ranks were dealt), each once
        assert set(delivered.tolist()) <= set(epoch_rows.tolist())
    left = len(epoch_rows) - sum(len(_rows_of(b)) for b in before)
    sitting_out = len(epoch_rows) - len(delivered)
    if stop and not drawn["drop_last"]:
        assert sitting_out == (left % new_size if new_size != old_size else 0)
    elif stop:
        assert sitting_out < new_size * drawn["batch_size"]
    for batches in after:  # dtypes, and full batches but the last
        assert all(len(b["id"]) == drawn["batch_size"] for b in batches[:-1])
        assert all(b["id"].dtype == np.int64 and b["x"].dtype == np.float32 for b in batches)
    # Later epochs: those of a fresh job on the new ranks.
    fresh = [make(r, new_size) for r in range(new_size)]
    for loader in fresh:
        loader.set_epoch(1)
    for loader, reference in zip(new, fresh, strict=True):
        assert _same([_copy(b) for b in loader], [_copy(b) for b in reference])


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("sizes", "shuffle", "cache", "within"),
    [
        ((4, 2), True, None, True),
        ((2, 3), True, None, False),
        ((3, 1), "global", "memory", True),
        ((2, 3), True, "disk", True),
        ((2, 3), False, None, True),
    ],
)
def test_the_gpu_backend_resumes_on_another_number_of_ranks_as_the_cpu_does(
    paths, tmp_path, sizes, shuffle, cache, within
):
    """The same batches on both backends, before the change of ranks and after, each row
    once; a cached epoch dealt anew is streamed (it holds other ranks' rows)."""
    options = {"shuffle": shuffle, "cache": cache, "shuffle_within_batch": within}
    options.update(batch_size=24, chunk_rows=90)
    runs = {}
    for device in ("cpu", "cuda"):

        def make(rank: int, size: int, device: str = device) -> tabloader.Loader:
            return _loader(
                paths, **options, global_rank=rank, global_size=size, device=device,
                cache_dir=tmp_path / device,
            )  # fmt: skip

        if cache == "disk":  # the old ranks' epoch is served from their complete caches
            for loader in [make(r, sizes[0]) for r in range(sizes[0])]:
                list(loader)
        runs[device] = _elastic_run(make, *sizes, stop=3)
    (cpu_before, cpu_after, _, _), (gpu_before, gpu_after, state, new) = runs["cpu"], runs["cuda"]
    assert state["epoch"] == 0 and state["batches"] == 3
    for cpu, gpu in zip(cpu_before + cpu_after, gpu_before + gpu_after, strict=True):
        assert _same(cpu, gpu)
    delivered = np.concatenate([_rows_of(b) for b in gpu_before + gpu_after])
    assert len(np.unique(delivered)) == len(delivered)
    assert len({len(b) for b in gpu_after}) == 1
    assert all(not loader.stats().from_cache for loader in new)


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
def test_agreed_state_refuses_a_plain_dataloader_whose_workers_it_cannot_count(paths):
    torch = pytest.importorskip("torch")
    from tabloader.torch import DLDataLoader, TorchAsyncItr, agreed_state

    itr = TorchAsyncItr(tabloader.Dataset(paths), cats=["id"], batch_size=64)
    plain = torch.utils.data.DataLoader(itr, batch_size=None, num_workers=2)
    with pytest.raises(tabloader.InvalidArgumentError, match="DLDataLoader, or torchdata"):
        agreed_state(plain)
    # in this process (no workers) its copy is the one iterated: counted exactly
    inline = torch.utils.data.DataLoader(itr, batch_size=None)
    batches = iter(inline)
    next(batches)
    assert agreed_state(inline)["batches"] == 1
    assert agreed_state(DLDataLoader(itr, batch_size=None, num_workers=2))["batches"] == 1


@pytest.mark.torch
@pytest.mark.parametrize("new_size", [2, 3])
def test_len_of_a_resumed_epoch_is_the_batches_still_to_come(paths, new_size):
    pytest.importorskip("torch")
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    def build(rank: int, size: int) -> TorchAsyncItr:
        return TorchAsyncItr(
            tabloader.Dataset(paths), cats=["id"], batch_size=16, shuffle=True, seed=1,
            global_rank=rank, global_size=size,
        )  # fmt: skip

    old = [build(r, 2) for r in range(2)]
    for itr in old:
        epoch = iter(DLDataLoader(itr, batch_size=None))
        for _ in range(3):
            next(epoch)
    state = tabloader.agreed_state([itr.state_dict() for itr in old])
    resumed = build(0, new_size)
    resumed.load_state_dict(state)
    loader = DLDataLoader(resumed, batch_size=None)
    promised = len(loader)
    assert promised == sum(1 for _ in loader) and promised < len(build(0, new_size))
    assert len(loader) == len(build(0, new_size))  # the next epoch is whole


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


def _torch_ids(batches: Any) -> list[np.ndarray]:
    return [x_cat[:, 0].numpy().copy() for x_cat, _, _ in batches]


@pytest.mark.torch
@pytest.mark.parametrize(("saved", "resumed"), [(2, 0), (0, 2), (2, 3)])
def test_dlloader_worker_processes_state_resumes_on_another_number_of_workers(
    paths, saved, resumed
):
    """With worker processes, the dataset in the training process counts the batches
    DLDataLoader handed out, so its mid-epoch state says how far every worker got: the
    rest of the epoch, on any number of workers, is every row not delivered, once."""
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    options = {**COLS, "batch_size": 16, "shuffle": True, "seed": 3, "device": "cpu"}
    whole = sorted(np.concatenate(_torch_ids(TorchAsyncItr(paths, **options))).tolist())
    itr = TorchAsyncItr(paths, **options)
    loader = DLDataLoader(itr, collate_fn=_identity, num_workers=saved)
    head = []
    for batch in loader:
        head += _torch_ids([batch])
        if len(head) == 7:
            break
    state = torch_roundtrip(itr.state_dict())
    assert (state["epoch"], state["batches"], state["num_workers"]) == (0, 7, max(saved, 1))
    again = TorchAsyncItr(paths, **options)
    again.load_state_dict(state)
    loader = DLDataLoader(again, collate_fn=_identity, num_workers=resumed)
    rest = _torch_ids(loader)
    assert sorted(np.concatenate(head + rest).tolist()) == whole  # every row once
    assert len(head) + len(rest) == len(itr)
    assert again.state_dict()["epoch"] == 1 and again.state_dict()["batches"] == 0


@pytest.mark.torch
@pytest.mark.parametrize("resumed", [0, 1])
def test_a_stateful_dataloaders_worker_states_merge_into_the_jobs(paths, resumed):
    """torchdata's StatefulDataLoader keeps a state per worker process:
    tabloader.torch.agreed_state merges them, and the job goes on with other workers."""
    pytest.importorskip("torchdata")
    from torchdata.stateful_dataloader import StatefulDataLoader

    import tabloader.torch
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    options = {**COLS, "batch_size": 16, "shuffle": True, "seed": 3, "device": "cpu"}
    whole = sorted(np.concatenate(_torch_ids(TorchAsyncItr(paths, **options))).tolist())
    itr = TorchAsyncItr(paths, **options)
    loader = StatefulDataLoader(itr, batch_size=None, num_workers=2, collate_fn=_identity)
    itr.set_epoch(0)
    head = []
    for batch in loader:
        head += _torch_ids([batch])
        if len(head) == 5:
            break
    state = torch_roundtrip(tabloader.torch.agreed_state(loader))
    assert (state["batches"], state["worker_batches"], state["num_workers"]) == (5, [3, 2], 2)
    again = TorchAsyncItr(paths, **options)
    again.load_state_dict(state)
    rest = _torch_ids(DLDataLoader(again, collate_fn=_identity, num_workers=resumed))
    assert sorted(np.concatenate(head + rest).tolist()) == whole
    # a snapshot behind the batches delivered is refused, not taken for the position
    lagging = StatefulDataLoader(
        TorchAsyncItr(paths, **options), batch_size=None, num_workers=2,
        collate_fn=_identity, snapshot_every_n_steps=4,
    )  # fmt: skip
    lagging.dataset.set_epoch(0)
    for _, _ in zip(range(5), lagging, strict=False):
        pass
    with pytest.raises(tabloader.InvalidArgumentError, match="snapshot_every_n_steps=1"):
        tabloader.torch.agreed_state(lagging)


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
@pytest.mark.parametrize(("old_size", "new_size"), [(4, 2), (2, 3), (3, 1)])
def test_keras_loaders_resume_on_another_number_of_ranks(paths, old_size, new_size):
    """Keras serves the rest of the epoch by index on the new ranks: ``len()`` is the
    batches still to come, the same on every rank, and every row comes once."""
    pytest.importorskip("tensorflow")
    old = [
        _keras(paths, shuffle=True, global_rank=r, global_size=old_size) for r in range(old_size)
    ]
    before = [_keras_batch(loader[i])[1] for loader in old for i in range(2)]  # ids, mid-epoch
    state = tabloader.agreed_state([loader.state_dict() for loader in old])
    for loader in old:
        loader.close()
    after, lengths = [], []
    for rank in range(new_size):
        resumed = _keras(paths, shuffle=True, global_rank=rank, global_size=new_size)
        resumed.load_state_dict(state)
        lengths.append(len(resumed))
        after += [_keras_batch(resumed[i])[1] for i in range(len(resumed))]
        resumed.on_epoch_end()  # the next epoch is whole, on the new ranks
        assert len(resumed) == len(_keras(paths, global_rank=rank, global_size=new_size))
    ids = np.concatenate(before + after)
    assert len(np.unique(ids)) == len(ids)  # every row at most once
    assert TOTAL - len(ids) < old_size + new_size - 1  # all but those sitting out
    assert len(set(lengths)) == 1


@pytest.mark.tensorflow
def test_keras_refuses_a_state_of_another_setup(paths):
    pytest.importorskip("tensorflow")
    state = _keras(paths).state_dict()
    with pytest.raises(tabloader.InvalidArgumentError, match=r"seed \(saved: 5; now: 9\)"):
        _keras(paths, seed=9).load_state_dict(state)


def test_keras_with_seed_fn_resumes_on_the_saved_seed(paths):
    """``seed_fn`` draws a seed once, another in a restarted run: the restarted loader
    takes the saved one, as PyTorch's and JAX's do, rather than refusing every resume."""
    pytest.importorskip("tensorflow")
    draws = iter([11, 12])
    first = _keras(paths, seed=None, seed_fn=lambda: next(draws))
    reference = [_keras_batch(b) for b in _keras(paths, seed=11)]
    before = [_keras_batch(first[i]) for i in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = _keras(paths, seed=None, seed_fn=lambda: next(draws))  # draws 12
    resumed.load_state_dict(state)
    assert _same_tensors(before + [_keras_batch(b) for b in resumed], reference)


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


def test_a_growing_dataset_resumes_on_the_listing_checked_when_the_state_was_loaded(tmp_path):
    """refresh=True: a file that joins after load_state_dict() waits for the next epoch
    (it changed the rest of the resumed epoch: rows twice, rows never); one that joined
    before is refused mid-epoch, and at an epoch's start the epoch lists it."""
    import pyarrow.parquet as pq

    from conftest import make_table

    directory = tmp_path / "data"
    write_dataset(directory, [[10, 10], [10, 10]])

    def add(name: str, start: int) -> None:
        pq.write_table(make_table(start, 20), directory / name, row_group_size=10)

    def make() -> tabloader.Loader:
        dataset = tabloader.Dataset(str(directory), refresh=True)
        return tabloader.Loader(dataset, cats=["id"], batch_size=8, shuffle=True, seed=3)

    saver = make()
    epoch = iter(saver)
    head = [next(epoch)["id"].tolist() for _ in range(2)]
    state = saver.state_dict()
    rest = [b["id"].tolist() for b in epoch]
    resumed = make()
    resumed.load_state_dict(state)
    add("part-100.parquet", 1000)  # joins after the state was loaded
    assert [b["id"].tolist() for b in resumed] == rest
    assert sorted(i for b in head + rest for i in b) == list(range(40))
    assert any(i >= 1000 for b in resumed for i in b["id"].tolist())  # the next epoch's
    late = make()
    add("part-101.parquet", 2000)  # joins before the state is loaded
    with pytest.raises(
        tabloader.InvalidArgumentError, match="differs from this loader in the dataset"
    ):
        late.load_state_dict(state)
    boundary = make()
    list(boundary)
    at_start = boundary.state_dict()  # epoch 1, nothing of it delivered
    add("part-102.parquet", 3000)
    again = make()
    again.load_state_dict(at_start)
    assert [b["id"].tolist() for b in again] == [b["id"].tolist() for b in boundary]


def test_a_state_saved_after_listing_the_next_epoch_is_of_the_epoch_in_progress(tmp_path):
    """``refresh(next_epoch)`` mid-epoch (to know the next epoch's ``len()``) lists a file
    that joined: a state saved after it still describes the files the epoch in progress
    reads. A restart that lists the new file too refuses it (it took the state for the new
    listing's, and delivered rows twice and rows of the next epoch); one that lists the
    epoch's files resumes it exactly."""
    import os

    import pyarrow.parquet as pq

    from conftest import make_table

    directory = tmp_path / "data"
    write_dataset(directory, [[10, 10], [10, 10]])

    def make() -> tabloader.Loader:
        dataset = tabloader.Dataset(str(directory), refresh=True)
        return tabloader.Loader(dataset, cats=["id"], batch_size=8, shuffle=True, seed=3)

    reference = [b["id"].tolist() for b in make()]
    saver = make()
    epoch = iter(saver)
    head = [next(epoch)["id"].tolist() for _ in range(2)]
    joined = directory / "part-100.parquet"
    pq.write_table(make_table(1000, 20), joined, row_group_size=10)
    saver.refresh(1)
    assert len(saver) == 8  # the next epoch's 60 rows
    state = saver.state_dict()
    assert (state["epoch"], state["batches"], state["dataset"]["files"]) == (0, 2, 2)
    assert head + [b["id"].tolist() for b in epoch] == reference
    with pytest.raises(
        tabloader.InvalidArgumentError, match="differs from this loader in the dataset"
    ):
        make().load_state_dict(state)
    os.remove(joined)
    resumed = make()
    resumed.load_state_dict(state)
    assert [b["id"].tolist() for b in resumed] == reference[2:]


@given(
    sizes=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    fraction=st.floats(0, 1),
    drop_last=st.booleans(),
    cache=st.sampled_from([None, "memory"]),
)
@FAST
def test_an_unshuffled_state_resumes_whatever_the_seed(paths, sizes, fraction, drop_last, cache):
    """Without shuffling the seed decides nothing: a state resumes under another seed,
    on as many ranks or another number, with the batches the saved seed gives."""

    def make(seed: int) -> Any:
        def build(rank: int, size: int) -> tabloader.Loader:
            return _loader(
                paths, shuffle=False, seed=seed, drop_last=drop_last, cache=cache,
                global_rank=rank, global_size=size,
            )  # fmt: skip

        return build

    stop = round(fraction * len(make(5)(0, sizes[0])))  # batches the old ranks delivered
    _, same, state, _ = _elastic_run(make(5), *sizes, stop)
    for rank in range(sizes[1]):
        other = make(6)(rank, sizes[1])
        other.load_state_dict(state)
        assert _same([_copy(b) for b in other], same[rank])


def test_a_global_shuffle_state_saved_without_its_cache_says_how_to_go_on(paths):
    """A run given shuffle="global" whose cache could not be used shuffled chunks and
    saved shuffle=True: a loader whose cache is used says so, and shuffle=True goes on
    with exactly that epoch."""
    options = {"batch_size": 16, "seed": 1, "parts_per_chunk": 2, "cache": "memory"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tabloader.CacheWarning)  # (said, and tested, elsewhere)
        whole = [_copy(b) for b in _loader(paths, shuffle="global", cache_max_bytes=1, **options)]
        saver = _loader(paths, shuffle="global", cache_max_bytes=1, **options)
        epoch = iter(saver)
        head = [_copy(next(epoch)) for _ in range(3)]
    state = saver.state_dict()
    with pytest.raises(tabloader.InvalidArgumentError, match="pass shuffle=True"):
        _loader(paths, shuffle="global", **options).load_state_dict(state)
    going_on = _loader(paths, shuffle=True, **options)
    going_on.load_state_dict(state)
    assert _same(head + [_copy(b) for b in going_on], whole)
