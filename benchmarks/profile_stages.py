"""Where a CPU loader's time goes, per thread, sampled with py-spy (native frames).

    python benchmarks/profile_stages.py                            # every mode, 4M rows
    python benchmarks/profile_stages.py --modes shuffle,cached --out profile.txt

Each mode runs in a fresh process sampled by ``py-spy record --native --threads
--idle``: its first epoch alone (``cache-fill``: the epoch filling a cache), or its later
ones (py-spy attaches once the first epoch is over), and every sample is put down to a
thread's role, found from its stack
(py-spy names threads by their id, which a later epoch's threads reuse): the decoder,
the order thread, the reader, its layout or cache-fill helpers, the gather threads, the
batcher, the consumer (the main thread), and Arrow's own thread pool. Per role the
report gives the share of its samples spent waiting (a lock, a queue, a condition), for
the GIL, in Arrow/parquet, in numpy (by the Python function that called it), in mapping
memory, and in Python itself. Modes:

- ``shuffle``, ``in-order``: the core ``Loader``'s later epochs, shuffled and not;
- ``cache-fill``, ``cached``: ``Loader(cache="memory")``, shuffled: the first epoch, which
  fills the cache, and the later ones, served from it;
- ``torch``: ``TorchAsyncItr`` + ``DLDataLoader`` on the CPU, shuffled, later epochs.

py-spy sees only threads that run Python: Arrow decodes a row group's columns on a pool
of its own, so the decoder shows as waiting for Arrow, and the process reports the CPU
time of the threads without Python (read from ``/proc``) beside the samples.

Needs ``py-spy`` (``pip install py-spy``). Sampling native stacks slows the process
(by half at 50 samples a second on 2 cores): read the shares, not the rates.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("shuffle", "in-order", "cache-fill", "cached", "torch")

ROLES = (
    ("decoder", ("decode_pieces",)),
    ("order", ("_chunk_places", "delivery_rows", "batch_order", "drawn_ahead")),
    ("gather", ("CachedRows.gather", "take_transposed")),
    ("reader", ("_read_chunks",)),
    ("helper", ("_run_all",)),  # a SplitWork helper: layout, or writing a cache
    ("batcher", ("batch_stream",)),
    ("idle pool thread", ("_worker", "_produce")),
)
"""A thread's role: the first of these of which a function on its stack is (or is a
method of that name); the reader's own share of `SplitWork`'s jobs is under
``_read_chunks``, checked before a helper's ``_run_all``. A thread waiting for its
first item (a pool's worker, a stage not started yet) shows no more than that."""
WAITS = (
    "PyThread_acquire_lock",
    "pthread_cond",
    "sem_wait",
    "sem_timedwait",
    "sem_clockwait",
    "futex",
    "epoll_wait",
    "select",
    "nanosleep",
    "ConditionVariable",
    "condition_variable",
)
"""Native frames of a thread waiting (a lock, a queue, a condition, a sleep)."""

CHILD = """
import os, sys, threading, time, glob, tabloader

def thread_cpu():
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = open(f"/proc/self/task/{tid}/stat").read().rpartition(")")[2].split()
        except OSError:
            continue
        cpu[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return cpu

from tabloader.synthetic import CATS, CONTS, LABELS
files, mode, epochs = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
wait_after_first = sys.argv[4] == "1"
options = dict(cats=CATS, conts=CONTS, labels=LABELS, batch_size=65536, seed=0,
               shuffle=mode != "in-order")
if mode in ("cache-fill", "cached"):
    options["cache"] = "memory"
if mode == "torch":
    from tabloader.torch import DLDataLoader, TorchAsyncItr
    dataset = TorchAsyncItr(tabloader.Dataset(files), device="cpu", **options)
    batches = DLDataLoader(dataset, batch_size=None, collate_fn=lambda b: b, num_workers=0)
    loader = dataset.loader
else:
    loader = batches = tabloader.Loader(files, **options)
native_before = {}
for epoch in range(epochs):
    if epoch == (1 if wait_after_first else 0):
        native_before = thread_cpu()
    started, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        pass
    print(f"epoch {epoch}: {time.perf_counter() - started:.2f} s, "
          f"CPU {time.process_time() - cpu:.2f} s", flush=True)
    if epoch == 0 and wait_after_first:
        print("first epoch done", flush=True)
        sys.stdin.readline()  # the profiler attaches meanwhile
print(f"loader.stats(): {loader.stats()}", flush=True)
python_threads = {t.native_id for t in threading.enumerate()}
native = sum(c - native_before.get(tid, 0.0) for tid, c in thread_cpu().items()
             if tid not in python_threads)
print(f"CPU of threads without Python (Arrow's pool, ...) while sampled: {native:.2f} s")
"""


def role_of(frames: list[str], thread: str) -> str:
    """The role of the thread whose stack (outermost frame first) is ``frames``."""
    if thread == "MainThread":
        return "consumer (main thread)"
    if not any(".py:" in f for f in frames):
        return "arrow pool (no Python frames)"
    functions = {f.split(" (")[0].rpartition(".")[2] for f in frames}
    for role, markers in ROLES:
        if any(m.rpartition(".")[2] in functions for m in markers):
            return role
    return "other"


def activity_of(frames: list[str]) -> str:
    """What the innermost frames of a stack are doing."""
    stack = ";".join(frames)
    caller = next((f.split(" (")[0] for f in reversed(frames) if ".py:" in f), "?")
    native = [f for f in frames if ".py:" not in f]
    inner = native[-4:] if native else []
    if "take_gil" in stack:
        return "waiting for the GIL"
    if "libparquet" in stack or "libarrow" in stack:
        if any(w in f for f in inner for w in WAITS):
            return "waiting (arrow)"
        return "arrow/parquet"
    if any(w in f for f in inner for w in WAITS) or frames[-1].startswith("read "):
        return "waiting"  # (a read outside Arrow: the consumer waiting for its go)
    if "madvise" in stack or "mmap" in stack or "munmap" in stack:
        return f"mapping memory ({caller})"
    if "_multiarray_umath" in stack or "numpy/" in stack:
        return f"numpy ({caller})"
    return f"python ({caller})"


def summarise(raw: Path, top: int = 8) -> str:
    """Per role: samples and the share of each activity (``top`` of them)."""
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if not frames or not n.isdigit():
            continue
        thread = re.sub(r"^thread \(\w+\): ?", "", frames[0])
        counts[role_of(frames[1:], thread)][activity_of(frames[1:])] += int(n)
    lines = []
    for role, activities in sorted(counts.items(), key=lambda kv: -kv[1].total()):
        total = activities.total()
        waiting = sum(n for a, n in activities.items() if a.startswith("waiting"))
        lines.append(f"{role}: {total} samples, busy {1 - waiting / total:.0%}")
        for activity, n in activities.most_common(top):
            lines.append(f"    {n / total:6.1%}  {activity}")
    return "\n".join(lines)


def profile(files: list[str], mode: str, epochs: int, rate: int, keep: Path | None) -> str:
    """Run ``mode`` in a fresh process under py-spy; its printed lines and the summary
    (and py-spy's raw samples copied into ``keep``, when given)."""
    first = mode == "cache-fill"
    child = [sys.executable, "-c", CHILD, ",".join(files), mode]
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "profile.raw"
        spy = ["py-spy", "record", "--native", "--threads", "--idle", "--format", "raw"]
        spy += ["--rate", str(rate), "-o", str(raw)]
        if first:
            done = subprocess.run(
                [*spy, "--", *child, "1", "0"], check=True, capture_output=True, text=True
            )
            printed = done.stdout
        else:
            process = subprocess.Popen(
                [*child, str(epochs + 1), "1"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert process.stdin is not None
            assert process.stdout is not None
            printed = ""
            while "first epoch done" not in printed:
                line = process.stdout.readline()
                if not line:
                    raise RuntimeError(f"{mode}: the process ended early:\n{printed}")
                printed += line
            spy_process = subprocess.Popen(
                [*spy, "--pid", str(process.pid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            time.sleep(1.0)  # py-spy attached
            process.stdin.write("\n")
            process.stdin.flush()
            printed += process.stdout.read()
            process.wait()
            spy_process.communicate()
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(raw, keep / f"{mode}.raw")
        lines = [line for line in printed.splitlines() if not line.startswith("py-spy>")]
        return "\n".join(lines) + "\n" + summarise(raw)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--data", type=Path, default=HERE / "data")
    parser.add_argument("--modes", default=",".join(MODES), help="default: %(default)s")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rate", type=int, default=50, help="samples per second")
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument("--raw", type=Path, help="keep py-spy's raw samples in this folder")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from throughput import dataset

    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        raise SystemExit(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    files = dataset(args.rows, 500_000, 131_072, args.data)
    sections = []
    for mode in args.modes.split(","):
        print(f"profiling {mode} ...", flush=True)
        report = profile(files, mode, args.epochs, args.rate, args.raw)
        sections.append(f"######## {mode}, {args.rows:,} rows, {args.epochs} epochs\n{report}")
        if args.out:
            args.out.write_text("\n\n".join(sections) + "\n")
    text = "\n\n".join(sections) + "\n"
    print(text)
    return text


if __name__ == "__main__":
    main()
