"""examples/criteo/convert.py: Criteo day files to loader-ready parquet, with Dask."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import tabloader

pytestmark = pytest.mark.dask
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "criteo" / "convert.py"


def load_convert():
    spec = importlib.util.spec_from_file_location("criteo_convert", EXAMPLE)
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
    path.write_text("".join("\t".join(line) + "\n" for line in lines))
    return lines


def test_days_become_typed_categorified_parquet(tmp_path):
    convert = load_convert()
    day0 = write_day(tmp_path / "day_0", 300, 0)
    day1 = write_day(tmp_path / "day_1", 200, 1)
    out = tmp_path / "out"
    convert.convert([str(tmp_path / "day_*")], out, row_group_size=64, blocksize="16KB")

    ds = tabloader.Dataset(str(out))
    assert len(ds) == 500
    assert ds.partition_rows.max() <= 64
    types = {f.name: str(f.type) for f in ds.schema}
    assert types["label"] == "float" and types["I1"] == "float" and types["C1"] == "int64"

    table = pq.read_table(out)
    lines = day0 + day1
    raw_c1 = [line[14] for line in lines]
    ids = table.column("C1").to_numpy()
    # Missing values get id 0; equal values equal ids; the most frequent value id 1.
    assert all(i == 0 for i, v in zip(ids, raw_c1, strict=True) if v == "")
    seen = {}
    for i, v in zip(ids, raw_c1, strict=True):
        if v:
            assert seen.setdefault(v, i) == i
    values, counts = np.unique([v for v in raw_c1 if v], return_counts=True)
    assert seen[values[np.argmax(counts)]] == 1
    assert sorted(seen.values()) == list(range(1, len(seen) + 1))
    raw_i1 = np.array([float(line[1]) if line[1] else 0.0 for line in lines])
    np.testing.assert_allclose(
        table.column("I1").to_numpy(), np.log1p(np.clip(raw_i1, 0, None)), rtol=1e-6
    )

    # A validation day reuses the training vocabulary.
    valid = tmp_path / "valid"
    write_day(tmp_path / "day_v", 50, 0)  # same seed: same values as day_0's first rows
    convert.convert([str(tmp_path / "day_v")], valid, vocab_dir=out / "_vocab", row_group_size=64)
    np.testing.assert_array_equal(pq.read_table(valid).column("C1").to_numpy(), ids[:50])


def test_hashing_gives_ids_in_range_without_a_vocabulary(tmp_path):
    convert = load_convert()
    write_day(tmp_path / "day_0", 100, 3)
    out = tmp_path / "out"
    convert.convert([str(tmp_path / "day_0")], out, hash_buckets=16)
    ids = pq.read_table(out).column("C3").to_numpy()
    assert ids.min() >= 0 and ids.max() < 16
    assert not (out / "_vocab").exists()
    loader = tabloader.Loader(
        str(out), cats=convert.CATS, conts=convert.CONTS, labels=["label"], batch_size=32
    )
    assert sum(len(b["label"]) for b in loader) == 100
