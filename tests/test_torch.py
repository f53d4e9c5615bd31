"""The PyTorch adapter: TorchAsyncItr and DLDataLoader."""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

import tabloader  # noqa: E402
from tabloader.tensors import TorchTensors  # noqa: E402
from tabloader.threads import usable_cores  # noqa: E402
from tabloader.torch import DLDataLoader, TorchAsyncItr  # noqa: E402

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = [[37, 101, 5], [64], [1, 90, 33]]  # 331 rows, ragged row groups
TOTAL = sum(map(sum, LAYOUT))
COLUMNS = {"cats": ["id", "cat"], "conts": ["x"], "labels": ["label"]}


def identity(batch: Any) -> Any:
    return batch


@pytest.fixture(autouse=True)
def _quiet_performance_warnings() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tabloader.PerformanceWarning)
        yield


@pytest.fixture
def paths(dataset_dir: Any) -> list[str]:
    return dataset_dir(LAYOUT)


@pytest.fixture
def one_thread() -> Any:
    """Training tests on a 2-core machine: keep torch's threads off the loader's."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make(paths: list[str], **options: Any) -> TorchAsyncItr:
    settings: dict[str, Any] = {**COLUMNS, "batch_size": 32, "device": "cpu"}
    settings.update(options)
    return TorchAsyncItr(tabloader.Dataset(paths), **settings)


def ids(batches: list[Any]) -> np.ndarray:
    return np.concatenate([b[0][:, 0].numpy() for b in batches])


def check_rows(batches: list[Any]) -> None:
    """Tensors hold real rows: every column agrees with the row's id."""
    for x_cat, x_cont, y in batches:
        row_ids = x_cat[:, 0].numpy()
        np.testing.assert_array_equal(x_cat[:, 1].numpy(), row_ids % 1000)
        np.testing.assert_array_equal(x_cont[:, 0].numpy(), (row_ids / 4.0).astype(np.float32))
        np.testing.assert_array_equal(y.numpy(), (row_ids % 2).astype(np.float32))


# -- what a batch looks like ------------------------------------------------------------


def test_batches_have_the_documented_shapes_dtypes_and_every_row_once(paths):
    loader = DLDataLoader(
        make(paths, shuffle=True, seed=3), batch_size=None, collate_fn=identity, num_workers=0
    )
    assert len(loader) == len(loader.dataset) == -(-TOTAL // 32)
    epochs = []
    for _ in range(2):
        batches = list(loader)
        assert len(batches) == len(loader)
        for i, batch in enumerate(batches):
            assert isinstance(batch, tuple)
            x_cat, x_cont, y = batch
            rows = 32 if i < len(batches) - 1 else TOTAL % 32
            assert [t.dtype for t in batch] == [torch.int64, torch.float32, torch.float32]
            assert (x_cat.shape, x_cont.shape, y.shape) == ((rows, 2), (rows, 1), (rows,))
        check_rows(batches)
        np.testing.assert_array_equal(np.sort(ids(batches)), np.arange(TOTAL))
        epochs.append(ids(batches))
    assert not np.array_equal(epochs[0], epochs[1])  # reshuffled


def test_without_shuffle_rows_come_in_dataset_order(paths):
    batches = list(DLDataLoader(make(paths), collate_fn=identity))
    np.testing.assert_array_equal(ids(batches), np.arange(TOTAL))
    check_rows(batches)


def test_missing_kinds_are_empty_width_tensors_of_the_right_dtype(paths):
    only_conts = next(iter(make(paths, cats=None, labels=None)))
    x_cat, x_cont, y = only_conts
    assert (x_cat.dtype, tuple(x_cat.shape)) == (torch.int64, (32, 0))
    assert (x_cont.dtype, tuple(x_cont.shape)) == (torch.float32, (32, 1))
    assert (y.dtype, tuple(y.shape)) == (torch.float32, (32, 0))
    x_cat, x_cont, _ = next(iter(make(paths, conts=None)))
    assert (x_cont.dtype, tuple(x_cont.shape)) == (torch.float32, (32, 0))
    assert tuple(x_cat.shape) == (32, 2)


def test_several_labels_give_a_two_dimensional_y(paths):
    _, _, y = next(iter(make(paths, conts=None, labels=["label", "x"], shuffle=True, seed=1)))
    assert (y.dtype, tuple(y.shape)) == (torch.float32, (32, 2))
    np.testing.assert_array_equal(y[:, 1].numpy() * 4 % 2, y[:, 0].numpy())


def test_default_collate_gives_the_same_tensors_in_a_list(paths):
    as_tuples = list(DLDataLoader(make(paths, shuffle=True, seed=5), collate_fn=identity))
    as_lists = list(DLDataLoader(make(paths, shuffle=True, seed=5)))
    assert len(as_lists) == len(as_tuples)
    for listed, tupled in zip(as_lists, as_tuples, strict=True):
        assert isinstance(listed, list)
        assert len(listed) == 3
        for a, b in zip(listed, tupled, strict=True):
            assert a.dtype == b.dtype
            assert torch.equal(a, b)


# -- no copies on the training thread ----------------------------------------------------


def as_tensor(array: Any) -> Any:
    return TorchTensors().tensor(array)


def test_tensors_share_the_arrays_memory_unless_read_only():
    block = np.arange(12, dtype=np.int64).reshape(6, 2)
    assert as_tensor(block).data_ptr() == block.ctypes.data
    view = block[2:5]
    assert as_tensor(view).data_ptr() == view.ctypes.data
    frozen = pa.array(np.arange(6, dtype=np.float32)).to_numpy().reshape(-1, 1)
    assert not frozen.flags.writeable
    copied = as_tensor(frozen)
    assert copied.data_ptr() != frozen.ctypes.data
    np.testing.assert_array_equal(copied.numpy(), frozen)
    copied += 1  # writing to the batch must never reach Arrow's buffers
    np.testing.assert_array_equal(frozen[:, 0], np.arange(6, dtype=np.float32))


def test_device_arrays_become_tensors_through_dlpack():
    class DeviceArray:  # an array that is not numpy and speaks DLPack, like cupy
        def __init__(self, array: np.ndarray) -> None:
            self.array = array

        def __dlpack__(self, **kwargs: Any) -> Any:
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self) -> Any:
            return self.array.__dlpack_device__()

    block = np.arange(8, dtype=np.float32).reshape(4, 2)
    tensor = as_tensor(DeviceArray(block))
    assert tensor.data_ptr() == block.ctypes.data
    assert tuple(tensor.shape) == (4, 2)


def test_tensors_are_built_in_the_background_thread(paths, monkeypatch):
    threads = []
    tensor = TorchTensors.tensor

    def recording(self: TorchTensors, array: Any) -> Any:
        threads.append(threading.current_thread().name)
        return tensor(self, array)

    # Loaders other tests dropped stop their threads when collected: let them, so that
    # only this test's batches are recorded.
    gc.collect()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        t.name.startswith("tabloader-") for t in threading.enumerate()
    ):
        time.sleep(0.05)
    monkeypatch.setattr(TorchTensors, "tensor", recording)
    for shuffle in (True, False):
        threads.clear()
        batches = list(DLDataLoader(make(paths, shuffle=shuffle, seed=1), collate_fn=identity))
        assert len(threads) == 3 * len(batches)
        assert set(threads) == {"tabloader-batcher"}


def test_closing_an_epoch_stops_its_threads(paths):
    before = set(threading.enumerate())
    epoch = iter(make(paths, shuffle=True, seed=1, parts_per_chunk=1))
    assert len(epoch) == -(-TOTAL // 32)
    next(epoch)
    assert len(epoch) == -(-TOTAL // 32) - 1
    started = [t for t in threading.enumerate() if t not in before]
    helpers = {"tabloader-layout"} if usable_cores() > 1 else set()
    assert {t.name.split("_")[0] for t in started} == {
        "tabloader-batcher",
        "tabloader-reader",
        "tabloader-decoder",
        "tabloader-order",  # the next chunk's row order, drawn ahead
        *helpers,  # threads laying out a chunk beside the reader
    }
    epoch.close()
    assert [t.name for t in started if t.is_alive()] == []


def test_close_stops_an_epoch_left_with_a_break(paths):
    """A ``break`` out of an epoch (then validation, another loader, or nothing): the
    adapter's ``close()`` stops the threads still reading ahead for it (else the next
    ``iter()`` does), and its state still says where the epoch stood."""
    before = set(threading.enumerate())
    itr = make(paths, shuffle=True, seed=1, parts_per_chunk=1)
    for i, _ in enumerate(DLDataLoader(itr, collate_fn=identity)):
        if i == 2:
            break
    itr.close()
    assert [t.name for t in threading.enumerate() if t not in before and t.is_alive()] == []
    assert (itr.state_dict()["epoch"], itr.state_dict()["batches"]) == (0, 3)
    assert itr.epoch == 1


def test_read_errors_reach_the_training_loop(paths):
    loader = DLDataLoader(make(paths), collate_fn=identity)
    Path(paths[1]).write_bytes(b"not parquet any more")
    with pytest.raises(tabloader.ReadError, match="part-001"):
        list(loader)


# -- options ---------------------------------------------------------------------------


def test_nvtabular_sparse_keywords_name_list_columns_only(paths):
    make(paths, sparse_names=None, sparse_max=None, sparse_as_dense=False)
    with pytest.raises(tabloader.ColumnTypeError, match=r"list column 'cat' is int32"):
        make(paths, sparse_names=["cat"])
    with pytest.raises(tabloader.InvalidArgumentError, match="sparse_max names"):
        make(paths, sparse_max={"cat": 3})


def test_unknown_keywords_raise(paths):
    with pytest.raises(TypeError, match="buffer_size"):
        make(paths, buffer_size=0.1)


def test_dlloader_refuses_a_batch_size(paths):
    with pytest.raises(tabloader.InvalidArgumentError, match="batch_size=None"):
        DLDataLoader(make(paths), batch_size=4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_device_without_cuda_is_refused(paths):
    with pytest.raises(tabloader.InvalidArgumentError, match="is_available"):
        make(paths, device="cuda", backend="cpu")


def test_a_gpu_without_cudf_is_refused_with_the_install_hint(paths, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    for options in ({"device": "cuda"}, {"backend": "gpu", "device": None}):
        with pytest.raises(tabloader.TabloaderError, match=r"pip install 'tabloader\[gpu\]'"):
            make(paths, **options)
    # without a backend named, the way that needs no cudf is named too
    with pytest.raises(tabloader.GPUUnavailableError, match=r"or pass backend='cpu'"):
        make(paths, device="cuda")
    with pytest.raises(tabloader.GPUUnavailableError) as refused:
        make(paths, device="cuda", backend="gpu")
    assert "backend='cpu'" not in str(refused.value)


def test_bad_devices_and_backends_are_refused(paths):
    with pytest.raises(tabloader.InvalidArgumentError, match="device must be"):
        make(paths, device="tpu:0")
    with pytest.raises(tabloader.InvalidArgumentError, match="device must be"):
        make(paths, device=True)
    with pytest.raises(tabloader.InvalidArgumentError, match="backend must be"):
        make(paths, backend="numpy")


def test_the_tensors_go_where_the_loader_resolved_its_device(paths, monkeypatch):
    monkeypatch.setenv("TABLOADER_DEVICE", "cpu")
    itr = make(paths, device=None)
    assert str(itr.loader.device) == "cpu"
    assert itr.device == torch.device("cpu")
    x_cat, _, _ = next(iter(itr))
    assert x_cat.device == itr.device


def test_rank_without_size_is_refused_outside_torch_distributed(paths):
    assert not torch.distributed.is_initialized()
    with pytest.raises(tabloader.InvalidArgumentError, match="pass both global_rank"):
        make(paths, global_size=2)
    itr = make(paths)
    assert (itr.global_rank, itr.global_size) == (0, 1)


def test_sharded_lengths_are_exact(paths):
    lengths = [len(make(paths, global_rank=r, global_size=3, batch_size=16)) for r in range(3)]
    assert lengths == [-(-(TOTAL // 3) // 16)] * 3
    assert len(make(paths, drop_last=True)) == TOTAL // 32


# -- epochs and seeds ------------------------------------------------------------------


def test_same_seed_same_batches_and_set_epoch_replays(paths):
    first, second = make(paths, shuffle=True, seed=9), make(paths, shuffle=True, seed=9)
    a0, a1 = ids(list(first)), ids(list(first))
    np.testing.assert_array_equal(a0, ids(list(second)))
    assert first.epoch == 2
    first.set_epoch(1)
    np.testing.assert_array_equal(ids(list(first)), a1)


def test_seed_fn_is_called_once_per_epoch_in_the_training_process(paths):
    calls = []
    parent = os.getpid()

    def seed_fn() -> int:
        if os.getpid() != parent:
            raise RuntimeError("seed_fn called in a worker process")
        calls.append(len(calls))
        return torch.tensor(100 + len(calls))  # anything with __index__ will do

    for workers in (0, 2):
        calls.clear()
        itr = make(paths, shuffle=True, seed_fn=seed_fn)
        loader = DLDataLoader(itr, collate_fn=identity, num_workers=workers)
        first, second = ids(list(loader)), ids(list(loader))
        assert len(calls) == 2
        assert not np.array_equal(first, second)
        # The epochs are those of a loader seeded with seed_fn's values.
        replay = make(paths, shuffle=True, seed=101)
        expected = ids(list(DLDataLoader(replay, collate_fn=identity, num_workers=workers)))
        np.testing.assert_array_equal(first, expected)


def test_seed_options_are_checked(paths):
    with pytest.raises(tabloader.InvalidArgumentError, match="not both"):
        make(paths, seed=1, seed_fn=lambda: 1)
    itr = make(paths, shuffle=True, seed_fn=lambda: -3)
    with pytest.raises(tabloader.InvalidArgumentError, match=r"seed_fn\(\) must be a non-negative"):
        iter(itr)
    with pytest.raises(tabloader.InvalidArgumentError, match="persistent_workers"):
        DLDataLoader(make(paths, seed_fn=lambda: 1), num_workers=1, persistent_workers=True)


def test_pickled_copies_deliver_the_same_batches(paths):
    import pickle

    itr = make(paths, shuffle=True)  # seed drawn at construction
    next(iter(itr))
    copy = pickle.loads(pickle.dumps(itr))
    assert copy.epoch == itr.epoch == 1
    np.testing.assert_array_equal(ids(list(copy)), ids(list(itr)))


# -- worker processes ------------------------------------------------------------------


def test_workers_deliver_every_row_once_and_reshuffle(paths):
    itr = make(paths, shuffle=True, seed=4, parts_per_chunk=2)
    loader = DLDataLoader(itr, collate_fn=identity, num_workers=2)
    assert len(loader) == -(-TOTAL // 32)
    seen = []
    for epoch in range(2):
        batches = list(loader)
        assert len(batches) == len(loader)
        assert [len(b[0]) for b in batches[:-1]] == [32] * (len(batches) - 1)
        check_rows(batches)
        np.testing.assert_array_equal(np.sort(ids(batches)), np.arange(TOTAL))
        assert itr.epoch == epoch + 1
        seen.append(ids(batches))
    assert not np.array_equal(seen[0], seen[1])


@pytest.mark.parametrize("shuffle", [True, False])
def test_workers_split_the_core_epoch_between_them(paths, shuffle):
    itr = make(paths, shuffle=shuffle, seed=4, parts_per_chunk=2)
    batches = list(DLDataLoader(itr, collate_fn=identity, num_workers=2))
    core = tabloader.Loader(
        tabloader.Dataset(paths),
        **COLUMNS,
        batch_size=32,
        shuffle=shuffle,
        seed=4,
        parts_per_chunk=2,
    )
    shares = [
        [b["id"].copy() for b in core.iter_epoch(0, worker=w, num_workers=2)] for w in range(2)
    ]
    # The DataLoader takes batches from its workers in turn.
    expected = [share[i] for i in range(len(shares[1])) for share in shares if i < len(share)]
    assert len(batches) == len(expected)
    for (x_cat, _, _), want in zip(batches, expected, strict=True):
        np.testing.assert_array_equal(x_cat[:, 0].numpy(), want)


def test_persistent_workers_reshuffle_like_fresh_ones(paths):
    fresh = DLDataLoader(make(paths, shuffle=True, seed=2), collate_fn=identity, num_workers=2)
    itr = make(paths, shuffle=True, seed=2)
    kept = DLDataLoader(itr, collate_fn=identity, num_workers=2, persistent_workers=True)
    runs = [(ids(list(fresh)), ids(list(kept))) for _ in range(3)]
    for a, b in runs:
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(runs[0][1], runs[1][1])
    assert not np.array_equal(runs[1][1], runs[2][1])
    itr.set_epoch(0)
    with pytest.raises(tabloader.TabloaderError, match="persistent worker processes"):
        iter(kept)


def test_a_memory_cache_in_workers_started_each_epoch_is_said_to_be_thrown_away(paths):
    """Each worker process keeps its own memory cache, and workers that are not
    persistent are started anew each epoch: every epoch decoded the files, silently."""
    with pytest.warns(tabloader.CacheWarning, match="persistent_workers=True"):
        DLDataLoader(make(paths, cache="memory"), collate_fn=identity, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tabloader.CacheWarning)
        itr = make(paths, cache="memory")
        DLDataLoader(itr, collate_fn=identity, num_workers=2, persistent_workers=True)
        DLDataLoader(make(paths, cache="memory"), collate_fn=identity)  # this process's
        DLDataLoader(make(paths, cache="disk", cache_dir=paths[0] + ".c"), num_workers=2)


def test_a_state_loaded_after_persistent_workers_started_is_refused_not_ignored(paths):
    # (rolling back to a checkpoint in the same process, after a NaN loss, say)
    saver = make(paths, shuffle=True, seed=2)
    loader = DLDataLoader(saver, collate_fn=identity, num_workers=2)
    list(loader)
    run = iter(loader)
    [next(run) for _ in range(2)]
    state = saver.state_dict()  # epoch 1, two batches in
    rest = list(run)
    itr = make(paths, shuffle=True, seed=2)
    kept = DLDataLoader(itr, collate_fn=identity, num_workers=2, persistent_workers=True)
    list(kept)  # epoch 0; the workers stay, and run epoch 1 next
    itr.load_state_dict(state)  # they would run the whole of epoch 1
    with pytest.raises(tabloader.TabloaderError, match="after the persistent worker processes"):
        iter(kept)
    again = make(paths, shuffle=True, seed=2)
    again.load_state_dict(state)  # before the workers start: they copy it
    kept = DLDataLoader(again, collate_fn=identity, num_workers=2, persistent_workers=True)
    np.testing.assert_array_equal(np.sort(ids(list(kept))), np.sort(ids(rest)))


def test_more_workers_than_batches(dataset_dir):
    paths = dataset_dir([[20]])
    loader = DLDataLoader(make(paths), collate_fn=identity, num_workers=2)
    batches = list(loader)
    assert len(batches) == len(loader) == 1
    np.testing.assert_array_equal(ids(batches), np.arange(20))


# -- CUDA (runs where CUDA exists) -------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batches_match_the_cpu_batches(paths):
    on_gpu = list(
        DLDataLoader(make(paths, shuffle=True, seed=6, device="cuda"), collate_fn=identity)
    )
    on_cpu = list(DLDataLoader(make(paths, shuffle=True, seed=6), collate_fn=identity))
    assert len(on_gpu) == len(on_cpu)
    for gpu, cpu in zip(on_gpu, on_cpu, strict=True):
        for g, c in zip(gpu, cpu, strict=True):
            assert g.device.type == "cuda"
            assert g.dtype == c.dtype
            assert torch.equal(g.cpu(), c)
    with pytest.raises(tabloader.InvalidArgumentError, match="worker processes"):
        DLDataLoader(make(paths, device="cuda"), num_workers=2)
    with pytest.raises(tabloader.InvalidArgumentError, match="pin_memory"):
        DLDataLoader(make(paths, device="cuda"), pin_memory=True)


# -- packaging and examples --------------------------------------------------------------


def test_importing_tabloader_does_not_import_torch():
    code = "import sys, tabloader; print('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "False"


def load_example(relative: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_criteo_example_loss_decreases(tmp_path, one_thread, capsys):
    example = load_example("examples/criteo/train_torch.py", "criteo_train_torch")
    args = ["--data", str(tmp_path), "--rows", "20000", "--epochs", "2", "--batch-size", "512"]
    history = example.main(["--synthetic", *args, "--threads", "1"])
    assert len(history) == 2
    assert history[1]["train_loss"] < history[0]["train_loss"]
    assert history[1]["valid_loss"] < history[0]["constant_loss"]
    out = capsys.readouterr().out
    assert f"writing 20,000 rows of generated data to {tmp_path}" in out
    assert "epoch 0: 20,000/20,000 rows in " in out  # the progress, as plain lines here
    assert "epoch 0: train loss" in out
    assert "epoch 1: train loss" in out
    assert len(list((tmp_path / "train").glob("*.parquet"))) == 4


def test_criteo_example_never_trains_on_data_it_was_not_given(tmp_path, capsys):
    example = load_example("examples/criteo/train_torch.py", "criteo_train_torch")
    (tmp_path / "train").mkdir()
    for data, message in (
        (tmp_path / "nothing", f"{tmp_path}/nothing/train does not exist"),
        (tmp_path, f"{tmp_path}/train holds no parquet files"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            example.main(["--data", str(data)])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert message in err
        assert "or --synthetic to train on generated data" in err
    assert not list(tmp_path.rglob("*.parquet"))  # nothing was generated


def write_movielens_like(directory: Path, *, seed: int = 0) -> None:
    """The schema of examples/movielens/prepare.py with a learnable signal: each user and
    each movie has a hidden bias, and a user likes a movie when their sum is high."""
    rng = np.random.default_rng(seed)
    users, movies = 300, 150
    user_bias, movie_bias = rng.normal(size=users), rng.normal(size=movies)

    def table(rows: int) -> pa.Table:
        user = rng.integers(1, users, rows)
        movie = rng.integers(1, movies, rows)
        liked = user_bias[user] + movie_bias[movie] + 0.5 * rng.normal(size=rows) > 0
        return pa.table(
            {
                "userId": user.astype(np.int64),
                "movieId": movie.astype(np.int64),
                "label": liked.astype(np.float32),
                "genre_drama": (movie % 3 == 0).astype(np.int8),
            }
        )

    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(table(24_000), directory / "train.parquet", row_group_size=6000)
    pq.write_table(table(4000), directory / "valid.parquet")


def test_movielens_example_learns_users_and_movies(tmp_path, one_thread, capsys):
    write_movielens_like(tmp_path)
    example = load_example("examples/movielens/train_torch.py", "movielens_train_torch")
    history = example.main(
        ["--data", str(tmp_path), "--epochs", "2", "--batch-size", "512", "--embedding-dim", "8"]
    )
    assert [h["epoch"] for h in history] == [0, 1]
    assert history[1]["train_loss"] < history[0]["train_loss"]
    assert history[1]["constant_auc"] == 0.5
    assert history[1]["valid_auc"] > 0.75
    out = capsys.readouterr().out
    assert "1 genre features" in out
    assert "valid AUC" in out
    assert "constant predictor: 0.5000" in out


def test_example_auc_matches_the_pairwise_definition():
    example = load_example("examples/movielens/train_torch.py", "movielens_train_torch")
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 300)
    scores = np.round(rng.normal(size=300), 1)  # with ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
    assert example.roc_auc(labels, scores) == pytest.approx(pairs)
    assert example.roc_auc(labels, np.zeros(300)) == 0.5


def test_iterating_warns_when_torch_and_the_loader_oversubscribe_the_cores(tmp_path):
    import torch

    table = pa.table({"id": list(range(100)), "label": [0.0] * 100})
    items = TorchAsyncItr(tabloader.Dataset(table), cats=["id"], labels=["label"], batch_size=50)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(usable_cores())  # set after the loader was built: still seen
        with pytest.warns(tabloader.PerformanceWarning, match="torch.set_num_threads") as caught:
            assert len(list(items)) == 2
        assert "PyTorch uses" in str(caught[0].message)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once, not every epoch
            assert len(list(items)) == 2
    finally:
        torch.set_num_threads(before)


def test_batches_are_staged_into_pinned_memory_by_numpy_not_torch(monkeypatch):
    """PyTorch's own copy (``pin_memory()``, ``copy_``) runs on its OpenMP threads, which
    spin between batches when woken from the loader's thread: the staging copy is numpy's."""
    from tabloader.staging import copy_to_pinned

    def refused(*args, **kwargs):
        raise AssertionError("staged with PyTorch's copy")

    batch = torch.arange(65536 * 3, dtype=torch.int64).reshape(-1, 3)
    monkeypatch.setattr(torch.Tensor, "copy_", refused)
    monkeypatch.setattr(torch.Tensor, "pin_memory", refused)
    made = []

    def empty(shape, dtype):
        made.append((shape, dtype))
        return torch.full(shape, -1, dtype=dtype)

    staged = copy_to_pinned(batch, empty=empty)
    assert made == [((65536, 3), torch.int64)]
    assert staged.data_ptr() != batch.data_ptr()
    assert torch.equal(staged, torch.arange(65536 * 3, dtype=torch.int64).reshape(-1, 3))


def test_a_loader_or_an_adapter_given_as_data_is_refused_without_running_it(paths):
    core = tabloader.Loader(tabloader.Dataset(paths), cats=["id"], batch_size=32)
    itr = make(paths)
    for source in (core, itr):
        with pytest.raises(tabloader.InvalidArgumentError, match="pass its dataset"):
            TorchAsyncItr(source, cats=["id"], batch_size=32)
    assert core.epoch == 0 and itr.epoch == 0  # neither ran an epoch to find out
    again = TorchAsyncItr(core.dataset, cats=["id"], batch_size=32)
    assert sum(len(b[0]) for b in again) == sum(len(b["id"]) for b in core)
    generated = TorchAsyncItr((p for p in paths), cats=["id"], batch_size=32)  # lists still do
    assert len(generated) == len(again)


def test_dl_data_loader_refuses_what_is_not_a_torch_async_itr_and_drop_last(paths):
    loader = tabloader.Loader(paths, cats=["id"], batch_size=8)
    for wrong in (paths[0], tabloader.Dataset(paths), loader):
        with pytest.raises(tabloader.InvalidArgumentError, match="takes a TorchAsyncItr"):
            DLDataLoader(wrong, batch_size=None)
    with pytest.raises(tabloader.InvalidArgumentError, match="Pass drop_last=True to TorchAsync"):
        DLDataLoader(make(paths), batch_size=None, drop_last=True)


def test_nvtabulars_positional_call_shape_gives_the_same_batches(paths):
    by_position = TorchAsyncItr(tabloader.Dataset(paths), ["id"], ["x"], ["label"], 32, seed=1)
    by_keyword = TorchAsyncItr(
        tabloader.Dataset(paths), cats=["id"], conts=["x"], labels=["label"], batch_size=32, seed=1
    )
    for a, b in zip(by_position, by_keyword, strict=True):
        for left, right in zip(a, b, strict=True):
            assert torch.equal(left, right)
    with pytest.raises(tabloader.InvalidArgumentError, match="needs batch_size"):
        TorchAsyncItr(tabloader.Dataset(paths), ["id"])


def test_list_columns_alone_make_empty_dense_tensors_beside_them(tmp_path):
    torch = pytest.importorskip("torch")
    from tabloader.torch import TorchAsyncItr

    table = pa.table({"hist": pa.array([[1, 2], [3], []], pa.list_(pa.int64()))})
    pq.write_table(table, tmp_path / "a.parquet")
    itr = TorchAsyncItr(str(tmp_path), sparse_names=["hist"], batch_size=3)
    x_cat, x_cont, y, lists = next(iter(itr))
    assert x_cat.shape == (3, 0) and x_cont.shape == (3, 0) and x_cat.dtype == torch.int64
    assert y.shape == (3, 0)
    values, offsets = lists["hist"]
    assert values.tolist() == [1, 2, 3] and offsets.tolist() == [0, 2, 3]  # EmbeddingBag's
