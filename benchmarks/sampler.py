"""A sampling profiler in pure Python: where each thread of this process spends its time.

For hosts without py-spy or perf (the GPU host has neither). A background thread wakes
every ``interval`` seconds and records the Python stack of every other thread
(``sys._current_frames()``), keyed by the thread's name. A thread running C code (cudf's
decode, a cupy kernel launch, numpy) is seen at the Python line that called it, which is
what attributing time to stages needs. The sampler takes the GIL to look, so it sees a
thread that holds the GIL only when that thread lets go (every ``sys.getswitchinterval()``
at most): shares are estimates, good to a few percent over a few thousand samples.

    with Sampler() as sampler:
        run_some_epochs()
    print(sampler.report())
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from pathlib import PurePath
from types import FrameType, TracebackType

Frame = tuple[str, str, int]
"""``(file, function, line)``."""

LIBRARIES = (
    "tabloader",
    "benchmarks",
    "cudf",
    "pylibcudf",
    "dask_cudf",
    "cupy",
    "cupyx",
    "rmm",
    "numba",
    "numpy",
    "pyarrow",
    "pandas",
    "torch",
    "dask",
    "distributed",
)
"""Libraries told apart in the report, by a folder of that name in the file's path."""
WAITING_FILES = ("threading.py", "queue.py", "selectors.py")
"""A stack whose innermost frame is in one of these is waiting (a lock, a queue, a sleep
in the threading module)."""


def library(filename: str) -> str:
    """The library a source file belongs to (``LIBRARIES``), else ``"python"``."""
    parts = PurePath(filename).parts
    if "benchmarks" in parts and "tabloader" not in parts:
        return "benchmarks"
    for part in parts:
        if part in LIBRARIES:
            return part
    return "python"


def short(filename: str) -> str:
    """A file's path from its library's folder on (``cudf/io/parquet.py``)."""
    parts = PurePath(filename).parts
    for i, part in enumerate(parts):
        if part in LIBRARIES:
            return "/".join(parts[i:])
    return "/".join(parts[-2:])


def is_waiting(stack: tuple[Frame, ...]) -> bool:
    return bool(stack) and PurePath(stack[-1][0]).name in WAITING_FILES


class Sampler:
    """Samples every other thread's stack every ``interval`` seconds while active."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.samples: dict[str, collections.Counter[tuple[Frame, ...]]] = {}
        self.ticks = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._started = time.perf_counter()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self.seconds += time.perf_counter() - self._started

    def _run(self) -> None:
        me = threading.get_ident()
        names: dict[int, str] = {}
        while not self._stop.wait(self.interval):
            frames = sys._current_frames()
            if frames.keys() - names.keys():
                names = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
            for ident, frame in frames.items():
                if ident != me:
                    name = names.get(ident, f"thread {ident}")
                    self.samples.setdefault(name, collections.Counter())[_stack(frame)] += 1
            self.ticks += 1

    def report(self, top: int = 10, threads: tuple[str, ...] = ()) -> str:
        """Per thread (those named in ``threads``, or all): its samples, the share spent
        waiting, the shares by library of the innermost frame, the innermost lines and the
        functions (anywhere on the stack) that took the most samples."""
        per_tick = self.seconds / self.ticks if self.ticks else self.interval
        lines = [
            f"{self.ticks} samples over {self.seconds:.1f} s (one every {1e3 * per_tick:.1f} ms)"
        ]
        for name in sorted(self.samples, key=lambda n: -sum(self.samples[n].values())):
            if threads and not any(name.startswith(t) for t in threads):
                continue
            lines += ["", *self._thread_report(name, top, per_tick)]
        return "\n".join(lines)

    def _thread_report(self, name: str, top: int, per_tick: float) -> list[str]:
        stacks = self.samples[name]
        total = sum(stacks.values())
        waiting = sum(n for s, n in stacks.items() if is_waiting(s))
        libraries: collections.Counter[str] = collections.Counter()
        leaves: collections.Counter[str] = collections.Counter()
        functions: collections.Counter[str] = collections.Counter()
        for stack, n in stacks.items():
            if not stack:
                continue
            file, function, line = stack[-1]
            libraries["waiting" if is_waiting(stack) else library(file)] += n
            if not is_waiting(stack):
                leaves[f"{short(file)}:{line} {function}"] += n
            for seen in {f"{short(f)} {fn}" for f, fn, _ in stack}:
                functions[seen] += n

        def share(n: int) -> str:
            return f"{n / total:6.1%}"

        by_library = ", ".join(f"{lib} {n / total:.0%}" for lib, n in libraries.most_common())
        out = [
            f"== thread {name}: {total} samples (~{total * per_tick:.2f} s), "
            f"waiting {waiting / total:.0%}",
            f"   innermost frame by library: {by_library}",
            "   busiest lines (innermost frame, waits left out):",
            *(f"   {share(n)}  {where}" for where, n in leaves.most_common(top)),
            "   functions on the stack (inclusive):",
            *(f"   {share(n)}  {where}" for where, n in functions.most_common(top)),
        ]
        return out


def _stack(frame: FrameType | None) -> tuple[Frame, ...]:
    """The stack from the outermost frame to ``frame``."""
    stack = []
    while frame is not None:
        code = frame.f_code
        name = getattr(code, "co_qualname", code.co_name)  # Python 3.11 and later
        stack.append((code.co_filename, name, frame.f_lineno or 0))
        frame = frame.f_back
    return tuple(reversed(stack))
