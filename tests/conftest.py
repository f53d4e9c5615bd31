"""Shared fixtures, and markers that skip tests whose optional dependency is missing."""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import settings

import tabloader

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Property tests check arithmetic, not speed (benchmarks/ measures that): no deadline, so
# that a loaded machine's slow first example (imports, a cold cache) is not a failure.
settings.register_profile("tabloader", deadline=None)
settings.load_profile("tabloader")
# Loaders given no device default to the GPU where one is usable; the suite's numpy-based
# checks need host arrays, so its default is the CPU (GPU tests pass device="cuda").
os.environ.setdefault("TABLOADER_DEVICE", "cpu")

# The emulated GPU stack (cupy, cudf, rmm stand-ins) must never be imported by collection:
# it would shadow the real packages for the whole session. Tests import it on purpose
# through emulated_gpu.paths.
collect_ignore = ["emulated_gpu"]


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:  # a broken install counts as missing
        return False
    return True


def _gpu_available() -> tuple[bool, str]:
    if not (_importable("cudf") and _importable("cupy")):
        return False, "needs cudf and cupy (pip install 'tabloader[gpu]') and a CUDA GPU"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False, "no CUDA GPU visible"
    except Exception as err:
        return False, f"no usable CUDA GPU: {err}"
    return True, ""


def _keras_available() -> tuple[bool, str]:
    """Keras 3 and the framework of its backend (``KERAS_BACKEND``, TensorFlow by default)."""
    if not _importable("keras"):
        return False, "needs Keras 3: pip install 'tabloader[keras]'"
    import keras

    backend = keras.backend.backend()
    if backend not in ("tensorflow", "jax", "torch") or not _importable(backend):
        return False, f"needs {backend}, Keras' backend (KERAS_BACKEND)"
    return True, ""


_REQUIREMENTS: dict[str, Callable[[], tuple[bool, str]]] = {
    "torch": lambda: (_importable("torch"), "needs PyTorch: pip install 'tabloader[torch]'"),
    "tensorflow": lambda: (
        _importable("tensorflow"),
        "needs TensorFlow: pip install 'tabloader[tensorflow]'",
    ),
    "keras": _keras_available,
    "jax": lambda: (_importable("jax"), "needs JAX: pip install 'tabloader[jax]'"),
    "dask": lambda: (
        _importable("dask.dataframe"),
        "needs dask: pip install 'tabloader[dask]'",
    ),
    "gpu": _gpu_available,
}
_checked: dict[str, tuple[bool, str]] = {}


def _emulated_gpu() -> bool:
    cudf = sys.modules.get("cudf")
    return bool(getattr(cudf, "__emulated__", False))


def pytest_report_header(config: pytest.Config) -> list[str]:
    # Keras reads KERAS_BACKEND when first imported (test_keras_backends.py runs the others)
    lines = [f"keras backend: {os.environ.get('KERAS_BACKEND', 'tensorflow')}"]
    if _importable("cudf") and _emulated_gpu():
        lines.append(
            "GPU tests run on the emulated device (tests/emulated_gpu): they check the GPU "
            "code paths, and nothing measured here is a GPU result"
        )
    return lines


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if "cudf" in sys.modules and _emulated_gpu():
        ran = len(terminalreporter.stats.get("passed", []))
        terminalreporter.write_line(
            f"GPU-marked tests ran on the emulated device ({ran} passed in all): not GPU results"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name, check in _REQUIREMENTS.items():
            if item.get_closest_marker(name) is None:
                continue
            if name not in _checked:
                _checked[name] = check()
            ok, reason = _checked[name]
            if not ok:
                item.add_marker(pytest.mark.skip(reason=reason))


def make_table(start: int, rows: int, *, seed: int = 0) -> pa.Table:
    """Rows with a unique ``id`` (start..start+rows-1) and columns derived from it.

    ``cat`` is int32, ``x`` float64, ``label`` int8: all differ from the delivered dtypes,
    so the loader's casts are exercised. Every column is a function of ``id``, so a test
    can check that a delivered row was not torn apart.
    """
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "cat": (ids % 1000).astype(np.int32),
            "x": ids.astype(np.float64) / 4.0,
            "label": (ids % 2).astype(np.int8),
        }
    )


def write_dataset(directory: Path, layout: Sequence[Sequence[int]]) -> list[str]:
    """Write one parquet file per entry of ``layout``, with row groups of the given sizes.

    Ids run across files in order, so a dataset of N rows holds ids 0..N-1.
    """
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    start = 0
    for f, row_groups in enumerate(layout):
        path = directory / f"part-{f:03d}.parquet"
        tables = []
        for rows in row_groups:
            tables.append(make_table(start, rows))
            start += rows
        with pq.ParquetWriter(path, tables[0].schema) as writer:
            for table in tables:
                writer.write_table(table, row_group_size=max(len(table), 1))
        paths.append(str(path))
    return paths


@pytest.fixture
def quiet_loader_warnings() -> Iterator[None]:
    """Silence the loader's advice about slow layouts and empty epochs, which small test
    datasets provoke on purpose (``pytest.warns`` still sees them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tabloader.PerformanceWarning)
        warnings.simplefilter("ignore", tabloader.EmptyEpochWarning)
        yield


@pytest.fixture
def dataset_dir(tmp_path: Path) -> Callable[[Sequence[Sequence[int]]], list[str]]:
    """Factory: ``dataset_dir([[100, 50], [70]])`` writes two files, three row groups."""
    counter = iter(range(1_000_000))

    def make(layout: Sequence[Sequence[int]]) -> list[str]:
        return write_dataset(tmp_path / f"ds{next(counter)}", layout)

    return make
