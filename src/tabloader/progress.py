"""A progress bar for loops over rows or bytes that stays quiet in log files.

On a terminal it is a tqdm bar redrawn at most four times a second, whatever the batch
rate; elsewhere (a log file, a pipe, CI) it writes one plain line every ``interval``
seconds and one at the end, never one per batch. ``tabloader bench``, ``tabloader
convert`` and the training scripts in ``examples/`` show their progress with it.

Examples:
    >>> import io
    >>> out = io.StringIO()
    >>> with Progress(1000, desc="epoch 0", stream=out) as bar:
    ...     for _ in range(4):
    ...         bar.update(250)
    >>> out.getvalue().startswith("epoch 0: 1,000/1,000 rows in ")
    True
"""

from __future__ import annotations

import sys
import time
from typing import Any, Literal, TextIO

__all__ = ["Progress"]


class Progress:
    """Rows (or bytes) done out of a known total: a tqdm bar on a terminal, a plain line
    now and then elsewhere.

    Args:
        total: How many rows (or bytes) the loop will do.
        desc: What is being done, the start of every line (``"epoch 3"``).
        stream: Where to draw or write; default ``sys.stderr``. A bar is drawn when
            ``stream.isatty()`` is true, plain lines are written otherwise.
        interval: Seconds between two plain lines (off a terminal).
        unit: ``"rows"`` (default) or ``"bytes"`` (shown in MiB).

    Use it as a context manager, calling [`update`][tabloader.Progress.update] with the rows done
    since the last call (a training loop: ``progress.update(len(y))``); leaving the ``with`` block
    finishes the bar or writes the last line, with the rate.
    """

    def __init__(
        self,
        total: int,
        *,
        desc: str,
        stream: TextIO | None = None,
        interval: float = 10.0,
        unit: Literal["rows", "bytes"] = "rows",
    ) -> None:
        if unit not in ("rows", "bytes"):
            raise ValueError(f"unit must be 'rows' or 'bytes', got {unit!r}")
        self.stream = sys.stderr if stream is None else stream
        self.total = int(total)
        self.desc = desc
        self.unit = unit
        self.rows = 0
        """Rows (or bytes) done so far."""
        self.interval = interval
        self.started = time.perf_counter()
        self._next_line = self.started + interval
        self._bar: Any = None
        isatty = getattr(self.stream, "isatty", None)
        if isatty is not None and isatty():
            from tqdm import tqdm  # type: ignore[import-untyped]

            self._bar = tqdm(
                total=self.total,
                desc=desc,
                unit="rows" if unit == "rows" else "B",
                unit_scale=True,
                unit_divisor=1000 if unit == "rows" else 1024,
                mininterval=0.25,
                file=self.stream,
                dynamic_ncols=True,
            )

    def update(self, rows: int) -> None:
        """Count ``rows`` more rows (or bytes) done."""
        self.rows += rows
        if self._bar is not None:
            self._bar.update(rows)
            return
        now = time.perf_counter()
        if now >= self._next_line:
            self._next_line = now + self.interval
            self._line(now, final=False)

    def close(self) -> None:
        """Finish the bar, or write the last line."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        else:
            self._line(time.perf_counter(), final=True)

    def _line(self, now: float, *, final: bool) -> None:
        seconds = max(now - self.started, 1e-9)
        verb = "in" if final else "after"
        if self.unit == "rows":
            done = f"{self.rows:,}/{self.total:,} rows"
            rate = f"{self.rows / seconds:,.0f} rows/s"
        else:
            mib = 2**20
            done = f"{self.rows / mib:,.1f}/{self.total / mib:,.1f} MiB"
            rate = f"{self.rows / mib / seconds:,.1f} MiB/s"
        self.stream.write(f"{self.desc}: {done} {verb} {seconds:.1f}s ({rate})\n")
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
