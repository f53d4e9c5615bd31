"""Nothing stale, nothing planted: the decoded cache and the resume state under changed
files, damaged caches, full disks and other users.

Each test reproduces a way a loader served wrong rows, or let another user decide what
it served, and checks the rows delivered (exact ids, every column agreeing with its id),
the warning said, and what is left on disk.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tabloader
from conftest import make_table, write_dataset
from tabloader.cache import MANIFEST
from tabloader.cache.files import CHECKSUM, checksum
from tabloader.state import STATE_FORMAT

COLS = {"cats": ["id", "cat"], "conts": ["x"], "labels": ["label"]}
LAYOUT = [[100, 60, 37], [80], [45, 90]]
ROWS = 412
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
OTHER_USER = 12345
"""A user id no test process runs as."""


def ids(batches: list[Any]) -> list[int]:
    return sorted(int(i) for b in batches for i in np.asarray(b["id"]))


def check_rows_intact(batches: list[Any]) -> None:
    for b in batches:
        i = np.asarray(b["id"])
        np.testing.assert_array_equal(b["cat"], i % 1000)
        np.testing.assert_array_equal(b["x"], (i / 4.0).astype(np.float32))
        np.testing.assert_array_equal(b["label"], (i % 2).astype(np.float32))


def run(loader: tabloader.Loader) -> list[Any]:
    batches = list(loader)
    if loader.cache is not None:
        loader.cache.wait()
    return batches


def published(root: Path) -> list[Path]:
    return [p.parent for p in root.glob(f"*/{MANIFEST}") if not p.parent.name.startswith(".")]


def cache_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, tabloader.CacheWarning)]


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    return write_dataset(tmp_path / "data", LAYOUT)


@pytest.fixture(params=["plenty", "scarce"])
def memory(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """With scarce memory a disk cache is written straight into its files."""
    if request.param == "scarce":
        import tabloader.cache.policy

        monkeypatch.setattr(tabloader.cache.policy, "_available_memory", lambda: 30_000)
    return str(request.param)


def _gen_table(gen: int, start: int, rows: int) -> pa.Table:
    return pa.table(
        {
            "id": np.arange(start, start + rows, dtype=np.int64),
            "gen": np.full(rows, gen, dtype=np.int64),
        }
    )


def _replace(path: Path, table: pa.Table) -> None:
    """Write ``table`` beside ``path`` and move it over ``path`` (a new file, same rows)."""
    temp = path.with_name(path.name + ".new")
    pq.write_table(table, temp)
    os.replace(temp, path)


# -- 1. a file replaced in place is read again ------------------------------------------


@pytest.mark.parametrize("cache", [None, "memory", "disk"])
def test_a_refreshing_loader_reads_a_file_replaced_in_place_again(tmp_path, cache):
    directory = tmp_path / "data"
    directory.mkdir()
    paths = [directory / f"part-{f}.parquet" for f in range(3)]
    for f, path in enumerate(paths):
        pq.write_table(_gen_table(0, f * 5000, 5000), path)
    dataset = tabloader.Dataset(str(directory), refresh=True)
    loader = tabloader.Loader(
        dataset, cats=["id", "gen"], batch_size=1000, cache=cache, cache_dir=tmp_path / "c"
    )
    epochs = []
    for epoch in range(4):
        if epoch:
            f = epoch - 1
            _replace(paths[f], _gen_table(epoch, f * 5000, 5000))
        batches = run(loader)
        assert ids(batches) == list(range(15_000))
        epochs.append({int(g) for b in batches for g in b["gen"]})
    assert epochs == [{0}, {0, 1}, {0, 1, 2}, {1, 2, 3}]
    if cache == "disk":
        assert len(published(tmp_path / "c")) == 1  # the stale versions were deleted


# -- 2. the key and the resume fingerprint follow the content ---------------------------


def _same_size_rewrite(path: Path, values: np.ndarray) -> None:
    """Rewrite ``path`` with ``values`` in place: same size, mtime put back (cp -p)."""
    before = os.stat(path)
    table = pa.table({"id": np.arange(len(values), dtype=np.int64), "v": values})
    pq.write_table(table, path, compression="none", use_dictionary=False)
    assert os.stat(path).st_size == before.st_size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_file_rewritten_with_its_size_and_mtime_kept_is_not_served_from_the_cache(tmp_path):
    path = tmp_path / "data.parquet"
    table = pa.table({"id": np.arange(1000, dtype=np.int64), "v": np.zeros(1000, np.int64)})
    pq.write_table(table, path, compression="none", use_dictionary=False)
    options = dict(cats=["id", "v"], batch_size=100, cache="disk", cache_dir=tmp_path / "c")
    first = tabloader.Loader(str(path), **options)
    assert {int(v) for b in run(first) for v in b["v"]} == {0}
    _same_size_rewrite(path, np.full(1000, 7, np.int64))
    second = tabloader.Loader(str(path), **options)
    assert {int(v) for b in run(second) for v in b["v"]} == {7}
    assert not second.stats().from_cache


def test_a_state_of_a_dataset_with_the_same_names_and_rows_but_other_content_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for directory, offset in ((a, 0), (b, 10_000)):
        directory.mkdir()
        for f in range(2):
            pq.write_table(_gen_table(0, offset + f * 300, 300), directory / f"p{f}.parquet")
    state = tabloader.Loader(str(a), cats=["id"], batch_size=64, seed=1).state_dict()
    same = tabloader.Loader(str(a), cats=["id"], batch_size=64, seed=1)
    same.load_state_dict(state)  # the same content resumes, wherever it lives:
    moved = tmp_path / "moved"
    shutil.copytree(a, moved)
    tabloader.Loader(str(moved), cats=["id"], batch_size=64, seed=1).load_state_dict(state)
    other = tabloader.Loader(str(b), cats=["id"], batch_size=64, seed=1)
    with pytest.raises(tabloader.InvalidArgumentError, match=r"cannot resume.*the dataset") as err:
        other.load_state_dict(state)
    assert "600 rows in 2 partitions of 2 files" in str(err.value)


def test_the_state_names_the_tabloader_version_and_refuses_an_old_format(files):
    loader = tabloader.Loader(files, **COLS, batch_size=50, seed=0)
    state = loader.state_dict()
    assert state["tabloader"] == tabloader.__version__ and state["format"] == STATE_FORMAT
    old = {k: v for k, v in state.items() if k != "tabloader"} | {"format": 1}
    with pytest.raises(
        tabloader.InvalidArgumentError, match=r"state format 1\), whose dataset fingerprint"
    ):
        loader.load_state_dict(old)
    with pytest.raises(
        tabloader.InvalidArgumentError, match=r"state format 7 \(saved by tabloader 9"
    ):
        loader.load_state_dict({**state, "format": 7, "tabloader": "9.0"})
    with pytest.raises(tabloader.InvalidArgumentError, match=r"format 2\), which shuffled"):
        loader.load_state_dict({**state, "format": 2})


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"options": "x"}, r"its 'options' must be a dict .*got 'x'"),
        ({"dataset": ["x"]}, r"its 'dataset' must be a dict"),
        ({"epoch": "3"}, r"its 'epoch' must be an integer, got '3'"),
        ({"batches": 1.5}, r"its 'batches' must be an integer"),
    ],
)
def test_a_malformed_state_is_a_clear_error(files, change, match):
    loader = tabloader.Loader(files, **COLS, batch_size=50, seed=0)
    with pytest.raises(tabloader.InvalidArgumentError, match=match):
        loader.load_state_dict({**loader.state_dict(), **change})


# -- 4. list columns with a cache -------------------------------------------------------


def _list_table(rows: int) -> pa.Table:
    lists = [None if i % 7 == 3 else list(range(i, i + i % 4)) for i in range(rows)]
    return pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "t": pa.array(lists, pa.list_(pa.int64())),
            "label": np.zeros(rows, np.float32),
        }
    )


def _lists_of(batch: dict[str, Any], dense: bool) -> list[list[int]]:
    if dense:
        return [[int(v) for v in row] for row in np.asarray(batch["t"])]
    values, offsets = batch["t"]
    return [list(map(int, values[a:b])) for a, b in itertools.pairwise(offsets)]


def _expected_list(i: int) -> list[int]:
    return [] if i % 7 == 3 else list(range(i, i + i % 4))


@pytest.mark.parametrize("cache", ["memory", "disk"])
@pytest.mark.parametrize("shuffle", [False, True, "global"])
@pytest.mark.parametrize("dense", [False, True])
def test_a_cached_list_column_delivers_what_streaming_does(tmp_path, memory, cache, shuffle, dense):
    path = tmp_path / "lists.parquet"
    pq.write_table(_list_table(203), path, row_group_size=50)
    options: dict[str, Any] = dict(
        cats=["id"], sparse_names=["t"], labels=["label"], batch_size=16, seed=3
    )
    if dense:
        options.update(sparse_as_dense=True, sparse_max={"t": 4}, sparse_pad=-1)
    cached = tabloader.Loader(
        str(path), **options, shuffle=shuffle, cache=cache, cache_dir=tmp_path / "c"
    )
    streamed = (
        tabloader.Loader(str(path), **options, shuffle=shuffle) if shuffle != "global" else None
    )
    for epoch in range(3):
        batches = run(cached)
        assert cached.stats().from_cache == (epoch > 0)
        assert ids(batches) == list(range(203))
        for b in batches:
            for i, got in zip(np.asarray(b["id"]).tolist(), _lists_of(b, dense), strict=True):
                want = _expected_list(i)
                assert got == (want + [-1] * (4 - len(want)) if dense else want)
        if streamed is not None:
            reference = list(streamed)
            assert [np.asarray(b["id"]).tolist() for b in batches] == [
                np.asarray(b["id"]).tolist() for b in reference
            ]
            assert [_lists_of(b, dense) for b in batches] == [
                _lists_of(b, dense) for b in reference
            ]


@pytest.mark.torch
@pytest.mark.parametrize("shuffle", [False, True, "global"])
def test_torch_adapter_serves_cached_list_columns(tmp_path, shuffle):
    from tabloader.torch import TorchAsyncItr

    path = tmp_path / "lists.parquet"
    pq.write_table(_list_table(100), path, row_group_size=25)
    itr = TorchAsyncItr(
        str(path),
        cats=["id"],
        sparse_names=["t"],
        labels=["label"],
        batch_size=8,
        shuffle=shuffle,
        seed=0,
        cache="memory",
        device="cpu",
    )
    for _ in range(2):
        seen = []
        for x_cat, _, _, lists in itr:
            values, offsets = lists["t"]
            ends = [*offsets.tolist()[1:], len(values)]
            for i, a, b in zip(x_cat[:, 0].tolist(), offsets.tolist(), ends, strict=True):
                assert values[a:b].tolist() == _expected_list(i)
                seen.append(i)
        assert sorted(seen) == list(range(100))


# -- 5. rows skipped while filling are never cached -------------------------------------


@pytest.mark.parametrize("cache", ["memory", "disk"])
def test_an_epoch_that_skipped_a_deleted_file_is_not_cached(tmp_path, cache):
    paths = write_dataset(tmp_path / "data", [[10_000]] * 6)
    backup = tmp_path / "backup.parquet"
    shutil.copy(paths[4], backup)
    dataset = tabloader.Dataset(paths, on_missing="skip")
    loader = tabloader.Loader(
        dataset,
        **COLS,
        batch_size=1000,
        parts_per_chunk=1,
        cache=cache,
        cache_dir=tmp_path / "c",
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        os.unlink(paths[4])  # deleted after it was listed: epoch 0 skips it
        epoch0 = run(loader)
    assert len(set(ids(epoch0))) == 50_000 and len(ids(epoch0)) == 60_000  # as streaming
    assert any("not keeping the decoded rows" in m for m in cache_warnings(caught))
    assert loader.stats().rows_skipped == 10_000
    assert not published(tmp_path / "c")
    epoch1 = run(loader)  # the file is still gone: streamed again, counted again
    assert not loader.stats().from_cache and loader.stats().rows_skipped == 20_000
    assert len(set(ids(epoch1))) == 50_000
    shutil.copy(backup, paths[4])  # back: the next epoch reads it, but a file put back
    epoch2 = run(loader)  # is not the file listed (its inode and times differ): not cached
    assert ids(epoch2) == list(range(60_000))
    assert not published(tmp_path / "c")
    listed = tabloader.Loader(  # listed again, it is cached
        tabloader.Dataset(paths, on_missing="skip"),
        **COLS,
        batch_size=1000,
        parts_per_chunk=1,
        cache=cache,
        cache_dir=tmp_path / "c",
    )
    assert ids(run(listed)) == list(range(60_000))
    epoch3 = run(listed)
    assert listed.stats().from_cache and ids(epoch3) == list(range(60_000))
    check_rows_intact(epoch3)


# -- 6. a published cache is verified -----------------------------------------------------


def _publish(files: list[str], root: Path, **options: Any) -> Path:
    run(tabloader.Loader(files, **COLS, batch_size=50, cache="disk", cache_dir=root, **options))
    (directory,) = published(root)
    return directory


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(64):
        data[-200 + i] ^= 0xFF
    path.write_bytes(bytes(data))


def _overwrite_one_id(path: Path) -> None:
    array = np.load(path, mmap_mode="r+")
    array[5, 0] = 17
    array.flush()
    del array


def _another_valid_npy(path: Path) -> None:
    array = np.load(path)
    np.save(path, array[::-1].copy())  # same shape and dtype, rows in another order


def _empty(path: Path) -> None:
    path.write_bytes(b"")


@pytest.mark.parametrize("damage", [_flip, _overwrite_one_id, _another_valid_npy, _empty])
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_damaged_cache_is_said_rebuilt_and_never_served(files, tmp_path, damage, shuffle):
    root = tmp_path / "c"
    directory = _publish(files, root, shuffle=shuffle, seed=1)
    damage(directory / "block0.npy")
    loader = tabloader.Loader(
        files, **COLS, batch_size=50, shuffle=shuffle, seed=1, cache="disk", cache_dir=root
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = run(loader)
    messages = cache_warnings(caught)
    assert len(messages) == 1 and "is damaged or was altered" in messages[0]
    assert not loader.stats().from_cache  # streamed meanwhile
    assert ids(batches) == list(range(ROWS))
    check_rows_intact(batches)
    again = tabloader.Loader(
        files, **COLS, batch_size=50, shuffle=shuffle, seed=1, cache="disk", cache_dir=root
    )
    batches = run(again)  # rebuilt, and verified when opened
    assert again.stats().from_cache and ids(batches) == list(range(ROWS))
    check_rows_intact(batches)


_CUT_WHILE_SERVED = textwrap.dedent(
    """
    import os, sys, warnings
    import numpy as np
    import tabloader

    files, root, directory = sys.argv[1:-1], sys.argv[-1], None
    options = dict(cats=["id", "cat"], conts=["x"], labels=["label"], batch_size=50,
                   shuffle=True, seed=1, cache="disk", cache_dir=root)
    filler = tabloader.Loader(files, **options)
    list(filler)
    filler.cache.wait()
    loader = tabloader.Loader(files, **options)
    served = list(loader)  # from the published cache, mapped
    assert loader.stats().from_cache
    (block,) = [p for p in loader.cache.path.iterdir() if p.name == "block0.npy"]
    os.truncate(block, os.path.getsize(block) // 2)  # cut short under the mapping
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = list(loader)
    ids = sorted(int(i) for b in again for i in b["id"])
    for b in again:
        assert (b["cat"] == b["id"] % 1000).all() and (b["x"] == (b["id"] / 4.0)).all()
    print("ROWS", ids == list(range(ROWS_)), "CACHED", loader.stats().from_cache)
    print("WARNED", [str(w.message) for w in caught])
    """
).replace("ROWS_", str(ROWS))


def test_a_published_cache_cut_short_while_served_is_dropped_not_a_crash(files, tmp_path):
    """A block truncated under a loader that maps it: reading past its new end would
    kill the process with SIGBUS, so the next epoch checks the mapped files' sizes."""
    done = subprocess.run(
        [sys.executable, "-c", _CUT_WHILE_SERVED, *files, str(tmp_path / "c")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-3000:])
    assert "ROWS True CACHED False" in done.stdout
    assert "was cut short while in use (one of its files has" in done.stdout


def test_the_checksums_cover_every_segment(files, tmp_path, monkeypatch):
    import tabloader.cache.files

    monkeypatch.setattr(tabloader.cache.files, "SEGMENT_BYTES", 512)
    directory = _publish(files, tmp_path / "c")
    manifest = json.loads((directory / MANIFEST).read_text())
    entry = manifest["files"][0]
    assert manifest["segment_bytes"] == 512 and len(entry[CHECKSUM]) == -(-ROWS * 8 // 512)


def _swap_two_segments(path: Path) -> None:
    data = bytearray(path.read_bytes())
    end = len(data)
    first, second = data[end - 1024 : end - 512], data[end - 512 :]
    assert first != second
    data[end - 1024 :] = second + first
    path.write_bytes(bytes(data))


def test_segments_swapped_within_a_file_are_damage(files, tmp_path, monkeypatch):
    import tabloader.cache.files

    monkeypatch.setattr(tabloader.cache.files, "SEGMENT_BYTES", 512)
    root = tmp_path / "c"
    directory = _publish(files, root)
    _swap_two_segments(directory / "block0.npy")
    loader = tabloader.Loader(files, **COLS, batch_size=50, cache="disk", cache_dir=root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = run(loader)
    assert any("is damaged or was altered" in m for m in cache_warnings(caught))
    assert not loader.stats().from_cache and ids(batches) == list(range(ROWS))
    check_rows_intact(batches)


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=4096),
    at=st.integers(0, 4095),
    change=st.integers(1, 2**32 - 1),
)
def test_the_checksum_finds_every_change_of_up_to_32_bits_in_a_row(data, at, change):
    """The cases the cache's checksum must catch: any bits flipped within 32 in a row
    (a flipped bit, an overwritten small value), wherever they fall in a segment."""
    changed = bytearray(data + bytes(4))
    at %= len(data)
    for i, byte in enumerate(change.to_bytes(4, "little")):
        changed[at + i] ^= byte
    original = data + bytes(4)
    assert checksum(bytes(changed)) != checksum(original)


# -- security: the cache directory is private ---------------------------------------------


def _modes(root: Path) -> set[tuple[str, int]]:
    found = set()
    for path in [root, *root.rglob("*")]:
        kind = "dir" if path.is_dir() else "file"
        found.add((kind, stat.S_IMODE(os.lstat(path).st_mode)))
    return found


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277])
def test_cache_directories_are_0700_and_files_0600_whatever_the_umask(
    files, tmp_path, memory, umask
):
    old = os.umask(umask)
    try:
        root = tmp_path / "new" / "c"
        loader = tabloader.Loader(
            files, **COLS, batch_size=50, shuffle=True, seed=0, cache="disk", cache_dir=root
        )
        run(loader)
        run(loader)
        assert loader.stats().from_cache
    finally:
        os.umask(old)
    assert _modes(tmp_path / "new") == {("dir", 0o700), ("file", 0o600)}


def test_a_cache_directory_others_can_write_is_refused(files, tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o777)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = tabloader.Loader(files, **COLS, batch_size=50, cache="disk", cache_dir=root)
        epochs = [run(loader) for _ in range(2)]
    messages = cache_warnings(caught)
    assert len(messages) == 1 and "can be written by other users (mode 777)" in messages[0]
    assert "not caching" in messages[0]
    for batches in epochs:
        assert ids(batches) == list(range(ROWS))
    assert list(root.iterdir()) == []  # nothing written there


@pytest.mark.skipif(not ROOT, reason="making a file another user's needs root")
def test_a_cache_directory_of_another_user_is_refused(files, tmp_path):
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    os.chown(root, OTHER_USER, OTHER_USER)
    with pytest.warns(tabloader.CacheWarning, match=f"owned by user id {OTHER_USER}"):
        loader = tabloader.Loader(files, **COLS, batch_size=50, cache="disk", cache_dir=root)
    assert ids(run(loader)) == list(range(ROWS)) and list(root.iterdir()) == []


@pytest.mark.skipif(not ROOT, reason="making a file another user's needs root")
def test_a_cache_planted_under_the_key_by_another_user_is_never_served(files, tmp_path):
    root = tmp_path / "c"
    directory = _publish(files, root)
    planted = np.load(directory / "block2.npy")  # x, the continuous column
    planted[:] = -1.0
    np.save(directory / "block2.npy", planted)
    (directory / MANIFEST).unlink()  # a valid-looking cache another user put in place
    shutil.copytree(directory, tmp_path / "planted")
    shutil.rmtree(directory)
    shutil.copytree(tmp_path / "planted", directory)
    for path in [directory, *directory.iterdir()]:
        os.chown(path, OTHER_USER, OTHER_USER)
    loader = tabloader.Loader(files, **COLS, batch_size=50, cache="disk", cache_dir=root)
    with pytest.warns(tabloader.CacheWarning, match=f"owned by user id {OTHER_USER}") as said:
        batches = run(loader)
    assert ids(batches) == list(range(ROWS)) and not loader.stats().from_cache
    check_rows_intact(batches)
    # It stays (another user's is never deleted), so the warning says how to clear it.
    (message,) = [str(w.message) for w in said if "owned by user id" in str(w.message)]
    assert f"delete {directory} (rm -r, as its owner or root)" in message
    assert "cache_dir=" in message and directory.exists()


@pytest.mark.skipif(not ROOT, reason="running as another user needs root")
def test_another_user_can_neither_read_nor_change_a_published_cache(files, tmp_path):
    # Let the other user reach the cache directory (the test's directories are private).
    reach = [p for p in [tmp_path, *tmp_path.parents] if not os.stat(p).st_mode & 0o001]
    modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in reach}
    for path, mode in modes.items():
        os.chmod(path, mode | 0o005)
    try:
        _try_as_another_user(files, tmp_path)
    finally:
        for path, mode in modes.items():
            os.chmod(path, mode)


def _try_as_another_user(files: list[str], tmp_path: Path) -> None:
    directory = _publish(files, tmp_path / "c")
    attempt = textwrap.dedent(
        f"""
        import os, sys
        os.setgid({OTHER_USER}); os.setuid({OTHER_USER})
        for action in (lambda: open({str(directory / "block0.npy")!r}, "r+b"),
                       lambda: open({str(directory / "block0.npy")!r}, "rb"),
                       lambda: os.mkdir({str(tmp_path / "c" / "planted")!r})):
            try:
                action()
            except PermissionError:
                continue
            sys.exit("allowed")
        """
    )
    result = subprocess.run([sys.executable, "-c", attempt], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_fifo_or_a_link_in_a_cache_does_not_hang_and_is_rebuilt(files, tmp_path):
    root = tmp_path / "c"
    directory = _publish(files, root)
    (directory / "block0.npy").unlink()
    os.mkfifo(directory / "block0.npy")
    (directory / "block1.npy").unlink()
    os.symlink(tmp_path / "data" / "part-000.parquet", directory / "block1.npy")
    script = textwrap.dedent(
        """
        import sys, warnings, tabloader
        warnings.simplefilter("always")
        loader = tabloader.Loader(sys.argv[1:-1], cats=["id", "cat"], conts=["x"],
                                  labels=["label"], batch_size=50, cache="disk",
                                  cache_dir=sys.argv[-1])
        with warnings.catch_warnings(record=True) as caught:
            rows = sorted(int(i) for b in loader for i in b["id"])
        print(rows == list(range(412)), loader.stats().from_cache)
        print(" | ".join(str(w.message) for w in caught))
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, "-c", script, *files, str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "True False", result.stderr
    assert "not a regular file" in lines[1] and "damaged" in lines[1]


def test_a_manifest_entry_leaving_the_cache_is_refused(files, tmp_path):
    root = tmp_path / "c"
    directory = _publish(files, root)
    outside = tmp_path / "outside"
    outside.mkdir()
    fake = np.load(directory / "block0.npy")
    fake[:] = 0
    np.save(outside / "ids.npy", fake)
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["files"][0]["file"] = "../../outside/ids.npy"
    manifest["blocks"][0]["files"] = ["../../outside/ids.npy"]
    (directory / MANIFEST).write_text(json.dumps(manifest))
    loader = tabloader.Loader(files, **COLS, batch_size=50, cache="disk", cache_dir=root)
    with pytest.warns(tabloader.CacheWarning, match="lists other files than the cache's own"):
        batches = run(loader)
    assert ids(batches) == list(range(ROWS))
    check_rows_intact(batches)


# -- cleanup: only what this library wrote, whose writer has ended ------------------------


OWNER = "owner.json"


def _temp_dir(root: Path, record: dict[str, Any] | None, *, age: float = 0) -> Path:
    temp = root / f".tmp-{'0' * 32}-{os.getpid()}-{os.urandom(4).hex()}"
    temp.mkdir(mode=0o700)
    (temp / "block0.npy").write_bytes(b"partial")
    if record is not None:
        (temp / OWNER).write_text(json.dumps(record))
    if age:
        for path in [*temp.iterdir(), temp]:
            os.utime(path, (time.time() - age, time.time() - age))
    return temp


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_cleanup_deletes_only_temporary_directories_whose_writer_has_ended(tmp_path):
    from tabloader.cache.store import CacheStore, owner_record, writer_gone

    root = tmp_path / "c"
    store = CacheStore(root)
    assert store.prepare() is None
    mine = owner_record()
    dead = _temp_dir(root, {**mine, "pid": _dead_pid()})
    reused = _temp_dir(root, {**mine, "start_ticks": (mine["start_ticks"] or 0) + 1})
    alive = _temp_dir(root, mine)
    namespace = _temp_dir(root, {**mine, "pid_namespace": 1, "pid": _dead_pid()})
    other_boot = _temp_dir(root, {**mine, "boot_id": "another-boot", "pid": _dead_pid()})
    other_host = _temp_dir(
        root, {**mine, "host": "elsewhere", "pid": _dead_pid()}, age=3 * 24 * 3600
    )
    stale = _temp_dir(root, {**mine, "host": "elsewhere"}, age=8 * 24 * 3600)
    no_record = _temp_dir(root, None, age=2 * 3600)
    store.remove_abandoned()
    left = {p.name for p in root.iterdir()}
    assert dead.name not in left and reused.name not in left and stale.name not in left
    assert {alive.name, namespace.name, other_boot.name, other_host.name, no_record.name} <= left
    assert writer_gone({**mine, "pid_namespace": 1}) is None  # cannot tell: kept


@pytest.mark.skipif(not ROOT, reason="making a directory another user's needs root")
def test_a_killed_writers_temporary_directory_goes_when_the_published_cache_is_opened(
    files, tmp_path
):
    from tabloader.cache.store import owner_record

    root = tmp_path / "c"
    _publish(files, root)
    mine = owner_record()
    dead = _temp_dir(root, {**mine, "pid": _dead_pid()})
    alive = _temp_dir(root, mine)  # this process: a writer still at work
    loader = tabloader.Loader(files, **COLS, batch_size=50, cache="disk", cache_dir=root)
    batches = run(loader)
    assert loader.stats().from_cache and ids(batches) == list(range(ROWS))
    assert not dead.exists() and alive.exists()


def test_cleanup_never_deletes_another_users_directory(tmp_path):
    from tabloader.cache.store import CacheStore, owner_record

    root = tmp_path / "c"
    store = CacheStore(root)
    store.prepare()
    theirs = _temp_dir(root, {**owner_record(), "pid": _dead_pid()}, age=30 * 24 * 3600)
    for path in [theirs, *theirs.iterdir()]:
        os.chown(path, OTHER_USER, OTHER_USER)
    store.remove_abandoned()
    assert theirs.exists()


WRITER = """
import sys, time, tabloader
loader = tabloader.Loader(sys.argv[1:-1], cats=["id"], batch_size=8, parts_per_chunk=1,
                          cache="disk", cache_dir=sys.argv[-1])
iterator = iter(loader)
next(iterator)
print("writing", flush=True)
sys.stdin.readline()
rows = [len(b["id"]) for b in iterator]
loader.cache.wait()
print("done", sum(rows) + 8, flush=True)
"""


def _unshare_pid() -> list[str] | None:
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    for prefix in ([unshare, "--pid", "--fork"], [unshare, "-r", "--pid", "--fork"]):
        if subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
            return prefix
    return None


@pytest.mark.skipif(_unshare_pid() is None, reason="needs unshare(1) with PID namespaces")
def test_a_writer_in_another_pid_namespace_keeps_its_temporary_directory(files, tmp_path):
    from tabloader.cache.store import CacheStore, owner_record

    root = tmp_path / "c"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    prefix = _unshare_pid()
    assert prefix is not None
    writer = subprocess.Popen(
        [*prefix, sys.executable, "-c", textwrap.dedent(WRITER), *files, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert writer.stdout is not None and writer.stdin is not None
        assert writer.stdout.readline().strip() == "writing"
        (temp,) = root.glob(".tmp-*")
        record = json.loads((temp / OWNER).read_text())
        assert record["pid_namespace"] != owner_record()["pid_namespace"]
        CacheStore(root).remove_abandoned()  # what another loader does before writing
        assert temp.exists()
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.stdout.readline().split() == ["done", str(ROWS)]
    finally:
        writer.kill()
        writer.wait()
    assert len(published(root)) == 1


def test_a_temporary_directory_that_vanishes_is_a_warning(files, tmp_path, memory):
    root = tmp_path / "c"
    loader = tabloader.Loader(
        files, **COLS, batch_size=8, parts_per_chunk=1, cache="disk", cache_dir=root
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        iterator = iter(loader)
        batches = [next(iterator)]
        for temp in root.glob(".tmp-*"):
            shutil.rmtree(temp)  # as a cleanup by another loader did
        batches += list(iterator)
        loader.cache.wait()
    messages = cache_warnings(caught)
    assert len(messages) == 1 and "vanished" in messages[0]
    assert ids(batches) == list(range(ROWS))
    check_rows_intact(batches)
    later = run(loader)  # this loader keeps the rows it has
    assert ids(later) == list(range(ROWS)) and loader.stats().from_cache


# -- 7. a full disk is a warning and a streamed epoch -------------------------------------

FULL_DISK = """
import errno, os, sys, warnings
import numpy as np
import tabloader, tabloader.cache.policy
files, root, scarce, shuffle = sys.argv[1:-3], sys.argv[-3], sys.argv[-2] == "scarce", sys.argv[-1]
if scarce:  # a cache larger than a quarter of the memory: written straight into its files
    tabloader.cache.policy._available_memory = lambda: 30_000
shuffle = {"False": False, "True": True, "global": "global"}[shuffle]
warnings.simplefilter("always")
loader = tabloader.Loader(files, cats=["id", "cat"], conts=["x"], labels=["label"],
                          batch_size=8, parts_per_chunk=1, shuffle=shuffle, seed=5,
                          cache="disk", cache_dir=root)
expected = [b["id"].tolist() for b in tabloader.Loader(
    files, cats=["id", "cat"], conts=["x"], labels=["label"], batch_size=8,
    parts_per_chunk=1, shuffle=shuffle == "global" or shuffle, seed=5, cache="memory")]
with warnings.catch_warnings(record=True) as caught:
    iterator = iter(loader)
    got = [next(iterator)["id"].tolist()]
    with open(os.path.join(root, "filler"), "wb", buffering=0) as filler:  # the disk fills up
        try:
            while True:
                filler.write(b"x" * 4096)
        except OSError as error:
            assert error.errno == errno.ENOSPC
    got += [b["id"].tolist() for b in iterator]
    loader.cache.wait()
    later = [b["id"].tolist() for b in loader]
said = [str(w.message) for w in caught if issubclass(w.category, tabloader.CacheWarning)]
print(sorted(sum(got, [])) == list(range(412)), sorted(sum(later, [])) == list(range(412)))
print(got == expected if shuffle != "global" else True)
print(" | ".join(said))
print(sorted(os.listdir(root)))
"""


def _small_disk() -> list[str] | None:
    """A command prefix that runs its command with a 1 MiB tmpfs at /mnt (a mount
    namespace of its own), or None where that is not allowed."""
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return None
    for flags in (["-m"], ["-r", "-m"]):
        probe = [unshare, *flags, "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"]
        if subprocess.run(probe, capture_output=True).returncode == 0:
            return [unshare, *flags]
    return None


@pytest.mark.skipif(_small_disk() is None, reason="needs a mount namespace for a small tmpfs")
@pytest.mark.parametrize("memory_kind", ["scarce", "plenty"])
@pytest.mark.parametrize("shuffle", ["False", "True", "global"])
def test_a_disk_that_fills_up_during_the_first_epoch_is_a_warning_and_a_streamed_epoch(
    files, tmp_path, memory_kind, shuffle
):
    prefix = _small_disk()
    assert prefix is not None
    script = tmp_path / "full_disk.py"
    script.write_text(textwrap.dedent(FULL_DISK))
    command = "mount -t tmpfs -o size=1m tmpfs /mnt && exec " + " ".join(
        [sys.executable, str(script), *files, "/mnt/cache", memory_kind, shuffle]
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [*prefix, "sh", "-c", command], capture_output=True, text=True, env=env, timeout=300
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stderr[-3000:]
    assert lines[0] == "True True" and lines[1] == "True", result.stdout
    assert "No space left on device" in lines[2] and "BufferError" not in lines[2], lines[2]
    assert lines[3] == "['filler']"  # no partial cache left behind


FILE_LIMIT = """
import resource, signal, sys, warnings
import numpy as np
from pathlib import Path
from tabloader.hostmem import populated_empty
from tabloader.cache.files import write_npy
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
array = populated_empty((1 << 18, 2), "int64")  # 4 MiB, page-aligned: written directly
array[...] = 1
try:
    write_npy(Path(sys.argv[1]) / "big.npy", array)
except Exception as error:
    print(type(error).__name__, getattr(error, "errno", None))
"""


def test_a_failed_direct_write_raises_its_own_error_not_buffererror(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FILE_LIMIT), str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert result.stdout.split() == ["OSError", "27"], result.stdout + result.stderr  # EFBIG


# -- 9. bad arguments are clear errors at construction ------------------------------------


def test_a_cache_dir_that_is_a_file_is_a_clear_error(files, tmp_path):
    path = tmp_path / "a-file"
    path.write_text("")
    with pytest.raises(tabloader.InvalidArgumentError, match=r"is a file, not a directory"):
        tabloader.Loader(files, **COLS, batch_size=8, cache="disk", cache_dir=path)
    with pytest.raises(tabloader.InvalidArgumentError, match=r"cannot be used: NotADirectory"):
        tabloader.Loader(files, **COLS, batch_size=8, cache="disk", cache_dir=path / "sub")


@pytest.mark.parametrize(
    ("value", "match"),
    [(123, r"cache_dir must be a path .*got 123"), ("", "cache_dir must name a directory")],
)
def test_a_cache_dir_that_is_no_path_is_a_clear_error(files, value, match):
    for cache in ("disk", "memory", None):
        with pytest.raises(tabloader.InvalidArgumentError, match=match):
            tabloader.Loader(files, **COLS, batch_size=8, cache=cache, cache_dir=value)


READ_ONLY = """
import sys, tabloader
try:
    tabloader.Loader(sys.argv[1:-1], cats=["id"], batch_size=8, cache="disk",
                     cache_dir=sys.argv[-1])
except tabloader.InvalidArgumentError as error:
    print("InvalidArgumentError", error)
"""


def test_a_cache_dir_under_a_read_only_directory_is_a_clear_error(files, tmp_path):
    if not ROOT:  # permissions bind this user
        parent = tmp_path / "ro"
        parent.mkdir()
        parent.chmod(0o555)
        with pytest.raises(tabloader.InvalidArgumentError, match=r"cannot be used: Permission"):
            tabloader.Loader(
                files, cats=["id"], batch_size=8, cache="disk", cache_dir=parent / "cache"
            )
        return
    prefix = _small_disk()  # root writes anywhere permissions say no: a read-only mount
    if prefix is None:
        pytest.skip("needs a mount namespace for a read-only file system")
    command = "mount -t tmpfs -o ro,size=1m tmpfs /mnt && exec " + " ".join(
        [sys.executable, "-c", shlex.quote(textwrap.dedent(READ_ONLY)), *files, "/mnt/cache"]
    )
    result = subprocess.run(
        [*prefix, "sh", "-c", command],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert result.stdout.startswith("InvalidArgumentError cache_dir '/mnt/cache' cannot be used")
    assert "Read-only file system" in result.stdout, result.stderr


@pytest.mark.parametrize(
    "options",
    [
        {"cache_dir": "CACHE"},
        {"cache_max_bytes": 10**9},
        {"cache_placement": "host"},
        {"cache_dir": "CACHE", "cache_placement": "host"},
    ],
)
def test_cache_options_without_a_cache_are_a_warning(files, tmp_path, options):
    options = {k: str(tmp_path / v) if v == "CACHE" else v for k, v in options.items()}
    with pytest.warns(tabloader.CacheWarning, match="cache= is not given") as said:
        loader = tabloader.Loader(files, **COLS, batch_size=50, **options)
    assert said[0].filename == __file__  # pointed at the call
    for name, value in options.items():
        assert f"{name}={value!r}" in str(said[0].message)
    assert loader.cache is None and ids(run(loader)) == list(range(ROWS))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tabloader.Loader(files, **COLS, batch_size=50, cache="disk", **options)


def test_storage_options_for_local_files_are_refused(files):
    with pytest.raises(tabloader.InvalidArgumentError, match=r"storage_options are for URLs"):
        tabloader.Dataset(files[0], storage_options={"anon": True})
    with pytest.raises(tabloader.InvalidArgumentError, match=r"storage_options are for URLs"):
        tabloader.Dataset(pa.table({"a": [1]}), storage_options={"anon": True})


def test_a_literal_path_with_glob_characters_is_read(tmp_path):
    path = tmp_path / "a[1].parquet"
    pq.write_table(make_table(0, 10), path)
    pq.write_table(make_table(10, 5), tmp_path / "a1.parquet")  # what the glob would match
    assert tabloader.Dataset(str(path)).files == [str(path)]
    assert ids(list(tabloader.Loader(str(path), cats=["id"], batch_size=4))) == list(range(10))
    assert tabloader.Dataset(str(tmp_path / "a[0-9].parquet")).num_rows == 5  # a glob still


def test_duplicate_column_names_are_a_clear_error(tmp_path):
    table = pa.Table.from_arrays([pa.array([1, 2]), pa.array([3, 4])], names=["id", "id"])
    pq.write_table(table, tmp_path / "dup.parquet")
    with pytest.raises(tabloader.InvalidFileError, match=r"has 2 columns named 'id'"):
        tabloader.Loader(str(tmp_path / "dup.parquet"), cats=["id"], batch_size=1)


# -- also: torch dtypes on the PyTorch adapter ----------------------------------------------


@pytest.mark.torch
def test_the_torch_adapter_takes_torch_dtypes(files):
    import torch

    from tabloader.torch import TorchAsyncItr

    itr = TorchAsyncItr(
        files,
        cats=["id"],
        conts=["x"],
        labels=["label"],
        batch_size=64,
        cat_dtype=torch.int32,
        cont_dtype=torch.float64,
        label_dtype=torch.int64,
        device="cpu",
    )
    x_cat, x_cont, y = next(iter(itr))
    assert (x_cat.dtype, x_cont.dtype, y.dtype) == (torch.int32, torch.float64, torch.int64)
    empty = TorchAsyncItr(files, cats=["id"], batch_size=8, label_dtype=torch.int64, device="cpu")
    assert next(iter(empty))[2].dtype == torch.int64  # a kind without columns too
    with pytest.raises(tabloader.InvalidArgumentError, match=r"torch.bfloat16 has no numpy"):
        TorchAsyncItr(files, cats=["id"], conts=["x"], batch_size=8, cont_dtype=torch.bfloat16)
    with pytest.raises(tabloader.InvalidArgumentError, match=r"cat_dtype must be an integer dtype"):
        TorchAsyncItr(files, cats=["id"], batch_size=8, cat_dtype=torch.float32)


# -- a fill that fails midway goes on from the files, exactly ---------------------------

_streamed_data: dict[str, Any] = {}


def _stream_dataset() -> tabloader.Dataset:
    if "ds" not in _streamed_data:
        table = make_table(0, 300)
        _streamed_data["ds"] = tabloader.Dataset(table, rows_per_partition=37)
    dataset: tabloader.Dataset = _streamed_data["ds"]
    return dataset


@settings(max_examples=60, deadline=None)
@given(
    shuffle=st.booleans(),
    within=st.booleans(),
    chunk=st.integers(1, 4),
    batch_size=st.integers(1, 50),
    resumed=st.integers(0, 5),
    data=st.data(),
)
def test_the_rest_of_an_epoch_streamed_after_a_failed_fill_is_the_rest_of_its_rows(
    shuffle, within, chunk, batch_size, resumed, data
):
    from tabloader.backends.cpu import CPUBackend
    from tabloader.batches import Block, segment_rows
    from tabloader.cache.serve import stream_rest
    from tabloader.plan import plan_epoch
    from tabloader.stages import ReadRequest
    from tabloader.stats import StatsRecorder

    dataset = _stream_dataset()
    plan = plan_epoch(
        dataset.partition_rows,
        batch_size=batch_size,
        shuffle=shuffle,
        seed=3,
        epoch=1,
        parts_per_chunk=chunk,
        shuffle_within_batch=within,
    )
    plan = plan.resume(min(resumed, plan.num_batches))
    blocks = [Block("id", ("id",), np.dtype("int64"))]
    request = ReadRequest(dataset, plan, blocks, {}, StatsRecorder())

    def delivered(chunks: Any) -> list[int]:
        out: list[int] = []
        for parts in chunks:
            for segment, index in parts:
                column = np.asarray(segment["id"])[:, 0]
                out.extend((column if index is None else column[index]).tolist())
                assert index is not None or len(column) == segment_rows(segment)
        return out

    whole = delivered(CPUBackend().read_chunks(request))
    rows = data.draw(st.integers(0, len(whole)))
    assert delivered(stream_rest(CPUBackend(), request, rows)) == whole[rows:]


FULL_DISK_LISTS = """
import errno, os, sys, warnings
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
import tabloader, tabloader.cache.policy
data, root = sys.argv[1], sys.argv[2]
rows = 10_000
lists = [list(range(i % 5)) for i in range(rows)]
pq.write_table(pa.table({"id": np.arange(rows), "t": lists}), data, row_group_size=500)
tabloader.cache.policy._available_memory = lambda: 30_000  # written into its files
options = dict(cats=["id"], sparse_names=["t"], batch_size=50, parts_per_chunk=1,
               shuffle=True, seed=2)
warnings.simplefilter("always")
expected = [(b["id"].tolist(), b["t"][0].tolist()) for b in tabloader.Loader(data, **options)]
loader = tabloader.Loader(data, **options, cache="disk", cache_dir=root)
with warnings.catch_warnings(record=True) as caught:
    iterator = iter(loader)
    got = [next(iterator)]
    with open(os.path.join(root, "filler"), "wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"x" * 4096)
        except OSError as error:
            assert error.errno == errno.ENOSPC
    got += list(iterator)
    later = [b["id"].tolist() for b in loader]
got = [(b["id"].tolist(), b["t"][0].tolist()) for b in got]
said = [str(w.message) for w in caught if issubclass(w.category, tabloader.CacheWarning)]
print(got == expected, sorted(sum(later, [])) == list(range(rows)), loader.stats().from_cache)
print(" | ".join(said))
"""


@pytest.mark.skipif(_small_disk() is None, reason="needs a mount namespace for a small tmpfs")
def test_a_disk_that_fills_up_midway_streams_the_rest_of_the_epoch_exactly(tmp_path):
    prefix = _small_disk()
    assert prefix is not None
    script = tmp_path / "full_disk_lists.py"
    script.write_text(textwrap.dedent(FULL_DISK_LISTS))
    command = "mount -t tmpfs -o size=1m tmpfs /mnt && exec " + " ".join(
        [sys.executable, str(script), str(tmp_path / "lists.parquet"), "/mnt/cache"]
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [*prefix, "sh", "-c", command], capture_output=True, text=True, env=env, timeout=300
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stderr[-3000:]
    assert lines[0] == "True True False", result.stdout
    assert "writing it failed" in lines[1] and "No space left on device" in lines[1]
    assert "this epoch goes on from the files" in lines[1]


def test_any_bit_flipped_in_a_cache_files_header_is_damage_never_a_crash(tmp_path):
    from tabloader.cache.files import CacheDamaged, read_npy, write_npy

    array = np.arange(24, dtype=np.int64).reshape(12, 2)
    path = tmp_path / "block0.npy"
    write_npy(path, array)
    original = path.read_bytes()
    header = original.index(b"\n") + 1  # the magic, the length and the dictionary
    outcomes = set()
    # every bit of the magic, the length and the dictionary, and of some of the padding
    # (a flip there once kept numpy's tokenizer busy for minutes)
    for at in [*range(min(header, 160)), *range(160, header, 61)]:
        for bit in range(8):
            damaged = bytearray(original)
            damaged[at] ^= 1 << bit
            path.write_bytes(bytes(damaged))
            path.chmod(0o600)
            try:
                read = read_npy(path, array.shape, array.dtype)
            except CacheDamaged:
                outcomes.add("damaged")
                continue
            # a flip the header does not notice (its padding): the data is the array's,
            # and its checksums are what tell the rest
            np.testing.assert_array_equal(read, array)
            outcomes.add("read")
    assert "damaged" in outcomes
