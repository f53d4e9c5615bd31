"""Train a like/dislike model on MovieLens with plain JAX, fed by tabloader's JaxLoader.

Run ``prepare.py`` first (``--genres`` adds the movie's genres as a list column), then::

    python examples/movielens/train_jax.py --epochs 3
    python examples/movielens/train_jax.py --without-genres   # the same, without them
    python examples/movielens/train_jax.py --synthetic        # generated ratings instead

(``--data`` names another directory that ``prepare.py`` wrote; a missing one is an
error. The shared flags are described in ``examples/example_flags.py``.)

The model embeds users and movies and, when the data has them, averages the embeddings
of the movie's genres (a list column, padded to the longest list, with its lengths);
it feeds the embeddings and their product through a small MLP and predicts whether the
rating is above 3. It is written in plain JAX, trained with SGD with momentum, one
jit-compiled step per batch: ``pad_last=True`` gives every batch, the last included,
the same shape, so the step compiles once (see docs/jax.md). After each epoch it prints
the validation AUC next to the AUC of a constant predictor (0.5).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tabloader.jax import JaxLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_flags as common

DEFAULT_DATA = Path(__file__).resolve().parent / "data"
CATS = ["userId", "movieId"]

Params = dict[str, Any]


def init_params(key: Any, users: int, movies: int, genres: int, dim: int) -> Params:
    """Embedding tables and a two-layer MLP, small random values."""
    keys = jax.random.split(key, 5)
    width = (4 if genres else 3) * dim
    params = {
        "users": 0.05 * jax.random.normal(keys[0], (users, dim)),
        "movies": 0.05 * jax.random.normal(keys[1], (movies, dim)),
        "w1": jax.random.normal(keys[2], (width, 64)) / np.sqrt(width),
        "b1": jnp.zeros(64),
        "w2": jax.random.normal(keys[3], (64, 1)) / 8.0,
        "b2": jnp.zeros(1),
    }
    if genres:
        params["genres"] = 0.05 * jax.random.normal(keys[4], (genres, dim))
    return params


def logits(params: Params, features: dict[str, Any]) -> Any:
    """One logit per row: does the user like the movie?"""
    user = params["users"][features["userId"]]
    movie = params["movies"][features["movieId"]]
    parts = [user, movie, user * movie]
    if "genres" in params:
        ids, lengths = features["genres"]  # [B, longest] padded, [B]
        real = (jnp.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(jnp.float32)
        pooled = jnp.sum(params["genres"][ids] * real[..., None], axis=1)
        parts.append(pooled / jnp.maximum(jnp.sum(real, axis=1, keepdims=True), 1.0))
    hidden = jax.nn.relu(jnp.concatenate(parts, axis=1) @ params["w1"] + params["b1"])
    return (hidden @ params["w2"] + params["b2"])[:, 0]


def loss_sum(params: Params, features: dict[str, Any], labels: Any, mask: Any) -> Any:
    """Binary cross-entropy summed over the real rows (``mask``: rows pad_last added)."""
    z = logits(params, features)
    losses = jnp.maximum(z, 0) - z * labels + jnp.log1p(jnp.exp(-jnp.abs(z)))
    return jnp.sum(jnp.where(mask, losses, 0.0))


@jax.jit
def train_step(
    params: Params, velocity: Params, features: dict[str, Any], labels: Any, mask: Any, lr: Any
) -> tuple[Params, Params, Any]:
    """SGD with momentum on the mean loss of the batch's real rows."""
    rows = jnp.maximum(jnp.sum(mask), 1)
    total, grads = jax.value_and_grad(loss_sum)(params, features, labels, mask)
    velocity = jax.tree.map(lambda v, g: 0.9 * v + g / rows, velocity, grads)
    params = jax.tree.map(lambda p, v: p - lr * v, params, velocity)
    return params, velocity, total / rows


@jax.jit
def evaluate_step(params: Params, features: dict[str, Any], labels: Any, mask: Any) -> Any:
    return loss_sum(params, features, labels, mask), logits(params, features)


def build_parser() -> Any:
    return common.parser(
        __doc__,
        data=DEFAULT_DATA,
        rows=100_000,
        epochs=3,
        batch_size=1024,
        lr=1.0,
        embedding_dim=32,
        torch=False,
        genres=True,
    )


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    """Train; return per epoch the train loss, validation loss and AUC, and the AUC of a
    constant predictor."""
    parser = build_parser()
    args = parser.parse_args(argv)
    data = common.data_directory(
        args,
        parser,
        needs=["train.parquet", "valid.parquet", "meta.json"],
        generate=lambda directory: common.write_synthetic_movielens(directory, args.rows),
        how_to_get="examples/movielens/prepare.py writes them",
    )
    meta = json.loads((data / "meta.json").read_text())
    splits = [str(data / "train.parquet"), str(data / "valid.parquet")]
    genres, longest = (0, 0) if args.without_genres else common.genre_lists(splits)
    columns: dict[str, Any] = {"cats": CATS, "labels": ["label"]}
    if genres:
        columns.update(sparse_names=["genres"], sparse_max={"genres": max(longest, 1)})
    train = JaxLoader(
        splits[0],
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        pad_last=True,
        **columns,
    )
    valid = JaxLoader(splits[1], batch_size=args.batch_size * 4, pad_last=True, **columns)
    users, movies = meta["cardinalities"]["userId"], meta["cardinalities"]["movieId"]
    print(
        f"{len(train.loader.dataset)} training rows in {len(train)} batches, "
        f"{len(valid.loader.dataset)} validation rows, {genres} genres, on {train.device}",
        flush=True,
    )
    params = init_params(jax.random.PRNGKey(args.seed), users, movies, genres, args.embedding_dim)
    velocity = jax.tree.map(jnp.zeros_like, params)
    lr = jnp.float32(args.lr)
    rows = len(train.loader.dataset)
    history = []
    for epoch in range(args.epochs):
        started = time.perf_counter()
        losses = []
        with common.epoch_progress(rows, epoch + 1) as progress:
            for features, labels, mask in train:
                params, velocity, loss = train_step(params, velocity, features, labels, mask, lr)
                losses.append(loss)
                progress.update(int(mask.sum()))
        train_loss = float(jnp.mean(jnp.stack(losses)))
        seconds = time.perf_counter() - started
        y, scores, total = [], [], 0.0
        for features, labels, mask in valid:
            batch_loss, batch_scores = evaluate_step(params, features, labels, mask)
            real = np.asarray(mask)
            total += float(batch_loss)
            y.append(np.asarray(labels)[real])
            scores.append(np.asarray(batch_scores)[real])
        labels_all, scores_all = np.concatenate(y), np.concatenate(scores)
        auc = common.roc_auc(labels_all, scores_all)
        constant = common.roc_auc(labels_all, np.zeros_like(scores_all))
        history.append(
            {
                "epoch": epoch,
                "train_loss": train_loss,
                "valid_loss": total / len(labels_all),
                "valid_auc": auc,
                "constant_auc": constant,
            }
        )
        print(
            f"epoch {epoch + 1}: train loss {train_loss:.4f}, valid loss "
            f"{total / len(labels_all):.4f}, valid AUC {auc:.4f} (constant predictor: "
            f"{constant:.4f}), {seconds:.1f} s, {rows / seconds:,.0f} rows/s",
            flush=True,
        )
    return history


if __name__ == "__main__":
    main()
