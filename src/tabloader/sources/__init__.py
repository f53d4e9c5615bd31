"""Where rows come from: the storage behind a [`Dataset`][tabloader.Dataset].

`tabloader.sources.remote` reads parquet from object storage through fsspec: byte
ranges planned from the footers, a bounded number of requests in flight, retries with
backoff, one filesystem object per process.
"""
