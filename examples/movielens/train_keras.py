"""Train a like/dislike model on MovieLens with Keras, fed by tabloader.

Run ``prepare.py`` first, then::

    python examples/movielens/train_keras.py --epochs 3

The model embeds users and movies (and reads the genre columns when ``prepare.py``
wrote them), feeds the embeddings and their product through a small MLP and predicts
whether the rating is above 3. ``KerasSequenceLoader`` serves shuffled training batches
and ``KerasSequenceValidater`` adds ``val_loss`` and ``val_auc`` after every epoch; a
constant prediction scores a validation AUC of 0.5.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import pyarrow.parquet as pq

from tabloader.tensorflow import KerasSequenceLoader, KerasSequenceValidater

DEFAULT_DATA = Path(__file__).resolve().parent / "data"


def build_model(cardinalities: dict[str, int], genres: Sequence[str], dim: int) -> keras.Model:
    user = keras.Input(shape=(), name="userId", dtype="int64")
    movie = keras.Input(shape=(), name="movieId", dtype="int64")
    inputs: dict[str, Any] = {"userId": user, "movieId": movie}
    u = keras.layers.Embedding(cardinalities["userId"], dim, name="user_embedding")(user)
    m = keras.layers.Embedding(cardinalities["movieId"], dim, name="movie_embedding")(movie)
    parts = [u, m, keras.layers.Multiply()([u, m])]
    if genres:
        inputs.update({g: keras.Input(shape=(), name=g) for g in genres})
        parts.append(keras.ops.stack([inputs[g] for g in genres], axis=-1))
    x = keras.layers.Concatenate()(parts)
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    output = keras.layers.Dense(1, activation="sigmoid", name="like")(x)
    return keras.Model(inputs, output)


class PrintEpoch(keras.callbacks.Callback):
    """One line per epoch, after the validater has added the val_* figures."""

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        logs = logs or {}
        print(
            f"epoch {epoch + 1}: loss {logs['loss']:.4f} auc {logs['auc']:.4f} | "
            f"val_loss {logs['val_loss']:.4f} val_auc {logs['val_auc']:.4f} "
            f"({time.perf_counter() - self.started:.1f}s)",
            flush=True,
        )


def main(argv: Sequence[str] | None = None) -> keras.callbacks.History:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="prepare.py's --out")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--embedding-dim", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--max-rows", type=int, default=None, help="train on the first N rows")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    meta_path = args.data / "meta.json"
    if not meta_path.is_file():
        parser.error(f"no prepared data in {args.data}: run examples/movielens/prepare.py first")
    meta = json.loads(meta_path.read_text())
    keras.utils.set_random_seed(args.seed)

    train_source: Any = str(args.data / "train.parquet")
    if args.max_rows is not None:
        train_source = pq.read_table(train_source).slice(0, args.max_rows)
    columns = {"cat_names": ["userId", "movieId"], "cont_names": meta["genres"]}
    train = KerasSequenceLoader(
        train_source,
        batch_size=args.batch_size,
        label_names=["label"],
        shuffle=True,
        seed=args.seed,
        **columns,
    )
    valid = KerasSequenceLoader(
        str(args.data / "valid.parquet"),
        batch_size=args.batch_size * 4,
        label_names=["label"],
        shuffle=False,
        **columns,
    )
    model = build_model(meta["cardinalities"], meta["genres"], args.embedding_dim)
    model.compile(
        keras.optimizers.Adam(args.learning_rate),
        "binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc")],
    )
    print(
        f"{meta['rows']['train'] if args.max_rows is None else len(train_source)} training "
        f"rows in {len(train)} batches, {meta['rows']['valid']} validation rows",
        flush=True,
    )
    return model.fit(
        train,
        epochs=args.epochs,
        verbose=0,
        callbacks=[KerasSequenceValidater(valid), PrintEpoch()],
    )


if __name__ == "__main__":
    main(sys.argv[1:])
