"""A dask_cudf DataFrame on the GPU backend: its partitions stay on the device, it gives
the CPU backend's rows and batches for a seed, and on ``cuda:N`` dask's threads compute
its partitions on GPU N.

These run where cudf imports: on a GPU with the real dask_cudf, and in CI on the
emulated device, whose ``dask_cudf`` (``tests/emulated_gpu/cudf_only``) builds real
dask-expr collections of emulated cudf partitions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tabloader

pytestmark = [pytest.mark.gpu, pytest.mark.dask]

OPTIONS: dict[str, Any] = {
    "cats": ["id", "cat"],
    "conts": ["x"],
    "labels": ["label"],
    "batch_size": 64,
    "shuffle": True,
    "seed": 11,
}
LAYOUT = [[287], [64], [233]]  # one row group per file: the files' partitions are the frame's
TOTAL = sum(map(sum, LAYOUT))


@pytest.fixture(autouse=True)
def _quiet(quiet_loader_warnings: None) -> None:
    """Every test here runs with the loader's advice silenced (see conftest)."""


@pytest.fixture
def files(dataset_dir):
    return dataset_dir(LAYOUT)


def _frame(files: list[str]) -> Any:
    import dask_cudf

    return dask_cudf.read_parquet(files, blocksize=None)  # one partition per file


def _host(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    import cupy

    return {name: cupy.asnumpy(array) for name, array in batch.items()}


def test_partitions_are_cudf_frames_that_stay_on_the_device(files, monkeypatch):
    import cudf
    import cupy

    frame = _frame(files)
    assert type(frame._meta).__module__.startswith("cudf")
    dataset = tabloader.Dataset(frame)
    assert dataset.num_partitions == 3
    loader = tabloader.Loader(dataset, device="cuda", **OPTIONS)

    def host_round_trip(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a partition went through the host")

    monkeypatch.setattr(cudf, "from_pandas", host_round_trip)
    monkeypatch.setattr(cudf.DataFrame, "to_pandas", host_round_trip)
    monkeypatch.setattr(cudf.DataFrame, "to_arrow", host_round_trip)
    seen = []
    for batch in loader:
        assert all(isinstance(a, cupy.ndarray) for a in batch.values())
        seen.append(cupy.asnumpy(batch["id"]))
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(TOTAL))


def test_the_batches_are_the_cpu_backends_for_a_seed(files):
    frame = _frame(files)
    dataset = tabloader.Dataset(frame)
    gpu = tabloader.Loader(dataset, device="cuda", **OPTIONS)
    on_cpu = tabloader.Loader(dataset, device="cpu", **OPTIONS)  # the same frame, on the host
    parquet = tabloader.Loader(files, device="cpu", **OPTIONS)  # the same rows from the files
    for epoch in range(2):
        batches = [_host(b) for b in gpu.iter_epoch(epoch)]
        for reference in (on_cpu, parquet):
            expected = list(reference.iter_epoch(epoch))
            assert len(batches) == len(expected) == -(-TOTAL // 64)
            for got, want in zip(batches, expected, strict=True):
                for name in want:
                    np.testing.assert_array_equal(got[name], want[name])
                    assert got[name].dtype == want[name].dtype


def test_a_frame_made_from_a_cudf_frame_loads_too(files):
    import cudf
    import dask_cudf

    if not hasattr(dask_cudf, "from_cudf"):
        pytest.skip("this dask_cudf has no from_cudf")
    frame = dask_cudf.from_cudf(cudf.read_parquet(files), npartitions=4)
    loader = tabloader.Loader(tabloader.Dataset(frame), device="cuda", **OPTIONS)
    ids = np.concatenate([_host(b)["id"] for b in loader])
    np.testing.assert_array_equal(np.sort(ids), np.arange(TOTAL))


def test_on_the_second_gpu_dasks_threads_compute_the_partitions_there(files):
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    computed: list[tuple[int, int]] = []

    def where(partition: Any) -> Any:
        """Runs in the dask thread computing the partition, right after it is read."""
        column = partition["id"].values
        computed.append((int(cupy.cuda.runtime.getDevice()), int(column.device.id)))
        return partition

    read = _frame(files)
    frame = read.map_partitions(where, meta=read._meta)
    dataset = tabloader.Dataset(frame)
    computed.clear()  # the partitions' lengths, computed when the Dataset was made
    loader = tabloader.Loader(dataset, device="cuda:1", **OPTIONS)
    ids = []
    for batch in loader:
        assert {a.device.id for a in batch.values()} == {1}
        ids.append(cupy.asnumpy(batch["id"]))
    np.testing.assert_array_equal(np.sort(np.concatenate(ids)), np.arange(TOTAL))
    assert len(computed) == 3
    assert set(computed) == {(1, 1)}  # current device, and where the partition's memory is


def test_the_loaders_dask_threads_are_its_computations_own(files):
    """The GPU's thread pool goes to the loader's own ``compute()`` calls, never into
    dask's configuration, which the process shares: the user's dask work (or a loader on
    another GPU) computing meanwhile sees dask's own settings."""
    import sys

    seen: list[Any] = []

    def where(partition: Any) -> Any:
        """Runs in a dask thread computing the loader's partition: what any other thread
        would see of dask's configuration now."""
        config = sys.modules["dask"].config
        seen.append((config.get("scheduler", None), config.get("pool", None)))
        return partition

    read = _frame(files)
    frame = read.map_partitions(where, meta=read._meta)
    dataset = tabloader.Dataset(frame)
    seen.clear()
    loader = tabloader.Loader(dataset, device="cuda", **OPTIONS)
    ids = np.concatenate([_host(batch)["id"] for batch in loader])
    np.testing.assert_array_equal(np.sort(ids), np.arange(TOTAL))
    assert seen == [(None, None)] * 3
