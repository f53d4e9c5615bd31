"""drop_last with fewer rows than a batch: torch's convention, an empty loader and a warning."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import tabloader

COLS = {"cats": ["id", "cat"], "conts": ["x"], "labels": ["label"]}


@pytest.fixture(autouse=True)
def _quiet(quiet_loader_warnings: None) -> None:
    """Every test here runs with the loader's advice silenced (see conftest)."""


def _quiet_loader(paths: Any, **options: Any) -> tabloader.Loader:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tabloader.EmptyEpochWarning)
        return tabloader.Loader(paths, **COLS, **options)


def test_fewer_rows_than_a_batch_with_drop_last_is_an_empty_loader(dataset_dir):
    paths = dataset_dir([[10]])
    with pytest.warns(tabloader.EmptyEpochWarning) as caught:
        loader = tabloader.Loader(paths, **COLS, batch_size=64, drop_last=True)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "rank 0 of 1 gets 10 of 10 rows, fewer than batch_size=64 with drop_last=True" in (
        message
    )
    assert "len(loader) == 0" in message
    assert issubclass(tabloader.EmptyEpochWarning, UserWarning)
    assert len(loader) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # iterating warns no more
        assert list(loader) == []
        assert list(loader) == []
    assert loader.epoch == 2


def test_a_rank_whose_share_is_smaller_than_a_batch_is_empty_on_every_rank(dataset_dir):
    paths = dataset_dir([[30, 30]])  # 20 rows per rank of 3
    with pytest.warns(tabloader.EmptyEpochWarning, match="rank 2 of 3 gets 20 of 60 rows"):
        loader = tabloader.Loader(
            paths,
            **COLS,
            batch_size=25,
            drop_last=True,
            global_rank=2,
            global_size=3,
            seed=0,
            shuffle=True,
        )
    assert len(loader) == 0 and list(loader) == []
    # Without drop_last the same ranks get one short batch each.
    kept = _quiet_loader(paths, batch_size=25, global_rank=2, global_size=3, seed=0)
    assert [len(b["id"]) for b in kept] == [20]


def test_more_ranks_than_rows_warns_with_the_remedy(dataset_dir):
    paths = dataset_dir([[2]])
    with pytest.warns(tabloader.EmptyEpochWarning, match="gets 0 of 2 rows.*Use fewer ranks"):
        loader = tabloader.Loader(paths, **COLS, batch_size=4, global_rank=0, global_size=3)
    assert len(loader) == 0 and list(loader) == []


@pytest.mark.torch
def test_torch_adapters_are_empty_too(dataset_dir):
    pytest.importorskip("torch")
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    paths = dataset_dir([[10]])
    with pytest.warns(tabloader.EmptyEpochWarning, match="fewer than batch_size=64"):
        itr = TorchAsyncItr(paths, **COLS, batch_size=64, drop_last=True, device="cpu")
    assert len(itr) == 0
    assert list(itr) == []
    for workers in (0, 2):
        loader = DLDataLoader(itr, num_workers=workers, collate_fn=lambda x: x)
        assert len(loader) == 0
        with warnings.catch_warnings():
            warnings.simplefilter("error", tabloader.EmptyEpochWarning)
            assert list(loader) == []


@pytest.mark.tensorflow
def test_keras_loader_is_empty_and_fit_refuses_it_in_its_own_words(dataset_dir):
    pytest.importorskip("tensorflow")
    import keras

    from tabloader.tensorflow import KerasSequenceLoader

    paths = dataset_dir([[10]])
    with pytest.warns(tabloader.EmptyEpochWarning, match="fewer than batch_size=64"):
        loader = KerasSequenceLoader(
            paths,
            batch_size=64,
            cat_names=["id"],
            cont_names=["x"],
            label_names=["label"],
            drop_last=True,
            seed=0,
        )
    assert len(loader) == 0
    assert list(loader) == []
    with pytest.raises(IndexError, match="has 0 batches per epoch"):
        loader[0]
    inputs = {
        "id": keras.Input(shape=(), name="id", dtype="int64"),
        "x": keras.Input(shape=(), name="x"),
    }
    out = keras.layers.Dense(1)(keras.ops.expand_dims(inputs["x"], -1))
    model = keras.Model(inputs, out)
    model.compile("sgd", "mse")
    # Keras refuses an empty PyDataset itself (torch's loop just runs no step).
    with pytest.raises(ValueError, match="PyDataset has length 0"):
        model.fit(loader, epochs=1, verbose=0)
