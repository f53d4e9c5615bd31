"""The ``tabloader`` command line."""

from __future__ import annotations

import numpy as np
import pytest

from tabloader.cli import _batches, _loader_options, build_parser, layout_warnings, main


def test_inspect_prints_files_row_groups_rows_and_schema(dataset_dir, capsys):
    paths = dataset_dir([[30, 20], [50]])
    assert main(["inspect", str(paths[0]).rsplit("/", 1)[0]]) == 0
    out = capsys.readouterr().out
    assert "100 rows in 3 row groups of 2 files" in out
    assert "rows per row group: min 20, median 30, max 50" in out
    assert "part-000.parquet  50 rows, 2 row groups" in out
    assert "  cat: int32" in out
    assert "warning: tiny row groups" in out


def test_inspect_warns_about_more_ranks_than_row_groups(dataset_dir, capsys):
    (path,) = dataset_dir([[100_000]])
    assert main(["inspect", path, "--ranks", "4"]) == 0
    out = capsys.readouterr().out
    assert "warning: more ranks (4) than row groups (1)" in out
    assert "tiny" not in out


def test_layout_warnings_flag_huge_row_groups():
    found = layout_warnings(np.array([10**6]), np.array([3 * 2**30]), ranks=1)
    assert found == [found[0]]
    assert found[0].startswith("huge row groups: the largest holds 3.0 GiB uncompressed")


def test_bench_runs_epochs_and_splits_the_time(dataset_dir, capsys):
    paths = dataset_dir([[300, 200]])
    code = main(
        [
            "bench",
            *paths,
            "--cats",
            "id,cat",
            "--conts",
            "x",
            "--labels",
            "label",
            "--batch-size",
            "64",
            "--epochs",
            "2",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "epoch 0: 500 rows" in out
    assert "epoch 1: 500 rows" in out
    assert "rows/s" in out
    assert "background: read" in out
    assert "input-bound" in out


@pytest.mark.parametrize("framework", ["none", "torch", "tensorflow"])
def test_bench_stored_order_reaches_the_loader(dataset_dir, framework):
    pytest.importorskip({"none": "numpy", "torch": "torch", "tensorflow": "tensorflow"}[framework])
    paths = dataset_dir([[100]])
    for extra, within in (([], True), (["--stored-order"], False)):
        args = build_parser().parse_args(
            ["bench", *paths, "--cats", "id", "--framework", framework, *extra]
        )
        _, loader = _batches(args, _loader_options(args))
        assert loader.shuffle_within_batch is within


def test_errors_are_reported_without_a_traceback(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "missing.parquet")]) == 2
    assert "tabloader: error:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench"])
