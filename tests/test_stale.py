"""Nothing stale: what a file's identity, a cache key and a resume state must tell apart.

A file rewritten in place can keep its size, its modification time and even its footer
byte for byte (a column permuted against the others, with pyarrow's default writer);
a global shuffle resumed where the cache is refused would be another plan; an in-memory
table has no footer at all. Each test writes the data the way a user's tools do and
checks the rows delivered, not tabloader's own bookkeeping.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader

ROWS = 100_000


def _footer(path: Path) -> bytes:
    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    return data[-8 - length :]


def _table(values: np.ndarray) -> pa.Table:
    ids = np.arange(ROWS, dtype=np.int64)
    return pa.table({"id": ids, "f": ids % 1000, "g": values})


def _rewrite_permuted(path: Path, values: np.ndarray, *, keep_mtime: bool) -> np.ndarray:
    """Rewrite ``path`` (pyarrow's defaults: snappy, dictionaries, statistics) with the
    float column permuted against the others; the footer comes out the same."""
    before = os.stat(path)
    footer = _footer(path)
    permuted = values[np.random.default_rng(1).permutation(ROWS)]
    pq.write_table(_table(permuted), path)
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert os.stat(path).st_mtime_ns == before.st_mtime_ns
    assert _footer(path) == footer, "the rewrite must keep the footer for this test to mean much"
    return permuted


@pytest.fixture
def written(tmp_path: Path) -> tuple[Path, np.ndarray]:
    path = tmp_path / "data" / "part-0.parquet"
    path.parent.mkdir()
    values = np.random.default_rng(0).random(ROWS).astype(np.float32)
    pq.write_table(_table(values), path)
    return path, values


def _stale_rows(batches: list[dict[str, Any]], values: np.ndarray) -> int:
    ids = np.concatenate([b["id"] for b in batches])
    g = np.concatenate([b["g"] for b in batches])
    assert sorted(ids.tolist()) == list(range(ROWS))
    return int((g != values[ids]).sum())


def _options(tmp_path: Path, **more: Any) -> dict[str, Any]:
    return dict(cats=["id", "f"], conts=["g"], batch_size=10_000, seed=3, **more)


@pytest.mark.parametrize("keep_mtime", [False, True], ids=["new-mtime", "mtime-put-back"])
def test_a_rewrite_with_an_identical_footer_is_not_served_from_a_disk_cache(
    tmp_path, written, keep_mtime
):
    path, values = written
    options = _options(tmp_path, cache="disk", cache_dir=tmp_path / "c", shuffle=True)
    first = tabloader.Loader(str(path), **options)
    assert _stale_rows(list(first), values) == 0
    first.cache.wait()
    now = _rewrite_permuted(path, values, keep_mtime=keep_mtime)
    second = tabloader.Loader(str(path), **options)
    assert _stale_rows(list(second), now) == 0
    assert not second.stats().from_cache


@pytest.mark.parametrize("keep_mtime", [False, True], ids=["new-mtime", "mtime-put-back"])
def test_a_refreshing_memory_cache_drops_a_rewrite_with_an_identical_footer(
    tmp_path, written, keep_mtime
):
    path, values = written
    dataset = tabloader.Dataset(str(path.parent), refresh=True)
    loader = tabloader.Loader(dataset, **_options(tmp_path, cache="memory"))
    assert _stale_rows(list(loader), values) == 0
    assert _stale_rows(list(loader), values) == 0 and loader.stats().from_cache
    now = _rewrite_permuted(path, values, keep_mtime=keep_mtime)
    assert dataset.changed_files() == [str(path)]
    assert _stale_rows(list(loader), now) == 0
    assert not loader.stats().from_cache


@pytest.mark.parametrize("keep_mtime", [False, True], ids=["new-mtime", "mtime-put-back"])
def test_a_state_saved_before_a_rewrite_with_an_identical_footer_is_refused(
    tmp_path, written, keep_mtime
):
    path, values = written
    loader = tabloader.Loader(str(path), **_options(tmp_path, shuffle=True))
    epoch = iter(loader)
    next(epoch)
    state = loader.state_dict()
    _rewrite_permuted(path, values, keep_mtime=keep_mtime)
    again = tabloader.Loader(str(path), **_options(tmp_path, shuffle=True))
    with pytest.raises(tabloader.InvalidArgumentError, match="rewritten in place") as err:
        again.load_state_dict(state)
    assert "cannot resume from this state" in str(err.value)


def test_a_state_resumes_on_copies_made_with_or_without_their_times(tmp_path, written):
    """The same data elsewhere resumes: only at the same place do new stamps mean a
    rewrite (what the fingerprint caught before, a copy, still holds)."""
    path, _ = written
    loader = tabloader.Loader(str(path.parent), **_options(tmp_path, shuffle=True))
    epoch = iter(loader)
    before = [next(epoch)["id"].copy() for _ in range(3)]
    state = loader.state_dict()
    rest = [b["id"].copy() for b in epoch]
    for name, copy in (("kept", shutil.copy2), ("new", shutil.copy)):
        target = tmp_path / name
        target.mkdir()
        copy(path, target / path.name)
        resumed = tabloader.Loader(str(target), **_options(tmp_path, shuffle=True))
        resumed.load_state_dict(state)
        again = [b["id"] for b in resumed]
        assert all(np.array_equal(a, b) for a, b in zip(again, rest, strict=True))
    assert len(before) + len(rest) == len(loader)


def test_a_state_resumes_on_another_machines_copy_at_the_same_path(tmp_path, written, monkeypatch):
    """Each node of a job may read a copy of its own at the same path (other inodes and
    times): a state saved on one node resumes on another. The files' names, rows and
    footers still decide; the stamps only on the machine that took them."""
    import socket

    path, _ = written
    loader = tabloader.Loader(str(path), **_options(tmp_path, shuffle=True))
    epoch = iter(loader)
    next(epoch)
    state = loader.state_dict()
    rest = [b["id"].copy() for b in epoch]
    copy = tmp_path / "copy.parquet"
    shutil.copy(path, copy)
    os.replace(copy, path)  # what the other node's copy is: another inode, other times
    with pytest.raises(tabloader.InvalidArgumentError, match="rewritten in place"):
        tabloader.Loader(str(path), **_options(tmp_path, shuffle=True)).load_state_dict(state)
    monkeypatch.setattr(socket, "gethostname", lambda: "another-node")
    resumed = tabloader.Loader(str(path), **_options(tmp_path, shuffle=True))
    resumed.load_state_dict(state)
    again = [b["id"] for b in resumed]
    assert all(np.array_equal(a, b) for a, b in zip(again, rest, strict=True))


def test_a_touched_file_at_the_same_place_refuses_a_state_saying_why(tmp_path, written):
    path, _ = written
    loader = tabloader.Loader(str(path), **_options(tmp_path))
    state = loader.state_dict()
    os.utime(path)  # nothing tells a touch from a rewrite that kept the footer
    with pytest.raises(tabloader.InvalidArgumentError, match="rewritten in place"):
        tabloader.Loader(str(path), **_options(tmp_path)).load_state_dict(state)


# -- a global shuffle resumed where its cache is refused -----------------------------------


def _global(tmp_path: Path, files: list[str], cache_dir: Path) -> tabloader.Loader:
    return tabloader.Loader(
        files, cats=["id"], batch_size=500, shuffle="global", seed=5, cache="disk",
        cache_dir=cache_dir,
    )  # fmt: skip


@pytest.fixture
def parts(tmp_path: Path) -> list[str]:
    paths = []
    for f in range(4):
        path = tmp_path / f"part-{f}.parquet"
        pq.write_table(pa.table({"id": np.arange(f * 2000, (f + 1) * 2000)}), path)
        paths.append(str(path))
    return paths


def _open_directory(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    return shared


def test_a_global_state_is_refused_where_the_cache_is_refused(tmp_path, parts):
    saving = _global(tmp_path, parts, tmp_path / "private")
    epoch = iter(saving)
    delivered = [next(epoch)["id"].copy() for _ in range(4)]
    state = saving.state_dict()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        refused = _global(tmp_path, parts, _open_directory(tmp_path))
    with pytest.raises(tabloader.InvalidArgumentError) as err:
        refused.load_state_dict(state)
    message = str(err.value)
    assert "shuffle (saved: 'global'; now: True" in message
    assert "cache is not used" in message and "can be written by other users" in message
    assert sum(len(b) for b in delivered) == 2000


def test_a_state_saved_while_the_cache_was_refused_resumes_exactly_where_it_is_refused(
    tmp_path, parts
):
    shared = _open_directory(tmp_path)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        saving = _global(tmp_path, parts, shared)
        epoch = iter(saving)
        before = [next(epoch)["id"].copy() for _ in range(4)]
        state = saving.state_dict()
        rest = [b["id"].copy() for b in epoch]
        resumed = _global(tmp_path, parts, shared)
        resumed.load_state_dict(state)
        again = [b["id"] for b in resumed]
    assert all(np.array_equal(a, b) for a, b in zip(again, rest, strict=True))
    ids = np.concatenate(before + again)
    assert sorted(ids.tolist()) == list(range(8000))
    refused = r"shuffle \(saved: True; now: 'global'"
    with pytest.raises(tabloader.InvalidArgumentError, match=refused):
        _global(tmp_path, parts, tmp_path / "private").load_state_dict(state)


def test_a_global_state_resumes_exactly_where_the_cache_is_used(tmp_path, parts):
    saving = _global(tmp_path, parts, tmp_path / "private")
    epoch = iter(saving)
    before = [next(epoch)["id"].copy() for _ in range(4)]
    state = saving.state_dict()
    rest = [b["id"].copy() for b in epoch]
    resumed = _global(tmp_path, parts, tmp_path / "private2")
    resumed.load_state_dict(state)
    again = [b["id"] for b in resumed]
    assert all(np.array_equal(a, b) for a, b in zip(again, rest, strict=True))
    assert sorted(np.concatenate(before + again).tolist()) == list(range(8000))


# -- in-memory sources are told apart by their rows -----------------------------------------


def _frames(kind: str) -> tuple[Any, Any, Any]:
    """A frame, the same rows built again, and other rows of the same schema and count."""
    a = {"id": np.arange(1000, dtype=np.int64), "x": np.linspace(0, 1, 1000)}
    b = {"id": np.arange(1000, dtype=np.int64)[::-1].copy(), "x": np.linspace(0, 1, 1000)}
    if kind == "arrow":
        return pa.table(a), pa.table({k: v.copy() for k, v in a.items()}), pa.table(b)
    import pandas as pd

    if kind == "pandas":
        return pd.DataFrame(a), pd.DataFrame(a), pd.DataFrame(b)
    dd = pytest.importorskip("dask.dataframe")
    return (
        dd.from_pandas(pd.DataFrame(a), npartitions=2),
        dd.from_pandas(pd.DataFrame(a), npartitions=2),
        dd.from_pandas(pd.DataFrame(b), npartitions=2),
    )


@pytest.mark.parametrize("kind", ["arrow", "pandas", "dask"])
def test_a_state_of_another_in_memory_table_of_the_same_shape_is_refused(kind):
    frame, same, other = _frames(kind)
    options = dict(cats=["id"], conts=["x"], batch_size=100, shuffle=True, seed=2)
    loader = tabloader.Loader(frame, **options)
    epoch = iter(loader)
    next(epoch)
    state = loader.state_dict()
    rest = [b["id"].copy() for b in epoch]
    resumed = tabloader.Loader(same, **options)
    resumed.load_state_dict(state)
    assert all(np.array_equal(a, b["id"]) for a, b in zip(rest, resumed, strict=True))
    with pytest.raises(tabloader.InvalidArgumentError, match=r"cannot resume.*the dataset"):
        tabloader.Loader(other, **options).load_state_dict(state)


def _ids_table(ids: np.ndarray) -> pa.Table:
    return pa.table({"id": ids.astype(np.int64), "x": ids.astype(np.float64) / 1000})


_DASK_RESUME = """
import json, sys
import dask.dataframe as dd
import tabloader
directory, state_file, step = sys.argv[1:4]
frame = dd.read_parquet(directory)[["id", "x"]]
loader = tabloader.Loader(frame, cats=["id"], conts=["x"], batch_size=100, shuffle=True, seed=2)
if step == "save":
    epoch = iter(loader)
    next(epoch)
    with open(state_file, "w") as f:
        json.dump(loader.state_dict(), f)
    print(json.dumps(sorted(int(i) for b in epoch for i in b["id"])))
else:
    with open(state_file) as f:
        loader.load_state_dict(json.load(f))
    print(json.dumps(sorted(int(i) for b in loader for i in b["id"])))
"""


def test_a_dask_frame_read_from_files_resumes_in_a_restarted_process(tmp_path):
    """The same files read by ``dask.dataframe.read_parquet`` in a new process resume a
    state: dask's own token of such a frame changes from one process to the next (it
    hashes the pyarrow dataset object it keeps), so the frame is told by its expression
    and the files' checksums. Files rewritten since the state was saved refuse it."""
    import json
    import subprocess
    import sys

    pytest.importorskip("dask.dataframe")
    directory = tmp_path / "data"
    directory.mkdir()
    for i in range(2):
        pq.write_table(_ids_table(np.arange(500 * i, 500 * (i + 1))), directory / f"p{i}.parquet")
    state = tmp_path / "state.json"
    script = tmp_path / "resume.py"
    script.write_text(_DASK_RESUME)

    def run(step: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        command = [sys.executable, str(script), str(directory), str(state), step]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)

    saved = run("save")
    assert saved.returncode == 0, saved.stderr
    resumed = run("load")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == json.loads(saved.stdout)  # the rest, exactly
    pq.write_table(_ids_table(np.arange(500, 1000)[::-1].copy()), directory / "p1.parquet")
    refused = run("load")
    assert refused.returncode != 0 and "cannot resume from this state" in refused.stderr


def test_a_table_sliced_from_a_larger_one_has_the_digest_of_its_own_rows():
    whole = pa.table({"id": np.arange(2000, dtype=np.int64)})
    alone = pa.table({"id": np.arange(1000, 2000, dtype=np.int64)})
    sliced = tabloader.Dataset(whole.slice(1000)).content_digest()
    assert sliced == tabloader.Dataset(alone).content_digest()
    assert sliced != tabloader.Dataset(whole.slice(0, 1000)).content_digest()
