"""Vector columns: parquet fixed-size lists (embeddings) delivered as dense ``[B, k]`` blocks.

Every value is compared with pyarrow's read of the same files, row by row (each row found
by its id), on both backends, with and without a decoded cache, stacked or not, resumed,
and through every adapter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tabloader
from tabloader.config import LoaderConfig

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
LAYOUT = [[130, 47], [200], [9, 64]]  # 450 rows
TOTAL = sum(map(sum, LAYOUT))
EMB, IDS = 5, 3


def table(start: int, rows: int) -> pa.Table:
    ids = np.arange(start, start + rows, dtype=np.int64)
    emb = (ids[:, None] * 8 + np.arange(EMB)).astype(np.float16) / 4  # float16 as stored
    near = ids[:, None] * 3 + np.arange(IDS)
    return pa.table(
        {
            "id": ids,
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), EMB),
            "near": pa.FixedSizeListArray.from_arrays(pa.array(near.ravel().astype(np.int32)), IDS),
            "x": ids / 2,
            "y": (ids % 3).astype(np.float32),
        }
    )


def write(directory: Path, layout: list[list[int]] = LAYOUT, start: int = 0) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    for f, groups in enumerate(layout):
        with pq.ParquetWriter(directory / f"part-{start + f}.parquet", table(0, 1).schema) as w:
            for rows in groups:
                w.write_table(table(start, rows), row_group_size=rows)
                start += rows
    return str(directory)


@pytest.fixture(autouse=True)
def _quiet(quiet_loader_warnings: None) -> None:
    """Every test here runs with the loader's advice silenced (see conftest)."""


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write(tmp_path_factory.mktemp("vectors"))


def reference(directory: str) -> dict[str, dict[int, list[Any]]]:
    """pyarrow's read of every column, by row id."""
    read = pq.read_table(directory).to_pydict()
    return {c: dict(zip(read["id"], values, strict=True)) for c, values in read.items()}


def host(array: Any) -> np.ndarray:
    return array.get() if hasattr(array, "get") else np.asarray(array)


def columns_of(batch: dict[str, Any], stacked: bool) -> dict[str, np.ndarray]:
    """The delivered columns of a batch: a vector's [B, k] at its k places when stacked."""
    if not stacked:
        return {name: host(array) for name, array in batch.items()}
    cats, conts = host(batch["cats"]), host(batch["conts"])
    return {
        "id": cats[:, 0],
        "near": cats[:, 1 : 1 + IDS],
        "emb": conts[:, :EMB],
        "x": conts[:, EMB],
        "y": host(batch["labels"])[:, 0],
    }


def check_epoch(batches: list[dict[str, Any]], expected: dict, stacked: bool = False) -> None:
    """Every row once, each delivered value pyarrow's, in the delivered dtype."""
    got = [columns_of(b, stacked) for b in batches]
    ids = np.concatenate([b["id"] for b in got])
    assert sorted(ids.tolist()) == sorted(expected["id"])
    for name, k, dtype in (("emb", EMB, np.float32), ("near", IDS, np.int64)):
        values = np.concatenate([b[name] for b in got])
        assert values.shape == (len(ids), k) and values.dtype == dtype
        want = np.array([expected[name][i] for i in ids.tolist()], dtype=dtype)
        np.testing.assert_array_equal(values, want)
    x = np.concatenate([b["x"] for b in got])
    np.testing.assert_array_equal(x, np.array([expected["x"][i] for i in ids], np.float32))


OPTIONS: dict[str, Any] = {
    "cats": ["id", "near"],
    "conts": ["emb", "x"],
    "labels": ["y"],
    "batch_size": 64,
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache", [None, "memory", "disk"])
@pytest.mark.parametrize("shuffle", [False, True, "global"])
@pytest.mark.parametrize("layout", ["columns", "stacked"])
def test_every_row_once_with_pyarrows_values(data, tmp_path, device, cache, shuffle, layout):
    if shuffle == "global" and cache is None:
        pytest.skip("a global shuffle needs a cache")
    expected = reference(data)
    loader = tabloader.Loader(
        data, **OPTIONS, device=device, cache=cache, cache_dir=tmp_path, shuffle=shuffle, seed=4,
        layout=layout, chunk_rows=150,
    )  # fmt: skip
    epochs = [list(loader) for _ in range(3)]
    for batches in epochs:
        check_epoch(batches, expected, stacked=layout == "stacked")
        if layout == "columns":
            first = batches[0]
            assert host(first["emb"]).flags.c_contiguous  # dense rows, no offsets or padding
            assert host(first["near"]).shape == (64, IDS)
    if shuffle:
        orders = [
            np.concatenate([columns_of(b, layout == "stacked")["id"] for b in e]) for e in epochs
        ]
        assert not np.array_equal(orders[0], orders[1])


@pytest.mark.parametrize("device", DEVICES)
def test_a_seed_gives_the_same_batches_on_every_loader_and_backend(data, device):
    def run(device: str) -> list[dict[str, np.ndarray]]:
        loader = tabloader.Loader(data, **OPTIONS, device=device, shuffle=True, seed=11)
        return [columns_of(b, False) for b in loader]

    first, again, cpu = run(device), run(device), run("cpu")
    for a, b, c in zip(first, again, cpu, strict=True):
        for name in ("id", "emb", "near"):
            np.testing.assert_array_equal(a[name], b[name])
            np.testing.assert_array_equal(a[name], c[name])


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batch_size=st.integers(1, 90),
    done=st.integers(0, 12),
    shuffle=st.booleans(),
    cache=st.sampled_from([None, "memory"]),
    stacked=st.booleans(),
)
def test_a_resumed_epoch_delivers_the_rest_exactly(data, batch_size, done, shuffle, cache, stacked):
    options = {**OPTIONS, "batch_size": batch_size, "shuffle": shuffle, "seed": 2, "cache": cache}
    layout = "stacked" if stacked else "columns"
    whole = [columns_of(b, stacked) for b in tabloader.Loader(data, **options, layout=layout)]
    done = min(done, len(whole))
    loader = tabloader.Loader(data, **options, layout=layout)
    epoch = iter(loader)
    for _ in range(done):
        next(epoch)
    state = loader.state_dict()
    epoch.close()
    again = tabloader.Loader(data, **options, layout=layout)
    again.load_state_dict(json.loads(json.dumps(state)))
    if done == len(whole):  # every batch taken: the epoch is over, the next one follows
        assert (state["epoch"], state["batches"]) == (1, 0)
        return
    rest = [columns_of(b, stacked) for b in again]
    assert len(rest) == len(whole) - done
    for a, b in zip(rest, whole[done:], strict=True):
        for name in ("id", "emb", "near"):
            np.testing.assert_array_equal(a[name], b[name])


def test_ranks_share_the_rows_and_each_row_keeps_its_vector(data):
    expected = reference(data)
    seen = []
    for rank in range(3):
        loader = tabloader.Loader(
            data, **OPTIONS, shuffle=True, seed=5, global_rank=rank, global_size=3
        )
        batches = list(loader)
        check_epoch_rows = [columns_of(b, False) for b in batches]
        ids = np.concatenate([b["id"] for b in check_epoch_rows])
        emb = np.concatenate([b["emb"] for b in check_epoch_rows])
        np.testing.assert_array_equal(emb, np.array([expected["emb"][i] for i in ids], np.float32))
        seen.append(ids)
    assert len(np.unique(np.concatenate(seen))) == sum(map(len, seen)) == TOTAL


# -- nulls -----------------------------------------------------------------------------------


def write_nulls(path: Path) -> pa.Table:
    """A null vector (row 1) and a null inside one (row 3, its second value)."""
    rows = [[0.0, 1.0], None, [4.0, 5.0], [6.0, None], [8.0, 9.0]]
    data = pa.table(
        {"id": pa.array(range(5), pa.int64()), "emb": pa.array(rows, pa.list_(pa.float64(), 2))}
    )
    pq.write_table(data, path)
    return data


@pytest.mark.parametrize("device", DEVICES)
def test_null_vectors_and_nulls_inside_them_need_fill_null(tmp_path, device):
    path = tmp_path / "nulls.parquet"
    write_nulls(path)
    loader = tabloader.Loader(str(path), cats=["id"], conts=["emb"], batch_size=5, device=device)
    with pytest.raises(tabloader.NullValuesError, match="column 'emb' has 1 null value"):
        list(loader)
    filled = tabloader.Loader(
        str(path), cats=["id"], conts=["emb"], batch_size=5, device=device, fill_null={"emb": -1}
    )
    (batch,) = list(filled)
    assert host(batch["emb"]).tolist() == [[0, 1], [-1, -1], [4, 5], [6, -1], [8, 9]]


@pytest.mark.parametrize("device", DEVICES)
def test_a_null_inside_a_vector_is_named_as_such(tmp_path, device):
    path = tmp_path / "inside.parquet"
    rows = [[0.0, 1.0], [6.0, None]]
    pq.write_table(pa.table({"emb": pa.array(rows, pa.list_(pa.float64(), 2))}), path)
    loader = tabloader.Loader(str(path), conts=["emb"], batch_size=2, device=device)
    with pytest.raises(
        tabloader.NullValuesError, match=r"1 null value\(s\) in .* \(inside lists\)"
    ):
        list(loader)


# -- what is refused ---------------------------------------------------------------------------


def one_file(tmp_path: Path, column: pa.Array) -> str:
    path = tmp_path / "v.parquet"
    pq.write_table(pa.table({"v": column}), path)
    return str(path)


def test_vectors_of_strings_ids_as_floats_and_of_no_values_are_refused(tmp_path):
    strings = one_file(tmp_path, pa.array([["a", "b"]], pa.list_(pa.string(), 2)))
    with pytest.raises(tabloader.ColumnTypeError) as info:
        tabloader.Loader(strings, conts=["v"], batch_size=1)
    assert str(info.value) == (
        f"column 'v' is fixed_size_list<element: string>[2] in {strings}, a vector of string; "
        "vector columns (fixed-size lists, delivered as [B, k]) must hold numbers (integer, "
        "floating point or boolean). Convert it, or leave it out"
    )
    floats = one_file(tmp_path, pa.array([[0.5, 1.5]], pa.list_(pa.float32(), 2)))
    with pytest.raises(tabloader.ColumnTypeError, match="categorical column 'v' is fixed_size"):
        tabloader.Loader(floats, cats=["v"], batch_size=1)
    assert len(list(tabloader.Loader(floats, conts=["v"], batch_size=1))) == 1
    empty = one_file(tmp_path, pa.array([[]], pa.list_(pa.float32(), 0)))
    with pytest.raises(tabloader.ColumnTypeError, match="a vector of no values holds nothing"):
        tabloader.Loader(empty, conts=["v"], batch_size=1)
    nested = one_file(tmp_path, pa.array([[[1, 2]]], pa.list_(pa.list_(pa.int64(), 2), 1)))
    with pytest.raises(tabloader.ColumnTypeError, match="must hold numbers"):
        tabloader.Loader(nested, conts=["v"], batch_size=1)


def test_files_with_vectors_of_other_lengths_are_refused_naming_both(tmp_path):
    a = tmp_path / "a.parquet"
    b = tmp_path / "b.parquet"
    pq.write_table(pa.table({"v": pa.array([[1.0, 2.0]], pa.list_(pa.float32(), 2))}), a)
    pq.write_table(pa.table({"v": pa.array([[1.0, 2.0, 3.0]], pa.list_(pa.float32(), 3))}), b)
    with pytest.raises(tabloader.SchemaMismatchError) as info:
        tabloader.Loader(str(tmp_path), conts=["v"], batch_size=1)
    assert str(info.value).startswith(
        f"column 'v' is fixed_size_list<element: float>[3] in {b} but "
        f"fixed_size_list<element: float>[2] in {a}"
    )


def test_a_value_that_does_not_fit_the_dtype_is_refused_from_the_footers(tmp_path):
    big = one_file(tmp_path, pa.array([[1, 2**40]], pa.list_(pa.int64(), 2)))
    with pytest.raises(tabloader.ValueRangeError, match=r"column 'v' holds 1099511627776"):
        tabloader.Loader(big, cats=["v"], batch_size=1, cat_dtype="int32")


@pytest.mark.parametrize("device", DEVICES)
def test_a_fraction_in_a_vector_delivered_as_integers_is_refused_when_read(tmp_path, device):
    path = tmp_path / "v.parquet"
    column = pa.array([[1.0, 2.0], [3.0, 2.5]], pa.list_(pa.float64(), 2))
    pq.write_table(pa.table({"v": column}), path, write_statistics=False)
    loader = tabloader.Loader(
        str(path), conts=["v"], batch_size=2, cont_dtype="int16", device=device
    )  # (no statistics: nothing to refuse it by before reading)
    with pytest.raises(tabloader.ValueRangeError, match=r"holds 2\.5\b.* lose its fraction"):
        list(loader)


@pytest.mark.parametrize("device", DEVICES)
def test_a_vector_named_in_sparse_names_is_read_as_lists(data, device):
    expected = reference(data)
    loader = tabloader.Loader(
        data, cats=["id"], sparse_names=["near"], batch_size=50, device=device, shuffle=True, seed=1
    )
    for batch in loader:
        values, offsets = (host(a) for a in batch["near"])
        ids = host(batch["id"])
        np.testing.assert_array_equal(offsets, np.arange(len(ids) + 1) * IDS)
        want = np.array([expected["near"][i] for i in ids]).ravel()
        np.testing.assert_array_equal(values, want)


# -- chunks, inspect ---------------------------------------------------------------------------


def test_a_default_chunk_holds_about_as_many_bytes_with_vectors(data):
    loader = tabloader.Loader(data, conts=["emb"], batch_size=8)
    plain = LoaderConfig.build(batch_size=8, conts=["emb"])
    assert loader.config.widths == {"emb": EMB}
    assert loader.config.chunk_rows == plain.chunk_rows // EMB  # 128 MiB of 5 float32 a row
    given_rows = tabloader.Loader(data, conts=["emb"], batch_size=8, chunk_rows=100)
    assert given_rows.config.chunk_rows == 100


def test_inspect_suggests_vectors_by_their_values(data, capsys):
    from tabloader.cli import main

    assert main(["inspect", data, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["suggested"] == {"cats": ["id", "near"], "conts": ["emb", "x", "y"], "labels": []}
    uses = {c["name"]: c["use"] for c in report["columns"]}
    assert uses["emb"] == "conts" and uses["near"] == "cats"
    assert report["errors"] == []


# -- adapters ------------------------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.parametrize("cache", [None, "memory"])
def test_torch_gets_the_vector_values_at_their_places_in_x_cont(data, cache):
    from tabloader.torch import TorchAsyncItr

    expected = reference(data)
    itr = TorchAsyncItr(data, **OPTIONS, shuffle=True, seed=3, device="cpu", cache=cache)
    x_cat, x_cont, y = next(iter(itr))
    np.testing.assert_array_equal(y.numpy(), [expected["y"][i] for i in x_cat[:, 0].tolist()])
    assert tuple(x_cat.shape) == (64, 1 + IDS) and tuple(x_cont.shape) == (64, EMB + 1)
    ids = x_cat[:, 0].tolist()
    want = np.array([expected["emb"][i] for i in ids], np.float32)
    np.testing.assert_array_equal(x_cont[:, :EMB].numpy(), want)
    np.testing.assert_array_equal(
        x_cat[:, 1:].numpy(), np.array([expected["near"][i] for i in ids])
    )


@pytest.mark.keras
def test_keras_gets_each_vector_as_one_input(data):
    from tabloader.keras import KerasSequenceLoader

    expected = reference(data)
    loader = KerasSequenceLoader(data, **OPTIONS, shuffle=True, seed=3, device="cpu")
    features, labels = loader[0]
    ids = np.asarray(features["id"]).tolist()
    np.testing.assert_array_equal(np.asarray(labels), [expected["y"][i] for i in ids])
    assert tuple(features["emb"].shape) == (64, EMB)
    want = np.array([expected["emb"][i] for i in ids], np.float32)
    np.testing.assert_array_equal(np.asarray(features["emb"]), want)
    np.testing.assert_array_equal(
        np.asarray(features["near"]), np.array([expected["near"][i] for i in ids])
    )


@pytest.mark.jax
def test_jax_pads_the_last_batch_of_vectors(data):
    from tabloader.jax import JaxLoader

    expected = reference(data)
    loader = JaxLoader(data, **OPTIONS, shuffle=True, seed=3, device="cpu", pad_last=True)
    batches = list(loader)
    features, _, mask = batches[-1]
    real = int(np.asarray(mask).sum())
    assert real == TOTAL % 64 and tuple(features["emb"].shape) == (64, EMB)
    ids = np.asarray(features["id"])[:real].tolist()
    want = np.array([expected["emb"][i] for i in ids], np.float32)
    np.testing.assert_array_equal(np.asarray(features["emb"])[:real], want)
    assert not np.asarray(features["emb"])[real:].any()


def test_the_vector_benchmark_reports_both_layouts():
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "vectors_speed.py"), "--rows", "4000",
         "--k", "4", "--rounds", "1"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root / "src")},
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "4,000 rows, k=4, 1 rounds, cpu (seconds)"
    assert [line.split()[0] for line in lines[1:]] == ["columns", "stacked"]
