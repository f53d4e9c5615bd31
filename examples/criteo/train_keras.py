"""Train a click model with Keras on synthetic Criteo-like data, fed by tabloader.

::

    python examples/criteo/train_keras.py --rows 1000000 --epochs 2

The first run writes ``--rows`` synthetic training rows (and a fifth as many validation
rows) with :func:`tabloader.synthetic.write_criteo_like` under ``--path``; later runs
reuse them. The data is synthetic (Criteo's schema: a label, 13 continuous ``I*`` and
26 categorical ``C*`` columns), with a label that depends on a few columns, so the
model has something to learn; it says nothing about real click logs.

The model hashes each categorical id into at most ``--buckets`` embedding rows,
log-scales and batch-normalises the continuous columns, and runs an MLP over the lot.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras

from tabloader.synthetic import CARDINALITIES, CATS, CONTS, LABELS, write_criteo_like
from tabloader.tensorflow import KerasSequenceLoader, KerasSequenceValidater

DEFAULT_PATH = Path(__file__).resolve().parent / "data"


def ensure_data(path: Path, rows: int) -> tuple[list[str], list[str]]:
    """Training and validation files under ``path``, written if missing."""
    splits = {}
    for split, count, seed in (("train", rows, 1), ("valid", max(rows // 5, 1), 2)):
        directory = path / f"{split}-{count}"
        files = sorted(str(p) for p in directory.glob("*.parquet"))
        if not files:
            print(f"writing {count} synthetic rows to {directory}", flush=True)
            files = write_criteo_like(
                directory, rows=count, files=min(4, count), row_group_size=131_072, seed=seed
            )
        splits[split] = files
    return splits["train"], splits["valid"]


def build_model(buckets: int, dim: int) -> keras.Model:
    inputs = {name: keras.Input(shape=(), name=name, dtype="int64") for name in CATS}
    inputs.update({name: keras.Input(shape=(), name=name) for name in CONTS})
    parts = []
    for name in CATS:
        size = min(CARDINALITIES[name], buckets)
        ids = keras.ops.mod(inputs[name], size)
        parts.append(keras.layers.Embedding(size, dim, name=f"{name}_embedding")(ids))
    conts = keras.ops.stack([inputs[name] for name in CONTS], axis=-1)
    parts.append(keras.layers.BatchNormalization(name="conts")(keras.ops.log1p(conts)))
    x = keras.layers.Concatenate()(parts)
    x = keras.layers.Dense(128, activation="relu")(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    output = keras.layers.Dense(1, activation="sigmoid", name="click")(x)
    return keras.Model(inputs, output)


class PrintEpoch(keras.callbacks.Callback):
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
    parser.add_argument("--path", type=Path, default=DEFAULT_PATH, help="where the data lives")
    parser.add_argument("--rows", type=int, default=500_000, help="training rows")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--buckets", type=int, default=100_000, help="embedding rows at most")
    parser.add_argument("--embedding-dim", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    train_files, valid_files = ensure_data(args.path, args.rows)
    columns = {"cat_names": CATS, "cont_names": CONTS, "label_names": LABELS}
    train = KerasSequenceLoader(
        train_files, batch_size=args.batch_size, shuffle=True, seed=args.seed, **columns
    )
    valid = KerasSequenceLoader(
        valid_files, batch_size=args.batch_size * 4, shuffle=False, **columns
    )
    model = build_model(args.buckets, args.embedding_dim)
    model.compile(
        keras.optimizers.Adam(1e-3), "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")]
    )
    print(f"{args.rows} training rows in {len(train)} batches", flush=True)
    return model.fit(
        train,
        epochs=args.epochs,
        verbose=0,
        callbacks=[KerasSequenceValidater(valid), PrintEpoch()],
    )


if __name__ == "__main__":
    main(sys.argv[1:])
