"""Object storage against local files: rows per second, with and without request latency.

Starts moto's S3-compatible server on loopback with the test suite's TCP proxy in front
(``tests/netproxy.py``, which adds ``--latency`` seconds before every request), writes
the same parquet files there and to a local directory, and times full shuffled epochs
reading ``--columns`` of 9 float64 columns: local, remote, remote with latency. Rounds
alternate the cases so that a shared machine's noise hits them alike; the best round of
each is reported.

The server and the proxy run in this process, in Python: the remote rates measure
tabloader's request pipeline against a slow server, not S3. The ratio of the delayed to
the undelayed remote read says whether prefetch hides the latency
(``max_concurrent_reads``).

Usage:
    python benchmarks/remote.py
    python benchmarks/remote.py --row-group-rows 40000 --concurrency 8 16 32
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import tabloader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from netproxy import NetProxy


def epoch_rate(dataset: tabloader.Dataset, columns: list[str]) -> float:
    loader = tabloader.Loader(dataset, conts=columns, batch_size=8192, shuffle=True, seed=1)
    started = time.perf_counter()
    rows = sum(len(b[columns[0]]) for b in loader)
    return rows / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rows-per-file", type=int, default=160_000)
    parser.add_argument("--row-group-rows", type=int, default=10_000)
    parser.add_argument("--columns", type=int, default=2, help="columns read, of 9")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per request")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    proxy = NetProxy((host, port))
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": proxy.url, "region_name": "us-east-1"},
    }
    s3 = boto3.client(
        "s3",
        endpoint_url=f"http://{host}:{port}",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    s3.create_bucket(Bucket="bench")
    local_dir = Path(tempfile.mkdtemp(prefix="tabloader-remote-bench-"))
    rng = np.random.default_rng(0)
    for f in range(args.files):
        table = pa.table({f"c{i}": rng.random(args.rows_per_file) for i in range(9)})
        sink = io.BytesIO()
        pq.write_table(table, sink, row_group_size=args.row_group_rows)
        s3.put_object(Bucket="bench", Key=f"data/part-{f}.parquet", Body=sink.getvalue())
        (local_dir / f"part-{f}.parquet").write_bytes(sink.getvalue())
    columns = [f"c{i}" for i in range(args.columns)]
    local = tabloader.Dataset(str(local_dir))
    report: dict[str, Any] = {}
    try:
        for concurrency in args.concurrency:
            remote = tabloader.Dataset(
                "s3://bench/data/", storage_options=options, max_concurrent_reads=concurrency
            )
            rates: dict[str, list[float]] = {"local": [], "remote": [], "remote+latency": []}
            for _ in range(args.rounds):
                rates["local"].append(epoch_rate(local, columns))
                proxy.latency = 0.0
                rates["remote"].append(epoch_rate(remote, columns))
                proxy.latency = args.latency
                rates["remote+latency"].append(epoch_rate(remote, columns))
                proxy.latency = 0.0
            best = {case: max(values) for case, values in rates.items()}
            ratio = best["remote+latency"] / best["remote"]
            report[str(concurrency)] = {**best, "latency_ratio": ratio}
            print(
                f"max_concurrent_reads={concurrency}: "
                + ", ".join(f"{case} {rate / 1e6:.2f}M rows/s" for case, rate in best.items())
                + f"; with {args.latency * 1000:.0f} ms per request: {ratio:.2f}x"
            )
    finally:
        proxy.close()
        server.stop()
    return report


if __name__ == "__main__":
    main()
