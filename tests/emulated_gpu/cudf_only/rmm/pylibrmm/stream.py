"""Emulated ``rmm.pylibrmm.stream``: ``Stream(obj)`` wraps a cupy stream (rmm's Stream
accepts a Numba or CuPy stream and makes a thin wrapper around it)."""

from __future__ import annotations

from typing import Any

__emulated__ = True


class Stream:
    def __init__(self, obj: Any = None) -> None:
        import cupy

        self.obj = cupy.cuda.Stream() if obj is None else obj
        if not hasattr(self.obj, "ptr"):
            raise TypeError(f"cannot make a stream of {obj!r}")
