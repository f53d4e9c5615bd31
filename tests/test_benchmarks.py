"""The benchmark scripts run end to end on a small dataset and report what they promise."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def throughput(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import throughput

    yield throughput
    sys.modules.pop("throughput", None)


@pytest.mark.slow
def test_throughput_reports_every_case_against_the_limit(throughput, tmp_path):
    out = tmp_path / "report.json"
    report = throughput.main(
        [
            "--rows",
            "40000",
            "--files",
            "2",
            "--row-group-size",
            "5000",
            "--batch-size",
            "4096",
            "--rounds",
            "1",
            "--data",
            str(tmp_path / "data"),
            "--json",
            str(out),
        ]
    )
    results = {r["name"]: r for r in report["results"]}
    assert report["results"][0]["group"] == "limit"
    assert report["results"][0]["ratio_to_limit"] == 1.0
    for name in ("tabloader Loader, no shuffle", "tabloader Loader, shuffle"):
        assert results[name]["rows_per_second"] > 0
    assert any(r["group"] == "baseline" for r in report["results"])
    memory = report["memory"]
    assert memory["large"]["rows"] == 4 * memory["small"]["rows"]
    assert memory["large"]["peak"] > memory["large"]["baseline"]
    assert out.exists()

    pytest.importorskip("matplotlib")
    import plot

    png = tmp_path / "report.png"
    plot.main([str(out), str(png)])
    assert png.read_bytes()[:4] == b"\x89PNG"
