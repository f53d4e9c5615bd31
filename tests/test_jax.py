"""JaxLoader: batches of jax.Array, padded lists, pad_last, resuming, ranks from JAX."""

from __future__ import annotations

import json
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

pytestmark = pytest.mark.jax

SRC = str(Path(__file__).resolve().parents[1] / "src")
COLUMNS = {"cats": ["id", "cat"], "conts": ["x"], "labels": ["label"]}


@pytest.fixture(autouse=True)
def _quiet(quiet_loader_warnings: None) -> None:
    """Every test here runs with the loader's advice silenced (see conftest)."""


def make(paths, **options):
    from tabloader.jax import JaxLoader

    kwargs = {**COLUMNS, "batch_size": 32, "shuffle": True, "seed": 3}
    kwargs.update(options)
    return JaxLoader(paths, **kwargs)


def ids_of(items):
    return np.concatenate([np.asarray(item[0]["id"]) for item in items])


def test_items_are_jax_arrays_of_the_delivered_dtypes(dataset_dir):
    import jax

    loader = make(dataset_dir([[70, 30]]), shuffle=False)
    features, labels = next(iter(loader))
    assert sorted(features) == ["cat", "id", "x"]
    assert all(isinstance(a, jax.Array) for a in [*features.values(), labels])
    assert {next(iter(a.devices())).platform for a in [*features.values(), labels]} == {"cpu"}
    assert loader.device.platform == "cpu"
    assert features["id"].dtype == features["cat"].dtype == np.int32  # JAX's 32-bit mode
    assert features["x"].dtype == labels.dtype == np.float32
    np.testing.assert_array_equal(features["id"], np.arange(32))
    np.testing.assert_array_equal(features["cat"], np.arange(32) % 1000)
    np.testing.assert_array_equal(features["x"], np.arange(32) / 4)
    np.testing.assert_array_equal(labels, np.arange(32) % 2)
    several = make(dataset_dir([[10]]), conts=[], labels=["x", "label"], shuffle=False)
    features, labels = next(iter(several))
    assert sorted(labels) == ["label", "x"]
    features, labels = next(iter(make(dataset_dir([[10]]), labels=[])))
    assert labels is None


def test_epochs_deliver_every_row_once_as_the_core_loader_does(dataset_dir):
    paths = dataset_dir([[37, 101, 5], [64]])
    loader = make(paths, parts_per_chunk=2)
    core = tabloader.Loader(
        paths, **COLUMNS, batch_size=32, shuffle=True, seed=3, parts_per_chunk=2
    )
    assert len(loader) == len(core) == 207 // 32 + 1
    epochs = []
    for epoch in range(2):
        items = list(loader)
        assert len(items) == len(loader)
        for (features, labels), batch in zip(items, core.iter_epoch(epoch), strict=True):
            np.testing.assert_array_equal(features["id"], batch["id"])
            np.testing.assert_array_equal(labels, batch["label"])
        epochs.append(ids_of(items))
        np.testing.assert_array_equal(np.sort(epochs[-1]), np.arange(207))
    assert not np.array_equal(*epochs)
    assert loader.epoch == 2
    again = make(paths, parts_per_chunk=2)
    np.testing.assert_array_equal(ids_of(list(again)), epochs[0])


def test_close_leaves_no_thread_behind_after_a_break(dataset_dir):
    """``close()`` stops the threads of an epoch left with a ``break``."""
    import threading

    before = set(threading.enumerate())
    loader = make(dataset_dir([[100, 100], [100]]), batch_size=7, parts_per_chunk=1)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    loader.close()
    assert [t.name for t in threading.enumerate() if t not in before and t.is_alive()] == []


def test_pad_last_pads_the_short_batch_and_masks_it(dataset_dir):
    loader = make(dataset_dir([[100]]), pad_last=True, shuffle=False)
    items = list(loader)
    assert len(items) == len(loader) == 4
    for features, labels, mask in items:
        assert features["id"].shape == features["x"].shape == labels.shape == mask.shape == (32,)
        assert mask.dtype == np.bool_
    *full, (features, labels, mask) = items
    assert all(bool(m.all()) for *_, m in full)
    assert np.asarray(mask).tolist() == [True] * 4 + [False] * 28
    np.testing.assert_array_equal(features["id"][:4], np.arange(96, 100))
    assert not np.asarray(features["id"][4:]).any() and not np.asarray(labels[4:]).any()
    dropped = make(dataset_dir([[100]]), pad_last=True, drop_last=True)
    assert [int(m.sum()) for *_, m in dropped] == [32, 32, 32]


def test_a_jitted_step_compiles_once_with_pad_last(dataset_dir):
    import jax
    import jax.numpy as jnp

    traces = []

    @jax.jit
    def step(weight, features, labels, mask):
        traces.append(features["x"].shape)  # runs when JAX traces, not when it runs

        def loss(w):
            error = jnp.where(mask, (features["x"] * w - labels) ** 2, 0.0)
            return jnp.sum(error) / jnp.sum(mask)

        value, grad = jax.value_and_grad(loss)(weight)
        return weight - 0.01 * grad, value

    weight = jnp.float32(0.0)
    for _epoch in range(2):
        for features, labels, mask in make(dataset_dir([[90]]), pad_last=True):
            weight, _loss = step(weight, features, labels, mask)
    assert traces == [(32,)]
    unpadded = []

    @jax.jit
    def plain(features):
        unpadded.append(features["x"].shape)
        return jnp.sum(features["x"])

    for features, _labels in make(dataset_dir([[90]])):
        plain(features)
    assert unpadded == [(32,), (26,)]  # without pad_last the last batch compiles again


@pytest.fixture
def list_paths(tmp_path):
    rows = 120
    genres = [[i % 5, (i * 7) % 5, 4][: i % 4] for i in range(rows)]
    table = pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "genres": pa.array(genres, pa.list_(pa.int64())),
            "label": np.ones(rows, np.float32),
        }
    )
    path = tmp_path / "lists.parquet"
    pq.write_table(table, path, row_group_size=40)
    return [str(path)], genres


def test_list_columns_come_padded_with_their_lengths(list_paths):
    paths, genres = list_paths
    loader = make(
        paths,
        cats=["id"],
        conts=[],
        sparse_names=["genres"],
        sparse_max={"genres": 3},
        sparse_pad=-1,
        pad_last=True,
        batch_size=50,
    )
    seen = []
    for features, _labels, mask in loader:
        values, lengths = features["genres"]
        assert values.shape == (50, 3) and lengths.shape == (50,)
        assert values.dtype == np.int32 and lengths.dtype == np.int32
        for i, row, n, real in zip(
            np.asarray(features["id"]),
            np.asarray(values),
            np.asarray(lengths),
            np.asarray(mask),
            strict=True,
        ):
            if not real:
                assert n == 0 and row.tolist() == [-1, -1, -1]
                continue
            want = genres[int(i)]
            assert n == len(want) and row.tolist() == want + [-1] * (3 - len(want))
            seen.append(int(i))
    assert sorted(seen) == list(range(120))
    with pytest.raises(tabloader.InvalidArgumentError, match=r"sparse_max has no entry for \["):
        make(paths, cats=["id"], conts=[], sparse_names=["genres"])
    with pytest.raises(tabloader.InvalidArgumentError, match="leave sparse_as_dense out"):
        make(
            paths,
            cats=["id"],
            conts=[],
            sparse_names=["genres"],
            sparse_max={"genres": 3},
            sparse_as_dense=False,
        )
    too_short = make(
        paths, cats=["id"], conts=[], sparse_names=["genres"], sparse_max={"genres": 2}
    )
    with pytest.raises(tabloader.InvalidArgumentError, match=r"row of 3 values.*sparse_max"):
        list(too_short)


def test_ids_that_do_not_fit_int32_are_refused_and_64_bit_mode_takes_them(tmp_path):
    import jax

    big = np.array([1, 2, 3, 2**40], np.int64)
    path = str(tmp_path / "big.parquet")
    pq.write_table(pa.table({"user": big, "y": np.ones(4, np.float32)}), path)
    options = {"cats": ["user"], "conts": [], "labels": ["y"], "batch_size": 2, "shuffle": False}
    loader = make(path, **options)
    first, second = iter(loader), None
    assert np.asarray(next(first)[0]["user"]).tolist() == [1, 2]
    with pytest.raises(
        tabloader.InvalidArgumentError,
        match=r"'user' holds 1099511627776, which does not fit int32",
    ):
        second = next(first)
    assert second is None
    with pytest.raises(tabloader.InvalidArgumentError, match="cat_dtype='int64': JAX holds no"):
        make(path, **options, cat_dtype="int64")
    with pytest.raises(tabloader.InvalidArgumentError, match="cont_dtype='float64'"):
        make(path, **options, cont_dtype=np.float64)
    jax.config.update("jax_enable_x64", True)
    try:
        wide = make(path, **options, cat_dtype="int64")
        values = [np.asarray(f["user"]) for f, _ in wide]
        assert values[1].dtype == np.int64 and values[1].tolist() == [3, 2**40]
    finally:
        jax.config.update("jax_enable_x64", False)


def test_state_dict_resumes_exactly_and_set_epoch_chooses_the_epoch(dataset_dir):
    paths = dataset_dir([[50, 70], [80]])
    reference = make(paths, batch_size=16)
    epochs = [[np.asarray(f["id"]) for f, _ in reference] for _ in range(3)]
    interrupted = make(paths, batch_size=16)
    list(interrupted)  # epoch 0
    run = iter(interrupted)
    for _ in range(5):
        next(run)
    state = json.loads(json.dumps(interrupted.state_dict()))
    assert (state["epoch"], state["batches"]) == (1, 5)
    resumed = make(paths, batch_size=16)
    resumed.load_state_dict(state)
    rest = [np.asarray(f["id"]) for f, _ in resumed]
    assert len(rest) == len(epochs[1]) - 5
    for got, want in zip(rest, epochs[1][5:], strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip([np.asarray(f["id"]) for f, _ in resumed], epochs[2], strict=True):
        np.testing.assert_array_equal(got, want)
    chosen = make(paths, batch_size=16)
    chosen.set_epoch(2)
    for got, want in zip([np.asarray(f["id"]) for f, _ in chosen], epochs[2], strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(tabloader.InvalidArgumentError, match=r"batch_size \(saved: 16; now: 8"):
        make(paths, batch_size=8).load_state_dict(state)


def test_ranks_are_disjoint_and_the_keywords_are_checked(dataset_dir):
    paths = dataset_dir([[60, 41]])
    shares = [
        ids_of(list(make(paths, global_rank=r, global_size=3, batch_size=8))) for r in range(3)
    ]
    assert {len(s) for s in shares} == {101 // 3}
    union = np.concatenate(shares)
    assert len(np.unique(union)) == len(union)
    with pytest.raises(TypeError, match="'pad_lst'; did you mean 'pad_last'"):
        make(paths, pad_lst=True)
    with pytest.raises(tabloader.InvalidArgumentError, match="pad_last must be True or False"):
        make(paths, pad_last="yes")
    with pytest.raises(tabloader.InvalidArgumentError, match=r"global_rank must be in \[0, 2\)"):
        make(paths, global_rank=2, global_size=2)


def _last_lines_of_two_processes(code: str) -> list[str]:
    """Run ``code`` in two processes of one jax.distributed job (its process id the
    argument), on the CPU; the last line each printed."""
    env = {**os.environ, "PYTHONPATH": SRC, "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(rank)],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for rank in range(2)
    ]
    outputs = [p.communicate(timeout=240) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    return [out.strip().splitlines()[-1] for out, _ in outputs]


@pytest.mark.distributed
@pytest.mark.slow
def test_ranks_default_to_the_jax_processes(dataset_dir):
    """Two processes under jax.distributed: each loader takes its rank from JAX."""
    import socket

    paths = dataset_dir([[50, 50], [23]])
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    code = textwrap.dedent(
        f"""
        import sys, warnings, jax
        jax.distributed.initialize("localhost:{port}", num_processes=2,
                                   process_id=int(sys.argv[1]))
        warnings.simplefilter("ignore")
        from tabloader.jax import JaxLoader
        loader = JaxLoader({paths!r}, cats=["id"], batch_size=10, shuffle=True, seed=4,
                           device="cpu")
        ids = [int(i) for features, _ in loader for i in features["id"]]
        print(loader.global_rank, loader.global_size, len(loader), ids)
        jax.distributed.shutdown()
        """
    )
    results = []
    for line in _last_lines_of_two_processes(code):
        rank, size, length, ids = line.split(" ", 3)
        results.append((int(rank), int(size), int(length), json.loads(ids)))
    assert [(r, s, n) for r, s, n, _ in results] == [(0, 2, 7), (1, 2, 7)]
    first, second = (set(ids) for *_, ids in results)
    assert len(first) == len(second) == 61 and not first & second


def test_a_state_resumes_on_another_number_of_processes(dataset_dir):
    """Three processes' loaders pre-empted mid-epoch keep one state (each agreeing), which
    two resume: every row of the epoch once, the same number of batches each, pad_last's
    shapes throughout."""
    from tabloader.jax import JaxLoader

    paths = dataset_dir([[50, 70], [81]])  # 201 rows: 67 a rank on 3, 100 (and 1 out) on 2
    options = {**COLUMNS, "batch_size": 16, "shuffle": True, "seed": 3, "pad_last": True}

    def rows(items) -> list[int]:
        return [int(i) for f, _, mask in items for i in np.asarray(f["id"])[np.asarray(mask)]]

    old = [JaxLoader(paths, **options, global_rank=r, global_size=3) for r in range(3)]
    before, states = [], []
    for loader in old:
        run = iter(loader)
        before += rows(next(run) for _ in range(2))
        states.append(json.loads(json.dumps(loader.state_dict())))
    state = tabloader.agreed_state(states)
    after, counts = [], []
    for rank in range(2):
        loader = JaxLoader(paths, **options, global_rank=rank, global_size=2)
        loader.load_state_dict(state)
        items = list(loader)
        assert all(f["id"].shape == (16,) for f, _, _ in items)
        after += rows(items)
        counts.append(len(items))
    delivered = before + after
    assert len(set(delivered)) == len(delivered)  # none twice
    assert len(delivered) >= 201 - 2 - 1  # all but those that sat out (of 3 ranks, of 2)
    assert counts[0] == counts[1]


def test_processes_agree_on_one_state_or_are_refused(dataset_dir):
    """Two processes under jax.distributed: tabloader.jax.agreed_state gathers both
    states; in step they are one, out of step both processes are told so."""
    import socket

    paths = dataset_dir([[50, 50], [23]])
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    code = textwrap.dedent(
        f"""
        import json, sys, warnings, jax
        rank = int(sys.argv[1])
        jax.distributed.initialize("localhost:{port}", num_processes=2, process_id=rank)
        warnings.simplefilter("ignore")
        import tabloader
        from tabloader.jax import JaxLoader, agreed_state
        loader = JaxLoader({paths!r}, cats=["id"], batch_size=10, shuffle=True, seed=4,
                           device="cpu")
        run = iter(loader)
        for _ in range(3):
            next(run)
        state = agreed_state(loader)
        if rank == 1:
            next(run)  # one batch ahead of process 0
        try:
            agreed_state(loader)
            refused = ""
        except tabloader.InvalidArgumentError as error:
            refused = str(error)
        print(json.dumps([state, refused]))
        jax.distributed.shutdown()
        """
    )
    results = [json.loads(line) for line in _last_lines_of_two_processes(code)]
    (state, refused), (other, refused_too) = results
    assert state == other and (state["global_size"], state["batches"]) == (2, 3)
    assert "rank 1's batches is 4, rank 0's 3. The ranks were not in step" in refused
    assert refused == refused_too
    # the job goes on in one process, from the state either process kept
    resumed = make(paths, cats=["id"], conts=[], labels=[], batch_size=10, seed=4)
    resumed.load_state_dict(state)
    assert (
        sum(len(f["id"]) for f, _ in resumed) == 2 * 61 - 2 * 3 * 10
    )  # the rows neither delivered


# -- on a GPU ------------------------------------------------------------------------


@pytest.mark.gpu
def test_batches_on_the_gpu_are_jax_arrays_there_and_equal_the_cpus(dataset_dir):
    import cupy

    from tabloader.tensors import dlpack_place

    expected = "gpu" if dlpack_place(cupy.zeros(1))[0] == "cuda" else "cpu"  # emulated: host
    paths = dataset_dir([[300, 211]])
    cpu = make(paths, device="cpu", pad_last=True)
    gpu = make(paths, device="cuda", pad_last=True)
    assert gpu.loader.device.is_cuda and gpu.device.platform == expected
    for (cf, cy, cm), (gf, gy, gm) in zip(cpu, gpu, strict=True):
        for name in ("id", "cat", "x"):
            assert next(iter(gf[name].devices())).platform == expected
            np.testing.assert_array_equal(np.asarray(cf[name]), np.asarray(gf[name]))
        np.testing.assert_array_equal(np.asarray(cy), np.asarray(gy))
        np.testing.assert_array_equal(np.asarray(cm), np.asarray(gm))


@pytest.mark.gpu
def test_a_jitted_step_trains_on_gpu_batches(dataset_dir, list_paths):
    import jax
    import jax.numpy as jnp

    paths, _ = list_paths
    loader = make(
        paths,
        cats=["id"],
        conts=[],
        sparse_names=["genres"],
        sparse_max={"genres": 3},
        pad_last=True,
        batch_size=50,
        device="cuda",
    )
    table = jnp.zeros((5, 2))

    @jax.jit
    def step(table, features, labels, mask):
        def loss(table):
            values, lengths = features["genres"]
            real = jnp.arange(3)[None, :] < lengths[:, None]
            pooled = jnp.sum(table[values] * real[..., None], axis=1)
            error = jnp.where(mask, (pooled.sum(-1) - labels) ** 2, 0.0)
            return jnp.sum(error) / jnp.sum(mask)

        value, grad = jax.value_and_grad(loss)(table)
        return table - 0.05 * grad, value

    losses = []
    for _ in range(3):
        for features, labels, mask in loader:
            table, value = step(table, features, labels, mask)
            losses.append(float(value))
    assert losses[-1] < losses[0] / 2


def test_narrowing_names_the_column_that_does_not_fit_beside_empty_list_values():
    """Several columns narrowed at once (a batch's ids and a list column's values, which
    may be empty): one verdict for all, and the error names the column that holds the
    value, never a failure of the empty one."""
    from tabloader.tensors import narrowed

    int32 = np.dtype("int32")
    columns = {
        ("tags", "values"): np.array([], np.int64),
        "item": np.array([4, 2**31 - 1]),
        "user": np.array([3, -(2**31) - 1]),
    }
    dtypes = dict.fromkeys(columns, int32)
    with pytest.raises(tabloader.InvalidArgumentError, match=r"'user' holds -2147483649"):
        narrowed(columns, dtypes)
    columns["user"] = np.array([3, -(2**31)])
    out = narrowed(columns, dtypes)
    assert {key: a.dtype for key, a in out.items()} == dict.fromkeys(columns, int32)
    assert out["user"].tolist() == [3, -(2**31)] and out[("tags", "values")].size == 0


def test_bad_list_widths_and_dtypes_numpy_cannot_hold_are_clear_errors(dataset_dir):
    jnp = pytest.importorskip("jax.numpy")
    paths = dataset_dir([[40]])
    with pytest.raises(tabloader.InvalidArgumentError, match="sparse_max must be a mapping"):
        make(paths, sparse_names=["id"], sparse_max=4)
    with pytest.raises(tabloader.InvalidArgumentError, match="not one of numpy's own number"):
        make(paths, cont_dtype=jnp.bfloat16)
    # a non-integer id dtype: JAX's 32-bit mode read ids as int64 to narrow them, which
    # skipped the core's check, and the first batch raised numpy's "Invalid integer data type"
    for dtype in ("float32", "bool"):
        with pytest.raises(tabloader.InvalidArgumentError, match="cat_dtype must be an integer"):
            make(paths, cat_dtype=dtype)
