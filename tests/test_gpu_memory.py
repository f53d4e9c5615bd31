"""A GPU loader's streams and memory (``backends/gpu_memory.py``) beside a training step.

Memory goes back to the pool only once every stream that used it is done with it; the
loader's streams never queue behind the training step, nor the step behind the next
chunk's decode; no host wait hands a batch to PyTorch or JAX; the pool has a maximum and
its memory goes back when the loader closes or is collected; a cache in GPU memory is
placed one block at a time and gives way to the step.

The rules are checked through the emulated device's clock and race detector
(``tests/emulated_gpu``: a stream is a queue, a kernel takes time, a sleep kernel makes a
consumer slower than the loader, memory freed to a stream-ordered pool while another
stream may still use it is refused), which a real cupy does not offer: those tests skip
on a real GPU, where the GPU host run's race test checks the same.
"""

from __future__ import annotations

import gc
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader
from conftest import write_dataset

gpu = pytest.mark.gpu


def _order() -> Any:
    """The emulated device's clock and race detector; skips on a real GPU."""
    import cupy

    if not getattr(cupy, "__emulated__", False):
        pytest.skip("checked through the emulated device's clock (the GPU host run on a GPU)")
    return cupy.cuda._order


@pytest.fixture
def fresh_device() -> Iterator[None]:
    """rmm's default resource on GPU 0 and nothing of earlier tests' loaders left: the
    test sees the pool its own loader sets up, and memory it gives back."""
    import rmm

    gc.collect()
    rmm.reinitialize()
    yield
    gc.collect()


def _loader(paths: Any, **options: Any) -> tabloader.Loader:
    kwargs: dict[str, Any] = {
        "cats": ["id"],
        "conts": ["x"],
        "labels": ["label"],
        "batch_size": 64,
        "shuffle": True,
        "seed": 3,
        "device": "cuda",
        "parts_per_chunk": 1,
        "prefetch": 1,
    }
    kwargs.update(options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small row groups, on purpose
        return tabloader.Loader(paths, **kwargs)


# -- memory goes back only after every stream that used it ---------------------------------

_CONSUMER_CASES = {
    "streamed, shuffled": {},
    "streamed, in order (batches are views of chunks)": {"shuffle": False},
    "streamed, cudf.read_parquet": {"reader": "cudf"},
    "cached in GPU memory": {"cache": "memory", "cache_placement": "device"},
    "cached in pinned memory": {"cache": "memory", "cache_placement": "host"},
}


@gpu
@pytest.mark.parametrize("case", list(_CONSUMER_CASES))
def test_a_batch_goes_back_to_the_pool_only_after_the_consumers_queued_reads(
    tmp_path, monkeypatch, case
):
    """A consumer slower than the loader: each batch's reads are queued on the default
    stream behind a slow kernel, and the batch is dropped before they run. Its memory
    must not go back to the pool before they did: a stream-ordered pool hands it out
    again on the freeing stream with no wait, to the decoder of the next chunk (whose
    allocations come from rmm directly) or the next batch's gathers. The emulated device
    refuses memory freed while another stream's reads of it are not ordered before the
    freeing stream."""
    order = _order()
    options = dict(_CONSUMER_CASES[case])
    reader = options.pop("reader", None)
    if reader is not None:
        monkeypatch.setenv("TABLOADER_GPU_READER", reader)
    paths = write_dataset(tmp_path / "data", [[256, 256], [256], [256, 256, 256]])
    loader = _loader(paths, **options)
    for _ in range(3):  # streamed, or filling the cache, then served from it
        sums = []
        for batch in loader:
            order.sleep(0.001, (0, 0))  # the step before the reads runs a while
            sums.append([batch[c].sum() for c in ("id", "x", "label")])  # queued, not waited
            del batch
        totals = [sum(float(s[i].get()) for s in sums) for i in range(3)]
        ids = np.arange(1536)
        assert totals == [ids.sum(), (ids / 4.0).astype(np.float32).sum(), (ids % 2).sum()]


# -- the loader's streams and the training step do not wait for each other ------------------


@gpu
def test_the_batchers_stream_never_queues_behind_the_training_step(tmp_path):
    """The training step's kernels on the default stream (a long one here) hold up none
    of the loader's work: batches made while the step runs are complete long before it
    ends (the event of each batch handed over, on the emulated clock)."""
    order = _order()
    paths = write_dataset(tmp_path / "data", [[256] * 4, [256] * 4])
    loader = _loader(paths)
    epoch = iter(loader)
    next(epoch)
    order.sleep(1.0, (0, 0))  # the training step: a second on the default stream
    step_ends = order.ends((0, 0))
    ready = [loader.backend.xp.last_event.time for _batch in epoch]
    assert len(ready) == len(loader) - 1
    assert max(ready) < step_ends - 0.5, (max(ready), step_ends)


@gpu
def test_the_reader_waits_inside_libcudf_for_its_own_work_only(tmp_path):
    """libcudf's parquet reader waits on the host for its stream while it reads; that
    stream (the reader's) waits for nothing of the training step, so the reader thread
    is never blocked for the step's queued kernels."""
    order = _order()
    paths = write_dataset(tmp_path / "data", [[256] * 4, [256] * 4])
    loader = _loader(paths)
    before = order.host_wait_seconds()
    epoch = iter(loader)
    next(epoch)
    order.sleep(0.6, (0, 0))  # the training step
    rows = sum(len(batch["id"]) for batch in epoch)
    after = order.host_wait_seconds()
    waited = sum(
        seconds - before.get(name, 0.0)
        for name, seconds in after.items()
        if name.startswith("tabloader-reader")
    )
    assert rows == 2048 - 64
    assert waited < 0.2, f"the reader waited {waited:.2f} s on the host"


@gpu
def test_a_batch_is_handed_over_without_waiting_for_the_next_chunks_decode(tmp_path, monkeypatch):
    """The default stream waits for a batch's own gathers (and its chunk), not for the
    decode of the next chunk, which the reader has under way meanwhile (slow here: 0.3 s
    a chunk on the emulated clock): a step issued after taking a batch starts at once."""
    order = _order()
    import pylibcudf.io.parquet as plc_parquet

    read = plc_parquet.read_parquet

    def slow_read(options, stream=None, mr=None):
        import cupy

        on = cupy.cuda.Stream.null if stream is None else stream.obj
        order.sleep(0.3, on._key())  # the decode takes a while on its stream
        return read(options, stream=stream, mr=mr)

    monkeypatch.setattr(plc_parquet, "read_parquet", slow_read)
    paths = write_dataset(tmp_path / "data", [[256] * 3])
    loader = _loader(paths)
    waits = [loader.backend.xp.last_event.time - time.monotonic() for _batch in loader]
    assert len(waits) == 12
    assert max(waits) < 0.1, [round(w, 3) for w in waits]


@gpu
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_batches_reach_pytorch_and_jax_without_a_host_wait(tmp_path, framework):
    """PyTorch and JAX tell the producer their stream through DLPack, and cupy orders it
    after the batch's writes: the adapters' conversion waits for nothing on the host
    (TensorFlow is told no stream: it still waits, once a batch)."""
    order = _order()
    pytest.importorskip(framework)
    from tabloader.tensors import BatchConverter, delivered_dtypes, tensors_for

    tensors = tensors_for(framework)
    convert = BatchConverter(tensors)
    paths = write_dataset(tmp_path / "data", [[256] * 2, [256]])
    loader = _loader(
        paths,
        cats=[],
        transform=lambda batch: convert.tensors_of(convert.arrays(batch)),
        layout="columns",
    )
    convert.set_loader(loader, delivered_dtypes(tensors, {}))
    gc.collect()
    before = order.host_waits()
    batches = list(loader)
    after = order.host_waits()
    waited = {
        name: count - before.get(name, 0)
        for name, count in after.items()
        if name.startswith("tabloader")
        and count > before.get(name, 0)
        and not name.endswith("inside libcudf")
    }
    assert len(batches) == 12 and waited == {}, waited


# -- memory: a maximum, given back -----------------------------------------------------------


@gpu
@pytest.mark.usefixtures("fresh_device")
def test_the_pool_takes_at_most_its_budget_and_says_so(tmp_path, monkeypatch):
    """The pool the loader sets up has a maximum (``$TABLOADER_GPU_MEMORY``): past it, an
    allocation fails as GPUMemoryError naming the setting, never by taking the
    framework's memory."""
    import rmm

    from tabloader.errors import GPUMemoryError

    if not getattr(rmm, "__emulated__", False):
        pytest.skip("sized for the emulated device")
    monkeypatch.setenv("TABLOADER_GPU_POOL_SIZE", str(2**20))
    monkeypatch.setenv("TABLOADER_GPU_MEMORY", str(3 * 2**20))
    paths = write_dataset(tmp_path / "data", [[100_000]])  # a chunk of 3.2 MB decoded
    loader = _loader(paths, batch_size=1000)
    pool = rmm.mr.get_per_device_resource(0)
    assert type(pool).__name__ == "StatisticsResourceAdaptor"
    with pytest.raises(GPUMemoryError, match="TABLOADER_GPU_MEMORY") as raised:
        list(loader)
    assert "3,145,728 bytes" in str(raised.value)
    assert pool.get_upstream().pool_size() <= 3 * 2**20


@gpu
@pytest.mark.usefixtures("fresh_device")
@pytest.mark.parametrize("budget", ["0.3", "0.003", str(50_000_001)])
def test_a_budget_of_any_size_makes_a_pool_rmm_accepts(tmp_path, monkeypatch, budget):
    """rmm refuses pool sizes that are not multiples of 256 bytes, and an initial size
    above the maximum: a share of the device's memory, or bytes, gives neither."""
    import rmm

    monkeypatch.setenv("TABLOADER_GPU_MEMORY", budget)
    paths = write_dataset(tmp_path / "data", [[1_000]])
    loader = _loader(paths, batch_size=100)
    assert sum(len(b["id"]) for b in loader) == 1_000
    pool = rmm.mr.get_per_device_resource(0).get_upstream()
    assert pool.pool_size() % 256 == 0


@gpu
@pytest.mark.usefixtures("fresh_device")
@pytest.mark.parametrize("how", ["close", "collected"])
def test_a_loader_gives_its_gpu_memory_back(tmp_path, how):
    """After ``close()`` (or once the loader is collected) the driver has as much free
    memory as before the loader was built: the pool it set up is gone, and so is its
    cache in GPU memory. The device's resource is rmm's default again."""
    import cupy
    import rmm

    if not getattr(rmm, "__emulated__", False):
        pytest.skip("measured on the emulated device (the GPU host run measures a GPU)")
    free_before = cupy.cuda.runtime.memGetInfo()[0]  # (earlier tests' leftovers may go too)
    paths = write_dataset(tmp_path / "data", [[256] * 4, [256] * 4])
    loader = _loader(paths, cache="memory", cache_placement="device")
    for _ in range(2):
        ids = np.concatenate([batch["id"].get() for batch in loader])
        assert sorted(ids.tolist()) == list(range(2048))
    assert loader.stats().cache_placement == "device"
    assert cupy.cuda.runtime.memGetInfo()[0] < free_before
    if how == "close":
        loader.close()
        loader.close()  # twice is fine
    else:
        del loader
    gc.collect()
    assert cupy.cuda.runtime.memGetInfo()[0] >= free_before
    assert type(rmm.mr.get_per_device_resource(0)) is rmm.mr.CudaMemoryResource


@gpu
@pytest.mark.usefixtures("fresh_device")
@pytest.mark.parametrize("how", ["close", "collected"])
def test_a_loader_gives_its_page_locked_host_memory_back(tmp_path, how):
    """A cache in pinned host memory, and the pinned windows its batches are gathered
    into, are page-locked for the loader alone: after ``close()`` (or once the loader is
    collected) none of it stays locked, and none of it is left on cupy's pinned memory
    pool, which keeps what it is given back page-locked until ``free_all_blocks()``
    (``cupy/cuda/pinned_memory.pyx``): a cache's worth of RAM the system could not page
    out again."""
    import cupy

    if not getattr(cupy, "__emulated__", False):
        pytest.skip("counted on the emulated device (the GPU host run checks a GPU)")
    pinned = cupy.cuda.pinned_memory
    locked_before = pinned.locked_bytes()
    pool = cupy.get_default_pinned_memory_pool()
    free_blocks_before = pool.n_free_blocks()
    paths = write_dataset(tmp_path / "data", [[256] * 4, [256] * 4])
    loader = _loader(paths, cache="memory", cache_placement="host")
    for _ in range(3):
        ids = np.concatenate([batch["id"].get() for batch in loader])
        assert sorted(ids.tolist()) == list(range(2048))
    assert loader.stats().cache_placement == "pinned host"
    assert pinned.locked_bytes() > locked_before  # the cache, page-locked
    if how == "close":
        loader.close()
    else:
        del loader
    gc.collect()
    assert pinned.locked_bytes() == locked_before
    assert pool.n_free_blocks() == free_blocks_before


@gpu
@pytest.mark.usefixtures("fresh_device")
def test_closing_a_loader_mid_epoch_ends_the_epoch_before_its_memory_goes_back(tmp_path):
    """The pool goes back to the driver only once no epoch of the loader runs on it: the
    epoch in progress ends first (its reader would go on decoding into it)."""
    import cupy
    import rmm

    if not getattr(rmm, "__emulated__", False):
        pytest.skip("measured on the emulated device (the GPU host run measures a GPU)")
    free_before = cupy.cuda.runtime.memGetInfo()[0]
    paths = write_dataset(tmp_path / "data", [[256] * 8, [256] * 8])
    loader = _loader(paths)
    epoch = iter(loader)
    held = next(epoch)["id"].get()  # a batch copied out; the epoch goes on reading ahead
    loader.close()
    assert list(epoch) == []
    assert not [t.name for t in threading.enumerate() if t.name.startswith("tabloader-")]
    gc.collect()
    assert cupy.cuda.runtime.memGetInfo()[0] >= free_before
    assert len(held) == 64


@gpu
@pytest.mark.usefixtures("fresh_device")
def test_a_loader_used_again_after_close_takes_a_pool_and_streams_of_its_own(tmp_path):
    """close() then another epoch (the documented reuse): the epoch runs on a pool and on
    streams of its own again, not on the streams it gave back (which the next loader
    takes) nor without a pool; and a second close() gives them back too."""
    import cupy
    import rmm

    if not getattr(rmm, "__emulated__", False):
        pytest.skip("measured on the emulated device (the GPU host run measures a GPU)")
    free_before = cupy.cuda.runtime.memGetInfo()[0]
    paths = write_dataset(tmp_path / "data", [[256] * 4, [256] * 4])
    first = _loader(paths)
    expected = [batch["id"].get() for batch in first.iter_epoch(1)]
    first.close()
    again = [batch["id"].get() for batch in first.iter_epoch(1)]
    for a, b in zip(again, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    assert type(rmm.mr.get_per_device_resource(0)) is not rmm.mr.CudaMemoryResource  # a pool
    other = _loader(paths)
    mine, theirs = first.backend.xp.memory.streams, other.backend.xp.memory.streams
    assert mine is not theirs
    other.close()
    first.close()
    gc.collect()
    assert cupy.cuda.runtime.memGetInfo()[0] >= free_before
    assert type(rmm.mr.get_per_device_resource(0)) is rmm.mr.CudaMemoryResource


@gpu
@pytest.mark.usefixtures("fresh_device")
def test_free_device_memory_counts_only_what_the_driver_has_free():
    """Memory a pool holds unused serves only that pool's own allocations, and only where
    its blocks are large enough and free on the allocating stream: not counted free."""
    import cupy
    import rmm

    from tabloader.memory import free_device_memory

    pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=2**24)
    rmm.mr.set_per_device_resource(0, rmm.mr.StatisticsResourceAdaptor(pool))
    cupy.get_default_memory_pool().free_all_blocks()
    assert free_device_memory(0) == cupy.cuda.runtime.memGetInfo()[0]


# -- a cache in GPU memory ---------------------------------------------------------------------


@gpu
@pytest.mark.usefixtures("fresh_device")
def test_placing_a_cache_holds_each_block_once_on_the_device(tmp_path, monkeypatch):
    """The complete cache goes to the device one column at a time, each block straight
    into its layout: at no moment does a block exist twice there."""
    import cupy

    from tabloader.cache import device as cache_device

    if not getattr(cupy, "__emulated__", False):
        pytest.skip("counted on the emulated device")
    runtime = cupy.cuda.runtime
    peak = [0]
    original = cache_device.DeviceCacheBackend._to_device

    def measured(self, arrays):
        before = runtime._allocated(0)
        malloc = runtime.malloc

        def counting(size):
            ptr = malloc(size)
            peak[0] = max(peak[0], runtime._allocated(0) - before)
            return ptr

        monkeypatch.setattr(runtime, "malloc", counting)
        try:
            return original(self, arrays)
        finally:
            monkeypatch.setattr(runtime, "malloc", malloc)

    monkeypatch.setattr(cache_device.DeviceCacheBackend, "_to_device", measured)
    paths = write_dataset(tmp_path / "data", [[2000] * 5])
    loader = _loader(
        paths, cats=["id", "cat"], conts=["x"], cache="memory", cache_placement="device"
    )
    for _ in range(2):  # fills the cache and places it, then serves it
        ids = np.concatenate([batch["id"].get() for batch in loader])
        assert sorted(ids.tolist()) == list(range(10_000))
    assert loader.stats().cache_placement == "device"
    cache_bytes = loader.cache.nbytes
    assert cache_bytes <= peak[0] <= cache_bytes * 1.1, (peak[0], cache_bytes)


@gpu
@pytest.mark.usefixtures("fresh_device")
def test_a_cache_forced_onto_a_full_gpu_raises_gpu_memory_error(tmp_path, monkeypatch):
    """``cache_placement="device"`` on a GPU without room for the cache: GPUMemoryError
    naming the cache and the remedy, not an allocator's traceback; with ``"auto"`` the
    cache stays in pinned host memory instead, with a warning."""
    import cupy

    from tabloader.errors import CacheWarning, GPUMemoryError

    if not getattr(cupy, "__emulated__", False):
        pytest.skip("sized for the emulated device")
    paths = write_dataset(tmp_path / "data", [[20_000] * 5])
    forced = _loader(paths, cache="memory", cache_placement="device", batch_size=1000)
    auto = _loader(paths, cache="memory", cache_placement="auto", batch_size=1000)
    # the loaders' pool is taken: what is left cannot hold a cache (1.6 MB)
    used = cupy.cuda.runtime._allocated(0)
    monkeypatch.setenv("TABLOADER_EMULATED_GPU_MEMORY", str(used + 2**19))
    with pytest.raises(GPUMemoryError, match=r'decoded cache.*cache_placement="host"'):
        list(forced)
    monkeypatch.setattr(
        "tabloader.cache.device.DeviceCacheBackend._fits_on_device", lambda self: True
    )
    with pytest.warns(CacheWarning, match="pinned host memory instead"):
        ids = np.concatenate([batch["id"].get() for batch in auto])
    assert sorted(ids.tolist()) == list(range(100_000))
    assert auto.stats().cache_placement == "pinned host"


@gpu
@pytest.mark.usefixtures("fresh_device")
def test_a_cache_in_gpu_memory_gives_way_to_the_training_step(tmp_path, monkeypatch):
    """The step takes most of the GPU after the cache was placed there: the cache moves to
    pinned host memory, with a warning, its GPU memory goes back to the driver, and the
    epochs deliver the same batches."""
    import cupy

    from tabloader.errors import CacheWarning

    if not getattr(cupy, "__emulated__", False):
        pytest.skip("sized for the emulated device (the GPU host run checks a GPU)")
    monkeypatch.setenv("TABLOADER_EMULATED_GPU_MEMORY", str(2**30))
    paths = write_dataset(tmp_path / "data", [[2000] * 8])
    loader = _loader(paths, cache="memory")
    epochs = [[batch["id"].get() for batch in loader] for _ in range(2)]
    assert loader.stats().cache_placement == "device"
    placed_free = cupy.cuda.runtime.memGetInfo()[0]
    with cupy.cuda.using_allocator(None):  # the framework's allocator: the driver's memory
        step = cupy.empty(placed_free - 2**24, dtype=np.uint8)  # the step grows
    with pytest.warns(CacheWarning, match="moves to pinned host memory"):
        epochs.append([batch["id"].get() for batch in loader])
    epochs.append([batch["id"].get() for batch in loader])
    assert loader.stats().cache_placement == "pinned host"
    for served in epochs:
        assert sorted(np.concatenate(served).tolist()) == list(range(16_000))
    assert cupy.cuda.runtime.memGetInfo()[0] >= 2**24 + loader.cache.nbytes
    del step


# -- one writer of last_event ----------------------------------------------------------------


@gpu
def test_only_the_batcher_writes_last_event(tmp_path, monkeypatch):
    """``last_event`` marks the last batch handed over: the batcher thread's, never the
    reader's (which orders cudf's memory by events of its own)."""
    from tabloader.backends.gpu import DeviceArrays

    writers: list[str] = []

    class Recorded:
        def __set_name__(self, owner: type, name: str) -> None:
            self.name = "_recorded_" + name

        def __get__(self, obj: Any, owner: type) -> Any:
            return self if obj is None else obj.__dict__.get(self.name)

        def __set__(self, obj: Any, value: Any) -> None:
            writers.append(threading.current_thread().name.split("_")[0])
            obj.__dict__[self.name] = value

    recorded = Recorded()
    recorded.__set_name__(DeviceArrays, "last_event")
    monkeypatch.setattr(DeviceArrays, "last_event", recorded, raising=False)
    monkeypatch.setenv("TABLOADER_GPU_READER", "cudf")
    paths = write_dataset(tmp_path / "data", [[256] * 4])
    loader = _loader(paths)
    assert len(list(loader)) == 16
    assert set(writers) - {"MainThread"} == {"tabloader-batcher"}, writers


@gpu
def test_cudf_temporaries_go_back_to_the_default_stream_after_the_layout_read_them(
    tmp_path, monkeypatch
):
    """With ``cudf.read_parquet`` the columns are converted on the default stream (nulls
    filled) and laid out on the reader's: the converted columns go back to the default
    stream's pool only after the reader's layout read them."""
    _order()
    path = tmp_path / "nulls.parquet"
    x = pa.array([None if i % 7 == 0 else float(i) for i in range(1024)], pa.float64())
    ids = pa.array(np.arange(1024))
    pq.write_table(pa.table({"id": ids, "x": x, "label": ids}), path, row_group_size=256)
    monkeypatch.setenv("TABLOADER_GPU_READER", "cudf")
    loader = _loader([str(path)], fill_null={"x": -1.0})
    expected = sorted(np.float32(-1.0 if i % 7 == 0 else i) for i in range(1024))
    for _ in range(2):
        xs = np.concatenate([batch["x"].get() for batch in loader])
        assert sorted(xs.tolist()) == expected


@gpu
def test_a_loader_generator_finalised_in_another_thread_leaves_its_stream_alone():
    """A loader's generator may be finalised by a garbage collection in any thread. Each
    of its steps runs in the loader's scope (device, stream, allocator) and leaves it
    before yielding: closing it elsewhere leaves that thread's current stream its own.
    Held across a ``yield``, cupy's stream context was exited by the finalising thread and
    popped that thread's stack (``cupy/cuda/stream.pyx``), so another loader's reader went
    on on the legacy default stream, whose frees then raced with its own stream's copies."""
    import cupy

    from tabloader.backends.gpu_memory import scoped
    from tabloader.stages import each_step_in

    theirs, mine = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    inside = []

    def steps() -> Iterator[int]:
        for i in range(3):
            inside.append(cupy.cuda.get_current_stream().ptr)
            yield i

    def scope() -> Any:
        return scoped(cupy, 0, theirs, cupy.cuda.get_allocator())

    suspended = each_step_in(scope, steps())
    assert next(suspended) == 0 and inside == [theirs.ptr]
    assert cupy.cuda.get_current_stream().ptr == 0  # left before the yield
    seen = {}

    def elsewhere() -> None:
        with mine:
            suspended.close()  # as a collection in this thread would
            seen["stream"] = cupy.cuda.get_current_stream().ptr

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert seen == {"stream": mine.ptr}
