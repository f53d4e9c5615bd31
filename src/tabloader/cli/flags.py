"""What the commands share: the help's format, and flags read the same way everywhere.

Every option's default is shown at the end of its help (`HelpFormatter`); integers take
``_`` separators (``--rows 200_000``); ``--cats``, ``--conts``, ``--labels`` and
``--fill-null`` mean what the loader's keywords of those names mean.

Examples:
    >>> split_names(["C1,C2", "label"]), parse_fill_null("x=0,y=-1")
    (['C1', 'C2', 'label'], {'x': 0.0, 'y': -1.0})
"""

from __future__ import annotations

import argparse
import os
import textwrap
from collections.abc import Sequence
from typing import Any

from tabloader.errors import InvalidArgumentError

__all__ = [
    "HelpFormatter",
    "column_flags",
    "dataset_paths",
    "refuse_text_files",
    "fill_null_flag",
    "name_pairs",
    "non_negative",
    "parse_fill_null",
    "positive",
    "split_names",
    "wrap",
]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and every option's default at the end of its help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            not action.option_strings
            or "default" in text
            or action.default is argparse.SUPPRESS
            or isinstance(action, (argparse._HelpAction, argparse._VersionAction))
        ):
            return text
        default = action.default
        if default is None:
            shown = "none"
        elif default is True or default is False:
            shown = "on" if default else "off"
        elif isinstance(default, int) and not isinstance(default, bool):
            shown = f"{default:_}" if default >= 100_000 else str(default)
        else:
            shown = str(default)
        return f"{text} (default: {shown})"


def wrap(text: str) -> str:
    """A description as the help shows it: lines of at most 88 characters."""
    return textwrap.fill(text, width=88)


def positive(text: str) -> int:
    """An argument type: an integer of at least 1."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative(text: str) -> int:
    """An argument type: an integer of at least 0."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def column_flags(parser: Any, what: str, default: str) -> None:
    """``--cats``, ``--conts`` and ``--labels``: the columns ``what`` (to check, to load)."""
    for kind, meaning in (("cats", "categorical"), ("conts", "continuous"), ("labels", "label")):
        parser.add_argument(
            f"--{kind}",
            action="append",
            metavar="NAMES",
            help=f"{meaning} columns {what}, comma separated (default: {default})",
        )


def fill_null_flag(parser: Any) -> None:
    """``--fill-null``, read by `parse_fill_null`."""
    parser.add_argument(
        "--fill-null",
        metavar="VALUE|NAME=VALUE,...",
        help="replace nulls as the loader's fill_null does: one number for every column, or "
        "per column (default: none, nulls are an error)",
    )


def dataset_paths(paths: list[str]) -> str | list[str]:
    """What ``Dataset`` is given for the paths of the command line: one path as itself."""
    return paths[0] if len(paths) == 1 else paths


def refuse_text_files(paths: str | list[str], *, command: str) -> None:
    """A CSV, TSV or JSON lines file is no parquet: say how to convert it, and to run
    ``tabloader COMMAND`` on the result."""
    from tabloader.convert.inputs import COMPRESSION, SUFFIXES

    for path in [paths] if isinstance(paths, str) else paths:
        stem, suffix = os.path.splitext(path.lower())
        if suffix in COMPRESSION:
            suffix = os.path.splitext(stem)[1]
        kind = SUFFIXES.get(suffix)
        if path.lower().endswith(".metadata.json"):
            continue  # an Iceberg table's metadata, which the loader reads
        if kind is not None and kind != "parquet" and os.path.isfile(path):
            raise InvalidArgumentError(
                f"{path} is a {kind.upper()} file; the loader reads parquet. Convert it first: "
                f"tabloader convert {path} DEST (see tabloader convert --help), then "
                f"tabloader {command} DEST"
            )


def split_names(values: Sequence[str] | None) -> list[str]:
    """The names of a repeatable flag of comma-separated names, in order."""
    return [n for v in values or () for n in v.split(",") if n]


def name_pairs(text: str, what: str) -> dict[str, str]:
    """``"a=1,b=2"`` as ``{"a": "1", "b": "2"}``."""
    found = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise InvalidArgumentError(f"{what} takes NAME=VALUE pairs, got {part!r}")
        found[name.strip()] = value.strip()
    return found


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidArgumentError(f"{what} must be a number, got {text!r}") from None


def parse_fill_null(text: str | None) -> float | dict[str, float] | None:
    """``--fill-null``: one number for every column, or ``NAME=VALUE,...``."""
    if text is None:
        return None
    if "=" not in text:
        return _number(text, "--fill-null")
    return {k: _number(v, f"--fill-null {k}") for k, v in name_pairs(text, "--fill-null").items()}
