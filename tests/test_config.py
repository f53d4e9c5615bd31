"""The loader's options, declared once (tabloader.config): the config, the keywords the
adapters pass on, and the checks against the data, without building a loader."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pyarrow as pa
import pytest

import tabloader
from tabloader.checks import check_dataset
from tabloader.config import ALIASES, LOADER_KEYWORDS, LoaderConfig, LoaderOptions
from tabloader.options import keywords_of

TABLE = pa.table({"user": [3, 1, 2], "x": [0.5, None, 1.5], "y": [0.0, 1.0, 0.0]})


def test_the_typed_options_are_the_configs_options():
    assert set(LoaderOptions.__annotations__) == set(LOADER_KEYWORDS)
    fields = {f.metadata.get("keyword", f.name) for f in dataclasses.fields(LoaderConfig)}
    assert set(LOADER_KEYWORDS) - set(ALIASES) <= fields
    assert set(ALIASES.values()) <= fields


def test_the_loader_takes_its_own_keywords_and_the_options_nothing_else():
    own = set(keywords_of(tabloader.Loader.__init__))
    assert own == {"dataset", "batch_size", "layout", "device", "transform"}
    options = inspect.signature(tabloader.Loader.__init__).parameters["options"]
    assert options.annotation == "Unpack[LoaderOptions]"
    with pytest.raises(TypeError, match="'shufle'; did you mean 'shuffle'"):
        tabloader.Loader(TABLE, cats=["user"], batch_size=2, shufle=True)


def test_a_built_config_is_normalised_and_immutable():
    config = LoaderConfig.build(
        batch_size=2,
        cat_names="user",
        conts=["x"],
        shuffle="global",
        cache="memory",
        fill_null=0,
        sparse_names=["tags"],
        seed=5,
    )
    assert (config.cats, config.conts, config.labels) == (("user", "tags"), ("x",), ())
    assert (config.shuffle, config.cache_mode) == ("global", "memory")
    assert config.fill_null == {"user": 0, "tags": 0, "x": 0}
    assert config.dtypes == {
        "user": np.dtype("int64"),
        "tags": np.dtype("int64"),
        "x": np.dtype("float32"),
    }
    assert (config.seed, config.seed_given) == (5, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.batch_size = 4  # type: ignore[misc]
    assert list(config.plan_options()) == [
        "batch_size",
        "shuffle_within_batch",
        "drop_last",
        "global_rank",
        "global_size",
        "parts_per_chunk",
        "chunk_rows",
    ]
    assert config.order_options()["shuffle"] == "global"
    assert config.order_options()["cache"] is True


def test_a_config_without_a_seed_draws_one():
    first, second = (LoaderConfig.build(batch_size=1, cats="a") for _ in range(2))
    assert not first.seed_given and first.seed != second.seed


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
        ({"cats": ["a"], "cat_names": ["b"]}, "cats= and cat_names= are two names"),
        ({}, "no columns selected"),
        ({"cats": "a", "conts": "a"}, r"column\(s\) \['a'\] are listed more than once"),
        ({"cats": "a", "parts_per_chunk": 2, "chunk_rows": 9}, "parts_per_chunk or chunk_rows"),
        ({"cats": "a", "global_rank": 2, "global_size": 2}, r"global_rank must be in \[0, 2\)"),
        ({"cats": "a", "shuffle": "yes"}, "shuffle must be True, False or 'global'"),
        ({"cats": "a", "shuffle": "global"}, "shuffle='global' permutes all"),
        ({"cats": "a", "shuffle": True, "global_size": 2, "global_rank": 1}, "same seed="),
        ({"cats": "a", "label_dtype": "str"}, "label_dtype must be a numeric dtype"),
        ({"cats": "a", "fill_null": {"b": 0}}, r"fill_null names \['b'\]"),
        ({"sparse_names": "t", "sparse_as_dense": True}, "sparse_max has no entry"),
        (
            {"sparse_names": "t", "sparse_as_dense": True, "sparse_max": {"t": 2}, "sparse_pad": -1,
             "cat_dtype": "uint8"},
            "sparse_pad is -1, which does not fit cat_dtype=uint8",
        ),
    ],
)  # fmt: skip
def test_a_config_is_checked_where_it_is_built(options, message):
    with pytest.raises(tabloader.InvalidArgumentError, match=message):
        LoaderConfig.build(**{"batch_size": 2, **options})


def test_the_checks_against_the_data_run_without_a_loader():
    dataset = tabloader.Dataset(TABLE)
    checked = check_dataset(LoaderConfig.build(batch_size=2, cats="user"), dataset, stacklevel=1)
    assert checked.types == {"user": pa.int64()} and checked.narrowed == frozenset()
    with pytest.raises(
        tabloader.NullValuesError, match="column with null values and no fill value: 'x'"
    ):
        check_dataset(LoaderConfig.build(batch_size=2, conts="x"), dataset, stacklevel=1)
    with pytest.raises(tabloader.ColumnTypeError, match="categorical column 'x' is double"):
        check_dataset(LoaderConfig.build(batch_size=2, cats="x"), dataset, stacklevel=1)
    narrow = LoaderConfig.build(batch_size=2, cats="user", cat_dtype="int8", fill_null=300)
    with pytest.raises(tabloader.InvalidArgumentError, match="fill_null for 'user' is 300"):
        check_dataset(narrow, dataset, stacklevel=1)
    with pytest.warns(tabloader.EmptyEpochWarning, match="this loader yields no batch"):
        check_dataset(
            LoaderConfig.build(batch_size=4, cats="user", drop_last=True), dataset, stacklevel=1
        )


def test_a_loaders_options_are_its_configs_and_stay_fixed():
    loader = tabloader.Loader(TABLE, cat_names=["user"], batch_size=2, fill_null=0)
    assert loader.cats == loader.config.cats == ("user",)
    assert loader.fill_null == {"user": 0} and loader.columns == ("user",)
    with pytest.raises(AttributeError, match="batch_size is fixed when the Loader is built"):
        loader.batch_size = 3
    with pytest.raises(AttributeError, match="has no attribute 'no_such_option'"):
        _ = loader.no_such_option


def test_every_null_column_is_named_in_one_error_with_a_ready_fill(tmp_path):
    import re

    import pyarrow.parquet as pq

    table = pa.table(
        {
            "price": [1.0, None, 3.0, 4.0],
            "dwell_sec": [None, 2.0, 3.0, 4.0],
            "user": pa.array([1, 2, None, 4]),
            "label": [0.0, 1.0, 0.0, 1.0],
        }
    )
    pq.write_table(table, tmp_path / "clicks.parquet")
    dataset = tabloader.Dataset(str(tmp_path / "clicks.parquet"))
    options = {"conts": ["price", "dwell_sec"], "cats": ["user"], "labels": ["label"]}
    with pytest.raises(tabloader.NullValuesError) as info:
        tabloader.Loader(dataset, batch_size=2, fill_null={"user": -1}, **options)
    message = str(info.value)
    assert message.startswith("2 columns with null values and no fill value: 'price' in ")
    assert "'dwell_sec' in " in message and "'user'" not in message.split("fill_null=")[0]
    ready = re.search(r"fill_null=(\{.*?\})", message).group(1)
    assert ready == "{'user': -1, 'price': 0, 'dwell_sec': 0}"
    assert message.endswith("--fill-null user=-1,price=0,dwell_sec=0")
    loader = tabloader.Loader(dataset, batch_size=2, fill_null=eval(ready), **options)
    assert [b["dwell_sec"].tolist() for b in loader] == [[0.0, 2.0], [3.0, 4.0]]
