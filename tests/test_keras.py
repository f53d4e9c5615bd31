"""KerasSequenceLoader and KerasSequenceValidater on whichever backend Keras runs.

This file runs once per Keras backend: in this session on the backend Keras picked
(TensorFlow unless ``KERAS_BACKEND`` says otherwise), and under ``KERAS_BACKEND=jax``
and ``torch`` in sessions of their own (``test_keras_backends.py``), since Keras fixes
its backend when first imported. TensorFlow-only behaviour is in ``test_tensorflow.py``.
"""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader
from contract_tensorflow import CATS, CONTS, LABELS, make_loader

pytestmark = pytest.mark.keras


@pytest.fixture(autouse=True)
def _quiet(quiet_loader_warnings: None) -> None:
    """Every test here runs with the loader's advice silenced (see conftest)."""


def backend() -> str:
    import keras

    return str(keras.backend.backend())


def id_dtype() -> type:
    """Ids as the backend gets them: int32 on JAX in its default 32-bit mode."""
    if backend() == "jax":
        import jax

        return np.int64 if jax.config.jax_enable_x64 else np.int32
    return np.int64


def tensor_type() -> type:
    if backend() == "tensorflow":
        import tensorflow as tf

        return tf.Tensor
    if backend() == "jax":
        import jax

        return jax.Array
    import torch

    return torch.Tensor


def host(tensor: Any) -> np.ndarray:
    import keras

    return np.asarray(keras.ops.convert_to_numpy(tensor))


def ids(item):
    return host(item[0]["id"])


def run_epoch(loader, order=None):
    loader.on_epoch_begin()
    items = [loader[i] for i in (range(len(loader)) if order is None else order)]
    loader.on_epoch_end()
    return items


def core_batches(loader, epoch):
    """The ids of each batch the core loader, set up alike, delivers in ``epoch``."""
    inner = loader.loader
    core = tabloader.Loader(
        inner.dataset,
        batch_size=inner.batch_size,
        cats=inner.cats,
        conts=inner.conts,
        labels=inner.labels,
        shuffle=inner.shuffle,
        seed=inner.seed,
        parts_per_chunk=inner.parts_per_chunk,
        chunk_rows=inner.chunk_rows,
        drop_last=inner.drop_last,
    )
    return [batch["id"].copy() for batch in core.iter_epoch(epoch)]


# -- items --------------------------------------------------------------------------


def test_items_are_the_backends_tensors_of_the_delivered_dtypes(dataset_dir):
    loader = make_loader(dataset_dir([[100, 60]]), shuffle=False)
    features, labels = loader[0]
    assert sorted(features) == ["cat", "id", "x"]
    assert all(isinstance(t, tensor_type()) for t in [*features.values(), labels])
    arrays = {name: host(t) for name, t in features.items()}
    assert arrays["id"].dtype == arrays["cat"].dtype == id_dtype()
    assert arrays["x"].dtype == host(labels).dtype == np.float32
    assert arrays["id"].shape == arrays["x"].shape == host(labels).shape == (32,)
    np.testing.assert_array_equal(arrays["id"], np.arange(32))
    np.testing.assert_array_equal(arrays["cat"], np.arange(32) % 1000)
    np.testing.assert_array_equal(arrays["x"], np.arange(32) / 4)
    np.testing.assert_array_equal(host(labels), np.arange(32) % 2)


def test_several_labels_come_as_a_dict_and_no_label_as_features_alone(dataset_dir):
    paths = dataset_dir([[50]])
    features, labels = make_loader(paths, cont_names=[], label_names=["x", "label"])[0]
    assert sorted(features) == ["cat", "id"]
    assert sorted(labels) == ["label", "x"]
    np.testing.assert_array_equal(host(labels["x"]), host(features["id"]) / 4)
    item = make_loader(paths, label_names=[])[0]
    assert isinstance(item, dict)
    assert sorted(item) == ["cat", "id", "x"]


def test_dtypes_are_taken_in_numpy_keras_and_the_frameworks_spelling(dataset_dir):
    paths = dataset_dir([[40]])
    if backend() == "tensorflow":
        import tensorflow as tf

        spelled = {"cat_dtype": tf.int32, "cont_dtype": "float16", "label_dtype": tf.int32}
    elif backend() == "torch":
        import torch

        spelled = {"cat_dtype": torch.int32, "cont_dtype": "float16", "label_dtype": torch.int32}
    else:
        import jax.numpy as jnp

        spelled = {"cat_dtype": jnp.int16, "cont_dtype": "float16", "label_dtype": jnp.int32}
    features, labels = make_loader(paths, shuffle=False, **spelled)[0]
    assert host(features["id"]).dtype == (np.int16 if backend() == "jax" else np.int32)
    assert host(features["x"]).dtype == np.float16
    assert host(labels).dtype == np.int32
    np.testing.assert_array_equal(host(labels), np.arange(32) % 2)
    with pytest.raises(tabloader.InvalidArgumentError, match="cat_dtype must be a dtype"):
        make_loader(paths, cat_dtype="no-such-type")


def test_jax_in_32_bit_mode_gets_int32_ids_and_refuses_ids_that_do_not_fit(tmp_path):
    if backend() != "jax":
        pytest.skip("JAX's 32-bit mode")
    import jax

    if jax.config.jax_enable_x64:
        pytest.skip("JAX runs in 64-bit mode here")
    big = np.array([5, 2**31 - 1, 2**31 + 7, 3], np.int64)
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"user": big, "y": np.ones(4, np.float32)}), path)
    options = {"cat_names": ["user"], "label_names": ["y"], "cont_names": [], "shuffle": False}
    fits = make_loader(str(path), batch_size=2, **options)
    assert host(fits[0][0]["user"]).tolist() == [5, 2**31 - 1]
    with pytest.raises(
        tabloader.InvalidArgumentError,
        match=r"column 'user' holds 2147483655, which does not fit int32.*would wrap around.*"
        r"jax_enable_x64",
    ):
        fits[1]
    with pytest.raises(tabloader.InvalidArgumentError, match=r"cat_dtype='int64': JAX holds no"):
        make_loader(str(path), batch_size=2, cat_dtype="int64", **options)


def test_len_is_exact_and_asking_it_never_disturbs_an_epoch(dataset_dir):
    loader = make_loader(dataset_dir([[37, 101], [64]]), batch_size=16)
    assert len(loader) == 202 // 16 + 1
    loader.on_epoch_begin()
    got = []
    for i in range(len(loader)):
        assert len(loader) == 13
        got.append(ids(loader[i]))
        assert len(loader) == 13
    loader.on_epoch_end()
    np.testing.assert_array_equal(np.sort(np.concatenate(got)), np.arange(202))
    assert loader.epoch == 1


def test_batches_are_the_core_loaders_and_a_new_epoch_reshuffles(dataset_dir):
    loader = make_loader(dataset_dir([[40] * 5]), parts_per_chunk=2)
    first = [ids(item) for item in run_epoch(loader)]
    second = [ids(item) for item in run_epoch(loader)]
    for got, expected in zip(first, core_batches(loader, 0), strict=True):
        np.testing.assert_array_equal(got, expected)
    for got, expected in zip(second, core_batches(loader, 1), strict=True):
        np.testing.assert_array_equal(got, expected)
    assert not np.array_equal(np.concatenate(first), np.concatenate(second))
    np.testing.assert_array_equal(np.sort(np.concatenate(second)), np.arange(200))


def test_plain_iteration_runs_one_epoch_per_loop(dataset_dir):
    loader = make_loader(dataset_dir([[100]]))
    a = np.concatenate([ids(item) for item in loader])
    b = np.concatenate([ids(item) for item in loader])
    np.testing.assert_array_equal(np.sort(a), np.arange(100))
    np.testing.assert_array_equal(np.sort(b), np.arange(100))
    assert not np.array_equal(a, b)
    assert loader.epoch == 2


def test_keras_look_at_two_batches_is_replayed_without_reading_again(dataset_dir):
    # fit(): Keras may take items 0 and 1 to learn their structure, calls on_epoch_end,
    # then runs the epoch asking for the indices in a random order.
    loader = make_loader(dataset_dir([[50, 50], [60]]), batch_size=16)
    probe = [ids(loader[0]), ids(loader[1])]
    loader.on_epoch_end()
    order = np.random.default_rng(0).permutation(len(loader))
    items = run_epoch(loader, order)
    by_index = {int(i): ids(item) for i, item in zip(order, items, strict=True)}
    np.testing.assert_array_equal(by_index[0], probe[0])
    np.testing.assert_array_equal(by_index[1], probe[1])
    np.testing.assert_array_equal(np.sort(np.concatenate(list(by_index.values()))), np.arange(160))
    assert loader.loader.stats().batches == len(loader)  # every batch was cut once
    rest = [ids(item) for i, item in zip(order, items, strict=True) if i not in (0, 1)]
    expected = core_batches(loader, 0)
    np.testing.assert_array_equal(np.concatenate(rest), np.concatenate(expected[2:]))


def test_an_unfinished_epoch_is_served_again_from_its_start(dataset_dir):
    loader = make_loader(dataset_dir([[200]]), batch_size=20, parts_per_chunk=1)
    first = [ids(item) for item in run_epoch(loader, range(3))]
    again = [ids(item) for item in run_epoch(loader, range(3))]
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    whole = run_epoch(loader)
    np.testing.assert_array_equal(np.sort(np.concatenate([ids(i) for i in whole])), np.arange(200))
    assert loader.epoch == 1


def test_steps_per_epoch_continues_the_epoch_across_keras_epochs(dataset_dir):
    loader = make_loader(dataset_dir([[160]]), batch_size=16)
    order = np.random.default_rng(3).permutation(len(loader))
    seen = []
    for part in np.array_split(order, 4):
        seen.extend(ids(item) for item in run_epoch(loader, part.tolist()))
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(160))
    assert loader.epoch == 1


def test_an_index_asked_for_again_returns_the_same_batch(dataset_dir):
    loader = make_loader(dataset_dir([[200]]), batch_size=20)
    items = [ids(loader[i]) for i in range(5)]
    np.testing.assert_array_equal(ids(loader[1]), items[1])  # kept: no reading
    with pytest.warns(tabloader.PerformanceWarning, match="reading the epoch again"):
        again = ids(loader[3])
    np.testing.assert_array_equal(again, items[3])
    np.testing.assert_array_equal(ids(loader[5]), core_batches(loader, 0)[5])


def test_bad_indices_raise(dataset_dir):
    loader = make_loader(dataset_dir([[100]]))
    with pytest.raises(IndexError, match=r"batch index 4 is out of range: .* 4 batches"):
        loader[4]
    with pytest.raises(IndexError, match="out of range"):
        loader[-1]
    with pytest.raises(TypeError, match="must be an integer"):
        loader["0"]


def test_set_epoch_serves_that_epoch(dataset_dir):
    loader = make_loader(dataset_dir([[30] * 4]))
    loader[0]
    loader.set_epoch(3)
    got = [ids(item) for item in run_epoch(loader)]
    for a, b in zip(got, core_batches(loader, 3), strict=True):
        np.testing.assert_array_equal(a, b)
    assert loader.epoch == 4


def test_threads_end_with_the_epoch_and_on_close(dataset_dir):
    def tabloader_threads():
        return [t for t in threading.enumerate() if t.name.startswith("tabloader")]

    before = len(tabloader_threads())
    loader = make_loader(dataset_dir([[100]]), batch_size=10)
    run_epoch(loader)
    assert len(tabloader_threads()) == before
    loader[0]
    assert len(tabloader_threads()) > before
    loader.close()
    assert len(tabloader_threads()) == before


def test_read_errors_reach_the_caller(dataset_dir):
    paths = dataset_dir([[100], [100]])
    loader = make_loader(paths, shuffle=False, batch_size=50, parts_per_chunk=1)
    Path(paths[1]).write_bytes(b"PAR1 this is no longer parquet PAR1")
    loader.on_epoch_begin()
    _ = (loader[0], loader[1])
    with pytest.raises(tabloader.ReadError, match="part-001"):
        loader[2]


# -- options ------------------------------------------------------------------------


def test_unknown_and_unsupported_keywords_raise(dataset_dir):
    paths = dataset_dir([[50]])
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        make_loader(paths, colour="red")
    with pytest.raises(tabloader.InvalidArgumentError, match=r"workers= \(tabloader reads"):
        make_loader(paths, workers=4)
    with pytest.raises(tabloader.ColumnTypeError, match="list column 'x' is double"):
        make_loader(paths, sparse_names=["x"], sparse_as_dense=True, sparse_max={"x": 2})
    with pytest.raises(tabloader.InvalidArgumentError, match="engine must be 'parquet'"):
        make_loader(paths, engine="csv")
    with pytest.raises(tabloader.InvalidArgumentError, match=r"give seed= or seed_fn=, not both"):
        make_loader(paths, seed_fn=lambda: 3)
    with pytest.raises(tabloader.InvalidArgumentError, match="pass the same seed"):
        make_loader(paths, seed=None, global_size=2, global_rank=0)


def test_seed_fn_gives_the_seed(dataset_dir):
    calls = []

    def seed_fn():
        calls.append(1)
        return 11

    paths = dataset_dir([[20] * 5])
    loader = make_loader(paths, seed=None, seed_fn=seed_fn, engine="parquet")
    assert calls == [1]
    assert loader.loader.seed == 11
    other = make_loader(paths, seed=11)
    for a, b in zip(run_epoch(loader), run_epoch(other), strict=True):
        np.testing.assert_array_equal(ids(a), ids(b))


def test_buffer_size_sets_rows_per_chunk(dataset_dir):
    paths = dataset_dir([[25] * 8])
    small = make_loader(paths, buffer_size=50)
    large = make_loader(paths, buffer_size=150)
    assert (small.loader.chunk_rows, large.loader.chunk_rows) == (50, 150)
    assert small.loader.plan(0).num_chunks == 4
    assert large.loader.plan(0).num_chunks == 2
    for bad in (0, 1.0, 2.5, -0.1, True, "0.1"):
        with pytest.raises(tabloader.InvalidArgumentError, match="buffer_size"):
            make_loader(paths, buffer_size=bad)
    # NVTabular's scripts pass both: a chunk holds parts_per_chunk parts of buffer_size
    assert make_loader(paths, buffer_size=50, parts_per_chunk=1).loader.chunk_rows == 50
    assert make_loader(paths, buffer_size=50, parts_per_chunk=3).loader.chunk_rows == 150
    with pytest.raises(tabloader.InvalidArgumentError, match="chunk_rows both size chunks"):
        make_loader(paths, buffer_size=100, chunk_rows=200)


def test_nvtabulars_positional_call_shape_gives_the_same_batches(dataset_dir):
    from tabloader.keras import KerasSequenceLoader

    paths = dataset_dir([[37, 101], [64]])
    by_position = KerasSequenceLoader(paths, 32, LABELS, cat_names=CATS, cont_names=CONTS, seed=5)
    by_keyword = make_loader(paths)
    assert len(by_position) == len(by_keyword)
    for i in range(len(by_keyword)):
        np.testing.assert_array_equal(ids(by_position[i]), ids(by_keyword[i]))
    with pytest.raises(tabloader.InvalidArgumentError, match="needs batch_size"):
        KerasSequenceLoader(paths, label_names=LABELS, cat_names=CATS)


def test_every_core_keyword_works(dataset_dir, tmp_path):
    paths = dataset_dir([[37, 101], [64]])
    table = pq.read_table(paths[0])
    holes = table.set_column(2, "x", pa.array([None if i % 5 == 0 else float(i) / 4
                                               for i in range(len(table))]))  # fmt: skip
    pq.write_table(holes, paths[0], row_group_size=37)
    options = {
        "drop_last": True,
        "global_rank": 1,
        "global_size": 2,
        "fill_null": {"x": -1.0},
        "cache": "memory",
        "prefetch": 2,
        "shuffle_within_batch": False,
        "chunk_rows": 64,
        "batch_size": 16,
        "seed": 9,
    }
    loader = make_loader(paths, **options)
    core = tabloader.Loader(paths, cats=CATS, conts=CONTS, labels=LABELS, shuffle=True, **options)
    for epoch in range(2):
        items = run_epoch(loader)
        got = np.concatenate([ids(item) for item in items])
        assert len(items) == len(loader) == 101 // 16  # rank 1 of 2 holds 101 rows
        for (features, _), batch in zip(items, core.iter_epoch(epoch), strict=True):
            first = host(features["id"])
            np.testing.assert_array_equal(first, batch["id"])
            null = (first % 5 == 0) & (first < len(table))  # the first file's nulls
            np.testing.assert_array_equal(host(features["x"]), np.where(null, -1.0, first / 4))
        assert len(np.unique(got)) == len(got)
    assert loader.loader.stats().from_cache
    other = make_loader(paths, **{**options, "global_rank": 0})
    mine = np.concatenate([ids(item) for item in run_epoch(other)])
    assert not set(mine) & set(got)


# -- list columns -----------------------------------------------------------------------


@pytest.fixture
def list_paths(tmp_path):
    rows = 150
    genres = [[i % 7, (i * 3) % 7][: i % 3] for i in range(rows)]
    table = pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "genres": pa.array(genres, pa.list_(pa.int64())),
            "label": (np.arange(rows) % 2).astype(np.float32),
        }
    )
    path = tmp_path / "lists.parquet"
    pq.write_table(table, path, row_group_size=50)
    return [str(path)], genres


def test_list_columns_arrive_padded_on_every_backend(list_paths):
    paths, genres = list_paths
    loader = make_loader(
        paths, cat_names=["id"], cont_names=[], sparse_names=["genres"], sparse_as_dense=True,
        sparse_max={"genres": 3}, sparse_pad=-1, batch_size=32,
    )  # fmt: skip
    seen = []
    for features, _ in loader:
        padded = host(features["genres"])
        assert padded.shape[1] == 3 and padded.dtype == id_dtype()
        for i, row in zip(host(features["id"]), padded, strict=True):
            want = genres[int(i)]
            assert row.tolist() == want + [-1] * (3 - len(want))
            seen.append(int(i))
    assert sorted(seen) == list(range(150))
    if backend() != "tensorflow":
        with pytest.raises(tabloader.InvalidArgumentError, match="padded only: pass sparse_as"):
            make_loader(paths, cat_names=["id"], cont_names=[], sparse_names=["genres"])


def test_a_model_with_a_padded_list_input_trains(list_paths):
    import keras

    paths, _ = list_paths
    loader = make_loader(
        paths, cat_names=["id"], cont_names=[], sparse_names=["genres"], sparse_as_dense=True,
        sparse_max={"genres": 3}, sparse_pad=7, batch_size=32,
    )  # fmt: skip
    dtype = np.dtype(id_dtype()).name
    genres = keras.Input(shape=(3,), name="genres", dtype=dtype)
    user = keras.Input(shape=(), name="id", dtype=dtype)
    pooled = keras.ops.mean(keras.layers.Embedding(8, 4)(genres), axis=1)
    x = keras.layers.Concatenate()([pooled, keras.layers.Embedding(150, 4)(user)])
    model = keras.Model({"genres": genres, "id": user}, keras.layers.Dense(1)(x))
    model.compile("adam", "mse")
    history = model.fit(loader, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2


# -- training -----------------------------------------------------------------------


@pytest.fixture
def click_data(tmp_path):
    from tabloader.synthetic import write_criteo_like

    train = write_criteo_like(tmp_path / "train", rows=6000, files=2, row_group_size=1000, seed=1)
    valid = write_criteo_like(tmp_path / "valid", rows=1500, files=1, row_group_size=500, seed=2)
    return train, valid


def click_model(cats=("C1", "C9"), conts=("I1", "I2")):
    import keras

    dtype = np.dtype(id_dtype()).name
    inputs = {n: keras.Input(shape=(), name=n, dtype=dtype) for n in cats}
    inputs.update({n: keras.Input(shape=(1,), name=n) for n in conts})
    parts = [keras.layers.Embedding(2000, 4)(inputs[n]) for n in cats]
    parts += [inputs[n] for n in conts]
    x = keras.layers.Concatenate()(parts)
    x = keras.layers.Dense(16, activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
    model.compile(
        keras.optimizers.Adam(0.01),
        "binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc"), keras.metrics.BinaryAccuracy(name="acc")],
    )
    return model


def click_loader(files, shuffle, batch_size=256, **options):
    from tabloader.keras import KerasSequenceLoader

    return KerasSequenceLoader(
        files,
        batch_size=batch_size,
        cat_names=["C1", "C9"],
        cont_names=["I1", "I2"],
        label_names=["label"],
        shuffle=shuffle,
        seed=0,
        **options,
    )


def test_fit_with_the_validater_logs_val_metrics_for_history_and_callbacks(click_data):
    import keras

    from tabloader.keras import KerasSequenceValidater

    keras.utils.set_random_seed(0)
    train, valid = click_data
    model = click_model()
    stopper = keras.callbacks.EarlyStopping(monitor="val_auc", mode="max", patience=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(
            click_loader(train, True),
            epochs=3,
            verbose=0,
            callbacks=[KerasSequenceValidater(click_loader(valid, False)), stopper],
        )
    assert not [w for w in caught if "not available" in str(w.message)]  # EarlyStopping saw it
    logs = history.history
    assert set(logs) == {"loss", "auc", "acc", "val_loss", "val_auc", "val_acc"}
    assert len(logs["val_auc"]) == 3
    assert logs["loss"][2] < logs["loss"][0]
    assert stopper.best == max(logs["val_auc"])
    assert logs["val_auc"][-1] > 0.6


def test_validater_figures_equal_model_evaluate_on_the_same_rows(click_data):
    import keras

    from tabloader.keras import KerasSequenceValidater

    keras.utils.set_random_seed(1)
    train, valid = click_data
    model = click_model()
    history = model.fit(
        click_loader(train, True),
        epochs=2,
        verbose=0,
        callbacks=[KerasSequenceValidater(click_loader(valid, False, batch_size=200))],
    )
    table = pq.read_table(valid[0])
    x = {n: table[n].to_numpy().astype(id_dtype()) for n in ["C1", "C9"]}
    x.update({n: table[n].to_numpy().astype(np.float32) for n in ["I1", "I2"]})
    y = table["label"].to_numpy().astype(np.float32)
    expected = model.evaluate(x, y, batch_size=200, verbose=0, return_dict=True)
    for name, value in expected.items():
        np.testing.assert_allclose(history.history[f"val_{name}"][-1], value, rtol=1e-5)


def test_predict_with_a_loader_without_labels(click_data):
    train, _ = click_data
    from tabloader.keras import KerasSequenceLoader

    model = click_model()
    loader = KerasSequenceLoader(
        train,
        batch_size=1000,
        cat_names=["C1", "C9"],
        cont_names=["I1", "I2"],
        label_names=[],
        shuffle=False,
    )
    predictions = model.predict(loader, verbose=0)
    assert predictions.shape == (6000, 1)


def test_state_dict_resumes_exactly_and_fit_finishes_the_epoch(click_data):
    train, _ = click_data

    def batch(item: Any) -> list[np.ndarray]:
        features, labels = item
        return [host(features[k]) for k in sorted(features)] + [host(labels)]

    interrupted = click_loader(train, True, batch_size=500)
    for i in range(5):
        interrupted[i]
    state = json.loads(json.dumps(interrupted.state_dict()))
    assert (state["epoch"], state["batches"]) == (0, 5)
    rest = [batch(interrupted[i]) for i in range(5, len(interrupted))]
    resumed = click_loader(train, True, batch_size=500)
    resumed.load_state_dict(state)
    assert len(resumed) == len(rest) == 7
    for got, want in zip([batch(resumed[i]) for i in range(len(resumed))], rest, strict=True):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)

    again = click_loader(train, True, batch_size=500)
    again.load_state_dict(state)
    model = click_model()
    model.fit(again, initial_epoch=0, epochs=1, verbose=0)
    assert again.epoch == 1 and len(again) == 12
    model.fit(again, initial_epoch=1, epochs=2, verbose=0)
    assert again.epoch == 2
    with pytest.raises(tabloader.InvalidArgumentError, match=r"batch_size \(saved: 500; now: 250"):
        click_loader(train, True, batch_size=250).load_state_dict(state)


# -- on a GPU ------------------------------------------------------------------------


def device_kind(tensor: Any) -> str:
    """``"cuda"`` or ``"cpu"``: where the backend's tensor lives."""
    if backend() == "tensorflow":
        return "cuda" if "GPU" in tensor.device.upper() else "cpu"
    if backend() == "jax":
        return "cuda" if next(iter(tensor.devices())).platform == "gpu" else "cpu"
    return str(tensor.device.type)


@pytest.mark.gpu
def test_batches_on_the_gpu_are_the_backends_tensors_there(dataset_dir):
    import cupy

    from tabloader.tensors import dlpack_place

    expected = dlpack_place(cupy.zeros(1))[0]  # the host on the emulated device
    paths = dataset_dir([[300, 200]])
    cpu = make_loader(paths, device="cpu", parts_per_chunk=1)
    gpu = make_loader(paths, device="cuda", parts_per_chunk=1)
    assert gpu.loader.device.is_cuda
    for a, b in zip(cpu, gpu, strict=True):
        for name in ("id", "cat", "x"):
            assert device_kind(b[0][name]) == expected
            np.testing.assert_array_equal(host(a[0][name]), host(b[0][name]))
        assert device_kind(b[1]) == expected
        np.testing.assert_array_equal(host(a[1]), host(b[1]))


@pytest.mark.gpu
def test_fit_on_the_gpu_matches_the_cpu_batches_and_trains(click_data):
    import keras

    from tabloader.keras import KerasSequenceValidater

    train, valid = click_data
    keras.utils.set_random_seed(0)
    model = click_model()
    history = model.fit(
        click_loader(train, True, device="cuda"),
        epochs=2,
        verbose=0,
        callbacks=[KerasSequenceValidater(click_loader(valid, False, device="cuda"))],
    )
    assert history.history["loss"][1] < history.history["loss"][0]
    assert history.history["val_auc"][-1] > 0.6


@pytest.mark.gpu
def test_padded_lists_on_the_gpu_match_the_cpu(list_paths):
    paths, _ = list_paths
    options = {
        "cat_names": ["id"], "cont_names": [], "sparse_names": ["genres"],
        "sparse_as_dense": True, "sparse_max": {"genres": 3}, "batch_size": 32,
    }  # fmt: skip
    cpu = make_loader(paths, device="cpu", **options)
    gpu = make_loader(paths, device="cuda", **options)
    for a, b in zip(cpu, gpu, strict=True):
        np.testing.assert_array_equal(host(a[0]["genres"]), host(b[0]["genres"]))
        np.testing.assert_array_equal(host(a[0]["id"]), host(b[0]["id"]))


@pytest.mark.gpu
def test_shuffled_gpu_columns_reach_the_framework_without_a_copy(dataset_dir, monkeypatch):
    """A shuffled batch is gathered into fresh device memory, 64-byte aligned (rmm aligns
    to 256 bytes): its columns are handed over as they are, not copied for alignment."""
    from tabloader import tensors
    from tabloader.memory import address

    shared, copied = [], []
    original = tensors.BatchConverter.arrays

    def arrays(self, batch):
        out = original(self, batch)
        for name in self.columns:
            if name not in self.narrow:  # (ids JAX gets as int32 are new arrays)
                same = address(out[name]) == address(batch[name])
                (shared if same else copied).append(name)
        return out

    monkeypatch.setattr(tensors.BatchConverter, "arrays", arrays)
    loader = make_loader(dataset_dir([[300, 200]]), device="cuda", shuffle=True)
    assert sum(1 for _ in loader) == len(loader) == 16
    assert copied == [] and len(shared) >= 2 * 16


def test_a_growing_dataset_gives_each_epoch_and_each_fit_its_own_listing(tmp_path):
    """A ``refresh=True`` dataset is listed when an epoch starts: each epoch and each
    ``fit`` of one epoch sees the files that joined before it (each was cut to the
    previous epoch's batches)."""
    import keras

    from tabloader.keras import KerasSequenceLoader

    directory = tmp_path / "growing"
    directory.mkdir()

    def add(index: int, rows: int = 1_000) -> None:
        ids = np.arange(index * rows, (index + 1) * rows)
        table = pa.table({"id": ids, "x": (ids % 7).astype("float32"), "label": ids % 2 * 1.0})
        pq.write_table(table, directory / f"part-{index:03d}.parquet")

    add(0)
    train = KerasSequenceLoader(
        tabloader.Dataset(str(directory), refresh=True), batch_size=250, cat_names=["id"],
        cont_names=["x"], label_names=["label"], seed=0,
    )  # fmt: skip
    for epoch in range(3):
        ids = np.concatenate([np.asarray(f["id"]) for f, _ in train])
        assert sorted(ids.tolist()) == list(range((epoch + 1) * 1_000))
        add(epoch + 1)
    inputs = {
        "id": keras.Input(shape=(), name="id", dtype=np.dtype(id_dtype()).name),
        "x": keras.Input(shape=(1,), name="x"),
    }
    embedded = keras.layers.Embedding(10_000, 2)(inputs["id"])
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([embedded, inputs["x"]]))
    model = keras.Model(inputs, out)
    model.compile("sgd", "mse")
    steps: list[int] = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: steps.append(b))
    for k in range(2):
        steps.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # one fit an epoch: nothing is cut
            model.fit(train, epochs=1, verbose=0, callbacks=[counter])
        assert len(steps) == (4 + k) * 1_000 // 250
        add(4 + k)
    # One fit of several epochs counts the steps once: the later, longer epochs are cut
    # (their first batches trained again, the rest never), which is said.
    grow = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: add(6 + epoch))
    with pytest.warns(UserWarning, match=r"counted an epoch's batches when it started"):
        model.fit(train, epochs=3, verbose=0, callbacks=[grow])


@pytest.mark.parametrize("batches", [1, 2, 3])
def test_fit_trains_the_loaders_epochs_in_order_however_few_its_batches(tmp_path, batches):
    """Keras looks at the first batch before training (JAX and PyTorch build the model
    from it in a pass of their own): that look is not an epoch, and ``fit``'s first
    epoch trains the loader's epoch 0, its second epoch 1, however few its batches (a
    single batch was wholly served by the look, and fit's first epoch trained epoch 1)."""
    import keras

    table = pa.table({"x": np.arange(30, dtype=np.float32), "y": np.zeros(30, np.float32)})
    pq.write_table(table, tmp_path / "d.parquet")
    loader = make_loader(
        str(tmp_path / "d.parquet"), cat_names=[], cont_names=["x"], label_names=["y"],
        batch_size=-(-30 // batches), seed=1,
    )  # fmt: skip
    served: list[int] = []

    class Served(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            served.append(loader.epoch)

    x = keras.Input(shape=(), name="x")
    model = keras.Model({"x": x}, keras.layers.Dense(1)(keras.ops.expand_dims(x, -1)))
    model.compile("sgd", "mse")
    model.fit(loader, epochs=2, verbose=0, callbacks=[Served()])
    assert served == [0] * batches + [1] * batches


def test_a_state_saved_in_a_callback_counts_the_batches_trained_not_the_look(tmp_path):
    """On JAX and PyTorch, ``fit`` builds the model from a batch it asks for first and
    asks for again, as any index, at a random step of the epoch (``shuffle=True``): a
    state saved after 6 steps said 7 batches, and the resumed run never trained one."""
    import keras

    ids = np.arange(1000, dtype=np.int64)
    table = pa.table({"id": ids, "x": ids.astype(np.float32), "y": (ids % 2).astype(np.float32)})
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=100)

    def loader() -> Any:
        return make_loader(
            str(tmp_path / "p.parquet"), cat_names=["id"], cont_names=["x"],
            label_names=["y"], batch_size=64, seed=3,
        )  # fmt: skip

    class Saving(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 5:  # 6 steps trained
                self.state = train.state_dict()
                self.model.stop_training = True

    inputs = {
        "id": keras.Input(shape=(), name="id", dtype=np.dtype(id_dtype()).name),
        "x": keras.Input(shape=(), name="x"),
    }
    ids_too = keras.ops.cast(keras.ops.expand_dims(inputs["id"], -1), "float32")
    features = keras.layers.Concatenate()([ids_too, keras.ops.expand_dims(inputs["x"], -1)])
    model = keras.Model(inputs, keras.layers.Dense(1)(features))
    model.compile("sgd", "mse")
    train = loader()
    saving = Saving()
    model.fit(train, epochs=1, verbose=0, callbacks=[saving])
    assert saving.state["batches"] == 6
    resumed = loader()
    resumed.load_state_dict(saving.state)
    rest = np.concatenate([host(resumed[i][0]["id"]) for i in range(len(resumed))])
    whole = np.concatenate([host(b[0]["id"]) for b in loader()])
    np.testing.assert_array_equal(rest, whole[6 * 64 :])  # the run's own batches, after 6
