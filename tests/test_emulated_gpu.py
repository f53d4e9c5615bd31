"""The emulated GPU stack (tests/emulated_gpu): each emulated rule of cupy, rmm and cudf.

The stand-ins are imported through ``emulated_modules``, which removes them again, so
they never shadow real packages for the rest of the session.
"""

from __future__ import annotations

import gc
import itertools
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from emulated_gpu.paths import CUDF_ONLY, FULL, ROOT, emulated_modules

MIB = 2**20


@pytest.fixture
def gpu():
    """``(cupy, cudf, rmm)``, emulated; importing cudf installed rmm's cupy allocator."""
    with emulated_modules() as modules:
        yield modules


@pytest.fixture
def cupy_alone():
    """The emulated cupy without cudf: its own default memory pool allocates."""
    with emulated_modules(names=("cupy",)) as (cupy,):
        yield cupy


# -- layout and isolation ----------------------------------------------------------------------


def test_the_stack_imports_from_pythonpath_and_says_it_is_emulated():
    code = "import cudf, cupy, rmm; print(cudf.__emulated__, cupy.__emulated__, rmm.__emulated__)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(FULL)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"]


def test_cudf_only_holds_the_rapids_stand_ins_and_cupy_only_holds_cupy():
    found = sorted(p.name for p in Path(CUDF_ONLY[0]).iterdir() if p.is_dir())
    assert found == ["cudf", "dask_cudf", "pylibcudf", "rmm"]
    assert [p.name for p in Path(FULL[0]).iterdir() if p.is_dir()] == ["cupy"]
    assert (ROOT / "README.md").is_file()


def test_the_helper_leaves_no_emulated_module_behind():
    before = {m for m in sys.modules if m.split(".")[0] in {"cupy", "cudf", "rmm"}}
    path = list(sys.path)
    with emulated_modules() as (cupy, cudf, rmm):
        assert cupy.__emulated__ and cudf.__emulated__ and rmm.__emulated__
    assert {m for m in sys.modules if m.split(".")[0] in {"cupy", "cudf", "rmm"}} == before
    assert sys.path == path


# -- cupy: no implicit host conversion ----------------------------------------------------------


def test_numpy_conversion_of_a_device_array_is_refused_with_cupys_message(cupy_alone):
    a = cupy_alone.arange(4)
    with pytest.raises(TypeError, match=r"Implicit conversion to a NumPy array is not allowed"):
        np.asarray(a)
    np.testing.assert_array_equal(a.get(), [0, 1, 2, 3])
    np.testing.assert_array_equal(cupy_alone.asnumpy(a), [0, 1, 2, 3])


def test_a_fused_function_is_one_kernel_over_device_arrays(cupy_alone, monkeypatch):
    """``cupy.fuse``: over device arrays, one launch and the function's numpy results in
    new device memory; host arrays refused like a kernel's; with no device array, the
    function as it is (cupy/_core/fusion.pyx ``Fusion.__call__``). In-place operators
    write into the array, as cupy's."""
    cupy = cupy_alone

    @cupy.fuse(kernel_name="mix")
    def mix(x, y, k):
        t = x ^ y
        t *= k
        return t, t >> np.uint32(1)

    x, y = np.arange(6, dtype=np.uint32), np.full(6, 5, np.uint32)
    launches = []
    launch = cupy._launch
    monkeypatch.setattr(cupy, "_launch", lambda *a, **k: launches.append(a) or launch(*a, **k))
    t, u = mix(cupy.asarray(x), cupy.asarray(y), np.uint32(3))
    assert len(launches) == 1
    np.testing.assert_array_equal(t.get(), (x ^ y) * 3)
    np.testing.assert_array_equal(u.get(), ((x ^ y) * 3) >> 1)
    assert mix(x, y, np.uint32(3))[0].tolist() == ((x ^ y) * 3).tolist()  # numpy, as is
    with pytest.raises(TypeError, match="Unsupported type"):
        mix(cupy.asarray(x), y, np.uint32(3))
    with pytest.raises(TypeError, match="Invalid argument type"):
        mix(cupy.asarray(x), [1] * 6, np.uint32(3))
    a = cupy.asarray(x)
    view = a[2:]
    view += np.uint32(10)
    np.testing.assert_array_equal(a.get(), [0, 1, 12, 13, 14, 15])


@pytest.mark.parametrize(
    "convert",
    [float, int, bool, list, lambda a: a.tolist(), lambda a: a.item(), lambda a: [1, 2][a]],
    ids=["float", "int", "bool", "iter", "tolist", "item", "index"],
)
def test_implicit_syncs_are_refused(cupy_alone, convert):
    with pytest.raises(TypeError, match="would copy a device array to the host"):
        convert(cupy_alone.arange(3).sum() if convert is not list else cupy_alone.arange(3))


def test_numpy_functions_on_device_arrays_are_refused(cupy_alone):
    a = cupy_alone.arange(3)
    with pytest.raises(TypeError, match=r"numpy.concatenate was called with a device array"):
        np.concatenate([a, a])
    with pytest.raises(TypeError, match="Unsupported type"):
        np.arange(3) + a  # a numpy array among a ufunc's inputs, as in cupy
    np.testing.assert_array_equal((np.float32(2) * a).get(), [0, 2, 4])  # scalars are fine


def test_kernels_refuse_host_arrays(cupy_alone):
    cp = cupy_alone
    a = cp.arange(6)
    with pytest.raises(TypeError, match="Only cupy arrays can be concatenated"):
        cp.concatenate([a, np.arange(2)])
    with pytest.raises(TypeError, match="Unsupported type"):
        cp.take(a, np.array([0, 1]))
    with pytest.raises(TypeError, match="Unsupported type"):
        a + np.arange(6)
    with pytest.raises(TypeError, match="host arrays and lists as indices"):
        a[np.array([0, 1])]
    with pytest.raises(ValueError, match=r"non-scalar numpy\.ndarray cannot be used for fill"):
        a[:2] = np.array([7, 8])
    a[:2] = cp.asarray(np.array([7, 8]))  # the explicit host-to-device copy
    a[2] = np.int64(9)
    np.testing.assert_array_equal(a.get(), [7, 8, 9, 3, 4, 5])


# -- cupy: arrays, views and functions ---------------------------------------------------------


def test_slices_are_views_and_gathers_are_copies(cupy_alone):
    cp = cupy_alone
    block = cp.arange(12, dtype=cp.float32).reshape(4, 3)
    column = block[:, 1]
    assert not column.flags.c_contiguous
    assert column.data.ptr == block.data.ptr + 4
    block[2, 1] = 100
    np.testing.assert_array_equal(column.get(), [1, 4, 100, 10])
    gathered = block[cp.asarray([3, 0])]
    block[3, 0] = -1
    np.testing.assert_array_equal(gathered.get(), [[9, 10, 11], [0, 1, 2]])
    scalar = block[1, 1]
    assert isinstance(scalar, cp.ndarray) and scalar.shape == ()
    contiguous = cp.ascontiguousarray(column)
    assert contiguous.flags.c_contiguous and contiguous.data.ptr != column.data.ptr


def test_set_copies_into_contiguous_arrays_only_with_cupys_errors(cupy_alone):
    cp = cupy_alone
    block = cp.zeros((4, 3), dtype=cp.float32)
    block[1:3].set(np.ones((2, 3), np.float32))  # rows of a C-ordered block: contiguous
    np.testing.assert_array_equal(block.get().sum(axis=1), [0, 3, 3, 0])
    with pytest.raises(RuntimeError, match="Cannot set to non-contiguous array"):
        block[:, 1].set(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="float64 array cannot be set to float32 array"):
        block.set(np.ones((4, 3)))
    with pytest.raises(ValueError, match="Shape mismatch"):
        block.set(np.ones((3, 3), np.float32))
    with pytest.raises(TypeError, match=r"Only numpy\.ndarray"):
        block.set([[1.0] * 3] * 4)


def test_functions_write_into_out(cupy_alone):
    cp = cupy_alone
    a = cp.arange(10, dtype=cp.int64) * 10
    out = cp.empty(3, dtype=cp.int64)
    assert cp.take(a, cp.asarray([9, 0, 4]), out=out) is out
    np.testing.assert_array_equal(out.get(), [90, 0, 40])
    joined = cp.empty(5, dtype=cp.int64)
    assert cp.concatenate([a[:2], a[7:]], out=joined) is joined
    np.testing.assert_array_equal(joined.get(), [0, 10, 70, 80, 90])
    with pytest.raises(IndexError):  # cupy would wrap the index around; a bug either way
        cp.take(a, cp.asarray([10]))


def test_dlpack_hands_torch_the_same_memory(cupy_alone):
    torch = pytest.importorskip("torch")
    a = cupy_alone.arange(6, dtype=cupy_alone.float32).reshape(2, 3)
    assert a.__dlpack_device__() == (1, 0)  # host memory: kDLCPU, where cupy says kDLCUDA
    tensor = torch.from_dlpack(a)
    assert tensor.data_ptr() == a.data.ptr == a.__cuda_array_interface__["data"][0]
    tensor[0, 0] = 42
    assert a[0, 0].get() == 42


# -- cupy: devices, memory ---------------------------------------------------------------------


def test_mem_get_info_tracks_live_bytes_through_the_default_pool(cupy_alone):
    cp = cupy_alone
    pool = cp.get_default_memory_pool()
    free0, total = cp.cuda.runtime.memGetInfo()
    assert total == 16 * 2**30
    a = cp.empty(MIB, dtype=cp.uint8)
    assert pool.used_bytes() == MIB
    assert cp.cuda.runtime.memGetInfo()[0] == free0 - MIB
    del a
    gc.collect()
    assert pool.used_bytes() == 0 and pool.free_bytes() == MIB  # cached, as cupy's pool does
    b = cp.empty(MIB, dtype=cp.uint8)  # served from the cache
    assert cp.cuda.runtime.memGetInfo()[0] == free0 - MIB
    del b
    gc.collect()
    pool.free_all_blocks()
    assert cp.cuda.runtime.memGetInfo()[0] == free0


def test_live_arrays_never_share_memory(cupy_alone):
    cp = cupy_alone
    arrays = [cp.full(1000, i, dtype=cp.int32) for i in range(20)]
    del arrays[::2]
    gc.collect()
    arrays += [cp.full(1000, 100 + i, dtype=cp.int32) for i in range(10)]
    starts = sorted(a.data.ptr for a in arrays)
    assert all(b - a >= 4000 for a, b in itertools.pairwise(starts))
    assert [int(a[0].get()) for a in arrays] == [*range(1, 20, 2), *range(100, 110)]


def test_the_memory_size_is_a_limit(cupy_alone, monkeypatch):
    monkeypatch.setenv("TABLOADER_EMULATED_GPU_MEMORY", str(4 * MIB))
    cp = cupy_alone
    keep = cp.empty(3 * MIB, dtype=cp.uint8)
    with pytest.raises(cp.cuda.memory.OutOfMemoryError) as info:
        cp.empty(2 * MIB, dtype=cp.uint8)
    assert isinstance(info.value, MemoryError)
    assert cp.cuda.Device(0).mem_info == (MIB, 4 * MIB)
    assert cp.cuda.runtime.getDeviceProperties(0)["totalGlobalMem"] == 4 * MIB
    del keep


def test_the_current_device_is_per_thread(cupy_alone, monkeypatch):
    monkeypatch.setenv("TABLOADER_EMULATED_GPUS", "2")
    cp = cupy_alone
    assert cp.cuda.runtime.getDeviceCount() == 2
    seen = []
    with cp.cuda.Device(1):
        on_one = cp.arange(3)
        thread = threading.Thread(target=lambda: seen.append(cp.cuda.runtime.getDevice()))
        thread.start()
        thread.join()
        assert cp.cuda.runtime.getDevice() == 1
    assert seen == [0]  # a new thread starts on device 0
    assert on_one.device.id == 1 and cp.cuda.runtime.getDevice() == 0
    with pytest.raises(ValueError, match=r"array resides \(1\).*current device \(0\)"):
        on_one + 1
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="cudaErrorInvalidDevice"):
        cp.cuda.Device(2).use()


def test_no_device_makes_the_device_count_fail(cupy_alone, monkeypatch):
    monkeypatch.setenv("TABLOADER_EMULATED_GPUS", "0")
    with pytest.raises(cupy_alone.cuda.CUDARuntimeError, match="cudaErrorNoDevice"):
        cupy_alone.cuda.runtime.getDeviceCount()


def test_streams_and_events(cupy_alone):
    cp = cupy_alone
    assert cp.cuda.get_current_stream() is cp.cuda.Stream.null
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        assert cp.cuda.get_current_stream() is stream
        event = cp.cuda.Stream.null.record()
        stream.wait_event(event)
    assert event.query() and cp.cuda.get_current_stream() is cp.cuda.Stream.null


# -- rmm ------------------------------------------------------------------------------------------


def test_importing_cudf_routes_cupy_allocations_through_rmm(gpu):
    cupy, _cudf, rmm = gpu
    from rmm.allocators.cupy import rmm_cupy_allocator

    assert cupy.cuda.get_allocator() is rmm_cupy_allocator
    cuda = rmm.mr.CudaMemoryResource
    before = (cuda.allocations, cuda.deallocations)
    a = cupy.arange(1000)
    assert (cuda.allocations, cuda.deallocations) == (before[0] + 1, before[1])
    del a
    gc.collect()
    assert (cuda.allocations, cuda.deallocations) == (before[0] + 1, before[1] + 1)


def test_a_pool_serves_allocations_without_cuda_malloc(gpu):
    cupy, _cudf, rmm = gpu
    rmm.reinitialize(pool_allocator=True, initial_pool_size=4 * MIB, maximum_pool_size=8 * MIB)
    pool = rmm.mr.get_current_device_resource()
    assert isinstance(pool, rmm.mr.PoolMemoryResource) and pool.pool_size() == 4 * MIB
    assert cupy.cuda.runtime.memGetInfo()[1] - cupy.cuda.runtime.memGetInfo()[0] >= 4 * MIB
    cuda = rmm.mr.CudaMemoryResource
    before = (cuda.allocations, cuda.deallocations)
    for _ in range(20):
        batch = cupy.arange(MIB // 8)  # 1 MiB, freed before the next one
        del batch
    assert (cuda.allocations, cuda.deallocations) == before
    held = [cupy.empty(MIB, dtype=cupy.uint8) for _ in range(5)]  # grows the pool once
    assert cuda.allocations == before[0] + 1 and pool.pool_size() == 8 * MIB
    with pytest.raises(MemoryError, match="out_of_memory"):
        held.append(cupy.empty(4 * MIB, dtype=cupy.uint8))


def test_running_out_of_memory_under_rmm_is_rmms_memory_error(gpu, monkeypatch):
    monkeypatch.setenv("TABLOADER_EMULATED_GPU_MEMORY", str(2 * MIB))
    cupy, _cudf, _rmm = gpu
    with pytest.raises(MemoryError, match=r"std::bad_alloc: out_of_memory"):
        cupy.empty(3 * MIB, dtype=cupy.uint8)


def test_resources_are_per_device_and_statistics_count(gpu, monkeypatch):
    monkeypatch.setenv("TABLOADER_EMULATED_GPUS", "2")
    cupy, _cudf, rmm = gpu
    stats = rmm.mr.StatisticsResourceAdaptor(rmm.mr.CudaMemoryResource())
    rmm.mr.set_per_device_resource(1, stats)
    a = cupy.arange(10)  # device 0: not counted
    with cupy.cuda.Device(1):
        assert rmm.mr.get_current_device_resource() is stats
        b = cupy.empty(1000, dtype=cupy.uint8)
        counts = stats.allocation_counts
    assert counts.current_bytes == 1000 and counts.current_count == 1
    del b
    gc.collect()
    counts = stats.allocation_counts
    assert (counts.current_bytes, counts.peak_bytes, counts.total_count) == (0, 1000, 1)
    assert a.device.id == 0


# -- cudf -----------------------------------------------------------------------------------------


def _nan_and_null_file(path: Path) -> str:
    x = pa.array([0.5, None, float("nan"), 1.5] * 3, type=pa.float64())
    table = pa.table({"id": np.arange(12, dtype=np.int64), "x": x, "label": np.arange(12) % 2})
    pq.write_table(table, path, row_group_size=4)
    return str(path)


def test_read_parquet_keeps_nan_and_null_apart(gpu, tmp_path):
    cupy, cudf, _rmm = gpu
    frame = cudf.read_parquet(_nan_and_null_file(tmp_path / "f.parquet"))
    x = frame["x"]
    assert x.null_count == 3 and x.has_nulls  # the three NaN are values
    np.testing.assert_array_equal(x.isnull().values.get(), [False, True, True, False] * 3)
    with pytest.raises(ValueError, match="Column must have no nulls"):
        _ = x.values
    assert isinstance(frame["id"].values, cupy.ndarray)


def test_fillna_replaces_nan_as_well_as_null(gpu, tmp_path):
    _cupy, cudf, _rmm = gpu
    x = cudf.read_parquet(_nan_and_null_file(tmp_path / "f.parquet"))["x"]
    filled = x.fillna(x.dtype.type(-1.0))
    assert filled.null_count == 0
    np.testing.assert_array_equal(filled.values.get(), [0.5, -1, -1, 1.5] * 3)
    only_nan = x.iloc[2:4]  # no null in it: still a NaN
    assert only_nan.null_count == 0
    np.testing.assert_array_equal(only_nan.values.get(), [np.nan, 1.5])


def test_read_parquet_honours_columns_and_row_groups_and_adds_hive_keys(gpu, tmp_path):
    _cupy, cudf, _rmm = gpu
    (tmp_path / "day=7").mkdir()
    first = _nan_and_null_file(tmp_path / "day=7" / "a.parquet")
    second = _nan_and_null_file(tmp_path / "b.parquet")
    frame = cudf.read_parquet(
        [first, second],
        columns=["label", "id"],
        row_groups=[[2, 0], [1]],
        use_pandas_metadata=False,
    )
    assert list(frame.columns) == ["label", "id", "day"]  # a key=value directory: a column
    np.testing.assert_array_equal(frame["id"].values.get(), [8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7])
    assert str(frame["day"].dtype) == "category" and frame["day"].null_count == 4
    assert len(frame.iloc[3:9]) == 6 and len(frame[["id"]].columns) == 1


def test_read_parquet_through_a_filesystem_reads_the_whole_object(gpu, tmp_path):
    fsspec = pytest.importorskip("fsspec")
    _cupy, cudf, _rmm = gpu
    path = _nan_and_null_file(tmp_path / "f.parquet")
    fs = fsspec.filesystem("memory")
    fs.pipe("/remote/f.parquet", Path(path).read_bytes())
    frame = cudf.read_parquet(
        ["/remote/f.parquet"], columns=["id"], row_groups=[[1]], filesystem=fs
    )
    np.testing.assert_array_equal(frame["id"].values.get(), [4, 5, 6, 7])
    assert cudf._emulation_stats["remote_bytes"] == Path(path).stat().st_size


def test_file_like_objects_go_through_cudfs_fsspec_transfer(gpu, tmp_path):
    """cudf reads a file-like object through ioutils._fsspec_data_transfer, which compares
    ``bytes_per_thread >= path_or_fob.size``: a number reads the object whole, a method
    (``RangeFile.size()``) raises TypeError, as it did for remote files on a real GPU."""
    fsspec = pytest.importorskip("fsspec")
    _cupy, cudf, _rmm = gpu
    path = _nan_and_null_file(tmp_path / "f.parquet")
    fs = fsspec.filesystem("file")
    with fs.open(path, "rb") as handle:  # an fsspec file: size is a number
        assert len(cudf.read_parquet(handle, columns=["x"])) == 12

    class SizeMethod:
        def __init__(self) -> None:
            self._f = open(path, "rb")  # noqa: SIM115

        def read(self, n: int = -1) -> bytes:
            return self._f.read(n)

        def seek(self, offset: int, whence: int = 0) -> int:
            return self._f.seek(offset, whence)

        def size(self) -> int:
            return Path(path).stat().st_size

    with pytest.raises(TypeError, match="not supported between"):
        cudf.read_parquet(SizeMethod(), columns=["x"])


def test_frames_from_arrow_and_pandas(gpu):
    _cupy, cudf, _rmm = gpu
    table = pa.table({"a": pa.array([1, None, 3]), "b": pa.array([1.0, float("nan"), None])})
    frame = cudf.DataFrame.from_arrow(table)
    assert [frame[c].null_count for c in ("a", "b")] == [1, 1]
    back = frame.to_arrow()
    assert back["a"].equals(table["a"])
    assert back["b"].is_null().to_pylist() == [False, False, True]
    assert np.isnan(back["b"].to_numpy(zero_copy_only=False)[1])
    assert frame["a"].fillna(frame["a"].dtype.type(0)).values.get().tolist() == [1, 0, 3]
    np.testing.assert_array_equal(frame["b"].to_cupy(na_value=0.0).get(), [1.0, np.nan, 0.0])
    assert cudf.from_pandas(table.to_pandas())["b"].null_count == 2  # NaN as null by default


def test_list_columns_expose_leaves_and_lengths(gpu):
    _cupy, cudf, _rmm = gpu
    frame = cudf.DataFrame.from_arrow(pa.table({"l": pa.array([[1, 2], [], [3, 4, 5]])}))
    lists = frame["l"].iloc[1:3]
    np.testing.assert_array_equal(lists.list.leaves.values.get(), [3, 4, 5])
    np.testing.assert_array_equal(lists.list.len().values.get(), [0, 3])


# -- the rules real hardware enforced where an earlier stand-in was too forgiving --------------


def test_views_carry_their_base_and_copies_do_not(cupy_alone):
    """cupy sets ``base`` on views (cupy/_core/core.pyx ``_view``): code that copies views
    out of a larger buffer (``batches.detached``) then really copies on a GPU."""
    a = cupy_alone.arange(10)
    view = a[2:5].reshape(3, 1)[:, 0]
    assert view.base is a and a.base is None
    assert a[2:5].copy().base is None


def test_memory_belongs_to_the_device_it_came_from(gpu, monkeypatch):
    """cupy asks the driver for a pointer's device when rmm passes -1
    (cupy/cuda/memory.pyx UnownedMemory; rmm/allocators/cupy.py): memory of GPU 0 is
    GPU 0's whichever device is current, as a pool built on the wrong device showed."""
    cupy, _cudf, rmm = gpu
    monkeypatch.setenv("TABLOADER_EMULATED_GPUS", "2")
    pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 20)
    rmm.mr.set_per_device_resource(1, pool)  # built while GPU 0 is current: GPU 0's memory
    try:
        with cupy.cuda.Device(1):
            a = cupy.empty(16)
        assert a.device.id == 0
        with cupy.cuda.Device(1), pytest.raises(ValueError, match="Peer access is unavailable"):
            a + 1
    finally:
        rmm.mr.set_per_device_resource(1, rmm.mr.CudaMemoryResource())


def test_a_stream_belongs_to_its_device(cupy_alone, monkeypatch):
    monkeypatch.setenv("TABLOADER_EMULATED_GPUS", "2")
    with cupy_alone.cuda.Device(1):
        stream = cupy_alone.cuda.Stream(non_blocking=True)
        a = cupy_alone.arange(3)
    with stream, pytest.raises(cupy_alone.cuda.CUDARuntimeError, match="invalid resource handle"):
        a + 1  # device 0 is current


def test_work_on_a_non_blocking_stream_is_ordered_only_by_events_or_the_host(cupy_alone):
    cupy = cupy_alone
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        a = cupy.arange(4) * 2  # written on the stream
    with pytest.raises(cupy.cuda.RaceError, match="without waiting"):
        a + 1  # read on the default stream, unordered
    cupy.cuda.Stream.null.wait_event(stream.record())
    assert (a + 1).get().tolist() == [1, 3, 5, 7]
    with stream:
        b = cupy.arange(4) + 0
    stream.synchronize()
    assert b.get().tolist() == [0, 1, 2, 3]  # the host waited for it


def test_host_waits_are_counted_per_thread_and_queries_are_not_waits(cupy_alone):
    cupy = cupy_alone
    order = cupy.cuda._order
    name = threading.current_thread().name

    def waits_after(action) -> int:
        before = order.host_waits().get(name, 0)
        action()
        return order.host_waits().get(name, 0) - before

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        a = cupy.arange(6)
    event = stream.record()
    assert waits_after(lambda: (event.query(), event.done, stream.done)) == 0
    assert waits_after(event.synchronize) == 1
    assert waits_after(stream.synchronize) == 1
    assert waits_after(cupy.cuda.Device(0).synchronize) == 1
    with stream:
        assert waits_after(a.get) == 1  # a copy to the host
        assert waits_after(lambda: a[a > 2]) == 1  # the mask's count, on the host
        assert waits_after(lambda: cupy.nonzero(a)) == 1
        assert waits_after(lambda: cupy.where(a > 1)) == 1
        assert waits_after(lambda: (a[1:3], a[cupy.arange(2)], cupy.where(a > 1, a, 0))) == 0
    elsewhere = threading.Thread(target=stream.synchronize, name="another")
    before = order.host_waits().get("another", 0)
    elsewhere.start()
    elsewhere.join()
    assert order.host_waits()["another"] == before + 1


def test_a_blocking_stream_and_the_default_stream_order_each_other(cupy_alone):
    cupy = cupy_alone
    with cupy.cuda.Stream():  # blocking, as cupy's default
        a = cupy.arange(3) + 1
    assert (a + 1).get().tolist() == [2, 3, 4]


def test_memory_read_elsewhere_is_overwritten_only_after_that_read(cupy_alone):
    """A pool hands memory freed on a stream back to that stream at once: a loader that
    writes into memory its consumer read on the default stream must wait for it."""
    cupy = cupy_alone
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        batch = cupy.arange(1024) + 0
    cupy.cuda.Stream.null.wait_event(stream.record())
    _ = batch * 2  # the consumer reads it on the default stream
    with stream, pytest.raises(cupy.cuda.RaceError, match="still reads"):
        batch[...] = 0
    stream.wait_event(cupy.cuda.Stream.null.record())
    with stream:
        batch[...] = 0  # ordered after the consumer's read


def test_using_allocator_is_per_thread(cupy_alone):
    cupy = cupy_alone
    calls = []

    def counting(nbytes):
        calls.append(threading.current_thread().name)
        return cupy.cuda.memory._malloc(nbytes)

    with cupy.cuda.using_allocator(counting):
        cupy.empty(8)
        other = threading.Thread(target=cupy.empty, args=(8,), name="other")
        other.start()
        other.join()
    cupy.empty(8)
    assert calls == [threading.current_thread().name]


def test_memory_freed_on_a_destroyed_stream_breaks_the_device(gpu):
    """rmm's pool keeps freed blocks per stream and later synchronises with that stream:
    freeing memory on a stream already destroyed crashed a real GPU at a garbage
    collection; the emulated device refuses the next use instead."""
    cupy, _cudf, rmm = gpu
    from cupy.cuda import _order

    before = rmm.mr.get_current_device_resource()
    rmm.mr.set_current_device_resource(rmm.mr.PoolMemoryResource(before, 2**20))
    try:
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            kept = cupy.arange(8) + 1  # allocated on the stream
        del stream
        gc.collect()
        del kept  # freed on a stream that no longer exists
        gc.collect()
        with pytest.raises(RuntimeError, match="after that stream was destroyed"):
            cupy.arange(3) + 1
    finally:
        _order.reset()
        rmm.mr.set_current_device_resource(before)


# -- a stream is a queue with a clock -----------------------------------------------------------


def test_a_stream_is_a_queue_with_a_clock(cupy_alone):
    """A kernel queued behind a sleep ends after it; a query never blocks and says True
    only once the clock passed the event; a host wait blocks the thread until then (its
    seconds counted); another non-blocking stream's kernels run meanwhile."""
    cupy = cupy_alone
    order = cupy.cuda._order
    slow, other = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    with slow:
        a = cupy.arange(8)
    order.sleep(0.3, slow._key())
    with slow:
        b = a + 1  # queued behind the sleep
    behind = slow.record()
    with other:
        c = cupy.arange(8) * 2
    beside = other.record()
    assert behind.time - beside.time > 0.25
    assert beside.query() and not behind.query() and not slow.done
    name = threading.current_thread().name
    before = order.host_wait_seconds().get(name, 0.0)
    behind.synchronize()
    assert 0.2 < order.host_wait_seconds()[name] - before < 0.5
    assert behind.query() and slow.done
    assert b.get().tolist() == list(range(1, 9)) and c.get().tolist() == list(range(0, 16, 2))


def test_the_legacy_stream_and_the_blocking_streams_wait_for_each_others_work(cupy_alone):
    cupy = cupy_alone
    order = cupy.cuda._order
    order.sleep(0.2, (0, 0))  # on the legacy default stream
    with cupy.cuda.Stream():  # blocking: queued behind the legacy stream's work
        blocking = cupy.cuda.get_current_stream().record()
    with cupy.cuda.Stream(non_blocking=True):
        free = cupy.cuda.get_current_stream().record()
    assert blocking.time >= order.ends((0, 0)) - 1e-6
    assert free.time < blocking.time - 0.15


def test_a_wait_for_an_event_delays_the_waiting_streams_later_work(cupy_alone):
    cupy = cupy_alone
    order = cupy.cuda._order
    producer, consumer = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    order.sleep(0.2, producer._key())
    consumer.wait_event(producer.record())
    with consumer:
        cupy.arange(3)
    assert consumer.record().time >= order.ends(producer._key()) - 1e-6


# -- memory pools: a free list per stream ---------------------------------------------------


def test_cupys_pool_reuses_a_block_on_the_stream_that_freed_it_only(cupy_alone):
    """cupy keeps an arena per stream: a block freed on a stream is reused there, and not
    by another stream's allocation."""
    cupy = cupy_alone
    first, second = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    with first:
        a = cupy.empty(4096, dtype=np.uint8)
    ptr = a.data.ptr
    del a
    with second:
        b = cupy.empty(4096, dtype=np.uint8)
    with first:
        c = cupy.empty(4096, dtype=np.uint8)
    assert b.data.ptr != ptr and c.data.ptr == ptr


def _pool(rmm, size=MIB):
    mr = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=size)
    rmm.mr.set_current_device_resource(mr)
    return mr


def test_rmm_hands_a_block_back_on_its_stream_at_once_and_elsewhere_after_its_event(gpu):
    """rmm's stream-ordered pool: a block freed on a stream is the best fit of that
    stream's next allocation, with no wait; another stream takes it after waiting for the
    event the freeing stream recorded when it freed it, which orders the freeing
    stream's earlier work before the new owner's, and nothing else."""
    cupy, _cudf, rmm = gpu
    mr = _pool(rmm, 4096)  # one block: what the first stream frees is all there is
    first, second = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)

    def written(stream):
        buffer = rmm.DeviceBuffer(size=4096, stream=stream, mr=mr)
        memory = cupy.cuda.UnownedMemory(buffer.ptr, 4096, buffer, -1)
        array = cupy.ndarray((512,), np.int64, cupy.cuda.MemoryPointer(memory, 0))
        with stream:
            array[...] = 7
        return array

    a = written(first)
    ptr = a.data.ptr
    del a
    b = written(first)  # the same stream: the block back at once
    assert b.data.ptr == ptr
    del b
    c = written(second)  # another stream: after the first stream's event, no race
    assert c.data.ptr == ptr


def test_memory_freed_while_another_stream_may_still_read_it_is_refused(gpu):
    """A stream-ordered pool may hand a block freed on a stream out again at once there:
    every other stream's use of it must be ordered before the free (CUDA's stream-ordered
    allocator, and rmm's contract), else the next owner writes it under the reader's
    kernels. The emulated device refuses such a free at its next use, and says whether
    the read is still queued by the clock."""
    cupy, _cudf, rmm = gpu
    order = cupy.cuda._order
    _pool(rmm)
    loader, consumer = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    try:
        with loader:
            batch = cupy.arange(512) + 0
        consumer.wait_event(loader.record())
        order.sleep(0.2, consumer._key())
        with consumer:
            total = batch.sum()  # queued behind the sleep
        del batch  # freed on the loader's stream, the read not ordered before it
        with pytest.raises(cupy.cuda.RaceError, match="still queued"):
            cupy.arange(3) + 1
        cupy.cuda.Device(0).synchronize()  # the race's memory done with
        with loader:
            ordered = cupy.arange(512) + 0
        consumer.wait_event(loader.record())
        with consumer:
            total = ordered.sum()
        loader.wait_event(consumer.record())  # the freeing stream after the read
        del ordered
        cupy.arange(3) + 1  # nothing refused
        consumer.synchronize()
        assert int(total.get()) == 512 * 511 // 2
    finally:
        order.reset()


def test_libcudf_allocates_from_rmm_and_waits_for_its_stream(gpu, tmp_path):
    """pylibcudf's and cudf's parquet readers allocate from rmm's resource (the one given
    as ``mr``, else the current device's), never through cupy's allocator, on their
    stream, and wait on the host for that stream while they read."""
    cupy, cudf, rmm = gpu
    import pylibcudf as plc
    from rmm.pylibrmm.stream import Stream as RmmStream

    order = cupy.cuda._order
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": np.arange(1000), "b": np.ones(1000)}), path)
    counted = rmm.mr.StatisticsResourceAdaptor(_pool(rmm))
    calls = []

    def cupys(nbytes):
        calls.append(nbytes)
        return cupy.cuda.memory._malloc(nbytes)

    stream = cupy.cuda.Stream(non_blocking=True)
    name = threading.current_thread().name + " inside libcudf"
    waits = order.host_waits().get(name, 0)
    options = plc.io.parquet.ParquetReaderOptions.builder(plc.io.SourceInfo([str(path)])).build()
    with cupy.cuda.using_allocator(cupys):
        table = plc.io.parquet.read_parquet(options, stream=RmmStream(stream), mr=counted)
        frame = cudf.read_parquet(str(path))
    assert calls == []
    assert counted.allocation_counts.current_bytes >= 16_000
    assert order.host_waits()[name] == waits + 2
    assert table.column_names() == ["a", "b"] and len(frame) == 1000


# -- the frameworks' device side -----------------------------------------------------------------


def test_xla_reads_on_its_compute_stream_and_deletes_without_waiting(gpu):
    """JAX's stand-in: the import orders its ready-events stream after the producer, the
    step waits for the definition event on the compute stream, and deleting the tensor
    lets the memory go at once, its queued reads unordered with the producer's streams."""
    cupy, _cudf, rmm = gpu
    from emulated_gpu.frameworks import XlaOnGpu, sleep

    order = cupy.cuda._order
    _pool(rmm)
    xla = XlaOnGpu()
    producer = cupy.cuda.Stream(non_blocking=True)
    try:
        with producer:
            batch = cupy.arange(256) + 0
            tensor = xla.from_dlpack(batch)
        del batch  # the producer let go; the tensor holds the memory
        sleep(0.1, xla.stream)
        xla.step(tensor)  # ordered after the write through the definition event
        marker = xla.marker()
        assert not marker.is_ready()
        tensor.delete()  # PJRT's Delete: the deleter runs now, the step still queued
        with pytest.raises(cupy.cuda.RaceError, match="may still use it"):
            cupy.arange(3) + 1
        marker.block_until_ready()
        assert marker.is_ready()
    finally:
        order.reset()


def test_tensorflow_is_told_no_stream_and_reads_on_its_own(gpu):
    cupy, _cudf, _rmm = gpu
    from emulated_gpu.frameworks import TensorflowOnGpu

    _pool(_rmm)  # (rmm's default frees with cudaFree, which waits for the whole device)
    tf_gpu = TensorflowOnGpu()
    producer = cupy.cuda.Stream(non_blocking=True)
    with producer:  # exported in the loader's thread: the default stream waits for it
        batch = cupy.arange(64) + 0
        tensor = tf_gpu.from_dlpack(batch.__dlpack__())
    with pytest.raises(cupy.cuda.RaceError, match="without waiting"):
        tf_gpu.step(tensor)
    producer.synchronize()  # a host wait: the batch is complete for any stream
    tf_gpu.step(tensor)
    with pytest.raises(TypeError, match="capsule"):
        tf_gpu.from_dlpack(batch)


def test_torch_imports_on_its_current_stream_per_thread(gpu):
    cupy, _cudf, _rmm = gpu
    from emulated_gpu.frameworks import TorchOnGpu

    torch_gpu = TorchOnGpu()
    producer, mine = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    with producer:
        batch = cupy.arange(64) + 0
    seen = []
    with torch_gpu.use(mine):
        tensor = torch_gpu.from_dlpack(batch)  # mine waits for the producer
        torch_gpu.step(tensor)
        thread = threading.Thread(target=lambda: seen.append(torch_gpu.current_stream_ptr()))
        thread.start()
        thread.join()
    assert seen == [0] and torch_gpu.current_stream_ptr() == 0
    assert torch_gpu.values(tensor).tolist() == list(range(64))


def test_device_memory_freed_by_a_finalizer_inside_malloc_is_freed_after_it(cupy_alone):
    """The garbage collector may run a finalizer that frees device memory (rmm's
    DeviceBuffer, cupy's pool) on any allocation, also inside the stand-in's malloc,
    which holds the allocation tables' lock: that free waits until the lock is let go
    instead of hanging the thread on its own lock."""
    runtime = cupy_alone.cuda.runtime
    ptr = runtime.malloc(1024)
    before = runtime.memGetInfo()[0]
    done = threading.Event()

    def free_inside_malloc() -> None:
        with runtime._held:  # as malloc holds it when a collection runs a finalizer
            runtime.free(ptr)
        done.set()

    worker = threading.Thread(target=free_inside_malloc)
    worker.start()
    worker.join(timeout=10)
    assert done.is_set(), "a free inside malloc hung on the tables' own lock"
    assert runtime.memGetInfo()[0] == before + 1024
