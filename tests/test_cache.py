"""The decoded cache: exact rows per epoch, same batches as streaming, keys, limits, crashes."""

from __future__ import annotations

import gc
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tabloader
from conftest import make_table, write_dataset
from tabloader.batches import segment_rows
from tabloader.cache import MANIFEST, DecodedCache, cache_directory
from tabloader.cache.files import CHECKSUM
from tabloader.plan import fixed_share, plan_cached_epoch, plan_epoch, rank_rows

COLS = {"cats": ["id", "cat"], "conts": ["x"], "labels": ["label"]}
LAYOUT = [[100, 60, 37], [80], [45, 90]]  # 412 rows, 6 row groups of uneven sizes
ROWS = 412


def ids(batches) -> np.ndarray:
    return np.concatenate([np.asarray(b["id"]) for b in batches]) if batches else np.array([])


def check_rows_intact(batches) -> None:
    """Every delivered row is a real row: its columns agree with its id."""
    for b in batches:
        i = np.asarray(b["id"])
        np.testing.assert_array_equal(b["cat"], i % 1000)
        np.testing.assert_array_equal(b["x"], (i / 4.0).astype(np.float32))
        np.testing.assert_array_equal(b["label"], (i % 2).astype(np.float32))


def _mapping(array):
    """The file mapping an array is a view of, if any."""
    while isinstance(array, np.ndarray) and not isinstance(array, np.memmap):
        array = array.base
    return array


def run(loader) -> list:
    """One epoch, then wait for a disk cache written in the background to be published."""
    batches = list(loader)
    if loader.cache is not None:
        loader.cache.wait()
    return batches


def published(root: Path) -> list[Path]:
    return [p.parent for p in root.glob(f"*/{MANIFEST}") if not p.parent.name.startswith(".")]


def temporary(root: Path) -> list[Path]:
    return list(root.glob(".tmp-*"))


@pytest.fixture(params=["plenty", "scarce"])
def memory(request, monkeypatch) -> str:
    """With scarce memory, a disk cache is filled and read through file mappings."""
    if request.param == "scarce":
        import tabloader.cache.policy

        # Room for a memory cache of the test data (~10 kB), not for a disk cache's copy.
        monkeypatch.setattr(tabloader.cache.policy, "_available_memory", lambda: 30_000)
    return str(request.param)


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    return write_dataset(tmp_path / "data", LAYOUT)


# -- the plan: fixed shares ---------------------------------------------------------

partition_rows = st.lists(st.integers(1, 40), min_size=1, max_size=12).map(np.array)


@settings(max_examples=150, deadline=None)
@given(
    rows=partition_rows,
    world=st.integers(1, 5),
    batch_size=st.integers(1, 30),
    shuffle=st.sampled_from([False, True, "global"]),
    drop_last=st.booleans(),
    chunk=st.integers(1, 4),
    epoch=st.integers(0, 3),
    seed=st.integers(0, 2**31),
)
def test_cached_plans_give_each_rank_its_fixed_share_once_per_epoch(
    rows, world, batch_size, shuffle, drop_last, chunk, epoch, seed
):
    total = int(rows.sum())
    if total < world:
        return
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]])
    delivered, counts = [], []
    for rank in range(world):
        plan = plan_cached_epoch(
            rows,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            epoch=epoch,
            global_rank=rank,
            global_size=world,
            parts_per_chunk=chunk,
            drop_last=drop_last,
        )
        got = np.concatenate(
            [np.arange(0)]
            + [
                np.arange(starts[p] + a, starts[p] + b)
                for c in range(plan.num_chunks)
                for p, a, b in plan.pieces(c)
            ]
        )
        lo, hi = rank_rows(total, global_rank=rank, global_size=world)
        share = set(range(lo, hi))  # the share is the same rows in every epoch
        assert len(set(got.tolist())) == len(got)  # no row twice
        assert set(got.tolist()) <= share
        kept = batch_size * ((hi - lo) // batch_size) if drop_last else hi - lo
        assert len(got) == plan.num_rows == kept
        assert plan.num_batches == -(-kept // batch_size)
        if shuffle == "global":
            assert plan.num_chunks <= 1
        delivered.append(set(got.tolist()))
        counts.append(plan.num_batches)
    assert len(set(counts)) == 1  # equal batch counts on every rank
    assert sum(len(d) for d in delivered) == len(set().union(*delivered))  # ranks disjoint


@settings(max_examples=100, deadline=None)
@given(
    rows=partition_rows,
    batch_size=st.integers(1, 30),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    chunk_rows=st.integers(1, 100),
    epoch=st.integers(0, 3),
    workers=st.integers(1, 3),
)
def test_with_one_rank_the_cached_plan_is_the_streaming_plan(
    rows, batch_size, shuffle, drop_last, chunk_rows, epoch, workers
):
    for worker in range(workers):
        options = dict(
            batch_size=batch_size,
            shuffle=shuffle,
            seed=7,
            epoch=epoch,
            chunk_rows=chunk_rows,
            drop_last=drop_last,
            worker=worker,
            num_workers=workers,
        )
        a, b = plan_epoch(rows, **options), plan_cached_epoch(rows, **options)
        for field in ("partitions", "starts", "stops", "chunk_bounds", "origins"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
        assert (a.num_rows, a.num_batches) == (b.num_rows, b.num_batches)
        for c in range(a.num_chunks):
            order_a, order_b = a.batch_order(c), b.batch_order(c)
            assert (order_a is None) == (order_b is None)
            if order_a is not None:
                np.testing.assert_array_equal(order_a, order_b)


def test_a_fixed_share_is_the_unshuffled_shard():
    rows = np.array([5, 5, 5])
    parts, starts, stops = fixed_share(rows, global_rank=2, global_size=3)
    assert (parts.tolist(), starts.tolist(), stops.tolist()) == ([2], [0], [5])
    plan = plan_epoch(
        rows, batch_size=2, shuffle=False, seed=0, epoch=0, global_rank=2, global_size=3
    )
    assert plan.partitions.tolist() == [2]


# -- exact rows per epoch -------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True, "global"])
@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_cached_epochs_deliver_every_row_of_the_share_once(
    files, tmp_path, shuffle, world, drop_last, memory
):
    per_rank = ROWS // world
    loaders = [
        tabloader.Loader(
            files,
            **COLS,
            batch_size=16,
            shuffle=shuffle,
            seed=5,
            parts_per_chunk=2,
            drop_last=drop_last,
            global_rank=rank,
            global_size=world,
            cache="disk",
            cache_dir=tmp_path / "cache",
        )
        for rank in range(world)
    ]
    orders = []
    for epoch in range(3):
        seen = []
        for rank, loader in enumerate(loaders):
            batches = run(loader)
            assert loader.stats().from_cache == (epoch > 0)
            assert len(batches) == len(loader) == loaders[0].num_batches()
            check_rows_intact(batches)
            got = ids(batches)
            share = set(range(rank * per_rank, (rank + 1) * per_rank))
            assert len(set(got.tolist())) == len(got)
            assert set(got.tolist()) <= share
            assert len(got) == (16 * (per_rank // 16) if drop_last else per_rank)
            seen.append(set(got.tolist()))
            if rank == 0:
                orders.append(got)
        assert sum(len(s) for s in seen) == len(set().union(*seen))
    if shuffle:
        assert not np.array_equal(orders[1], orders[2])  # reshuffled every epoch
    else:
        assert np.array_equal(orders[1], orders[2])
    assert len(published(tmp_path / "cache")) == world
    assert loaders[0].stats().cache_epochs == 2


def test_global_shuffle_mixes_rows_from_the_whole_share(tmp_path):
    paths = write_dataset(tmp_path / "d", [[100] * 10])
    options = dict(cats=["id"], batch_size=50, seed=1, parts_per_chunk=1, cache="memory")
    chunked = tabloader.Loader(paths, shuffle=True, **options)
    everywhere = tabloader.Loader(paths, shuffle="global", **options)
    for epoch in range(2):
        # Rows of one chunk (one row group here) can only share a batch with a neighbour.
        assert all(len(np.unique(b["id"] // 100)) <= 2 for b in run(chunked))
        spread = [len(np.unique(b["id"] // 100)) for b in run(everywhere)]
        assert min(spread) >= 5, (epoch, spread)


def test_changing_a_batch_in_place_cannot_change_the_cache(files):
    loader = tabloader.Loader(files, **COLS, batch_size=16, cache="memory")
    for _ in range(3):
        batches = run(loader)
        check_rows_intact(batches)
        assert sorted(ids(batches).tolist()) == list(range(ROWS))
        for batch in batches:
            for array in batch.values():
                if array.flags.writeable:  # a copy (a batch straddling row groups)
                    array[:] = -1
                else:  # a view of the cache
                    with pytest.raises(ValueError, match="read-only"):
                        array[0] = -1


# -- the same batches as streaming ----------------------------------------------------


@pytest.mark.parametrize("mode", ["memory", "disk"])
@pytest.mark.parametrize(
    "options",
    [
        dict(layout="columns", chunk_rows=150),
        dict(layout="stacked", chunk_rows=150, drop_last=True),
        dict(layout="columns", parts_per_chunk=2, shuffle_within_batch=False),
        dict(layout="stacked", parts_per_chunk=1, shuffle_within_batch=False),
        dict(layout="columns", shuffle=False),
    ],
)
def test_cached_epochs_are_the_streamed_epochs(files, tmp_path, mode, options, memory):
    options = {"shuffle": True, **options}
    streamed = tabloader.Loader(files, **COLS, batch_size=24, seed=11, **options)
    cached = tabloader.Loader(
        files, **COLS, batch_size=24, seed=11, cache=mode, cache_dir=tmp_path / "c", **options
    )
    for epoch in range(3):
        a, b = run(streamed), run(cached)
        assert cached.stats().from_cache == (epoch > 0)
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert x.keys() == y.keys()
            for key in x:
                assert (x[key].dtype, x[key].shape) == (y[key].dtype, y[key].shape)
                np.testing.assert_array_equal(x[key], y[key])


@pytest.mark.parametrize("within", [True, False])
def test_shuffled_cached_epochs_gather_each_batch_whole(files, within):
    """A batch that begins in one chunk and ends in the next is gathered once, from
    both, never as two parts copied together again."""
    options = dict(COLS, batch_size=24, seed=2, shuffle=True, shuffle_within_batch=within)
    loader = tabloader.Loader(files, cache="memory", chunk_rows=100, **options)
    run(loader)
    expected = ids(run(loader))
    cache, plan = loader.cache, loader.plan(1)
    assert plan.num_chunks > 1 and any(plan.chunk_rows(c) % 24 for c in range(plan.num_chunks))
    chunks = [(c, cache.rows.delivery_rows(plan, c)) for c in range(plan.num_chunks)]
    served = cache.served()
    parts = [p for task in cache.rows.batch_tasks(lambda: served, plan, chunks, np) for p in task()]
    assert [segment_rows(segment) for segment, _ in parts] == [24] * (ROWS // 24) + [ROWS % 24]
    np.testing.assert_array_equal(np.concatenate([s["id"][:, 0] for s, _ in parts]), expected)


@pytest.mark.parametrize("stop", [1, 7, 17])
@pytest.mark.parametrize(
    "options",
    [
        dict(chunk_rows=150),
        dict(parts_per_chunk=1, shuffle_within_batch=False, drop_last=True),
        dict(chunk_rows=100, shuffle="global", layout="stacked"),
    ],
)
def test_a_cached_epoch_resumed_mid_way_delivers_exactly_the_rest(files, tmp_path, stop, options):
    """Batches that straddle chunks are gathered whole from the cache; a resume point
    inside such a chunk still gives exactly the batches that were still to come."""
    options = dict(COLS, batch_size=24, seed=11, shuffle=True, cache_dir=tmp_path / "c") | options
    reference = tabloader.Loader(files, cache="disk", **options)
    expected = [run(reference) for _ in range(2)][1]
    first = tabloader.Loader(files, cache="disk", **options)
    run(first)
    iterator = iter(first)
    before = [next(iterator) for _ in range(stop)]
    state = first.state_dict()
    iterator.close()
    if stop == len(expected):  # every batch taken: the epoch is over, the state says so
        assert (state["epoch"], state["batches"]) == (2, 0)
        return
    resumed = tabloader.Loader(files, cache="disk", **options)
    resumed.load_state_dict(state)
    after = run(resumed)
    assert resumed.stats().from_cache
    assert len(before) + len(after) == len(expected)
    for x, y in zip(before + after, expected, strict=True):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


# -- reuse and invalidation -----------------------------------------------------------


def test_a_second_loader_reads_only_the_cache(files, tmp_path, memory):
    options = dict(
        **COLS, batch_size=32, shuffle=True, seed=3, cache="disk", cache_dir=tmp_path / "c"
    )
    first = tabloader.Loader(files, **options)
    expected = [run(first) for _ in range(2)]
    second = tabloader.Loader(files, **options)
    for path in files:  # streaming would fail from here on
        os.rename(path, path + ".moved")
    for epoch in range(2):
        batches = run(second)
        assert second.stats().from_cache and second.stats().cache_epochs == epoch + 1
        assert second.stats().bytes_read == 0 and second.stats().read_seconds == 0
        for x, y in zip(expected[epoch], batches, strict=True):
            np.testing.assert_array_equal(x["id"], y["id"])
    # The files are mapped (shared with other processes, reclaimable), not copied.
    assert all(isinstance(_mapping(a), np.memmap) for a in second.cache.arrays.values())
    # 412 rows of int64 id and cat, float32 x and label
    assert second.stats().cache_bytes == ROWS * (8 + 8 + 4 + 4)


def _resident_bytes(directory: Path) -> int:
    """Bytes of this process's mappings of files under ``directory`` that are in memory."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = len(fields) >= 6 and fields[5].startswith(str(directory))
        elif inside and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_a_published_cache_that_fits_in_memory_is_read_in_when_opened(files, tmp_path, memory):
    """A later loader maps the files and, when they fit in memory, reads them in at once
    (large sequential reads), not page by page as shuffled gathers first touch them."""
    options = dict(**COLS, batch_size=32, shuffle=True, seed=3, cache="disk")
    first = tabloader.Loader(files, **options, cache_dir=tmp_path / "c")
    run(first)
    first.cache.wait()
    del first
    gc.collect()  # the first loader's own mappings of the files it wrote
    second = tabloader.Loader(files, **options, cache_dir=tmp_path / "c")
    assert second.cache.lookup()
    resident = _resident_bytes(tmp_path / "c")
    if memory == "scarce":
        assert resident == 0  # paged in on demand, as the gathers touch it
    else:
        assert resident >= second.cache.nbytes


def test_memory_cache_serves_later_epochs_without_the_files(files):
    loader = tabloader.Loader(files, **COLS, batch_size=50, shuffle=True, seed=0, cache="memory")
    assert sorted(ids(run(loader)).tolist()) == list(range(ROWS))
    for path in files:
        os.remove(path)
    for _ in range(2):
        batches = run(loader)
        check_rows_intact(batches)
        assert sorted(ids(batches).tolist()) == list(range(ROWS))
        assert loader.stats().from_cache


def test_a_changed_file_rebuilds_the_cache(tmp_path):
    paths = write_dataset(tmp_path / "d", [[50], [50]])
    options = dict(cats=["id"], batch_size=10, cache="disk", cache_dir=tmp_path / "c")
    loader = tabloader.Loader(paths, **options)
    run(loader)
    old = published(tmp_path / "c")
    assert len(old) == 1

    # Other values, same shape: only the modification time tells.
    table = make_table(1000, 50)
    import pyarrow.parquet as pq

    stat = os.stat(paths[1])
    pq.write_table(table, paths[1])
    os.utime(paths[1], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    renewed = tabloader.Loader(paths, **options)
    batches = run(renewed)
    assert not renewed.stats().from_cache
    assert sorted(ids(batches).tolist()) == list(range(50)) + list(range(1000, 1050))
    # The stale version is gone, the new one serves the next epoch.
    assert published(tmp_path / "c") != old and len(published(tmp_path / "c")) == 1
    assert sorted(ids(run(renewed)).tolist()) == list(range(50)) + list(range(1000, 1050))
    assert renewed.stats().from_cache


def test_a_list_columns_values_count_against_the_cache_limit(tmp_path):
    """A list column was counted as its spans alone (16 bytes a row), so a cache of long
    lists 16 times cache_max_bytes was written and served."""
    lists = pa.array([list(range(i % 200)) for i in range(2000)], pa.list_(pa.int64()))
    pq.write_table(pa.table({"id": np.arange(2000), "h": lists}), tmp_path / "l.parquet")
    values = sum(i % 200 for i in range(2000)) * 8  # 1.6 MB of values, 32 kB of spans
    options = dict(cats=["id", "h"], sparse_names=["h"], batch_size=100, cache="memory")
    loader = tabloader.Loader(str(tmp_path / "l.parquet"), **options, cache_max_bytes=values // 2)
    with pytest.warns(tabloader.CacheWarning, match="more than cache_max_bytes"):
        run(loader)
    run(loader)
    assert not loader.stats().from_cache
    roomy = tabloader.Loader(str(tmp_path / "l.parquet"), **options, cache_max_bytes=4 * values)
    run(roomy)
    run(roomy)
    assert roomy.stats().from_cache and values <= roomy.stats().cache_bytes <= 4 * values


@pytest.mark.parametrize("mode", ["memory", "disk"])
def test_rows_left_out_that_cannot_be_read_end_the_epoch_without_a_cache(tmp_path, mode):
    """With drop_last the cache reads the rows the epoch left out after its last batch:
    a file of those rows alone, deleted during the epoch, raised ReadError after the
    last batch, where the same loader without a cache finished the epoch."""
    for i, n in enumerate([1000, 1000, 50]):  # 2,050 rows in batches of 100: 50 left out
        pq.write_table(pa.table({"id": np.arange(n) + 10_000 * i}), tmp_path / f"p{i}.parquet")
    loader = tabloader.Loader(
        str(tmp_path / "p*.parquet"), cats=["id"], batch_size=100, drop_last=True,
        shuffle=False, cache=mode, cache_dir=tmp_path / "c",
    )  # fmt: skip
    batches = []

    def epoch() -> None:
        for batch in loader:
            batches.append(batch["id"])
            if len(batches) == 1:
                os.remove(tmp_path / "p2.parquet")

    with pytest.warns(tabloader.CacheWarning, match="the rows it left out"):
        epoch()
    assert np.array_equal(np.concatenate(batches), np.r_[np.arange(1000), np.arange(1000) + 10_000])
    assert loader.cache is not None and not loader.cache.complete


@pytest.mark.parametrize(
    "change",
    [
        dict(cats=["id"], conts=["x", "cat"]),
        dict(cats=["id", "cat"], conts=["x"], cont_dtype="float64"),
        dict(cats=["id", "cat"], conts=["x"], fill_null=0),
        dict(cats=["id", "cat"], conts=["x"], layout="stacked"),
        dict(cats=["id", "cat"], conts=["x"], global_size=2, global_rank=0),
    ],
)
def test_other_columns_dtypes_fills_layouts_or_shares_get_their_own_cache(files, tmp_path, change):
    base = dict(
        cats=["id", "cat"], conts=["x"], batch_size=20, cache="disk", cache_dir=tmp_path / "c"
    )
    run(tabloader.Loader(files, **base))
    loader = tabloader.Loader(files, **{**base, **change})
    first = run(loader)
    assert not loader.stats().from_cache
    assert {k: v.dtype for k, v in first[0].items()} == {
        k: v.dtype for k, v in next(iter(tabloader.Loader(files, **{**base, **change}))).items()
    }
    assert len(published(tmp_path / "c")) == 2


def test_a_fill_value_keys_its_cache_exactly(tmp_path):
    """A NaN fill's key never equalled itself (NaN != NaN), so its cache was called
    damaged and rebuilt by every run; integer fills beyond 2**53 were keyed as one float,
    so another fill was served the first one's rows."""
    path = tmp_path / "nulls.parquet"
    ids = pa.array([None if i % 5 == 0 else i for i in range(200)], pa.int64())
    xs = pa.array([None if i % 3 == 0 else float(i) for i in range(200)], pa.float32())
    pq.write_table(pa.table({"id": ids, "x": xs}), path)
    base = dict(cats=["id"], conts=["x"], batch_size=50, cache="disk", cache_dir=tmp_path / "c")

    def filled(fill_null: dict) -> tuple[list, list, bool]:
        loader = tabloader.Loader([str(path)], fill_null=fill_null, **base)
        with warnings.catch_warnings():
            warnings.simplefilter("error", tabloader.CacheWarning)  # nothing called damaged
            batches = run(loader)
        ids = [v for b in batches for v in b["id"].tolist() if v > 199]
        nans = [v for b in batches for v in b["x"].tolist() if v != v]
        return ids, nans, loader.stats().from_cache

    nan = {"id": 0, "x": float("nan")}
    ids, nans, from_cache = filled(nan)
    assert (ids, len(nans), from_cache) == ([], 67, False)
    ids, nans, from_cache = filled(nan)
    assert (ids, len(nans), from_cache) == ([], 67, True)  # the NaN fill's cache, served
    big = 2**53
    assert filled({"id": big, "x": 0.0}) == ([big] * 40, [], False)
    assert filled({"id": big + 1, "x": 0.0}) == ([big + 1] * 40, [], False)  # not big's rows
    assert filled({"id": big + 1, "x": 0.0}) == ([big + 1] * 40, [], True)


def test_loaders_differing_in_batching_share_the_cache(files, tmp_path):
    base = dict(**COLS, batch_size=20, shuffle=True, cache="disk", cache_dir=tmp_path / "c")
    run(tabloader.Loader(files, **base))
    # Batch size, seeds, drop_last and the layout do not change what is stored.
    other = tabloader.Loader(
        files, **{**base, "batch_size": 7}, seed=9, drop_last=True, layout="stacked"
    )
    run(other)
    assert other.stats().from_cache
    assert len(published(tmp_path / "c")) == 1


# -- where caches live ----------------------------------------------------------------


def test_the_cache_directory_comes_from_the_argument_the_environment_or_xdg(
    files, tmp_path, monkeypatch
):
    monkeypatch.setenv("TABLOADER_CACHE_DIR", str(tmp_path / "from-env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    run(tabloader.Loader(files, **COLS, batch_size=50, cache="disk"))
    assert len(published(tmp_path / "from-env")) == 1
    run(tabloader.Loader(files, **COLS, batch_size=50, cache="disk", cache_dir=tmp_path / "a"))
    assert len(published(tmp_path / "a")) == 1
    monkeypatch.delenv("TABLOADER_CACHE_DIR")
    assert cache_directory() == tmp_path / "xdg" / "tabloader"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_directory() == Path.home() / ".cache" / "tabloader"


def test_a_relative_cache_directory_stays_where_it_was_named(files, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loader = tabloader.Loader(files, **COLS, batch_size=50, cache="disk", cache_dir="cache")
    monkeypatch.chdir(tmp_path / "..")  # the working directory changes before epoch 0
    assert sorted(ids(run(loader)).tolist()) == list(range(ROWS))
    assert len(published(tmp_path / "cache")) == 1
    other = tabloader.Loader(files, **COLS, batch_size=50, cache="disk", cache_dir=tmp_path / "o")
    shutil.rmtree(tmp_path / "o")  # deleted before its first epoch: made again
    assert sorted(ids(run(other)).tolist()) == list(range(ROWS))
    assert len(published(tmp_path / "o")) == 1
    monkeypatch.setenv("TABLOADER_CACHE_DIR", "   ")
    with pytest.raises(tabloader.InvalidArgumentError, match="TABLOADER_CACHE_DIR must name"):
        tabloader.Loader(files, **COLS, batch_size=50, cache="disk")


@pytest.mark.parametrize("make", ["Loader", "TorchAsyncItr"])
def test_a_cache_warning_points_at_the_users_line(files, tmp_path, make):
    if make == "TorchAsyncItr":
        pytest.importorskip("torch")
        from tabloader.torch import TorchAsyncItr as build
    else:
        build = tabloader.Loader
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by others: not used
    options = {"cats": ["id"], "batch_size": 50}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(files, **options, cache="disk", cache_dir=shared)
        list(
            build(files, **options, cache="memory", cache_max_bytes=10)
        )  # too big: said by the epoch
    said = [w for w in caught if issubclass(w.category, tabloader.CacheWarning)]
    assert len(said) == 2
    assert all(w.filename == __file__ for w in said), [(w.filename, w.lineno) for w in said]


def test_a_manifest_describes_the_cache(files, tmp_path):
    run(tabloader.Loader(files, **COLS, batch_size=50, cache="disk", cache_dir=tmp_path))
    (directory,) = published(tmp_path)
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["rows"] == ROWS
    assert [b["columns"] for b in manifest["blocks"]] == [["id"], ["cat"], ["x"], ["label"]]
    assert [f["path"] for f in manifest["key"]["files"]] == [os.path.abspath(f) for f in files]
    assert [f["file"] for f in manifest["files"]] == [f"block{i}.npy" for i in range(4)]
    assert all(len(f[CHECKSUM]) == 1 for f in manifest["files"])  # one segment each, here
    ids_block = np.load(directory / manifest["blocks"][0]["files"][0])
    assert ids_block[:, 0].tolist() == list(range(ROWS))


# -- when the cache does not fit --------------------------------------------------------


@pytest.mark.parametrize("shuffle", [True, "global"])
def test_a_cache_over_the_limit_warns_once_and_streams(files, tmp_path, shuffle):
    loader = tabloader.Loader(
        files,
        **COLS,
        batch_size=32,
        shuffle=shuffle,
        seed=2,
        cache="disk",
        cache_dir=tmp_path / "c",
        cache_max_bytes=1000,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            batches = run(loader)
            check_rows_intact(batches)
            assert sorted(ids(batches).tolist()) == list(range(ROWS))
            assert not loader.stats().from_cache
    messages = [str(w.message) for w in caught if issubclass(w.category, tabloader.CacheWarning)]
    assert len(messages) == 1
    assert "more than cache_max_bytes=1000" in messages[0]
    assert "Raise cache_max_bytes" in messages[0]
    assert not (tmp_path / "c").exists() or not published(tmp_path / "c")


def test_a_cache_larger_than_the_free_space_is_not_written(files, tmp_path):
    cache = DecodedCache(
        "disk",
        dataset=tabloader.Dataset(files),
        blocks=tabloader.Loader(files, **COLS, batch_size=8).layout_plan.blocks,
        layout=tabloader.Loader(files, **COLS, batch_size=8).layout_plan,
        fill_null={},
        global_rank=0,
        global_size=1,
        cache_dir=tmp_path,
    )
    assert cache.why_not() is None
    cache.nbytes = 1 << 62  # what a too-large dataset would need
    reason = cache.why_not()
    assert reason is not None and "free" in reason and "cache_dir=" in reason


# -- crashes and interruptions ----------------------------------------------------------


def test_an_interrupted_first_epoch_publishes_nothing(files, tmp_path):
    loader = tabloader.Loader(
        files, **COLS, batch_size=8, parts_per_chunk=1, cache="disk", cache_dir=tmp_path / "c"
    )
    for i, _ in enumerate(loader):
        if i == 3:
            break
    assert not published(tmp_path / "c")
    assert not temporary(tmp_path / "c")  # the partial cache was removed
    batches = run(loader)  # streams again, and writes again
    assert not loader.stats().from_cache
    assert sorted(ids(batches).tolist()) == list(range(ROWS))
    run(loader)
    assert loader.stats().from_cache


CRASHING_WRITER = """
import sys, time, tabloader
loader = tabloader.Loader(sys.argv[1:-1], cats=["id"], batch_size=8, parts_per_chunk=1,
                          cache="disk", cache_dir=sys.argv[-1])
iterator = iter(loader)
next(iterator)
print("writing", flush=True)
time.sleep(120)
"""


def test_a_writer_killed_mid_write_leaves_nothing_a_later_loader_trusts(files, tmp_path):
    root = tmp_path / "c"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CRASHING_WRITER), *files, str(root)],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == b"writing"
        assert temporary(root) and not published(root)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    loader = tabloader.Loader(files, cats=["id"], batch_size=8, cache="disk", cache_dir=root)
    batches = run(loader)
    assert not loader.stats().from_cache
    assert sorted(ids(batches).tolist()) == list(range(ROWS))
    assert len(published(root)) == 1
    assert not temporary(root)  # the dead writer's directory was cleaned up
    assert sorted(ids(run(loader)).tolist()) == list(range(ROWS))
    assert loader.stats().from_cache


EXITING_WRITER = """
import sys, tabloader
import tabloader.cache.files
tabloader.cache.files.SEGMENT_BYTES = 256  # several checksum segments, hashed on threads
loader = tabloader.Loader(sys.argv[1:-1], cats=["id", "cat"], conts=["x"], batch_size=8,
                          parts_per_chunk=1, cache="disk", cache_dir=sys.argv[-1])
print(sum(len(b["id"]) for b in loader), flush=True)
"""


def test_a_script_that_ends_after_the_first_epoch_publishes_its_cache(files, tmp_path):
    # The cache is written in the background after the epoch; the interpreter's exit
    # waits for it, and writing it must not need what the exit has shut down already
    # (a thread pool refuses new work once the interpreter is shutting down).
    root = tmp_path / "c"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(EXITING_WRITER), *files, str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(ROWS)
    assert "CacheWarning" not in done.stderr, done.stderr
    assert len(published(root)) == 1 and not temporary(root)
    loader = tabloader.Loader(
        files, cats=["id", "cat"], conts=["x"], batch_size=8, cache="disk", cache_dir=root
    )
    assert sorted(ids(list(loader)).tolist()) == list(range(ROWS))
    assert loader.stats().from_cache  # its first epoch reads only the cache


def _first_epoch(files: list[str], root: str) -> None:
    loader = tabloader.Loader(files, **COLS, batch_size=8, cache="disk", cache_dir=root)
    assert sorted(ids(list(loader)).tolist()) == list(range(ROWS))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_child_process_that_fills_a_disk_cache_publishes_it(files, tmp_path, method):
    # A child process (a DataLoader worker) ends without the exit handlers that wait for
    # a writer thread: the cache must be written before its epoch ends.
    import multiprocessing

    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {method} start method here")
    root = tmp_path / "c"
    child = multiprocessing.get_context(method).Process(
        target=_first_epoch, args=(files, str(root))
    )
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert len(published(root)) == 1 and not temporary(root)
    loader = tabloader.Loader(files, **COLS, batch_size=8, cache="disk", cache_dir=root)
    assert sorted(ids(list(loader)).tolist()) == list(range(ROWS))
    assert loader.stats().from_cache


def test_a_cache_that_cannot_be_written_warns_and_is_served_from_memory(files, tmp_path):
    loader = tabloader.Loader(
        files, **COLS, batch_size=8, parts_per_chunk=1, cache="disk", cache_dir=tmp_path / "c"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        iterator = iter(loader)
        batches = [next(iterator)]
        for temp in temporary(tmp_path / "c"):  # the files' directory disappears
            shutil.rmtree(temp)
        batches += list(iterator)
        loader.cache.wait()
    messages = [str(w.message) for w in caught if issubclass(w.category, tabloader.CacheWarning)]
    assert len(messages) == 1 and "could not write the decoded cache" in messages[0]
    assert "keeps serving it from memory" in messages[0]
    assert sorted(ids(batches).tolist()) == list(range(ROWS))
    assert not published(tmp_path / "c")
    assert sorted(ids(run(loader)).tolist()) == list(range(ROWS))
    assert loader.stats().from_cache


def _threads_left(before: set[threading.Thread]) -> list[str]:
    """The tabloader threads started since ``before`` still running after a few seconds
    (a cache's writer aside): the other tests' may still be winding down."""
    deadline = time.monotonic() + 5
    while True:
        names = [
            t.name
            for t in set(threading.enumerate()) - before
            if t.name.startswith("tabloader-") and t.name != "tabloader-cache-writer"
        ]
        if not names or time.monotonic() > deadline:
            return names
        time.sleep(0.01)


@pytest.mark.parametrize("how", ["close", "with"])
def test_closing_a_loader_ends_its_epoch_in_progress(files, tmp_path, how):
    root = tmp_path / "c"
    options = dict(**COLS, batch_size=8, shuffle=True, seed=0, cache="disk", cache_dir=root)
    before = set(threading.enumerate())
    if how == "close":
        loader = tabloader.Loader(files, **options)
        epoch = iter(loader)
        next(epoch)
        loader.close()
    else:
        with tabloader.Loader(files, **options) as loader:
            epoch = iter(loader)
            next(epoch)
    assert list(epoch) == []  # the iterator yields nothing more
    assert not _threads_left(before)
    assert not published(root) and not temporary(root)
    assert sorted(ids(run(loader)).tolist()) == list(range(ROWS))  # the next epoch is whole


@pytest.mark.parametrize("cache", ["memory", "disk"])
def test_a_loop_that_takes_len_batches_finds_the_cache_at_the_next_epoch(
    files, tmp_path, monkeypatch, cache
):
    # drop_last: the rows the epoch leaves out are written after its last batch, and
    # the fill completed; a slow disk makes that take a while.
    import time

    import tabloader.cache.fill

    complete = tabloader.cache.fill.Fill.complete

    def slow_complete(self, *args, **kwargs):
        time.sleep(0.3)
        return complete(self, *args, **kwargs)

    monkeypatch.setattr(tabloader.cache.fill.Fill, "complete", slow_complete)
    options = dict(**COLS, batch_size=50, drop_last=True, shuffle=True, seed=0, cache=cache)
    if cache == "disk":
        options["cache_dir"] = tmp_path / "c"
    loader = tabloader.Loader(files, **options)
    for epoch in range(3):
        steps = iter(loader)
        batches = [next(steps) for _ in range(len(loader))]  # no StopIteration asked for
        assert len(batches) == ROWS // 50
        assert loader.stats().from_cache == (epoch > 0), epoch
        assert loader.stats().cache_epochs == epoch


def test_leaving_a_cached_epoch_stops_its_threads(files):
    import threading
    import time

    loader = tabloader.Loader(files, **COLS, batch_size=8, shuffle=True, seed=0, cache="memory")
    run(loader)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
        t.name.startswith(("tabloader-gather", "tabloader-reader", "tabloader-batcher"))
        for t in threading.enumerate()
    ):
        time.sleep(0.01)
    gather_threads = [
        t.name for t in threading.enumerate() if t.name.startswith("tabloader-gather")
    ]
    assert not gather_threads


def test_a_read_error_while_writing_reaches_the_consumer_and_publishes_nothing(tmp_path):
    paths = write_dataset(tmp_path / "d", [[50], [50]])
    loader = tabloader.Loader(
        paths, cats=["id"], batch_size=10, cache="disk", cache_dir=tmp_path / "c"
    )
    Path(paths[1]).write_bytes(Path(paths[1]).read_bytes()[:200] + b"\0" * 100)
    with pytest.raises(tabloader.ReadError, match=r"part-001\.parquet"):
        run(loader)
    assert not published(tmp_path / "c") and not temporary(tmp_path / "c")


def test_a_damaged_cache_is_rebuilt(files, tmp_path):
    options = dict(**COLS, batch_size=50, cache="disk", cache_dir=tmp_path)
    run(tabloader.Loader(files, **options))
    (directory,) = published(tmp_path)
    block = directory / "block0.npy"
    block.write_bytes(block.read_bytes()[:100])  # truncated
    loader = tabloader.Loader(files, **options)
    batches = run(loader)
    assert not loader.stats().from_cache
    assert sorted(ids(batches).tolist()) == list(range(ROWS))
    run(loader)
    assert loader.stats().from_cache


# -- worker processes' shares -------------------------------------------------------------


def test_a_worker_fills_the_whole_cache_and_the_next_reads_it(files, tmp_path):
    loader = tabloader.Loader(
        files,
        **COLS,
        batch_size=16,
        shuffle=True,
        seed=4,
        drop_last=True,
        cache="disk",
        cache_dir=tmp_path,
    )
    first = list(loader.iter_epoch(0, worker=0, num_workers=2))
    loader.cache.wait()
    assert not loader.stats().from_cache
    second = list(loader.iter_epoch(0, worker=1, num_workers=2))
    assert loader.stats().from_cache
    got = ids(first + second)
    assert len(got) == len(set(got.tolist())) == 16 * (ROWS // 16)
    # The rows the epoch dropped are in the cache too.
    whole = tabloader.Loader(
        files, **COLS, batch_size=16, shuffle=True, seed=0, cache="disk", cache_dir=tmp_path
    )
    assert sorted(ids(run(whole)).tolist()) == list(range(ROWS))
    assert whole.stats().from_cache


# -- arguments ------------------------------------------------------------------------


def test_global_shuffle_without_a_cache_says_what_to_pass(files):
    with pytest.raises(tabloader.InvalidArgumentError, match=r"shuffle='global'.*cache='memory'"):
        tabloader.Loader(files, **COLS, batch_size=8, shuffle="global")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (dict(cache="ram"), r"cache must be None, 'memory' or 'disk', got 'ram'"),
        (dict(cache="disk", cache_max_bytes=0), r"cache_max_bytes must be a positive integer"),
        (dict(shuffle="yes"), r"shuffle must be True, False or 'global', got 'yes'"),
    ],
)
def test_bad_cache_arguments_are_rejected(files, options, match):
    with pytest.raises(tabloader.InvalidArgumentError, match=match):
        tabloader.Loader(files, **COLS, batch_size=8, **options)


def test_a_disk_cache_needs_files():
    with pytest.raises(tabloader.InvalidArgumentError, match=r"cache='disk' needs a dataset of"):
        tabloader.Loader(pa.table({"x": [1.0, 2.0]}), conts=["x"], batch_size=1, cache="disk")


# -- adapters ---------------------------------------------------------------------------


@pytest.mark.torch
def test_torch_adapter_passes_the_cache_through(files, tmp_path):
    from tabloader.torch import TorchAsyncItr

    itr = TorchAsyncItr(
        files,
        cats=["id"],
        labels=["label"],
        batch_size=40,
        shuffle="global",
        seed=1,
        device="cpu",
        cache="disk",
        cache_dir=tmp_path,
    )
    epochs = [[int(i) for x_cat, _, _ in itr for i in x_cat[:, 0]] for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(ROWS))
    assert itr._loader.stats().from_cache


@pytest.mark.tensorflow
def test_keras_adapter_passes_the_cache_through(files):
    from tabloader.tensorflow import KerasSequenceLoader

    loader = KerasSequenceLoader(
        files,
        batch_size=40,
        cat_names=["id"],
        label_names=["label"],
        seed=1,
        device="cpu",
        cache="memory",
    )
    epochs = [[int(i) for features, _ in loader for i in features["id"]] for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(ROWS))
    assert loader.loader.stats().from_cache


@pytest.mark.parametrize("mode", ["memory", "disk"])
def test_a_growing_dataset_rebuilds_its_cache_when_the_files_change(tmp_path, mode):
    data, caches = tmp_path / "data", tmp_path / "caches"
    data.mkdir()

    def add(index: int) -> None:
        ids = np.arange(index * 100, (index + 1) * 100, dtype=np.int64)
        pq.write_table(pa.table({"id": ids}), data / f"part-{index}.parquet")

    add(0)
    dataset = tabloader.Dataset(str(data), refresh=True)
    loader = tabloader.Loader(
        dataset, cats=["id"], batch_size=64, shuffle=True, seed=2, cache=mode, cache_dir=caches
    )
    seen = []
    for epoch in range(5):
        ids = np.sort(np.concatenate([b["id"] for b in loader]))
        seen.append((len(ids), loader.stats().from_cache))
        files = sorted(data.glob("*.parquet"))
        np.testing.assert_array_equal(  # exactly the rows of the files listed this epoch
            ids, np.concatenate([pq.read_table(f)["id"].to_numpy() for f in files])
        )
        if epoch in (1, 3):
            add(epoch)  # a new file: the next epoch decodes again and rebuilds the cache
        if epoch == 3:
            (data / "part-0.parquet").unlink()  # and an evicted one leaves it
    assert seen == [(100, False), (100, True), (200, False), (200, True), (200, False)]
    if mode == "disk":  # only the current cache is kept
        assert len([p for p in caches.iterdir() if not p.name.startswith(".")]) <= 1


# -- benchmarks ---------------------------------------------------------------------------

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.slow
def test_the_cache_benchmark_cases_write_the_cache_then_read_only_it(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import cases_cache
    from common import Context
    from tabloader.synthetic import CATS, CONTS, LABELS, write_criteo_like

    write_criteo_like(tmp_path / "data", rows=20000, files=2, row_group_size=2500)
    files = sorted(str(p) for p in (tmp_path / "data").glob("*.parquet"))
    ctx = Context(files, CATS, CONTS, LABELS, batch_size=1024, rows=20000)
    names = []
    for case in cases_cache.cases(ctx):
        run = case.make()  # in its own process in the benchmark; here, in this one
        assert run() == 20000, case.name  # the epoch that writes the cache
        assert run() == 20000, case.name  # an epoch from the cache (the case checks it)
        names.append(case.name)
    assert "tabloader Loader, disk cache, global shuffle" in names


@pytest.mark.parametrize("rows", [0, 1, 511, 512, 513, 4096, 100_003])
@pytest.mark.parametrize("aligned", [True, False])
def test_cache_files_are_valid_npy_whatever_the_size_and_alignment(tmp_path, rows, aligned):
    # Page-aligned arrays of full pages are written directly where the system allows;
    # the rest (the tail, unaligned arrays) through the page cache: the file is the same.
    from tabloader.cache import write_npy
    from tabloader.hostmem import populated_empty

    values = np.arange(rows * 3, dtype=np.int64).reshape(rows, 3) * 7 - 5
    if aligned:
        array = populated_empty(values.shape, values.dtype)
        array[...] = values
    else:
        array = np.empty(values.size + 1, np.int64)[1:].reshape(values.shape)
        array[...] = values
    write_npy(tmp_path / "block.npy", array)
    loaded = np.load(tmp_path / "block.npy")
    mapped = np.load(tmp_path / "block.npy", mmap_mode="r")
    assert loaded.dtype == np.int64 and loaded.shape == (rows, 3)
    np.testing.assert_array_equal(loaded, values)
    np.testing.assert_array_equal(mapped, values)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(0, 40_000),
    width=st.integers(1, 5),
    dtype=st.sampled_from(["int64", "float32", "int32"]),
    cuts=st.lists(st.floats(0, 1), max_size=4),
)
def test_cache_files_are_valid_npy_whatever_the_size_width_dtype_and_pieces(
    rows, width, dtype, cuts
):
    """Rows written piece by piece, in any order, cast on the way, make a valid ``.npy``
    file whose mapping, read back before and after syncing, holds every row."""
    from tabloader.cache import CacheFiles, FileSpec

    values = np.arange(rows * width, dtype=np.int64).reshape(rows, width) * 7 - 5
    spec = FileSpec("block0.npy", (rows, width), np.dtype(dtype))
    with tempfile.TemporaryDirectory() as directory:
        files = CacheFiles(Path(directory), [spec])
        bounds = sorted({0, rows, *(int(c * rows) for c in cuts)})
        for lo, hi in reversed(list(itertools.pairwise(bounds))):
            files.write_rows("block0.npy", lo, [values[lo:hi, j] for j in range(width)])
        expected = values.astype(dtype)
        np.testing.assert_array_equal(files.mapped()["block0.npy"], expected)
        files.sync_and_close()
        loaded = np.load(Path(directory) / "block0.npy")
        assert loaded.dtype == np.dtype(dtype) and loaded.shape == (rows, width)
        np.testing.assert_array_equal(loaded, expected)


def test_a_disk_cache_too_large_for_memory_is_written_into_its_files(files, tmp_path, monkeypatch):
    """A disk cache that does not fit in memory is written straight into its files in
    epoch 0 (read back through a mapping of them), and served from them after."""
    monkeypatch.setattr(tabloader.cache.policy, "_available_memory", lambda: 30_000)
    options = dict(**COLS, batch_size=8, shuffle=True, seed=2)
    streamed = tabloader.Loader(files, **options)
    cached = tabloader.Loader(files, **options, cache="disk", cache_dir=tmp_path)
    for epoch in range(2):
        a, b = run(streamed), run(cached)
        assert cached.stats().from_cache == (epoch > 0)
        assert [x["id"].tolist() for x in a] == [y["id"].tolist() for y in b]
        check_rows_intact(b)
    (directory,) = published(tmp_path)
    arrays = cached.cache.arrays
    assert arrays and all(isinstance(_mapping(a), np.memmap) for a in arrays.values())
    if sys.platform.startswith("linux"):  # the mappings are of the published files
        maps = Path("/proc/self/maps").read_text().split()
        assert {Path(m).name for m in maps if m.startswith(str(directory))} == {
            f"block{i}.npy" for i in range(len(arrays))
        }


def test_a_disk_that_fills_up_before_the_cache_is_created_warns_once_and_streams(
    files, tmp_path, monkeypatch
):
    """The files' space is reserved before any row is written (no crash on a full disk
    halfway through the epoch): a disk that filled up since its free space was measured
    is found there, said once, and the loader streams."""
    import errno

    monkeypatch.setattr(tabloader.cache.policy, "_available_memory", lambda: 30_000)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    loader = tabloader.Loader(
        files, **COLS, batch_size=8, shuffle=True, seed=2, cache="disk", cache_dir=tmp_path
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        epochs = [run(loader) for _ in range(2)]
    messages = [str(w.message) for w in caught if issubclass(w.category, tabloader.CacheWarning)]
    assert len(messages) == 1
    assert "files could not be created" in messages[0] and "No space left" in messages[0]
    for batches in epochs:
        assert sorted(ids(batches).tolist()) == list(range(ROWS))
    assert not loader.stats().from_cache
    assert not published(tmp_path) and not temporary(tmp_path)


@pytest.mark.parametrize("layout", ["columns", "stacked"])
def test_the_loaders_threads_change_no_batch(files, tmp_path, layout):
    """Streamed, filling a cache, served from it: the same batches whatever the number
    of threads laying out, writing and gathering them; stats say which was taken."""
    options = dict(COLS, batch_size=24, seed=5, shuffle=True, chunk_rows=150, layout=layout)
    epochs = {}
    for threads in (1, 3, 8):
        streamed = tabloader.Loader(files, threads=threads, **options)
        cached = tabloader.Loader(files, threads=threads, cache="memory", **options)
        epochs[threads] = [run(streamed), run(streamed), run(cached), run(cached)]
        assert streamed.stats().threads == cached.stats().threads == threads
    for threads in (3, 8):
        for a, b in zip(epochs[1], epochs[threads], strict=True):
            assert len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                for key in x:
                    np.testing.assert_array_equal(x[key], y[key])
    assert tabloader.Loader(files, **options).stats().threads >= 1


@pytest.mark.parametrize("threads", [0, -2, 1.5, "4"])
def test_a_number_of_threads_that_is_not_a_positive_integer_is_refused(files, threads):
    with pytest.raises(tabloader.InvalidArgumentError, match="threads must be"):
        tabloader.Loader(files, **COLS, batch_size=8, threads=threads)
