"""Benchmark cases for the decoded cache (collected like ``cases_torch.py``).

- ``Loader(cache="disk")`` with ``shuffle`` False, True and ``"global"``: in its own
  process, a case's first epoch decodes the files and writes the cache, and its later
  epochs read nothing but the cache, so the report's "first epoch" column is the
  cache-writing epoch and "later epochs" the cached ones.
- ``TorchAsyncItr(cache="disk")`` through ``DLDataLoader``, the same three ways: the
  ``[B, k]`` blocks a training loop receives, which cached epochs gather without
  transposing rows into columns; and the same with ``cache="memory"``, whose epochs do
  not share the cores with a background thread writing the cache's files.
The memory-copy ceiling of cached epochs (``numpy.copyto`` of the decoded columns) is
a core case (``cases_core.py``).

Goals for cached epochs: 2x (no shuffle), 1.5x (shuffle) and 0.7x (global shuffle) the
parquet decode limit; the cache-writing first epoch at most 1.3x a streaming first
epoch. Caches are written to a temporary directory removed when the process exits.
"""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from common import Case, Context

SHUFFLES = (("no shuffle", False), ("shuffle", True), ("global shuffle", "global"))
NOTE = "the first epoch writes the cache; later epochs read only the cache"


def _cached_epochs(
    ctx: Context, shuffle: Any, torch: bool, cache: str = "disk"
) -> Callable[[], Callable[[], int]]:
    def make() -> Callable[[], int]:
        options: dict[str, Any] = {"shuffle": shuffle, "cache": cache}
        if cache == "disk":
            options["cache_dir"] = tempfile.mkdtemp(prefix="tabloader-cache-bench-")
            atexit.register(shutil.rmtree, options["cache_dir"], ignore_errors=True)
        if torch:
            from cases_torch import adapter_pass

            loader, count = adapter_pass(ctx, **options)
        else:
            import tabloader

            loader = tabloader.Loader(
                ctx.files, **ctx.loader_options, seed=0, device="cpu", **options
            )

            def count() -> int:
                return sum(len(next(iter(batch.values()))) for batch in loader)

        epochs = [0]

        def run() -> int:
            rows = count()
            if epochs[0] and not loader.stats().from_cache:
                raise RuntimeError("a later epoch was not served from the cache")
            epochs[0] += 1
            return rows

        return run

    return make


def cache_cases(ctx: Context) -> list[Case]:
    found = [
        Case(
            f"tabloader Loader, disk cache, {label}", _cached_epochs(ctx, shuffle, False), note=NOTE
        )
        for label, shuffle in SHUFFLES
    ]
    if importlib.util.find_spec("torch") is not None:
        found += [
            Case(
                f"TorchAsyncItr + DLDataLoader, disk cache, {label}",
                _cached_epochs(ctx, shuffle, True),
                note=NOTE,
            )
            for label, shuffle in SHUFFLES
        ]
        found += [
            Case(
                f"TorchAsyncItr + DLDataLoader, memory cache, {label}",
                _cached_epochs(ctx, shuffle, True, "memory"),
                note=NOTE,
            )
            for label, shuffle in SHUFFLES
        ]
    return found


def cases(ctx: Context) -> list[Case]:
    """The cache cases (CPU only: the GPU backend does not use the cache)."""
    if ctx.device != "cpu":
        return []
    return cache_cases(ctx)
