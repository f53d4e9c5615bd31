"""Every code block in docs/ runs, and the documentation site builds with --strict.

Blocks of one page run in order, in one namespace (Python) or one working directory
(shell), inside a scratch directory that stands for the repository root (``examples/``
and ``benchmarks/`` are linked in) and holds small synthetic datasets:

``data/train/*.parquet`` and ``data/valid/*.parquet``, with Criteo-like columns
(``label``, ``I1..I13``, ``C1..C26``).

A block preceded by ``<!-- requires: torch -->`` (or tensorflow, dask, gpu, torch-cuda,
torchrun, horovod, several names separated by spaces) is skipped where that is missing, like the
tests marked so; the page says in words what the block needs. ``requires: install``
marks ``pip install`` commands, and ``requires: fresh-process`` set-up that must come
first in a process (allocators); tests never run those (the CI install step runs their
equivalent from this checkout). A block preceded by ``<!-- skip-test: why -->`` never
runs here (a server that does not stop, a cluster); the reason is required and says why.
Every other block runs as written.
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tabloader.synthetic import write_criteo_like

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(
    r"(?:<!--\s*requires:\s*(?P<requires>[^>]*?)\s*-->\s*\n)?"
    r"(?:<!--\s*skip-test:(?P<skip>[^>]*?)-->\s*\n)?"
    r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^```",
    re.MULTILINE | re.DOTALL,
)
VENV_BIN = Path(sys.executable).parent


def _available(requirement: str) -> bool:
    if requirement in ("install", "fresh-process"):
        return False
    if requirement == "gpu":  # the GPU backend can run: cudf and cupy, and a GPU
        from tabloader.backends.gpu import gpu_usable

        return gpu_usable()
    if requirement == "torch-cuda":  # PyTorch built with CUDA, and a GPU
        try:
            import torch

            return bool(torch.cuda.is_available())
        except Exception:
            return False
    if requirement == "torchrun":  # the environment's own, like the blocks' PATH below
        return (
            shutil.which("torchrun", path=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}") is not None
        )
    return importlib.util.find_spec(requirement) is not None


def blocks(page: Path) -> list[tuple[str, str, list[str]]]:
    """The page's runnable blocks: language, code, requirements (``skip-test`` blocks left out)."""
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        if m["lang"] not in ("python", "bash", "console"):
            continue
        if m["skip"] is not None:
            assert m["skip"].strip(), f"{page.name}: a skip-test comment must say why"
            continue
        found.append((m["lang"], m["code"], (m["requires"] or "").split()))
    return found


PAGES = sorted(p for p in DOCS.rglob("*.md") if blocks(p))


@pytest.fixture(scope="module")
def sample_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("docs-data")
    write_criteo_like(root / "data" / "train", rows=6_000, files=3, row_group_size=1_000)
    write_criteo_like(root / "data" / "valid", rows=2_000, files=1, row_group_size=1_000, seed=1)
    return root


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_code_blocks_run(page, sample_data, tmp_path, monkeypatch):
    workdir = tmp_path / "work"
    shutil.copytree(sample_data, workdir)
    for name in ("examples", "benchmarks"):
        (workdir / name).symlink_to(ROOT / name)
    monkeypatch.chdir(workdir)
    monkeypatch.setenv(
        "PYTHONPATH", str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    namespace: dict[str, object] = {"__name__": "__docs__"}
    ran = 0
    for lang, code, requires in blocks(page):
        missing = [r for r in requires if not _available(r)]
        if missing:
            continue
        if lang == "python":
            exec(compile(code, f"{page.name} block", "exec"), namespace)
        else:
            commands = "\n".join(
                line[2:] if line.startswith("$ ") else line for line in code.splitlines()
            )
            result = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", commands],
                capture_output=True,
                text=True,
                env={**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"},
                timeout=300,
            )
            assert result.returncode == 0, f"{page.name}:\n{commands}\n{result.stderr[-3000:]}"
        ran += 1
    if not ran:
        pytest.skip("every block on this page needs something missing here")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The documentation site, built once with ``--strict`` (a warning fails the build)."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("needs mkdocs: pip install 'tabloader[docs]'")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def test_the_site_builds_strictly(site):
    assert (site / "index.html").exists()
    assert (site / "reference" / "index.html").exists()


SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|exc|data|obj|ref|const):`?[\w.~]")
LITERAL_BLOCK = re.compile(r"\w::(?:\s|$)")


def unrendered_markup(page_html: str) -> list[str]:
    """Sphinx markup that reached a page as text (``:class:Loader``, ``keeps working::``):
    the docstrings are Markdown for mkdocstrings, which renders neither."""
    text = html.unescape(re.sub(r"<pre[^>]*>.*?</pre>", " ", page_html, flags=re.S))
    text = re.sub(r"<[^>]+>", "", text)
    return [m.group(0) for m in (*SPHINX_ROLE.finditer(text), *LITERAL_BLOCK.finditer(text))]


def test_the_markup_check_finds_an_unrendered_role():
    assert unrendered_markup("<p>see :class:<code>Loader</code> and :func:`plan`</p>") == [
        ":class:L",
        ":func:`p",
    ]
    assert unrendered_markup("<p>keeps working::</p>") == ["g::"]
    assert unrendered_markup('<p>see <a href="#tabloader.Loader"><code>Loader</code></a></p>') == []
    assert unrendered_markup("<pre><code>a:: :class:`x`</code></pre>") == []  # code blocks


def test_no_page_shows_unrendered_markup(site):
    found = {
        str(page.relative_to(site)): unrendered_markup(page.read_text())
        for page in site.rglob("*.html")
    }
    assert not {page: hits for page, hits in found.items() if hits}


def test_docstrings_hold_no_sphinx_markup():
    """Caught here too for modules the reference does not render."""
    found = []
    for path in sorted((ROOT / "src" / "tabloader").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if SPHINX_ROLE.search(line) or re.search(r"\S::$", line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_reference_renders_every_public_class_and_function(site):
    hooks = _load_hooks()
    pages = {
        path.parent.name: path.read_text() for path in (site / "reference").glob("*/index.html")
    }
    anchors = {a for page in pages.values() for a in re.findall(r'id="(tabloader[\w.]*)"', page)}
    import tabloader

    wanted = [f"tabloader.{name}" for name in tabloader.__all__ if not name.startswith("_")]
    wanted = [
        f"tabloader.errors.{n.split('.')[-1]}"
        if n.split(".")[-1] in tabloader.errors.__all__
        else n
        for n in wanted
    ]
    for module in hooks.public_modules():
        wanted += [f"{module}.{name}" for name in hooks.declared_names(hooks.module_path(module))]
    missing = sorted(set(wanted) - anchors)
    assert not missing, f"the API reference lacks {missing}"
    for adapter in ("tabloader.torch.TorchAsyncItr", "tabloader.torch.DLDataLoader"):
        assert adapter in wanted
    for adapter in ("KerasSequenceLoader", "KerasSequenceValidater"):
        assert f"tabloader.tensorflow.{adapter}" in wanted
    assert "tabloader.convert.convert" in wanted  # a package: its __init__'s names
    # one page per public class, the plumbing left out
    for name in ("Dataset", "Loader", "LoaderOptions", "LoaderStats", "BatchIterator"):
        assert f'id="tabloader.{name}"' in pages[name]
    assert 'id="tabloader.Loader"' not in pages["Dataset"]
    for page, members in hooks.INTERNAL.items():
        for member in members:
            assert f"tabloader.{page}.{member}" not in anchors
    # grouped keywords are parameter tables, and Dataset's list of sources a list
    dataset = pages["Dataset"]
    dataset = dataset[
        dataset.index('id="tabloader.Dataset"') : dataset.index('id="tabloader.Dataset.num_rows"')
    ]
    assert dataset.count("<table>") >= 3 and "<ul>" in dataset
    for title in ("A directory that changes", "Object storage"):
        assert title in dataset
    loader = pages["Loader"]
    for title in ("What to read", "How to batch", "How to shuffle", "Caching", "Distributed"):
        assert title in loader
    assert loader.count("<table>") >= 6
    overview = (site / "reference" / "index.html").read_text()
    assert all(f'href="{name}/"' in overview for name in pages)


def _load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_picks_up_a_new_adapter_module(tmp_path, monkeypatch):
    hooks = _load_hooks()
    package = tmp_path / "tabloader"
    package.mkdir()
    (package / "__init__.py").write_text('__all__ = ["Dataset", "Loader", "NewError"]\n')
    (package / "errors.py").write_text('__all__ = ["NewError"]\n')
    (package / "keras.py").write_text('"""Keras 3."""\n__all__ = ["Loader"]\n')
    (package / "convert").mkdir()
    (package / "convert" / "__init__.py").write_text('__all__ = ["convert"]\n')
    monkeypatch.setattr(hooks, "PACKAGE", package)
    pages = hooks.reference_pages()
    assert list(pages) == [
        "reference/index.md",
        "reference/Dataset.md",
        "reference/Loader.md",
        "reference/keras.md",
        "reference/convert.md",
        "reference/errors.md",
    ]
    assert "::: tabloader.keras\n" in pages["reference/keras.md"]
    assert '- "!^resume_cursor$"' in pages["reference/Loader.md"]
    assert "[`tabloader.Dataset`](Dataset.md)" in pages["reference/index.md"]
    assert "tabloader.torch" not in "".join(pages.values())  # no module, no page
    nav = [{"Home": "index.md"}, {"API reference": "reference/index.md"}]
    hooks.on_config({"nav": nav})
    assert nav[1]["API reference"][0] == {"Overview": "reference/index.md"}
    assert {"keras": "reference/keras.md"} in nav[1]["API reference"]


def test_a_module_that_takes_its_names_from_another_has_them_in_the_reference(
    tmp_path, monkeypatch
):
    hooks = _load_hooks()
    package = tmp_path / "tabloader"
    package.mkdir()
    (package / "keras.py").write_text('__all__ = ["KerasSequenceLoader"]\n')
    (package / "tensorflow.py").write_text(
        "from tabloader.keras import *\nfrom tabloader.keras import __all__ as __all__\n"
    )
    monkeypatch.setattr(hooks, "PACKAGE", package)
    names = hooks.declared_names(hooks.module_path("tabloader.tensorflow"))
    assert names == ["KerasSequenceLoader"]


def test_the_docs_name_every_framework():
    """The frameworks of `tabloader.frameworks` are the docs' frameworks: a guide and a
    reference page per adapter, and docs/gpu.md names each adapter selftest checks."""
    from tabloader.frameworks import FRAMEWORKS, framework_titles

    hooks = _load_hooks()
    nav = (ROOT / "mkdocs.yml").read_text()
    for framework in FRAMEWORKS:
        assert framework.name in hooks.MODULES
        assert f"  - {framework.title}: " in nav
    selftest = " ".join((DOCS / "gpu.md").read_text().split())
    assert f"the {framework_titles()} adapters" in selftest


def test_skip_test_comments_leave_their_block_out(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- skip-test: the server runs until stopped -->\n```bash\nmkdocs serve\n```\n\n"
        "<!-- requires: torch -->\n```python\nimport torch\n```\n\n"
        "```bash\ntabloader --version\n```\n"
    )
    assert blocks(page) == [
        ("python", "import torch\n", ["torch"]),
        ("bash", "tabloader --version\n", []),
    ]
    page.write_text("<!-- skip-test: -->\n```bash\nmkdocs serve\n```\n")
    with pytest.raises(AssertionError, match="must say why"):
        blocks(page)


def test_ci_runs_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^python -m pip install .*$", readme, re.MULTILINE)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci  # the README's second command, as CI runs it
    assert commands[0].endswith("python examples/criteo/train_torch.py --synthetic")


def test_the_test_command_installs_every_package_with_its_dependencies():
    """pip reports a broken environment (a red ``ERROR: pip's dependency resolver``) on
    every install after a package installed without its dependencies: the test command
    installs none that way, and says how long the suite takes and how to run less."""
    readme = (ROOT / "README.md").read_text()
    command = re.findall(r"^python -m pip install .*$", readme, re.MULTILINE)[1]
    steps = [step.strip() for step in command.split("&&")]
    assert not [step for step in steps if "--no-deps" in step], steps
    assert steps[-1] == "python -m pytest"
    assert re.search(r"about \d+ minutes on two cores", readme)
    assert 'python -m pytest -m "not slow"' in readme
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "s3fs[boto3]" not in pyproject  # s3fs has no such extra: pip warns about it
    assert re.search(r'"boto3>=[\d.]+,<[\d.]+"', pyproject)  # no backtracking through boto3
