"""Train a small embedding + MLP click model on Criteo-like parquet data with tabloader.

On your data, or on generated data in seconds on a CPU::

    python examples/criteo/train_torch.py --synthetic
    python examples/criteo/train_torch.py --data /path/to/criteo --epochs 3 --batch-size 65536

``--data`` is a directory with ``train/`` and ``valid/`` subdirectories of parquet files
with the Criteo columns (``label``, ``I1..I13``, ``C1..C26``), as
``examples/criteo/convert.py`` writes them; a missing or empty one is an error.
``--synthetic`` trains on ``--rows`` generated Criteo-like rows instead
(``tabloader.synthetic``: not real click data), written on the first run to
``examples/criteo/data/synthetic/`` (or ``--data``). Each categorical column gets an
embedding table with a row per id, sized from the parquet footers
(``Dataset.embedding_sizes``), at most ``--buckets`` rows: larger ids are hashed into it.
The shared flags are described in ``examples/example_flags.py``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

import tabloader
from tabloader.synthetic import CATS, CONTS, LABELS
from tabloader.torch import DLDataLoader, TorchAsyncItr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_flags as common

DEFAULT_DATA = Path(__file__).resolve().parent / "data"


class ClickModel(nn.Module):
    """An embedding table per categorical column, concatenated with the continuous
    columns and fed through an MLP that outputs one logit. ``sizes`` holds each table's
    rows and width, in the order of the columns."""

    def __init__(self, sizes: Sequence[tuple[int, int]], n_conts: int) -> None:
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(rows, width) for rows, width in sizes)
        self.register_buffer("rows", torch.tensor([rows for rows, _ in sizes]))
        self.mlp = nn.Sequential(
            nn.Linear(sum(width for _, width in sizes) + n_conts, 128),
            nn.ReLU(),
            nn.Linear(128, 64),
            nn.ReLU(),
            nn.Linear(64, 1),
        )

    def forward(self, x_cat: torch.Tensor, x_cont: torch.Tensor) -> torch.Tensor:
        ids = x_cat % self.rows  # ids past a table capped by --buckets are hashed into it
        embedded = [table(ids[:, k]) for k, table in enumerate(self.embeddings)]
        return self.mlp(torch.cat([*embedded, x_cont], dim=1)).squeeze(1)


def table_sizes(files: Sequence[str], buckets: int, dim: int) -> list[tuple[int, int]]:
    """Each categorical column's embedding table: its ids' count from the parquet footers
    (``Dataset.cardinalities``), at most ``buckets`` rows, ``dim`` wide."""
    rows = tabloader.Dataset(list(files)).cardinalities(CATS)
    return [(min(rows[name], buckets), dim) for name in CATS]


def find_data(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> tuple[list[str], list[str]]:
    """The train and valid files: from ``--data``, or generated with ``--synthetic``."""
    data = common.data_directory(
        args,
        parser,
        needs=["train/", "valid/"],
        generate=lambda directory: common.write_synthetic_criteo(directory, args.rows),
        how_to_get="examples/criteo/convert.py writes them",
    )
    return common.parquet_files(data / "train"), common.parquet_files(data / "valid")


def build_parser() -> argparse.ArgumentParser:
    parser = common.parser(
        __doc__,
        data=DEFAULT_DATA,
        rows=200_000,
        epochs=2,
        batch_size=4096,
        lr=0.003,
        embedding_dim=16,
        torch=True,
    )
    parser.add_argument(
        "--buckets", type=int, default=100_000, help="most rows of one embedding table"
    )
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    return parser


def evaluate(model: nn.Module, loader: DLDataLoader, device: torch.device) -> float:
    """Mean log loss over one pass of ``loader``."""
    loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
    total, rows = 0.0, 0
    model.eval()
    with torch.no_grad():
        for x_cat, x_cont, y in loader:
            total += float(loss_fn(model(x_cat, x_cont), y))
            rows += len(y)
    model.train()
    return total / rows


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    """Train; return per epoch the mean train loss, the validation loss, and the
    validation loss of a constant predictor for comparison."""
    parser = build_parser()
    args = parser.parse_args(argv)
    threads = common.torch_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # Worker processes need batches on the host; the training loop moves them.
    placement = {"device": "cpu"} if args.workers else common.loader_placement(device)
    train_files, valid_files = find_data(args, parser)

    train = TorchAsyncItr(
        tabloader.Dataset(train_files),
        cats=CATS,
        conts=CONTS,
        labels=LABELS,
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        **placement,
    )
    valid = TorchAsyncItr(
        tabloader.Dataset(valid_files),
        cats=CATS,
        conts=CONTS,
        labels=LABELS,
        batch_size=args.batch_size,
        **placement,
    )
    train_loader = DLDataLoader(
        train, batch_size=None, collate_fn=lambda x: x, num_workers=args.workers
    )
    valid_loader = DLDataLoader(valid, batch_size=None, collate_fn=lambda x: x)

    sizes = table_sizes(train_files + valid_files, args.buckets, args.embedding_dim)
    model = ClickModel(sizes, len(CONTS)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()

    labels = torch.cat([y for _, _, y in valid_loader])
    baseline = constant_loss(float(labels.float().mean()))
    print(f"valid loss of a constant predictor (the positive rate): {baseline:.4f}")
    rows = len(train.loader.dataset)
    print(f"{rows:,} training rows in {len(train)} batches, PyTorch threads: {threads}")
    history = []
    for epoch in range(args.epochs):
        started = time.perf_counter()
        total, batches = 0.0, 0
        with common.epoch_progress(rows, epoch) as progress:
            for x_cat, x_cont, y in train_loader:
                x_cat, x_cont, y = (t.to(device, non_blocking=True) for t in (x_cat, x_cont, y))
                loss = loss_fn(model(x_cat, x_cont), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += loss.item()
                batches += 1
                progress.update(len(y))
        seconds = time.perf_counter() - started
        train_loss = total / batches
        valid_loss = evaluate(model, valid_loader, device)
        history.append(
            {
                "epoch": epoch,
                "train_loss": train_loss,
                "valid_loss": valid_loss,
                "constant_loss": baseline,
            }
        )
        print(
            f"epoch {epoch}: train loss {train_loss:.4f}, valid loss {valid_loss:.4f} "
            f"({batches} batches, {seconds:.1f} s, {rows / seconds:,.0f} rows/s)"
        )
    return history


def constant_loss(rate: float) -> float:
    """Log loss of always predicting the positive rate ``rate``."""
    if rate in (0.0, 1.0):
        return 0.0
    return -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))


if __name__ == "__main__":
    main()
