"""Nothing stale on object storage: an object replaced in place is read again, cached or
not, and a cache is keyed by what the store says of each object's version."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader

pytest.importorskip("boto3")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from test_remote import client, options, proxy, s3_server  # noqa: F401  (fixtures)


def _put(s3: Any, bucket: str, key: str, gen: int, start: int, rows: int) -> None:
    table = pa.table(
        {
            "id": np.arange(start, start + rows, dtype=np.int64),
            "gen": np.full(rows, gen, dtype=np.int64),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    s3.put_object(Bucket=bucket, Key=key, Body=sink.getvalue())


@pytest.mark.parametrize("cache", [None, "memory", "disk"])
def test_an_object_replaced_in_place_is_read_again(proxy, s3_server, tmp_path, cache):  # noqa: F811
    s3 = client(s3_server)
    bucket = f"replaced-{cache or 'none'}"
    s3.create_bucket(Bucket=bucket)
    for f in range(3):
        _put(s3, bucket, f"data/part-{f}.parquet", 0, f * 5000, 5000)
    dataset = tabloader.Dataset(
        f"s3://{bucket}/data/", storage_options=options(proxy), refresh=True
    )
    loader = tabloader.Loader(
        dataset, cats=["id", "gen"], batch_size=1000, cache=cache, cache_dir=tmp_path / "c"
    )
    seen = []
    for epoch in range(4):
        if epoch:
            f = epoch - 1
            _put(s3, bucket, f"data/part-{f}.parquet", epoch, f * 5000, 5000)
        batches = list(loader)
        if loader.cache is not None:
            loader.cache.wait()
        assert sorted(int(i) for b in batches for i in b["id"]) == list(range(15_000))
        seen.append({int(g) for b in batches for g in b["gen"]})
    assert seen == [{0}, {0, 1}, {0, 1, 2}, {1, 2, 3}]
    identities = dataset.file_identities()
    assert all(i["version"] and i["footer"] for i in identities)  # the ETag, and the footer
