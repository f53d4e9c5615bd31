"""A new user's path, end to end, on generated data: their CSV files and one parquet file
they already had, ``tabloader convert``, ``inspect``, ``bench`` on data with nulls, and
training with embedding tables sized by the API, each step as they would run it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader
from tabloader.cli import main

pytestmark = pytest.mark.torch

CATS = ["user", "item", "city"]
CONTS = ["price", "age"]
ROWS_PER_FILE = 3_000


def their_rows(seed: int, rows: int) -> dict[str, np.ndarray]:
    """Click rows whose label depends on the item and the price; nulls in ``price`` and
    ``city`` (as in their real data: two columns with gaps)."""
    rng = np.random.default_rng(seed)
    item = rng.integers(0, 400, rows)
    price = rng.exponential(2.0, rows)
    logit = 1.5 * (item % 2 == 0) - 0.8 * price + 0.5
    return {
        "user": rng.integers(0, 300, rows),
        "item": item,
        "city": rng.integers(0, 40, rows).astype(float),
        "price": price,
        "age": rng.integers(18, 80, rows).astype(float),
        "click": (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int),
    }


def write_their_files(raw: Path) -> int:
    """Three CSV files with a header (empty fields for missing values) and one parquet
    file from an older pipeline with other widths (int32 ids, double prices)."""
    raw.mkdir()
    for k in range(3):
        columns = their_rows(k, ROWS_PER_FILE)
        lines = [",".join(columns)]
        for i in range(ROWS_PER_FILE):
            price = "" if i % 13 == 0 else f"{columns['price'][i]:.4f}"
            city = "" if i % 17 == 0 else str(int(columns["city"][i]))
            lines.append(
                f"{columns['user'][i]},{columns['item'][i]},{city},{price},"
                f"{int(columns['age'][i])},{columns['click'][i]}"
            )
        (raw / f"clicks-{k}.csv").write_text("\n".join(lines) + "\n")
    old = their_rows(9, ROWS_PER_FILE)
    table = pa.table(
        {
            "user": pa.array(old["user"], pa.int32()),
            "item": pa.array(old["item"], pa.int32()),
            "city": pa.array(old["city"].astype(np.int64), pa.int64()),
            "price": pa.array(old["price"], pa.float64()),
            "age": pa.array(old["age"], pa.float64()),
            "click": pa.array(old["click"], pa.int8()),
        }
    )
    pq.write_table(table, raw / "clicks-old.parquet")
    return 4 * ROWS_PER_FILE


def test_csv_to_convert_to_inspect_to_bench_to_training(tmp_path, capsys, monkeypatch):
    import torch
    from torch import nn

    from tabloader.torch import DLDataLoader, TorchAsyncItr

    monkeypatch.chdir(tmp_path)
    rows = write_their_files(tmp_path / "raw")

    # 1. Their files, as parquet the loader likes, split into train/ and valid/.
    assert main(["convert", "raw", "data", "--split", "valid=0.1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"converted 4 files: {rows:,} rows in, {rows:,} rows out" in out
    train_rows = len(tabloader.Dataset("data/train"))
    valid_rows = len(tabloader.Dataset("data/valid"))
    assert train_rows + valid_rows == rows

    # Pointing at the parent directory by mistake would mix the splits: refused.
    assert main(["inspect", "data"]) == 2
    err = capsys.readouterr().err
    assert "train/ (1 file), valid/ (1 file)" in err and "Dataset('data/train')" in err

    # 2. inspect: nulls in two columns would make training fail; the ids are there.
    assert main(["inspect", "data/train", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    nulls = {c["name"]: c["nulls"] for c in report["columns"] if c["nulls"]}
    assert set(nulls) == {"city", "price"}
    # ints in every file are ids; age, int in the CSV and double in the parquet, a float
    assert report["suggested"] == {"cats": CATS, "conts": CONTS, "labels": ["click"]}
    assert report["ids"]["item"]["rows"] == 400 and report["ids"]["item"]["row_groups_read"] == 0

    # 3. bench with the nulls filled, on the CLI, with the columns they will train on.
    flags = ["--cats", ",".join(CATS), "--conts", ",".join(CONTS), "--labels", "click"]
    flags += ["--fill-null", "city=0,price=0", "--batch-size", "1024", "--framework", "torch"]
    assert main(["bench", "data/train", *flags]) == 0
    out = capsys.readouterr().out
    assert out.startswith("measured: TorchAsyncItr through DLDataLoader (torch tensors) on cpu;")
    assert f"1 epoch of {train_rows:,} rows" in out and "--fill-null city=0,price=0" in out

    # 4. Training, with embedding tables sized from the footers of both splits.
    sizes = tabloader.Dataset(["data/train", "data/valid"]).embedding_sizes(CATS)
    assert sizes["item"] == (400, round(1.6 * 400**0.56)) and sizes["city"][0] == 40
    torch.manual_seed(0)

    def loader(split: str, shuffle: bool) -> DLDataLoader:
        dataset = TorchAsyncItr(tabloader.Dataset(f"data/{split}"), cats=CATS, conts=CONTS,
                                labels=["click"], fill_null={"city": 0, "price": 0},
                                batch_size=512, shuffle=shuffle, seed=0, device="cpu")  # fmt: skip
        return DLDataLoader(dataset, batch_size=None, collate_fn=lambda x: x)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tables = nn.ModuleList(nn.Embedding(n, w) for n, w in sizes.values())
            width = sum(w for _, w in sizes.values()) + len(CONTS)
            self.mlp = nn.Sequential(nn.Linear(width, 32), nn.ReLU(), nn.Linear(32, 1))

        def forward(self, x_cat: torch.Tensor, x_cont: torch.Tensor) -> torch.Tensor:
            parts = [table(x_cat[:, k]) for k, table in enumerate(self.tables)]
            return self.mlp(torch.cat([*parts, torch.log1p(x_cont)], dim=1)).squeeze(1)

    model = Model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005)
    loss_fn = nn.BCEWithLogitsLoss()
    train, valid = loader("train", shuffle=True), loader("valid", shuffle=False)

    def valid_loss() -> float:
        with torch.no_grad():
            losses = [loss_fn(model(c, x), y).item() * len(y) for c, x, y in valid]
        return sum(losses) / valid_rows

    before = valid_loss()
    seen = 0
    for _ in range(3):
        for x_cat, x_cont, y in train:
            loss = loss_fn(model(x_cat, x_cont), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += len(y)
    assert seen == 3 * train_rows  # every row, every epoch
    after = valid_loss()
    rate = sum(float(y.sum()) for _, _, y in valid) / valid_rows
    constant = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate))
    assert after < constant - 0.02, (before, after, constant)  # it learned from the features
