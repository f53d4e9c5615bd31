"""Every entry point takes both spellings of the column options, checks its booleans and
options, and answers an unknown keyword with the closest known one; importing the Keras
adapter is quiet."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import tabloader

ROOT = Path(__file__).resolve().parents[1]
TABLE = pa.table(
    {
        "user": pa.array(range(10), pa.int64()),
        "x": pa.array(np.arange(10) / 2, pa.float64()),
        "y": pa.array([0, 1] * 5, pa.int64()),
    }
)


def test_the_core_takes_nvtabulars_names_too():
    ours = tabloader.Loader(TABLE, cats=["user"], conts="x", labels=["y"], batch_size=4)
    theirs = tabloader.Loader(
        TABLE, cat_names=["user"], cont_names="x", label_names=["y"], batch_size=4
    )
    assert (theirs.cats, theirs.conts, theirs.labels) == (("user",), ("x",), ("y",))
    for a, b in zip(ours, theirs, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize(
    ("ours", "theirs"), [("cats", "cat_names"), ("conts", "cont_names"), ("labels", "label_names")]
)
def test_both_spellings_of_one_option_are_refused(ours, theirs):
    with pytest.raises(
        tabloader.InvalidArgumentError,
        match=f"{ours}= and {theirs}= are two names for the same option: give one of them",
    ):
        tabloader.Loader(TABLE, **{ours: ["x"], theirs: ["x"]}, batch_size=2)


def test_an_unknown_keyword_names_the_closest_one():
    with pytest.raises(TypeError, match=r"Loader\(\) got an unexpected keyword argument "
                       r"'batch_sise'; did you mean 'batch_size'\?"):  # fmt: skip
        tabloader.Loader(TABLE, cats=["user"], batch_size=2, batch_sise=3)
    with pytest.raises(TypeError, match="'suffle'; did you mean 'shuffle'"):
        tabloader.Loader(TABLE, cats=["user"], batch_size=2, suffle=True)


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [("shuffle", "no", "True, False or 'global'"), ("drop_last", "False", "True or False")],
)
def test_booleans_from_a_config_file_are_refused(name, value, allowed):
    with pytest.raises(
        tabloader.InvalidArgumentError, match=f"{name} must be {allowed}, got '{value}'"
    ):
        tabloader.Loader(TABLE, cats=["user"], batch_size=2, **{name: value})


# -- PyTorch ------------------------------------------------------------------------------


@pytest.mark.torch
def test_torch_takes_both_spellings_and_the_dtypes():
    import torch

    from tabloader.torch import TorchAsyncItr

    itr = TorchAsyncItr(
        TABLE,
        cat_names=["user"],
        conts=["x"],
        label_names=["y"],
        batch_size=10,
        label_dtype="int64",
        cat_dtype="int32",
        cont_dtype="float64",
        device="cpu",
    )
    x_cat, x_cont, y = next(iter(itr))
    assert (x_cat.dtype, x_cont.dtype, y.dtype) == (torch.int32, torch.float64, torch.int64)
    assert y.tolist() == [0, 1] * 5  # class indices, ready for CrossEntropyLoss
    assert itr.cats == ("user",)
    with pytest.raises(tabloader.InvalidArgumentError, match="label_dtype must be a numeric"):
        TorchAsyncItr(TABLE, cats=["user"], batch_size=2, label_dtype="str", device="cpu")
    with pytest.raises(tabloader.InvalidArgumentError, match="labels= and label_names= are"):
        TorchAsyncItr(TABLE, labels=["y"], label_names=["y"], batch_size=2, device="cpu")


@pytest.mark.torch
def test_torch_checks_its_booleans_and_names_unknown_keywords():
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    for name, value in (("shuffle", "no"), ("drop_last", "False"), ("shuffle_within_batch", 1)):
        with pytest.raises(tabloader.InvalidArgumentError, match=f"{name} must be True"):
            TorchAsyncItr(TABLE, cats=["user"], batch_size=2, device="cpu", **{name: value})
    with pytest.raises(TypeError, match=r"TorchAsyncItr\(\) .* 'label_dtypes'; did you mean "
                       r"'label_dtype'\?"):  # fmt: skip
        TorchAsyncItr(TABLE, cats=["user"], batch_size=2, device="cpu", label_dtypes="int64")
    itr = TorchAsyncItr(TABLE, cats=["user"], batch_size=2, device="cpu")
    with pytest.raises(TypeError, match=r"DLDataLoader\(\) .* 'num_worker'; did you mean "
                       r"'num_workers'\?"):  # fmt: skip
        DLDataLoader(itr, num_worker=2)


# -- Keras --------------------------------------------------------------------------------


@pytest.mark.tensorflow
def test_keras_takes_the_cores_names_too():
    from tabloader.tensorflow import KerasSequenceLoader

    loader = KerasSequenceLoader(
        TABLE, cats=["user"], cont_names=["x"], labels="y", batch_size=10, shuffle=False
    )
    features, labels = loader[0]
    assert sorted(features) == ["user", "x"]
    assert labels.numpy().tolist() == [0.0, 1.0] * 5
    with pytest.raises(tabloader.InvalidArgumentError, match="cats= and cat_names= are two"):
        KerasSequenceLoader(TABLE, cats=["user"], cat_names=["user"], label_names=["y"],
                            batch_size=2)  # fmt: skip


@pytest.mark.tensorflow
def test_keras_takes_every_loader_keyword():
    from tabloader.tensorflow import KerasSequenceLoader

    loader = KerasSequenceLoader(
        TABLE, cat_names=["user"], cont_names=["x"], label_names=["y"], batch_size=10,
        cat_dtype="int32", cont_dtype="float64", label_dtype="int64", chunk_rows=10, prefetch=2,
        shuffle=False,
    )  # fmt: skip
    features, labels = loader[0]
    assert (features["user"].dtype.name, features["x"].dtype.name) == ("int32", "float64")
    assert labels.dtype.name == "int64" and labels.numpy().tolist() == [0, 1] * 5
    assert (loader.loader.chunk_rows, loader.loader.prefetch) == (10, 2)
    with pytest.raises(tabloader.InvalidArgumentError, match="buffer_size and chunk_rows both"):
        KerasSequenceLoader(TABLE, cat_names=["user"], label_names=["y"], batch_size=2,
                            buffer_size=4, chunk_rows=4)  # fmt: skip
    with pytest.raises(TypeError, match=r"KerasSequenceLoader\(\) .* 'layout'"):
        KerasSequenceLoader(TABLE, cat_names=["user"], label_names=["y"], batch_size=2,
                            layout="stacked")  # fmt: skip


@pytest.mark.tensorflow
def test_keras_without_labels_fails_at_construction_unless_told_it_predicts():
    from tabloader.tensorflow import KerasSequenceLoader

    with pytest.raises(
        tabloader.InvalidArgumentError,
        match=r"KerasSequenceLoader needs label_names= \(the target columns\) to train.*"
        r"To predict on data without labels, pass label_names=\[\]",
    ):
        KerasSequenceLoader(TABLE, cat_names=["user"], batch_size=5)
    for no_labels in ({"label_names": []}, {"labels": []}):
        item = KerasSequenceLoader(TABLE, cat_names=["user"], batch_size=5, **no_labels)[0]
        assert isinstance(item, dict)  # features alone, for predict
        assert sorted(item) == ["user"]


@pytest.mark.tensorflow
def test_keras_checks_its_booleans_and_names_unknown_keywords():
    from tabloader.tensorflow import KerasSequenceLoader

    options = {"cat_names": ["user"], "label_names": ["y"], "batch_size": 2}
    for name, value in (("shuffle", "no"), ("drop_last", "False")):
        with pytest.raises(tabloader.InvalidArgumentError, match=f"{name} must be True"):
            KerasSequenceLoader(TABLE, **options, **{name: value})
    with pytest.raises(TypeError, match=r"KerasSequenceLoader\(\) .* 'label_name'; did you "
                       r"mean 'label_names'\?"):  # fmt: skip
        KerasSequenceLoader(TABLE, cat_names=["user"], batch_size=2, label_name=["y"])
    with pytest.raises(tabloader.InvalidArgumentError, match="does not support workers="):
        KerasSequenceLoader(TABLE, **options, workers=4)


# -- quiet logs ---------------------------------------------------------------------------

# What TensorFlow 2.21 prints while importing, whatever TF_CPP_MIN_LOG_LEVEL says (its
# absl logging starts before it reads the variable): nothing tabloader can switch off.
TF_UNCONDITIONAL = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on.",
)


def _import_stderr(extra_env: dict[str, str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update({"PYTHONPATH": str(ROOT / "src"), **extra_env})
    result = subprocess.run(
        [sys.executable, "-c", "import tabloader.tensorflow"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    return result.stderr.splitlines()


@pytest.mark.tensorflow
@pytest.mark.slow
def test_importing_the_keras_adapter_is_quiet_unless_asked():
    quiet = _import_stderr({})
    assert [line for line in quiet if not any(u in line for u in TF_UNCONDITIONAL)] == []
    # the user's own choice is kept: level 0 shows TensorFlow's informational logs
    chatty = _import_stderr({"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert len(chatty) > len(quiet)


@pytest.mark.dask
def test_loading_a_dask_frame_shows_no_warnings_from_inside_dask(tmp_path):
    import warnings

    import dask.dataframe as dd

    from tabloader.synthetic import write_criteo_like

    write_criteo_like(tmp_path, rows=2000, files=2, row_group_size=500)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = dd.read_parquet(str(tmp_path))
        loader = tabloader.Loader(
            tabloader.Dataset(frame), cats=["C1"], labels=["label"], batch_size=500
        )
        assert sum(len(b["C1"]) for b in loader) == 2000
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []
