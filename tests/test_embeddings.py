"""The ids an id column spans and the embedding tables for them: from the footers, from
the data where the footers say nothing, on the CPU and on the GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tabloader
from tabloader.embeddings import embedding_dim, id_ranges


def write(path: Path, table: pa.Table, **kwargs) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **kwargs)
    return str(path)


@pytest.fixture
def ids_dir(tmp_path):
    """Two files of ids: ``user`` 0..99 (nulls in the second file), ``item`` 5..49, ``tags``
    lists of ids up to 300; row groups of 25 rows."""
    rng = np.random.default_rng(0)
    users = rng.permutation(100)
    items = np.concatenate([[5, 49], rng.integers(5, 50, 98)])
    tags = [[int(t) for t in rng.integers(0, 300, k)] for k in rng.integers(0, 4, 100)]
    tags[7] = [300]
    for k in range(2):
        rows = slice(k * 50, k * 50 + 50)
        user = pa.array(users[rows], pa.int32() if k else pa.int64())
        if k:
            user = pa.array(
                [None if i % 10 == 0 else int(u) for i, u in enumerate(users[rows])], pa.int32()
            )
        table = pa.table(
            {
                "user": user,
                "item": pa.array(items[rows], pa.int16()),
                "tags": pa.array(tags[rows], pa.list_(pa.int64())),
                "x": rng.random(50),
            }
        )
        write(tmp_path / f"part-{k}.parquet", table, row_group_size=25)
    return tmp_path, users, items, tags


def expected(users, items, tags):
    users = [int(u) for i, u in enumerate(users) if not (i >= 50 and (i - 50) % 10 == 0)]
    return {"user": max(users) + 1, "item": int(items.max()) + 1, "tags": 301}


def test_cardinalities_come_from_the_footers(ids_dir):
    root, users, items, tags = ids_dir
    ds = tabloader.Dataset(str(root))
    assert ds.cardinalities(["user", "item", "tags"]) == expected(users, items, tags)
    ranges = id_ranges(ds, ["user", "item"])
    assert ranges["item"].min == 5 and ranges["item"].max == 49
    assert ranges["user"].from_footers and ranges["user"].partitions == 4
    assert ds.cardinalities("item") == {"item": 50}


def test_row_groups_without_statistics_are_read_and_said_so(ids_dir, tmp_path):
    root, users, items, tags = ids_dir
    bare = tmp_path / "bare"
    for path in sorted(root.glob("*.parquet")):
        table = pq.read_table(path)
        # the second file keeps statistics for item only
        stats = ["item"] if path.name.endswith("1.parquet") else False
        write(bare / path.name, table, row_group_size=25, write_statistics=stats)
    ds = tabloader.Dataset(str(bare))
    assert ds.cardinalities(["user", "item", "tags"]) == expected(users, items, tags)
    ranges = id_ranges(ds, ["user", "item"])
    assert ranges["user"].partitions_read == 4 and not ranges["user"].from_footers
    assert ranges["item"].partitions_read == 2


def test_embedding_sizes_follow_the_rule_within_bounds(ids_dir):
    root, users, items, tags = ids_dir
    ds = tabloader.Dataset(str(root))
    sizes = ds.embedding_sizes(["user", "tags"])
    want = expected(users, items, tags)
    assert sizes == {
        "user": (want["user"], embedding_dim(want["user"])),
        "tags": (301, round(1.6 * 301**0.56)),
    }
    assert sizes["user"][1] == 21  # round(1.6 * 100 ** 0.56)
    assert ds.embedding_sizes("item") == {"item": (50, 16)}  # 14 below the lower bound
    assert ds.embedding_sizes("tags", min_dim=4, max_dim=8) == {"tags": (301, 8)}
    with pytest.raises(tabloader.InvalidArgumentError, match="max_dim must be an integer >= 4"):
        ds.embedding_sizes("tags", min_dim=4, max_dim=2)


@given(st.integers(1, 10**9))
def test_the_embedding_width_is_monotone_and_bounded(n):
    assert 16 <= embedding_dim(n) <= 512
    assert embedding_dim(n) <= embedding_dim(n + 1)


def test_ids_of_in_memory_tables_are_read():
    table = pa.table({"user": pa.array([4, None, 2], pa.int64()), "none": pa.nulls(3, pa.int8())})
    ds = tabloader.Dataset(table, rows_per_partition=2)
    ranges = id_ranges(ds, ["user", "none"])
    assert (ranges["user"].min, ranges["user"].max, ranges["user"].partitions_read) == (2, 4, 2)
    assert ranges["none"].max is None and ranges["none"].cardinality == 1


def test_columns_that_are_not_ids_are_refused(tmp_path):
    ds = tabloader.Dataset(pa.table({"x": [0.5], "name": ["a"], "neg": [-3], "C1": [1]}))
    with pytest.raises(tabloader.ColumnTypeError, match="column 'x' is double; embedding sizes"):
        ds.cardinalities(["x"])
    with pytest.raises(tabloader.ColumnTypeError, match="column 'name' is string"):
        ds.embedding_sizes(["name"])
    with pytest.raises(tabloader.InvalidArgumentError, match=r"negative ids \(as low as -3, in"):
        ds.cardinalities(["neg"])
    with pytest.raises(tabloader.ColumnNotFoundError, match=r"did you mean 'C1'\?"):
        ds.cardinalities(["c1"])


@pytest.mark.gpu
def test_cardinalities_on_the_gpu_read_with_cudf_and_cupy(ids_dir, tmp_path):
    root, users, items, tags = ids_dir
    bare = tmp_path / "bare"
    for path in sorted(root.glob("*.parquet")):
        write(bare / path.name, pq.read_table(path), row_group_size=25, write_statistics=False)
    want = expected(users, items, tags)
    for source in (root, bare):
        ds = tabloader.Dataset(str(source))
        assert ds.cardinalities(["user", "item", "tags"], device="cuda") == want
    ranges = id_ranges(tabloader.Dataset(str(bare)), ["user", "tags"], device="cuda")
    assert ranges["user"].partitions_read == 4 and ranges["user"].min == int(
        min(u for i, u in enumerate(users) if not (i >= 50 and (i - 50) % 10 == 0))
    )
    assert ranges["tags"].partitions_read == 4 and ranges["tags"].max == 300


def test_embedding_sizes_warn_above_the_budget_with_the_distinct_ids(tmp_path):
    from tabloader.convert import convert

    ds = tabloader.Dataset(pa.table({"user": [3, 5_279_479] * 5, "item": [1, 2] * 5}))
    with pytest.warns(tabloader.EmbeddingSizeWarning) as caught:
        sizes = ds.embedding_sizes(["user", "item"])
    assert sizes == {"user": (5_279_480, 512), "item": (3, 16)}
    assert len(caught) == 1  # the small table is fine
    message = str(caught[0].message)
    assert "'user' has 5,279,480 rows x 512 = 10.1 GiB of float32 weights" in message
    assert "only 2 are used" in message and "--categorify user (4 rows)" in message
    with pytest.warns(tabloader.EmbeddingSizeWarning, match="--hash item=BUCKETS"):
        ds.embedding_sizes(["item"], budget_bytes=100)  # 3 ids, 3 distinct: dense, but large
    src = tmp_path / "clicks.csv"
    src.write_text("user\n" + "".join(f"{u}\n" for u in [3, 5_279_479, 7, 7]))
    convert(str(src), tmp_path / "data", categorify="user")
    encoded = tabloader.Dataset(str(tmp_path / "data"))
    # rows from the vocabulary: 3 values, unknown values and nulls
    assert encoded.embedding_sizes("user", vocabulary=tmp_path / "data") == {"user": (5, 16)}
    with pytest.warns(tabloader.EmbeddingSizeWarning, match="--min-count N"):
        encoded.embedding_sizes("user", vocabulary=tmp_path / "data", budget_bytes=10)
