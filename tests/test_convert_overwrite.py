"""tabloader convert --overwrite: the new set is written beside the old one and takes its
place only when complete; a failed or interrupted run (a real process, stopped with
SIGINT) leaves the old set whole; only the files a previous conversion wrote go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import tabloader
from tabloader.convert import convert

ROOT = Path(__file__).resolve().parents[1]


def write_rows(path: Path, rows: int, version: int, *, bad_last: bool = False) -> Path:
    lines = ["row,version,price"] + [f"{i},{version},{i / 4}" for i in range(rows)]
    if bad_last:
        lines.append("oops,not,a,row")
    path.write_text("\n".join(lines) + "\n")
    return path


def contents(dest: Path) -> dict[str, list[tuple[int, int]]]:
    """Every split's (row, version) pairs, as a loader would read them."""
    found = {}
    for split in ("train", "valid"):
        if (dest / split).is_dir():
            table = pq.read_table(sorted(str(p) for p in (dest / split).glob("*.parquet")))
            found[split] = sorted(
                zip(
                    table.column("row").to_pylist(),
                    table.column("version").to_pylist(),
                    strict=True,
                )
            )
    return found


def test_a_failed_conversion_leaves_the_old_set_whole(tmp_path):
    old = write_rows(tmp_path / "old.csv", 5_000, version=1)
    convert(str(old), tmp_path / "data", split="valid=0.2")
    before = contents(tmp_path / "data")
    files = sorted(p.relative_to(tmp_path / "data") for p in (tmp_path / "data").rglob("*"))
    # the malformed row lies past the first block of text, which decides the types
    new = write_rows(tmp_path / "new.csv", 1_500_000, version=2, bad_last=True)
    with pytest.raises(tabloader.InvalidFileError, match=r"new\.csv"):
        convert(str(new), tmp_path / "data", split="valid=0.2", overwrite=True)
    assert contents(tmp_path / "data") == before
    assert sum(len(v) for v in before.values()) == 5_000
    after = sorted(p.relative_to(tmp_path / "data") for p in (tmp_path / "data").rglob("*"))
    assert after == files  # no staging directory left behind either


def test_only_files_a_conversion_wrote_are_replaced(tmp_path):
    src = write_rows(tmp_path / "a.csv", 1_000, version=1)
    dest = tmp_path / "data"
    convert(str(src), dest, split="valid=0.2", categorify="version")
    assert (dest / "_vocabulary" / "version.parquet").is_file()
    # a new set without a split and without a vocabulary: the old splits' files go
    convert(str(write_rows(tmp_path / "b.csv", 10, version=2)), dest, overwrite=True)
    assert sorted(p.name for p in dest.iterdir()) == [
        ".tabloader-convert.json",
        "part-00000.parquet",
    ]
    assert pq.read_table(dest / "part-00000.parquet").column("version").to_pylist() == [2] * 10
    # a file convert did not write is never deleted: the destination is refused
    (dest / "mydata.parquet").write_bytes((dest / "part-00000.parquet").read_bytes())
    with pytest.raises(tabloader.InvalidArgumentError) as info:
        convert(str(src), dest, overwrite=True)
    assert "not empty ('mydata.parquet')" in str(info.value)
    assert "never deletes another file" in str(info.value)
    assert (dest / "mydata.parquet").is_file() and (dest / "part-00000.parquet").is_file()


@pytest.mark.slow
def test_a_signal_waits_for_the_swap_whichever_thread_the_system_gives_it_to():
    """While the files are swapped, SIGINT waits: also when the system delivers it to
    another thread of the process (pyarrow's, the loader's), whose handler Python runs in
    the main thread all the same. Blocking it in the main thread alone let it through,
    and an interrupted swap left the previous files in a hidden directory."""
    from tabloader.convert.output import _signals_held

    stop = threading.Event()
    other = threading.Thread(target=stop.wait)  # a thread that takes signals
    other.start()
    finished: list[str] = []

    def swap() -> None:
        with _signals_held():
            assert other.ident is not None
            signal.pthread_kill(other.ident, signal.SIGINT)  # the system's choice
            time.sleep(0.2)  # where a handler run now would interrupt the swap
            finished.append("swapped")
        time.sleep(0.2)  # where it runs: after the swap

    try:
        with pytest.raises(KeyboardInterrupt):
            swap()
    finally:
        stop.set()
        other.join()
    assert finished == ["swapped"]


def test_sigint_at_any_moment_leaves_the_old_set_or_the_new_one_whole(tmp_path):
    old = write_rows(tmp_path / "old.csv", 5_000, version=1)
    new = write_rows(tmp_path / "new.csv", 400_000, version=2)
    dest = tmp_path / "data"
    convert(str(old), dest, split="valid=0.2")
    old_set = contents(dest)
    command = [sys.executable, "-m", "tabloader.cli", "convert", str(new), str(dest),
               "--split", "valid=0.2", "--overwrite", "--quiet",
               "--row-group-rows", "20000"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

    def start() -> tuple[subprocess.Popen[str], float]:
        """A conversion, and when it began writing (its staging directory appeared)."""
        process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
        while not any(p.name.startswith(".tabloader-convert-") for p in dest.iterdir()):
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            time.sleep(0.005)
        return process, time.perf_counter()

    process, began = start()
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    writing = time.perf_counter() - began
    new_set = contents(dest)
    assert sum(len(v) for v in new_set.values()) == 400_000
    outcomes = []
    for k in range(10):
        convert(str(old), dest, split="valid=0.2", overwrite=True)
        assert contents(dest) == old_set
        process, _ = start()
        if k < 9:  # from the first rows written to the end, whatever this machine's pace
            time.sleep(writing * k / 8)
        else:  # and once after the end (a loaded machine may write slower than at first)
            process.wait(timeout=300)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=300)
        found = contents(dest)
        assert found in (old_set, new_set), f"run {k}: a mixed or partial set ({err})"
        outcomes.append(("old" if found == old_set else "new", process.returncode))
        if found == old_set:
            assert process.returncode == 130, err
            assert "interrupted; " in err and "is as it was" in err and "Traceback" not in err
        assert not [p for p in dest.iterdir() if p.name.startswith(".tabloader-convert-")]
    assert ("old", 130) in outcomes and ("new", 0) in outcomes, outcomes


def test_sigterm_leaves_nothing_behind_and_a_failure_no_directory_it_made(tmp_path):
    new = write_rows(tmp_path / "new.csv", 400_000, version=2)
    dest = tmp_path / "made" / "for" / "it"
    work = tmp_path / "work"
    work.mkdir()
    command = [sys.executable, "-m", "tabloader.cli", "convert", str(new), str(dest),
               "--split", "valid=0.2", "--categorify", "version", "--quiet",
               "--row-group-rows", "20000"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TMPDIR": str(work)}
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    while not (dest.is_dir() and any(dest.iterdir())):  # writing has begun
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        time.sleep(0.005)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 143 and "terminated" in err and "Traceback" not in err, err
    assert not (tmp_path / "made").exists() and not list(work.iterdir())
    bad = tmp_path / "bad.csv"
    bad.write_text("id,t\n1,2024-03-01 10:00:00\n2,yesterday\n")
    with pytest.raises(tabloader.InvalidFileError):
        convert(str(bad), tmp_path / "nested" / "a" / "b", time_parts={"t": ["hour"]})
    assert not (tmp_path / "nested").exists()


def test_a_destination_inside_a_source_directory_is_not_read_again(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    write_rows(logs / "day1.csv", 100, 1)
    first = convert(str(logs), str(logs / "parquet"))
    again = convert(str(logs), str(logs / "parquet"), overwrite=True)
    assert first.inputs == again.inputs == [str(logs / "day1.csv")]
    assert again.rows_out == {"": 100}
    table = pq.read_table(str(logs / "parquet"))
    assert sorted(table.column("row").to_pylist()) == list(range(100))
    # named itself, a file of the destination is read
    rebuilt = convert(
        str(logs / "parquet" / "part-00000.parquet"), str(logs / "parquet"), overwrite=True
    )
    assert rebuilt.rows_out == {"": 100}
