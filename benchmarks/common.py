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

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CASE_MODULES = (
    "cases_core",
    "cases_torch",
    "cases_tensorflow",
    "cases_gpu",
    "cases_gpu_cache",
    "cases_training",
    "cases_cache",
    "cases_merlin",
)
"""Case modules, in report order; missing ones are skipped. merlin-dataloader comes last:
a library of another environment, which may fail or hang, runs after everything else."""


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
    gpu: str = ""
    """With ``--device cuda``: ``"real"``, ``"emulated"`` (the stand-in of
    ``tests/emulated_gpu``), or ``""`` when the GPU backend cannot run here. Decided once
    by the benchmark's parent process, so that listing cases imports nothing."""

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
    reference beyond which no loader can go), ``"reference"`` (another limit, which the
    derived figures compare some cases with), ``"tabloader"`` or ``"baseline"``."""
    note: str = ""
    every_size: bool = True
    """False: run at the smallest dataset size only (a baseline stopping on a row budget,
    whose rate does not depend on the size of the data)."""
    interpreter: str | None = None
    """The Python to run the case's process with, for a library that cannot share the
    project's environment (None: the one running the benchmark)."""
    pythonpath: tuple[str, ...] = ()
    """Folders put first on the case's ``PYTHONPATH`` (packages staged for it alone)."""
    epochs: int = 0
    """At least this many passes in the case's process (0: the benchmark's ``--epochs``):
    a case whose second pass is a one-off too (a cache placed) needs four, so that the
    median of its later passes is a steady one."""


FACTS: dict[str, Any] = {}
"""What a case's process learnt besides its timings (a training step's time alone, the
loader's counters after each epoch, ...): reported with the case's figures."""


def fact(name: str, value: Any) -> None:
    """Record ``value`` (JSON-serialisable) under ``name`` for the report of this case."""
    FACTS[name] = value


def loader_facts(loader: Any) -> None:
    """Append the loader's counters (``loader.stats()``) to the case's facts: called
    after each epoch, they show where a slow epoch's time went (read, assemble, batch,
    wait) and whether it was served from the cache."""
    import dataclasses

    counters = dataclasses.asdict(loader.stats())
    plain = (bool, int, float, str, type(None))
    FACTS.setdefault("stats_after_epoch", []).append(
        {k: v if isinstance(v, plain) else str(v) for k, v in counters.items()}
    )


def emulated_gpu() -> bool:
    """Whether the GPU stack here is tabloader's emulated stand-in (``tests/emulated_gpu``):
    its figures are never GPU figures. Imports cupy and cudf, so call it only where a
    GPU case runs or is listed."""
    for name in ("cupy", "cudf"):
        try:
            module = sys.modules.get(name) or importlib.import_module(name)
        except Exception:
            continue
        if getattr(module, "__emulated__", False):
            return True
    return False


def fill_doc(path: Path, table: str, begin: str, end: str) -> None:
    """Replace the section of ``path`` between the markers ``begin`` and ``end`` with
    ``table``: the figures in docs are generated, never typed."""
    text = path.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{path} has no section marked {begin!r} ... {end!r}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{table}\n{end}{tail}")
