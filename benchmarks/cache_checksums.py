"""What the decoded cache's checksums cost: epochs with and without them, same run.

Writes a Criteo-like dataset (26 int64 ids, 13 float32 values, a label), then, for each
variant, alternating, in fresh cache directories:

- ``first epoch``: a loader's epoch 0, which decodes the files, fills the cache in
  memory and writes it out in the background (hashing what it writes), up to the
  moment the files are published (``loader.cache.wait()``);
- ``first epoch, files``: the same for a cache too large for memory, written straight
  into its files (hashed from the files once synced);
- ``opened``: a new loader's first epoch from that published cache, which reads and
  verifies every file first;
- ``cached epoch``: that loader's next epoch, from the cache in memory.

"without" replaces the checksum by a constant (computing nothing), so the difference is
what verification costs. Run::

    python benchmarks/cache_checksums.py --rows 1000000 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tabloader
import tabloader.cache.files as files
import tabloader.cache.policy as policy
from tabloader.synthetic import CATS, CONTS, write_criteo_like


@contextlib.contextmanager
def checksums(enabled: bool) -> Iterator[None]:
    """Checksum as tabloader does, or compute nothing (every segment's checksum 0, which
    reading the same way verifies)."""
    saved = files.checksum
    if not enabled:
        files.checksum = lambda data, running=0: 0  # type: ignore[assignment]
    try:
        yield
    finally:
        files.checksum = saved  # type: ignore[assignment]


@contextlib.contextmanager
def memory(scarce: bool) -> Iterator[None]:
    saved = policy._available_memory
    if scarce:
        policy._available_memory = lambda: 1 << 20  # type: ignore[assignment]
    try:
        yield
    finally:
        policy._available_memory = saved  # type: ignore[assignment]


def timed(loader: tabloader.Loader) -> float:
    started = time.perf_counter()
    for _ in loader:
        pass
    if loader.cache is not None:
        loader.cache.wait()
    return time.perf_counter() - started


def one_round(data: str, enabled: bool) -> dict[str, float]:
    options: dict[str, Any] = dict(
        cats=CATS, conts=CONTS, labels=["label"], batch_size=65536, shuffle=True, seed=0
    )
    out = {}
    with checksums(enabled), tempfile.TemporaryDirectory() as root:
        first = tabloader.Loader(data, **options, cache="disk", cache_dir=root)
        out["first epoch"] = timed(first)
        del first
        opened = tabloader.Loader(data, **options, cache="disk", cache_dir=root)
        out["opened"] = timed(opened)
        assert opened.stats().from_cache
        out["cached epoch"] = timed(opened)
    with checksums(enabled), memory(scarce=True), tempfile.TemporaryDirectory() as root:
        direct = tabloader.Loader(data, **options, cache="disk", cache_dir=root)
        out["first epoch, files"] = timed(direct)
    return out


def options_for_hashing() -> dict[str, Any]:
    return dict(cats=CATS, conts=CONTS, labels=["label"], batch_size=65536, shuffle=True)


def hashing(data: str, options: dict[str, Any]) -> float:
    """The fastest of three verifications of a published cache's files, alone."""
    with tempfile.TemporaryDirectory() as root:
        loader = tabloader.Loader(data, **options, seed=0, cache="disk", cache_dir=root)
        timed(loader)
        cache = loader.cache
        assert cache is not None
        directory = cache.path
        assert directory is not None
        paths = sorted(directory.glob("*.npy"))
        sizes = [(path, path.stat().st_size - files.PAGE) for path in paths]
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            files.file_checksums(sizes)
            best = min(best, time.perf_counter() - started)
        return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        data = str(Path(directory) / "data")
        write_criteo_like(data, rows=args.rows, files=4)
        one_round(data, True)  # warm: page cache, pools
        results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for _ in range(args.rounds):
            for enabled in (False, True):
                results[enabled].append(one_round(data, enabled))
        alone = hashing(data, options_for_hashing())
    print(f"{args.rows:,} rows, {args.rounds} rounds (seconds: fastest, median)")
    print(f"{'':22} {'without':>15} {'with':>15} {'cost (fastest)':>15}")
    for case in results[True][0]:
        without = [r[case] for r in results[False]]
        with_ = [r[case] for r in results[True]]
        print(
            f"{case:22} {min(without):7.3f} {statistics.median(without):7.3f} "
            f"{min(with_):7.3f} {statistics.median(with_):7.3f} "
            f"{min(with_) - min(without):+15.3f}"
        )
    print(f"verifying a published cache's files alone: {alone:.3f} s (fastest of 3)")


if __name__ == "__main__":
    main()
