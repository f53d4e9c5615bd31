"""The package as users get it: the source distribution holds the whole, runnable test tree,
installs into a fresh environment, and its tests pass there; the metadata is complete.

Building needs ``build`` (in the ``test`` extra); the sdist is built without network
access (``--no-isolation``) from a copy of the files git tracks, so the checkout is left
as it was. The fresh environment borrows this one's packages through a ``.pth`` file
(numpy, pyarrow, pytest, setuptools) but gets tabloader only from the sdist, and runs
the sdist's ``smoke`` tests: a few seconds, enough to show that the tree is complete
(conftest, fixtures) and that the installed package works.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("tests", "docs", "examples", "benchmarks")
"""Folders the sdist carries whole, so that its tests can run."""


def _tracked() -> list[str]:
    """The files git tracks (or would track: new, not ignored), relative to the root."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the files to package are those git tracks")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [p for p in listed.split("\0") if p and (ROOT / p).is_file()]


def _env() -> dict[str, str]:
    """This environment without what would put the checkout's sources on the path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("build") is None:
        pytest.skip("needs build: pip install 'tabloader[test]'")
    tree = tmp_path_factory.mktemp("checkout")
    for path in _tracked():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, tree / path)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out)],
        cwd=tree,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (archive,) = out.glob("tabloader-*.tar.gz")
    return archive


def _members(archive: Path) -> set[str]:
    with tarfile.open(archive) as tar:
        return {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name and m.isfile()}


@pytest.mark.slow
def test_the_sdist_holds_the_whole_test_tree_and_nothing_stale(sdist):
    members = _members(sdist)
    wanted = [p for p in _tracked() if p.startswith(tuple(f"{d}/" for d in SHIPPED))]
    wanted += ["mkdocs.yml", "CHANGELOG.md", "README.md", "LICENSE", "pyproject.toml"]
    missing = sorted(set(wanted) - members)
    assert not missing, f"the sdist lacks {missing[:20]}"
    assert {"tests/conftest.py", "tests/emulated_gpu/paths.py", "tests/contract.py"} <= members
    stale = [m for m in members if "__pycache__" in m or m.endswith(".pyc")]
    assert not stale


@pytest.mark.slow
def test_the_sdists_tests_pass_in_a_fresh_environment(sdist, tmp_path):
    source = tmp_path / "source"
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12 and later
            tar.extractall(source, filter="data")
        else:  # the archive was built here a moment ago
            tar.extractall(source)
    (tree,) = source.iterdir()
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=False)
    python = str(fresh / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    borrowed = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(site, "_borrowed.pth").write_text("".join(f"{p}\n" for p in borrowed))
    install = subprocess.run(
        [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--no-cache-dir", "--disable-pip-version-check", "--quiet", str(sdist)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    where = subprocess.run(
        [python, "-c", "import tabloader; print(tabloader.__file__)"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=tmp_path,
    ).stdout.strip()
    assert where.startswith(site), where  # the sdist's copy, not the checkout's
    run = subprocess.run(
        [python, "-m", "pytest", "tests", "-m", "smoke", "-q", "-p", "no:cacheprovider"],
        cwd=tree,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-5000:]
    passed = re.search(r"(\d+) passed", output)
    assert passed is not None and int(passed.group(1)) >= 20, output[-3000:]


def test_the_metadata_names_versions_status_links_and_gpu_extras():
    tomllib = pytest.importorskip(
        "tomllib", reason="reads pyproject.toml with Python 3.11's tomllib"
    )
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    classifiers = project["classifiers"]
    assert any(c.startswith("Development Status :: ") for c in classifiers)
    floor = re.fullmatch(r">=3\.(\d+)", project["requires-python"])
    assert floor is not None
    for minor in range(int(floor.group(1)), 14):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers
    assert {"Documentation", "Source", "Issues", "Changelog"} <= set(project["urls"])
    assert project["urls"]["Changelog"].endswith("/CHANGELOG.md")
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog\n")
    extras = project["optional-dependencies"]
    assert all("cu12" in r or "cuda12" in r for r in extras["gpu-cu12"])
    assert all("cu13" in r or "cuda13" in r for r in extras["gpu-cu13"])
    assert extras["gpu"] == extras["gpu-cu12"]
    assert any(r.startswith("build") for r in extras["test"])
