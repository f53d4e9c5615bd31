"""``tabloader selftest``: the flags of `tabloader.selftest.run_selftest`."""

from __future__ import annotations

import argparse
from typing import TextIO

from tabloader.cli.flags import positive, wrap
from tabloader.frameworks import framework_titles

__all__ = ["DESCRIPTION", "EPILOG", "HELP", "NAME", "add_flags", "run"]

NAME = "selftest"
HELP = "check the install on generated data: parity, adapters, memory, speed"


def add_flags(p: argparse.ArgumentParser) -> None:
    """``tabloader selftest``'s flags."""
    p.add_argument("--device", default=None, help="cpu or a GPU: cuda or cuda:N (default: cpu)")
    p.add_argument("--rows", type=positive, default=200_000, help="rows of generated data")


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run the checks; 0 when nothing failed, 1 when a check failed, 2 without the device."""
    from tabloader.selftest import run_selftest

    return run_selftest(args.device, rows=args.rows, out=out)


DESCRIPTION = wrap(
    "Check this install on generated data (with nulls, NaN and infinities): every row once "
    "per epoch with the requested dtypes; on a GPU, batches bit-identical to the CPU's; the "
    f"{framework_titles()} adapters when installed; memory flat over epochs; and throughput "
    "against the decode limit. Prints PASS, FAIL or SKIP per check; exit status 0 when "
    "nothing failed, 1 when a check failed, 2 when the device cannot be used here."
)
EPILOG: str | None = None
