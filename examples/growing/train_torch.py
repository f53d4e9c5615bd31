"""Train on a directory that a sampler keeps filling: every epoch reads what is there now.

A writer process adds a parquet file every ``--interval`` seconds (written under a
temporary name, then renamed, so a half-written file is never listed) and evicts the
oldest once more than ``--keep`` files exist. The training loop reads the directory with
``Dataset(..., refresh=True)``: each epoch lists it again when it starts, so the log
shows the epochs growing, then sliding along as old files are evicted.

Usage:
    python examples/growing/train_torch.py                      # about 10 seconds
    python examples/growing/train_torch.py --epochs 20 --interval 2 --keep 8
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import tabloader
from tabloader.torch import DLDataLoader, TorchAsyncItr

ROWS_PER_FILE = 20_000
FEATURES = [f"x{i}" for i in range(8)]


def write_file(directory: Path, index: int) -> None:
    rng = np.random.default_rng(index)
    x = rng.standard_normal((ROWS_PER_FILE, len(FEATURES))).astype(np.float32)
    y = (x @ np.linspace(-1, 1, len(FEATURES)) > 0).astype(np.float32)
    table = pa.table({**{n: x[:, i] for i, n in enumerate(FEATURES)}, "label": y})
    temporary = directory / f"part-{index:05d}.parquet.tmp"  # skipped by the listing
    pq.write_table(table, temporary, row_group_size=5_000)
    os.replace(temporary, directory / f"part-{index:05d}.parquet")  # appears complete


def next_index(directory: Path) -> int:
    """The index after the highest file's in ``directory`` (a run on an earlier run's
    directory numbers on: its new files sort last, and the oldest are evicted)."""
    found = [p.name[len("part-") :].split(".")[0] for p in directory.glob("part-*.parquet")]
    return max((int(i) for i in found if i.isdigit()), default=-1) + 1


def writer(
    directory: Path, first: int, interval: float, keep: int, stop: multiprocessing.Event
) -> None:
    index = first
    while not stop.wait(interval):
        write_file(directory, index)
        index += 1
        files = sorted(directory.glob("part-*.parquet"))
        for old in files[: max(0, len(files) - keep)]:
            old.unlink()  # evicted between epochs, or during one (on_missing="skip")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="directory (default: a temporary one)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between files")
    parser.add_argument("--keep", type=int, default=5, help="files kept at most")
    parser.add_argument("--batch-size", type=int, default=4096)
    args = parser.parse_args()

    directory = args.data or Path(tempfile.mkdtemp(prefix="tabloader-growing-"))
    directory.mkdir(parents=True, exist_ok=True)
    first = next_index(directory)
    write_file(directory, first)  # something to train on from the start

    stop = multiprocessing.Event()
    sampler = multiprocessing.Process(
        target=writer, args=(directory, first + 1, args.interval, args.keep, stop), daemon=True
    )
    sampler.start()
    try:
        dataset = tabloader.Dataset(str(directory), refresh=True, on_missing="skip")
        itr = TorchAsyncItr(
            dataset,
            conts=FEATURES,
            labels=["label"],
            batch_size=args.batch_size,
            shuffle=True,
            seed=0,
            device="cpu",
        )
        loader = DLDataLoader(itr, batch_size=None)
        model = torch.nn.Linear(len(FEATURES), 1)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
        for epoch in range(args.epochs):
            rows, loss_sum = 0, 0.0
            for _, x_cont, y in loader:  # no categorical columns: x_cat is empty
                loss = torch.nn.functional.binary_cross_entropy_with_logits(
                    model(x_cont).squeeze(1), y
                )
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                rows += len(y)
                loss_sum += float(loss.detach()) * len(y)
            print(
                f"epoch {epoch}: {len(dataset.files)} files, {rows:,} rows, "
                f"{len(loader)} batches, loss {loss_sum / rows:.3f}",
                flush=True,
            )
            time.sleep(args.interval)  # let the sampler add something
        skipped = dataset.rows_skipped
        if skipped:
            print(f"{skipped:,} rows were replaced because their file was evicted mid-epoch")
    finally:
        stop.set()
        sampler.join(timeout=10)


if __name__ == "__main__":
    main()
