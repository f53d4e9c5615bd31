"""Dask partitions computed on the loader's GPU.

A ``dask_cudf`` partition is a cudf DataFrame made by the task that computes it, on the
current CUDA device of the thread the task runs in. Dask's threaded scheduler runs tasks
in a pool of its own threads (one pool per calling thread), and a new thread starts on
GPU 0: for a loader on ``cuda:1``, every partition would be read into GPU 0's memory,
and the GPU backend, working on GPU 1, would then meet arrays of another device. So the
GPU backend computes a partition with a pool whose threads make the loader's GPU
current when they start (`dask_compute_options`), one pool per GPU, kept for the process
like dask's own. The pool goes to that computation's ``compute()`` call only, never to
dask's configuration, which is the process's: set there, it would send another thread's
dask work (the user's own, or a loader on another GPU) to this GPU's threads.

Only the local threaded scheduler is given that pool: a ``dask.distributed`` client
computes on its workers (with dask-cuda, one GPU per worker), and a scheduler the user
configured (``dask.config.set(scheduler=...)``) is left as it is.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["dask_compute_options", "device_pool"]

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


def dask_compute_options(device: int, cupy: Any) -> dict[str, Any]:
    """The keywords of ``compute()`` that run dask's threaded scheduler in threads that
    have CUDA device ``device`` current (`device_pool`); none when dask is not imported,
    when a ``dask.distributed`` client computes, or when the user configured another
    scheduler. Passed to one computation, they change nothing for any other thread.

    Examples:
        >>> dask_compute_options(0, cupy=None) if "dask" not in sys.modules else {}
        {}
    """
    if "dask" not in sys.modules:  # no Dask frame anywhere: nothing to compute
        return {}
    import dask

    from tabloader.sources.dask import _distributed_client

    scheduler = dask.config.get("scheduler", None)
    if scheduler not in (None, "threads", "threading") or _distributed_client() is not None:
        return {}
    return {"scheduler": "threads", "pool": device_pool(device, cupy)}
