"""Train a click model with Keras on Criteo-like parquet data, fed by tabloader.

::

    python examples/criteo/train_keras.py --synthetic --rows 1000000 --epochs 2
    python examples/criteo/train_keras.py --data /path/to/criteo

``--data`` is a directory with ``train/`` and ``valid/`` parquet files with the Criteo
columns (``label``, ``I1..I13``, ``C1..C26``), as ``examples/criteo/convert.py`` writes
them; a missing or empty one is an error. ``--synthetic`` trains on ``--rows`` generated
rows instead (:func:`tabloader.synthetic.write_criteo_like`, written on the first run to
``examples/criteo/data/synthetic/`` or ``--data`` and reused after): Criteo's schema with
a label that depends on a few columns, so the model has something to learn; it says
nothing about real click logs.

The model gives each categorical column an embedding table with a row per id (sized
from the parquet footers, ``Dataset.cardinalities``), hashing ids into at most
``--buckets`` rows,
log-scales and batch-normalises the continuous columns, and runs an MLP over the lot.
The shared flags are described in ``examples/example_flags.py``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras

import tabloader
from tabloader.synthetic import CATS, CONTS, LABELS
from tabloader.tensorflow import KerasSequenceLoader, KerasSequenceValidater

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_flags as common

DEFAULT_DATA = Path(__file__).resolve().parent / "data"
ID_DTYPE = "int32" if keras.backend.backend() == "jax" else "int64"
"""The ids' dtype in a batch: JAX holds no 64-bit integers by default (docs/keras.md)."""


def build_model(rows: dict[str, int], buckets: int, dim: int) -> keras.Model:
    inputs = {name: keras.Input(shape=(), name=name, dtype=ID_DTYPE) for name in CATS}
    inputs.update({name: keras.Input(shape=(), name=name) for name in CONTS})
    parts = []
    for name in CATS:
        size = min(rows[name], buckets)
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
    parser = common.parser(
        __doc__,
        data=DEFAULT_DATA,
        rows=500_000,
        epochs=2,
        batch_size=8192,
        lr=1e-3,
        embedding_dim=8,
        torch=False,
    )
    parser.add_argument("--buckets", type=int, default=100_000, help="embedding rows at most")
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    data = common.data_directory(
        args,
        parser,
        needs=["train/", "valid/"],
        generate=lambda directory: common.write_synthetic_criteo(directory, args.rows),
        how_to_get="examples/criteo/convert.py writes them",
    )
    train_files = common.parquet_files(data / "train")
    valid_files = common.parquet_files(data / "valid")
    columns = {"cat_names": CATS, "cont_names": CONTS, "label_names": LABELS}
    train = KerasSequenceLoader(
        train_files, batch_size=args.batch_size, shuffle=True, seed=args.seed, **columns
    )
    valid = KerasSequenceLoader(
        valid_files, batch_size=args.batch_size * 4, shuffle=False, **columns
    )
    # A row per id of both splits, from the parquet footers, at most --buckets rows.
    rows = tabloader.Dataset(train_files + valid_files).cardinalities(CATS)
    model = build_model(rows, args.buckets, args.embedding_dim)
    model.compile(
        keras.optimizers.Adam(args.lr),
        "binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc")],
    )
    rows = len(train.loader.dataset)
    print(f"{rows:,} training rows in {len(train)} batches", flush=True)
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
