"""Where the emulated GPU stack lives, and a helper to import it without leaking it.

``FULL`` is the emulated device (emulated cupy, cudf and rmm): put these first on
``sys.path`` or ``PYTHONPATH``. ``CUDF_ONLY`` is for a GPU host with the real cupy but
no cudf: only the emulated cudf and rmm, which then work on the real cupy.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent
CUPY_ONLY = str(ROOT / "cupy_only")
CUDF_ONLY_DIR = str(ROOT / "cudf_only")
FULL = [CUPY_ONLY, CUDF_ONLY_DIR]
CUDF_ONLY = [CUDF_ONLY_DIR]
PACKAGES = ("cupy", "cudf", "rmm")
STACK = (*PACKAGES, "dask_cudf", "pylibcudf")
"""Every emulated package; dask imports dask_cudf by itself when it meets a cudf frame,
and the GPU backend imports pylibcudf."""


def _stack_modules() -> dict[str, ModuleType]:
    return {name: module for name, module in sys.modules.items() if name.split(".")[0] in STACK}


@contextlib.contextmanager
def emulated_modules(
    paths: list[str] | None = None, names: tuple[str, ...] = PACKAGES
) -> Iterator[tuple[ModuleType, ...]]:
    """Import the emulated ``names`` (default ``(cupy, cudf, rmm)``) with ``paths``
    (default FULL) first on sys.path, and yield them in that order; on exit remove cupy,
    cudf and rmm from sys.modules and restore sys.path and the modules loaded before.

    Importing cudf installs rmm's allocator in cupy, as the real cudf does; modules that
    bound ``cupy`` while inside keep the emulated one, so use it only inside the block.
    ``dask_cudf`` (imported by dask when it meets a cudf frame) is removed on exit too.
    """
    saved_path = list(sys.path)
    saved = _stack_modules()
    for name in saved:
        del sys.modules[name]
    sys.path[:0] = FULL if paths is None else paths
    importlib.invalidate_caches()
    try:
        yield tuple(importlib.import_module(name) for name in names)
    finally:
        for name in _stack_modules():
            del sys.modules[name]
        sys.modules.update(saved)
        sys.path[:] = saved_path
        importlib.invalidate_caches()
