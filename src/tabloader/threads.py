"""How many threads a loader runs: every stage's width, decided in one place from the cores.

`Threads` sizes each CPU stage from the cores the loader may keep busy
(``Loader(threads=)``, by default those this process may run on: `usable_cores`), and
`thread_advice` says what to set when a framework's own threads and the loader's would
fight over too few cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["LOADER_THREADS", "Threads", "thread_advice", "usable_cores"]


LOADER_THREADS = 2
"""Background threads of one loader (a reader and a batcher), besides pyarrow's decode pool
and the reader's short-lived layout helpers."""


def thread_advice(torch_threads: int, cores: int) -> str | None:
    """What to set when PyTorch's intra-op threads and the loader's threads exceed the cores.

    None too when the advice is followed already (one thread on a machine of two cores
    or fewer: there is nothing left to lower).

    Examples:
        >>> thread_advice(2, 2).split(";")[0]
        'PyTorch uses 2 intra-op threads and the loader 2 background threads on 2 cores'
        >>> thread_advice(6, 8) is None, thread_advice(1, 2) is None
        (True, True)
    """
    fit = max(1, cores - LOADER_THREADS)
    if torch_threads + LOADER_THREADS <= cores or torch_threads <= fit:
        return None
    return (
        f"PyTorch uses {torch_threads} intra-op threads and the loader {LOADER_THREADS} "
        f"background threads on {cores} cores; they will fight over the cores and an epoch "
        f"can take several times longer. Call torch.set_num_threads({fit}) or set "
        f"OMP_NUM_THREADS={fit} (see docs/performance.md)"
    )


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class Threads:
    """How many threads each CPU stage may run at once, all decided here from one number:
    the cores the loader may keep busy (``Loader(threads=)``, by default the cores this
    process may run on, `usable_cores`). `LoaderStats.threads` says which was taken.

    Arrow decodes each row group on its own pool, as wide as the machine, beside these.
    On 2 cores every stage gets both (alone, the reader laying out chunks was the
    pipeline's slowest stage: the decoder, one piece ahead, waited for it a quarter of
    the time). The limits beyond are where memory bandwidth, not cores, sets the pace
    of a scatter or a gather; they await a measurement on many cores.

    Examples:
        >>> Threads(2).layout, Threads(2).gather, Threads(2).fill
        (2, 2, 2)
        >>> Threads(16).layout, Threads(16).gather, Threads(16).fill
        (8, 8, 4)
        >>> Threads(2).device_gather, Threads(16).device_gather
        (2, 4)
    """

    cores: int

    @classmethod
    def sized(cls, threads: int | None = None) -> Threads:
        """``threads`` when given, else the cores this process may run on."""
        return cls(usable_cores() if threads is None else max(1, threads))

    @property
    def layout(self) -> int:
        """Threads laying out a chunk's decoded pieces, the reader's own included."""
        return min(self.cores, 8)

    @property
    def gather(self) -> int:
        """Threads gathering a cached epoch's batches (`run_ahead`)."""
        return min(self.cores, 8)

    @property
    def device_gather(self) -> int:
        """Threads gathering a GPU cache's windows at once (launches, not copies: a few
        keep the device busy)."""
        return min(self.cores, 4)

    @property
    def fill(self) -> int:
        """Threads writing decoded pieces into a cache being filled, the reader's included
        (the gather threads serve the epoch beside them)."""
        return min(self.cores, 4)
