"""KerasSequenceLoader and KerasSequenceValidater (the contract suite runs through them too)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader

pytestmark = pytest.mark.tensorflow

SRC = str(Path(__file__).resolve().parents[1] / "src")
CATS, CONTS, LABELS = ["id", "cat"], ["x"], ["label"]


@pytest.fixture(autouse=True)
def _quiet(quiet_loader_warnings: None) -> None:
    """Every test here runs with the loader's advice silenced (see conftest)."""


def make_loader(paths, **options):
    from tabloader.tensorflow import KerasSequenceLoader

    kwargs = {
        "batch_size": 32,
        "cat_names": CATS,
        "cont_names": CONTS,
        "label_names": LABELS,
        "shuffle": True,
        "seed": 5,
    }
    kwargs.update(options)
    return KerasSequenceLoader(paths, **kwargs)


def ids(item):
    return item[0]["id"].numpy()


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


def run_python(code, env=None, timeout=120):
    full_env = {**os.environ, "PYTHONPATH": SRC, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


# -- items --------------------------------------------------------------------------


def test_items_are_named_tensors_of_the_delivered_dtypes(dataset_dir):
    import tensorflow as tf

    loader = make_loader(dataset_dir([[100, 60]]), shuffle=False)
    features, labels = loader[0]
    assert sorted(features) == ["cat", "id", "x"]
    assert all(isinstance(t, tf.Tensor) for t in [*features.values(), labels])
    assert features["id"].dtype == features["cat"].dtype == tf.int64
    assert features["x"].dtype == labels.dtype == tf.float32
    assert features["id"].shape == features["x"].shape == labels.shape == (32,)
    np.testing.assert_array_equal(features["id"].numpy(), np.arange(32))
    np.testing.assert_array_equal(features["cat"].numpy(), np.arange(32) % 1000)
    np.testing.assert_array_equal(features["x"].numpy(), np.arange(32) / 4)
    np.testing.assert_array_equal(labels.numpy(), np.arange(32) % 2)


def test_several_labels_come_as_a_dict_and_no_label_as_features_alone(dataset_dir):
    paths = dataset_dir([[50]])
    features, labels = make_loader(paths, cont_names=[], label_names=["x", "label"])[0]
    assert sorted(features) == ["cat", "id"]
    assert sorted(labels) == ["label", "x"]
    np.testing.assert_array_equal(labels["x"].numpy(), features["id"].numpy() / 4)
    item = make_loader(paths, label_names=[])[0]
    assert isinstance(item, dict)
    assert sorted(item) == ["cat", "id", "x"]


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
    # fit(): Keras takes items 0 and 1 to learn their structure, calls on_epoch_end,
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
    # evaluate(steps=3) twice, then a whole epoch: the same three batches each time,
    # then every row once.
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
        make_loader(paths, sparse_names=["x"])
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
    from tabloader.memory import total_memory_bytes

    paths = dataset_dir([[25] * 8])
    small = make_loader(paths, buffer_size=50)
    large = make_loader(paths, buffer_size=150)
    assert (small.loader.chunk_rows, large.loader.chunk_rows) == (50, 150)
    assert small.loader.plan(0).num_chunks == 4
    assert large.loader.plan(0).num_chunks == 2
    fraction = make_loader(paths, buffer_size=1e-6)
    row_bytes = 8 + 8 + 4 + 4  # id, cat as int64; x, label as float32
    assert fraction.loader.chunk_rows == max(int(1e-6 * total_memory_bytes()) // row_bytes, 32)
    page, pages = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_PHYS_PAGES")
    assert abs(total_memory_bytes() - page * pages) <= 0.01 * page * pages
    for bad in (0, 1.0, 2.5, -0.1, True, "0.1"):
        with pytest.raises(tabloader.InvalidArgumentError, match="buffer_size"):
            make_loader(paths, buffer_size=bad)
    with pytest.raises(tabloader.InvalidArgumentError, match="not both"):
        make_loader(paths, buffer_size=100, parts_per_chunk=2)


def test_feature_columns_name_cats_and_conts(dataset_dir):
    import tensorflow as tf

    from tabloader.tensorflow import feature_column_names

    fc = tf.feature_column
    columns = [
        fc.embedding_column(fc.categorical_column_with_identity("id", 1000), 4),
        fc.indicator_column(fc.categorical_column_with_identity("cat", 1000)),
        fc.numeric_column("x", (1,)),
    ]
    loader = make_loader(
        dataset_dir([[64]]), cat_names=None, cont_names=None, feature_columns=columns
    )
    assert (loader.loader.cats, loader.loader.conts) == (("id", "cat"), ("x",))
    features, _ = loader[0]
    assert sorted(features) == ["cat", "id", "x"]

    more = [
        fc.categorical_column_with_identity("a", 5),
        fc.bucketized_column(fc.numeric_column("b"), [0.0, 1.0]),
        fc.weighted_categorical_column(fc.categorical_column_with_identity("c", 5), "w"),
        fc.categorical_column_with_vocabulary_list("d", [1, 2], dtype=tf.int64),
        fc.numeric_column("b"),
    ]
    assert feature_column_names(more) == (["a", "c", "d"], ["b", "w"])
    with pytest.raises(tabloader.InvalidArgumentError, match="crossed feature column"):
        feature_column_names([fc.crossed_column(["a", "c"], 10)])
    with pytest.raises(tabloader.InvalidArgumentError, match="either categorical or continuous"):
        feature_column_names([fc.numeric_column("a"), fc.categorical_column_with_identity("a", 3)])
    with pytest.raises(tabloader.InvalidArgumentError, match=r"must hold tf\.feature_column"):
        feature_column_names(["id"])
    with pytest.raises(tabloader.InvalidArgumentError, match="not both"):
        make_loader(dataset_dir([[10]]), feature_columns=columns)


def test_feature_columns_without_tf_feature_column_say_what_to_pass(monkeypatch):
    import tensorflow as tf

    from tabloader.tensorflow import feature_column_names

    monkeypatch.delattr(tf, "feature_column", raising=False)
    with pytest.raises(tabloader.InvalidArgumentError, match=r"cat_names=\[...\] and cont_names"):
        feature_column_names([object()])


# -- TF_MEMORY_ALLOCATION -----------------------------------------------------------


def test_memory_allocation_values():
    from tabloader.tensorflow import memory_limit_mb

    assert memory_limit_mb("0.25", total_mb=80_000) == 20_000
    assert memory_limit_mb("8192", total_mb=None) == 8192
    for bad in ("half", "0", "-1", "inf", "nan"):
        with pytest.raises(tabloader.InvalidArgumentError, match="TF_MEMORY_ALLOCATION"):
            memory_limit_mb(bad, total_mb=1000)
    with pytest.raises(tabloader.InvalidArgumentError, match="give it in megabytes"):
        memory_limit_mb("0.5", total_mb=None)


def test_memory_allocation_caps_each_gpu_or_warns_when_too_late(monkeypatch):
    import tensorflow as tf

    import tabloader.tensorflow as ktl

    applied = []
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind: ["gpu0", "gpu1"])
    monkeypatch.setattr(
        tf.config,
        "set_logical_device_configuration",
        lambda gpu, configs: applied.append((gpu, configs[0].memory_limit)),
    )
    assert ktl.apply_memory_allocation("4096") is True
    assert applied == [("gpu0", 4096), ("gpu1", 4096)]
    monkeypatch.setattr(ktl, "_gpu_total_mb", lambda index: 10_000.0)
    applied.clear()
    assert ktl.apply_memory_allocation("0.3") is True
    assert applied == [("gpu0", 3000), ("gpu1", 3000)]

    def too_late(gpu, configs):
        raise RuntimeError("Virtual devices cannot be modified after being initialized")

    monkeypatch.setattr(tf.config, "set_logical_device_configuration", too_late)
    with pytest.warns(RuntimeWarning, match="already initialised its GPUs"):
        assert ktl.apply_memory_allocation("0.3") is False
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind: [])
    assert ktl.apply_memory_allocation("0.3") is False  # no GPU: nothing to do
    monkeypatch.delenv("TF_MEMORY_ALLOCATION", raising=False)
    assert ktl.apply_memory_allocation() is False


def test_importing_tabloader_leaves_tensorflow_alone():
    result = run_python(
        """
        import sys, tabloader
        assert "tensorflow" not in sys.modules and "keras" not in sys.modules
        import tabloader.tensorflow, tensorflow as tf
        print(len(tf.config.list_physical_devices("GPU")))
        """,
        env={"TF_MEMORY_ALLOCATION": "0.5"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "0"


# -- memory handed to TensorFlow ----------------------------------------------------


def test_tensors_are_aligned_copies_in_a_subprocess(tmp_path):
    """TensorFlow aborts the whole process on unaligned DLPack memory: run it aside."""
    table = pa.table(
        {
            "id": np.arange(301, dtype=np.int64),
            "cat": (np.arange(301) % 7).astype(np.int32),
            "x": np.arange(301, dtype=np.float64) / 4,
            "label": (np.arange(301) % 2).astype(np.int8),
        }
    )
    pq.write_table(table, tmp_path / "odd.parquet", row_group_size=37)
    result = run_python(
        f"""
        import warnings, numpy as np, pyarrow as pa, tensorflow as tf
        import tabloader
        from tabloader.tensorflow import KerasSequenceLoader, _TensorMaker
        warnings.simplefilter("ignore", tabloader.PerformanceWarning)
        path = {str(tmp_path / "odd.parquet")!r}
        for batch_size in (1, 3, 7, 13, 64):
            for shuffle in (False, True):
                loader = KerasSequenceLoader(path, batch_size=batch_size, cat_names=["id", "cat"],
                                             cont_names=["x"], label_names=["label"],
                                             shuffle=shuffle, seed=1, buffer_size=50)
                total = 0
                for features, label in loader:
                    ids = features["id"]
                    # each op below reads the tensor's memory through Eigen
                    total += int(tf.reduce_sum(ids))
                    tf.debugging.assert_equal(features["cat"], ids % 7)
                    tf.debugging.assert_equal(features["x"], tf.cast(ids, tf.float32) / 4)
                    tf.debugging.assert_equal(label, tf.cast(ids % 2, tf.float32))
                assert total == 300 * 301 // 2, (batch_size, shuffle, total)
        # views that must not reach TensorFlow as they are: misaligned, strided, read-only
        maker = _TensorMaker()
        columns = pa.table({{"id": [1], "x": [1.0], "label": [1.0]}})
        maker.set_columns(tabloader.Loader(columns, cats=["id"], conts=["x"], labels=["label"],
                                           batch_size=1, device="cpu"))
        raw = np.arange(4000, dtype=np.int64)
        block = np.arange(3000, dtype=np.float32).reshape(1000, 3)
        frozen = np.arange(1001, dtype=np.float32)
        frozen.flags.writeable = False
        for start in range(1, 9):
            batch = {{"id": raw[start:start + 500], "x": block[:500, 1],
                     "label": frozen[start:start + 500]}}
            features, label = maker(batch)
            assert int(tf.reduce_sum(features["id"])) == int(raw[start:start + 500].sum())
            assert float(tf.reduce_max(features["x"])) == float(block[499, 1])
            assert float(tf.reduce_min(label)) == float(start)
        print("ok")
        """
    )
    assert result.returncode == 0, f"rc={result.returncode}\n{result.stderr[-3000:]}"
    assert result.stdout.strip().endswith("ok")


def test_unaligned_dlpack_memory_does_abort_tensorflow():
    """The hazard the previous test guards against is real (so that test can fail)."""
    result = run_python(
        """
        import numpy as np, tensorflow as tf
        memory = np.zeros(1000, dtype=np.int64)
        view = next(memory[s:s + 500] for s in range(8) if memory[s:].ctypes.data % 64)
        tensor = tf.experimental.dlpack.from_dlpack(view.__dlpack__())
        print(int(tf.reduce_sum(tensor)))
        """
    )
    assert result.returncode != 0
    assert "IsAligned" in result.stderr


# -- training -----------------------------------------------------------------------


@pytest.fixture
def click_data(tmp_path):
    from tabloader.synthetic import write_criteo_like

    train = write_criteo_like(tmp_path / "train", rows=6000, files=2, row_group_size=1000, seed=1)
    valid = write_criteo_like(tmp_path / "valid", rows=1500, files=1, row_group_size=500, seed=2)
    return train, valid


def click_model(cats=("C1", "C9"), conts=("I1", "I2")):
    import keras

    inputs = {n: keras.Input(shape=(), name=n, dtype="int64") for n in cats}
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


def click_loader(files, shuffle, batch_size=256):
    from tabloader.tensorflow import KerasSequenceLoader

    return KerasSequenceLoader(
        files,
        batch_size=batch_size,
        cat_names=["C1", "C9"],
        cont_names=["I1", "I2"],
        label_names=["label"],
        shuffle=shuffle,
        seed=0,
    )


def test_fit_with_the_validater_logs_val_metrics_for_history_and_callbacks(click_data):
    import keras

    from tabloader.tensorflow import KerasSequenceValidater

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

    from tabloader.tensorflow import KerasSequenceValidater

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
    x = {n: table[n].to_numpy().astype(np.int64) for n in ["C1", "C9"]}
    x.update({n: table[n].to_numpy().astype(np.float32) for n in ["I1", "I2"]})
    y = table["label"].to_numpy().astype(np.float32)
    expected = model.evaluate(x, y, batch_size=200, verbose=0, return_dict=True)
    for name, value in expected.items():
        np.testing.assert_allclose(history.history[f"val_{name}"][-1], value, rtol=1e-5)


def test_predict_with_a_loader_without_labels(click_data):
    train, _ = click_data
    from tabloader.tensorflow import KerasSequenceLoader

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


def test_the_criteo_example_trains(tmp_path, capsys):
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "examples" / "criteo" / "train_keras.py"
    spec = importlib.util.spec_from_file_location("criteo_train_keras", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = ["--data", str(tmp_path), "--rows", "2000", "--epochs", "2", "--batch-size", "1000"]
    history = example.main(["--synthetic", *args, "--buckets", "100", "--embedding-dim", "2"])
    assert set(history.history) == {"loss", "auc", "val_loss", "val_auc"}
    assert len(list((tmp_path / "train").glob("*.parquet"))) == 4
    assert capsys.readouterr().out.count("val_auc") == 2


# -- documentation ------------------------------------------------------------------


def test_the_keras_page_runs(tmp_path, monkeypatch):
    page = Path(__file__).resolve().parents[1] / "docs" / "keras.md"
    blocks = page.read_text().split("```python\n")[1:]
    code = "\n".join(block.split("```")[0] for block in blocks)
    assert "KerasSequenceValidater(valid)" in code
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "keras_page"}
    exec(compile(code, str(page), "exec"), namespace)
