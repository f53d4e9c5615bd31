"""The package's layering holds: no module imports one above it (pyproject.toml's
import-linter contracts, drawn in docs/architecture.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_imports_one_above_it():
    # The one installed beside this interpreter first (a virtual environment not activated).
    beside = Path(sys.executable).parent / "lint-imports"
    command = str(beside) if beside.exists() else shutil.which("lint-imports")
    if command is None:
        pytest.skip("needs import-linter: pip install 'tabloader[dev]'")
    # This checkout's package, whatever is installed.
    path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [command, "--no-cache"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert "0 broken" in result.stdout


def test_every_module_of_the_package_has_its_layer():
    """A new module joins the layering (or the sub-package it is in does)."""
    tomllib = pytest.importorskip(
        "tomllib", reason="reads pyproject.toml with Python 3.11's tomllib"
    )
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
    layered = {
        name.strip()
        for contract in contracts
        for layer in contract["layers"]
        for name in layer.split("|")
    }
    package = ROOT / "src" / "tabloader"
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) == 1:
            continue  # the package itself
        module = ".".join(parts)
        top = ".".join(parts[:2])
        assert top in layered, f"{module} is in no layer of the import-linter contracts"
