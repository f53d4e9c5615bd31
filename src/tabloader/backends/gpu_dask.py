"""Dask partitions computed on the loader's GPU.

A ``dask_cudf`` partition is a cudf DataFrame made by the task that computes it, on the
current CUDA device of the thread the task runs in. Dask's threaded scheduler runs tasks
in a pool of its own threads (one pool per calling thread), and a new thread starts on
GPU 0: for a loader on ``cuda:1``, every partition would be read into GPU 0's memory,
and the GPU backend, working on GPU 1, would then meet arrays of another device. So the
GPU backend computes a partition with a pool whose threads make the loader's GPU
current when they start (`dask_threads_on`), one pool per GPU, kept for the process
like dask's own.

Only the local threaded scheduler is given that pool: a ``dask.distributed`` client
computes on its workers (with dask-cuda, one GPU per worker), and a scheduler the user
configured (``dask.config.set(scheduler=...)``) is left as it is.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["dask_threads_on", "device_pool"]

_pools: dict[int, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def device_pool(device: int, cupy: Any) -> ThreadPoolExecutor:
    """The thread pool whose threads run dask tasks with CUDA device ``device`` current."""
    with _lock:
        pool = _pools.get(device)
        if pool is None:
            import dask.threaded

            # dask's own executor carries contextvars into the tasks (dask >= 2025)
            kind = getattr(dask.threaded, "ContextAwareThreadPoolExecutor", ThreadPoolExecutor)
            pool = _pools[device] = kind(
                max_workers=os.cpu_count() or 1,
                initializer=cupy.cuda.runtime.setDevice,
                initargs=(device,),
                thread_name_prefix=f"dask-cuda{device}",
            )
        return pool


@contextlib.contextmanager
def dask_threads_on(device: int, cupy: Any) -> Iterator[None]:
    """Within the block, dask's threaded scheduler runs tasks in threads that have CUDA
    device ``device`` current (`device_pool`). Nothing changes when dask is not
    imported, when a ``dask.distributed`` client computes, or when the user configured
    another scheduler."""
    if "dask" not in sys.modules:  # no Dask frame anywhere: nothing to compute
        yield
        return
    import dask

    from tabloader.sources.dask import _distributed_client

    scheduler = dask.config.get("scheduler", None)
    if scheduler not in (None, "threads", "threading") or _distributed_client() is not None:
        yield
        return
    with dask.config.set(scheduler="threads", pool=device_pool(device, cupy)):
        yield
