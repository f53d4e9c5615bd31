"""Keras cases for the throughput benchmark: KerasSequenceLoader against plain tf.data.

- ``KerasSequenceLoader``: one epoch of ``loader[i]`` for ``i in range(len(loader))``
  between ``on_epoch_begin`` and ``on_epoch_end``, as ``model.fit`` asks for batches;
  every item is a ready ``(features, labels)`` pair of ``tf.Tensor``. Rows counted.
- The textbook alternative: the files loaded with pandas, then
  ``tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(...).batch(...)``.
  The pandas load runs once, in ``setup`` (its time is written into the case's note,
  not into the timed pass), as a training script would load once and iterate every
  epoch. Its shuffle buffer holds ``SHUFFLE_BUFFER`` rows (a whole-dataset buffer costs
  several kB per row in tf.data), and a pass stops after ``ROW_BUDGET`` rows: tf.data
  pays per row, so the rate does not depend on how many rows are measured.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

try:
    from common import Case, Context
except ImportError:  # imported as part of a package
    from benchmarks.common import Case, Context

SHUFFLE_BUFFER = 65_536
ROW_BUDGET = 1 << 18


def cases(ctx: Context) -> list[Case]:
    try:
        import tensorflow  # noqa: F401

        from tabloader.tensorflow import KerasSequenceLoader
    except ImportError:
        return []

    def keras_case(shuffle: bool) -> Case:
        loader = KerasSequenceLoader(
            ctx.files,
            batch_size=ctx.batch_size,
            cat_names=ctx.cats,
            cont_names=ctx.conts,
            label_names=ctx.labels,
            shuffle=shuffle,
            seed=0,
            device=None if ctx.device == "cpu" else ctx.device,
        )

        def run() -> int:
            rows = 0
            loader.on_epoch_begin()
            for i in range(len(loader)):
                features, _ = loader[i]
                rows += int(next(iter(features.values())).shape[0])
            loader.on_epoch_end()
            return rows

        kind = "shuffle" if shuffle else "no shuffle"
        return Case(
            name=f"KerasSequenceLoader ({kind})",
            run=run,
            note="loader[i] over an epoch; items are dicts of tf.Tensor",
        )

    return [keras_case(True), keras_case(False), _tf_data_case(ctx)]


def _tf_data_case(ctx: Context) -> Case:
    import pandas as pd
    import tensorflow as tf

    data: dict[str, Any] = {}
    case = Case(
        name="pandas + tf.data from_tensor_slices (shuffle)", run=lambda: 0, group="baseline"
    )

    def setup() -> None:
        started = time.perf_counter()
        columns = ctx.cats + ctx.conts + ctx.labels
        frame = pd.concat(
            [pd.read_parquet(f, columns=columns) for f in ctx.files], ignore_index=True
        )
        features = {c: frame[c].to_numpy(np.int64) for c in ctx.cats}
        features.update({c: frame[c].to_numpy(np.float32) for c in ctx.conts})
        labels = {c: frame[c].to_numpy(np.float32) for c in ctx.labels}
        data["xy"] = (features, labels[ctx.labels[0]] if len(ctx.labels) == 1 else labels)
        seconds = time.perf_counter() - started
        case.note = (
            f"pandas load {seconds:.1f}s once, untimed; shuffle buffer {SHUFFLE_BUFFER} rows; "
            f"passes stop after {ROW_BUDGET} rows"
        )

    def run() -> int:
        if "xy" not in data:
            setup()
        dataset = tf.data.Dataset.from_tensor_slices(data["xy"])
        dataset = dataset.shuffle(min(SHUFFLE_BUFFER, ctx.rows)).batch(ctx.batch_size)
        rows = 0
        for _, labels in dataset.take(math.ceil(min(ROW_BUDGET, ctx.rows) / ctx.batch_size)):
            rows += int(tf.nest.flatten(labels)[0].shape[0])
        return rows

    case.run = run
    case.setup = setup
    return case
