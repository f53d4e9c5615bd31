"""merlin-dataloader, the loader of NVIDIA's Merlin, on the CPU: the library tabloader's
PyTorch and Keras adapters take their names from.

Its releases need older pandas, numpy and dask than the project's environment has, so it
runs in an interpreter of its own: ``throughput.py --merlin-python PATH`` (or
``MERLIN_PYTHON=PATH``) names it, and without it there are no merlin cases. How to
build that environment is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from common import Case, Context

MERLIN_SHUFFLE = "merlin-dataloader (PyTorch), shuffle"


def cases(ctx: Context) -> list[Case]:
    python = os.environ.get("MERLIN_PYTHON")
    if not python or ctx.device != "cpu":
        return []

    def make() -> Callable[[], int]:
        import merlin.io
        from merlin.dataloader.torch import Loader
        from merlin.schema import Tags

        dataset = merlin.io.Dataset(ctx.files, engine="parquet", cpu=True)
        schema = dataset.schema.select_by_name(ctx.columns)
        for name in ctx.labels:
            schema[name] = schema[name].with_tags([Tags.TARGET])
        dataset.schema = schema
        loader = Loader(dataset, batch_size=ctx.batch_size, shuffle=True)

        def run() -> int:
            return sum(len(labels) for _, labels in loader)

        return run

    return [Case(MERLIN_SHUFFLE, make, group="baseline", interpreter=python)]
