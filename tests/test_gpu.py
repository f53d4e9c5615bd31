"""The GPU backend: its pure parts and error paths everywhere, its device behaviour on a GPU.

Tests marked ``gpu`` run only where cudf, cupy and a CUDA GPU are present (conftest skips
them otherwise). Everything else runs on any machine; absent or broken GPU libraries are
simulated by editing ``sys.modules`` and ``sys.meta_path``, never by faking a working GPU.
"""

from __future__ import annotations

import ast
import gc
import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tabloader
from conftest import make_table, write_dataset
from tabloader import _deps as deps_module
from tabloader.backends import gpu as gpu_module
from tabloader.backends.gpu import (
    GPUMemoryError,
    GPUUnavailableError,
    as_contiguous,
    batch_device,
    chunk_rows_for_fraction,
    is_out_of_memory,
    memory_error_message,
)
from tabloader.decode.gpu import READER_ENV
from tabloader.device import DEVICE_ENV, default_device_spec, resolve_device
from tabloader.errors import InvalidArgumentError, NullValuesError, TabloaderError

SRC = str(Path(__file__).resolve().parents[1] / "src")
INSTALL_HINT = r"pip install 'tabloader\[gpu\]'"


@pytest.fixture(autouse=True)
def _fresh_probe() -> Iterator[None]:
    """Each test sees the GPU probe recomputed, and leaves no cached answer behind."""
    deps_module.gpu_usable.cache_clear()
    yield
    deps_module.gpu_usable.cache_clear()


def _table(rows: int = 10) -> pa.Table:
    ids = np.arange(rows, dtype=np.int64)
    return pa.table({"id": ids, "x": ids / 4.0, "label": (ids % 2).astype(np.int8)})


# -- simulated absence and failure of cudf / cupy --------------------------------------------


class _Refuse:
    """A meta path finder that fails the import of some modules like a broken CUDA install."""

    def __init__(self, names: set[str], error: Exception) -> None:
        self.names = names
        self.error = error

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] in self.names:
            raise self.error
        return None


def _refuse_import(monkeypatch: pytest.MonkeyPatch, name: str, error: Exception) -> None:
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setattr(sys, "meta_path", [_Refuse({name}, error), *sys.meta_path])


def _cupy_reporting(monkeypatch: pytest.MonkeyPatch, count: Any) -> None:
    """Replace cupy by a module whose only ability is to report a device count (or fail)."""

    def get_device_count() -> int:
        if isinstance(count, Exception):
            raise count
        return int(count)

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        runtime=types.SimpleNamespace(getDeviceCount=get_device_count, getDevice=lambda: 0)
    )
    monkeypatch.setitem(sys.modules, "cupy", fake)


@pytest.mark.parametrize("spec", ["cuda", "cuda:1", 0, 3, "gpu"])
def test_asking_for_the_gpu_without_cupy_says_what_to_install(monkeypatch, spec):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(GPUUnavailableError, match=rf"needs cupy.*{INSTALL_HINT}.*device='cpu'"):
        resolve_device(spec)
    with pytest.raises(GPUUnavailableError) as info:
        tabloader.Loader(_table(), cats=["id"], batch_size=2, device=spec)
    assert isinstance(info.value, ImportError)
    assert isinstance(info.value, TabloaderError)


def test_a_broken_cupy_import_is_reported_whatever_it_raises(monkeypatch):
    error = RuntimeError("CUDA driver version is insufficient for CUDA runtime version")
    _refuse_import(monkeypatch, "cupy", error)
    with pytest.raises(GPUUnavailableError) as info:
        resolve_device("cuda")
    message = str(info.value)
    assert "cupy" in message
    assert "RuntimeError: CUDA driver version is insufficient" in message
    assert "pip install 'tabloader[gpu]'" in message
    assert info.value.__cause__ is error


@pytest.mark.parametrize(
    "error",
    [ImportError("libcudf.so: cannot open shared object file"), RuntimeError("cudaErrorNoDevice")],
)
def test_a_missing_or_broken_cudf_is_reported(monkeypatch, error):
    _cupy_reporting(monkeypatch, 1)
    _refuse_import(monkeypatch, "cudf", error)
    with pytest.raises(GPUUnavailableError, match=rf"needs cudf.*{type(error).__name__}.*"):
        resolve_device("cuda")
    monkeypatch.setitem(sys.modules, "cudf", None)
    with pytest.raises(GPUUnavailableError, match=rf"needs cudf.*{INSTALL_HINT}"):
        resolve_device("cuda:0")


def test_a_failing_device_count_is_reported_before_cudf_is_imported(monkeypatch):
    _cupy_reporting(monkeypatch, RuntimeError("cudaErrorInsufficientDriver"))
    _refuse_import(monkeypatch, "cudf", AssertionError("cudf must not be imported here"))
    with pytest.raises(
        GPUUnavailableError, match=r"no usable CUDA GPU.*cudaErrorInsufficientDriver"
    ):
        resolve_device("cuda")


def test_no_visible_gpu_is_reported_with_cuda_visible_devices(monkeypatch):
    _cupy_reporting(monkeypatch, 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(GPUUnavailableError, match=r"no CUDA GPU .*CUDA_VISIBLE_DEVICES=''"):
        resolve_device("cuda")


@pytest.mark.parametrize("spec", ["cuda:5", 2, "gpu:7"])
def test_a_device_index_beyond_the_visible_gpus_is_rejected(monkeypatch, spec):
    _cupy_reporting(monkeypatch, 2)
    with pytest.raises(
        InvalidArgumentError, match=r"does not exist: 2 CUDA GPU\(s\).*cuda:0\.\.cuda:1"
    ):
        resolve_device(spec)


# -- choosing the device ---------------------------------------------------------------------


def _forbid_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    def probe() -> bool:
        raise AssertionError("the GPU was probed")

    monkeypatch.setattr(deps_module, "gpu_usable", probe)


def test_device_cpu_never_probes_for_a_gpu(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    _forbid_probe(monkeypatch)
    assert resolve_device("cpu").kind == "cpu"
    loader = tabloader.Loader(_table(), cats=["id"], batch_size=4, device="cpu")
    assert loader.backend.name == "cpu"
    assert [b["id"].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def _pretend_installed(monkeypatch: pytest.MonkeyPatch, names: set[str]) -> None:
    """Make the probe's spec lookup report ``names`` as installed, so the probe imports them."""
    import importlib.machinery
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        if name in names:
            return importlib.machinery.ModuleSpec(name, None)
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize(
    "simulate", ["cupy-absent", "cudf-absent", "cudf-broken", "no-device", "count-fails"]
)
def test_the_default_device_is_the_cpu_when_the_gpu_backend_cannot_run(monkeypatch, simulate):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    imported = []
    real_import = deps_module.import_gpu

    def import_gpu(device: int | None = None) -> Any:
        imported.append(device)
        return real_import(device)

    monkeypatch.setattr(deps_module, "import_gpu", import_gpu)
    _pretend_installed(monkeypatch, {"cupy", "cudf"})  # so the probe goes as far as importing
    if simulate == "cupy-absent":
        monkeypatch.setitem(sys.modules, "cupy", None)
    elif simulate == "cudf-absent":
        _cupy_reporting(monkeypatch, 1)
        monkeypatch.setitem(sys.modules, "cudf", None)
    elif simulate == "cudf-broken":
        _cupy_reporting(monkeypatch, 1)
        _refuse_import(monkeypatch, "cudf", RuntimeError("CUDA initialization failed"))
    elif simulate == "no-device":
        _cupy_reporting(monkeypatch, 0)
    else:
        _cupy_reporting(monkeypatch, RuntimeError("cudaErrorNoDevice"))
    assert deps_module.gpu_usable() is False
    assert imported == [None]  # the import was tried, and its failure meant "no"
    assert default_device_spec() == "cpu"
    loader = tabloader.Loader(_table(), cats=["id"], batch_size=4)
    assert loader.backend.name == "cpu"
    assert isinstance(next(iter(loader))["id"], np.ndarray)
    assert imported == [None]  # the answer is cached


def test_the_probe_imports_nothing_when_cudf_is_not_installed(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    monkeypatch.setattr(deps_module, "import_gpu", lambda device=None: pytest.fail("imported"))
    monkeypatch.setitem(sys.modules, "cudf", None)  # find_spec reports None: not installed
    assert deps_module.gpu_usable() is False
    assert default_device_spec() == "cpu"


def test_tabloader_device_selects_the_default(monkeypatch):
    _forbid_probe(monkeypatch)
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    assert default_device_spec() == "cpu"
    assert tabloader.Loader(_table(), cats=["id"], batch_size=4).backend.name == "cpu"

    monkeypatch.setenv(DEVICE_ENV, "cuda:1")
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert default_device_spec() == "cuda:1"
    with pytest.raises(GPUUnavailableError, match="needs cupy"):
        tabloader.Loader(_table(), cats=["id"], batch_size=4)

    monkeypatch.setenv(DEVICE_ENV, "tpu")
    with pytest.raises(InvalidArgumentError, match="TABLOADER_DEVICE='tpu' is not a device"):
        default_device_spec()


def test_an_explicit_device_overrides_tabloader_device(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    _forbid_probe(monkeypatch)
    assert resolve_device("cpu").kind == "cpu"


_RECORD_GPU_IMPORTS = """
import os, sys
seen = []
class Recorder:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"cudf", "cupy", "rmm", "pylibcudf", "numba", "cuda"}:
            seen.append(name)
        return None
sys.meta_path.insert(0, Recorder())
import pyarrow as pa
import tabloader
loader = tabloader.Loader(pa.table({"x": [1.0, 2.0, 3.0]}), conts=["x"], batch_size=2,
                          device=DEVICE)
assert [len(b["x"]) for b in loader] == [2, 1]
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {"cudf", "cupy", "rmm"})
print(loader.backend.name, sorted(set(seen)), loaded)
"""


def _run_recorded(device: str | None, env: dict[str, str]) -> str:
    code = _RECORD_GPU_IMPORTS.replace("DEVICE", repr(device))
    full_env = {k: v for k, v in os.environ.items() if k != DEVICE_ENV}
    full_env.update(env, PYTHONPATH=SRC)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("device", "env"), [("cpu", {}), (None, {DEVICE_ENV: "cpu"})], ids=["device-cpu", "env-cpu"]
)
def test_the_cpu_backend_never_looks_for_cudf_or_cupy(device, env):
    assert _run_recorded(device, env) == "cpu [] []"


def test_probing_for_an_absent_gpu_stack_imports_nothing():
    if importlib.util.find_spec("cupy") and importlib.util.find_spec("cudf"):
        pytest.skip("cudf and cupy are installed here: probing them imports cupy")
    name, seen, loaded = _run_recorded(None, {}).split(" ", 2)
    assert name == "cpu"
    assert loaded == "[]"  # looked up at most, never imported
    assert set(ast.literal_eval(seen)) <= {"cudf", "cupy"}


@pytest.mark.parametrize(
    "counts",
    [
        pytest.param({"current_bytes": 4096, "peak_bytes": 8192}, id="rmm-before-25-dict"),
        pytest.param(types.SimpleNamespace(current_bytes=4096, peak_bytes=8192), id="Statistics"),
    ],
)
def test_device_bytes_in_use_reads_both_forms_of_rmm_counts(counts):
    """Older rmm gives allocation counts as a dict, rmm 25 and later as a Statistics object."""
    resource = types.SimpleNamespace(allocation_counts=counts)
    mr = types.SimpleNamespace(get_per_device_resource=lambda device: resource)
    rmm = types.SimpleNamespace(mr=mr)
    assert gpu_module.device_bytes_in_use(rmm, None, 0) == 4096


# -- memory sizing and out-of-memory errors ----------------------------------------------------


def test_chunk_rows_for_fraction_fills_the_share_with_whole_batches():
    gib = 2**30
    assert chunk_rows_for_fraction(0.1, 16 * gib, 160, 65536) == 10_682_368
    assert chunk_rows_for_fraction(1, 1000, 10, 7) == 98
    assert chunk_rows_for_fraction(0.5, 1000, 10, 100) == 100  # exactly half: one batch
    assert chunk_rows_for_fraction(0.01, 1000, 10, 100) == 100  # too small: still one batch
    assert chunk_rows_for_fraction(0.5, 0, 10, 100) == 100  # nothing free: one batch, not zero


@settings(max_examples=200, deadline=None)
@given(
    fraction=st.floats(1e-6, 1.0),
    free=st.integers(0, 2**40),
    row_bytes=st.integers(1, 4096),
    batch=st.integers(1, 2**20),
)
def test_chunk_rows_is_a_whole_number_of_batches_within_the_share(fraction, free, row_bytes, batch):
    rows = chunk_rows_for_fraction(fraction, free, row_bytes, batch)
    assert rows >= batch
    assert rows % batch == 0
    if rows > batch:  # fits in the share
        assert rows * row_bytes <= fraction * free
    # and one more batch would not (up to the bytes of the row cut off at the end)
    assert (rows + batch) * row_bytes > fraction * free - row_bytes - 1


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 100, 10, 1), r"buffer_size .* in \(0, 1\], got 0"),
        ((1.5, 100, 10, 1), r"in \(0, 1\], got 1.5"),
        ((True, 100, 10, 1), r"got True"),
        (("0.1", 100, 10, 1), r"got '0.1'"),
        ((0.1, -1, 10, 1), r"free_bytes must be an integer >= 0, got -1"),
        ((0.1, 100, 0, 1), r"row_bytes must be an integer >= 1, got 0"),
        ((0.1, 100, 10, 0), r"batch_size must be an integer >= 1, got 0"),
        ((0.1, 100, 10, 2.5), r"batch_size must be an integer >= 1, got 2.5"),
    ],
)
def test_chunk_rows_for_fraction_rejects_bad_arguments(args, match):
    with pytest.raises(InvalidArgumentError, match=match):
        chunk_rows_for_fraction(*args)


class OutOfMemoryError(MemoryError):
    """Shaped like cupy.cuda.memory.OutOfMemoryError."""


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (MemoryError("std::bad_alloc: out_of_memory: RMM failure at: arena.hpp"), True),
        (OutOfMemoryError("Out of memory allocating 1,073,741,824 bytes"), True),
        (RuntimeError("parallel_for failed: cudaErrorMemoryAllocation: out of memory"), True),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
        (ValueError("out of memory"), False),
        (OSError("No such file"), False),
    ],
)
def test_is_out_of_memory_recognises_allocation_failures(error, expected):
    assert is_out_of_memory(error) is expected


def test_a_chunk_of_exactly_2_to_the_32_rows_keeps_every_image_of_its_domain():
    """A permutation of 2**32 rows has a domain of 32-bit positions, which cannot hold the
    row count itself: the images kept are those up to the last row, which they can
    (the comparison with the count overflowed)."""
    from tabloader import permutation

    images = np.array([0, 2**31, 2**32 - 1], dtype=np.uint32)
    assert (images <= permutation._last_row(2**32, np.uint32)).tolist() == [True, True, True]
    assert (images <= permutation._last_row(2**31, np.uint32)).tolist() == [True, False, False]


def test_out_of_memory_errors_become_one_error_with_the_remedy():
    cause = MemoryError("std::bad_alloc: out_of_memory: RMM failure")
    with (
        pytest.raises(GPUMemoryError) as info,
        gpu_module._out_of_memory_as_error(3, "reading a chunk of 1,000 rows"),
    ):
        raise cause
    message = str(info.value)
    assert message == memory_error_message(cause, device=3, doing="reading a chunk of 1,000 rows")
    assert message.startswith("cuda:3 ran out of memory reading a chunk of 1,000 rows")
    for remedy in ("chunk_rows=", "parts_per_chunk=", "buffer_size=", "prefetch=", "RMM pool"):
        assert remedy in message
    assert info.value.__cause__ is cause
    assert isinstance(info.value, MemoryError)
    assert isinstance(info.value, TabloaderError)
    with pytest.raises(ValueError, match="unrelated"), gpu_module._out_of_memory_as_error(0, "x"):
        raise ValueError("unrelated")


# -- hand-off helpers --------------------------------------------------------------------------


class _DeviceArray:
    """Only the DLPack device query of an array, to test how it is read."""

    def __init__(self, kind: int, index: int) -> None:
        self.device = (kind, index)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


def test_batch_device_reads_the_dlpack_device():
    assert batch_device({"x": np.zeros(3), "y": np.zeros(3)}) is None
    assert batch_device(np.zeros(2)) is None
    assert batch_device({}) is None
    assert batch_device({"x": _DeviceArray(2, 3)}) == 3  # kDLCUDA
    assert batch_device(_DeviceArray(13, 1)) == 1  # kDLCUDAManaged
    assert batch_device(_DeviceArray(3, 0)) is None  # kDLCUDAHost: pinned host memory


@pytest.mark.torch
def test_batch_device_of_torch_cpu_tensors_is_none():
    import torch

    assert batch_device({"x": torch.zeros(3)}) is None


def test_as_contiguous_copies_only_strided_arrays():
    block = np.arange(12, dtype=np.float32).reshape(4, 3)
    column = block[:, 1]
    out = as_contiguous(column)
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, [1, 4, 7, 10])
    assert as_contiguous(block) is block


# -- on a GPU ----------------------------------------------------------------------------------

gpu = pytest.mark.gpu


def _host(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    import cupy

    return {k: cupy.asnumpy(v) for k, v in batch.items()}


def _assert_same_epochs(cpu: tabloader.Loader, dev: tabloader.Loader, epochs: int = 2) -> None:
    import cupy

    assert len(cpu) == len(dev)
    for _ in range(epochs):
        cpu_batches = list(cpu)
        dev_batches = list(dev)
        assert len(cpu_batches) == len(dev_batches) == len(cpu)
        for c, d in zip(cpu_batches, dev_batches, strict=True):
            assert c.keys() == d.keys()
            for key in c:
                assert isinstance(d[key], cupy.ndarray)
                assert d[key].dtype == c[key].dtype, key
                assert d[key].shape == c[key].shape, key
                np.testing.assert_array_equal(cupy.asnumpy(d[key]), c[key])


GPU_CASES = {
    "shuffle-2-parts": {"shuffle": True, "parts_per_chunk": 2},
    "shuffle-chunk-rows": {"shuffle": True, "chunk_rows": 100},
    "ordered": {"shuffle": False, "parts_per_chunk": 3},
    "rank-1-of-3": {"shuffle": True, "global_rank": 1, "global_size": 3, "batch_size": 16},
    "drop-last": {"shuffle": True, "drop_last": True},
}


@gpu
@pytest.mark.parametrize("layout", ["columns", "stacked"])
@pytest.mark.parametrize("case", GPU_CASES.values(), ids=GPU_CASES.keys())
def test_cpu_and_gpu_deliver_identical_batches_for_a_seed(dataset_dir, layout, case):
    paths = dataset_dir([[37, 101, 5], [64], [1, 90, 33]])
    options = {
        "cats": ["id", "cat"],
        "conts": ["x"],
        "labels": ["label"],
        "batch_size": 32,
        "seed": 11,
        "layout": layout,
        **case,
    }
    cpu = tabloader.Loader(tabloader.Dataset(paths), device="cpu", **options)
    dev = tabloader.Loader(tabloader.Dataset(paths), device="cuda", **options)
    _assert_same_epochs(cpu, dev)


@gpu
def test_cpu_and_gpu_agree_on_an_in_memory_table():
    table = _table(1000)
    options = {
        "cats": ["id"],
        "conts": ["x"],
        "labels": ["label"],
        "batch_size": 64,
        "shuffle": True,
        "seed": 5,
        "parts_per_chunk": 2,
    }
    dataset = tabloader.Dataset(table, rows_per_partition=150)
    _assert_same_epochs(
        tabloader.Loader(dataset, device="cpu", **options),
        tabloader.Loader(dataset, device="cuda", **options),
    )


@gpu
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", 0])
def test_batches_live_on_the_requested_gpu(dataset_dir, spec):
    import cupy

    loader = tabloader.Loader(
        tabloader.Dataset(dataset_dir([[100, 50]])),
        cats=["id"],
        conts=["x"],
        batch_size=32,
        shuffle=True,
        seed=0,
        device=spec,
    )
    assert loader.backend.name == "cuda:0"
    for batch in loader:
        assert batch_device(batch) == 0
        assert all(isinstance(a, cupy.ndarray) and a.device.id == 0 for a in batch.values())


def _second_gpu() -> None:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two CUDA GPUs")


@gpu
@pytest.mark.parametrize("spec", ["cuda:1", 1, "current"])
def test_batches_live_on_the_second_gpu_whatever_thread_makes_them(dataset_dir, spec):
    import cupy

    _second_gpu()
    paths = dataset_dir([[100, 50], [70]])
    options = {"cats": ["id"], "conts": ["x"], "batch_size": 32, "shuffle": True, "seed": 0}
    before = cupy.cuda.runtime.getDevice()
    if spec == "current":  # "cuda" means the current device, as set per rank
        with cupy.cuda.Device(1):
            loader = tabloader.Loader(tabloader.Dataset(paths), device="cuda", **options)
    else:
        loader = tabloader.Loader(tabloader.Dataset(paths), device=spec, **options)
    assert loader.backend.name == "cuda:1"
    ids = []
    for batch in loader:  # made in the loader's threads, which start on GPU 0
        assert batch_device(batch) == 1
        assert all(a.device.id == 1 for a in batch.values())
        ids.append(cupy.asnumpy(batch["id"]))
    assert cupy.cuda.runtime.getDevice() == before
    np.testing.assert_array_equal(np.sort(np.concatenate(ids)), np.arange(220))


@gpu
@pytest.mark.torch
def test_torch_receives_tensors_on_the_batch_gpu_without_a_copy(dataset_dir):
    import cupy
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch built with CUDA")
    device = cupy.cuda.runtime.getDeviceCount() - 1  # the last GPU: not the thread default

    def to_torch(batch: dict[str, Any]) -> dict[str, Any]:
        with gpu_module.device_scope(batch_device(batch)):
            return {k: (torch.from_dlpack(v), v.data.ptr) for k, v in batch.items()}

    loader = tabloader.Loader(
        tabloader.Dataset(dataset_dir([[100, 50]])),
        cats=["id"],
        conts=["x"],
        batch_size=32,
        shuffle=True,
        seed=0,
        device=device,
        transform=to_torch,
    )
    for batch in loader:
        for tensor, pointer in batch.values():
            assert tensor.device == torch.device("cuda", device)
            assert tensor.data_ptr() == pointer


@gpu
def test_gpu_batches_make_no_host_round_trip(dataset_dir, monkeypatch):
    import cudf
    import cupy

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("device data went through the host")

    monkeypatch.setattr(tabloader.Dataset, "iter_pieces", refuse)
    monkeypatch.setattr(cupy, "asnumpy", refuse)
    for cls, names in (
        (cudf.DataFrame, ("to_pandas", "to_arrow")),
        (cudf.Series, ("to_pandas", "to_arrow", "to_numpy")),
    ):
        for name in names:
            monkeypatch.setattr(cls, name, refuse)
    if hasattr(cudf.Series, "values_host"):  # gone from newer cudf
        monkeypatch.setattr(cudf.Series, "values_host", property(refuse))
    for shuffle in (True, False):
        loader = tabloader.Loader(
            tabloader.Dataset(dataset_dir([[100, 50], [70]])),
            cats=["id", "cat"],
            conts=["x"],
            labels=["label"],
            batch_size=32,
            shuffle=shuffle,
            seed=0,
            device="cuda",
        )
        batches = list(loader)
        assert len(batches) == len(loader)
        assert all(isinstance(a, cupy.ndarray) for b in batches for a in b.values())


@pytest.fixture(params=["cudf", "pylibcudf"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str]:
    """Each parquet reader of the GPU backend: ``(module, its read function's name)``."""
    monkeypatch.setenv(READER_ENV, request.param)
    if request.param == "cudf":
        import cudf

        return cudf, "read_parquet"
    plc = pytest.importorskip("pylibcudf")
    return plc.io.parquet, "read_parquet"


@gpu
def test_a_chunk_is_one_read_even_across_files(dataset_dir, monkeypatch, reader):
    """The reader's per-call cost is paid once per chunk, not once per file or row group."""
    module, name = reader
    calls = []
    read_parquet = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return read_parquet(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    paths = dataset_dir([[40, 30], [50], [20, 10]])
    for shuffle in (True, False):
        calls.clear()
        loader = tabloader.Loader(
            paths, cats=["id"], batch_size=16, shuffle=shuffle, seed=1, device="cuda"
        )
        assert loader.backend.reader == reader[0].__name__.split(".")[0]
        ids = np.concatenate([_host(b)["id"] for b in loader])
        assert sorted(ids.tolist()) == list(range(150))
        assert len(calls) == 1  # the whole dataset is one chunk here


@gpu
def test_files_read_together_may_differ_in_columns_not_read(tmp_path):
    """One read of several files still works where the files' schemas differ elsewhere."""
    first = make_table(0, 60)
    second = make_table(60, 40).append_column("extra", pa.array(np.arange(40.0)))
    paths = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    pq.write_table(first, paths[0], row_group_size=30)
    pq.write_table(second, paths[1], row_group_size=20)
    options: dict[str, Any] = {"cats": ["id"], "conts": ["x"], "batch_size": 16, "seed": 2}
    for shuffle in (True, False):
        cpu = list(tabloader.Loader(paths, shuffle=shuffle, device="cpu", **options))
        gpu = list(tabloader.Loader(paths, shuffle=shuffle, device="cuda", **options))
        assert len(cpu) == len(gpu)
        for c, g in zip(cpu, gpu, strict=True):
            np.testing.assert_equal(_host(g), c)


@gpu
def test_a_corrupt_file_among_several_is_named(tmp_path):
    paths = write_dataset(tmp_path, [[50], [50], [50]])
    data = bytearray(Path(paths[1]).read_bytes())
    data[100:400] = bytes(300)  # column chunks of the middle file, not its footer
    Path(paths[1]).write_bytes(bytes(data))
    loader = tabloader.Loader(paths, cats=["id", "cat"], batch_size=16, device="cuda")
    with pytest.raises(TabloaderError, match=r"part-001\.parquet"):
        list(loader)


@gpu
def test_out_of_memory_while_reading_names_the_remedy(dataset_dir, monkeypatch, reader):
    def out_of_memory(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError("std::bad_alloc: out_of_memory: RMM failure")

    monkeypatch.setattr(*reader, out_of_memory)
    loader = tabloader.Loader(
        tabloader.Dataset(dataset_dir([[100, 50]])),
        cats=["id"],
        batch_size=32,
        device="cuda:0",
        parts_per_chunk=2,
    )
    expected = r"cuda:0 ran out of memory reading a chunk of 150 rows.*chunk_rows="
    with pytest.raises(GPUMemoryError, match=expected):
        list(loader)


def _write_with_nulls(path: Path) -> str:
    x = pa.array([0.5, None, 1.5, 2.5] * 25, type=pa.float64())
    table = pa.table({"id": np.arange(100, dtype=np.int64), "x": x})
    pq.write_table(table, path, row_group_size=50, write_statistics=False)  # found at read time
    return str(path)


@gpu
@pytest.mark.usefixtures("reader")
def test_nulls_fail_or_fill_exactly_as_on_the_cpu(tmp_path):
    path = _write_with_nulls(tmp_path / "nulls.parquet")
    options = {"cats": ["id"], "conts": ["x"], "batch_size": 16, "shuffle": True, "seed": 1}
    errors = []
    for device in ("cpu", "cuda"):
        with pytest.raises(NullValuesError) as info:
            list(tabloader.Loader(path, device=device, **options))
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    assert "nulls.parquet (row group" in errors[1]
    assert "fill_null={'x': 0}" in errors[1]
    _assert_same_epochs(
        tabloader.Loader(path, device="cpu", fill_null={"x": -1.0}, **options),
        tabloader.Loader(path, device="cuda", fill_null={"x": -1.0}, **options),
    )


def _loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tabloader-") and t.is_alive()]


@gpu
def test_gpu_loader_threads_end_when_the_iterator_is_closed_or_dropped(dataset_dir):
    loader = tabloader.Loader(
        tabloader.Dataset(dataset_dir([[64] * 8])),
        cats=["id"],
        batch_size=8,
        shuffle=True,
        seed=0,
        device="cuda",
        parts_per_chunk=1,
    )
    iterator = iter(loader)
    next(iterator)
    threads = iterator.threads
    iterator.close()
    assert not any(t.is_alive() for t in threads)

    for _ in loader:
        break
    gc.collect()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _loader_threads():
        time.sleep(0.05)
    assert _loader_threads() == []


@gpu
def test_the_default_device_is_the_current_gpu(monkeypatch):
    import cupy

    monkeypatch.delenv(DEVICE_ENV, raising=False)
    assert default_device_spec() == "cuda"
    loader = tabloader.Loader(_table(), cats=["id"], batch_size=4)
    assert loader.backend.name == f"cuda:{cupy.cuda.runtime.getDevice()}"
    assert isinstance(next(iter(loader))["id"], cupy.ndarray)


@gpu
def test_chunk_rows_for_device_sizes_from_free_memory():
    free = gpu_module.free_device_memory(0)
    assert free > 0
    rows = gpu_module.chunk_rows_for_device(0.1, row_bytes=100, batch_size=1024, device=0)
    assert rows % 1024 == 0
    assert rows * 100 <= 0.1 * free or rows == 1024


# -- parity: the CPU and GPU backends deliver bit-identical batches -------------------------------


def _write_awkward(directory: Path) -> list[str]:
    """Two files with nulls (int and float columns), NaN and infinities beside them."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for f, (start, rows) in enumerate([(0, 230), (230, 171)]):
        ids = np.arange(start, start + rows, dtype=np.int64)
        x = ids / 4.0
        x[ids % 7 == 1] = np.nan
        x[ids % 11 == 2] = np.inf
        x[ids % 13 == 3] = -np.inf
        table = pa.table(
            {
                "id": ids,
                "cat": pa.array((ids % 100).astype(np.int32), mask=ids % 5 == 0),
                "x": pa.array(x, mask=ids % 3 == 0),
                "y": pa.array(np.sqrt(ids).astype(np.float32)),
                "label": pa.array((ids % 2).astype(np.int8), mask=ids % 17 == 4),
            }
        )
        path = directory / f"part-{f}.parquet"
        pq.write_table(table, path, row_group_size=60)
        paths.append(str(path))
    return paths


def _bitwise_equal_epochs(cpu: tabloader.Loader, dev: tabloader.Loader, epochs: int = 2) -> None:
    import cupy

    assert len(cpu) == len(dev)
    for _ in range(epochs):
        cpu_batches, dev_batches = list(cpu), list(dev)
        assert len(cpu_batches) == len(dev_batches) == len(cpu)
        for c, d in zip(cpu_batches, dev_batches, strict=True):
            assert c.keys() == d.keys()
            for key in c:
                host = cupy.asnumpy(d[key])
                assert host.dtype == c[key].dtype and host.shape == c[key].shape, key
                assert host.tobytes() == c[key].tobytes(), key  # NaN payloads included


DTYPE_OPTIONS = [
    {},
    {"cat_dtype": "int32", "cont_dtype": "float64", "label_dtype": "float64"},
    {"cat_dtype": "uint16", "cont_dtype": "float32", "label_dtype": "int8"},
]


@gpu
@pytest.mark.parametrize("layout", ["columns", "stacked"])
@pytest.mark.parametrize("drop_last", [False, True], ids=["keep-last", "drop-last"])
@pytest.mark.parametrize("ranks", [1, 3])
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffle", "ordered"])
@pytest.mark.usefixtures("reader")
def test_cpu_and_gpu_agree_bit_for_bit_on_nulls_nan_and_infinities(
    tmp_path, layout, drop_last, ranks, shuffle
):
    paths = _write_awkward(tmp_path)
    dtypes = DTYPE_OPTIONS[(ranks + drop_last + (layout == "stacked")) % len(DTYPE_OPTIONS)]
    for rank in range(ranks):
        options = {
            "cats": ["id", "cat"],
            "conts": ["x", "y"],
            "labels": ["label"],
            "batch_size": 32,
            "seed": 5,
            "shuffle": shuffle,
            "drop_last": drop_last,
            "layout": layout,
            "global_rank": rank,
            "global_size": ranks,
            "parts_per_chunk": 2,
            "fill_null": {"cat": 7, "x": -1.5, "label": 0},
            **dtypes,
        }
        _bitwise_equal_epochs(
            tabloader.Loader(paths, device="cpu", **options),
            tabloader.Loader(paths, device="cuda", **options),
        )


@gpu
@pytest.mark.usefixtures("reader")
def test_nan_and_infinities_are_delivered_as_stored_and_only_nulls_are_filled(tmp_path):
    import cupy

    paths = _write_awkward(tmp_path)
    loader = tabloader.Loader(
        paths, conts=["x"], cats=["id"], batch_size=512, device="cuda", fill_null={"x": -1.5}
    )
    (batch,) = list(loader)
    ids, x = cupy.asnumpy(batch["id"]), cupy.asnumpy(batch["x"])
    expected = (ids / 4.0).astype(np.float32)
    expected[ids % 7 == 1] = np.nan
    expected[ids % 11 == 2] = np.inf
    expected[ids % 13 == 3] = -np.inf
    expected[ids % 3 == 0] = -1.5
    np.testing.assert_array_equal(x, expected)  # NaN where NaN was stored, nowhere else


@gpu
def test_hive_partition_directories_add_no_column_on_either_backend(tmp_path):
    directory = tmp_path / "year=2024" / "month=05"
    directory.mkdir(parents=True)
    pq.write_table(_table(50), directory / "part.parquet", row_group_size=20)
    for device in ("cpu", "cuda"):
        loader = tabloader.Loader(
            str(tmp_path), cats=["id"], conts=["x"], batch_size=64, device=device
        )
        (batch,) = list(loader)
        assert sorted(batch) == ["id", "x"], device


# -- device memory: a pool, bounded by the chunk buffer --------------------------------------


@gpu
def test_a_pool_is_set_up_once_and_spares_cudamalloc_per_batch(dataset_dir, monkeypatch):
    import rmm

    if not getattr(rmm, "__emulated__", False):
        pytest.skip("counts cudaMalloc calls of the emulated device's default resource")
    monkeypatch.delenv(gpu_module.POOL_ENV, raising=False)
    rmm.reinitialize()  # back to the default: cudaMalloc/cudaFree for every allocation
    loader = tabloader.Loader(
        tabloader.Dataset(dataset_dir([[64] * 6])),
        cats=["id", "cat"],
        conts=["x"],
        batch_size=16,
        shuffle=True,
        seed=0,
        device="cuda",
        parts_per_chunk=2,
    )
    resource = rmm.mr.get_per_device_resource(0)
    assert type(resource).__name__ == "StatisticsResourceAdaptor"
    before = rmm.mr.CudaMemoryResource.allocations
    for _ in range(3):
        batches = list(loader)
        assert len(batches) == len(loader) == 24
    assert rmm.mr.CudaMemoryResource.allocations == before  # served from the pool
    # A second loader keeps the pool already there.
    tabloader.Loader(_table(), cats=["id"], batch_size=4, device="cuda")
    assert rmm.mr.get_per_device_resource(0) is resource


@gpu
def test_a_users_own_memory_resource_is_kept(monkeypatch):
    import rmm

    monkeypatch.delenv(gpu_module.POOL_ENV, raising=False)
    rmm.reinitialize(pool_allocator=True, initial_pool_size=2**20)
    mine = rmm.mr.get_per_device_resource(0)
    tabloader.Loader(_table(), cats=["id"], batch_size=4, device="cuda")
    assert rmm.mr.get_per_device_resource(0) is mine


@gpu
def test_a_bad_pool_size_setting_is_named(monkeypatch):
    import rmm

    rmm.reinitialize()
    monkeypatch.setenv(gpu_module.POOL_ENV, "lots")
    with pytest.raises(InvalidArgumentError, match="TABLOADER_GPU_POOL_SIZE='lots'"):
        tabloader.Loader(_table(), cats=["id"], batch_size=4, device="cuda")


@gpu
def test_device_memory_is_bounded_by_the_chunk_buffer_and_flat_across_epochs(dataset_dir):
    import cupy
    import rmm

    loader = tabloader.Loader(
        tabloader.Dataset(dataset_dir([[200] * 40, [200] * 40])),
        cats=["id", "cat"],
        conts=["x"],
        labels=["label"],
        batch_size=64,
        shuffle=True,
        seed=0,
        device="cuda",
        parts_per_chunk=2,
    )
    between_epochs, peaks = [], []
    for _ in range(5):
        peak = 0
        for _batch in loader:
            peak = max(peak, loader.stats().device_bytes)
        del _batch
        gc.collect()
        between_epochs.append(gpu_module.device_bytes_in_use(rmm, cupy, 0))
        peaks.append(peak)
    assert len(set(between_epochs)) == 1, between_epochs  # nothing left behind
    decoded = 16_000 * (8 + 4 + 8 + 1)  # the dataset's columns as cudf decodes them
    assert 0 < max(peaks) < decoded / 4, (peaks, decoded)  # chunks, not the dataset


@gpu
def test_the_loader_works_on_a_non_blocking_stream_of_its_own():
    """Not the default stream: the loader neither waits for a training step's kernels nor
    holds them up (see backends/gpu.py, "Devices, streams, and the hand-off rules")."""
    import cupy

    loader = tabloader.Loader(_table(), cats=["id"], batch_size=4, device="cuda")
    stream = loader.backend.xp.stream
    assert stream is not cupy.cuda.Stream.null and stream.ptr != 0
    assert stream.device_id == loader.device.index


@gpu
@pytest.mark.parametrize("cache", [None, "memory"])
def test_a_consumer_on_a_stream_of_its_own_reads_a_batch_after_waiting_for_last_event(cache):
    """docs/gpu.md's first hand-off rule for a non-blocking stream of the consumer's own:
    after taking a batch, wait for ``last_event`` (the event of the last batch handed
    over). The emulated device refuses a read it would not order (``RaceError``), and does
    so without the wait."""
    import cupy

    rows = 4000
    loader = tabloader.Loader(
        _table(rows), cats=["id"], conts=["x"], labels=["label"], batch_size=256,
        shuffle=True, seed=0, device="cuda", cache=cache,
    )  # fmt: skip
    mine = cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.Device(loader.device.index):
        for _ in range(3):  # streamed or filling a cache, then served from it
            total = 0
            for batch in loader:
                mine.wait_event(loader.backend.xp.last_event)
                with mine:
                    total += int(batch["id"].sum().get())
                cupy.cuda.Stream.null.wait_event(mine.record())  # the second rule
            assert total == rows * (rows - 1) // 2
        if getattr(cupy, "__emulated__", False):  # the same reads, not ordered
            from cupy.cuda._order import RaceError

            from emulated_gpu.frameworks import settle

            def read_unordered() -> None:
                for batch in loader:
                    with mine:
                        batch["id"].sum()

            try:
                with pytest.raises(RaceError):
                    read_unordered()
            finally:
                settle()


# -- the self-test --------------------------------------------------------------------------------


@gpu
def test_selftest_passes_on_the_gpu_and_labels_an_emulated_device():
    import io

    import cudf

    from tabloader.selftest import run_selftest

    out = io.StringIO()
    code = run_selftest("cuda", rows=4_000, out=out)
    report = out.getvalue()
    assert code == 0, report
    assert "PASS  CPU/GPU parity" in report
    assert "PASS  every row exactly once" in report
    assert "PASS  memory flat over epochs" in report
    if getattr(cudf, "__emulated__", False):
        assert "emulated device: results are not GPU results" in report
        assert "not a GPU figure" in report


# -- cuda:N everywhere: the adapters build on the loader's GPU, not on GPU 0 ------------------


@gpu
@pytest.mark.tensorflow
def test_keras_tensors_are_built_on_the_second_gpu(dataset_dir):
    from tabloader.tensorflow import KerasSequenceLoader

    _second_gpu()
    paths = dataset_dir([[100, 50], [70]])
    loader = KerasSequenceLoader(
        paths,
        batch_size=32,
        cat_names=["id"],
        cont_names=["x"],
        label_names=["label"],
        shuffle=True,
        seed=0,
        device="cuda:1",
    )
    assert str(loader.loader.device) == "cuda:1"
    ids = [np.asarray(features["id"]) for features, _ in loader]
    np.testing.assert_array_equal(np.sort(np.concatenate(ids)), np.arange(220))


@gpu
@pytest.mark.torch
def test_torch_batches_from_the_second_gpu_with_a_kind_left_empty(dataset_dir):
    from contract_gpu import dlpack_torch_device
    from tabloader.torch import TorchAsyncItr

    _second_gpu()
    itr = TorchAsyncItr(
        dataset_dir([[100, 50]]), cats=["id"], labels=["label"], batch_size=32, device="cuda:1"
    )
    assert str(itr.loader.device) == "cuda:1"
    ids = []
    for x_cat, x_cont, y in itr:
        assert x_cont.shape == (x_cat.shape[0], 0)
        assert x_cat.device == x_cont.device == y.device
        assert x_cat.device.type == dlpack_torch_device().type
        ids.append(x_cat[:, 0].cpu().numpy())
    np.testing.assert_array_equal(np.sort(np.concatenate(ids)), np.arange(150))


@gpu
@pytest.mark.dask
def test_a_dask_frame_on_the_gpu_matches_the_cpu():
    import dask.dataframe as dd

    frame = dd.from_pandas(_table(500).to_pandas(), npartitions=4)
    options = {
        "cats": ["id"],
        "conts": ["x"],
        "labels": ["label"],
        "batch_size": 64,
        "shuffle": True,
        "seed": 2,
    }
    dataset = tabloader.Dataset(frame)
    _bitwise_equal_epochs(
        tabloader.Loader(dataset, device="cpu", **options),
        tabloader.Loader(dataset, device="cuda", **options),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2, 1000, 2**16 + 1, 2**19, 3 * 2**20 + 7])
def test_counter_permutation_on_the_device_is_the_hosts(n: int) -> None:
    import cupy

    from tabloader.permutation import counter_permutation

    keys = [2**64 - 1, 7, 2**40 + 3, 0]
    on_device = counter_permutation(n, keys, xp=cupy, block=max(1, n // 2))
    np.testing.assert_array_equal(cupy.asnumpy(on_device), counter_permutation(n, keys))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_the_feistel_network_is_one_kernel_with_the_hosts_images(dtype, monkeypatch) -> None:
    """The network of a permutation runs as one fused kernel on the device, 32- and 64-bit
    positions alike, round keys one per round or one per position, with the images numpy
    computes (on the emulated device, its launches counted too)."""
    import cupy

    from tabloader.permutation import _network

    width = 8 * np.dtype(dtype).itemsize
    half = width // 2 - 2
    positions = np.arange(0, 1 << (2 * half), (1 << (2 * half)) // 5000, dtype=dtype)
    scalars = [dtype((2**64 - 1 - 2**63 * r) % 2**width) for r in range(4)]
    per_position = [(positions * dtype(r + 3)) ^ dtype(r) for r in range(4)]
    emulated = getattr(cupy, "__emulated__", False)
    launches: list[int] = []
    if emulated:
        launch = cupy._launch
        monkeypatch.setattr(cupy, "_launch", lambda *a, **k: launches.append(1) or launch(*a, **k))
    for keys in (scalars, per_position):
        expected = _network(positions.copy(), half, keys, np)
        device_keys = [k if np.isscalar(k) else cupy.asarray(k) for k in keys]
        device_positions = cupy.asarray(positions)
        launches.clear()
        images = _network(device_positions, half, device_keys, cupy)
        assert len(launches) == (1 if emulated else 0)
        assert images.dtype == dtype
        np.testing.assert_array_equal(cupy.asnumpy(images), expected)


@pytest.mark.gpu
@settings(max_examples=60, deadline=None)
@given(
    base=st.integers(0, 3000),
    sizes=st.lists(st.sampled_from(["base", "base", "other"]), min_size=1, max_size=8),
    others=st.lists(st.integers(0, 6000), min_size=8, max_size=8),
    positions=st.sampled_from([4, 64, 4096, 1 << 22]),
    seed=st.integers(0, 2**63),
)
def test_chunk_permutations_drawn_together_on_the_device_are_each_chunks_own(
    base: int, sizes: list[str], others: list[int], positions: int, seed: int
) -> None:
    """Several chunks' permutations in one pass (chunks of one size, as an epoch's are but
    its last, and others between them) are each chunk's `counter_permutation`, the
    host's draw, whatever the group's bound."""
    import cupy

    from tabloader.permutation import chunk_keys, counter_permutation, counter_permutations

    rows = [base if s == "base" else others[i] for i, s in enumerate(sizes)]
    keys = [chunk_keys(seed=seed, epoch=1, rank=0, worker=0, chunk=c) for c in range(len(rows))]
    with cupy.cuda.Device(0):
        drawn = [
            cupy.asnumpy(o) for o in counter_permutations(rows, keys, xp=cupy, positions=positions)
        ]
    assert len(drawn) == len(rows)
    for order, n, k in zip(drawn, rows, keys, strict=True):
        assert order.dtype == np.int64
        np.testing.assert_array_equal(order, counter_permutation(n, k))


@pytest.mark.gpu
def test_a_cached_epoch_draws_its_chunks_orders_in_a_few_passes(tmp_path, monkeypatch):
    """The reader's kernel launches in a shuffled epoch from a cache in GPU memory: the
    chunks' permutations drawn together cost a few dozen launches a group, not a few
    dozen a chunk (each launch gives the GIL away and waits to take it back). Counted on
    the emulated device, whose every kernel goes through ``cupy._launch``."""
    import cupy

    if not getattr(cupy, "__emulated__", False):
        pytest.skip("kernel launches are counted by the emulated device only")
    launches: dict[str, int] = {}
    launch = cupy._launch

    def counted(*arrays, read=True):
        name = threading.current_thread().name
        launches[name] = launches.get(name, 0) + 1
        return launch(*arrays, read=read)

    rows = 40_000  # 40 chunks of one row group of 1,000 rows each
    paths = write_dataset(tmp_path / "data", [[1_000] * 10] * 4)
    loader = tabloader.Loader(
        paths, cats=["id"], conts=["x"], labels=["label"], batch_size=250, shuffle=True,
        seed=1, device="cuda", cache="memory", parts_per_chunk=1,
    )  # fmt: skip
    list(loader)  # fills the cache, and places it
    assert loader.stats().cache_placement == "device"
    monkeypatch.setattr(cupy, "_launch", counted)
    served = sorted(int(i) for b in loader for i in b["id"].get().ravel())
    assert served == list(range(rows))
    chunks = loader.plan(1).num_chunks
    assert chunks >= 40
    reader = launches["tabloader-reader"]
    # one pass for all 40 chunks (domains of 2**10 positions; the network one fused
    # kernel), then per chunk its offset, the rows carried into it joined, and its
    # window's gathers: 135 launches as counted here; with the network's rounds a kernel
    # per operation, 220; drawn chunk by chunk, about 90 a chunk (3,600)
    assert reader < 20 + 4 * chunks, (reader, chunks)


# -- what the loader's threads cost the host ---------------------------------------------------

_WAIT_CASES = {
    "streamed, shuffled": {"shuffle": True},
    "streamed, in order": {"shuffle": False},
    "cached on the device, shuffled": {"shuffle": True, "cache": "memory"},
    "cached on the device, global": {"shuffle": "global", "cache": "memory"},
    "cached on the device, in order": {"shuffle": False, "cache": "memory"},
    "cached in pinned memory, shuffled": {
        "shuffle": True,
        "cache": "memory",
        "cache_placement": "host",
    },
}


@gpu
@pytest.mark.parametrize("case", list(_WAIT_CASES))
def test_the_loaders_threads_never_wait_for_the_device(tmp_path, case):
    """A host wait (a stream or event synchronize, a copy to the host, a size the host
    must know, as for a boolean mask) costs the thread the time the device still needs
    for all the work queued before it. None of the loader's threads waits, in the epoch
    that fills a cache or in the ones after: a shuffled chunk's order is drawn on the
    device without the host learning a count, batches are handed over by events, pinned
    staging memory is let go when its copy's event says it is done. Counted by the
    emulated device (``cupy.cuda._order``), which real cupy does not offer."""
    _wait_counter()  # skips on a real GPU
    paths = write_dataset(tmp_path / "data", [[300, 300], [400], [250, 250]])
    loader = tabloader.Loader(
        paths,
        cats=["id"],
        conts=["x"],
        batch_size=64,
        parts_per_chunk=1,
        device="cuda",
        seed=4,
        **_WAIT_CASES[case],
    )
    for _ in range(3):
        chunks = loader.stats().chunks
        batches = _without_host_waits(lambda: list(loader))
        assert loader.stats().chunks - chunks >= 1
        ids = np.concatenate([b["id"].get().ravel() for b in batches])
        assert sorted(ids.tolist()) == list(range(1500))


@gpu
@pytest.mark.parametrize("cache", [None, "memory"])
def test_the_pytorch_adapter_hands_batches_over_without_host_waits(tmp_path, cache):
    """``TorchAsyncItr`` through ``DLDataLoader``: DLPack hands each batch to PyTorch on
    its stream (``stream=``), so neither the loader's threads nor the training loop
    wait for the device."""
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    _wait_counter()  # skips on a real GPU
    paths = write_dataset(tmp_path / "data", [[300, 300], [400]])
    itr = TorchAsyncItr(
        paths, cats=["id"], batch_size=64, device="cuda", shuffle=True, seed=1, cache=cache
    )
    loader = DLDataLoader(itr, batch_size=None, collate_fn=lambda batch: batch)
    for _ in range(2):
        batches = _without_host_waits(lambda: list(loader))
        ids = np.concatenate([b[0].cpu().numpy().ravel() for b in batches])  # cats, [B, 1]
        assert sorted(ids.tolist()) == list(range(1000))


@gpu
def test_the_jax_adapter_waits_once_a_batch_also_when_it_narrows_ids(tmp_path):
    """JAX in its 32-bit mode gets int64 ids narrowed to int32, each checked to fit: one
    verdict for all of a batch's id columns crosses to the host, and that wait is the
    batch's one hand-off wait (the batcher's, never the training loop's)."""
    jax = pytest.importorskip("jax")
    from tabloader.jax import JaxLoader

    _wait_counter()  # skips on a real GPU
    if jax.config.jax_enable_x64:
        pytest.skip("JAX runs in 64-bit mode here")
    table = make_table(0, 640)
    table = table.append_column("other", table["id"]).append_column("third", table["id"])
    loader = JaxLoader(
        table, cats=["id", "other", "third"], batch_size=64, device="cuda", shuffle=True, seed=2
    )
    batches, waits = _host_waits_during(lambda: list(loader))
    assert waits == {"tabloader-batcher": len(batches)} and len(batches) == 10
    features = batches[0][0]
    assert {str(features[c].dtype) for c in ("id", "other", "third")} == {"int32"}


def _wait_counter() -> Any:
    """The emulated device's count of host waits (``cupy.cuda._order``); the test is
    skipped on a real GPU, whose cupy keeps none."""
    import cupy

    order = getattr(cupy.cuda, "_order", None)
    if order is None or not hasattr(order, "host_waits"):
        pytest.skip("host waits are counted by the emulated device only")
    return order


def _host_waits_during(run: Any) -> tuple[Any, dict[str, int]]:
    """``run()``'s result, and the host waits meanwhile per thread (``tabloader-batcher``
    and the like, without the suffix that numbers a thread). The waits inside libcudf's
    parquet reader, which synchronises its stream while it reads, are left out: the
    loader cannot avoid them (`test_the_reader_waits_inside_libcudf_for_its_own_work_only`
    holds them to the reader's own work)."""
    order = _wait_counter()
    gc.collect()  # memory of earlier tests' loaders goes back now, not in this run's threads
    before = order.host_waits()
    result = run()
    after = order.host_waits()
    waits = {
        name.split("_")[0]: after[name] - before.get(name, 0)
        for name in after
        if after[name] > before.get(name, 0) and not name.endswith("inside libcudf")
    }
    return result, waits


def _without_host_waits(run: Any) -> Any:
    """``run()``'s result, checking that no thread waited for the device meanwhile."""
    result, waits = _host_waits_during(run)
    assert waits == {}, f"threads that waited for the device: {waits}"
    return result
