"""examples/criteo/convert.py: Criteo day files to the train/ and valid/ parquet the
training scripts read, through tabloader.convert."""

from __future__ import annotations

import gzip
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import tabloader

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"criteo_{name}", EXAMPLES / "criteo" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_day(path: Path, rows: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(rows):
        label = str(int(rng.random() < 0.3))
        ints = ["" if rng.random() < 0.2 else str(int(rng.integers(-2, 50))) for _ in range(13)]
        cats = ["" if rng.random() < 0.1 else f"{int(rng.zipf(1.5)) % 7:08x}" for _ in range(26)]
        lines.append([label, *ints, *cats])
    text = "".join("\t".join(line) + "\n" for line in lines)
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return lines


def test_days_become_train_and_valid_parquet_with_hashed_ids(tmp_path):
    convert = load("convert.py")
    day0 = write_day(tmp_path / "day_0", 300, 0)
    day1 = write_day(tmp_path / "day_1.gz", 200, 1)
    out = tmp_path / "criteo"
    result = convert.main(
        [
            str(tmp_path / "day_0"),
            str(tmp_path / "day_1.gz"),
            "--out",
            str(out),
            "--hash-buckets",
            "16",
            "--row-group-rows",
            "64",
        ]
    )
    assert result.rows_in == 500 == result.rows_out["train"] + result.rows_out["valid"]
    assert 20 < result.rows_out["valid"] < 90
    train = tabloader.Dataset(str(out / "train"))
    assert train.partition_rows.max() <= 64
    types = {f.name: str(f.type) for f in train.schema}
    assert types["label"] == "float" and types["I1"] == "float" and types["C1"] == "int64"

    table = pq.read_table(
        [str(p) for p in sorted((out / "train").glob("*.parquet"))]
        + [str(p) for p in sorted((out / "valid").glob("*.parquet"))]
    )
    lines = day0 + day1
    by_line = {tuple(line): line for line in lines}
    assert len(by_line) == len(lines)  # random rows: each line is unique
    # Missing values get id 0; equal values equal ids, all within the buckets.
    ids = table.column("C1").to_numpy()
    assert ids.min() >= 0 and ids.max() < 16
    labels = table.column("label").to_numpy()
    assert sorted(labels.tolist()) == sorted(float(line[0]) for line in lines)
    i1 = np.sort(table.column("I1").to_numpy())
    raw_i1 = np.array([float(line[1]) if line[1] else 0.0 for line in lines])
    np.testing.assert_allclose(i1, np.sort(np.log1p(np.clip(raw_i1, 0, None))), rtol=1e-6)
    missing = sum(1 for line in lines if line[14] == "")
    assert int((ids == 0).sum()) == missing


def test_the_training_script_reads_what_the_converter_writes(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    convert = load("convert.py")
    write_day(tmp_path / "day_0", 400, 2)
    convert.main([str(tmp_path / "day_0"), "--out", str(tmp_path / "criteo")])
    monkeypatch.syspath_prepend(str(EXAMPLES))
    train = load("train_torch.py")
    history = train.main(
        [
            "--data",
            str(tmp_path / "criteo"),
            "--epochs",
            "1",
            "--batch-size",
            "64",
            "--threads",
            "1",
        ]
    )
    assert len(history) == 1 and np.isfinite(history[0]["valid_loss"])
    assert "example_flags" in sys.modules
