"""The GPU backend as contract adapters: the core loader on ``device="cuda"``.

Batches are copied to the host with ``cupy.asnumpy`` only here, to check them; the
arrays the loader delivered must already be cupy arrays (checked on the way).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tabloader
from contract import Adapter, Batch


def _make(**fixed: Any) -> Any:
    def make(source: Any, **options: Any) -> tabloader.Loader:
        return tabloader.Loader(source, device="cuda", **fixed, **options)

    return make


def _to_host(array: Any) -> np.ndarray:
    import cupy

    assert isinstance(array, cupy.ndarray), type(array)
    return cupy.asnumpy(array)


def _columns_epoch(loader: tabloader.Loader) -> list[Batch]:
    return [{k: _to_host(v) for k, v in batch.items()} for batch in loader]


def _stacked_epoch(loader: tabloader.Loader) -> list[Batch]:
    out = []
    for batch in loader:
        flat: Batch = {}
        for kind, names in (
            ("cats", loader.cats),
            ("conts", loader.conts),
            ("labels", loader.labels),
        ):
            block = _to_host(batch[kind])
            for j, name in enumerate(names):
                flat[name] = block[:, j]
        out.append(flat)
    return out


ADAPTERS = [
    Adapter("gpu", _make(), _columns_epoch, marks=[pytest.mark.gpu]),
    Adapter("gpu-stacked", _make(layout="stacked"), _stacked_epoch, marks=[pytest.mark.gpu]),
]
