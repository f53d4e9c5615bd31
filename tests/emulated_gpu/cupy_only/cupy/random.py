"""Emulated ``cupy.random``: the seeded permutation a hand-written loader draws on the device.

cupy keeps one generator per device (``cupy.random.seed`` reseeds the current device's);
here a numpy generator per device stands in, and results land in device memory through
the current allocator, written on the current stream like any kernel's output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__emulated__ = True

_generators: dict[int, np.random.Generator] = {}


def _generator() -> np.random.Generator:
    from .cuda import runtime

    device = runtime.getDevice()
    if device not in _generators:
        _generators[device] = np.random.default_rng()
    return _generators[device]


def seed(seed: int | None = None) -> None:
    from .cuda import runtime

    _generators[runtime.getDevice()] = np.random.default_rng(seed)


def permutation(a: Any) -> Any:
    """A random permutation of ``range(a)`` (an int), as a device array."""
    from . import _to_device

    if not isinstance(a, (int, np.integer)):
        raise TypeError("the emulated cupy.random.permutation takes an int")
    return _to_device(_generator().permutation(int(a)))
