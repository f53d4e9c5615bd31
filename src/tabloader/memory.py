"""Memory, framework-agnostic: total memory of a device, rows per chunk for a
``buffer_size`` (rows or a fraction of memory), ``TF_MEMORY_ALLOCATION`` values,
64-byte aligned buffers, and handing Arrow's cached memory back when an epoch ends.

Rows per chunk from a fraction of *free* GPU memory (the GPU backend's sizing) are
`chunk_rows_for_fraction` (`free_device_memory`: what the driver says is free);
`chunk_rows_for` sizes chunks from a fraction of *total* memory, as NVTabular's
``buffer_size`` does.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np
import pyarrow as pa

from tabloader import _deps
from tabloader.device import resolve_device
from tabloader.errors import InvalidArgumentError
from tabloader.options import int_at_least

__all__ = [
    "ALIGN",
    "address",
    "aligned_columns",
    "aligned_rows",
    "chunk_rows_for",
    "chunk_rows_for_buffer",
    "chunk_rows_for_device",
    "chunk_rows_for_fraction",
    "free_device_memory",
    "gpu_total_mb",
    "memory_limit_mb",
    "release_arrow_memory",
    "total_memory_bytes",
]

ALIGN = 64
"""TensorFlow requires 64-byte aligned tensor memory; DLPack imports must honour it."""


def total_memory_bytes(device: str | int | None = None) -> int:
    """Total memory of ``device``: host RAM for the CPU, device memory for a CUDA GPU."""
    resolved = resolve_device(device)
    if resolved.is_cuda:
        cupy = _deps.require("cupy")
        return int(cupy.cuda.Device(resolved.index).mem_info[1])
    psutil = _deps.optional("psutil")
    if psutil is not None:
        return int(psutil.virtual_memory().total)
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        raise InvalidArgumentError(
            "cannot read this machine's total memory (install psutil), so buffer_size cannot "
            "be a fraction: give it as a number of rows instead"
        ) from None


def chunk_rows_for(
    buffer_size: object, *, row_bytes: int, batch_size: int, device: str | int | None = None
) -> int:
    """Rows per chunk for ``buffer_size``: rows (an int) or a fraction of total memory.

    Examples:
        >>> chunk_rows_for(100_000, row_bytes=40, batch_size=1024)
        100000
        >>> chunk_rows_for(0.5, row_bytes=40, batch_size=1024) == total_memory_bytes() // 2 // 40
        True
    """
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, Real):
        raise InvalidArgumentError(
            f"buffer_size must be a number of rows (int) or a fraction of memory in (0, 1), "
            f"got {buffer_size!r}"
        )
    if isinstance(buffer_size, Integral):
        if buffer_size < 1:
            raise InvalidArgumentError(
                f"buffer_size in rows must be at least 1, got {buffer_size!r}"
            )
        return max(int(buffer_size), 1)
    fraction = float(buffer_size)
    if not 0.0 < fraction < 1.0:
        raise InvalidArgumentError(
            f"buffer_size must be a fraction of memory in (0, 1) or a whole number of rows "
            f"(an int), got {buffer_size!r}"
        )
    rows = int(fraction * total_memory_bytes(device)) // row_bytes
    return max(rows, batch_size)


def chunk_rows_for_buffer(
    buffer_size: object, options: Mapping[str, Any], batch_size: object, device: Any = None
) -> int:
    """Rows per chunk for NVTabular's ``buffer_size``, given a loader's ``options``.

    The columns the options name (either spelling), delivered as int64 cats and float32
    conts and labels, turn a fraction of memory into rows; with ``parts_per_chunk``, as
    NVTabular reads them, a chunk holds that many parts of that size.

    Examples:
        >>> chunk_rows_for_buffer(500, {"cats": "a", "cont_names": ["b"]}, 8)
        500
        >>> chunk_rows_for_buffer(500, {"cats": "a", "parts_per_chunk": 2}, 8)
        1000
    """
    if options.get("chunk_rows") is not None:
        raise InvalidArgumentError("buffer_size and chunk_rows both size chunks: give one")
    parts = options.get("parts_per_chunk")
    parts = 1 if parts is None else int_at_least(parts, 1, "parts_per_chunk")
    widths = {"cat": 8, "cont": 4, "label": 4}
    row_bytes = 0
    for kind, width in widths.items():
        names = options.get(f"{kind}s") or options.get(f"{kind}_names")
        row_bytes += width * (1 if isinstance(names, str) else len(names or ()))
    return parts * chunk_rows_for(
        buffer_size,
        row_bytes=max(row_bytes, 1),
        batch_size=batch_size if isinstance(batch_size, int) else 1,
        device=device,
    )


def memory_limit_mb(value: str, *, total_mb: float | None) -> int:
    """Megabytes for a ``TF_MEMORY_ALLOCATION`` value: below 1 a fraction of ``total_mb``.

    Examples:
        >>> memory_limit_mb("0.5", total_mb=16000), memory_limit_mb("8192", total_mb=None)
        (8000, 8192)
    """
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not number > 0 or math.isinf(number):
        raise InvalidArgumentError(
            f"TF_MEMORY_ALLOCATION must be a fraction of GPU memory in (0, 1) or a number of "
            f"megabytes, got {value!r}; for example TF_MEMORY_ALLOCATION=0.5 or 8192"
        )
    if number >= 1:
        return int(number)
    if total_mb is None:
        raise InvalidArgumentError(
            f"TF_MEMORY_ALLOCATION={value!r} is a fraction, but the GPU's memory size is "
            "unknown (install cupy or nvidia-ml-py); give it in megabytes instead"
        )
    return int(number * total_mb)


def gpu_total_mb(index: int) -> float | None:
    """Total memory of CUDA device ``index`` in MiB (cupy, else NVML), None if unknown."""
    try:
        import cupy

        return float(cupy.cuda.runtime.getDeviceProperties(index)["totalGlobalMem"]) / 2**20
    except Exception:
        pass
    try:
        pynvml = _deps.optional("pynvml")
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return float(pynvml.nvmlDeviceGetMemoryInfo(handle).total) / 2**20
    except Exception:
        return None


def free_device_memory(device: int | None = None) -> int:
    """Bytes another allocation on ``device`` (None: the current device) can count on: the
    free memory the driver reports.

    Memory pools hold unused memory (cupy's, rmm's, the framework's), but only their own
    allocations can use it, and only where its blocks are large enough and free on the
    allocating stream: it is not counted.
    """
    _, cupy, device = _deps.import_gpu(device)
    with cupy.cuda.Device(device):
        free, _total = cupy.cuda.runtime.memGetInfo()
    return int(free)


def _is_number(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def chunk_rows_for_fraction(
    fraction: float, free_bytes: int, row_bytes: int, batch_size: int
) -> int:
    """Rows per chunk so that one chunk takes about ``fraction`` of ``free_bytes``.

    The result is a whole number of batches, and at least one batch. The loader holds
    about ``prefetch + 2`` chunks at once (see ``docs/gpu.md``), so the memory it uses
    is about ``(prefetch + 2) * fraction`` of the free memory: 0.1 with the default
    ``prefetch=1`` uses about 30%.

    Args:
        fraction: Share of the free memory one chunk may take, in (0, 1] (the Keras
            loader's ``buffer_size``).
        free_bytes: Free device memory (`free_device_memory`).
        row_bytes: Bytes per delivered row (the sum of the delivered dtypes' sizes).
        batch_size: Rows per batch.

    Examples:
        >>> chunk_rows_for_fraction(0.1, 16 * 2**30, 160, 65536)
        10682368
        >>> chunk_rows_for_fraction(0.1, 2**20, 160, 65536)  # less than a batch fits: one batch
        65536
    """
    if not _is_number(fraction) or not 0 < fraction <= 1:
        raise InvalidArgumentError(
            f"buffer_size (the share of free GPU memory one chunk may take) must be a "
            f"number in (0, 1], got {fraction!r}; for example 0.1"
        )
    for name, value, least in (
        ("free_bytes", free_bytes, 0),
        ("row_bytes", row_bytes, 1),
        ("batch_size", batch_size, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise InvalidArgumentError(f"{name} must be an integer >= {least}, got {value!r}")
    rows = int(float(fraction) * int(free_bytes)) // int(row_bytes)
    return max(rows // batch_size, 1) * int(batch_size)


def chunk_rows_for_device(
    fraction: float, *, row_bytes: int, batch_size: int, device: int | None = None
) -> int:
    """`chunk_rows_for_fraction` of the memory free on ``device`` right now."""
    return chunk_rows_for_fraction(fraction, free_device_memory(device), row_bytes, batch_size)


def address(array: Any) -> int:
    interface = getattr(array, "__cuda_array_interface__", None) or array.__array_interface__
    return int(interface["data"][0])


def aligned_rows(xp: Any, k: int, rows: int, dtype: Any) -> Any:
    """An empty ``[k, stride]`` array whose rows start on 64-byte boundaries.

    ``stride >= rows``; use ``out[j, :rows]``. ``xp`` allocates (numpy-like ``empty``).

    Examples:
        >>> out = aligned_rows(np, 3, 5, "float32")
        >>> out.shape, [out[j, :5].ctypes.data % 64 for j in range(3)]
        ((3, 16), [0, 0, 0])
    """
    dtype = np.dtype(dtype)
    per_align = ALIGN // dtype.itemsize
    stride = -(-rows // per_align) * per_align
    flat = xp.empty((k * stride + per_align,), dtype)
    offset = (-address(flat) % ALIGN) // dtype.itemsize
    return flat[offset : offset + k * stride].reshape(k, stride)


def aligned_columns(
    batch: Mapping[str, Any],
    groups: Sequence[tuple[np.dtype[Any], Sequence[str]]],
    xp: Any,
    *,
    share: bool = True,
) -> dict[str, Any]:
    """Every column ``groups`` names (``(dtype, names)`` pairs) as a writable, contiguous,
    64-byte aligned 1-D array of that dtype, for frameworks that wrap memory as it is.

    With ``share`` a column that already is one is returned as it is: every column of a
    shuffled batch (gathered into pooled aligned memory on the host, into fresh device
    memory on a GPU, which rmm aligns to 256 bytes), and an unshuffled device column
    that starts on a 64-byte boundary. The others (read-only views of Arrow memory,
    views off a 64-byte boundary) are copied into the rows of one `aligned_rows`
    block per dtype, allocated by ``xp``.

    Examples:
        >>> batch = {"a": np.arange(3), "b": np.arange(4.0)[1:]}
        >>> out = aligned_columns(batch, [(np.dtype("int64"), ["a"]),
        ...                               (np.dtype("float32"), ["b"])], np)
        >>> out["b"].dtype, out["b"].tolist(), address(out["b"]) % ALIGN
        (dtype('float32'), [1.0, 2.0, 3.0], 0)
    """

    def shareable(array: Any, dtype: np.dtype[Any]) -> bool:
        if not (
            share
            and array.dtype == dtype
            and array.ndim == 1
            and array.flags.c_contiguous
            and address(array) % ALIGN == 0
        ):
            return False
        if isinstance(array, np.ndarray):
            return bool(array.flags.writeable)  # else Arrow's memory
        return hasattr(array, "__cuda_array_interface__")  # device memory (rmm: 256-aligned)

    rows = int(next(iter(batch.values())).shape[0]) if batch else 0
    out: dict[str, Any] = {}
    for dtype, names in groups:
        copied = [name for name in names if not shareable(batch[name], dtype)]
        out.update((name, batch[name]) for name in names if name not in copied)
        if copied:
            block = aligned_rows(xp, len(copied), rows, dtype)
            for j, name in enumerate(copied):
                block[j, :rows] = batch[name]
                out[name] = block[j, :rows]
    return out


def release_arrow_memory() -> None:
    """Hand the memory Arrow's allocator keeps for reuse back to the operating system.

    Parquet is decoded into Arrow's memory pool (mimalloc or jemalloc) on the epoch's
    background threads. A freed block goes back to the heap of the thread that
    allocated it, and when that thread ends its heap is set aside until some other
    thread happens to claim it: between one and two hundred MiB of a chunk's decoded
    row groups stayed resident after each epoch, more or less from one epoch to the
    next. Called once the epoch's threads have ended, from the thread that consumed the
    epoch: from the main thread, mimalloc also takes back the heaps of threads that
    ended. A few milliseconds, once an epoch.

    Examples:
        >>> release_arrow_memory()
    """
    pa.default_memory_pool().release_unused()
