"""GPU benchmark cases for the decoded cache (``--device cuda``, smallest size only).

In its own process, each case's first epoch decodes the files and fills the cache, and
its later epochs are served from the cache alone (checked with ``loader.stats()``). The
first of those also places the complete cache (copies it to GPU memory, or to pinned host
memory), once: each case runs four epochs, so that the report's "first epoch" is the
cache-filling epoch and "later epochs" the median of the cached ones, a steady epoch; the
goals table shows the placing epoch on its own.

- ``cache="memory"``, shuffled and ``shuffle="global"``: the decoded rows in GPU memory;
- the same cache kept in pinned host memory (``PINNED_HOST``), each chunk copied to the
  device ahead of its use;
- ``cache="disk"``, shuffled: cache files read back through pinned memory.

Goals (``gpu_goals.py``), as multiples of cudf's decode of the same data: cached
shuffled epochs 10x, global shuffle 5x, the pinned-host cache 2x.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

try:
    from common import Case, Context, fact
except ImportError:  # imported as part of a package
    from benchmarks.common import Case, Context, fact

PINNED_HOST: dict[str, Any] = {"cache_placement": "host"}
"""The options that make a GPU loader keep its decoded cache in pinned host memory even
where it fits on the device: the one place that names them."""
PLACEMENT_STAT = "cache_placement"
"""The ``LoaderStats`` field saying where the cache lives; recorded when present, and the
pinned-host case fails when it names another place."""

MEMORY_SHUFFLE = "Loader(device='cuda', cache='memory') (shuffle)"
MEMORY_GLOBAL = "Loader(device='cuda', cache='memory') (global shuffle)"
PINNED_SHUFFLE = "Loader(device='cuda', cache='memory', pinned host) (shuffle)"
DISK_SHUFFLE = "Loader(device='cuda', cache='disk') (shuffle)"
NOTE = "the first epoch fills the cache, the second places it; later epochs read only the cache"
CACHE_EPOCHS = 4
"""Passes per cached case: filling, placing, and two steady cached epochs."""


def cases(ctx: Context) -> list[Case]:
    if ctx.device != "cuda" or not ctx.gpu:
        return []
    return [
        Case(name, _cached(ctx, **options), note=NOTE, every_size=False, epochs=CACHE_EPOCHS)
        for name, options in (
            (MEMORY_SHUFFLE, {"cache": "memory", "shuffle": True}),
            (MEMORY_GLOBAL, {"cache": "memory", "shuffle": "global"}),
            (PINNED_SHUFFLE, {"cache": "memory", "shuffle": True, **PINNED_HOST}),
            (DISK_SHUFFLE, {"cache": "disk", "shuffle": True}),
        )
    ]


def _cached(ctx: Context, **options: Any) -> Callable[[], Callable[[], int]]:
    def make() -> Callable[[], int]:
        import tabloader
        from cases_gpu import counted, gpu_index

        chosen = dict(options)
        if chosen["cache"] == "disk":
            chosen["cache_dir"] = tempfile.mkdtemp(prefix="tabloader-gpu-cache-bench-")
            atexit.register(shutil.rmtree, chosen["cache_dir"], ignore_errors=True)
        device = gpu_index()
        loader = tabloader.Loader(ctx.files, **ctx.loader_options, seed=0, device=device, **chosen)
        count = counted(loader, device)
        epochs = [0]

        def run() -> int:
            rows = count()
            stats = loader.stats()
            placement = getattr(stats, PLACEMENT_STAT, None)
            if placement is not None:
                fact(PLACEMENT_STAT, str(placement))
            if epochs[0] and not stats.from_cache:
                raise RuntimeError("a later epoch was not served from the cache")
            if options.keys() & PINNED_HOST.keys() and placement not in (None, "pinned host"):
                raise RuntimeError(f"asked for a pinned-host cache, got one in {placement!r}")
            epochs[0] += 1
            return rows

        return run

    return make
