"""The Keras adapter on TensorFlow: what only TensorFlow does (the suite every backend
runs is ``test_keras.py``): feature columns, GPU memory, batches handed to the train step
on the device, 64-byte alignment, the GPU TensorFlow sees, and memory held until
TensorFlow's queued work is done."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader
from contract_tensorflow import make_loader

pytestmark = pytest.mark.tensorflow

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(autouse=True)
def _quiet(quiet_loader_warnings: None) -> None:
    """Every test here runs with the loader's advice silenced (see conftest)."""


@pytest.fixture(autouse=True)
def _tensorflow_backend() -> None:
    import keras

    if keras.backend.backend() != "tensorflow":
        pytest.skip("Keras runs on another backend in this session")


def run_python(code, env=None, timeout=120):
    full_env = {**os.environ, "PYTHONPATH": SRC, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


def test_the_nvtabular_import_gives_the_keras_classes():
    import tabloader.keras
    import tabloader.tensorflow

    assert tabloader.tensorflow.KerasSequenceLoader is tabloader.keras.KerasSequenceLoader
    assert tabloader.tensorflow.KerasSequenceValidater is tabloader.keras.KerasSequenceValidater


# -- feature columns ---------------------------------------------------------------------


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


# -- GPU memory ----------------------------------------------------------------------------


def test_memory_allocation_values():
    from tabloader.memory import memory_limit_mb

    assert memory_limit_mb("0.25", total_mb=80_000) == 20_000
    assert memory_limit_mb("8192", total_mb=None) == 8192
    for bad in ("half", "0", "-1", "inf", "nan"):
        with pytest.raises(tabloader.InvalidArgumentError, match="TF_MEMORY_ALLOCATION"):
            memory_limit_mb(bad, total_mb=1000)
    with pytest.raises(tabloader.InvalidArgumentError, match="give it in megabytes"):
        memory_limit_mb("0.5", total_mb=None)


@pytest.fixture
def two_gpus(monkeypatch):
    """TensorFlow's configuration calls, recorded, as if it saw two GPUs (this
    TensorFlow has none); what is checked is which calls tabloader makes."""
    import tensorflow as tf

    calls = []
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind: ["gpu0", "gpu1"])
    monkeypatch.setattr(tf.config, "get_logical_device_configuration", lambda gpu: None)
    monkeypatch.setattr(
        tf.config,
        "set_logical_device_configuration",
        lambda gpu, configs: calls.append((gpu, configs[0].memory_limit)),
    )
    monkeypatch.setattr(
        tf.config.experimental, "set_memory_growth", lambda gpu, on: calls.append((gpu, on))
    )
    monkeypatch.delenv("TF_MEMORY_ALLOCATION", raising=False)
    monkeypatch.delenv("TF_FORCE_GPU_ALLOW_GROWTH", raising=False)
    return calls


def test_memory_is_capped_by_tf_memory_allocation_and_grows_by_default(two_gpus, monkeypatch):
    import tabloader.keras_tensorflow as ktf

    assert ktf.apply_memory_allocation("4096") is True
    assert two_gpus == [("gpu0", 4096), ("gpu1", 4096)]
    monkeypatch.setattr(ktf, "gpu_total_mb", lambda index: 10_000.0)
    two_gpus.clear()
    monkeypatch.setenv("TF_MEMORY_ALLOCATION", "0.3")
    assert ktf.apply_memory_allocation() is True
    assert two_gpus == [("gpu0", 3000), ("gpu1", 3000)]
    # unset: memory growth, so that TensorFlow does not take the loader's memory
    monkeypatch.delenv("TF_MEMORY_ALLOCATION")
    two_gpus.clear()
    assert ktf.apply_memory_allocation() is True
    assert two_gpus == [("gpu0", True), ("gpu1", True)]
    two_gpus.clear()
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")  # TensorFlow's own switch
    assert ktf.apply_memory_allocation() is False
    assert two_gpus == []


def test_memory_settings_too_late_say_so(two_gpus, monkeypatch):
    import tensorflow as tf

    import tabloader.keras_tensorflow as ktf

    def too_late(*args):
        raise RuntimeError("Physical devices cannot be modified after being initialized")

    monkeypatch.setattr(tf.config, "set_logical_device_configuration", too_late)
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth", too_late)
    monkeypatch.setattr(ktf, "gpu_total_mb", lambda index: 10_000.0)
    with pytest.warns(RuntimeWarning, match=r"TF_MEMORY_ALLOCATION='0.3' was not applied"):
        assert ktf.apply_memory_allocation("0.3") is False
    with pytest.warns(RuntimeWarning, match="memory growth .* was not applied.*before TensorFlow"):
        assert ktf.apply_memory_allocation() is False
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind: [])
    assert ktf.apply_memory_allocation("0.3") is False  # no GPU: nothing to do
    with pytest.raises(tabloader.InvalidArgumentError, match="TF_MEMORY_ALLOCATION"):
        ktf.apply_memory_allocation("half")


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


# -- the GPU TensorFlow sees -----------------------------------------------------------------


def test_which_cuda_device_tensorflow_finds_dlpack_memory_on():
    from tabloader.tensors import tensorflow_gpu_index

    assert tensorflow_gpu_index(0, [0]) is None
    assert tensorflow_gpu_index(2, [0, 1, 2, 3]) is None
    assert "sees no GPU (tensorflow-cpu" in tensorflow_gpu_index(0, [])
    # one process per GPU with set_visible_devices: TensorFlow's GPU:0 is CUDA device 3
    assert "does not see CUDA device 1: it sees GPU(s) [3]" in tensorflow_gpu_index(1, [3])
    assert "its 'GPU:3' is not CUDA device 3" in tensorflow_gpu_index(3, [1, 3])
    assert "splits CUDA device 0 into 2 logical" in tensorflow_gpu_index(0, [0], {0: 2})
    assert "its 'GPU:1' is not CUDA device 1" in tensorflow_gpu_index(1, [0, 1], {0: 2})


def test_tensorflow_cpu_refuses_a_gpu_loader_at_construction():
    from tabloader.device import Device
    from tabloader.tensors import TensorflowTensors

    tensors = TensorflowTensors()
    tensors.check_device(Device("cuda", 0), ("cpu", 0))  # memory the host holds: fine
    with pytest.raises(
        tabloader.InvalidArgumentError,
        match=r"reads on cuda:0, but TensorFlow sees no GPU \(tensorflow-cpu.*"
        r"tensorflow\[and-cuda\].*CUDA_VISIBLE_DEVICES.*device='cpu'",
    ):
        tensors.check_device(Device("cuda", 0), ("cuda", 0))


# -- batches reach the train step as the loader made them ---------------------------------


def _click_loader(tmp_path, **options):
    from tabloader.synthetic import write_criteo_like

    files = write_criteo_like(tmp_path / "train", rows=3000, files=1, row_group_size=1000)
    return make_loader(
        files, batch_size=250, cat_names=["C1"], cont_names=["I1"], label_names=["label"],
        **options,
    )  # fmt: skip


def _click_model():
    import keras

    inputs = {"C1": keras.Input(shape=(), name="C1", dtype="int64"),
              "I1": keras.Input(shape=(), name="I1")}  # fmt: skip
    x = keras.layers.Concatenate()(
        [keras.layers.Embedding(2000, 2)(inputs["C1"]), keras.ops.expand_dims(inputs["I1"], -1)]
    )
    return inputs, keras.layers.Dense(1, activation="sigmoid")(x)


def _host_conversions(loader, fit):
    """How many of the loader's tensors were turned into numpy arrays (on a GPU, each a
    device-to-host copy) while ``fit`` ran; what ``fit`` returned; the loader's tensors."""
    from tensorflow.python.framework import ops
    from tensorflow.python.util import numpy_compat

    made: dict[int, object] = {}
    transform = loader.loader.transform

    def recording(batch):
        item = transform(batch)
        for tensor in [*item[0].values(), item[1]]:
            made[id(tensor)] = tensor  # kept, so that ids stay unique
        return item

    loader.loader.transform = recording
    converted = []
    # Where a tensor becomes a numpy array: its own methods, and the conversion of a
    # py-func's results (tf.data's from_generator), which uses the buffer protocol.
    hooks = [
        (ops._EagerTensorBase, "__array__"),
        (ops._EagerTensorBase, "numpy"),
        (numpy_compat, "np_asarray"),
    ]
    originals = [getattr(owner, name) for owner, name in hooks]

    def counting(original):
        def convert(value, *args, **kwargs):
            if id(value) in made:
                converted.append(id(value))
            return original(value, *args, **kwargs)

        return convert

    for (owner, name), original in zip(hooks, originals, strict=True):
        setattr(owner, name, counting(original))
    try:
        seen = fit(made)
    finally:
        for (owner, name), original in zip(hooks, originals, strict=True):
            setattr(owner, name, original)
        loader.loader.transform = transform
    return len(converted), seen, list(made.values())


def _memory(tensor):
    """Where a (host) tensor's data is; read after the counting above."""
    return np.asarray(tensor).ctypes.data


def test_fit_hands_the_batches_to_the_train_step_without_a_host_copy(tmp_path):
    import keras

    inputs, output = _click_model()

    class Recording(keras.Model):
        def train_step(self, data):
            self.seen.append(data[0]["C1"])
            return super().train_step(data)

    def fit(made):
        model = Recording(inputs, output)
        model.seen = []
        model.compile("sgd", "binary_crossentropy", run_eagerly=True)
        model.fit(loader, epochs=2, verbose=0)
        return model.seen

    loader = _click_loader(tmp_path)
    converted, seen, made = _host_conversions(loader, fit)
    assert converted == 0
    lent = {_memory(t) for t in made}
    assert [_memory(t) in lent for t in seen] == [True] * 24  # the loader's very memory
    # Keras' own way, tf.data.Dataset.from_generator, converts every tensor to numpy:
    # on a GPU a copy to the host and back. It is what the test above would catch.
    loader._device_batches = False
    converted, seen, made = _host_conversions(loader, fit)
    assert converted >= 2 * 24


def test_compiled_fit_evaluate_and_predict_take_the_batches_as_they_are(tmp_path):
    import keras

    inputs, output = _click_model()
    loader = _click_loader(tmp_path, shuffle=False)

    def run(made):
        model = keras.Model(inputs, output)
        model.compile("adam", "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
        model.fit(loader, epochs=2, verbose=0)
        model.evaluate(loader, verbose=0)
        assert model.predict(loader, verbose=0).shape == (3000, 1)
        return []

    converted, _, _ = _host_conversions(loader, run)
    assert converted == 0
    # class weights still apply (Keras computes them from the labels, on the host)
    model = keras.Model(inputs, output)
    model.compile("adam", "binary_crossentropy")
    history = model.fit(loader, epochs=1, verbose=0, class_weight={0: 1.0, 1: 2.0})
    assert len(history.history["loss"]) == 1


def test_under_a_strategy_of_its_own_keras_distributes_through_tf_data(tmp_path):
    import keras
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        inputs, output = _click_model()
        model = keras.Model(inputs, output)
        model.compile("sgd", "binary_crossentropy")
    history = model.fit(_click_loader(tmp_path), epochs=1, verbose=0)
    assert len(history.history["loss"]) == 1


def test_an_empty_loader_is_refused_by_keras_in_its_own_words(dataset_dir):
    import keras

    with pytest.warns(tabloader.EmptyEpochWarning):
        loader = make_loader(dataset_dir([[10]]), batch_size=64, drop_last=True)
    inputs = {"x": keras.Input(shape=(), name="x")}
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.ops.expand_dims(inputs["x"], -1)))
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match="PyDataset has length 0"):
        model.fit(loader, epochs=1, verbose=0)


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
        from tabloader.keras import _TENSORS, KerasSequenceLoader, _TensorMaker
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
        maker = _TensorMaker(_TENSORS)
        columns = pa.table({{"id": [1], "x": [1.0], "label": [1.0]}})
        maker.set_columns(tabloader.Loader(columns, cats=["id"], conts=["x"], labels=["label"],
                                           batch_size=1, device="cpu"), _TENSORS.dtypes())
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


def _tensorflow_on_the_emulated_gpu(monkeypatch):
    """TensorFlow's device side on the emulated GPU (``emulated_gpu/frameworks.py``): the
    adapter's tensors are imported as TensorFlow imports them (a capsule, no stream told)
    and read by its steps on a non-blocking stream of its own; ``sync_devices`` is its
    host wait. Skips on a real GPU, where TensorFlow itself runs."""
    import cupy

    if not getattr(cupy, "__emulated__", False):
        pytest.skip("TensorFlow's streams are emulated on the emulated device only")
    import tensorflow as tf

    from emulated_gpu.frameworks import TensorflowOnGpu
    from tabloader import tensors

    tf_gpu = TensorflowOnGpu()
    monkeypatch.setattr(
        tensors.TensorflowTensors,
        "tensor",
        lambda self, array: tf_gpu.from_dlpack(array.__dlpack__()),
    )
    monkeypatch.setattr(tf.test.experimental, "sync_devices", tf_gpu.sync_devices)
    return tf_gpu


@pytest.mark.gpu
def test_memory_tensorflow_let_go_of_is_reused_only_after_its_queued_work(dataset_dir, monkeypatch):
    """TensorFlow frees a DLPack tensor's memory when its last tensor is dropped, while
    its kernels reading it may still be queued on its own stream; the loader writes that
    memory again only after the host waited for TensorFlow (``sync_devices``), once every
    few batches. Each step here reads its batch on TensorFlow's stream, queued behind a
    slow kernel: the emulated device refuses a write into memory a step still reads, and
    a step's read of a batch not complete yet."""
    tf_gpu = _tensorflow_on_the_emulated_gpu(monkeypatch)
    from emulated_gpu.frameworks import sleep
    from tabloader import tensors

    loader = make_loader(dataset_dir([[100] * 4]), device="cuda", batch_size=10, parts_per_chunk=1)
    ids = []
    for _ in range(2):
        for features, labels in loader:
            sleep(0.002, tf_gpu.stream)
            tf_gpu.step(features, labels)
            ids.append(tf_gpu.copy(features["id"]))  # read later: no host wait now
            del features, labels  # TensorFlow lets go of the batch here
    tf_gpu.sync_devices()
    assert sorted(np.concatenate(ids).ravel().tolist()) == sorted(list(range(400)) * 2)
    fence = loader.loader.backend.xp.memory.consumer
    assert isinstance(fence, tensors.HostFence)
    assert fence.syncs >= 2 * len(loader) // tensors.FENCE_BATCHES - 1


@pytest.mark.gpu
def test_without_the_fence_memory_would_be_reused_under_tensorflow(dataset_dir, monkeypatch):
    """The previous test can fail: without waiting for TensorFlow, the loader writes a
    batch's memory while a step TensorFlow queued still reads it."""
    tf_gpu = _tensorflow_on_the_emulated_gpu(monkeypatch)
    from cupy.cuda import RaceError

    from emulated_gpu.frameworks import settle, sleep
    from tabloader import tensors

    monkeypatch.setattr(tensors.TensorflowTensors, "release_fence", lambda self, device: None)
    loader = make_loader(dataset_dir([[100] * 4]), device="cuda", batch_size=10, parts_per_chunk=1)

    def train() -> None:
        for features, labels in loader:
            sleep(0.002, tf_gpu.stream)
            tf_gpu.step(features, labels)
            del features, labels

    try:
        with pytest.raises(RaceError, match=r"may still use it|still reads"):
            train()
    finally:
        settle()


# -- examples and docs --------------------------------------------------------------


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


def test_the_keras_page_runs(tmp_path, monkeypatch):
    page = Path(__file__).resolve().parents[1] / "docs" / "keras.md"
    blocks = page.read_text().split("```python\n")[1:]
    code = "\n".join(block.split("```")[0] for block in blocks)
    assert "KerasSequenceValidater(valid)" in code
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "keras_page"}
    exec(compile(code, str(page), "exec"), namespace)
