"""The ``tabloader`` command line: inspect as a preflight, bench, and the command's manners."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader
from tabloader.cli import build_parser, main
from tabloader.cli.bench import _batches, _loader_options
from tabloader.dataset import SMALL_ROW_GROUP_ROWS
from tabloader.inspection import compact_names, inspect_dataset, layout_warnings
from tabloader.progress import Progress
from tabloader.threads import thread_advice

ROOT = Path(__file__).resolve().parents[1]


def write(path: Path, table: pa.Table, row_group_size: int | None = None) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return str(path)


@pytest.fixture
def mixed(tmp_path):
    """Two files that agree, one whose ``user`` is double; a string, a list, nulls in x."""
    good = pa.table(
        {
            "user": pa.array([1, 2, 3, 4], pa.int64()),
            "x": pa.array([0.5, None, 1.5, None], pa.float32()),
            "name": ["a", "b", "c", "d"],
            "tags": [[1], [], [2, 3], [4]],
            "click": pa.array([0, 1, 0, 1], pa.int8()),
        }
    )
    write(tmp_path / "a.parquet", good)
    write(tmp_path / "b.parquet", good)
    odd = good.set_column(0, "user", pa.array([1.0, 2.0, 3.0, 4.0]))
    write(tmp_path / "c.parquet", odd)
    return tmp_path


# -- inspect ----------------------------------------------------------------------------


def test_inspect_prints_rows_row_groups_columns_and_suggestions(dataset_dir, capsys):
    paths = dataset_dir([[30, 20], [50]])
    assert main(["inspect", str(paths[0]).rsplit("/", 1)[0], "--batch-size", "40"]) == 0
    out = capsys.readouterr().out
    assert "100 rows in 3 row groups of 2 files" in out
    assert "rows per row group: min 20, median 30, max 50" in out
    assert "  cats         int64          id\n" in out
    assert "  cats         int32          cat\n" in out
    assert "  labels       int8           label\n" in out
    assert "nulls (from the footers): none" in out
    assert "per rank (--ranks 1, --batch-size 40): 100 rows, 3 batches (the last holds 20" in out
    assert "suggested columns: --cats id,cat --conts x --labels label" in out
    assert "ok: nothing here would make training fail" in out
    assert len(out.splitlines()) < 25  # one screen


def test_inspect_reports_every_problem_and_fails(mixed, capsys):
    assert main(["inspect", str(mixed / "*.parquet"), "--max-files", "1"]) == 1
    out = capsys.readouterr().out
    assert "12 rows in 3 row groups of 3 files" in out
    # each distinct schema, with the files that have it
    assert "schemas: 2 distinct ones" in out
    assert f"  schema 1: 2 files: {mixed / 'a.parquet'}, ...\n" in out
    assert f"  schema 2: 1 file: {mixed / 'c.parquet'}\n" in out
    assert "error: the files disagree on their schema (2 schemas)" in out
    assert "user is double (not int64): conflict" in out
    assert "  unsupported  string         name" in out
    assert "  list         list<element: int64> tags" in out
    assert "nulls (from the footers): x 6; not recorded for tags" in out  # [] is no null
    assert "warning: columns that cannot be loaded: name (string)" in out
    assert "suggested columns: --cats user --conts x --labels click" in out
    assert "with the suggested columns: column 'user' is double" in out


def test_inspect_checks_the_requested_columns(mixed, capsys):
    # a, b agree: the string column is only a problem once it is asked for
    files = [str(mixed / "a.parquet"), str(mixed / "b.parquet")]
    assert main(["inspect", *files, "--cats", "user", "--labels", "click"]) == 0
    assert "ok: nothing here" in capsys.readouterr().out
    assert main(["inspect", *files, "--conts", "name"]) == 1
    out = capsys.readouterr().out
    assert "error: with the requested columns: continuous column 'name' is string" in out
    assert main(["inspect", *files, "--conts", "x"]) == 1
    assert "column with null values and no fill value: 'x' in" in capsys.readouterr().out
    assert main(["inspect", *files, "--conts", "x", "--fill-null", "x=0.5"]) == 0
    assert "ok: nothing here" in capsys.readouterr().out
    assert main(["inspect", *files, "--cats", "nope"]) == 1
    assert "column 'nope' is not in" in capsys.readouterr().out


def test_inspect_counts_an_ids_fill_value_as_an_id(tmp_path, capsys):
    """The loader delivers a cat column's fill value for its nulls as an id: inspect sized
    the table for the stored ids only (4 rows for a fill of 1000: an IndexError in the
    embedding lookup) and said "ok" for a negative fill."""
    ids = pa.array([0, 1, None, 3], pa.int64())
    pq.write_table(pa.table({"user": ids, "label": [0.0, 1.0, 0.0, 1.0]}), tmp_path / "p.parquet")
    data = str(tmp_path / "p.parquet")
    flags = ["--cats", "user", "--labels", "label", "--json"]
    assert main(["inspect", data, *flags, "--fill-null", "user=1000"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ids"]["user"]["max"] == 1000 and report["ids"]["user"]["rows"] == 1001
    assert main(["inspect", data, *flags, "--fill-null", "user=2"]) == 0
    assert json.loads(capsys.readouterr().out)["ids"]["user"]["rows"] == 4  # within the ids
    assert main(["inspect", data, *flags, "--fill-null", "user=-1"]) == 1
    errors = json.loads(capsys.readouterr().out)["errors"]
    assert any("filled with -1, a negative id" in e for e in errors)
    full = str(tmp_path / "full.parquet")  # no nulls: the fill is never delivered
    pq.write_table(pa.table({"user": [0, 1], "label": [0.0, 1.0]}), full)
    assert main(["inspect", full, *flags, "--fill-null", "user=1000"]) == 0
    assert json.loads(capsys.readouterr().out)["ids"]["user"]["rows"] == 2


def test_schemas_that_disagree_only_outside_the_loaded_columns_are_a_warning(mixed, capsys):
    files = [str(mixed / "a.parquet"), str(mixed / "c.parquet")]  # user: int64 vs double
    assert main(["inspect", *files, "--conts", "x", "--labels", "click", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)  # x has nulls: that fails, not the schemas
    assert report["warnings"][0].startswith("the files disagree on their schema")
    assert report["errors"] == [
        f"with the requested columns: column with null values and no fill value: 'x' in "
        f"{files[0]} (row group 0) and 1 more partition(s). Fill them in the data, or pass "
        "fill_null={'x': 0} (any numbers) to the loader; on the command line, --fill-null x=0"
    ]
    assert main(["inspect", *files, "--labels", "click"]) == 0
    out = capsys.readouterr().out
    assert "warning: the files disagree on their schema (2 schemas)" in out
    assert "ok: nothing here would make training fail" in out


def test_inspect_fails_when_no_column_can_be_loaded(tmp_path, capsys):
    path = write(tmp_path / "names.parquet", pa.table({"name": ["a", "b"], "city": ["c", "d"]}))
    assert main(["inspect", path]) == 1
    out = capsys.readouterr().out
    assert "suggested columns: none (no numeric columns)" in out
    assert "error: with the suggested columns: no column can be loaded: none is numeric" in out


def test_inspect_fails_on_negative_ids_no_embedding_table_has(tmp_path, capsys):
    """The loader delivers negative ids as they are (they are valid int64): the embedding
    lookup of the training step is what fails, so inspect says so and fails."""
    table = pa.table(
        {"user": np.arange(100) - 1, "item": np.arange(100) % 5, "label": np.zeros(100)}
    )
    path = write(tmp_path / "negative.parquet", table)
    assert main(["inspect", path, "--cats", "user,item", "--labels", "label"]) == 1
    out = capsys.readouterr().out
    assert "error: column 'user' holds negative ids (as low as -1" in out
    assert "an embedding lookup fails" in out
    assert "item 0..4" in out and "ok: nothing here" not in out


def test_inspect_and_bench_say_what_is_wrong_with_a_flag_or_a_text_file(tmp_path, capsys):
    """A malformed --filter is the user's mistake, said as such (it was reported as a
    failure without a message of its own); bench on a CSV points to convert, as inspect
    does (it called the file a truncated parquet file)."""
    path = write(tmp_path / "d.parquet", pa.table({"day": [1, 2], "label": [0.0, 1.0]}))
    assert main(["inspect", path, "--filter", "day"]) == 2
    err = capsys.readouterr().err
    assert "--filter: a filter is COLUMN OP VALUE" in err and "please report" not in err
    src = tmp_path / "clicks.csv"
    src.write_text("user,label\n1,1\n")
    assert main(["bench", str(src), "--cats", "user", "--labels", "label"]) == 2
    err = capsys.readouterr().err
    assert f"{src} is a CSV file; the loader reads parquet" in err
    assert "then tabloader bench DEST" in err


def test_inspect_reports_rows_and_batches_per_rank(dataset_dir, capsys):
    (path,) = dataset_dir([[1000]])
    assert main(["inspect", path, "--ranks", "3", "--batch-size", "100"]) == 0
    out = capsys.readouterr().out
    assert "per rank (--ranks 3, --batch-size 100): 333 rows, 4 batches (the last holds 33" in out
    assert "warning: more ranks (3) than row groups (1)" in out
    assert main(["inspect", path, "--ranks", "4", "--batch-size", "300", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["per_rank"] == {
        "ranks": 4,
        "batch_size": 300,
        "rows": 250,
        "batches": 1,
        "last_batch_rows": 250,
        "rows_left_over": 0,
    }
    assert any("fewer than one batch of 300" in w for w in report["warnings"])
    assert main(["inspect", path, "--ranks", "2000", "--json"]) == 0  # more ranks than rows
    report = json.loads(capsys.readouterr().out)
    assert report["per_rank"]["rows"] == 0
    assert any("every rank gets 0 rows" in w for w in report["warnings"])


def test_inspect_json_is_the_whole_report_for_machines(mixed, capsys):
    assert main(["inspect", str(mixed), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["files"] == 3
    assert report["rows"] == 12
    assert [len(s["files"]) for s in report["schemas"]] == [2, 1]
    assert report["schemas"][1]["columns"]["user"] == "double"
    columns = {c["name"]: c for c in report["columns"]}
    assert columns["x"] == {"name": "x", "type": "float", "nulls": 6, "use": "conts"}
    assert columns["name"]["use"] == "unsupported"
    assert columns["tags"]["use"] == "list"
    assert report["suggested"] == {"cats": ["user"], "conts": ["x"], "labels": ["click"]}
    assert report["errors"][0].startswith("the files disagree on their schema")


def test_inspect_small_row_groups_use_the_loaders_threshold(dataset_dir, capsys):
    small = SMALL_ROW_GROUP_ROWS // 16
    (path,) = dataset_dir([[small] * 16])
    assert main(["inspect", path]) == 0
    assert f"warning: small row groups: the median row group holds {small:,} rows" in (
        capsys.readouterr().out
    )
    with pytest.warns(tabloader.PerformanceWarning, match=f"row groups hold {small:,} rows"):
        tabloader.Loader(path, cats=["id"], batch_size=10)
    # at the threshold, neither speaks
    (path,) = dataset_dir([[SMALL_ROW_GROUP_ROWS] * 16])
    assert main(["inspect", path]) == 0
    assert "small row groups" not in capsys.readouterr().out


def test_layout_warnings_flag_large_row_groups():
    found = layout_warnings(np.array([10**6]), np.array([3 * 2**30]), ranks=1)
    assert found == [found[0]]
    assert found[0].startswith("large row groups: the largest holds 3.0 GiB uncompressed")


def test_inspect_works_on_tables_too():
    table = pa.table({"user": [1, 2, 3], "rating": [0.5, 1.0, 2.0], "target": [0.0, 1.0, 1.0]})
    report = inspect_dataset(tabloader.Dataset(table), batch_size=2)
    assert report["suggested"] == {"cats": ["user"], "conts": ["rating"], "labels": ["target"]}
    assert report["errors"] == []


def test_compact_names_shortens_numbered_runs():
    assert compact_names([f"C{i}" for i in range(1, 27)]) == "C1..C26"
    assert compact_names(["a1", "a2", "b", "a3"]) == "a1, a2, b, a3"


def test_a_missing_path_is_an_error_without_a_traceback(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "missing.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tabloader: error: ")
    assert "missing.parquet" in err
    assert "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["bench"])


# -- bench ------------------------------------------------------------------------------


def test_bench_runs_epochs_and_splits_the_time(dataset_dir, capsys):
    paths = dataset_dir([[300, 200]])
    args = ["--cats", "id,cat", "--conts", "x", "--labels", "label"]
    code = main(["bench", *paths, *args, "--batch-size", "64", "--epochs", "2"])
    assert code == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(
        "measured: tabloader.Loader (an array per column) on cpu; 2 epochs of 500 rows "
        "(rank 0 of 1) in batches of 64; 2 cats, 1 cont, 1 label; shuffle on; cache none\n"
    )
    assert "epoch 0: 500 rows" in captured.out
    assert "epoch 1: 500 rows" in captured.out
    assert "throughput: " in captured.out and " rows/s, " in captured.out
    assert " batches/s over the 2 epochs, end to end" in captured.out
    assert "background: read" in captured.out
    assert "input-bound" in captured.out
    # not a terminal: plain lines, no bar redrawn with carriage returns
    assert "epoch 0: 500/500 rows in " in captured.err
    assert "\r" not in captured.err


@pytest.mark.parametrize("framework", ["none", "torch", "tensorflow", "jax"])
def test_bench_stored_order_reaches_the_loader(dataset_dir, framework):
    pytest.importorskip({"none": "numpy"}.get(framework, framework))
    paths = dataset_dir([[100]])
    for extra, within in (([], True), (["--stored-order"], False)):
        args = build_parser().parse_args(
            ["bench", *paths, "--cats", "id", "--framework", framework, *extra]
        )
        _, loader = _batches(args, _loader_options(args))
        assert loader.shuffle_within_batch is within


@pytest.mark.jax
def test_bench_times_list_columns_on_every_framework_and_counts_them_apart(tmp_path, capsys):
    """``--sparse`` alone runs with JaxLoader too (which always pads: --sparse-as-dense
    was passed as False and refused), and the report counts list columns apart from the
    cats."""
    lists = pa.array([[1, 2], [3], [], [4, 5, 6]] * 25, pa.list_(pa.int64()))
    table = pa.table({"u": np.arange(100), "genres": lists, "label": np.zeros(100)})
    path = write(tmp_path / "lists.parquet", table)
    argv = ["bench", path, "--cats", "u", "--sparse", "genres", "--labels", "label"]
    argv += ["--sparse-max", "genres=3", "--batch-size", "32", "--epochs", "1"]
    for framework in ("none", "jax"):
        assert main([*argv, "--framework", framework]) == 0, framework
        assert "; 1 cat, 1 label, 1 list column; " in capsys.readouterr().out


@pytest.mark.jax
def test_bench_times_the_jax_loader(dataset_dir, capsys):
    paths = dataset_dir([[300, 200]])
    argv = ["bench", *paths, "--cats", "id", "--labels", "label", "--batch-size", "64"]
    assert main([*argv, "--framework", "jax"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("measured: JaxLoader (jax.Array per column, on the loader's JAX ")
    assert "epoch 0: 500 rows in " in out


def test_bench_without_torch_says_how_to_install_it(dataset_dir):
    (path,) = dataset_dir([[100]])
    code = (
        "import sys; sys.modules['torch'] = None\n"  # what a missing package looks like
        "from tabloader.cli import main\n"
        f"sys.exit(main(['bench', {path!r}, '--cats', 'id', '--framework', 'torch']))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr == (
        "tabloader: error: tabloader.torch needs PyTorch: pip install 'tabloader[torch]'\n"
    )


def test_thread_oversubscription_is_named_with_what_to_set():
    advice = thread_advice(2, 2)
    assert advice is not None
    assert "PyTorch uses 2 intra-op threads and the loader 2 background threads on 2 cores" in (
        advice
    )
    assert "torch.set_num_threads(1) or set OMP_NUM_THREADS=1" in advice
    assert "OMP_NUM_THREADS=6" in (thread_advice(8, 8) or "")
    assert thread_advice(6, 8) is None
    # the advice followed already: nothing left to lower, nothing said
    assert thread_advice(1, 2) is None and thread_advice(1, 1) is None


@pytest.mark.torch
def test_bench_with_torch_warns_when_threads_oversubscribe(dataset_dir, capsys):
    import torch

    from tabloader.threads import usable_cores

    (path,) = dataset_dir([[100]])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(usable_cores())
        assert main(["bench", path, "--cats", "id", "--framework", "torch"]) == 0
        assert "tabloader: warning: PyTorch uses" in capsys.readouterr().err
        torch.set_num_threads(1)
        if usable_cores() >= 3:
            assert main(["bench", path, "--cats", "id", "--framework", "torch"]) == 0
            assert "warning" not in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)


# -- progress and manners -----------------------------------------------------------------


def test_progress_off_a_terminal_writes_a_line_per_interval_and_one_at_the_end():
    out = io.StringIO()
    with Progress(300, desc="epoch 3", stream=out, interval=0.0) as bar:
        bar.update(100)
        bar.update(200)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("epoch 3: 100/300 rows after ")
    assert lines[1].startswith("epoch 3: 300/300 rows after ")
    assert lines[2].startswith("epoch 3: 300/300 rows in ")
    assert all(line.endswith(" rows/s)") for line in lines)
    quiet = io.StringIO()
    with Progress(300, desc="e", stream=quiet, interval=3600) as bar:
        for _ in range(100):
            bar.update(3)
    assert len(quiet.getvalue().splitlines()) == 1  # not one line per batch


def test_progress_on_a_terminal_redraws_a_few_times_a_second():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    with Progress(10_000, desc="epoch 0", stream=out) as bar:
        assert bar._bar.mininterval == 0.25
        for _ in range(1000):
            bar.update(10)
    text = out.getvalue()
    assert "\r" in text
    assert text.count("\r") < 20  # 1000 batches in well under a second: a few redraws
    assert "10.0k/10.0k" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "x", "--batch-size", "0"], "--batch-size: must be a positive integer, got '0'"),
        (["bench", "x", "--epochs", "two"], "--epochs: must be an integer, got 'two'"),
        (["inspect", "x", "--ranks", "-1"], "--ranks: must be a positive integer, got '-1'"),
        (["bench", "x", "--seed", "-3"], "--seed: must be a non-negative integer, got '-3'"),
    ],
)
def test_numbers_on_the_command_line_are_checked(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_version_and_examples_in_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"tabloader {tabloader.__version__}\n"
    for argv in (["--help"], ["inspect", "--help"], ["bench", "--help"], ["convert", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "examples:\n  tabloader " in capsys.readouterr().out


@pytest.mark.slow
def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    # 200 files with 200 schemas: a report far longer than a pipe's buffer
    for i in range(200):
        table = pa.table({f"f{i}_{j}": pa.array(range(10), pa.int64()) for j in range(50)})
        write(tmp_path / f"part-{i:03d}.parquet", table)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(
        f"{sys.executable} -m tabloader.cli inspect {tmp_path} --max-files 1000 | head -n 2",
        shell=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.stdout.splitlines() == [
        "2,000 rows in 200 row groups of 200 files",
        "rows per row group: min 10, median 10, max 10; median 0.0 MiB uncompressed",
    ]
    assert result.stderr == ""  # no BrokenPipeError traceback


# -- help that shows no markup, and every flag's default -------------------------------------


def _subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


@pytest.mark.smoke
def test_help_shows_no_markup_and_every_command_has_a_description(capsys):
    import re

    markup = re.compile(r"``|:(class|func|meth|attr|mod|exc|data|obj):`|\.\. [a-z]+::")
    with pytest.raises(SystemExit):
        main(["--help"])
    assert not markup.search(capsys.readouterr().out)
    for name, sub in _subparsers(build_parser()):
        assert sub.description and len(sub.description) > 40, name
        with pytest.raises(SystemExit):
            main([name, "--help"])
        assert not markup.search(capsys.readouterr().out), name


@pytest.mark.smoke
def test_every_flag_has_help_that_shows_its_default():
    for name, sub in _subparsers(build_parser()):
        formatter = sub._get_formatter()
        for action in sub._actions:
            if not action.option_strings or action.dest == "help":
                continue
            text = formatter._get_help_string(action)
            assert action.help, f"{name} {action.option_strings[0]} has no help"
            assert "default" in text, f"{name} {action.option_strings[0]}: {text!r}"


# -- bench: every loader keyword a user needs, on the command line ---------------------------


@pytest.fixture
def user_data(tmp_path):
    """A user's data as it comes: nulls in a cont and a cat, a list column, a string."""
    rng = np.random.default_rng(0)
    n = 600
    price = rng.random(n)
    table = pa.table(
        {
            "user": pa.array([None if i % 50 == 0 else i % 97 for i in range(n)], pa.int64()),
            "item": pa.array(rng.integers(0, 30, n), pa.int32()),
            "price": pa.array([None if i % 7 == 0 else p for i, p in enumerate(price)]),
            "tags": pa.array([[i % 5, i % 3] for i in range(n)], pa.list_(pa.int64())),
            "city": [f"c{i % 4}" for i in range(n)],
            "click": pa.array(rng.integers(0, 2, n), pa.int8()),
        }
    )
    write(tmp_path / "data" / "part-0.parquet", table.slice(0, 300), row_group_size=100)
    write(tmp_path / "data" / "part-1.parquet", table.slice(300), row_group_size=100)
    return str(tmp_path / "data")


def bench_loader(path, *flags):
    args = build_parser().parse_args(["bench", path, *flags])
    args.path = args.path[0]
    dataset = tabloader.Dataset(args.path)
    return _batches(args, _loader_options(args, dataset))[1]


def test_bench_with_nulls_needs_fill_null_and_says_how_to_give_it(user_data, capsys):
    assert main(["bench", user_data, "--batch-size", "64"]) == 2
    err = capsys.readouterr().err
    assert "tabloader: loading the suggested columns: --cats user,item --conts price" in err
    assert "2 columns with null values and no fill value: 'user' in" in err
    assert "fill_null={'user': 0, 'price': 0}" in err
    assert "on the command line, --fill-null user=0,price=0\n" in err
    assert main(["bench", user_data, "--batch-size", "64", "--fill-null", "0"]) == 0
    out = capsys.readouterr().out
    assert "--fill-null 0" in out.splitlines()[0]
    loader = bench_loader(user_data, "--fill-null", "user=0,price=-1")
    assert loader.fill_null == {"user": 0.0, "price": -1.0}
    with pytest.raises(tabloader.InvalidArgumentError, match="--fill-null price must be a number"):
        bench_loader(user_data, "--fill-null", "user=0,price=x")


@pytest.mark.parametrize(
    ("flags", "check"),
    [
        (
            ["--columns", "item,price,click"],
            lambda ld: (ld.cats, ld.conts, ld.labels) == (("item",), ("price",), ("click",)),
        ),
        (["--cats", "item", "--labels", "click"], lambda ld: ld.cats == ("item",) and not ld.conts),
        (
            ["--shuffle", "global", "--cache", "memory"],
            lambda ld: (
                ld.shuffle == "global" and ld.cache is not None and ld.cache.mode == "memory"
            ),
        ),
        (["--shuffle", "false"], lambda ld: not ld.shuffle),
        (["--no-shuffle"], lambda ld: not ld.shuffle),
        (["--stored-order"], lambda ld: not ld.shuffle_within_batch),
        (["--sparse", "tags"], lambda ld: ld.sparse_names == ("tags",)),
        (
            ["--sparse", "tags", "--sparse-max", "tags=2", "--sparse-as-dense"],
            lambda ld: ld.sparse_as_dense and ld.sparse_max == {"tags": 2},
        ),
        (["--device", "cpu"], lambda ld: str(ld.device) == "cpu"),
        (["--drop-last", "--batch-size", "256"], lambda ld: ld.drop_last and len(ld) == 2),
        (["--chunk-rows", "200"], lambda ld: ld.chunk_rows == 200),
        (["--parts-per-chunk", "3"], lambda ld: ld.parts_per_chunk == 3),
        (["--prefetch", "2"], lambda ld: ld.prefetch == 2),
        (["--ranks", "3", "--rank", "2"], lambda ld: (ld.global_rank, ld.global_size) == (2, 3)),
        (["--seed", "7"], lambda ld: ld.seed == 7),
        (
            ["--cat-dtype", "int32", "--cont-dtype", "float64", "--label-dtype", "int8"],
            lambda ld: (
                [str(ld.dtypes[c]) for c in ("item", "price", "click")]
                == ["int32", "float64", "int8"]
            ),
        ),
        (
            ["--cache", "disk", "--cache-max-bytes", "1000000"],
            lambda ld: ld.cache is not None and ld.cache.mode == "disk",
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_bench_flags_reach_the_loader(user_data, tmp_path, monkeypatch, flags, check):
    monkeypatch.setenv("TABLOADER_CACHE_DIR", str(tmp_path / "cache"))
    base = ["--batch-size", "100", "--fill-null", "0"]
    if not any(f in flags for f in ("--columns", "--cats")):
        base += ["--cats", "item", "--conts", "price", "--labels", "click"]
    assert check(bench_loader(user_data, *base, *flags))


def test_bench_runs_with_a_disk_cache_and_says_so(user_data, tmp_path, capsys):
    flags = [
        "--fill-null",
        "0",
        "--batch-size",
        "128",
        "--epochs",
        "2",
        "--cache",
        "disk",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--shuffle",
        "global",
    ]
    assert main(["bench", user_data, *flags]) == 0
    out = capsys.readouterr().out
    assert "shuffle global; cache disk; --fill-null 0" in out
    assert "1 epoch(s) from the cache" in out
    assert any((tmp_path / "cache").iterdir())


def test_bench_columns_are_checked_like_the_loaders(user_data, capsys):
    assert main(["bench", user_data, "--columns", "prcie"]) == 2
    assert "did you mean 'price'?" in capsys.readouterr().err
    assert main(["bench", user_data, "--columns", "city,item"]) == 2
    assert "--columns city: not numeric" in capsys.readouterr().err
    assert main(["bench", user_data, "--columns", "item", "--cats", "item"]) == 2
    assert "give --columns or --cats/--conts/--labels, not both" in capsys.readouterr().err


@pytest.mark.gpu
def test_bench_on_the_gpu(user_data, capsys):
    flags = ["--device", "cuda", "--fill-null", "0", "--cats", "item", "--conts", "price"]
    assert main(["bench", user_data, *flags, "--batch-size", "128"]) == 0
    assert " on cuda:0; " in capsys.readouterr().out


# -- inspect: ids and widths ------------------------------------------------------------------


def test_inspect_reports_ids_and_embedding_sizes(user_data, tmp_path, capsys):
    assert main(["inspect", user_data, "--batch-size", "64"]) == 1  # nulls, without a fill
    out = capsys.readouterr().out
    assert "ids (min..max, distinct -> embedding rows x width, float32 bytes; " in out
    assert "  user 0..96, 97 distinct -> 97 x 21, 8.0 KiB\n" in out
    assert "  item 0..29, 30 distinct -> 30 x 16, 1.9 KiB\n" in out
    bare = tmp_path / "bare.parquet"
    pq.write_table(pq.read_table(user_data), bare, write_statistics=["item"], row_group_size=200)
    # without statistics the footers cannot tell the nulls either: they are counted
    assert main(["inspect", str(bare), "--cats", "user,item", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any("null value(s) (counted in the data" in e for e in report["errors"])
    ids = report["ids"]
    assert ids["user"] == {
        "min": 0,
        "max": 96,
        "distinct": 97,
        "rows": 97,
        "width": 21,
        "bytes": 97 * 21 * 4,
        "vocabulary": False,
        "row_groups_read": 3,
        "row_groups": 3,
    }
    assert ids["item"]["row_groups_read"] == 0
    assert main(["inspect", str(bare), "--cats", "user,item"]) == 1
    assert (
        "  no statistics in the footers, so read to find the ids: user (3 of 3 row groups)\n"
        in capsys.readouterr().out
    )


def test_inspect_tells_widths_that_mix_from_conflicts(tmp_path, capsys):
    a = write(
        tmp_path / "a.parquet",
        pa.table({"user": pa.array([1, 2], pa.int32()), "x": pa.array([0.5, 1.0], pa.float32())}),
    )
    b = write(
        tmp_path / "b.parquet",
        pa.table({"user": pa.array([3, 4], pa.int64()), "x": pa.array([0.5, 1.0], pa.float64())}),
    )
    assert main(["inspect", a, b]) == 0
    out = capsys.readouterr().out
    assert "note: the files store some columns with other widths (2 schemas)" in out
    assert "user is int64 (not int32): widened to int64" in out
    assert "x is double (not float): widened to double" in out
    assert "ok: nothing here would make training fail" in out
    c = write(tmp_path / "c.parquet", pa.table({"user": ["u"], "x": [0.5]}))
    assert main(["inspect", a, b, c]) == 1
    out = capsys.readouterr().out
    assert "user is string (not int32): conflict" in out
    assert "error: the files disagree on their schema (3 schemas)" in out


# -- convert on the command line --------------------------------------------------------------


@pytest.fixture
def raw(tmp_path):
    path = tmp_path / "raw" / "clicks.csv"
    path.parent.mkdir()
    lines = ["user,price,label"] + [f"{i},{i / 8},{i % 2}" for i in range(1_000)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.smoke
def test_convert_writes_splits_and_says_rows_in_and_out(raw, tmp_path, capsys):
    dest = tmp_path / "data"
    assert main(["convert", str(raw), str(dest), "--split", "valid=0.2", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # --quiet: not even the progress line
    lines = captured.out.splitlines()
    assert lines[0] == "converted 1 file: 1,000 rows in, 1,000 rows out"
    train, valid = (int(line.split()[1].replace(",", "")) for line in lines[1:3])
    assert train + valid == 1_000 and lines[1].endswith(f"-> {dest}/train")
    assert "schema: int64 user, label; float price" in captured.out
    assert lines[-1] == f"next: tabloader inspect {dest}/train"
    assert len(tabloader.Dataset(str(dest / "valid"))) == valid
    assert main(["convert", str(raw), str(dest), "--split", "valid=0.2"]) == 2  # not empty
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "check"),
    [
        (["--format", "csv"], lambda t, r: t.num_rows == 1_000),
        (
            ["--no-header", "--names", "a,b,c", "--schema", "a=string"],
            lambda t, r: t.column_names == ["a", "b", "c"] and t.column("a")[0].as_py() == "user",
        ),
        (["--header", "--names", "a,b,c"], lambda t, r: t.column("a").to_pylist()[:2] == [0, 1]),
        (
            ["--schema", "user=int32,price=float64"],
            lambda t, r: t.schema.types[:2] == [pa.int32(), pa.float64()],
        ),
        (["--delimiter", ";"], lambda t, r: t.column_names == ["user,price,label"]),
        (["--row-group-rows", "300"], lambda t, r: r.metadata.row_group(0).num_rows == 300),
        (
            ["--rows-per-file", "500", "--row-group-rows", "250"],
            lambda t, r: r.metadata.num_rows == 500,
        ),
        (["--split", "valid=0.5", "--seed", "1"], lambda t, r: 0 < t.num_rows < 1_000),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_convert_flags(raw, tmp_path, flags, check):
    dest = tmp_path / "out"
    assert main(["convert", str(raw), str(dest), "--quiet", *flags]) == 0
    files = sorted(dest.rglob("*.parquet"))
    table = pq.read_table(files[0])
    assert check(table, pq.ParquetFile(files[0]))


def test_convert_overwrite_and_progress(raw, tmp_path, capsys):
    dest = tmp_path / "out"
    assert main(["convert", str(raw), str(dest)]) == 0
    assert capsys.readouterr().err.startswith("converting: ")  # one line, off a terminal
    assert main(["convert", str(raw), str(dest), "--overwrite", "--quiet"]) == 0
    assert len(tabloader.Dataset(str(dest))) == 1_000


def test_inspect_says_a_failure_it_has_no_message_for_in_one_line(dataset_dir, monkeypatch, capsys):
    (path,) = dataset_dir([[100]])

    def broken_reader(*args, **kwargs):
        raise pa.ArrowInvalid("a footer this reader has never seen")

    # (a stand-in for a dependency's failure that tabloader does not know yet)
    monkeypatch.setattr(tabloader.cli.inspect, "inspect_dataset", broken_reader)
    assert main(["inspect", path]) == 2
    error = capsys.readouterr().err
    assert error == (
        "tabloader: error: ArrowInvalid: a footer this reader has never seen (tabloader has no "
        "message of its own for this: please report it, with the command)\n"
    )
    monkeypatch.setattr(tabloader.cli.bench, "bench_columns", broken_reader)
    with pytest.raises(pa.ArrowInvalid):  # bench raises it as it is
        main(["bench", path, "--cats", "id"])


def test_inspect_warns_about_tables_above_the_budget_and_sizes_them_by_a_vocabulary(
    tmp_path, capsys
):
    from tabloader.convert import convert

    src = tmp_path / "clicks.csv"
    src.write_text("user_id,label\n" + "".join(f"{u},{u % 2}\n" for u in [3, 5_279_479] * 50))
    convert(str(src), tmp_path / "raw")
    assert main(["inspect", str(tmp_path / "raw")]) == 0
    out = capsys.readouterr().out
    assert "  user_id 3..5,279,479, 2 distinct -> 5,279,480 x 512, 10.1 GiB\n" in out
    assert (
        "warning: the embedding table of 'user_id' has 5,279,480 rows x 512 = 10.1 GiB of "
        "float32 weights (before the optimizer's state), above 1.0 GiB: its ids run to "
        "5,279,479 but only 2 are used. Give them contiguous ids with tabloader convert "
        "--categorify user_id (4 rows), or hash them (--hash user_id=BUCKETS)\n"
    ) in out
    convert(str(src), tmp_path / "ids", categorify="user_id")
    vocabulary = str(tmp_path / "ids" / "_vocabulary")
    assert main(["inspect", str(tmp_path / "ids"), "--vocabulary", vocabulary, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ids"]["user_id"]["rows"] == 4 and report["ids"]["user_id"]["vocabulary"]
    assert not [w for w in report["warnings"] if "embedding table" in w]
    # data converted without the vocabulary holds ids beyond it: said
    assert main(["inspect", str(tmp_path / "raw"), "--vocabulary", vocabulary, "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert any("beyond its vocabulary's 4 rows" in w for w in warnings)


def test_inspect_on_a_csv_file_points_to_convert(tmp_path, capsys):
    src = tmp_path / "clicks.csv"
    src.write_text("user,label\nu1,1\n")
    assert main(["inspect", str(src)]) == 2
    err = capsys.readouterr().err
    assert f"{src} is a CSV file; the loader reads parquet. Convert it first: " in err
    assert f"tabloader convert {src} DEST" in err


def test_text_and_time_columns_are_told_how_to_become_numbers(tmp_path, capsys):
    table = pa.table(
        {
            "country": ["fr", "de"],
            "seen": pa.array([0, 1], pa.timestamp("ms")),
            "price": [0.5, 1.5],
            "label": [0.0, 1.0],
        }
    )
    write(tmp_path / "t.parquet", table)
    assert main(["inspect", str(tmp_path / "t.parquet")]) == 0
    out = capsys.readouterr().out
    assert (
        "warning: columns that cannot be loaded: country (string): Give it integer ids with "
        "tabloader convert --categorify country (or --hash country=BUCKETS); seen "
        "(timestamp[ms]): Take its parts as integers with tabloader convert --time-parts "
        "seen=hour,dow (or epoch)\n"
    ) in out
    with pytest.raises(tabloader.ColumnTypeError) as info:
        tabloader.Loader(str(tmp_path / "t.parquet"), cats=["country"], batch_size=2)
    assert "tabloader convert --categorify country" in str(info.value)
    assert "conts" not in str(info.value)  # text is no measurement
    with pytest.raises(tabloader.ColumnTypeError, match="list it under conts"):
        tabloader.Loader(str(tmp_path / "t.parquet"), cats=["price"], batch_size=2)


def test_inspect_counts_the_nulls_footers_without_statistics_do_not_record(tmp_path, capsys):
    table = pa.table({"user": pa.array([1, None, 3, None]), "label": [1.0, 0.0, 1.0, 0.0]})
    path = str(tmp_path / "bare.parquet")
    pq.write_table(table, path, write_statistics=False)
    assert main(["inspect", path, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any("column 'user' has 2 null value(s) (counted" in e for e in report["errors"])
    assert {c["name"]: c["nulls"] for c in report["columns"]}["user"] == 2
    assert main(["inspect", path, "--fill-null", "user=0"]) == 0


def test_inspect_counts_the_nulls_the_loader_refuses_in_vectors_and_lists(tmp_path, capsys):
    """A list's footer counts its empty and null lists among its nulls: a vector with a
    null inside was "ok" (the footers recorded it, so it was taken for refused when the
    loader was built, which only refuses it reading), and a list of empty lists was
    reported with nulls it does not have."""
    vectors = pa.array([[1, 2], [3, None], [4, 5], [6, 7]], pa.list_(pa.int64(), 2))
    lists = pa.array([[1, 2], [], None, [3]], pa.list_(pa.int64()))
    labels = [0.0, 1.0, 0.0, 1.0]
    pq.write_table(pa.table({"v": vectors, "tags": lists, "label": labels}), tmp_path / "p.parquet")
    data = str(tmp_path / "p.parquet")
    assert main(["inspect", data, "--cats", "v", "--labels", "label", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any("column 'v' has 1 null value(s) (counted" in e for e in report["errors"])
    assert main(["inspect", data, "--cats", "v", "--labels", "label", "--fill-null", "v=0"]) == 0
    capsys.readouterr()
    assert main(["inspect", data, "--labels", "label", "--json"]) in (0, 1)
    nulls = {c["name"]: c["nulls"] for c in json.loads(capsys.readouterr().out)["columns"]}
    assert nulls["tags"] is None and nulls["v"] is None  # not told by the footers
    with pytest.raises(tabloader.NullValuesError, match="'v'"):
        list(tabloader.Loader(data, cats=["v"], labels=["label"], batch_size=2))
