"""What benchmark cases receive and return (shared by throughput.py and the cases_*.py files).

A case module (``cases_torch.py``, ``cases_tensorflow.py``, ``cases_gpu.py``) exposes
``cases(ctx: Context) -> list[Case]``; it returns ``[]`` when its framework or device is
missing. Each :class:`Case` runs one full pass when called and returns the number of rows
it delivered; ``throughput.py`` times the calls, interleaving all cases over several
rounds so that the machine's noise hits them alike, and reports rows/s and the ratio to
the parquet decode limit measured in the same rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


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


@dataclass
class Case:
    name: str
    """Shown in the report, e.g. ``"TorchAsyncItr + DLDataLoader (shuffle)"``."""
    run: Callable[[], int]
    """One pass; returns the rows delivered (a baseline may stop early on a row budget)."""
    group: str = "tabloader"
    """``"limit"``, ``"tabloader"`` or ``"baseline"``: how the report groups the rows."""
    note: str = ""
    setup: Callable[[], None] | None = field(default=None)
    """Optional warm-up, called once before the timed rounds."""
