"""The decoded cache of a GPU loader: placed in GPU memory or pinned host memory, its
batches those of the CPU backend's cache for a seed, device memory flat over epochs.

Tests marked ``gpu`` run where cudf, cupy and a GPU are present, and in CI on the emulated
device (tests/test_emulated_device.py); the option checks run everywhere.
"""

from __future__ import annotations

import gc
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader
from conftest import write_dataset
from tabloader.cache.device import FRACTION_ENV, device_share
from tabloader.errors import InvalidArgumentError

gpu = pytest.mark.gpu


def _host(batch):
    """A batch's arrays on the host (lists as (values, offsets) or padded arrays)."""
    out = {}
    for name, value in batch.items():
        if isinstance(value, tuple):
            out[name] = tuple(v.get() if hasattr(v, "get") else v for v in value)
        else:
            out[name] = value.get() if hasattr(value, "get") else value
    return out


def _on_device(value):
    arrays = value if isinstance(value, tuple) else (value,)
    return all(type(a).__module__.split(".")[0] == "cupy" for a in arrays)


def _same(cpu_batches, gpu_batches):
    assert len(cpu_batches) == len(gpu_batches)
    for c, g in zip(cpu_batches, gpu_batches, strict=True):
        assert all(_on_device(v) for v in g.values()), {k: type(v) for k, v in g.items()}
        # columns and stacked blocks alike reach the framework without a copy
        dense = {k: v for k, v in g.items() if not isinstance(v, tuple)}
        assert all(v.flags.c_contiguous for v in dense.values()), {
            k: v.strides for k, v in dense.items()
        }
        g = _host(g)
        assert c.keys() == g.keys()
        for name, value in c.items():
            if isinstance(value, tuple):
                for a, b in zip(value, g[name], strict=True):
                    np.testing.assert_array_equal(a, b)
                continue
            assert value.dtype == g[name].dtype, name
            np.testing.assert_array_equal(value, g[name], err_msg=name)


def _table(rows: int = 900) -> pa.Table:
    ids = np.arange(rows)
    return pa.table(
        {
            "id": ids,
            "cat": (ids % 13).astype(np.int32),
            "x": ids / 4.0,
            "y": (ids % 2).astype(np.float32),
            "tags": pa.array([list(range(i % 4)) for i in ids], pa.list_(pa.int64())),
        }
    )


@gpu
@pytest.mark.parametrize("placement", ["auto", "host"])
@pytest.mark.parametrize("shuffle", [True, "global", False], ids=["shuffle", "global", "ordered"])
@pytest.mark.parametrize("layout", ["columns", "stacked"])
def test_cached_gpu_batches_are_the_cpu_caches(placement, shuffle, layout):
    options = {
        "cats": ["id", "cat"],
        "conts": ["x"],
        "labels": ["y"],
        "batch_size": 64,
        "shuffle": shuffle,
        "seed": 5,
        "cache": "memory",
        "chunk_rows": 256,
        "layout": layout,
    }
    cpu = tabloader.Loader(_table(), device="cpu", **options)
    gpu_loader = tabloader.Loader(_table(), device="cuda", cache_placement=placement, **options)
    for epoch in range(3):
        _same(list(cpu), list(gpu_loader))
        stats = gpu_loader.stats()
        assert stats.from_cache == (epoch > 0)
    expected = "pinned host" if placement == "host" else "device"
    assert stats.cache_placement == expected and stats.cache_epochs == 2


@gpu
def test_list_columns_are_cached_on_the_gpu_as_on_the_cpu():
    options = {
        "cats": ["id"],
        "sparse_names": ["tags"],
        "labels": ["y"],
        "batch_size": 50,
        "shuffle": True,
        "seed": 1,
        "cache": "memory",
        "chunk_rows": 200,
    }
    cpu = tabloader.Loader(_table(), device="cpu", **options)
    on_gpu = tabloader.Loader(_table(), device="cuda", **options)
    for _ in range(2):
        _same(list(cpu), list(on_gpu))
    assert on_gpu.stats().from_cache


@gpu
def test_a_disk_cache_is_read_by_a_new_gpu_loader_and_placed(tmp_path):
    paths = write_dataset(tmp_path / "data", [[100, 100], [150]])
    options = {
        "cats": ["id", "cat"],
        "conts": ["x"],
        "labels": ["label"],
        "batch_size": 32,
        "shuffle": True,
        "seed": 2,
        "cache": "disk",
        "cache_dir": tmp_path / "cache",
    }
    first = tabloader.Loader(paths, device="cuda", **options)
    expected = [_host(b) for b in first]
    first.cache.wait()  # written out in the background
    later = tabloader.Loader(paths, device="cuda", **options)
    again = list(later)
    assert later.stats().from_cache and later.stats().cache_placement == "device"
    cpu = tabloader.Loader(paths, device="cpu", **options)
    _same(list(cpu), again)  # the published cache, opened by the CPU backend too
    assert len(expected) == len(again)


@gpu
def test_the_share_of_device_memory_decides_the_placement(monkeypatch):
    monkeypatch.setenv(FRACTION_ENV, "0")  # no room on the device: pinned host memory
    loader = tabloader.Loader(
        _table(), cats=["id"], batch_size=100, device="cuda", cache="memory", shuffle=True, seed=0
    )
    for _ in range(2):
        list(loader)
    assert loader.stats().cache_placement == "pinned host"
    forced = tabloader.Loader(
        _table(),
        cats=["id"],
        batch_size=100,
        device="cuda",
        cache="memory",
        cache_placement="device",
        seed=0,
    )
    for _ in range(2):
        list(forced)
    assert forced.stats().cache_placement == "device"


_WHERE_DRAWN = {
    # (placement, shuffle): (thread that draws a chunk's order, its array module, staged)
    ("device", True): ("tabloader-reader", "cupy", False),
    ("device", "global"): ("tabloader-reader", "cupy", False),
    ("host", True): ("tabloader-reader", "cupy", True),
    ("host", "global"): ("tabloader-order", "numpy", False),
}


@gpu
@pytest.mark.parametrize(("placement", "shuffle"), list(_WHERE_DRAWN))
def test_a_cached_chunks_order_is_drawn_where_it_is_gathered(
    tmp_path, monkeypatch, placement, shuffle
):
    """In GPU memory, the order is drawn on the device by the reader (queued on the
    loader's stream). In pinned host memory, a chunk of at most a window is copied to the
    device in stored order and permuted there, its order drawn there too; a global
    shuffle's single chunk is gathered on the host, its order drawn ahead by the order
    thread. Batches are the CPU backend's either way."""
    from tabloader.cache import device as device_module
    from tabloader.cache.device import DeviceCacheBackend
    from tabloader.plan import EpochPlan

    drawn: list[tuple[str, str]] = []
    staged: list[int] = []
    batch_order, batch_orders = EpochPlan.batch_order, EpochPlan.batch_orders
    stage = DeviceCacheBackend._staged

    def record(order):
        drawn.append((threading.current_thread().name.split("_")[0], type(order).__module__))
        return order

    def recorded(self, chunk, *, xp=np):
        return record(batch_order(self, chunk, xp=xp))

    def recorded_all(self, *, xp=np):  # each chunk's order recorded as it is taken
        return map(record, batch_orders(self, xp=xp))

    def recorded_stage(self, placed, plan, chunk):
        staged.append(chunk)
        return stage(self, placed, plan, chunk)

    monkeypatch.setattr(EpochPlan, "batch_order", recorded)
    monkeypatch.setattr(EpochPlan, "batch_orders", recorded_all)
    monkeypatch.setattr(DeviceCacheBackend, "_staged", recorded_stage)
    # windows of 100 rows of 8 bytes: a chunk of one row group (up to 150 rows) is at
    # most two windows and is staged, the global shuffle's 470 rows are not
    monkeypatch.setattr(device_module, "DEFAULT_CHUNK_BYTES", 100 * 8)
    options = {"cats": ["id"], "batch_size": 100, "shuffle": shuffle, "seed": 3, "cache": "memory"}
    paths = write_dataset(tmp_path / "data", [[100, 100], [150], [120]])
    loader = tabloader.Loader(
        paths, parts_per_chunk=1, device="cuda", cache_placement=placement, **options
    )
    list(loader)  # fills the cache
    drawn.clear()
    served = list(loader)
    assert loader.stats().cache_placement == ("pinned host" if placement == "host" else "device")
    chunks = loader.plan(1).num_chunks
    assert chunks == (1 if shuffle == "global" else 4)
    thread, module, is_staged = _WHERE_DRAWN[placement, shuffle]
    assert drawn == [(thread, module)] * chunks
    assert staged == (list(range(chunks)) if is_staged else [])
    cpu = tabloader.Loader(paths, parts_per_chunk=1, device="cpu", **options)
    list(cpu)
    _same(list(cpu), served)


@gpu
@pytest.mark.parametrize("placement", ["device", "host"])
def test_device_memory_stays_flat_over_cached_epochs(placement):
    import cupy
    import rmm

    from tabloader.backends import gpu as gpu_module

    loader = tabloader.Loader(
        _table(4000),
        cats=["id", "cat"],
        conts=["x"],
        batch_size=128,
        shuffle=True,
        seed=0,
        device="cuda",
        cache="memory",
        cache_placement=placement,
        chunk_rows=1000,
    )
    between = []
    for _ in range(5):
        for _batch in loader:
            pass
        del _batch
        gc.collect()
        between.append(gpu_module.device_bytes_in_use(rmm, cupy, 0))
    assert len(set(between[1:])) == 1, between  # the cache placed once, nothing left behind


@gpu
@pytest.mark.parametrize("placement", ["device", "host"])
def test_a_global_shuffle_is_gathered_a_window_at_a_time(monkeypatch, placement):
    """A global shuffle's epoch is one chunk of every row. Served a window at a time, the
    device holds the cache (where it is placed there), the epoch's order, and a few
    windows: never a second, shuffled copy of the whole cache, and from pinned memory
    never the cache it had no room for."""
    import cupy
    import rmm

    from tabloader.backends import gpu as gpu_module
    from tabloader.cache import device as device_module

    window_bytes = 32 * 1024
    monkeypatch.setattr(device_module, "DEFAULT_CHUNK_BYTES", window_bytes)
    rows = 40_000
    ids = np.arange(rows)
    conts = [f"x{i}" for i in range(10)]
    table = pa.table({"id": ids, **{c: ids * (i + 1) / 7 for i, c in enumerate(conts)}})
    options = {"cats": ["id"], "conts": conts, "batch_size": 128, "seed": 5}
    loader = tabloader.Loader(
        table,
        device="cuda",
        shuffle="global",
        cache="memory",
        cache_placement=placement,
        **options,
    )
    list(loader)  # fills the cache, and places it
    gc.collect()
    placed = gpu_module.device_bytes_in_use(rmm, cupy, 0)
    peak = 0
    served = []
    for batch in loader:
        peak = max(peak, gpu_module.device_bytes_in_use(rmm, cupy, 0) - placed)
        served.append(batch["id"].get().ravel())
        del batch
    assert loader.stats().cache_placement == ("pinned host" if placement == "host" else "device")
    cache_bytes = loader.cache.nbytes
    assert cache_bytes >= rows * 48
    bound = rows * 8 + 8 * window_bytes  # the order, and a few windows in flight
    assert peak <= bound < cache_bytes / 2, (peak, bound, cache_bytes)
    cpu = tabloader.Loader(table, device="cpu", shuffle="global", cache="memory", **options)
    list(cpu)
    np.testing.assert_array_equal(
        np.concatenate(served), np.concatenate([b["id"].ravel() for b in cpu])
    )


def test_cache_placement_is_checked_at_construction():
    table = pa.table({"x": [1.0, 2.0]})
    with pytest.raises(InvalidArgumentError, match=r"cache_placement must be 'auto', 'device'"):
        tabloader.Loader(table, conts=["x"], batch_size=1, cache="memory", cache_placement="gpu")
    with pytest.raises(InvalidArgumentError, match=r"cache_placement='device'.*is the CPU"):
        tabloader.Loader(
            table, conts=["x"], batch_size=1, device="cpu", cache="memory", cache_placement="device"
        )


def test_the_device_share_is_a_fraction(monkeypatch):
    assert device_share() == 0.5
    monkeypatch.setenv(FRACTION_ENV, "0.25")
    assert device_share() == 0.25
    for bad in ("1.5", "-1", "half"):
        monkeypatch.setenv(FRACTION_ENV, bad)
        with pytest.raises(InvalidArgumentError, match=rf"{FRACTION_ENV}='{bad}' must be"):
            device_share()


@gpu
@pytest.mark.parametrize("stop", [0, 1, 4, 7])
def test_a_cached_epoch_is_gathered_in_whole_windows_across_chunks(tmp_path, monkeypatch, stop):
    """From a cache in GPU memory, the rows after a chunk's last whole window are carried
    into the next chunk's first window: every gather is a window that ends where a batch
    does (the epoch's last but one), so no batch is joined from two gathers, with chunks
    that end inside batches, and an epoch resumed mid-way on the same loader (its first
    chunk then begins inside a batch). Batches are the CPU backend's."""
    from tabloader.backends.gpu import DeviceArrays
    from tabloader.cache import device as device_module

    batch, window = 64, 3 * 64
    monkeypatch.setattr(device_module, "DEFAULT_CHUNK_BYTES", window * 8)  # rows of 8 bytes
    options = {"cats": ["id"], "batch_size": batch, "shuffle": True, "seed": 7, "cache": "memory"}
    paths = write_dataset(tmp_path / "data", [[100, 70], [150, 130], [90, 200]])
    loader = tabloader.Loader(paths, parts_per_chunk=1, device="cuda", **options)
    cpu = tabloader.Loader(paths, parts_per_chunk=1, device="cpu", **options)
    list(loader), list(cpu)  # fill the caches
    expected = list(cpu)
    assert loader.plan(1).num_chunks == 6

    served = []
    iterator = iter(loader)
    served += [_host(next(iterator)) for _ in range(stop)]
    state = loader.state_dict()
    iterator.close()
    loader.load_state_dict(state)
    gathered: list[int] = []
    joined: list[int] = []
    gather, concatenate = device_module.DeviceCacheBackend._gather, DeviceArrays.concatenate

    def counted_gather(self, placed, rows, *helpers):
        gathered.append(len(rows))
        return gather(self, placed, rows, *helpers)

    def counted_concatenate(self, arrays, axis=0, out=None):
        joined.append(len(arrays))
        return concatenate(self, arrays, axis=axis, out=out)

    monkeypatch.setattr(device_module.DeviceCacheBackend, "_gather", counted_gather)
    monkeypatch.setattr(DeviceArrays, "concatenate", counted_concatenate)
    served += [_host(b) for b in loader]
    assert loader.stats().from_cache and loader.stats().cache_placement == "device"
    assert [len(b["id"]) for b in served] == [len(b["id"]) for b in expected]
    np.testing.assert_array_equal(
        np.concatenate([b["id"] for b in served]), np.concatenate([b["id"] for b in expected])
    )
    # the resumed epoch's rows (from the start of the chunk holding the first batch not
    # served, whose rows before that batch the batcher drops): whole windows in between
    assert sum(gathered) >= 740 - stop * batch
    assert len(gathered) >= 2 and all(n == window for n in gathered[1:-1]), gathered
    assert max(gathered) <= window + batch, gathered
    assert joined == [], joined  # the carried rows' indices are joined, not batches' blocks


@gpu
def test_a_chunk_of_several_cache_runs_is_gathered_as_on_the_cpu(tmp_path, monkeypatch):
    """Partitions are dealt into chunks anew each epoch, so a chunk's rows may lie in
    several runs of the cache (filled in another epoch's order): each position of its
    order finds its run on the device (one search), and the batches are the CPU
    backend's, epoch after epoch."""
    import cupy

    searched: list[int] = []
    search = cupy.searchsorted

    def counted(a, v, *args, **kwargs):
        searched.append(len(a))
        return search(a, v, *args, **kwargs)

    monkeypatch.setattr(cupy, "searchsorted", counted)
    options = {
        "cats": ["id"],
        "conts": ["x"],
        "batch_size": 48,
        "shuffle": True,
        "seed": 11,
        "cache": "memory",
        "parts_per_chunk": 3,
    }
    paths = write_dataset(tmp_path / "data", [[40, 30, 50], [60, 20], [70, 35, 45], [25]])
    gpu_loader = tabloader.Loader(paths, device="cuda", **options)
    cpu = tabloader.Loader(paths, device="cpu", **options)
    for _ in range(4):
        _same(list(cpu), list(gpu_loader))
    assert gpu_loader.stats().from_cache
    assert searched  # some chunk lay in two runs of the cache or more


@gpu
@pytest.mark.parametrize("threads", [1, 3])
def test_a_gpu_caches_gather_helpers_are_as_many_as_the_loaders_threads_allow(monkeypatch, threads):
    """``threads=`` sizes every pool of a loader, the helpers that gather a GPU cache's
    windows on the host too (a global shuffle from pinned memory, in windows of 2,048
    rows): with one thread the reader gathers alone, with three it has two helpers."""
    from tabloader.cache import device as device_module

    monkeypatch.setattr(device_module, "DEFAULT_CHUNK_BYTES", 16 * 1024)
    table = pa.table({"id": np.arange(8192)})
    loader = tabloader.Loader(
        table, cats=["id"], batch_size=256, shuffle="global", seed=0, device="cuda",
        cache="memory", cache_placement="host", threads=threads,
    )  # fmt: skip
    expected = sorted(range(8192))
    assert sorted(np.concatenate([b["id"].get() for b in loader]).tolist()) == expected
    helpers: set[str] = set()
    ids = []
    for batch in loader:  # served from the cache
        helpers |= {t.name for t in threading.enumerate() if t.name.startswith("tabloader-gather")}
        ids.append(batch["id"].get())
    assert sorted(np.concatenate(ids).tolist()) == expected
    assert len(helpers) == threads - 1


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("name", "value"),
    [("TABLOADER_GPU_CACHE_FRACTION", "50%"), ("TABLOADER_GPU_CACHE_RESERVE", "lots")],
)
def test_a_bad_device_cache_setting_is_refused_when_the_loader_is_built(
    tmp_path, monkeypatch, name, value
):
    """It was read when the cache was placed: after a whole epoch had been delivered."""
    monkeypatch.setenv(name, value)
    pq.write_table(pa.table({"id": np.arange(100)}), tmp_path / "a.parquet")
    with pytest.raises(tabloader.InvalidArgumentError, match=name):
        tabloader.Loader(str(tmp_path), cats=["id"], batch_size=10, cache="memory", device="cuda")
