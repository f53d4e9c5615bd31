"""Object storage: a real S3-compatible server (moto) behind a proxy that injects faults.

The proxy (:mod:`netproxy`) sits on the network path between s3fs and the server, so
latency, dropped connections and outages reach tabloader the way they reach users.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tabloader
from conftest import make_table
from netproxy import NetProxy
from tabloader.sources.parquet import file_stamps
from tabloader.sources.remote import RangeFile, merge_ranges

boto3 = pytest.importorskip("boto3")
pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

KEY = SECRET = "testing"
LAYOUT = [[3000, 2000, 1000], [2500], [1500, 1500]]  # 11_500 rows in 3 objects
TOTAL = sum(map(sum, LAYOUT))


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    """moto's S3-compatible server on a free loopback port; yields its URL."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def proxy(s3_server: str) -> Iterator[NetProxy]:
    host, port = s3_server.removeprefix("http://").split(":")
    with NetProxy((host, int(port))) as p:
        yield p


def client(endpoint: str, **credentials: str) -> Any:
    """A boto3 client talking to the server directly (setup bypasses the proxy)."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=credentials.get("key", KEY),
        aws_secret_access_key=credentials.get("secret", SECRET),
        region_name="us-east-1",
    )


def options(proxy: NetProxy, **extra: Any) -> dict[str, Any]:
    return {
        "key": KEY,
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": proxy.url, "region_name": "us-east-1"},
        **extra,
    }


def put_table(s3: Any, bucket: str, key: str, table: pa.Table, row_group_size: int) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_size)
    s3.put_object(Bucket=bucket, Key=key, Body=sink.getvalue())
    return sink.getvalue()


@pytest.fixture
def bucket(s3_server: str) -> str:
    """A fresh bucket holding ``LAYOUT`` under ``data/`` (ids 0..TOTAL-1)."""
    name = f"b-{uuid.uuid4().hex[:12]}"
    s3 = client(s3_server)
    s3.create_bucket(Bucket=name)
    start = 0
    for f, groups in enumerate(LAYOUT):
        tables = [make_table(start + sum(groups[:i]), n) for i, n in enumerate(groups)]
        start += sum(groups)
        sink = io.BytesIO()
        with pq.ParquetWriter(sink, tables[0].schema) as writer:
            for table in tables:
                writer.write_table(table, row_group_size=len(table))
        s3.put_object(Bucket=name, Key=f"data/part-{f}.parquet", Body=sink.getvalue())
    s3.put_object(Bucket=name, Key="data/_SUCCESS", Body=b"")
    return name


def identity(batch: Any) -> Any:
    return batch


# -- every row once -----------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("ranks", [1, 2])
def test_every_row_exactly_once_per_epoch(proxy, bucket, shuffle, ranks):
    ds = tabloader.Dataset(f"s3://{bucket}/data/", storage_options=options(proxy))
    assert [f.rsplit("/", 1)[1] for f in ds.files] == [f"part-{i}.parquet" for i in range(3)]
    assert ds.describe_partition(0).startswith(f"s3://{bucket}/data/part-0.parquet")
    for epoch in range(2):
        seen = []
        for rank in range(ranks):
            loader = tabloader.Loader(
                ds,
                cats=["id", "cat"],
                conts=["x"],
                batch_size=1000,
                shuffle=shuffle,
                seed=7,
                global_rank=rank,
                global_size=ranks,
                chunk_rows=2000,
            )
            loader.set_epoch(epoch)
            batches = list(loader)
            assert len(batches) == len(loader)
            for b in batches:
                np.testing.assert_array_equal(b["cat"], b["id"] % 1000)
                np.testing.assert_array_equal(b["x"], (b["id"] / 4).astype(np.float32))
            seen.append(np.concatenate([b["id"] for b in batches]))
        ids = np.concatenate(seen)
        np.testing.assert_array_equal(np.sort(ids), np.arange(TOTAL))
        if shuffle:
            assert not np.array_equal(ids, np.arange(TOTAL))


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize(("workers", "context"), [(0, None), (2, None), (2, "fork"), (2, "spawn")])
def test_torch_worker_processes_each_get_their_own_filesystem(proxy, bucket, workers, context):
    """The default start method on Linux is fork: s3fs objects cannot cross it."""
    from tabloader.torch import DLDataLoader, TorchAsyncItr

    ds = tabloader.Dataset(f"s3://{bucket}/data/", storage_options=options(proxy))
    ds.source.filesystem.ls(bucket)  # the parent's filesystem is in use before the fork
    itr = TorchAsyncItr(ds, cats=["id"], batch_size=500, shuffle=True, seed=3, device="cpu")
    extra = {} if context is None else {"multiprocessing_context": context}
    loader = DLDataLoader(itr, collate_fn=identity, num_workers=workers, **extra)
    for _ in range(2):
        batches = list(loader)
        assert len(batches) == len(loader)
        ids = np.concatenate([b[0][:, 0].numpy() for b in batches])
        np.testing.assert_array_equal(np.sort(ids), np.arange(TOTAL))


def test_a_pickled_dataset_reads_without_fetching_the_footers_again(proxy, bucket):
    import pickle

    ds = tabloader.Dataset(f"s3://{bucket}/data/", storage_options=options(proxy))
    clone = pickle.loads(pickle.dumps(ds))
    proxy.reset_counters()
    assert clone.read_partition(3, ["id"]).column("id").to_pylist()[:2] == [6000, 6001]
    assert proxy.requests == 1


# -- what goes over the network --------------------------------------------------------


@pytest.fixture
def wide(s3_server: str) -> tuple[str, int, int]:
    """One object of 9 float columns, 8 row groups: (bucket, object size, bytes of c0)."""
    name = f"w-{uuid.uuid4().hex[:12]}"
    s3 = client(s3_server)
    s3.create_bucket(Bucket=name)
    rng = np.random.default_rng(0)
    rows = 80_000
    table = pa.table({"id": np.arange(rows), **{f"c{i}": rng.random(rows) for i in range(8)}})
    body = put_table(s3, name, "wide.parquet", table, row_group_size=10_000)
    md = pq.read_metadata(pa.BufferReader(body))
    column = sum(md.row_group(g).column(1).total_compressed_size for g in range(8))
    return name, len(body), column


def test_reading_one_column_of_nine_moves_only_that_column(proxy, wide):
    name, size, column_bytes = wide
    proxy.reset_counters()
    ds = tabloader.Dataset(f"s3://{name}/wide.parquet", storage_options=options(proxy))
    footer = proxy.bytes_down
    assert footer < size / 4
    for _ in range(2):
        proxy.reset_counters()
        loader = tabloader.Loader(ds, conts=["c0"], batch_size=4096, shuffle=True, seed=1)
        assert sum(len(b["c0"]) for b in loader) == 80_000
        # Response headers cost a few hundred bytes per request.
        assert column_bytes <= proxy.bytes_down <= 1.5 * column_bytes + 1000 * proxy.requests
        assert proxy.bytes_down < size / 4
        assert proxy.requests == 8  # one coalesced range per row group, each fetched once


def test_columns_whose_names_hold_a_dot_are_read_from_object_storage(proxy, s3_server):
    # A leaf's dotted path cannot tell a name holding a "." from a nested field: the
    # chunks of "price.usd" were never fetched, and the decoder read zeros.
    name = f"d-{uuid.uuid4().hex[:12]}"
    s3 = client(s3_server)
    s3.create_bucket(Bucket=name)
    rows = 1_000
    table = pa.table(
        {
            "price": pa.array([{"usd": float(i), "eur": 0.5} for i in range(rows)]),
            "price.usd": np.arange(rows, dtype=np.float64) * 2,
            "tags": pa.array([[i, i + 1] for i in range(rows)]),
            "id": np.arange(rows),
        }
    )
    put_table(s3, name, "dotted.parquet", table, row_group_size=250)
    ds = tabloader.Dataset(f"s3://{name}/dotted.parquet", storage_options=options(proxy))
    loader = tabloader.Loader(ds, cats=["id"], conts=["price.usd"], batch_size=100)
    got = {i: x for b in loader for i, x in zip(b["id"], b["price.usd"], strict=True)}
    assert got == {i: np.float32(2 * i) for i in range(rows)}


def test_open_row_groups_fetches_the_footer_and_the_chunks_asked_for(proxy, wide, s3_server):
    name, size, _ = wide
    body = client(s3_server).get_object(Bucket=name, Key="wide.parquet")["Body"].read()
    expected = pq.read_table(pa.BufferReader(body), columns=["c0", "c1"]).slice(20_000, 20_000)
    ds = tabloader.Dataset(f"s3://{name}/wide.parquet", storage_options=options(proxy))
    proxy.reset_counters()
    with ds.open_row_groups(0, [2, 3], ["c0", "c1"]) as handle:
        # One range per row group (c0 and c1 are adjacent, coalesced), and the footer.
        assert proxy.requests == 3
        assert handle.seek(0, io.SEEK_END) == size
        handle.seek(0)
        table = pq.ParquetFile(handle).read_row_groups([2, 3], columns=["c0", "c1"])
    assert table.equals(expected)
    assert proxy.requests == 3  # decoding fetched nothing more


@pytest.mark.slow
def test_prefetch_keeps_requests_in_flight_to_hide_latency(proxy, s3_server):
    """With 50 ms added to every request, reads overlap up to the configured bound.

    The speed itself (latency against no latency, same run) is measured by
    ``benchmarks/remote.py``, not here: this checks the mechanism that hides the
    latency, several requests in flight at once and never more than allowed.
    """
    name = f"l-{uuid.uuid4().hex[:12]}"
    s3 = client(s3_server)
    s3.create_bucket(Bucket=name)
    rng = np.random.default_rng(1)
    for f in range(4):
        table = pa.table({"c0": rng.random(80_000), "c1": rng.random(80_000)})
        put_table(s3, name, f"p/part-{f}.parquet", table, row_group_size=10_000)
    for bound in (4, 12):
        ds = tabloader.Dataset(
            f"s3://{name}/p/", storage_options=options(proxy), max_concurrent_reads=bound
        )
        proxy.latency = 0.05
        proxy.reset_counters()
        loader = tabloader.Loader(ds, conts=["c0"], batch_size=8192, shuffle=True, seed=1)
        assert sum(len(b["c0"]) for b in loader) == 320_000
        assert proxy.requests == 32  # one range per row group
        # One request at a time would add 32 x 50 ms; the fetch pool keeps the bound busy
        # (at least half of it at some moment, even on a busy machine).
        assert bound // 2 <= proxy.max_in_flight <= bound, (bound, proxy.max_in_flight)
    proxy.latency = 0.0


def test_a_refreshing_table_checks_its_objects_concurrently(proxy, s3_server):
    """Each epoch of a refreshing table asks for every object's metadata (has it
    changed?): up to max_concurrent_reads at a time, not one after another."""
    name = f"h-{uuid.uuid4().hex[:12]}"
    s3 = client(s3_server)
    s3.create_bucket(Bucket=name)
    for f in range(24):
        put_table(s3, name, f"p/part-{f:02d}.parquet", make_table(f * 10, 10), 10)
    ds = tabloader.Dataset(
        f"s3://{name}/p/", storage_options=options(proxy), max_concurrent_reads=8
    )
    remote = ds.source.remote
    remote.filesystem.invalidate_cache()  # asked of the store, as a table's files are
    proxy.latency = 0.05
    proxy.reset_counters()
    try:
        stamps = file_stamps(ds.files, remote)
    finally:
        proxy.latency = 0.0
    assert None not in stamps and len(set(stamps)) == 24
    assert proxy.requests >= 24 and 2 <= proxy.max_in_flight <= 8, proxy.max_in_flight


# -- failures --------------------------------------------------------------------------


def test_an_outage_shorter_than_the_retry_budget_is_survived(proxy, bucket):
    ds = tabloader.Dataset(
        f"s3://{bucket}/data/",
        storage_options=options(proxy),
        retry_seconds=30,
        request_timeout=2,
        max_concurrent_reads=1,
    )
    loader = tabloader.Loader(
        ds, cats=["id"], batch_size=500, shuffle=True, seed=2, parts_per_chunk=1
    )
    batches = iter(loader)
    ids = [next(batches)["id"]]
    proxy.outage()
    before = proxy.requests
    threading.Timer(3.0, proxy.restore).start()
    started = time.monotonic()
    ids.extend(b["id"] for b in batches)
    assert time.monotonic() - started >= 2.0  # the outage was felt...
    assert proxy.requests > before  # ...and requests went through after it
    np.testing.assert_array_equal(np.sort(np.concatenate(ids)), np.arange(TOTAL))


def test_dropped_connections_and_throttling_are_retried(proxy, bucket):
    ds = tabloader.Dataset(
        f"s3://{bucket}/data/", storage_options=options(proxy), retry_seconds=30, request_timeout=5
    )
    loader = tabloader.Loader(ds, cats=["id"], batch_size=500, shuffle=True, seed=5)
    stop = threading.Event()

    def cut_connections() -> None:
        while not stop.wait(0.05):
            proxy.drop_connections()

    cutter = threading.Thread(target=cut_connections)
    cutter.start()
    try:
        proxy.throttle(20)
        ids = np.concatenate([b["id"] for b in loader])
    finally:
        stop.set()
        cutter.join()
    assert proxy.throttled == 20
    np.testing.assert_array_equal(np.sort(ids), np.arange(TOTAL))


def test_a_lasting_outage_fails_within_the_budget_naming_object_and_range(proxy, bucket):
    ds = tabloader.Dataset(
        f"s3://{bucket}/data/",
        storage_options=options(proxy),
        retry_seconds=3,
        request_timeout=1,
    )
    loader = tabloader.Loader(ds, cats=["id"], batch_size=500)
    proxy.outage()
    started = time.monotonic()
    with pytest.raises(tabloader.ReadError) as info:
        list(loader)
    elapsed = time.monotonic() - started
    assert elapsed < 3 + 2 * 1 + 2  # the budget, one attempt's timeout, sync's 1 s ticks
    message = str(info.value)
    assert f"s3://{bucket}/data/part-0.parquet" in message
    assert "bytes " in message and "attempt(s) failed" in message
    assert "retry_seconds" in message and "network" in message
    assert "corrupt" not in message


def test_a_lasting_outage_is_not_a_deleted_file_even_when_deleted_files_are_skipped(proxy, bucket):
    objects = [f"s3://{bucket}/data/part-{f}.parquet" for f in range(len(LAYOUT))]
    ds = tabloader.Dataset(
        objects, storage_options=options(proxy), retry_seconds=2, request_timeout=1,
        on_missing="skip", max_concurrent_reads=1,
    )  # fmt: skip
    loader = tabloader.Loader(ds, cats=["id"], batch_size=50, parts_per_chunk=1, prefetch=1)
    batches = iter(loader)
    next(batches)
    proxy.outage()  # for good: the objects' metadata cannot be read either
    with pytest.raises(tabloader.ReadError, match="network"):
        list(batches)
    assert ds.rows_skipped == 0  # nothing replaced by repeats: the epoch failed


def test_an_object_deleted_mid_epoch_is_skipped_when_asked(proxy, bucket, s3_server):
    """The deletion is seen, though the listing that found the object is cached."""
    ds = tabloader.Dataset(
        f"s3://{bucket}/data/", storage_options=options(proxy), on_missing="skip",
        max_concurrent_reads=1,
    )  # fmt: skip
    loader = tabloader.Loader(ds, cats=["id"], batch_size=50, parts_per_chunk=1, prefetch=1)
    batches = iter(loader)
    first = [next(batches)]
    last = ds.files[-1].rsplit("/", 1)[-1]
    client(s3_server).delete_object(Bucket=bucket, Key=f"data/{last}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rest = list(batches)
    assert ds.rows_skipped > 0 and len(first) + len(rest) == len(loader)
    assert any("was deleted or changed during the epoch" in str(w.message) for w in caught)


def test_an_object_rewritten_shorter_mid_epoch_is_said_at_once_not_retried(
    proxy, bucket, s3_server
):
    ds = tabloader.Dataset(
        f"s3://{bucket}/data/", storage_options=options(proxy), retry_seconds=30,
        max_concurrent_reads=1,
    )  # fmt: skip
    loader = tabloader.Loader(ds, cats=["id"], batch_size=50, parts_per_chunk=1, prefetch=1)
    batches = iter(loader)
    next(batches)
    last = ds.files[-1].rsplit("/", 1)[-1]
    # shorter than where its first row group starts: the store refuses the range (416)
    client(s3_server).put_object(Bucket=bucket, Key=f"data/{last}", Body=b"PAR")
    started = time.monotonic()
    with pytest.raises(tabloader.ReadError, match="deleted or rewritten since the dataset"):
        list(batches)
    assert time.monotonic() - started < 15  # not the 30 s of retries a network failure gets


def test_a_glob_skips_what_writers_keep_to_themselves_on_object_storage(proxy, bucket, s3_server):
    s3 = client(s3_server)
    put_table(s3, bucket, "data/_temporary/0/task_1/part-9.parquet", make_table(0, 10), 10)
    put_table(s3, bucket, "data/.spark-staging-1/part-8.parquet", make_table(0, 10), 10)
    found = tabloader.Dataset(f"s3://{bucket}/data/**/*.parquet", storage_options=options(proxy))
    assert (
        found.num_rows == TOTAL
        and found.files
        == tabloader.Dataset(f"s3://{bucket}/data/", storage_options=options(proxy)).files
    )


def test_an_outage_at_construction_fails_within_the_budget(proxy, bucket):
    proxy.outage()
    started = time.monotonic()
    with pytest.raises(tabloader.ReadError, match="network or storage service failure") as info:
        tabloader.Dataset(
            f"s3://{bucket}/data/",
            storage_options=options(proxy),
            retry_seconds=2,
            request_timeout=1,
        )
    assert time.monotonic() - started < 2 + 2 * 1 + 2
    assert f"the listing of s3://{bucket}/data/" in str(info.value)


def test_a_refreshing_dataset_sees_new_objects_at_the_next_epoch(proxy, bucket, s3_server):
    ds = tabloader.Dataset(f"s3://{bucket}/data/", storage_options=options(proxy), refresh=True)
    loader = tabloader.Loader(ds, cats=["id"], batch_size=1000)
    assert len(np.concatenate([b["id"] for b in loader])) == TOTAL
    put_table(client(s3_server), bucket, "data/part-9.parquet", make_table(TOTAL, 500), 500)
    ids = np.concatenate([b["id"] for b in loader])
    np.testing.assert_array_equal(np.sort(ids), np.arange(TOTAL + 500))


def test_corrupt_data_is_still_reported_as_corrupt(proxy, s3_server):
    name = f"c-{uuid.uuid4().hex[:12]}"
    s3 = client(s3_server)
    s3.create_bucket(Bucket=name)
    body = bytearray(put_table(s3, name, "bad.parquet", make_table(0, 5000), 5000))
    md = pq.read_metadata(pa.BufferReader(bytes(body)))
    chunk = md.row_group(0).column(0)
    start = chunk.data_page_offset
    body[start : start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    s3.put_object(Bucket=name, Key="bad.parquet", Body=bytes(body))
    ds = tabloader.Dataset(f"s3://{name}/bad.parquet", storage_options=options(proxy))
    with pytest.raises(tabloader.ReadError, match="truncated or corrupt") as info:
        list(tabloader.Loader(ds, cats=["id"], batch_size=100))
    assert f"s3://{name}/bad.parquet (row group 0)" in str(info.value)


def test_a_missing_bucket_is_a_clear_error_at_construction(proxy):
    with pytest.raises(tabloader.SourceNotFoundError, match="check the bucket name") as info:
        tabloader.Dataset("s3://no-such-bucket/data/", storage_options=options(proxy))
    assert "s3://no-such-bucket/data/" in str(info.value)


def test_a_missing_object_is_a_clear_error_at_construction(proxy, bucket):
    with pytest.raises(tabloader.SourceNotFoundError, match="does not exist"):
        tabloader.Dataset(f"s3://{bucket}/data/nope.parquet", storage_options=options(proxy))


@pytest.fixture
def auth_enforced(s3_server: str) -> Iterator[dict[str, str]]:
    """Make the server check credentials; yields a valid key pair allowed to read S3."""
    import urllib.request

    iam = boto3.client(
        "iam",
        endpoint_url=s3_server,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    user = f"u{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    allow_s3 = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
    }
    iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps(allow_s3))
    created = iam.create_access_key(UserName=user)["AccessKey"]

    def set_auth(count: str) -> None:
        request = urllib.request.Request(
            f"{s3_server}/moto-api/reset-auth",
            data=count.encode(),
            method="POST",
            headers={"Content-Type": "text/plain"},  # a form body would be parsed away
        )
        urllib.request.urlopen(request).read()

    set_auth("0")
    try:
        yield {"key": created["AccessKeyId"], "secret": created["SecretAccessKey"]}
    finally:
        set_auth("inf")


def test_wrong_credentials_are_a_clear_error_at_construction(proxy, bucket, auth_enforced):
    good = options(proxy, **auth_enforced)
    assert len(tabloader.Dataset(f"s3://{bucket}/data/", storage_options=good)) == TOTAL
    wrong = options(proxy, key=auth_enforced["key"], secret="not-the-secret")
    started = time.monotonic()
    with pytest.raises(tabloader.ReadError, match="denied") as info:
        tabloader.Dataset(f"s3://{bucket}/data/", storage_options=wrong)
    assert time.monotonic() - started < 10  # not retried for the whole budget
    assert "check the credentials" in str(info.value)
    assert f"s3://{bucket}/data/" in str(info.value)


def test_missing_credentials_are_a_clear_error_at_once(proxy, bucket, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    no_keys = {"client_kwargs": {"endpoint_url": proxy.url, "region_name": "us-east-1"}}
    started = time.monotonic()
    with pytest.raises(tabloader.ReadError, match="NoCredentialsError") as info:
        tabloader.Dataset(f"s3://{bucket}/data/", storage_options=no_keys)
    assert time.monotonic() - started < 10
    assert "Give the credentials in storage_options" in str(info.value)


def test_a_storage_option_the_filesystem_rejects_is_named(proxy, bucket):
    with pytest.raises(tabloader.InvalidArgumentError, match="'retries'") as info:
        tabloader.Dataset(f"s3://{bucket}/data/", storage_options=options(proxy, retries=3))
    assert "retry_seconds" in str(info.value)
    with pytest.raises(tabloader.InvalidArgumentError, match="'colour'"):
        tabloader.Dataset(f"s3://{bucket}/data/", storage_options=options(proxy, colour="red"))


@pytest.mark.parametrize("plaintext_footer", [True, False])
def test_an_encrypted_object_is_refused_from_its_footer(proxy, s3_server, plaintext_footer):
    encryption = pytest.importorskip("pyarrow.parquet.encryption")
    name = f"b-{uuid.uuid4().hex[:12]}"
    s3 = client(s3_server)
    s3.create_bucket(Bucket=name)
    table = make_table(0, 100)
    properties = encryption.create_encryption_properties(
        b"0123456789abcdef", plaintext_footer=plaintext_footer
    )
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, table.schema, encryption_properties=properties) as writer:
        writer.write_table(table)
    s3.put_object(Bucket=name, Key="data/enc.parquet", Body=sink.getvalue())
    with pytest.raises(tabloader.InvalidFileError) as info:
        tabloader.Dataset(f"s3://{name}/data/", storage_options=options(proxy))
    shown = f"s3://{name}/data/enc.parquet is an encrypted parquet file"
    assert str(info.value).startswith(shown)
    expected = "id, cat, x, label are encrypted" if plaintext_footer else "it ends with PARE"
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("max_concurrent_reads", 0, "max_concurrent_reads must be a positive integer"),
        ("retry_seconds", -1, "retry_seconds must be a number of seconds >= 0"),
        ("request_timeout", 0, "request_timeout must be a positive number"),
        ("storage_options", ["key"], "storage_options must be a dict"),
    ],
)
def test_remote_options_are_checked(option, value, message):
    with pytest.raises(tabloader.InvalidArgumentError, match=message):
        tabloader.Dataset("s3://bucket/data/", **{option: value})


# -- byte ranges -----------------------------------------------------------------------


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 100)), max_size=20), st.integers(0, 50)
)
def test_merged_ranges_cover_exactly_the_inputs_and_the_small_gaps(spans, gap):
    ranges = [(a, a + n) for a, n in spans]
    merged = merge_ranges(ranges, gap=gap)
    covered = {b for a, z in ranges for b in range(a, z)}
    fetched = {b for a, z in merged for b in range(a, z)}
    assert covered <= fetched
    assert all(z - a > 0 for a, z in merged)
    for (_, z0), (a1, _) in itertools.pairwise(merged):
        assert a1 - z0 > gap  # anything closer was merged
    # Every byte fetched beyond the inputs lies in a gap no wider than ``gap``.
    assert len(fetched - covered) <= gap * max(len(ranges) - 1, 0)


def test_a_range_file_reads_the_fetched_bytes_and_zeros_between():
    data = bytes(range(20))
    handle = RangeFile(20, [(15, data[15:]), (0, data[:5])])
    assert handle.read(7) == data[:5] + b"\0\0"
    handle.seek(14)
    assert handle.read() == b"\0" + data[15:]
    assert handle.read() == b""
    assert handle.seek(-3, io.SEEK_END) == 17


@pytest.mark.slow
def test_the_remote_benchmark_reports_every_case(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import remote as bench

    report = bench.main(
        ["--files", "2", "--rows-per-file", "20000", "--rounds", "1", "--latency", "0.01"]
    )
    assert set(report["16"]) == {"local", "remote", "remote+latency", "latency_ratio"}
    assert all(rate > 0 for rate in report["16"].values())


def test_a_file_over_plain_http_is_read_even_from_a_server_ignoring_ranges(tmp_path):
    import functools
    import http.server

    pytest.importorskip("aiohttp")
    pq.write_table(make_table(0, 100), tmp_path / "x.parquet", row_group_size=30)

    class Quiet(http.server.SimpleHTTPRequestHandler):  # answers Range with the whole file
        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path))
    )
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/x.parquet"
        ds = tabloader.Dataset(url)
        assert ds.describe_partition(1) == f"{url} (row group 1)"
        ids = np.concatenate([b["id"] for b in tabloader.Loader(ds, cats=["id"], batch_size=7)])
        np.testing.assert_array_equal(ids, np.arange(100))
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


@pytest.mark.gpu
def test_the_gpu_backend_fetches_only_the_column_chunks_it_reads(proxy, wide):
    import cupy

    name, size, column_bytes = wide
    ds = tabloader.Dataset(f"s3://{name}/wide.parquet", storage_options=options(proxy))
    proxy.reset_counters()
    loader = tabloader.Loader(
        ds, conts=["c0"], cats=["id"], batch_size=4096, shuffle=True, seed=1, device="cuda"
    )
    ids = [cupy.asnumpy(batch["id"]) for batch in loader]
    np.testing.assert_array_equal(np.sort(np.concatenate(ids)), np.arange(80_000))
    id_bytes = column_bytes  # id is int64 and c0 float64: about the same size
    assert proxy.bytes_down <= 1.5 * (column_bytes + id_bytes) + 2000 * proxy.requests
    assert proxy.bytes_down < size / 2  # never the whole object
