"""mkdocs hook: the API reference lists the public API by itself.

``docs/reference.md`` holds a marker that this hook replaces with one ``:::`` entry per
name in ``tabloader.__all__`` and one per public module that exists (the framework
adapters, ``convert``, ``synthetic``, ``plan``, ``errors``): a class added to
``__all__``, or an adapter module added to the package, is in the reference without
editing it. The names are read from the sources, so building the docs imports nothing
(PyTorch, TensorFlow and cudf need not be installed).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "tabloader"
MARKER = "<!-- the public API: filled in by docs/hooks.py -->"
MODULES = ("torch", "keras", "tensorflow", "jax", "convert", "synthetic", "plan", "errors")
"""Public modules, in the order the reference shows them (those that exist)."""


def declared_names(path: Path) -> list[str]:
    """The names a module's ``__all__ = [...]`` lists (later ``+=`` are left out)."""
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            and isinstance(node.value, (ast.List, ast.Tuple))
        ):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return []


def public_modules() -> list[str]:
    """The public modules that exist, as ``tabloader.<name>``."""
    return [f"tabloader.{m}" for m in MODULES if (PACKAGE / f"{m}.py").is_file()]


def reference_markdown() -> str:
    """The ``:::`` entries of the whole public API."""
    top = [n for n in declared_names(PACKAGE / "__init__.py") if not n.startswith("_")]
    entries = ["## The `tabloader` package", ""]
    entries += [f"::: tabloader.{name}\n" for name in top]
    for module in public_modules():
        entries += [
            f"## `{module}`",
            "",
            f"::: {module}",
            "    options:",
            "      show_root_heading: false",
            "",
        ]
    return "\n".join(entries)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    return markdown.replace(MARKER, reference_markdown()) if MARKER in markdown else markdown
