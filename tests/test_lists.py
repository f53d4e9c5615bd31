"""List (multi-hot) columns: sparse_names, sparse_max, sparse_as_dense, on the core and adapters."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tabloader

LAYOUT = [[37, 101, 5], [64], [1, 90, 33]]  # 331 rows, ragged row groups
TOTAL = sum(map(sum, LAYOUT))


def genres(i: int) -> list[int] | None:
    """Row ``i``'s list: a function of the row id, so a test can check every row."""
    if i % 11 == 3:
        return None
    return [i * 10 + k for k in range(i % 6)]


def table(start: int, rows: int) -> pa.Table:
    ids = list(range(start, start + rows))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "genres": pa.array([genres(i) for i in ids], pa.list_(pa.int32())),
            "scores": pa.array([[i / 4, i / 2] for i in ids], pa.list_(pa.float64())),
            "label": pa.array([i % 2 for i in ids], pa.int8()),
        }
    )


def write(directory: Path, layout: list[list[int]]) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    paths, start = [], 0
    for f, groups in enumerate(layout):
        path = directory / f"part-{f}.parquet"
        with pq.ParquetWriter(path, table(0, 1).schema) as writer:
            for rows in groups:
                writer.write_table(table(start, rows), row_group_size=rows)
                start += rows
        paths.append(str(path))
    return paths


@pytest.fixture(autouse=True)
def _quiet(quiet_loader_warnings: None) -> None:
    """Every test here runs with the loader's advice silenced (see conftest)."""


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write(tmp_path_factory.mktemp("lists"), LAYOUT)


def rows_of(values: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    return [values[a:b].tolist() for a, b in itertools.pairwise(offsets)]


def expected(i: int) -> list[int]:
    return genres(i) or []


@given(
    batch_size=st.integers(1, 80),
    shuffle=st.booleans(),
    shuffle_within_batch=st.booleans(),
    drop_last=st.booleans(),
    ranks=st.sampled_from([(0, 1), (0, 2), (1, 2)]),
    chunking=st.sampled_from([{"parts_per_chunk": 1}, {"parts_per_chunk": 3}, {"chunk_rows": 90}]),
    stacked=st.booleans(),
)
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_every_row_keeps_its_own_list_and_comes_once(
    paths, batch_size, shuffle, shuffle_within_batch, drop_last, ranks, chunking, stacked
):
    loader = tabloader.Loader(
        paths,
        cats=["id"],
        sparse_names=["genres"],
        labels=["label"],
        batch_size=batch_size,
        shuffle=shuffle,
        shuffle_within_batch=shuffle_within_batch,
        drop_last=drop_last,
        global_rank=ranks[0],
        global_size=ranks[1],
        seed=3,
        layout="stacked" if stacked else "columns",
        **chunking,
    )
    seen = []
    batches = list(loader)
    assert len(batches) == len(loader)
    for batch in batches:
        ids = batch["cats"][:, 0] if stacked else batch["id"]
        values, offsets = batch["genres"]
        assert values.dtype == np.int64 and offsets.dtype == np.int64
        assert len(offsets) == len(ids) + 1 and offsets[0] == 0 and offsets[-1] == len(values)
        assert rows_of(values, offsets) == [expected(int(i)) for i in ids]
        seen.extend(ids.tolist())
    assert len(set(seen)) == len(seen)
    if not drop_last:
        assert len(seen) == TOTAL // ranks[1]
    # The same seed gives the same batches.
    again = list(loader.iter_epoch(0))
    assert all(
        np.array_equal(a["genres"][0], b["genres"][0]) for a, b in zip(batches, again, strict=True)
    )


def test_dense_lists_are_padded_with_the_pad_value(paths):
    loader = tabloader.Loader(
        paths,
        cats=["id"],
        conts=["scores"],
        sparse_names=["genres", "scores"],
        sparse_as_dense=True,
        sparse_max={"genres": 5, "scores": 2},
        sparse_pad=-1,
        batch_size=50,
        shuffle=True,
        seed=1,
    )
    for batch in loader:
        assert batch["genres"].shape == (len(batch["id"]), 5)
        assert batch["genres"].dtype == np.int64 and batch["scores"].dtype == np.float32
        for i, row, score in zip(batch["id"], batch["genres"], batch["scores"], strict=True):
            want = expected(int(i))
            assert row.tolist() == want + [-1] * (5 - len(want))
            assert score.tolist() == [i / 4, i / 2]


def test_a_list_longer_than_sparse_max_is_an_error_naming_it(paths):
    loader = tabloader.Loader(
        paths,
        cats=["id"],
        sparse_names=["genres"],
        sparse_as_dense=True,
        sparse_max={"genres": 3},
        batch_size=400,
    )
    with pytest.raises(tabloader.InvalidArgumentError) as caught:
        list(loader)
    assert "list column 'genres' has a row of 5 values, longer than sparse_max['genres']=3" in (
        str(caught.value)
    )


def test_nulls_inside_lists_follow_fill_null(tmp_path):
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"g": pa.array([[1, None], None, [3]], pa.list_(pa.int64()))}), path)
    with pytest.raises(tabloader.NullValuesError, match=r"'g' has 1 null value\(s\).*inside lists"):
        list(tabloader.Loader(str(path), sparse_names=["g"], batch_size=3))
    loader = tabloader.Loader(str(path), sparse_names=["g"], batch_size=3, fill_null={"g": 9})
    values, offsets = next(iter(loader))["g"]
    assert rows_of(values, offsets) == [[1, 9], [], [3]]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"sparse_names": ["id"]},
            tabloader.ColumnTypeError,
            "list column 'id' is int64 .*Leave it out of sparse_names",
        ),
        (
            {"cats": ["genres"]},
            tabloader.ColumnTypeError,
            r"'genres' is list<element: int32>.*sparse_names=\['genres'\]",
        ),
        ({"sparse_names": ["scores"]}, tabloader.ColumnTypeError, "lists of integer ids"),
        (
            {"sparse_names": ["genres"], "sparse_as_dense": True},
            tabloader.InvalidArgumentError,
            r"sparse_max has no entry for \['genres'\]",
        ),
        (
            {"sparse_names": ["genres"], "sparse_max": {"other": 2}},
            tabloader.InvalidArgumentError,
            r"sparse_max names \['other'\], which are not in sparse_names",
        ),
        (
            {"sparse_names": ["genres"], "sparse_max": {"genres": 0}},
            tabloader.InvalidArgumentError,
            "sparse_max",
        ),
        (
            {"sparse_names": ["label"], "labels": ["label"]},
            tabloader.InvalidArgumentError,
            "labels must be scalar",
        ),
        (
            {"sparse_names": ["genres"], "sparse_pad": "x"},
            tabloader.InvalidArgumentError,
            "sparse_pad must be a number",
        ),
    ],
)
def test_list_options_are_checked_at_construction(paths, options, error, message):
    with pytest.raises(error, match=message):
        tabloader.Loader(paths, **{"cats": ["id"], "batch_size": 8, **options})


def _host(value: Any) -> Any:
    import cupy

    if isinstance(value, tuple):
        return tuple(_host(v) for v in value)
    return cupy.asnumpy(value) if isinstance(value, cupy.ndarray) else np.asarray(value)


@pytest.mark.gpu
@pytest.mark.parametrize("dense", [False, True], ids=["ragged", "dense"])
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffle", "ordered"])
@pytest.mark.parametrize("ranks", [1, 2])
def test_cpu_and_gpu_deliver_the_same_list_batches(paths, dense, shuffle, ranks):
    import cupy

    options: dict[str, Any] = {
        "cats": ["id", "genres"],
        "conts": ["scores"],
        "sparse_names": ["genres", "scores"],
        "labels": ["label"],
        "batch_size": 16,
        "shuffle": shuffle,
        "seed": 3,
        "parts_per_chunk": 2,
        "global_size": ranks,
    }
    if dense:
        options.update(sparse_as_dense=True, sparse_max={"genres": 5, "scores": 2})
    for rank in range(ranks):
        cpu = tabloader.Loader(paths, device="cpu", global_rank=rank, **options)
        gpu = tabloader.Loader(paths, device="cuda", global_rank=rank, **options)
        for _ in range(2):
            cpu_batches, gpu_batches = list(cpu), list(gpu)
            assert len(cpu_batches) == len(gpu_batches) == len(cpu)
            for c, g in zip(cpu_batches, gpu_batches, strict=True):
                assert c.keys() == g.keys()
                for key in c:
                    got = g[key] if isinstance(g[key], tuple) else (g[key],)
                    assert all(isinstance(a, cupy.ndarray) for a in got), key
                    want = c[key] if isinstance(c[key], tuple) else (c[key],)
                    for w, h in zip(want, _host(got), strict=True):
                        assert w.dtype == h.dtype and w.shape == h.shape, key
                        assert w.tobytes() == h.tobytes(), key


@pytest.mark.gpu
def test_nulls_inside_lists_follow_fill_null_on_the_gpu(tmp_path):
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"g": pa.array([[1, None], None, [3]], pa.list_(pa.int64()))}), path)
    with pytest.raises(tabloader.NullValuesError, match=r"'g' has 1 null value\(s\).*inside lists"):
        list(tabloader.Loader(str(path), sparse_names=["g"], batch_size=3, device="cuda"))
    loader = tabloader.Loader(
        str(path), sparse_names=["g"], batch_size=3, fill_null={"g": 9}, device="cuda"
    )
    values, offsets = _host(next(iter(loader))["g"])
    assert rows_of(values, offsets) == [[1, 9], [], [3]]


def test_resume_with_list_columns(paths):
    options: dict[str, Any] = {
        "cats": ["id"],
        "sparse_names": ["genres"],
        "batch_size": 40,
        "shuffle": True,
        "seed": 2,
    }
    reference = [b["genres"][0].tolist() for b in tabloader.Loader(paths, **options)]
    first = tabloader.Loader(paths, **options)
    it = iter(first)
    before = [next(it)["genres"][0].tolist() for _ in range(3)]
    resumed = tabloader.Loader(paths, **options)
    resumed.load_state_dict(first.state_dict())
    assert before + [b["genres"][0].tolist() for b in resumed] == reference


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)], ids=["cpu", "gpu"]
)
@pytest.mark.parametrize(("old_size", "new_size"), [(4, 2), (2, 3), (3, 1)])
def test_list_columns_resume_on_another_number_of_ranks(paths, device, old_size, new_size):
    """Every row's list comes once, whole, across the change of ranks (a chunk read for
    a few of its rows gathers only their lists)."""
    options: dict[str, Any] = {
        "cats": ["id"],
        "sparse_names": ["genres"],
        "batch_size": 16,
        "shuffle": True,
        "seed": 2,
        "chunk_rows": 100,
        "device": device,
    }
    host = _host if device == "cuda" else (lambda value: value)
    seen: list[tuple[int, list[int]]] = []

    def deliver(loader: tabloader.Loader, stop: int | None = None) -> None:
        iterator = iter(loader)
        for batch in iterator if stop is None else (next(iterator) for _ in range(stop)):
            ids, (values, offsets) = host(batch["id"]), host(batch["genres"])
            seen.extend(zip(ids.tolist(), rows_of(values, offsets), strict=True))
        iterator.close()

    old = [
        tabloader.Loader(paths, **options, global_rank=r, global_size=old_size)
        for r in range(old_size)
    ]
    for loader in old:
        deliver(loader, stop=2)
    state = tabloader.agreed_state([loader.state_dict() for loader in old])
    for rank in range(new_size):
        loader = tabloader.Loader(paths, **options, global_rank=rank, global_size=new_size)
        loader.load_state_dict(state)
        deliver(loader)
    ids = [i for i, _ in seen]
    assert len(set(ids)) == len(ids)  # every row once ...
    assert TOTAL - len(ids) < old_size + new_size - 1  # ... but those sitting out
    assert all(values == expected(i) for i, values in seen)  # with its own list


# -- torch ---------------------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.parametrize("workers", [0, 2])
def test_torch_lists_feed_embedding_bag_and_come_once(paths, workers):
    torch = pytest.importorskip("torch")
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    itr = TorchAsyncItr(
        paths,
        cats=["id", "genres"],
        labels=["label"],
        sparse_names=["genres"],
        batch_size=64,
        shuffle=True,
        seed=4,
        device="cpu",
    )
    bag = torch.nn.EmbeddingBag(TOTAL * 10, 3, mode="sum")
    seen = []
    for x_cat, _x_cont, y, lists in DLDataLoader(itr, num_workers=workers, collate_fn=_first):
        values, offsets = lists["genres"]
        assert x_cat.shape == (len(y), 1)  # the list column is not in x_cat
        assert values.dtype == torch.int64 and offsets.dtype == torch.int64
        assert len(offsets) == len(y)  # bag starts only: EmbeddingBag's default
        assert bag(values, offsets).shape == (len(y), 3)
        ends = torch.cat([offsets[1:], torch.tensor([len(values)])])
        starts = zip(x_cat[:, 0].tolist(), offsets.tolist(), ends.tolist(), strict=True)
        for i, start, end in starts:
            assert values[start:end].tolist() == expected(i)
        seen.extend(x_cat[:, 0].tolist())
    assert sorted(seen) == list(range(TOTAL))


def _first(batch: Any) -> Any:
    return batch


@pytest.mark.torch
def test_torch_dense_lists_are_padded_tensors(paths):
    torch = pytest.importorskip("torch")
    from tabloader.torch import TorchAsyncItr

    itr = TorchAsyncItr(
        paths,
        cats=["id"],
        conts=["scores"],
        sparse_names=["genres", "scores"],
        sparse_as_dense=True,
        sparse_max={"genres": 6, "scores": 2},
        batch_size=100,
        device="cpu",
    )
    *_, lists = next(iter(itr))
    assert lists["genres"].shape == (100, 6) and lists["genres"].dtype == torch.int64
    assert lists["scores"].shape == (100, 2) and lists["scores"].dtype == torch.float32
    assert lists["genres"][7].tolist() == expected(7) + [0] * (6 - len(expected(7)))


# -- Keras ---------------------------------------------------------------------------------


@pytest.mark.tensorflow
def test_keras_lists_as_ragged_and_padded_tensors(paths):
    tf = pytest.importorskip("tensorflow")
    import keras

    from tabloader.tensorflow import KerasSequenceLoader

    ragged = KerasSequenceLoader(
        paths,
        batch_size=64,
        cat_names=["id"],
        sparse_names=["genres"],
        label_names=["label"],
        seed=1,
    )
    seen = []
    for features, _labels in ragged:
        genres = features["genres"]
        assert isinstance(genres, tf.RaggedTensor) and genres.dtype == tf.int64
        ids = features["id"].numpy().tolist()
        assert genres.to_list() == [expected(i) for i in ids]
        seen.extend(ids)
    assert sorted(seen) == list(range(TOTAL))

    dense = KerasSequenceLoader(
        paths,
        batch_size=64,
        cat_names=["id"],
        sparse_names=["genres"],
        label_names=["label"],
        sparse_as_dense=True,
        sparse_max={"genres": 5},
        seed=1,
    )
    features, _labels = dense[0]
    assert features["genres"].shape == (64, 5) and features["genres"].dtype == tf.int64
    inputs = {
        "id": keras.Input(shape=(), name="id", dtype="int64"),
        "genres": keras.Input(shape=(5,), name="genres", dtype="int64"),
    }
    bag = keras.ops.sum(keras.layers.Embedding(TOTAL * 10, 4)(inputs["genres"]), axis=1)
    model = keras.Model(inputs, keras.layers.Dense(1)(bag))
    model.compile("sgd", "mse")
    history = model.fit(dense, epochs=1, verbose=0)
    assert len(history.history["loss"]) == 1


@pytest.mark.slow
def test_the_list_benchmark_runs_and_reports(tmp_path):
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "lists.json"
    result = subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "lists_speed.py"),
            "--rows",
            "3000",
            "--files",
            "2",
            "--row-group-size",
            "1000",
            "--batch-size",
            "512",
            "--repeat",
            "1",
            "--dir",
            str(tmp_path / "data"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(root / "src")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [r["rows"] for r in report["results"]] == [3000] * 5
    assert report["results"][0]["vs_pyarrow"] == 1.0


# -- the ragged arithmetic ----------------------------------------------------------------

LISTS = st.lists(st.one_of(st.none(), st.lists(st.integers(-5, 5), max_size=6)), max_size=30)


def ragged_of(rows: list[list[int] | None]) -> Any:
    from tabloader.decode.host import list_column_to_ragged

    return list_column_to_ragged(pa.array(rows, pa.list_(pa.int64())), "g", None, "here")


def as_lists(ragged: Any) -> list[list[int]]:
    compact = ragged.compact()
    return rows_of(compact.values, compact.offsets)


@given(rows=LISTS, data=st.data())
@settings(deadline=None)
def test_ragged_slices_gathers_and_concatenations_keep_every_row(rows, data):
    from tabloader.batches import Ragged

    want = [r or [] for r in rows]
    ragged = ragged_of(rows)
    assert as_lists(ragged) == want
    n = len(want)
    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n))
    assert as_lists(ragged[lo:hi]) == want[lo:hi]
    index = np.array(
        data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=20) if n else st.just([])),
        dtype=np.int64,
    )
    assert as_lists(ragged.take(index)) == [want[i] for i in index]
    # A lazily reordered view: slices and gathers compose with the pending order.
    order = np.array(data.draw(st.permutations(list(range(n)))), dtype=np.int64)
    view = Ragged(ragged.values, ragged.offsets, rows=order)
    assert as_lists(view) == [want[i] for i in order]
    assert as_lists(view[lo:hi].take(np.arange(hi - lo))) == [want[i] for i in order[lo:hi]]
    assert view.lengths().tolist() == [len(want[i]) for i in order]
    cut = data.draw(st.integers(0, n))
    joined = Ragged.concatenate([ragged[:cut], view[cut:]])
    assert as_lists(joined) == want[:cut] + [want[i] for i in order[cut:]]
    width = max((len(r) for r in want), default=0) + 1
    dense = ragged.to_dense(width, -9, "g")
    assert dense.tolist() == [r + [-9] * (width - len(r)) for r in want]


@pytest.mark.gpu
@pytest.mark.tensorflow
def test_keras_lists_from_the_gpu_backend_match_the_cpu(paths):
    from tabloader.tensorflow import KerasSequenceLoader

    options: dict[str, Any] = {
        "batch_size": 16,
        "cat_names": ["id"],
        "sparse_names": ["genres"],
        "label_names": ["label"],
        "seed": 5,
    }
    for dense in ({}, {"sparse_as_dense": True, "sparse_max": {"genres": 6}}):
        cpu = KerasSequenceLoader(paths, device="cpu", **options, **dense)
        gpu = KerasSequenceLoader(paths, device="cuda", **options, **dense)
        assert gpu.loader.device.is_cuda
        for (c, _), (g, _) in zip(cpu, gpu, strict=True):
            np.testing.assert_array_equal(c["id"].numpy(), g["id"].numpy())
            if dense:
                np.testing.assert_array_equal(c["genres"].numpy(), g["genres"].numpy())
            else:
                assert c["genres"].to_list() == g["genres"].to_list()


@pytest.mark.gpu
@pytest.mark.torch
def test_torch_lists_from_the_gpu_backend_match_the_cpu(paths):
    from contract_gpu import dlpack_torch_device
    from tabloader.torch import TorchAsyncItr

    options: dict[str, Any] = {
        "cats": ["id"],
        "sparse_names": ["genres"],
        "labels": ["label"],
        "batch_size": 16,
        "shuffle": True,
        "seed": 5,
    }
    cpu = list(TorchAsyncItr(paths, device="cpu", **options))
    gpu = list(TorchAsyncItr(paths, device="cuda", **options))
    assert len(cpu) == len(gpu) == -(-TOTAL // 16)
    for (c_cat, _, c_y, c_lists), (g_cat, _, g_y, g_lists) in zip(cpu, gpu, strict=True):
        values, offsets = g_lists["genres"]
        assert values.device == dlpack_torch_device()
        assert torch_equal(c_cat, g_cat) and torch_equal(c_y, g_y)
        assert torch_equal(c_lists["genres"][0], values)
        assert torch_equal(c_lists["genres"][1], offsets)


def torch_equal(a: Any, b: Any) -> bool:
    return bool((a.cpu() == b.cpu()).all()) and a.dtype == b.dtype and a.shape == b.shape


def test_a_default_chunk_counts_the_values_of_list_columns(tmp_path):
    """Chunks of about 128 MiB of decoded data with long lists too: counted one value a
    row, a chunk held the whole dataset however large."""
    rows, per_row = 4_000, 50
    values = pa.array(np.arange(rows * per_row, dtype=np.int64))
    offsets = pa.array(np.arange(0, rows * per_row + 1, per_row, dtype=np.int32))
    table = pa.table({"id": np.arange(rows), "hist": pa.ListArray.from_arrays(offsets, values)})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=1_000)
    loader = tabloader.Loader(str(tmp_path), cats=["id"], sparse_names=["hist"], batch_size=100)
    row_bytes = 8 + 8 * per_row + 8  # the id, the list's values, its offset
    assert loader.config.chunk_rows == (128 << 20) // row_bytes
    plain = tabloader.Loader(str(tmp_path), cats=["id"], batch_size=100)
    assert plain.config.chunk_rows == (128 << 20) // 8


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_list_views_in_memory_deliver_what_lists_do(device):
    lists = pa.array([[1, 2, 3], None, [4], [], [5, 6], [7, 8, 9]], pa.list_(pa.int64()))
    views = pa.array(lists.to_pylist(), pa.list_view(pa.int64()))
    batches = []
    for column in (lists, views, pa.array(lists.to_pylist(), pa.large_list_view(pa.int64()))):
        table = pa.table({"id": np.arange(6), "hist": column})
        loader = tabloader.Loader(table, cats=["id"], sparse_names=["hist"], batch_size=3,
                                  device=device)  # fmt: skip
        batches.append([
            (_on_host(b["hist"][0]).tolist(), _on_host(b["hist"][1]).tolist()) for b in loader
        ])  # fmt: skip
    assert batches[0] == [([1, 2, 3, 4], [0, 3, 3, 4]), ([5, 6, 7, 8, 9], [0, 0, 2, 5])]
    assert batches[1] == batches[0] and batches[2] == batches[0]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_float64_vector_in_memory_is_delivered_as_float32(device):
    emb = pa.array([[0.5, 1.5, 2.5], [3.5, 4.5, 5.5]], pa.list_(pa.float64(), 3))
    table = pa.table({"emb": emb, "y": [0.0, 1.0]})
    loader = tabloader.Loader(table, conts=["emb"], labels=["y"], batch_size=2, device=device)
    (batch,) = list(loader)
    assert _on_host(batch["emb"]).tolist() == emb.to_pylist() and batch["emb"].dtype == np.float32


def _on_host(array: Any) -> np.ndarray:
    get = getattr(array, "get", None)  # cupy's copy to the host, on a GPU
    return np.asarray(get() if callable(get) else array)
