"""``tabloader selftest`` on the CPU: every check, and every framework's adapter, reported."""

from __future__ import annotations

import io
import re

from tabloader.cli import build_parser
from tabloader.frameworks import FRAMEWORKS, framework_titles
from tabloader.selftest import run_selftest


def test_selftest_checks_the_adapter_of_every_framework():
    out = io.StringIO()
    assert run_selftest("cpu", rows=2_000, out=out) == 0, out.getvalue()
    report = out.getvalue()
    for framework in FRAMEWORKS:  # PASS where it is installed, SKIP where not
        assert re.search(rf"^(PASS|SKIP)  {framework.title} adapter: ", report, re.M), report
    assert re.search(r"^0 failed, \d+ passed$", report, re.M), report


def test_selftest_checks_only_the_frameworks_asked_for():
    out = io.StringIO()
    assert run_selftest("cpu", rows=2_000, out=out, frameworks=["jax"]) == 0
    checked = re.findall(r"^\w+ +(\w+) adapter: ", out.getvalue(), re.M)
    assert checked == ["JAX"]


def test_bench_and_selftest_name_every_framework():
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    bench = next(a for a in commands["bench"]._actions if a.dest == "framework")
    assert list(bench.choices) == ["none", *(framework.name for framework in FRAMEWORKS)]
    for framework in FRAMEWORKS:
        assert f"{framework.name}: {framework.classes}" in bench.help
    assert f"the {framework_titles()} adapters" in " ".join(
        commands["selftest"].description.split()
    )


def test_selftest_passes_with_an_odd_number_of_rows():
    for rows in (1, 2_001):
        out = io.StringIO()
        assert run_selftest("cpu", rows=rows, out=out, frameworks=[]) == 0, out.getvalue()


def test_selftest_fails_a_loader_that_alters_values(monkeypatch):
    """The rows check compared the ids and dtypes only: a loader that shifted, zeroed or
    flipped every other column passed, and the adapter checks compare with it."""
    import numpy as np

    import tabloader
    from tabloader import selftest

    class Altering(tabloader.Loader):
        def __iter__(self):  # type: ignore[no-untyped-def]
            for batch in super().__iter__():
                yield {**batch, "x": np.where(np.isnan(batch["x"]), 0.0, batch["x"]).astype("f4")}

    monkeypatch.setattr(selftest.tabloader, "Loader", Altering)
    out = io.StringIO()
    assert run_selftest("cpu", rows=2_000, out=out, frameworks=[]) == 1
    assert re.search(
        r"^FAIL  every row exactly once: row \d+: x is 0\.0, written as nan", out.getvalue(), re.M
    ), out.getvalue()
