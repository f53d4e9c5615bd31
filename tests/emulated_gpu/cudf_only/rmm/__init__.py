"""Emulated rmm (RAPIDS Memory Manager): memory resources over ``cupy.cuda.runtime.malloc``.

Works with the emulated cupy and with the real one: resources allocate with
``cupy.cuda.runtime.malloc``/``free`` (cudaMalloc/cudaFree), whichever cupy imports.
"""

from __future__ import annotations

from typing import Any

from . import mr
from .mr import DeviceBuffer

__emulated__ = True
__version__ = "26.10-emulated"

__all__ = [
    "DeviceBuffer",
    "is_initialized",
    "mr",
    "register_reinitialize_hook",
    "reinitialize",
    "unregister_reinitialize_hook",
]

_hooks: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []


def reinitialize(
    pool_allocator: bool = False,
    managed_memory: bool = False,
    initial_pool_size: int | None = None,
    maximum_pool_size: int | None = None,
    devices: int | list[int] = 0,
    logging: bool = False,
    log_file_name: str | None = None,
) -> None:
    """Replace the resource of each of ``devices`` (signature of rmm/rmm.py reinitialize).

    Hooks run first, in reverse order of registration, as in rmm. ``managed_memory``
    builds a ManagedMemoryResource (counted like cudaMalloc here); ``logging`` is not
    emulated and ignored.
    """
    for func, args, kwargs in reversed(_hooks):
        func(*args, **kwargs)
    mr._initialize(
        pool_allocator=pool_allocator,
        managed_memory=managed_memory,
        initial_pool_size=initial_pool_size,
        maximum_pool_size=maximum_pool_size,
        devices=devices,
    )


def is_initialized() -> bool:
    return mr.is_initialized()


def register_reinitialize_hook(func: Any, *args: Any, **kwargs: Any) -> Any:
    _hooks.append((func, args, kwargs))
    return func


def unregister_reinitialize_hook(func: Any) -> None:
    _hooks[:] = [hook for hook in _hooks if hook[0] is not func]
