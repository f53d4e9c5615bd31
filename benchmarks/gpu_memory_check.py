"""The memory checks of the GPU host run: a loader gives back what it took, and a cache in
GPU memory gives way to the training step.

1. **Closing.** The driver's free memory is read before a GPU loader is built; the loader
   runs streamed epochs and epochs from a cache in GPU memory, then ``close()``. The
   framework (PyTorch on a GPU) must then allocate, in one piece, at least 95% of the
   memory that was free before.
2. **Unlocking.** A cache in pinned host memory: after ``close()`` none of it stays
   page-locked: cupy's pinned memory pool, which keeps what it is given back locked,
   holds no block of the loader's (the emulated device also counts the locked bytes;
   the resident memory before, while running and after is reported beside).
3. **Giving way.** A decoded cache is placed in GPU memory; then the training step grows
   (a block a batch) until the GPU keeps only 5% of its memory free, below the cache's
   reserve. The loader must move the cache to pinned host memory with a ``CacheWarning``,
   the step must never run out of memory, every epoch must deliver every row, and the
   step must then be able to take the memory the cache gave back.

On the emulated device the framework's allocations are the driver's memory (cupy without
a pool), on an emulated GPU of ``--emulated-memory`` bytes. Nothing measured there is a
GPU result.

    python benchmarks/gpu_memory_check.py --rows 2000000 --out memory.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_race import write_data  # noqa: E402

OPTIONS = {"cats": ["c0", "c1"], "conts": ["x0", "x1"], "labels": ["label"], "shuffle": True,
           "seed": 3}  # fmt: skip


class Framework:
    """The training step's memory: PyTorch's on a GPU, the driver's on the emulated one."""

    def __init__(self) -> None:
        import cupy

        self.emulated = bool(getattr(cupy, "__emulated__", False))
        self.cupy = cupy
        self.blocks: list[Any] = []
        if not self.emulated:
            import torch

            self.torch = torch

    def free_total(self) -> tuple[int, int]:
        if self.emulated:
            free, total = self.cupy.cuda.runtime.memGetInfo()
            return int(free), int(total)
        free, total = self.torch.cuda.mem_get_info()
        return int(free), int(total)

    def take(self, nbytes: int) -> None:
        """The step allocates ``nbytes`` more (raises when the device has no room)."""
        if self.emulated:
            with self.cupy.cuda.using_allocator(None):
                self.blocks.append(self.cupy.empty(int(nbytes), dtype=np.uint8))
            return
        self.blocks.append(self.torch.empty(int(nbytes), dtype=self.torch.uint8, device="cuda"))

    def release(self) -> None:
        self.blocks.clear()
        if not self.emulated:
            self.torch.cuda.empty_cache()


def check_closing(files: list[str], framework: Framework, batch_size: int) -> dict[str, Any]:
    import tabloader

    gc.collect()
    free_before, total = framework.free_total()
    loader = tabloader.Loader(
        files, device="cuda", batch_size=batch_size, cache="memory", cache_placement="device",
        **OPTIONS,
    )  # fmt: skip
    rows = [sum(len(b["c0"]) for b in loader) for _ in range(3)]
    held = free_before - framework.free_total()[0]
    loader.close()
    gc.collect()
    want = int(0.95 * free_before)
    try:
        framework.take(want)
        took = True
    except Exception as err:  # the check's verdict, with why
        took = False
        print(f"could not allocate {want:,} bytes after close(): {type(err).__name__}: {err}")
    finally:
        framework.release()
    return {
        "check": "close() gives the memory back",
        "free_before": free_before,
        "total": total,
        "held_while_running": held,
        "rows_per_epoch": rows,
        "allocated_after_close": want if took else 0,
        "passed": took and len(set(rows)) == 1,
    }


def _rss() -> int:
    """This process's resident memory in bytes (Linux), 0 where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _locked_bytes(cupy: Any) -> int | None:
    """Page-locked bytes on the emulated device (which counts them); None on a GPU, whose
    driver has no such query: there the pool's free blocks and the resident memory say it."""
    emulated = getattr(cupy.cuda, "pinned_memory", None)
    return emulated.locked_bytes() if hasattr(emulated, "locked_bytes") else None


def check_pinned_closing(files: list[str], framework: Framework, batch_size: int) -> dict[str, Any]:
    import cupy

    import tabloader

    gc.collect()
    pool = cupy.get_default_pinned_memory_pool()
    free_blocks_before, rss_before = pool.n_free_blocks(), _rss()
    locked_before = _locked_bytes(cupy)
    loader = tabloader.Loader(
        files, device="cuda", batch_size=batch_size, cache="memory", cache_placement="host",
        **OPTIONS,
    )  # fmt: skip
    rows = [sum(len(b["c0"]) for b in loader) for _ in range(3)]
    placed = loader.stats().cache_placement
    cache_bytes = loader.cache.nbytes if loader.cache is not None else 0
    rss_running = _rss()
    loader.close()
    del loader
    gc.collect()
    rss_after = _rss()
    locked_after = _locked_bytes(cupy)
    return {
        "check": "close() unlocks the pinned host memory",
        "placed": placed,
        "cache_bytes": cache_bytes,
        "rss_before": rss_before,
        "rss_running": rss_running,
        "rss_after": rss_after,
        "default_pool_free_blocks": [free_blocks_before, pool.n_free_blocks()],
        "page_locked_bytes": [locked_before, locked_after],
        "rows_per_epoch": rows,
        "passed": placed == "pinned host"
        and len(set(rows)) == 1
        and pool.n_free_blocks() == free_blocks_before
        and locked_after == locked_before,
    }


def check_giving_way(files: list[str], framework: Framework, batch_size: int) -> dict[str, Any]:
    import tabloader
    from tabloader.errors import CacheWarning

    gc.collect()
    loader = tabloader.Loader(files, device="cuda", batch_size=batch_size, cache="memory",
                              **OPTIONS)  # fmt: skip
    expected = sum(len(b["c0"]) for b in loader)  # fills the cache
    assert sum(len(b["c0"]) for b in loader) == expected  # placed
    placed = loader.stats().cache_placement
    free, total = framework.free_total()
    target = free - int(0.05 * total)  # the step leaves 5% of the device free
    block = max(target // 16, 1 << 20)  # the step grows over 16 batches
    delivered, crashed = [], ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for _ in range(3):
                rows = 0
                for batch in loader:
                    rows += len(batch["c0"])
                    grown = sum(int(getattr(b, "nbytes", 0)) for b in framework.blocks)
                    if grown < target:
                        framework.take(min(block, target - grown))
                delivered.append(rows)
        except Exception as err:
            crashed = f"{type(err).__name__}: {err}"
    gave_way = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    after = loader.stats().cache_placement
    cache_bytes = loader.cache.nbytes if loader.cache is not None else 0
    try:  # more than the 5% left: only with the memory the cache gave back
        framework.take(int(0.05 * total) + cache_bytes // 2)
        took_back = True
    except Exception:
        took_back = False
    framework.release()
    loader.close()
    return {
        "check": "a cache in GPU memory gives way to the step",
        "placed": placed,
        "placement_after": after,
        "warnings": gave_way[:1],
        "rows_per_epoch": delivered,
        "expected_rows": expected,
        "step_crashed": crashed,
        "step_took_the_cache_memory": took_back,
        "passed": placed == "device"
        and after == "pinned host"
        and bool(gave_way)
        and not crashed
        and delivered == [expected] * 3
        and took_back,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--row-group-size", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=65536)
    parser.add_argument("--data", default=str(Path(tempfile.gettempdir()) / "tabloader-memory"))
    parser.add_argument("--emulated-memory", type=int, default=2**30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import cupy

    if getattr(cupy, "__emulated__", False):
        os.environ["TABLOADER_EMULATED_GPU_MEMORY"] = str(args.emulated_memory)
        where = "EMULATED device: not GPU results"
    else:
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        where = name.decode() if isinstance(name, bytes) else str(name)
    files = write_data(Path(args.data), args.rows, args.row_group_size)
    framework = Framework()
    results = []
    for check in (check_closing, check_pinned_closing, check_giving_way):
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            result = check(files, framework, args.batch_size)
        result["seconds"] = round(time.perf_counter() - started, 1)
        results.append(result)
        verdict = "ok" if result["passed"] else "FAILED"
        print(f"{result['check']:<46} {verdict}  {json.dumps(result)[:600]}", flush=True)
    print(f"memory checks on {where}: {sum(r['passed'] for r in results)} of {len(results)} passed")
    if args.out is not None:
        args.out.write_text(json.dumps({"on": where, "results": results}, indent=1))
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
