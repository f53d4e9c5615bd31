"""What benchmark cases receive and return (shared by throughput.py and the cases_*.py files).

The case registry is generic: ``throughput.py`` imports every module named in
``CASE_MODULES`` that exists (``cases_core.py``, ``cases_torch.py``, ``cases_tensorflow.py``,
``cases_gpu.py``, ``cases_cache.py``, ...). A case module exposes
``cases(ctx: Context) -> list[Case]`` and returns ``[]`` when its framework or device is
missing. ``cases()`` must be cheap and import nothing heavy: the parent process only reads
the names, and every case runs in a fresh process of its own, where
``throughput.py --child NAME`` calls the case's :attr:`Case.make` and times the epochs.
To add cases, add a module and its name to ``CASE_MODULES``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CASE_MODULES = (
    "cases_core",
    "cases_torch",
    "cases_tensorflow",
    "cases_merlin",
    "cases_gpu",
    "cases_cache",
)
"""Case modules, in report order; missing ones are skipped."""


@dataclass(frozen=True)
class Context:
    files: list[str]
    """The benchmark's parquet files (synthetic Criteo-like data)."""
    cats: list[str]
    conts: list[str]
    labels: list[str]
    batch_size: int
    rows: int
    """Rows in the dataset (one epoch)."""
    device: str = "cpu"
    """``"cpu"``, or ``"cuda"`` when run with ``--device cuda``."""

    @property
    def columns(self) -> list[str]:
        """Every column the cases read: cats, conts, labels."""
        return [*self.cats, *self.conts, *self.labels]

    @property
    def loader_options(self) -> dict[str, Any]:
        """The columns and batch size as tabloader's loaders take them."""
        return {
            "cats": self.cats,
            "conts": self.conts,
            "labels": self.labels,
            "batch_size": self.batch_size,
        }


@dataclass
class Case:
    name: str
    """Shown in the report and used to run the case: ``throughput.py --child NAME``."""
    make: Callable[[], Callable[[], int]]
    """Called once in the case's own process: builds the loader (or loads the data) and
    returns one pass, a callable that returns the rows it delivered (a baseline may stop
    early on a row budget). Its time is reported as the case's setup, not as an epoch."""
    group: str = "tabloader"
    """``"limit"`` (the parquet decode limit every ratio refers to), ``"ceiling"`` (a
    reference beyond which no loader can go), ``"tabloader"`` or ``"baseline"``."""
    note: str = ""
    every_size: bool = True
    """False: run at the smallest dataset size only (a baseline stopping on a row budget,
    whose rate does not depend on the size of the data)."""
    interpreter: str | None = None
    """The Python to run the case's process with, for a library that cannot share the
    project's environment (None: the one running the benchmark)."""


def fill_doc(path: Path, table: str, begin: str, end: str) -> None:
    """Replace the section of ``path`` between the markers ``begin`` and ``end`` with
    ``table``: the figures in docs are generated, never typed."""
    text = path.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{path} has no section marked {begin!r} ... {end!r}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{table}\n{end}{tail}")
