"""merlin-dataloader, the loader of NVIDIA's Merlin, on the CPU: the library tabloader's
PyTorch and Keras adapters take their names from.

Its releases need older pandas, numpy and dask than the project's environment has, so it
runs in an interpreter of its own: ``throughput.py --merlin-python PATH`` (or
``MERLIN_PYTHON=PATH``) names it, and without it there are no merlin cases. How to
build that environment is in ``benchmarks/README.md``.

On a GPU (``--device cuda``), ``throughput.py --merlin-gpu FOLDER`` (or ``MERLIN_GPU``)
names a folder that ``stage_merlin.sh`` staged: merlin's packages in ``FOLDER/site``, put
first on the case's ``PYTHONPATH`` beside the host's cudf, and dask 2024.12.1 in
``FOLDER/dask-legacy``. Two cases try merlin-dataloader on the GPU there: with the host's
dask, and with the older dask put first (merlin-core 23.8 needs the dask DataFrame that
dask removed in 2025.1). Either may fail; the report keeps its error.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from common import Case, Context

MERLIN_SHUFFLE = "merlin-dataloader (PyTorch), shuffle"
MERLIN_GPU = "merlin-dataloader 23.8 on the GPU (shuffle)"
MERLIN_GPU_LEGACY_DASK = "merlin-dataloader 23.8 on the GPU, dask 2024.12.1 (shuffle)"


def cases(ctx: Context) -> list[Case]:
    if ctx.device == "cuda":
        return gpu_cases(ctx)
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


def gpu_cases(ctx: Context) -> list[Case]:
    """merlin-dataloader's PyTorch loader reading on the GPU, from a staged folder."""
    staged = os.environ.get("MERLIN_GPU")
    if not staged or not ctx.gpu:
        return []
    site, legacy = Path(staged) / "site", Path(staged) / "dask-legacy"
    found = [
        Case(
            MERLIN_GPU,
            _on_gpu(ctx, False),
            group="baseline",
            every_size=False,
            pythonpath=(str(site),),
        )
    ]
    if legacy.is_dir():
        found.append(
            Case(
                MERLIN_GPU_LEGACY_DASK,
                _on_gpu(ctx, True),
                group="baseline",
                every_size=False,
                pythonpath=(str(legacy), str(site)),
            )
        )
    return found


def _on_gpu(ctx: Context, legacy_dask: bool) -> Callable[[], Callable[[], int]]:
    def make() -> Callable[[], int]:
        if legacy_dask:  # dask 2024.12's legacy DataFrame, which merlin-core 23.8 uses
            import dask

            dask.config.set({"dataframe.query-planning": False})
        import merlin.io
        import torch
        from merlin.dataloader.torch import Loader
        from merlin.schema import Tags

        dataset = merlin.io.Dataset(ctx.files, engine="parquet", cpu=False)
        schema = dataset.schema.select_by_name(ctx.columns)
        for name in ctx.labels:
            schema[name] = schema[name].with_tags([Tags.TARGET])
        dataset.schema = schema
        loader = Loader(dataset, batch_size=ctx.batch_size, shuffle=True)

        def run() -> int:
            rows = sum(len(labels) for _, labels in loader)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            return rows

        return run

    return make
