"""The ``tabloader`` command: convert data, check it before training, and time how it loads.

tabloader convert raw/*.csv data --split valid=0.1
tabloader inspect data/train
tabloader bench data/train --fill-null 0 --epochs 2

Each command is a module of this package (`tabloader.cli.convert`, `tabloader.cli.inspect`,
`tabloader.cli.bench`, `tabloader.cli.selftest`) that says its ``NAME``, ``HELP``,
``DESCRIPTION`` and ``EPILOG``, adds its flags (``add_flags``) and runs (``run``);
`build_parser` makes every command's parser the same way, and `main` says every
command's errors the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TextIO

from tabloader._version import __version__
from tabloader.cli import bench, convert, inspect, selftest
from tabloader.cli.flags import HelpFormatter, wrap
from tabloader.errors import TabloaderError

__all__ = ["build_parser", "main"]

COMMANDS = (convert, inspect, bench, selftest)
"""The commands, in the order the help lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The ``tabloader`` parser: a subparser per command, each added by its module."""
    parser = argparse.ArgumentParser(
        prog="tabloader",
        description=wrap(
            "Convert tabular data to parquet, check it before training, and time how fast it loads."
        ),
        epilog=_EXAMPLES,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tabloader {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = commands.add_parser(
            command.NAME,
            help=command.HELP,
            description=command.DESCRIPTION,
            epilog=command.EPILOG,
            formatter_class=HelpFormatter,
        )
        sub.set_defaults(run=command.run)
        command.add_flags(sub)
    return parser


class Terminated(BaseException):
    """SIGTERM, raised in the command's thread so that its clean-up runs (Python's own
    handling of the signal ends the process on the spot, leaving half-written files)."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    out: TextIO = sys.stdout
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        code: int = args.run(args, out, sys.stderr)
        out.flush()  # a closed pipe shows here, not at exit
        return code
    except Terminated:
        sys.stderr.write("\ntabloader: terminated\n")
        return 143  # 128 + SIGTERM
    except TabloaderError as error:
        sys.stderr.write(f"tabloader: error: {error}\n")
        return 2
    except ImportError as error:  # an optional framework that is not installed
        sys.stderr.write(f"tabloader: error: {error}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("\ntabloader: interrupted\n")
        return 130  # 128 + SIGINT
    except BrokenPipeError:
        # The reader went away (`tabloader inspect ... | head`): stop quietly, as other
        # command-line tools do. Python would flush stdout again at exit and fail.
        with contextlib.suppress(OSError, ValueError, AttributeError):  # not a real fd
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool stopped by the pipe
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


_EXAMPLES = """\
examples:
  tabloader convert raw/*.csv data --split valid=0.1  your files as parquet, split
  tabloader inspect data/train                         check the files before training
  tabloader inspect data/train --ranks 8 --json        the same, for a script
  tabloader bench data/train --fill-null 0 --epochs 2  time epochs of the suggested columns
  tabloader bench data/train --cats C1,C2 --conts I1 --labels label --framework torch
  tabloader selftest --device cuda                     check the install
"""
