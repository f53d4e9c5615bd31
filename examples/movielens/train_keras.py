"""Train a like/dislike model on MovieLens with Keras, fed by tabloader.

Run ``prepare.py`` first, then::

    python examples/movielens/train_keras.py --epochs 3

(``--data`` names another directory that ``prepare.py`` wrote; a missing one is an
error. ``--synthetic`` trains on generated ratings instead. The shared flags are
described in ``examples/example_flags.py``.)

The model embeds users and movies and, when ``prepare.py --genres`` wrote them, the
movie's genres: the ``genres`` list column arrives padded (``sparse_as_dense``, padded
with an id past the last genre) and its genre embeddings are averaged over the real
entries (``--without-genres`` leaves them out, to compare). It feeds the embeddings and
their product through a small MLP and predicts whether the rating is above 3.
``KerasSequenceLoader`` serves shuffled training batches and ``KerasSequenceValidater``
adds ``val_loss`` and ``val_auc`` after every epoch; a constant prediction scores a
validation AUC of 0.5.
"""

from __future__ import annotations

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

import tabloader
from tabloader.tensorflow import KerasSequenceLoader, KerasSequenceValidater

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_flags as common

DEFAULT_DATA = Path(__file__).resolve().parent / "data"
ID_DTYPE = "int32" if keras.backend.backend() == "jax" else "int64"
"""The ids' dtype in a batch: JAX holds no 64-bit integers by default (docs/keras.md)."""


def build_model(cardinalities: dict[str, int], genres: int, longest: int, dim: int) -> keras.Model:
    """Users, movies and, with ``genres`` > 0, the mean embedding of a movie's genres,
    given as ``[B, longest]`` ids padded with ``genres`` (an id no genre has)."""
    user = keras.Input(shape=(), name="userId", dtype=ID_DTYPE)
    movie = keras.Input(shape=(), name="movieId", dtype=ID_DTYPE)
    inputs: dict[str, Any] = {"userId": user, "movieId": movie}
    u = keras.layers.Embedding(cardinalities["userId"], dim, name="user_embedding")(user)
    m = keras.layers.Embedding(cardinalities["movieId"], dim, name="movie_embedding")(movie)
    parts = [u, m, keras.layers.Multiply()([u, m])]
    if genres:
        ids = inputs["genres"] = keras.Input(shape=(longest,), name="genres", dtype=ID_DTYPE)
        vectors = keras.layers.Embedding(genres + 1, dim, name="genre_embedding")(ids)
        real = keras.ops.expand_dims(keras.ops.cast(ids < genres, "float32"), -1)
        total = keras.ops.sum(vectors * real, axis=1)
        parts.append(total / keras.ops.maximum(keras.ops.sum(real, axis=1), 1.0))
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
    parser = common.parser(
        __doc__,
        data=DEFAULT_DATA,
        rows=100_000,
        epochs=3,
        batch_size=1024,
        lr=2e-3,
        embedding_dim=16,
        torch=False,
        genres=True,
    )
    parser.add_argument("--max-rows", type=int, default=None, help="train on the first N rows")
    args = parser.parse_args(argv)
    data = common.data_directory(
        args,
        parser,
        needs=["train.parquet", "valid.parquet", "meta.json"],
        generate=lambda directory: common.write_synthetic_movielens(directory, args.rows),
        how_to_get="examples/movielens/prepare.py writes them",
    )
    meta = json.loads((data / "meta.json").read_text())
    keras.utils.set_random_seed(args.seed)

    train_source: Any = str(data / "train.parquet")
    if args.max_rows is not None:
        train_source = pq.read_table(train_source).slice(0, args.max_rows)
    splits = [data / "train.parquet", data / "valid.parquet"]
    genres, longest = (0, 0) if args.without_genres else common.genre_lists(splits)
    columns: dict[str, Any] = {"cat_names": ["userId", "movieId"]}
    if genres:  # a multi-hot list column, padded to the longest list with an unused id
        columns.update(
            sparse_names=["genres"],
            sparse_as_dense=True,
            sparse_max={"genres": longest},
            sparse_pad=genres,
        )
    train = KerasSequenceLoader(
        train_source,
        batch_size=args.batch_size,
        label_names=["label"],
        shuffle=True,
        seed=args.seed,
        **columns,
    )
    valid = KerasSequenceLoader(
        str(data / "valid.parquet"),
        batch_size=args.batch_size * 4,
        label_names=["label"],
        shuffle=False,
        **columns,
    )
    # Embedding rows for every id of both splits, from the parquet footers.
    cardinalities = tabloader.Dataset([str(p) for p in splits]).cardinalities(["userId", "movieId"])
    model = build_model(cardinalities, genres, longest, args.embedding_dim)
    model.compile(
        keras.optimizers.Adam(args.lr),
        "binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc")],
    )
    rows = len(train.loader.dataset)
    print(
        f"{rows} training rows in {len(train)} batches, {meta['rows']['valid']} validation rows, "
        f"{genres} genres",
        flush=True,
    )
    return model.fit(
        train,
        epochs=args.epochs,
        verbose=0,
        callbacks=[
            common.keras_progress(rows, args.batch_size),
            KerasSequenceValidater(valid),
            PrintEpoch(),
        ],
    )


if __name__ == "__main__":
    main(sys.argv[1:])
