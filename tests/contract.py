"""The invariants every backend and framework adapter must keep, as reusable checks.

An :class:`Adapter` wraps one way of loading (the core loader in either layout, the
PyTorch or Keras adapter, the GPU backend) behind three calls; ``test_contract.py`` runs
every check against every adapter, so a new adapter inherits the whole suite by adding
itself to ``ADAPTERS`` there.

Datasets come from ``conftest.write_dataset``: column ``id`` is unique, ``cat``, ``x``
and ``label`` are functions of it, so a check can tell a row from a torn one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import tabloader

CATS = ["id", "cat"]
CONTS = ["x"]
LABELS = ["label"]
COLUMNS = CATS + CONTS + LABELS
EXPECTED_DTYPES = {"id": np.int64, "cat": np.int64, "x": np.float32, "label": np.float32}

Batch = dict[str, np.ndarray]


@dataclass
class Adapter:
    """One way of loading, seen as: build a loader, run one epoch, ask its length.

    ``make(source, **options)`` takes a tabloader.Dataset (or paths) and the core
    loader's keyword options (cats, conts, labels, batch_size, shuffle, seed, drop_last,
    global_rank, global_size, parts_per_chunk, chunk_rows). ``epoch(loader)`` runs the
    next epoch and returns its batches as ``{column: 1-D numpy array}``, with the dtypes
    the framework delivered. ``length(loader)`` is what ``len()`` says. ``ordered``:
    without shuffling, batches come in dataset order (False for an adapter whose worker
    processes each read a contiguous share and hand batches over in turn).
    """

    name: str
    make: Callable[..., Any]
    epoch: Callable[[Any], list[Batch]]
    length: Callable[[Any], int] = len
    marks: Sequence[Any] = field(default_factory=tuple)
    ordered: bool = True
    dtypes: Callable[[], dict[str, Any]] | None = None
    """The dtypes delivered, when the framework's differ from ``EXPECTED_DTYPES``."""

    def expected_dtypes(self) -> dict[str, Any]:
        return EXPECTED_DTYPES if self.dtypes is None else self.dtypes()

    def hold(self, loader: Any) -> list[Any]:
        """The next epoch's batches as delivered (tensors, device arrays), not yet copied."""
        held: list[Any] = []
        self.epoch(_Recording(loader, held))
        return held

    def to_host(self, loader: Any, item: Any) -> Batch:
        """One held batch of ``loader``, converted as ``epoch`` converts it."""
        (batch,) = self.epoch(_Replay(loader, item))
        return batch


class _Recording:
    """Stands for a loader: delegates everything, and records what iteration delivers."""

    def __init__(self, loader: Any, held: list[Any]) -> None:
        self._loader = loader
        self._held = held

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Any:
        for item in self._loader:
            self._held.append(item)
            yield item

    def __getitem__(self, index: int) -> Any:
        item = self._loader[index]
        self._held.append(item)
        return item


class _Replay:
    """Stands for a loader whose epoch is one item already delivered."""

    def __init__(self, loader: Any, item: Any) -> None:
        self._loader = loader
        self._item = item

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Any:
        return iter([self._item])

    def __getitem__(self, index: int) -> Any:
        return self._item

    def on_epoch_begin(self) -> None:
        pass

    def on_epoch_end(self) -> None:
        pass


def loader_options(**overrides: Any) -> dict[str, Any]:
    options: dict[str, Any] = {
        "cats": CATS,
        "conts": CONTS,
        "labels": LABELS,
        "batch_size": 32,
        "shuffle": True,
        "seed": 7,
    }
    options.update(overrides)
    return options


def ids_of(batches: list[Batch]) -> np.ndarray:
    if not batches:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.asarray(b["id"]) for b in batches])


def check_rows_intact(batches: list[Batch]) -> None:
    """Every delivered row is a real row: its columns agree with its id."""
    for batch in batches:
        ids = np.asarray(batch["id"])
        np.testing.assert_array_equal(np.asarray(batch["cat"]), ids % 1000)
        np.testing.assert_array_equal(np.asarray(batch["x"]), (ids / 4.0).astype(np.float32))
        np.testing.assert_array_equal(np.asarray(batch["label"]), (ids % 2).astype(np.float32))


def check_dtypes(batches: list[Batch], expected: dict[str, Any] | None = None) -> None:
    for batch in batches:
        for name, dtype in (EXPECTED_DTYPES if expected is None else expected).items():
            assert np.asarray(batch[name]).dtype == dtype, (name, np.asarray(batch[name]).dtype)
            assert np.asarray(batch[name]).ndim == 1


def check_batch_sizes(batches: list[Batch], batch_size: int, *, drop_last: bool) -> None:
    sizes = [len(b["id"]) for b in batches]
    assert all(s == batch_size for s in sizes[:-1]), sizes
    if sizes:
        assert 0 < sizes[-1] <= batch_size
        if drop_last:
            assert sizes[-1] == batch_size


def expected_batches(rows: int, batch_size: int, *, drop_last: bool) -> int:
    return rows // batch_size + (0 if drop_last or rows % batch_size == 0 else 1)


def dataset(paths: list[str]) -> tabloader.Dataset:
    return tabloader.Dataset(paths)
