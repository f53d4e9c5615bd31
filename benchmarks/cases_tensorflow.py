"""Keras cases for the throughput benchmark: KerasSequenceLoader against plain tf.data.

- ``KerasSequenceLoader``: one epoch of ``loader[i]`` for ``i in range(len(loader))``
  between ``on_epoch_begin`` and ``on_epoch_end``, as ``model.fit`` asks for batches;
  every item is a ready ``(features, labels)`` pair of ``tf.Tensor``. Rows counted.
- The textbook alternative: the files loaded with pandas, then
  ``tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(...).batch(...)``.
  The pandas load runs once, untimed (reported as the case's setup), as a training
  script would load once and iterate every epoch. Its shuffle buffer holds
  ``SHUFFLE_BUFFER`` rows (a whole-dataset buffer costs several kB per row in tf.data),
  and a pass stops after ``ROW_BUDGET`` rows: tf.data pays per row, so the rate does
  not depend on how many rows are measured.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable

import numpy as np

try:
    from common import Case, Context
except ImportError:  # imported as part of a package
    from benchmarks.common import Case, Context

SHUFFLE_BUFFER = 65_536
ROW_BUDGET = 1 << 18


def cases(ctx: Context) -> list[Case]:
    if importlib.util.find_spec("tensorflow") is None or ctx.device != "cpu":
        return []

    def keras_case(shuffle: bool) -> Case:
        def make() -> Callable[[], int]:
            from tabloader.tensorflow import KerasSequenceLoader

            loader = KerasSequenceLoader(
                ctx.files,
                **ctx.loader_options,
                shuffle=shuffle,
                seed=0,
                device=None,
            )

            def run() -> int:
                rows = 0
                loader.on_epoch_begin()
                for i in range(len(loader)):
                    features, _ = loader[i]
                    rows += int(next(iter(features.values())).shape[0])
                loader.on_epoch_end()
                return rows

            return run

        kind = "shuffle" if shuffle else "no shuffle"
        return Case(
            name=f"KerasSequenceLoader, {kind}",
            make=make,
            note="loader[i] over an epoch; items are dicts of tf.Tensor",
        )

    return [keras_case(True), keras_case(False), _tf_data_case(ctx)]


def _tf_data_case(ctx: Context) -> Case:
    def make() -> Callable[[], int]:
        import pandas as pd
        import tensorflow as tf

        columns = ctx.columns
        frame = pd.concat(
            [pd.read_parquet(f, columns=columns) for f in ctx.files], ignore_index=True
        )
        features = {c: frame[c].to_numpy(np.int64) for c in ctx.cats}
        features.update({c: frame[c].to_numpy(np.float32) for c in ctx.conts})
        labels = {c: frame[c].to_numpy(np.float32) for c in ctx.labels}
        del frame
        xy = (features, labels[ctx.labels[0]] if len(ctx.labels) == 1 else labels)

        def run() -> int:
            dataset = tf.data.Dataset.from_tensor_slices(xy)
            dataset = dataset.shuffle(min(SHUFFLE_BUFFER, ctx.rows)).batch(ctx.batch_size)
            rows = 0
            steps = math.ceil(min(ROW_BUDGET, ctx.rows) / ctx.batch_size)
            for _, batch_labels in dataset.take(steps):
                rows += int(tf.nest.flatten(batch_labels)[0].shape[0])
            return rows

        return run

    return Case(
        name="pandas + tf.data from_tensor_slices, shuffle",
        make=make,
        group="baseline",
        note=(
            f"load untimed (setup); shuffle buffer {SHUFFLE_BUFFER} rows; stops after "
            f"{ROW_BUDGET} rows"
        ),
        every_size=False,
    )
