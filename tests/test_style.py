"""The code base stays lint-clean, formatted and type-checked (ruff and mypy, from pyproject)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize(
    "command",
    [("check",), ("format", "--check")],
    ids=["ruff-check", "ruff-format"],
)
def test_ruff(command):
    if shutil.which("ruff") is None:
        pytest.skip("needs ruff: pip install 'tabloader[dev]'")
    result = run("ruff", *command, "src", "tests", "benchmarks", "examples")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy():
    pytest.importorskip("mypy", reason="needs mypy: pip install 'tabloader[dev]'")
    result = run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr
