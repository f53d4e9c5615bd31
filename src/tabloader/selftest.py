"""``tabloader selftest``: prove an install works, on the CPU or on a GPU, in one command.

It prints the environment (library versions, and on a GPU the driver and CUDA runtime),
then PASS, FAIL or SKIP for each check, on generated data that holds nulls, NaN and
infinities:

- every row exactly once per epoch, with the requested dtypes;
- on a GPU: the CPU and GPU backends deliver bit-identical batches for a seed, shuffled
  and in order, in both layouts;
- the adapter of every framework (`tabloader.frameworks`: PyTorch, Keras, JAX), when
  installed: the same values and dtypes, and PyTorch's tensors on the loader's device;
- memory flat over several epochs (device memory on a GPU, resident memory on the CPU);
- throughput as a ratio to the decode limit of the same row groups (cudf's own read on
  a GPU, pyarrow's on the CPU). It is reported, not judged: on a few hundred thousand
  generated rows it says more about the data size than about the install, and
  ``benchmarks/`` measures speed properly.

The exit code is 0 when nothing failed, 1 when a check failed, and 2 when the device
asked for cannot be used here. When cudf or cupy is the emulated stand-in used in
tabloader's own tests, the report says "emulated device" and its speed is not a GPU
figure.

Examples:
    >>> from tabloader.selftest import run_selftest
    >>> import io
    >>> out = io.StringIO()
    >>> run_selftest("cpu", rows=2_000, out=out, frameworks=())
    0
    >>> "PASS  every row exactly once" in out.getvalue()
    True
"""

from __future__ import annotations

import functools
import importlib
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import tabloader
from tabloader.device import Device, resolve_device
from tabloader.errors import TabloaderError
from tabloader.frameworks import FRAMEWORKS

__all__ = ["run_selftest"]
_CATS, _CONTS, _LABELS = ["id", "item"], ["x", "y"], ["label"]

_Result = tuple[str, str]
"""What a check found: PASS, FAIL, SKIP or INFO, and the detail."""


@dataclass
class _Check:
    name: str
    status: str  # PASS, FAIL, SKIP or INFO
    detail: str = ""


def _write_data(directory: Path, rows: int) -> list[str]:
    """Two files of several row groups; ``id`` is unique (0 to ``rows - 1``), the rest
    derive from it."""
    paths = []
    bounds = [0, rows // 2, rows]
    for f in range(2):
        ids = np.arange(bounds[f], bounds[f + 1], dtype=np.int64)
        per_file = len(ids)
        table = pa.table(
            {
                "id": ids,
                "item": pa.array(ids % 1000, mask=ids % 13 == 0),  # nulls in an int column
                "x": pa.array(_stored_x(ids), mask=ids % 11 == 0),  # nulls beside NaN, inf
                "y": (ids % 7).astype(np.float32),
                "label": (ids % 2).astype(np.int8),
            }
        )
        path = directory / f"part-{f}.parquet"
        pq.write_table(table, path, row_group_size=max(per_file // 4, 1))
        paths.append(str(path))
    return paths


def _stored_x(ids: np.ndarray) -> np.ndarray:
    """Column ``x`` as written for ``ids`` (its nulls apart): NaN and infinities among
    the numbers."""
    x = (ids / 8.0).astype(np.float64)
    x[ids % 97 == 3] = np.nan
    x[ids % 89 == 5] = np.inf
    x[ids % 83 == 7] = -np.inf
    return x


def _delivered(ids: np.ndarray) -> dict[str, np.ndarray]:
    """What the loader must deliver for the rows ``ids`` of `_write_data`'s files with
    `_options`' fills, bit for bit."""
    return {
        "id": ids,
        "item": np.where(ids % 13 == 0, 0, ids % 1000),
        "x": np.where(ids % 11 == 0, -1.0, _stored_x(ids)).astype(np.float32),
        "y": (ids % 7).astype(np.float32),
        "label": (ids % 2).astype(np.float32),
    }


def _host(array: Any) -> np.ndarray:
    if isinstance(array, np.ndarray):
        return array
    get = getattr(array, "get", None)  # cupy
    if callable(get):
        return np.asarray(get())
    return np.asarray(array.cpu().numpy() if hasattr(array, "cpu") else array)


def _epoch(loader: tabloader.Loader) -> list[dict[str, np.ndarray]]:
    return [{k: _host(v) for k, v in batch.items()} for batch in loader]


def _options(**extra: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        "cats": _CATS,
        "conts": _CONTS,
        "labels": _LABELS,
        "batch_size": 256,
        "seed": 3,
        "fill_null": {"item": 0, "x": -1.0},
        "parts_per_chunk": 2,
    }
    options.update(extra)
    return options


def _same_batches(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]]) -> str:
    """'' when identical (bit for bit, NaN included), else what differs."""
    if len(a) != len(b):
        return f"{len(a)} batches against {len(b)}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x.keys() != y.keys():
            return f"batch {i} has keys {sorted(x)} against {sorted(y)}"
        for key in x:
            if x[key].dtype != y[key].dtype or x[key].shape != y[key].shape:
                got, other = x[key], y[key]
                return (
                    f"batch {i} column {key}: {got.dtype}{got.shape} against "
                    f"{other.dtype}{other.shape}"
                )
            if x[key].tobytes() != y[key].tobytes():
                return f"batch {i} column {key} differs"
    return ""


def _check_rows(paths: list[str], device: Device, rows: int) -> _Result:
    loader = tabloader.Loader(paths, device=str(device), shuffle=True, **_options())
    batches = _epoch(loader)
    delivered = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    by_id = np.argsort(delivered["id"], kind="stable")
    ids = delivered["id"][by_id]
    if not np.array_equal(ids, np.arange(rows)):
        return "FAIL", f"{len(ids)} ids delivered of {rows}"
    expected = _delivered(ids)
    dtypes = {k: str(v.dtype) for k, v in delivered.items()}
    if dtypes != {k: str(v.dtype) for k, v in expected.items()}:
        return "FAIL", f"dtypes {dtypes}"
    for name, values in expected.items():
        got = delivered[name][by_id]
        bits = np.dtype(f"u{values.itemsize}")  # bit for bit: NaN, infinities, fills
        differ = np.flatnonzero(got.view(bits) != values.view(bits))
        if len(differ):
            i = int(differ[0])
            return "FAIL", f"row {int(ids[i])}: {name} is {got[i]}, written as {values[i]}"
    x = expected["x"]
    kept = f"{int(np.isnan(x).sum())} NaN and {int(np.isinf(x).sum())} infinities kept"
    return "PASS", f"{rows:,} rows on {device}, every value as written, {kept}"


def _check_parity(paths: list[str], device: Device) -> _Result:
    cases: list[dict[str, Any]] = [
        {"shuffle": True},
        {"shuffle": False},
        {"shuffle": True, "layout": "stacked"},
        {"shuffle": True, "drop_last": True, "global_rank": 1, "global_size": 3},
    ]
    for case in cases:
        cpu = _epoch(tabloader.Loader(paths, device="cpu", **_options(**case)))
        gpu = _epoch(tabloader.Loader(paths, device=str(device), **_options(**case)))
        differs = _same_batches(cpu, gpu)
        if differs:
            return "FAIL", f"{case}: {differs}"
    return "PASS", f"bit-identical batches in {len(cases)} setups"


def _verdict(expected: list[dict[str, np.ndarray]], got: Any, passed: str) -> _Result:
    """PASS with ``passed`` when ``got`` equals ``expected`` bit for bit, else FAIL."""
    differs = _same_batches(expected, got)
    return ("FAIL", differs) if differs else ("PASS", passed)


def _check_torch(paths: list[str], device: Device) -> _Result:
    try:
        from tabloader.torch import DLDataLoader, TorchAsyncItr
    except ImportError:
        return "SKIP", "PyTorch is not installed"
    options = _options(shuffle=True)
    cpu = _epoch(tabloader.Loader(paths, device="cpu", layout="stacked", **options))
    itr = TorchAsyncItr(paths, device=str(device), **options)
    expected = str(itr.device)
    if device.is_cuda:  # where DLPack puts the loader's memory (the host, when emulated)
        import cupy
        import torch.utils.dlpack

        expected = str(torch.utils.dlpack.from_dlpack(cupy.zeros(1)).device)
    got = []
    for x_cat, x_cont, y in DLDataLoader(itr, batch_size=None, collate_fn=lambda b: b):
        where = {str(t.device) for t in (x_cat, x_cont, y)}
        if where != {expected}:
            return "FAIL", f"tensors on {where}, expected {expected}"
        got.append({"cats": _host(x_cat), "conts": _host(x_cont), "labels": _host(y)[:, None]})
    return _verdict(cpu, got, f"tensors on {expected}, same values as the CPU")


def _check_keras(paths: list[str], device: Device) -> _Result:
    try:
        from tabloader.keras import _TENSORS, KerasSequenceLoader
    except ImportError:
        return "SKIP", "Keras or its backend is not installed"
    import keras

    ids = _TENSORS.dtypes()["cat"]  # int32 on JAX in its 32-bit mode
    keras_loader = KerasSequenceLoader(paths, device=str(device), **_options(shuffle=True))
    return _same_features(paths, ids, keras_loader, keras.ops.convert_to_numpy)


def _check_jax(paths: list[str], device: Device) -> _Result:
    try:
        from tabloader.jax import JaxLoader
        from tabloader.tensors import JaxTensors
    except ImportError:
        return "SKIP", "JAX is not installed"
    ids = JaxTensors().dtypes()["cat"]  # int32 in JAX's 32-bit mode
    jax_loader = JaxLoader(paths, device=str(device), **_options(shuffle=True))
    return _same_features(paths, ids, jax_loader, np.asarray)


def _same_features(
    paths: list[str], ids: np.dtype[Any], adapter: Iterable[Any], host: Callable[[Any], Any]
) -> _Result:
    """Whether an adapter's ``(features, labels)`` hold the CPU loader's batches, with ids
    of dtype ``ids``; ``host`` makes the framework's tensors numpy arrays."""
    cpu = _epoch(tabloader.Loader(paths, device="cpu", cat_dtype=ids, **_options(shuffle=True)))
    got = []
    for features, labels in adapter:
        batch = {name: np.asarray(host(t)) for name, t in features.items()}
        batch["label"] = np.asarray(host(labels))
        got.append(batch)
    expected = [{k: b[k] for k in sorted(b)} for b in cpu]
    return _verdict(expected, got, "same values and dtypes as the CPU")


def _memory_in_use(device: Device, loader: tabloader.Loader) -> int:
    if device.is_cuda:
        return loader.stats().device_bytes
    try:
        with open("/proc/self/statm") as statm:  # resident pages now, not the peak
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _check_memory(paths: list[str], device: Device, epochs: int = 6) -> _Result:
    loader = tabloader.Loader(paths, device=str(device), shuffle=True, **_options())
    seen = []
    for _ in range(epochs):
        for _batch in loader:
            pass
        seen.append(_memory_in_use(device, loader))
    what = "device memory" if device.is_cuda else "resident memory"
    first, last = seen[1], seen[-1]  # epoch 0 fills the pools
    detail = f"{what} after epochs 2..{epochs}: {first / 2**20:.1f} -> {last / 2**20:.1f} MiB"
    return ("FAIL" if last > first * 1.1 + 2**20 else "PASS"), detail


def _decode_limit(paths: list[str], device: Device) -> Callable[[], int]:
    columns = _CATS + _CONTS + _LABELS

    def cpu_read() -> int:
        rows = 0
        for path in paths:
            handle = pq.ParquetFile(path)
            for group in range(handle.num_row_groups):
                table = handle.read_row_group(group, columns=columns)
                for column in table.columns:
                    column.to_numpy()
                rows += table.num_rows
        return rows

    if not device.is_cuda:
        return cpu_read
    import cudf
    import cupy

    def gpu_read() -> int:
        rows = 0
        with cupy.cuda.Device(device.index):
            for path in paths:
                groups = pq.ParquetFile(path).num_row_groups
                for group in range(groups):
                    frame = cudf.read_parquet(path, columns=columns, row_groups=[[group]])
                    rows += len(frame)
            cupy.cuda.Device(device.index).synchronize()
        return rows

    return gpu_read


def _check_throughput(paths: list[str], device: Device, emulated: bool) -> _Result:
    limit = _decode_limit(paths, device)
    batch_size = max(256, min(65_536, loader_rows(paths) // 16))
    loader = tabloader.Loader(
        paths, device=str(device), shuffle=True, **_options(batch_size=batch_size)
    )

    def epoch() -> int:
        return sum(len(b["id"]) for b in loader)

    rates = {}
    for name, run in (("limit", limit), ("loader", epoch)):
        run()  # warm: page cache, pools, kernels
        started = time.perf_counter()
        rows = run()
        rates[name] = rows / (time.perf_counter() - started)
    ratio = rates["loader"] / rates["limit"]
    detail = (
        f"{ratio:.2f}x the decode limit ({rates['loader']:,.0f} against "
        f"{rates['limit']:,.0f} rows/s)"
    )
    if emulated:
        detail += "; emulated device: not a GPU figure"
    return "INFO", detail


def loader_rows(paths: list[str]) -> int:
    return sum(pq.ParquetFile(p).metadata.num_rows for p in paths)


def _is_emulated(name: str) -> bool:
    module = sys.modules.get(name)
    return bool(getattr(module, "__emulated__", False))


def _environment(device: Device) -> list[str]:
    lines = [
        f"tabloader {tabloader.__version__}, Python {platform.python_version()} "
        f"on {platform.platform()}",
        f"numpy {np.__version__}, pyarrow {pa.__version__}",
    ]
    versions = []
    packages = [name for framework in FRAMEWORKS for name in framework.packages]
    for name in [*packages, *(("cudf", "cupy", "rmm") if device.is_cuda else ())]:
        try:
            module = importlib.import_module(name)
        except Exception:
            versions.append(f"{name} not installed")
            continue
        label = " (emulated)" if getattr(module, "__emulated__", False) else ""
        versions.append(f"{name} {getattr(module, '__version__', '?')}{label}")
    lines.append(", ".join(versions))
    if device.is_cuda:
        import cupy

        runtime = cupy.cuda.runtime
        name = runtime.getDeviceProperties(device.index)["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
        lines.append(
            f"{device}: {name}, driver {runtime.driverGetVersion()}, "
            f"CUDA runtime {runtime.runtimeGetVersion()}"
        )
    return lines


_ADAPTER_CHECKS: dict[str, Callable[[list[str], Device], _Result]] = {
    "torch": _check_torch,
    "tensorflow": _check_keras,
    "jax": _check_jax,
}
"""Each framework's adapter check, by `tabloader.frameworks.Framework.name`."""


def run_selftest(
    device: str | None = None,
    *,
    rows: int = 200_000,
    out: TextIO = sys.stdout,
    frameworks: Iterable[str] | None = None,
) -> int:
    """Run the checks on ``device`` (None: the CPU); returns the exit code (0, 1 or 2).

    ``frameworks`` names the adapters to check (None: every one of
    `tabloader.frameworks.FRAMEWORKS`), each skipped where its framework is not installed.
    """
    try:
        resolved = resolve_device(device or "cpu")
    except TabloaderError as error:
        out.write(f"no usable {device} here: {error}\n")
        return 2
    emulated = resolved.is_cuda and (_is_emulated("cudf") or _is_emulated("cupy"))
    title = f"tabloader selftest on {resolved}"
    if emulated:
        title += " (emulated device: results are not GPU results)"
    out.write(title + "\n")
    for line in _environment(resolved):
        out.write(f"  {line}\n")
    checks: list[_Check] = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = _write_data(Path(tmp), rows)
        steps: list[tuple[str, Callable[[], _Result]]] = [
            ("every row exactly once", lambda: _check_rows(paths, resolved, rows))
        ]
        if resolved.is_cuda:
            steps.append(("CPU/GPU parity", lambda: _check_parity(paths, resolved)))
        for framework in FRAMEWORKS:
            if frameworks is None or framework.name in frameworks:
                check_adapter = functools.partial(_ADAPTER_CHECKS[framework.name], paths, resolved)
                steps.append((f"{framework.title} adapter", check_adapter))
        steps.append(("memory flat over epochs", lambda: _check_memory(paths, resolved)))
        steps.append(("throughput", lambda: _check_throughput(paths, resolved, emulated)))
        for name, step in steps:
            try:
                check = _Check(name, *step())
            except Exception as error:  # a crash is a failed check, reported like one
                check = _Check(name, "FAIL", f"{type(error).__name__}: {error}")
            checks.append(check)
            out.write(f"{check.status:<5} {check.name}: {check.detail}\n")
            out.flush()
    failed = [c.name for c in checks if c.status == "FAIL"]
    out.write(f"{len(failed)} failed, {sum(c.status == 'PASS' for c in checks)} passed\n")
    return 1 if failed else 0
