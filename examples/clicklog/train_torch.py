"""Train an embedding + MLP click model on data ``tabloader convert`` wrote, and score it.

    python examples/clicklog/train_torch.py --data data/day1 --cats user_id,item_id,country \\
        --conts price,dwell_sec --label click --fill-null price=0,dwell_sec=0 --save model.pt
    python examples/clicklog/train_torch.py --data data/day2 --evaluate model.pt ...

Nothing in it knows the data: the columns, the fill values and the embedding tables all
come from the command line and from what ``convert`` wrote. ``--data`` is a converted
destination: ``train/`` and ``valid/``, or the rows themselves for ``--evaluate``, and
``_vocabulary/``, whose sizes give the embedding tables of the categorified columns
(``Dataset.embedding_sizes(..., vocabulary=...)``); other id columns get max id + 1
rows. ``--evaluate`` scores a saved model on other data converted with the same
vocabulary (the same ids), and prints its AUC. ``--rows`` sizes the tables of columns
whose every id the training data may not show, such as the parts of a time
(``event_time_dow=7``: a day of logs holds one day of the week).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import tabloader
from tabloader.torch import DLDataLoader, TorchAsyncItr


class ClickModel(nn.Module):
    """An embedding table per id column, concatenated with the numbers, through an MLP."""

    def __init__(self, sizes: Sequence[tuple[int, int]], n_conts: int) -> None:
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(rows, width) for rows, width in sizes)
        width = sum(w for _, w in sizes) + n_conts
        self.mlp = nn.Sequential(nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x_cat: torch.Tensor, x_cont: torch.Tensor) -> torch.Tensor:
        embedded = [table(x_cat[:, k]) for k, table in enumerate(self.embeddings)]
        return self.mlp(torch.cat([*embedded, torch.log1p(x_cont.clamp(min=0))], dim=1))[:, 0]


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """The area under the ROC curve: the chance a click scores above a non-click."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    positive = labels > 0.5
    n_pos, n_neg = positive.sum(), (~positive).sum()
    if not n_pos or not n_neg:
        return 0.5
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def batches(path: Path, args: argparse.Namespace, *, shuffle: bool) -> Any:
    items = TorchAsyncItr(
        tabloader.Dataset(str(path)),
        cats=args.cats,
        conts=args.conts,
        labels=[args.label],
        batch_size=args.batch_size,
        shuffle=shuffle,
        seed=args.seed,
        fill_null=args.fill_null,
    )
    return DLDataLoader(items, batch_size=None, collate_fn=lambda x: x)


def score(model: ClickModel, path: Path, args: argparse.Namespace) -> float:
    model.eval()
    labels, scores = [], []
    with torch.no_grad():
        for x_cat, x_cont, y in batches(path, args, shuffle=False):
            scores.append(model(x_cat, x_cont).numpy())
            labels.append(y.reshape(-1).numpy())
    return auc(np.concatenate(labels), np.concatenate(scores))


def names(text: str) -> list[str]:
    return [n for n in text.split(",") if n]


def fills(text: str | None) -> dict[str, float] | None:
    if not text:
        return None
    return {k: float(v) for k, v in (pair.split("=") for pair in text.split(","))}


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="a converted destination")
    parser.add_argument("--cats", type=names, required=True, help="id columns, comma separated")
    parser.add_argument("--conts", type=names, default=[], help="number columns")
    parser.add_argument("--label", required=True, help="the 0/1 label column")
    parser.add_argument("--fill-null", type=fills, help="NAME=VALUE,... as for tabloader")
    parser.add_argument(
        "--rows",
        type=fills,
        help="NAME=ROWS,...: embedding rows of columns whose ids the training data does not "
        "all show, such as the parts of a time (event_time_dow=7)",
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", type=Path, help="write the trained model here")
    parser.add_argument("--evaluate", type=Path, help="score this saved model on --data")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.rows or {}) - set(args.cats))
    if unknown:
        parser.error(f"--rows names {', '.join(unknown)}, which --cats does not")
    torch.manual_seed(args.seed)
    if not args.data.is_dir():
        parser.error(f"{args.data} does not exist: tabloader convert writes it")
    sizes = tabloader.Dataset(str(args.data / "train" if args.evaluate is None else args.data))
    if args.evaluate is not None:
        saved = torch.load(args.evaluate, weights_only=True)
        model = ClickModel(saved["sizes"], len(args.conts))
        model.load_state_dict(saved["weights"])
        found = score(model, args.data, args)
        print(f"AUC on {args.data}: {found:.4f}")
        return [{"auc": found}]
    tables = sizes.embedding_sizes(args.cats, vocabulary=args.data, max_dim=32)
    for name, rows in (args.rows or {}).items():
        tables[name] = (int(rows), tables[name][1])
    print("embedding tables: " + ", ".join(f"{n} {r:,} x {w}" for n, (r, w) in tables.items()))
    model = ClickModel(list(tables.values()), len(args.conts))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    history = []
    train = batches(args.data / "train", args, shuffle=True)  # one loader: each epoch reshuffled
    for epoch in range(1, args.epochs + 1):
        model.train()
        total, rows = 0.0, 0
        for x_cat, x_cont, y in train:
            optimizer.zero_grad()
            loss = loss_fn(model(x_cat, x_cont), y.reshape(-1))
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            rows += len(y)
        history.append(
            {"train_loss": total / rows, "valid_auc": score(model, args.data / "valid", args)}
        )
        print(
            f"epoch {epoch}: train loss {history[-1]['train_loss']:.4f}, "
            f"valid AUC {history[-1]['valid_auc']:.4f} ({rows:,} rows)"
        )
    if args.save is not None:
        torch.save({"sizes": list(tables.values()), "weights": model.state_dict()}, args.save)
        print(f"saved the model to {args.save}")
    return history


if __name__ == "__main__":
    main(sys.argv[1:])
