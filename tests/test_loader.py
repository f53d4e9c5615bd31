"""The core Loader: batches, shuffling, options, errors, background threads, memory."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader
from conftest import make_table, write_dataset

COLS = {"cats": ["id", "cat"], "conts": ["x"], "labels": ["label"]}


def ids(batches) -> np.ndarray:
    return np.concatenate([b["id"] for b in batches])


_EARLIER: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def _ignore_threads_of_earlier_tests():
    """Loaders other tests still hold (in reference cycles) are not this test's business."""
    gc.collect()
    _EARLIER.clear()
    _EARLIER.update(threading.enumerate())


def tabloader_threads() -> list[threading.Thread]:
    return [
        t for t in threading.enumerate() if t.name.startswith("tabloader") and t not in _EARLIER
    ]


def wait_for_no_threads(timeout: float = 5.0) -> list[threading.Thread]:
    deadline = time.monotonic() + timeout
    while tabloader_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return tabloader_threads()


# -- batches ------------------------------------------------------------------------


def test_len_is_exact_before_iterating_and_batches_are_full(dataset_dir):
    loader = tabloader.Loader(dataset_dir([[100, 50], [77]]), **COLS, batch_size=40)
    assert len(loader) == 6  # 227 rows
    batches = list(loader)
    assert [len(b["id"]) for b in batches] == [40, 40, 40, 40, 40, 27]
    assert ids(batches).tolist() == list(range(227))


def test_delivered_dtypes_are_configurable(dataset_dir):
    loader = tabloader.Loader(
        dataset_dir([[10]]),
        **COLS,
        batch_size=4,
        cat_dtype="int32",
        cont_dtype=np.float64,
        label_dtype="int8",
    )
    batch = next(iter(loader))
    assert batch["id"].dtype == np.int32 and batch["x"].dtype == np.float64
    assert batch["label"].dtype == np.int8


@pytest.mark.parametrize(
    "shuffle", [True, False, {"shuffle": True, "shuffle_within_batch": False}], ids=str
)
def test_stacked_layout_delivers_one_block_per_kind(dataset_dir, shuffle):
    options = shuffle if isinstance(shuffle, dict) else {"shuffle": shuffle}
    loader = tabloader.Loader(
        dataset_dir([[30, 20]]), **COLS, batch_size=16, layout="stacked", seed=0, **options
    )
    batches = list(loader)
    first = batches[0]
    assert set(first) == {"cats", "conts", "labels"}
    assert all(a.flags.c_contiguous for b in batches for a in b.values())
    assert first["cats"].shape == (16, 2) and first["cats"].dtype == np.int64
    assert first["conts"].shape == (16, 1) and first["conts"].dtype == np.float32
    assert first["labels"].shape == (16, 1)
    all_cats = np.concatenate([b["cats"] for b in batches])
    assert sorted(all_cats[:, 0].tolist()) == list(range(50))
    np.testing.assert_array_equal(all_cats[:, 1], all_cats[:, 0] % 1000)
    assert batches[-1]["cats"].shape == (2, 2)


def test_stacked_layout_leaves_out_kinds_without_columns(dataset_dir):
    loader = tabloader.Loader(dataset_dir([[8]]), conts=["x"], batch_size=4, layout="stacked")
    assert set(next(iter(loader))) == {"conts"}


def test_shuffled_batches_mix_partitions_and_change_every_epoch(dataset_dir):
    paths = dataset_dir([[100] * 4, [100] * 4])
    loader = tabloader.Loader(
        paths, **COLS, batch_size=50, shuffle=True, seed=11, parts_per_chunk=4
    )
    epochs = [list(loader) for _ in range(3)]
    for batches in epochs:
        assert sorted(ids(batches).tolist()) == list(range(800))
        # Rows of one batch come from several row groups (of 100 rows each)...
        assert all(len(np.unique(b["id"] // 100)) >= 3 for b in batches)
    # ...and the batches differ from epoch to epoch, beyond their order.
    first = [frozenset(b["id"].tolist()) for b in epochs[0]]
    second = [frozenset(b["id"].tolist()) for b in epochs[1]]
    assert not set(first) & set(second)
    # Row groups are visited in a different order each epoch.
    assert epochs[0][0]["id"][0] // 100 != epochs[1][0]["id"][0] // 100 or (
        epochs[1][0]["id"][0] // 100 != epochs[2][0]["id"][0] // 100
    )


@pytest.mark.parametrize("layout", ["columns", "stacked"])
def test_stored_order_within_batches_keeps_the_shuffled_batch_composition(dataset_dir, layout):
    paths = dataset_dir([[100] * 4, [100] * 4])
    options = dict(batch_size=48, shuffle=True, seed=5, chunk_rows=400, layout=layout)
    full = tabloader.Loader(paths, **COLS, **options)
    stored = tabloader.Loader(paths, **COLS, **options, shuffle_within_batch=False)
    assert len(stored) == len(full) == 17

    def id_batches(loader):
        key = "id" if layout == "columns" else "cats"
        return [b[key] if layout == "columns" else b[key][:, 0] for b in loader]

    for _ in range(2):  # two epochs
        a, b = id_batches(full), id_batches(stored)
        assert [len(x) for x in a] == [len(x) for x in b]
        assert sorted(np.concatenate(b).tolist()) == list(range(800))
        # The same rows share each batch; only their order inside it differs.
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(np.sort(x), np.sort(y))
        assert sum(not np.array_equal(x, y) for x, y in zip(a, b, strict=True)) >= 15
        # Batches inside one chunk (400 rows) keep the rows' stored order; 48 does not
        # divide 400, so two of every chunk's batches straddle chunks.
        inside = [y for y in b if np.all(np.diff(y) > 0)]
        assert len(inside) >= 13
        assert all(np.array_equal(y, np.sort(y)) for y in inside)


def test_full_shuffle_also_shuffles_within_a_batch(dataset_dir):
    paths = dataset_dir([[300]])
    loader = tabloader.Loader(paths, **COLS, batch_size=300, shuffle=True, seed=1)
    (batch,) = list(loader)
    assert sorted(batch["id"].tolist()) == list(range(300))
    assert not np.all(np.diff(batch["id"]) > 0)
    (again,) = list(tabloader.Loader(paths, **COLS, batch_size=300, shuffle=True, seed=1))
    np.testing.assert_array_equal(batch["id"], again["id"])
    np.testing.assert_array_equal(batch["cat"], batch["id"] % 1000)  # rows stay whole


def test_set_epoch_replays_an_epoch(dataset_dir):
    loader = tabloader.Loader(dataset_dir([[60, 60]]), **COLS, batch_size=16, shuffle=True)
    first, second = ids(loader), ids(loader)
    assert loader.epoch == 2
    loader.set_epoch(1)
    np.testing.assert_array_equal(ids(loader), second)
    loader.set_epoch(0)
    np.testing.assert_array_equal(ids(loader), first)
    np.testing.assert_array_equal(ids(loader.iter_epoch(0)), first)


def test_no_seed_means_fresh_randomness(dataset_dir):
    paths = dataset_dir([[200]])
    a = tabloader.Loader(paths, **COLS, batch_size=200, shuffle=True)
    b = tabloader.Loader(paths, **COLS, batch_size=200, shuffle=True)
    assert a.seed != b.seed
    assert not np.array_equal(ids(a), ids(b))


def test_worker_shares_of_an_epoch_cover_it_once(dataset_dir):
    loader = tabloader.Loader(dataset_dir([[70, 31], [99]]), **COLS, batch_size=16, shuffle=True)
    shares = [ids(loader.iter_epoch(3, worker=w, num_workers=3)) for w in range(3)]
    assert [len(s) // 16 + (len(s) % 16 > 0) for s in shares] == [
        loader.num_batches(worker=w, num_workers=3) for w in range(3)
    ]
    assert sorted(np.concatenate(shares).tolist()) == list(range(200))
    assert sum(loader.num_batches(worker=w, num_workers=3) for w in range(3)) == len(loader)


def test_transform_runs_in_the_background_and_its_result_is_yielded(dataset_dir):
    threads = []

    def transform(batch):
        threads.append(threading.current_thread().name)
        return batch["id"].sum()

    loader = tabloader.Loader(dataset_dir([[10]]), cats=["id"], batch_size=5, transform=transform)
    assert list(loader) == [10, 35]
    assert threads == ["tabloader-batcher"] * 2


def test_in_memory_sources_load_like_files():
    frame = make_table(0, 25).to_pandas()
    loader = tabloader.Loader(frame, **COLS, batch_size=10, shuffle=True, seed=0)
    assert sorted(ids(loader).tolist()) == list(range(25))


def test_stats_count_rows_batches_and_time(dataset_dir):
    loader = tabloader.Loader(dataset_dir([[30, 30]]), **COLS, batch_size=25, shuffle=True)
    list(loader)
    list(loader)
    stats = loader.stats()
    assert (stats.rows, stats.batches, stats.chunks) == (120, 6, 2)
    assert stats.bytes_read > 0 and stats.read_seconds > 0
    assert 0 <= stats.input_bound_fraction <= 1
    assert "120 rows in 6 batches" in str(stats)


# -- nulls ----------------------------------------------------------------------------


def _with_nulls(tmp_path, *, statistics: bool) -> str:
    path = tmp_path / "nulls.parquet"
    table = make_table(0, 8).set_column(
        2, "x", pa.array([0.0, 0.25, None, 0.75, 1.0, None, 1.5, 1.75], pa.float64())
    )
    pq.write_table(table, path, row_group_size=4, write_statistics=statistics)
    return str(path)


def test_nulls_are_reported_at_construction_from_the_footer(tmp_path):
    path = _with_nulls(tmp_path, statistics=True)
    with pytest.raises(tabloader.NullValuesError) as info:
        tabloader.Loader(path, **COLS, batch_size=4)
    message = str(info.value)
    assert "'x'" in message and "nulls.parquet (row group 0)" in message
    assert "and 1 more partition" in message and "fill_null={'x': 0}" in message


def test_nulls_without_statistics_are_reported_while_reading(tmp_path):
    path = _with_nulls(tmp_path, statistics=False)
    loader = tabloader.Loader(path, **COLS, batch_size=4)
    with pytest.raises(tabloader.NullValuesError, match=r"'x' has 1 null value\(s\) in .*nulls"):
        list(loader)
    assert wait_for_no_threads() == []


def test_fill_null_replaces_nulls(tmp_path):
    path = _with_nulls(tmp_path, statistics=True)
    loader = tabloader.Loader(path, **COLS, batch_size=8, fill_null={"x": -1})
    (batch,) = list(loader)
    assert batch["x"].tolist() == [0.0, 0.25, -1, 0.75, 1.0, -1, 1.5, 1.75]
    loader = tabloader.Loader(path, conts=["x"], batch_size=8, fill_null=0)
    assert next(iter(loader))["x"][2] == 0


# -- argument and data errors ---------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
        ({"batch_size": 2.5}, "batch_size must be a positive integer, got 2.5"),
        ({"batch_size": True}, "batch_size must be a positive integer, got True"),
        ({"cats": [], "conts": None, "labels": ()}, "no columns selected"),
        ({"cats": ["id", "x"]}, r"\['x'\] are listed more than once"),
        ({"cats": [1]}, "cats must be column names"),
        ({"parts_per_chunk": 2, "chunk_rows": 10}, "parts_per_chunk or chunk_rows, not both"),
        ({"parts_per_chunk": 0}, "parts_per_chunk must be a positive integer"),
        ({"global_size": 2, "global_rank": 2}, r"global_rank must be in \[0, 2\)"),
        ({"global_rank": -1}, "global_rank must be a non-negative integer"),
        ({"global_size": 0}, "global_size must be a positive integer"),
        ({"shuffle": True, "global_size": 2}, "pass the same seed= on every rank"),
        ({"seed": -3}, "seed must be a non-negative integer"),
        ({"layout": "rows"}, "layout must be 'columns' or 'stacked'"),
        ({"cat_dtype": "float32"}, "cat_dtype must be an integer dtype"),
        ({"cont_dtype": "U3"}, "cont_dtype must be a numeric dtype"),
        ({"cont_dtype": "no-such-type"}, "cont_dtype must be a numpy dtype"),
        ({"fill_null": {"nope": 0}}, r"fill_null names \['nope'\]"),
        ({"fill_null": {"id": 0.5}}, "must be a whole number"),
        ({"fill_null": "zero"}, "must be a number"),
        ({"prefetch": 0}, "prefetch must be a positive integer"),
        ({"device": "tpu"}, "device must be 'cpu', 'cuda', 'cuda:N' or an int"),
        ({"transform": 3}, "transform must be callable"),
    ],
)
def test_bad_arguments_are_rejected_with_the_value_and_the_fix(dataset_dir, options, match):
    arguments = {**COLS, "batch_size": 4, **options}
    with pytest.raises(tabloader.InvalidArgumentError, match=match):
        tabloader.Loader(dataset_dir([[10]]), **arguments)


def test_a_missing_column_fails_at_construction(dataset_dir):
    with pytest.raises(tabloader.ColumnNotFoundError, match=r"'C1' is not in .*part-000"):
        tabloader.Loader(dataset_dir([[10]]), cats=["C1"], batch_size=4)


def test_non_numeric_columns_fail_at_construction_with_the_fix(tmp_path):
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"name": ["a", "b"], "f": [0.5, 1.5], "n": [1, 2]}), path)
    with pytest.raises(tabloader.ColumnTypeError, match=r"'name' is string.*must be numeric"):
        tabloader.Loader(str(path), conts=["name"], batch_size=1)
    with pytest.raises(tabloader.ColumnTypeError, match=r"categorical column 'f' is double.*ids"):
        tabloader.Loader(str(path), cats=["f"], batch_size=1)
    with pytest.raises(tabloader.ColumnTypeError, match="label 'name'"):
        tabloader.Loader(str(path), labels=["name"], batch_size=1)
    assert isinstance(tabloader.ColumnTypeError("x"), TypeError)


def test_a_dataset_without_rows_is_an_error(dataset_dir):
    with pytest.raises(tabloader.EmptyDatasetError, match="no rows"):
        tabloader.Loader(pa.table({"a": pa.array([], pa.int64())}), cats=["a"], batch_size=1)


def test_slow_layouts_warn(dataset_dir):
    with pytest.warns(tabloader.PerformanceWarning, match="3 ranks share 2 partitions"):
        tabloader.Loader(
            dataset_dir([[10, 10]]), **COLS, batch_size=2, global_size=3, global_rank=0
        )
    with pytest.warns(tabloader.PerformanceWarning, match="row groups hold 10 rows"):
        tabloader.Loader(dataset_dir([[10] * 20]), **COLS, batch_size=2)


def test_a_corrupt_row_group_fails_in_the_consumer_naming_the_file(tmp_path):
    (path,) = write_dataset(tmp_path, [[1000, 1000]])
    with open(path, "r+b") as handle:
        handle.seek(8)  # the first pages' headers; the footer stays intact
        handle.write(b"\xff" * 192)
    loader = tabloader.Loader(path, **COLS, batch_size=100)  # the footer reads fine
    with pytest.raises(tabloader.ReadError, match=r"could not read .*part-000.parquet"):
        list(loader)
    assert wait_for_no_threads() == []


def test_an_error_in_transform_reaches_the_consumer(dataset_dir):
    def transform(batch):
        raise RuntimeError("boom in transform")

    loader = tabloader.Loader(dataset_dir([[10]]), cats=["id"], batch_size=5, transform=transform)
    with pytest.raises(RuntimeError, match="boom in transform"):
        next(iter(loader))
    assert wait_for_no_threads() == []


# -- threads and memory ---------------------------------------------------------------


def test_breaking_out_stops_the_threads_and_the_next_epoch_is_clean(dataset_dir):
    paths = dataset_dir([[100] * 10])
    loader = tabloader.Loader(paths, **COLS, batch_size=10, shuffle=True, seed=1, prefetch=2)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert wait_for_no_threads() == []
    assert sorted(ids(loader).tolist()) == list(range(1000))
    assert wait_for_no_threads() == []


def test_dropping_an_iterator_or_the_loader_stops_the_threads(dataset_dir):
    loader = tabloader.Loader(dataset_dir([[100] * 10]), **COLS, batch_size=10)
    iterator = iter(loader)
    next(iterator)
    assert tabloader_threads()
    del iterator
    assert wait_for_no_threads() == []
    iterator = iter(loader)
    next(iterator)
    del iterator, loader
    gc.collect()
    assert wait_for_no_threads() == []


def test_close_stops_the_threads_and_ends_the_iterator(dataset_dir):
    loader = tabloader.Loader(dataset_dir([[100] * 10]), **COLS, batch_size=10)
    with iter(loader) as iterator:
        next(iterator)
        assert len(iterator) == 99
    assert wait_for_no_threads() == []
    assert list(iterator) == []


def test_memory_stays_flat_over_many_epochs(tmp_path):
    # In a process of its own: what earlier tests left behind (threads, arenas) would
    # move this process's RSS by tens of MiB either way.
    paths = write_dataset(tmp_path, [[50_000] * 4] * 2)
    script = f"""
import gc, psutil, tabloader
loader = tabloader.Loader({[str(p) for p in paths]!r}, **{COLS!r}, batch_size=4096,
                          shuffle=True, seed=0, chunk_rows=100_000)
process = psutil.Process()
for _ in range(3):
    list(loader)
gc.collect()
before = process.memory_info().rss
for _ in range(15):
    for _ in loader:
        pass
gc.collect()
print(process.memory_info().rss - before)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    grown = int(done.stdout.split()[-1])
    assert grown < 40 * 2**20, f"RSS grew by {grown / 2**20:.0f} MiB over 15 epochs"


def test_dataset_row_groups_are_read_in_the_order_planned(tmp_path):
    # Several row groups of one file in one chunk, in shuffled order: the rows must
    # still come out intact and complete.
    (path,) = write_dataset(tmp_path, [[10] * 12])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tabloader.PerformanceWarning)
        loader = tabloader.Loader(path, **COLS, batch_size=7, shuffle=True, parts_per_chunk=5)
    batches = list(loader)
    assert sorted(ids(batches).tolist()) == list(range(120))
    for b in batches:
        np.testing.assert_array_equal(b["cat"], b["id"] % 1000)


def test_a_pandas_frame_with_an_index_loads_its_columns_only():
    frame = pd.DataFrame({"a": [1, 2, 3]}, index=[10, 20, 30])
    loader = tabloader.Loader(frame, cats=["a"], batch_size=3)
    assert next(iter(loader))["a"].tolist() == [1, 2, 3]
