"""What the Delta and Iceberg tests share: rows whose columns derive from their id, the
loader and epoch helpers, and the scenarios every table format must pass, run on a
`TableUnderTest` of each format (``test_delta.py``, ``test_iceberg.py``):

- a table that grows, is overwritten and loses rows under ``refresh=True``;
- two ranks that must load the version rank 0 saw, while rank 1 commits another.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

import tabloader


class TableUnderTest(Protocol):
    """A table of one format, as the shared scenarios write and read it. It travels to
    the ranks' processes, so it holds where the table is, never an open connection."""

    def create(self, table: pa.Table) -> None:
        """Create the table with ``table``'s rows (partitioned by day, if the test says)."""

    def append(self, table: pa.Table) -> None: ...

    def overwrite(self, table: pa.Table) -> None: ...

    def delete(self, predicate: str) -> None: ...

    def dataset(self, **options: Any) -> tabloader.Dataset:
        """The table as a dataset (``refresh=True`` and so on)."""

    def version(self) -> int:
        """The current version (Delta) or snapshot id (Iceberg)."""

    def truth(self, version: int | None = None) -> np.ndarray:
        """The ids the format's own reader finds (at ``version``), sorted."""


def rows(start: int, n: int, *, days: int = 3) -> pa.Table:
    """Ids start..start+n-1; ``day`` (int32) and ``x`` are functions of the id, so a row
    torn apart would show."""
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "day": (ids % days).astype(np.int32),
            "x": ids.astype(np.float64) / 4.0,
        }
    )


def host(array: Any) -> np.ndarray:
    return array.get() if hasattr(array, "get") else np.asarray(array)


def epoch(loader: tabloader.Loader, column: str = "id") -> np.ndarray:
    return np.concatenate([host(b[column]) for b in loader])


def loader(ds: tabloader.Dataset, device: str, **options: Any) -> tabloader.Loader:
    defaults: dict[str, Any] = {"cats": ["id"], "batch_size": 32, "shuffle": True, "seed": 7}
    return tabloader.Loader(ds, device=device, **{**defaults, **options})


def check_refresh_follows_appends_overwrites_and_deletes(
    table: TableUnderTest, device: str
) -> tuple[tabloader.Dataset, tabloader.Loader]:
    """A ``refresh=True`` loader sees every commit at its next epoch; returns the dataset
    and the loader, for what a format does besides."""
    table.create(rows(0, 100))
    ds = table.dataset(refresh=True)
    load = loader(ds, device)
    np.testing.assert_array_equal(np.sort(epoch(load)), table.truth())
    np.testing.assert_array_equal(table.truth(), np.arange(100))

    table.append(rows(100, 60))  # another writer commits; the dataset reads the log again
    load.refresh(1)  # len() of the next epoch, before it starts
    assert len(load) == -(-160 // 32) and ds.version == table.version()
    np.testing.assert_array_equal(np.sort(epoch(load)), np.arange(160))

    table.overwrite(rows(500, 40))
    np.testing.assert_array_equal(np.sort(epoch(load)), np.arange(500, 540))

    table.delete("id >= 520")
    np.testing.assert_array_equal(np.sort(epoch(load)), np.arange(500, 520))
    np.testing.assert_array_equal(table.truth(), np.arange(500, 520))
    return ds, load


def _rank_versions(rank: int, table: TableUnderTest) -> list[Any]:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        ds = table.dataset(refresh=True)
        load = tabloader.Loader(
            ds, cats=["id"], batch_size=16, shuffle=True, seed=3, global_rank=rank, global_size=2
        )
        seen = []
        for e in range(2):
            dist.barrier()
            if rank == 1:
                # Rank 0 loads the latest version at once; this rank commits another one
                # before it asks: it must still load rank 0's.
                time.sleep(1.0)
                table.append(rows(1000 * (e + 1), 40))
            ids = epoch(load)
            seen.append((ds.version, len(load), ids.tolist()))
        return seen
    finally:
        dist.destroy_process_group()


def check_every_rank_loads_rank_zeros_version(table: TableUnderTest) -> list[int]:
    """Two ranks (real gloo processes) load the same version each epoch, rank 1's own
    commits notwithstanding: the same number of batches, no row twice, every row of the
    version. Returns the version of each epoch."""
    from test_torch_distributed import _run_ranks

    table.create(rows(0, 100))
    ranks = _run_ranks(_rank_versions, table)
    for e in range(2):
        (v0, n0, ids0), (v1, n1, ids1) = ranks[0][e], ranks[1][e]
        assert v0 == v1 and n0 == n1
        assert not set(ids0) & set(ids1)
        np.testing.assert_array_equal(np.sort(ids0 + ids1), table.truth(v0))
    versions = [version for version, _, _ in ranks[0]]
    assert versions[1] != versions[0]  # the second epoch saw the first commit
    return versions
