"""The benchmark script runs end to end on tiny datasets and reports what it promises."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def throughput(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import throughput

    yield throughput
    for name in ("throughput", "common", "plot"):
        sys.modules.pop(name, None)


@pytest.mark.slow
def test_every_case_runs_in_its_own_process_against_the_limit(throughput, tmp_path):
    out, table, doc = tmp_path / "report.json", tmp_path / "report.md", tmp_path / "doc.md"
    doc.write_text(f"# Before\n\n{throughput.DOC_BEGIN}\nold\n{throughput.DOC_END}\n\nAfter\n")
    report = throughput.main(
        [
            *("--sizes", "20000,40000"),
            *("--rows-per-file", "10000"),
            *("--row-group-size", "2500"),
            *("--batch-size", "2048"),
            *("--epochs", "2"),
            *("--soak-epochs", "4"),
            # the core cases, the shuffled disk caches, and one of each adapter's when its
            # framework is installed
            *(
                "--cases",
                "^Loader|ceiling|pandas \\+ permute|disk cache, shuffle|^TorchAsync.*, shuffle",
            ),
            *("--data", str(tmp_path / "data")),
            *("--json", str(out)),
            *("--table", str(table)),
            *("--doc", str(doc)),
        ]
    )
    assert json.loads(out.read_text())["config"]["sizes"] == "20000,40000"
    assert [s["rows"] for s in report["sizes"]] == [20000, 40000]
    assert [s["files"] for s in report["sizes"]] == [2, 4]
    for section in report["sizes"]:
        results = {r["name"]: r for r in section["results"]}
        limit = section["results"][0]
        assert limit["group"] == "limit" and limit["first_ratio"] == 1.0
        assert len(limit["runs"]) == 2  # before and after the cases
        for name in ("Loader, shuffle", "Loader, no shuffle", "Loader, shuffle, stacked [B, k]"):
            result = results[name]
            (run,) = result["runs"]
            assert run["rows"] == [section["rows"]] * 2  # whole epochs, each timed
            assert result["first_ratio"] > 0 and result["later_ratio"] > 0
            assert result["peak_rss"] >= max(run["rss_after_epoch"]) > 0
    first = {r["name"]: r for r in report["sizes"][0]["results"]}
    assert first["numpy.copyto of the decoded arrays (copy ceiling)"]["group"] == "ceiling"
    machine = report["machine"]
    assert machine["cpus"] >= 1 and len(machine["load_before"]) == 3
    assert len(report["soak"]["rss_after_epoch"]) == 4
    text = table.read_text()
    assert "| Loader, shuffle |" in text and "load average" in text
    assert "RSS over 4 epochs" in text
    # the cache goals, derived from the cases at both sizes
    assert re.search(r"\| Loader disk cache, shuffle, cached epochs \| >= 1.5 \| \d.* \| \d", text)
    writes = (
        r"\| Loader cache-writing epoch / streaming first epoch, shuffle \(time\) \| <= 1.3 \| \d"
    )
    assert re.search(writes, text)
    assert doc.read_text().startswith("# Before") and "| Loader, shuffle |" in doc.read_text()
    assert "old" not in doc.read_text() and doc.read_text().endswith("After\n")

    pytest.importorskip("matplotlib")
    import plot

    png = tmp_path / "report.png"
    plot.main([str(out), str(png)])
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_case_names_are_unique_and_modules_cheap_to_list(throughput, tmp_path):
    ctx = throughput.Context(["x.parquet"], ["c"], ["x"], ["y"], 8, 8)
    before = set(sys.modules)
    names = [c.name for c in throughput.collect_cases(ctx)]
    assert len(names) == len(set(names)) and "Loader, shuffle" in names
    heavy = {"torch", "tensorflow", "pandas", "cudf"} & (set(sys.modules) - before)
    assert not heavy, f"listing cases imported {heavy}"
