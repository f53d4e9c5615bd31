"""Where a cached GPU epoch spends its time, against what Python and cupy can do at all.

    python benchmarks/profile_gpu_cache.py                           # 4M rows, cuda:0
    python benchmarks/profile_gpu_cache.py --py-spy "$(which py-spy)" --out cache.txt

In one process: the benchmark's data (``throughput.py`` writes it under ``--data`` when
missing) decoded into a cache in GPU memory by a ``Loader(cache="memory")``'s first epoch,
then ``--epochs`` cached epochs for each shuffle (``True``, ``"global"``) and layout,
each timed to its last batch with the device synchronised: rows/s, the time to the first
batch, and the median and 90th percentile of the gaps between batches as the consumer
sees them.

**The floor**: as many rows, in blocks of the cache's dtypes and widths (row-major, as a
cache in GPU memory stores them), served by the shortest loop cupy allows on the same
kind of stream: one ``cupy.random.permutation`` an epoch, one ``take`` per block per
window of the loader's size, and per batch the dict of views the layout delivers (a
view per column, or per block when stacked). No loader written in Python delivers more
batches a second on this host; the cached loader's rate over the floor's says how much of
the gap is the loader's.

With ``--py-spy PATH``: the shuffled cached epochs again, in a child process under
``py-spy record --native --threads --idle``, and per thread of the loader (told apart by
the functions on its stacks) the innermost frames, native ones included, that took the
most samples, grouped too: waiting for the GIL, waiting on a queue or a lock, inside the
CUDA driver, inside cupy or rmm, or running Python. A thread busy in Python while the
consumer waits is the bottleneck; one that mostly waits for the GIL is held up by the
others.
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SHUFFLES: tuple[Any, ...] = (True, "global")
LAYOUTS = ("columns", "stacked")
THREAD = re.compile(r"^thread \((\d+)\): (.*)$")
ROLES = (  # a thread's role, by a function on its stack (names of reused ids go stale)
    ("reader", "_read_chunks"),
    ("batcher", "batch_stream"),
    ("order", "drawn_ahead"),
    ("gather", "_worker (concurrent/futures/thread.py"),
    ("consumer", "_consume"),
)


def group_of(frames: list[str]) -> str:
    """What a sampled stack (outermost first) was doing: waiting on a queue or lock (the
    interpreter's lock acquisition), waiting for the GIL (a condition variable waited on
    straight from the interpreter: ``take_gil``, whose symbols a release build strips),
    in the CUDA driver, in cupy or rmm, or running."""
    if any("PyThread_acquire_lock" in f for f in frames):
        return "waiting on a queue or lock"
    native = [f for f in frames if not f.startswith("0x")]
    if native and native[-1].startswith("pthread_cond_"):
        return "waiting for the GIL"
    inner = " ".join(frames[-4:])
    if "libcuda" in inner:
        return "in the CUDA driver"
    if "cupy" in inner or "rmm" in inner:
        return "in cupy or rmm"
    return "running"


def _where(frames: list[str]) -> str:
    """The innermost frame of Python or Cython code (its line numbers merged)."""
    for frame in reversed(frames):
        if re.search(r"\.(py|pyx):\d+\)$", frame) or frame.endswith((".py)", ".pyx)")):
            return re.sub(r":\d+\)$", ")", frame)
    return frames[-1] if frames else "?"


def _loader(files: list[str], device: int, batch_size: int, shuffle: Any, layout: str) -> Any:
    import tabloader
    from tabloader.synthetic import CATS, CONTS, LABELS

    return tabloader.Loader(
        files, cats=CATS, conts=CONTS, labels=LABELS, batch_size=batch_size, seed=0,
        shuffle=shuffle, layout=layout, device=device, cache="memory",
    )  # fmt: skip


def timed_epoch(batches: Iterator[Any], synchronize: Callable[[], None]) -> dict[str, float]:
    """One epoch of ``batches``, timed on the consumer's side."""
    started = last = time.perf_counter()
    gaps: list[float] = []
    rows = 0
    for batch in batches:
        first = next(iter(batch.values()))
        rows += int(first.shape[0])
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    synchronize()
    took = time.perf_counter() - started
    return {
        "rows/s": rows / took,
        "first batch ms": gaps[0] * 1e3 if gaps else 0.0,
        "gap p50 ms": statistics.median(gaps[1:]) * 1e3 if len(gaps) > 1 else 0.0,
        "gap p90 ms": (sorted(gaps[1:])[int(0.9 * (len(gaps) - 2))] * 1e3)
        if len(gaps) > 1
        else 0.0,
        "epoch ms": took * 1e3,
    }


def _median_row(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def cached_epochs(
    files: list[str], device: int, batch_size: int, epochs: int, shuffle: Any, layout: str
) -> tuple[dict[str, float], int, int]:
    """The median of ``epochs`` cached epochs; the cache's rows, and the rows it gathers
    at once (its window)."""
    import cupy

    from tabloader.cache.device import window_rows

    loader = _loader(files, device, batch_size, shuffle, layout)
    with cupy.cuda.Device(device) as current:
        for _ in loader:  # the first epoch fills the cache
            pass
        runs = [timed_epoch(iter(loader), current.synchronize) for _ in range(epochs)]
    stats = loader.stats()
    if not stats.from_cache:
        raise RuntimeError("a timed epoch was not served from the cache")
    return _median_row(runs), loader.cache.num_rows, window_rows(loader.cache, batch_size)


def floor_epochs(
    rows: int, device: int, batch_size: int, window: int, epochs: int, stacked: bool
) -> dict[str, float]:
    """The floor (see the module's text): the median of ``epochs`` epochs."""
    import cupy

    from tabloader.synthetic import CATS, CONTS, LABELS

    with cupy.cuda.Device(device) as current:
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            ids = cupy.zeros((rows, len(CATS)), dtype=cupy.int64)
            floats = cupy.zeros((rows, len(CONTS) + len(LABELS)), dtype=cupy.float32)
            names = [CATS, CONTS + LABELS]

            def batches() -> Iterator[dict[str, Any]]:
                order = cupy.random.permutation(rows)
                for lo in range(0, rows, window):
                    index = order[lo : lo + window]
                    blocks = [cupy.take(b.T, index, axis=1).T for b in (ids, floats)]
                    for b in range(0, len(index), batch_size):
                        if stacked:
                            yield {str(i): g[b : b + batch_size] for i, g in enumerate(blocks)}
                        else:
                            yield {
                                name: block[b : b + batch_size, j]
                                for block, columns in zip(blocks, names, strict=True)
                                for j, name in enumerate(columns)
                            }

            timed_epoch(batches(), stream.synchronize)  # the kernels compiled and loaded
            runs = [timed_epoch(batches(), stream.synchronize) for _ in range(epochs)]
        current.synchronize()
    return _median_row(runs)


CHILD = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from profile_gpu_cache import _loader
files = sys.argv[2].split(",")
device, batch_size, epochs = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
loader = _loader(files, device, batch_size, True, "columns")
filling = set()
for _ in loader:  # the cache-filling epoch: its threads are left out of the report
    filling |= {t.native_id for t in threading.enumerate() if t.name.startswith("tabloader")}
with open(sys.argv[6], "w") as out:
    out.write(" ".join(map(str, sorted(filling))))
def _consume():
    for _ in range(epochs):
        for _ in loader:
            pass
_consume()
"""


def summarise(raw: str, top: int, skip: frozenset[int] = frozenset()) -> str:
    """Per thread: samples, what they were doing, and where (the innermost Python or
    Cython frame), for the stacks of the loader's threads and its consumer; the threads
    whose ids are in ``skip`` left out."""
    by_thread: dict[str, collections.Counter[tuple[str, str]]] = collections.defaultdict(
        collections.Counter
    )
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        named = THREAD.match(frames[0]) if frames else None
        if not named or not count.isdigit() or int(named.group(1)) in skip:
            continue
        name = next((role for role, marker in ROLES if marker in stack), None)
        if name is None:
            continue  # the interpreter starting, imports, the cache-filling epoch
        by_thread[name][(group_of(frames[1:]), _where(frames[1:]))] += int(count)
    lines = []
    for name, counts in sorted(by_thread.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(counts.values())
        groups: collections.Counter[str] = collections.Counter()
        for (group, _), n in counts.items():
            groups[group] += n
        lines.append(f"== {name}: {total} samples")
        lines += [f"   {n / total:6.1%}  {g}" for g, n in groups.most_common()]
        lines.append("   busiest (what, where):")
        lines += [f"   {n / total:6.1%}  {g:<28} {w}" for (g, w), n in counts.most_common(top)]
    return "\n".join(lines)


def py_spy_profile(
    py_spy: str, files: list[str], device: int, batch_size: int, epochs: int, rate: int, top: int
) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        raw, filling = Path(tmp) / "profile.raw", Path(tmp) / "filling.txt"
        done = subprocess.run(
            [
                *(py_spy, "record", "--native", "--threads", "--idle", "--format", "raw"),
                *("--rate", str(rate), "-o", str(raw), "--"),
                *(sys.executable, "-c", CHILD, str(HERE), ",".join(files)),
                *(str(device), str(batch_size), str(epochs), str(filling)),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0 or not raw.exists():
            return f"py-spy failed ({done.returncode}):\n{done.stderr[-2000:]}"
        skip = frozenset(int(t) for t in filling.read_text().split())
        return summarise(raw.read_text(), top, skip)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", type=int, default=0, help="the GPU's index")
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--rows-per-file", type=int, default=500_000)
    parser.add_argument("--row-group-size", type=int, default=131_072)
    parser.add_argument("--batch-size", type=int, default=65_536)
    parser.add_argument("--data", type=Path, default=HERE / "data")
    parser.add_argument("--epochs", type=int, default=5, help="timed epochs per case")
    parser.add_argument("--py-spy", help="py-spy's path: also profile the shuffled epochs")
    parser.add_argument("--py-spy-epochs", type=int, default=10)
    parser.add_argument(
        "--rate", type=int, default=250,
        help="py-spy's samples a second (native stacks of every thread slow the process)",
    )  # fmt: skip
    parser.add_argument("--top", type=int, default=12, help="frames per thread")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from throughput import dataset

    files = dataset(args.rows, args.rows_per_file, args.row_group_size, args.data)
    lines = [
        f"Cached GPU epochs, {args.rows:,} rows, batch {args.batch_size:,} (cuda:{args.device})"
    ]
    header = ["rows/s", "first batch ms", "gap p50 ms", "gap p90 ms", "epoch ms"]
    lines.append(f"{'case':<50}" + "".join(f"{h:>16}" for h in header))

    def row(name: str, figures: dict[str, float]) -> None:
        lines.append(f"{name:<50}" + "".join(f"{figures[h]:>16,.2f}" for h in header))
        print(lines[-1], flush=True)

    rows, window = args.rows, args.batch_size
    for shuffle in SHUFFLES:
        for layout in LAYOUTS:
            figures, rows, window = cached_epochs(
                files, args.device, args.batch_size, args.epochs, shuffle, layout
            )
            row(f"Loader cache='memory' shuffle={shuffle!r} {layout}", figures)
    for stacked in (False, True):
        figures = floor_epochs(rows, args.device, args.batch_size, window, args.epochs, stacked)
        row(f"floor: cupy loop, {'stacked' if stacked else 'columns'}", figures)
    if args.py_spy:
        lines.append("")
        lines.append(
            f"py-spy, shuffle=True columns, {args.py_spy_epochs} cached epochs after the "
            f"filling one, {args.rate} samples/s, idle threads included"
        )
        lines.append(
            py_spy_profile(
                args.py_spy,
                files,
                args.device,
                args.batch_size,
                args.py_spy_epochs,
                args.rate,
                args.top,
            )
        )
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
