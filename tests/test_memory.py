"""Memory is bounded by the chunk buffer: flat in the dataset's size and over epochs.

Each measurement runs in a fresh process, so that one test's memory (or another
loader's pool) does not hide another's growth.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader

MiB = 2**20
# Row groups of uneven sizes: chunks, and the rows carried between them, differ in size
# from one chunk to the next, which is what made buffers pile up.
ROW_GROUPS = [37_000, 52_000, 61_000, 45_000, 29_000, 58_000]
CATS = [f"c{i}" for i in range(12)]
# 12 int64 + 3 float32 + 1 float32 = 112 bytes a row: chunks of 100k rows hold 11 MiB,
# well above the allocator's noise.

CHILD = """
import json, sys
import pyarrow as pa
import tabloader

def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096

def peak():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmHWM"))

paths, epochs = json.loads(sys.argv[1]), int(sys.argv[2])
loader = tabloader.Loader(paths, cats=[f"c{i}" for i in range(12)], conts=["x", "y", "z"],
                          labels=["label"], batch_size=8192, shuffle=True, seed=0,
                          chunk_rows=100_000)
pool = loader.backend.xp.pool
base = rss()
after, pooled = [], []
for _ in range(epochs):
    rows = sum(len(batch["c0"]) for batch in loader)
    after.append(rss())
    pooled.append(sum(len(b[0] if isinstance(b, tuple) else b) for b in pool._buffers))
# What Arrow's allocator still held for reuse once the last epoch had ended.
held = rss()
pa.default_memory_pool().release_unused()
held -= rss()
print(json.dumps({"base": base, "peak": max(peak(), *after), "after": after, "rows": rows,
                  "pooled": pooled, "arrow_held": held, "pandas": "pandas" in sys.modules}))
"""


def _run(paths: list[str], epochs: int) -> dict[str, object]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(paths), str(epochs)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _write(directory: Path, files: int) -> list[str]:
    """``files`` files of 282k rows in row groups of uneven sizes."""
    directory.mkdir()
    ids = np.arange(sum(ROW_GROUPS), dtype=np.int64)
    columns = {name: ids * (i + 1) for i, name in enumerate(CATS)}
    columns.update({name: ids.astype(np.float32) for name in ("x", "y", "z", "label")})
    table = pa.table(columns)
    paths = []
    for f in range(files):
        path = directory / f"part-{f}.parquet"
        with pq.ParquetWriter(path, table.schema) as writer:
            offset = 0
            for rows in np.roll(ROW_GROUPS, f).tolist():
                writer.write_table(table.slice(offset, rows), row_group_size=rows)
                offset += rows
        paths.append(str(path))
    return paths


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_dataset(tmp_path):
    # The small dataset is big enough for every kind of moment a chunk boundary brings
    # (about a dozen chunks): with fewer, a run may just not meet the fullest one.
    small = _write(tmp_path / "small", 4)  # 1.1M rows, 12 chunks
    large = _write(tmp_path / "large", 12)  # 3.4M rows, 34 chunks
    measured = {name: _run(paths, epochs=2) for name, paths in (("small", small), ("large", large))}
    assert measured["large"]["rows"] == 3 * measured["small"]["rows"]
    # The buffers kept: at most prefetch + 2 = 3 chunks in flight (of at most 161k rows,
    # 18 MiB, rounded up to 20 MiB), and a quarter for timing, whatever the dataset's size.
    for name, run in measured.items():
        pooled = max(run["pooled"]) / MiB
        assert pooled <= 1.25 * 3 * 20, f"{name}: the pool kept {pooled:.0f} MiB"
    # The process as a whole. Allowance: the threads' timing decides whether two or
    # three chunks are in flight at the worst moment, and the allocators' own caches
    # (glibc's per-thread arenas, pyarrow's) jitter by a few tens of MiB.
    grown = {k: (v["peak"] - v["base"]) / MiB for k, v in measured.items()}
    assert grown["large"] <= 1.1 * grown["small"] + 48, (
        f"peak memory above the start grew from {grown['small']:.0f} MiB to "
        f"{grown['large']:.0f} MiB for 3x the rows"
    )


@pytest.mark.slow
def test_memory_stays_flat_over_epochs_in_a_fresh_process(tmp_path):
    paths = _write(tmp_path / "data", 4)
    measured = _run(paths, epochs=12)
    # The buffers kept, as above.
    pooled = [x / MiB for x in measured["pooled"]]
    assert max(pooled) <= 1.25 * 3 * 20, f"pooled MiB after each epoch: {pooled}"
    # The process as a whole: the allocators' own caches make single readings jitter,
    # so compare the last epochs with the first ones.
    after = [x / MiB for x in measured["after"]]
    early, late = np.mean(after[1:4]), np.mean(after[-3:])
    assert late <= early * 1.1 + 16, f"RSS after each epoch (MiB): {after}"


def test_arrow_memory_is_given_back_when_an_epoch_ends(tmp_path):
    # Row groups are decoded into Arrow's pool on the epoch's threads; once they had
    # ended, tens of MiB (up to two hundred at the benchmark's size) stayed with the
    # allocator, more or less from one epoch to the next.
    paths = _write(tmp_path / "data", 2)
    measured = _run(paths, epochs=2)
    held = measured["arrow_held"] / MiB
    assert held <= 8, f"Arrow's allocator still held {held:.0f} MiB after the epoch"


def test_a_slow_consumer_holds_two_shuffled_chunks_not_three(tmp_path):
    # Batches are views of their chunk. The reader lays out the next chunk only once the
    # one before the last is let go: prefetch=1 means the chunk being cut and one more.
    from tabloader.hostmem import _size_class

    paths = _write(tmp_path / "data", 1)
    loader = tabloader.Loader(
        paths, cats=CATS, conts=["x", "y", "z"], labels=["label"], batch_size=8192,
        shuffle=True, seed=0, chunk_rows=100_000, prefetch=1,
    )  # fmt: skip
    rows = []
    for batch in loader:
        time.sleep(0.002)  # the training step: the loader runs ahead and waits
        rows.append(batch["c0"].copy())  # (a view would keep the chunk)
    assert sorted(np.concatenate(rows).tolist()) == list(range(sum(ROW_GROUPS)))
    chunk = _size_class(100_000 * 112 + 64 * 16)  # the largest chunk, aligned blocks
    assert loader.backend.xp.pool.peak_lent_bytes <= 2 * chunk


def _six_chunk_loader(tmp_path: Path) -> tabloader.Loader:
    """A shuffled loader over one file whose epoch has six chunks, the rows' ids in c0."""
    paths = _write(tmp_path / "data", 1)
    return tabloader.Loader(
        paths, cats=["c0"], conts=["x"], batch_size=8192, shuffle=True, seed=0,
        chunk_rows=50_000,
    )  # fmt: skip


def test_a_consumer_that_keeps_every_batch_still_gets_them_all(tmp_path):
    # Every chunk stays held, so the reader cannot wait for one to be let go: it goes on
    # once the batcher has nothing left to cut.
    loader = _six_chunk_loader(tmp_path)
    started = time.monotonic()
    batches = list(loader)
    assert time.monotonic() - started < 30
    assert sorted(np.concatenate([b["c0"] for b in batches]).tolist()) == list(
        range(sum(ROW_GROUPS))
    )


def test_closing_an_epoch_whose_batches_are_still_held_ends_its_threads(tmp_path):
    # The reader waits for old chunks to be let go; a closed epoch's reader must not.
    loader = _six_chunk_loader(tmp_path)
    before = set(threading.enumerate())
    epoch = iter(loader)
    kept = [next(epoch) for _ in range(12)]  # views of the first chunks
    time.sleep(0.2)  # the reader is waiting for them
    started = time.monotonic()
    epoch.close()
    assert time.monotonic() - started < 5
    assert [t.name for t in threading.enumerate() if t not in before] == []
    assert len(kept) == 12


def test_reading_does_not_import_pandas(tmp_path):
    # Arrow's to_numpy imports pandas on first use: tens of MiB and a pause in the first
    # epoch, for a library the loader never uses.
    measured = _run(_write(tmp_path / "data", 1), epochs=1)
    assert measured["rows"] == sum(ROW_GROUPS)
    assert measured["pandas"] is False


def test_unshuffled_batches_are_read_only_views_of_the_decoded_data(tmp_path):
    paths = _write(tmp_path / "data", 1)
    loader = tabloader.Loader(paths, cats=["c0"], conts=["x"], batch_size=1000)
    batch = next(iter(loader))
    for array in batch.values():
        assert not array.flags.writeable and not array.flags.owndata
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 0
    assert batch["c0"].tolist() == list(range(1000))


@pytest.mark.tensorflow
def test_keras_tensors_share_aligned_batch_memory_and_keep_it_lent():
    tf = pytest.importorskip("tensorflow")
    import tabloader
    from tabloader.backends.cpu import BufferPool
    from tabloader.keras import _TENSORS, _TensorMaker

    maker = _TensorMaker(_TENSORS)
    columns = pa.table({"id": [1], "x": [1.0]})
    maker.set_columns(
        tabloader.Loader(columns, cats=["id"], conts=["x"], batch_size=1, device="cpu"),
        _TENSORS.dtypes(),
    )
    pool = BufferPool()
    ids = pool.empty((1 << 18,), "int64")
    ids[:] = 5
    frozen = np.full(1 << 18, 2.5, np.float32)
    frozen.flags.writeable = False
    features = maker({"id": ids, "x": frozen})
    ids[0] = 7  # shared, not copied
    assert int(features["id"][0]) == 7 and int(tf.reduce_sum(features["id"])) == 5 * (1 << 18) + 2
    assert float(tf.reduce_sum(features["x"])) == 2.5 * (1 << 18)  # read-only: a copy
    del ids
    gc.collect()
    assert pool.idle_bytes() == 0  # the tensor keeps the buffer lent
    del features
    gc.collect()
    assert pool.idle_bytes() == pool.pooled_bytes() > 0


@pytest.mark.torch
def test_torch_tensors_wrap_the_gathered_blocks():
    torch = pytest.importorskip("torch")
    import tabloader
    from tabloader.torch import TorchAsyncItr

    table = pa.table({"c": np.arange(1000), "d": np.arange(1000) * 2, "y": np.ones(1000)})
    itr = TorchAsyncItr(
        table, cats=["c", "d"], labels=["y"], batch_size=256, shuffle=True, seed=0, device="cpu"
    )
    loader = tabloader.Loader(
        table, cats=["c", "d"], labels=["y"], batch_size=256, shuffle=True, seed=0, layout="stacked"
    )
    for (x_cat, _, y), batch in zip(itr, loader, strict=True):
        assert x_cat.is_contiguous() and x_cat.shape == (len(y), 2)
        assert torch.equal(x_cat, torch.from_numpy(batch["cats"]))
        assert torch.equal(x_cat[:, 1], 2 * x_cat[:, 0])
