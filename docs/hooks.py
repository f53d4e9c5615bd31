"""mkdocs hook: the API reference lists the public API by itself, one page per name.

The pages under ``reference/`` are generated, never written by hand: an overview
(``reference/index.md``), one page per name in ``tabloader.__all__`` (``Dataset``,
``Loader``, ...; the exceptions together on the ``errors`` page) and one per public
module that exists (the framework adapters, ``convert``, ``synthetic``, the epoch
plan's ``plan``, ``permutation`` and ``elastic``, ``errors``). A class added to
``__all__``, or an adapter module added to the package, gets its page and its place in
the navigation without editing anything. The names are
read from the sources, so building the docs imports nothing (PyTorch, TensorFlow and
cudf need not be installed).

Members that are the package's own plumbing (``INTERNAL``) stay out of the reference.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "tabloader"
MODULES = (
    "torch",
    "keras",
    "tensorflow",
    "jax",
    "convert",
    "synthetic",
    "plan",
    "permutation",
    "elastic",
    "errors",
)
"""Public modules, in the order the reference shows them (those that exist)."""
NAV_TITLE = "API reference"
INTERNAL = {
    "Dataset": ("open_row_groups", "check_worker_processes", "iter_pieces"),
    "Loader": ("check_state", "resume_cursor"),
}
"""Public members that only the package itself calls: left out of the reference."""


def declared_names(path: Path) -> list[str]:
    """The names a module's ``__all__ = [...]`` lists (later ``+=`` are left out), or
    those of the module it takes its ``__all__`` from (``from tabloader.keras import
    __all__``); a package's ``__init__.py`` for a package's directory."""
    if path.is_dir():
        path = path / "__init__.py"
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            and isinstance(node.value, (ast.List, ast.Tuple))
        ):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
        if isinstance(node, ast.ImportFrom) and any(a.name == "__all__" for a in node.names):
            return declared_names(module_path(node.module or ""))
    return []


def module_path(module: str) -> Path:
    """The file (or package directory) of ``tabloader.<name>``."""
    name = module.split(".", 1)[1]
    return PACKAGE / name if (PACKAGE / name).is_dir() else PACKAGE / f"{name}.py"


def public_modules() -> list[str]:
    """The public modules that exist, as ``tabloader.<name>``."""
    return [
        f"tabloader.{m}"
        for m in MODULES
        if (PACKAGE / f"{m}.py").is_file() or (PACKAGE / m / "__init__.py").is_file()
    ]


def reference_pages() -> dict[str, str]:
    """``{path under docs/: markdown}`` of every reference page, the overview first."""
    top = [
        n
        for n in declared_names(PACKAGE / "__init__.py")
        if not n.startswith("_") and n not in declared_names(PACKAGE / "errors.py")
    ]
    pages: dict[str, str] = {}
    overview = [
        "# API reference",
        "",
        "Everything `import tabloader` offers, a page each, then each public module: the "
        "framework adapters, the converter, the synthetic data, the epoch plan (its "
        "chunks' permutations, and the rest of an epoch dealt to another world) and the "
        "exceptions. Names not listed here are implementation details and may change.",
        "",
        "## The `tabloader` package",
        "",
    ]
    for name in top:
        pages[f"reference/{name}.md"] = _page(f"tabloader.{name}", name)
        overview.append(f"- [`tabloader.{name}`]({name}.md)")
    overview += ["", "## Modules", ""]
    for module in public_modules():
        short = module.split(".", 1)[1]
        pages[f"reference/{short}.md"] = _page(module, module, root_heading=False)
        overview.append(f"- [`{module}`]({short}.md)")
    return {"reference/index.md": "\n".join(overview) + "\n", **pages}


def _page(target: str, title: str, *, root_heading: bool = True) -> str:
    name = target.rsplit(".", 1)[-1]
    lines = [f"# `{title}`", "", f"::: {target}", "    options:"]
    lines.append(f"      show_root_heading: {'true' if root_heading else 'false'}")
    hidden = INTERNAL.get(name, ())
    if hidden:
        lines.append("      filters:")
        lines.append('        - "!^_"')
        lines += [f'        - "!^{member}$"' for member in hidden]
    return "\n".join(lines) + "\n"


def nav_entries() -> list[dict[str, str]]:
    """The navigation of the reference: the overview, then a page per name."""
    entries = []
    for path in reference_pages():
        title = "Overview" if path.endswith("index.md") else Path(path).stem
        entries.append({title: path})
    return entries


def on_config(config: Any, **kwargs: Any) -> Any:
    nav = config.get("nav") or []
    for k, item in enumerate(nav):
        if isinstance(item, dict) and NAV_TITLE in item:
            nav[k] = {NAV_TITLE: nav_entries()}
    return config


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    from mkdocs.structure.files import File

    for path, text in reference_pages().items():
        files.append(File.generated(config, path, content=text))
    return files
