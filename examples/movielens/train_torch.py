"""Train a recommender on MovieLens ratings with tabloader: will a user like a movie?

Reads ``train.parquet`` and ``valid.parquet`` from ``--data`` (by default
``examples/movielens/data/``, written by ``examples/movielens/prepare.py``) with columns
``userId`` and ``movieId`` (int64 ids), ``label`` (float32: 1 when the rating is above 3)
and, optionally, the movie's genres: a list column ``genres`` (``prepare.py --genres``),
read as a multi-hot feature (tabloader's ``sparse_names``) and pooled by a
``torch.nn.EmbeddingBag``, or else numeric genre columns used as continuous features.
Missing files are an error. ``--synthetic`` trains on generated ratings instead. ::

    python examples/movielens/prepare.py --genres
    python examples/movielens/train_torch.py                    # with the genres
    python examples/movielens/train_torch.py --without-genres   # the same, without them
    python examples/movielens/train_torch.py --synthetic

The model embeds users and movies, feeds the two embeddings, their product and the
pooled genre embedding through an MLP, and prints per epoch the training loss, the
validation loss and the validation AUC, next to the AUC of a constant predictor (0.5)
for comparison. Run it with and without ``--without-genres`` to see what the genres add.
The shared flags are described in ``examples/example_flags.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

import tabloader
from tabloader.torch import DLDataLoader, TorchAsyncItr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_flags as common

DEFAULT_DATA = Path(__file__).resolve().parent / "data"
CATS = ["userId", "movieId"]
LABELS = ["label"]
GENRES = "genres"


roc_auc = common.roc_auc
"""Area under the ROC curve (shared by the MovieLens examples)."""


def feature_columns(path: str) -> list[str]:
    """The numeric columns besides ids and label (genre flags, if the data has them)."""
    schema = pq.read_schema(path)
    return [
        field.name
        for field in schema
        if field.name not in CATS + LABELS
        and (
            pa.types.is_integer(field.type)
            or pa.types.is_floating(field.type)
            or pa.types.is_boolean(field.type)
        )
    ]


def to_device(batch: Sequence[Any], device: torch.device) -> list[Any]:
    """A batch's tensors (and its list columns' ``(values, offsets)``) on ``device``."""

    def move(item: Any) -> Any:
        if isinstance(item, dict):
            return {name: move(value) for name, value in item.items()}
        if isinstance(item, tuple):
            return tuple(move(value) for value in item)
        return item.to(device, non_blocking=True)

    return [move(item) for item in batch]


class Recommender(nn.Module):
    """User and movie embeddings, their product, the continuous features and, with
    ``genres`` > 0, the mean embedding of the movie's genres (an ``EmbeddingBag``)."""

    def __init__(self, users: int, movies: int, n_conts: int, dim: int, genres: int = 0) -> None:
        super().__init__()
        self.users = nn.Embedding(users, dim)
        self.movies = nn.Embedding(movies, dim)
        self.genres = nn.EmbeddingBag(genres, dim, mode="mean") if genres else None
        width = (4 if genres else 3) * dim + n_conts
        self.mlp = nn.Sequential(nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(
        self, x_cat: torch.Tensor, x_cont: torch.Tensor, lists: dict[str, Any] | None = None
    ) -> torch.Tensor:
        user, movie = self.users(x_cat[:, 0]), self.movies(x_cat[:, 1])
        parts = [user, movie, user * movie, x_cont]
        if self.genres is not None and lists is not None:
            values, offsets = lists[GENRES]  # offsets: each movie's first genre, as
            parts.append(self.genres(values, offsets))  # EmbeddingBag takes them
        return self.mlp(torch.cat(parts, dim=1)).squeeze(1)


def build_parser() -> argparse.ArgumentParser:
    return common.parser(
        __doc__,
        data=DEFAULT_DATA,
        rows=100_000,
        epochs=3,
        batch_size=1024,
        lr=0.01,
        embedding_dim=32,
        torch=True,
        genres=True,
    )


def predict(model: nn.Module, loader: DLDataLoader) -> tuple[np.ndarray, np.ndarray, float]:
    """Labels, scores and mean log loss over one pass of ``loader``."""
    labels, scores, loss = [], [], 0.0
    loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
    model.eval()
    with torch.no_grad():
        for batch in loader:
            x_cat, x_cont, y, *lists = to_device(batch, next(model.parameters()).device)
            logits = model(x_cat, x_cont, *lists)
            loss += loss_fn(logits, y).item()
            labels.append(y.cpu().numpy())
            scores.append(logits.cpu().numpy())
    model.train()
    y_all = np.concatenate(labels)
    return y_all, np.concatenate(scores), loss / len(y_all)


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    """Train; return per epoch the train loss, validation loss and AUC, and the AUC of a
    constant predictor."""
    parser = build_parser()
    args = parser.parse_args(argv)
    data = common.data_directory(
        args,
        parser,
        needs=["train.parquet", "valid.parquet"],
        generate=lambda directory: common.write_synthetic_movielens(directory, args.rows),
        how_to_get="examples/movielens/prepare.py writes them",
    )
    train_path, valid_path = str(data / "train.parquet"), str(data / "valid.parquet")
    threads = common.torch_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    genres = 0 if args.without_genres else common.genre_lists([train_path, valid_path])[0]
    if genres:  # the genres as a multi-hot list column, pooled by an EmbeddingBag
        conts: list[str] = []
        shown = f"{genres} genres in an EmbeddingBag"
    else:  # numeric genre flags, if any (none with --without-genres)
        conts = [] if args.without_genres else feature_columns(train_path)
        shown = f"{len(conts)} genre features"
    sparse = {"sparse_names": [GENRES]} if genres else {}
    # Embedding rows for every id of both splits, from the parquet footers.
    ids = tabloader.Dataset([train_path, valid_path]).cardinalities(CATS)
    users, movies = ids["userId"], ids["movieId"]
    print(f"{users} user ids, {movies} movie ids, {shown}, PyTorch threads: {threads}")

    train = TorchAsyncItr(
        tabloader.Dataset(train_path),
        cats=CATS,
        conts=conts,
        labels=LABELS,
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        device="cpu",  # list columns reach PyTorch from the CPU; the loop moves batches
        **sparse,
    )
    valid = TorchAsyncItr(
        tabloader.Dataset(valid_path),
        cats=CATS,
        conts=conts,
        labels=LABELS,
        batch_size=args.batch_size,
        device="cpu",
        **sparse,
    )
    train_loader = DLDataLoader(train, batch_size=None, collate_fn=lambda x: x)
    valid_loader = DLDataLoader(valid, batch_size=None, collate_fn=lambda x: x)

    model = Recommender(users, movies, len(conts), args.embedding_dim, genres).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()

    rows = len(train.loader.dataset)
    history = []
    for epoch in range(args.epochs):
        started = time.perf_counter()
        total, batches = 0.0, 0
        with common.epoch_progress(rows, epoch) as progress:
            for batch in train_loader:
                x_cat, x_cont, y, *lists = to_device(batch, device)
                loss = loss_fn(model(x_cat, x_cont, *lists), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += loss.item()
                batches += 1
                progress.update(len(y))
        seconds = time.perf_counter() - started
        labels, scores, valid_loss = predict(model, valid_loader)
        auc = roc_auc(labels, scores)
        constant_auc = roc_auc(labels, np.zeros_like(scores))
        history.append(
            {
                "epoch": epoch,
                "train_loss": total / batches,
                "valid_loss": valid_loss,
                "valid_auc": auc,
                "constant_auc": constant_auc,
            }
        )
        print(
            f"epoch {epoch}: train loss {total / batches:.4f}, valid loss {valid_loss:.4f}, "
            f"valid AUC {auc:.4f} (constant predictor: {constant_auc:.4f}), {seconds:.1f} s, "
            f"{rows / seconds:,.0f} rows/s"
        )
    return history


if __name__ == "__main__":
    main()
