"""Every backend and adapter keeps the same promises (see ``contract.py``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tabloader
from contract import (
    Adapter,
    Batch,
    check_batch_sizes,
    check_dtypes,
    check_rows_intact,
    dataset,
    expected_batches,
    ids_of,
    loader_options,
)


def _core_epoch(loader: tabloader.Loader) -> list[Batch]:
    return [{k: np.asarray(v) for k, v in batch.items()} for batch in loader]


def _stacked_epoch(loader: tabloader.Loader) -> list[Batch]:
    out = []
    for batch in loader:
        flat: Batch = {}
        for kind, names in (
            ("cats", loader.cats),
            ("conts", loader.conts),
            ("labels", loader.labels),
        ):
            for j, name in enumerate(names):
                flat[name] = np.asarray(batch[kind][:, j])
        out.append(flat)
    return out


def _core_make(**fixed: Any) -> Callable[..., tabloader.Loader]:
    def make(source: Any, **options: Any) -> tabloader.Loader:
        return tabloader.Loader(source, **fixed, **options)

    return make


ADAPTERS: list[Adapter] = [
    Adapter("loader", _core_make(), _core_epoch),
    Adapter("loader-stacked", _core_make(layout="stacked"), _stacked_epoch),
]
for module in ("contract_torch", "contract_tensorflow", "contract_gpu"):
    try:
        ADAPTERS.extend(importlib.import_module(module).ADAPTERS)
    except ModuleNotFoundError as err:
        if err.name != module:
            raise

adapters = pytest.mark.parametrize(
    "adapter", [pytest.param(a, marks=a.marks, id=a.name) for a in ADAPTERS]
)

LAYOUTS = {
    "one-file": [[300]],
    "ragged": [[37, 101, 5], [64], [1, 90, 33]],
    "many-small": [[20] * 6, [13] * 4],
}


@pytest.fixture(autouse=True)
def _quiet(quiet_loader_warnings: None) -> None:
    """Every test here runs with the loader's advice silenced (see conftest)."""


@adapters
@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffle", "ordered"])
def test_every_row_exactly_once_per_epoch(adapter, dataset_dir, layout, shuffle):
    paths = dataset_dir(layout)
    total = sum(map(sum, layout))
    loader = adapter.make(dataset(paths), **loader_options(shuffle=shuffle, parts_per_chunk=2))
    assert adapter.length(loader) == expected_batches(total, 32, drop_last=False)
    for _ in range(2):
        batches = adapter.epoch(loader)
        assert len(batches) == adapter.length(loader)
        np.testing.assert_array_equal(np.sort(ids_of(batches)), np.arange(total))
        check_rows_intact(batches)
        check_dtypes(batches, adapter.expected_dtypes())
        check_batch_sizes(batches, 32, drop_last=False)
    if not shuffle and adapter.ordered:
        np.testing.assert_array_equal(ids_of(batches), np.arange(total))


@adapters
def test_drop_last_drops_only_the_short_batch(adapter, dataset_dir):
    layout = LAYOUTS["ragged"]
    total = sum(map(sum, layout))
    paths = dataset_dir(layout)
    loader = adapter.make(dataset(paths), **loader_options(drop_last=True))
    batches = adapter.epoch(loader)
    assert total % 32  # the dataset does end in a short batch
    assert len(batches) == adapter.length(loader) == total // 32
    check_batch_sizes(batches, 32, drop_last=True)
    check_rows_intact(batches)
    ids = ids_of(batches)
    assert len(np.unique(ids)) == len(ids) == total - total % 32


@adapters
@pytest.mark.parametrize("world", [2, 3, 8])
def test_ranks_get_disjoint_rows_and_equal_batch_counts(adapter, dataset_dir, world):
    layout = LAYOUTS["ragged"]
    total = sum(map(sum, layout))
    paths = dataset_dir(layout)
    per_rank = []
    for rank in range(world):
        loader = adapter.make(
            dataset(paths), **loader_options(global_rank=rank, global_size=world, batch_size=16)
        )
        batches = adapter.epoch(loader)
        assert len(batches) == adapter.length(loader)
        check_rows_intact(batches)
        per_rank.append(ids_of(batches))
    counts = {len(ids) for ids in per_rank}
    assert counts == {total // world}
    union = np.concatenate(per_rank)
    assert len(np.unique(union)) == len(union)  # disjoint
    assert total - len(union) < world


@adapters
def test_same_seed_same_batches_other_epoch_other_order(adapter, dataset_dir):
    paths = dataset_dir(LAYOUTS["many-small"])
    first = adapter.make(dataset(paths), **loader_options(seed=3, parts_per_chunk=3))
    second = adapter.make(dataset(paths), **loader_options(seed=3, parts_per_chunk=3))
    a0, b0 = ids_of(adapter.epoch(first)), ids_of(adapter.epoch(second))
    np.testing.assert_array_equal(a0, b0)
    a1 = ids_of(adapter.epoch(first))
    assert not np.array_equal(a0, a1)
    other = adapter.make(dataset(paths), **loader_options(seed=4, parts_per_chunk=3))
    assert not np.array_equal(a0, ids_of(adapter.epoch(other)))


@adapters
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffle", "ordered"])
def test_batches_held_through_the_epoch_stay_intact(adapter, dataset_dir, shuffle):
    """A delivered batch stays valid while the user holds it: no buffer is reused under it.

    ``epoch`` copies each batch to the host only after the whole epoch (and the next
    epoch's start) was delivered, so a batch whose memory the loader reused would show
    torn or repeated rows.
    """
    layout = LAYOUTS["many-small"]
    total = sum(map(sum, layout))
    paths = dataset_dir(layout)
    loader = adapter.make(dataset(paths), **loader_options(shuffle=shuffle, parts_per_chunk=1))
    held = adapter.hold(loader)
    adapter.epoch(loader)  # another epoch runs while the first epoch's batches are held
    batches = [adapter.to_host(loader, b) for b in held]
    check_rows_intact(batches)
    np.testing.assert_array_equal(np.sort(ids_of(batches)), np.arange(total))
