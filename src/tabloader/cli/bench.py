"""``tabloader bench``: time full epochs of a loader on the user's data, with the loader's
keywords as flags, and say what was measured and where the time went.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Iterable
from typing import Any, TextIO

import pyarrow as pa

from tabloader.cli.flags import (
    column_flags,
    dataset_paths,
    fill_null_flag,
    name_pairs,
    non_negative,
    parse_fill_null,
    positive,
    refuse_text_files,
    split_names,
    wrap,
)
from tabloader.dataset import Dataset
from tabloader.errors import ColumnTypeError, InvalidArgumentError, PerformanceWarning
from tabloader.frameworks import FRAMEWORKS
from tabloader.inspection import counted, suggest_columns
from tabloader.loader import Loader
from tabloader.plan import rank_rows
from tabloader.progress import Progress
from tabloader.threads import thread_advice, usable_cores

__all__ = ["DESCRIPTION", "EPILOG", "HELP", "NAME", "MEASURED", "add_flags", "bench_columns", "run"]

NAME = "bench"
HELP = "time full epochs on your data and say where the time goes"
DESCRIPTION = wrap(
    "Time full epochs of a loader on your data, with the loader's keywords as flags, "
    "and say what was measured and where the time went."
)

MEASURED = {
    "none": "tabloader.Loader (an array per column)",
    **{framework.name: framework.measured for framework in FRAMEWORKS},
}
"""What ``bench --framework`` times, in the words its report uses: the core loader, or
a framework's adapter."""


def add_flags(p: argparse.ArgumentParser) -> None:
    """``tabloader bench``'s flags."""
    p.add_argument("path", nargs="+", help="files, directories, globs or URLs")
    group = p.add_argument_group("what to load")
    column_flags(group, "to load", "without these or --columns, the suggested ones")
    group.add_argument(
        "--columns",
        action="append",
        help="columns to load, comma separated, each as a cat, cont or label by its type and "
        "name as inspect suggests (default: see --cats)",
    )
    fill_null_flag(group)
    group.add_argument(
        "--sparse", action="append", help="list (multi-hot) columns, comma separated"
    )
    group.add_argument(
        "--sparse-max", metavar="NAME=N,...", help="most values per row of each list column"
    )
    group.add_argument(
        "--sparse-as-dense",
        action="store_true",
        help="deliver list columns padded to --sparse-max values",
    )
    group.add_argument(
        "--cat-dtype",
        help="dtype of categorical columns (default: int64; int32 with --framework jax)",
    )
    group.add_argument("--cont-dtype", default="float32", help="dtype of continuous columns")
    group.add_argument("--label-dtype", default="float32", help="dtype of label columns")
    group = p.add_argument_group("how to batch and shuffle")
    group.add_argument("--batch-size", type=positive, default=65_536, help="rows per batch")
    group.add_argument("--epochs", type=positive, default=1, help="epochs to time")
    group.add_argument(
        "--shuffle",
        choices=["true", "false", "global"],
        default="true",
        help="true: row groups in a new order and rows mixed within chunks every epoch; "
        "global: all rows mixed (needs --cache)",
    )
    group.add_argument(
        "--no-shuffle",
        dest="shuffle",
        action="store_const",
        const="false",
        help="the same as --shuffle false (default: off)",
    )
    group.add_argument(
        "--stored-order",
        action="store_true",
        help="shuffled batches keep their rows in stored order (shuffle_within_batch=False)",
    )
    group.add_argument("--seed", type=non_negative, default=0, help="seed of the shuffle")
    group.add_argument("--drop-last", action="store_true", help="drop a short last batch")
    group.add_argument(
        "--chunk-rows",
        type=positive,
        help="most rows read and shuffled together (default: chunks of 128 MiB)",
    )
    group.add_argument(
        "--parts-per-chunk",
        type=positive,
        help="row groups read and shuffled together, instead of --chunk-rows",
    )
    group.add_argument("--prefetch", type=positive, default=1, help="chunks decoded ahead")
    group = p.add_argument_group("where, and how often the files are read")
    group.add_argument(
        "--device",
        help="cpu, cuda or cuda:N (default: $TABLOADER_DEVICE, else the GPU when cudf and "
        "cupy can use one, else the CPU)",
    )
    group.add_argument(
        "--cache",
        choices=["none", "memory", "disk"],
        default="none",
        help="keep decoded rows after the first epoch, in memory or on disk",
    )
    group.add_argument(
        "--cache-dir",
        help="directory of disk caches (default: $TABLOADER_CACHE_DIR, else ~/.cache/tabloader)",
    )
    group.add_argument(
        "--cache-max-bytes",
        type=positive,
        help="largest cache to write (default: no limit "
        "but the free disk space or half the memory)",
    )
    group.add_argument(
        "--ranks", type=positive, default=1, help="ranks the data is split across (global_size)"
    )
    group.add_argument(
        "--rank", type=non_negative, default=0, help="the rank to time (global_rank)"
    )
    group.add_argument(
        "--framework",
        choices=list(MEASURED),
        default="none",
        help="none: the core Loader; "
        + "; ".join(f"{framework.name}: {framework.classes}" for framework in FRAMEWORKS),
    )


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Time ``args.epochs`` epochs of the loader the flags describe, and say where the time went."""
    args.path = dataset_paths(args.path)
    refuse_text_files(args.path, command="bench")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the loader says the same when it is built
        dataset = Dataset(args.path)
    options = _loader_options(args, dataset)
    if not any(split_names(getattr(args, kind)) for kind in ("cats", "conts", "labels", "columns")):
        flags = " ".join(
            f"--{k} {','.join(v)}"
            for k, v in options.items()
            if k in ("cats", "conts", "labels") and v
        )
        err.write(f"tabloader: loading the suggested columns: {flags or 'none'}\n")
    iterable, loader = _batches(args, options)
    if args.framework == "torch":
        import torch

        advice = thread_advice(torch.get_num_threads(), usable_cores())
        if advice:
            err.write(f"tabloader: warning: {advice}\n")
    batches = len(loader)
    lo, hi = rank_rows(
        loader.dataset.num_rows, global_rank=loader.global_rank, global_size=loader.global_size
    )
    epoch_rows = min(hi - lo, batches * args.batch_size)
    out.write(_what_was_measured(args, loader, epoch_rows) + "\n")
    started = time.perf_counter()
    for epoch in range(args.epochs):
        epoch_started = time.perf_counter()
        with (
            Progress(epoch_rows, desc=f"epoch {epoch}", stream=err) as progress,
            warnings.catch_warnings(),
        ):
            # said above, not again as TorchAsyncItr's warning when the epoch starts
            warnings.filterwarnings("ignore", "PyTorch uses", PerformanceWarning)
            for i, _ in enumerate(iterable):
                progress.update(min(args.batch_size, epoch_rows - i * args.batch_size))
        seconds = time.perf_counter() - epoch_started
        out.write(f"epoch {epoch}: {epoch_rows:,} rows in {seconds:.2f}s\n")
    elapsed = time.perf_counter() - started
    stats = loader.stats()
    rows = stats.rows if stats.rows else epoch_rows * args.epochs
    out.write(
        f"throughput: {rows / elapsed:,.0f} rows/s, {stats.batches / elapsed:,.1f} batches/s "
        f"over the {counted(args.epochs, 'epoch')}, end to end\n"
        f"background: read {stats.read_seconds:.2f}s, assemble {stats.assemble_seconds:.2f}s, "
        f"shuffle and slice {stats.batch_seconds:.2f}s"
        + (f"; {stats.cache_epochs} epoch(s) from the cache" if stats.cache_epochs else "")
        + "\n"
        f"waiting for data: {stats.wait_seconds:.2f}s of {stats.consume_seconds:.2f}s "
        f"({stats.input_bound_fraction:.0%} input-bound)\n"
    )
    return 0


def bench_columns(args: argparse.Namespace, dataset: Dataset | None) -> dict[str, list[str]]:
    """The columns ``bench`` loads: ``--cats``/``--conts``/``--labels``; or ``--columns``,
    each given the use ``inspect`` suggests for its type and name; or, with neither, every
    column ``inspect`` suggests."""
    given = {kind: split_names(getattr(args, kind)) for kind in ("cats", "conts", "labels")}
    chosen = split_names(getattr(args, "columns", None))
    if any(given.values()) or dataset is None:
        if chosen:
            raise InvalidArgumentError("give --columns or --cats/--conts/--labels, not both")
        return given
    schema = dataset.schema
    if chosen:
        missing = [n for n in chosen if schema.get_field_index(n) < 0]
        if missing:
            dataset.column_types(missing)  # the error naming the closest column
        schema = pa.schema([schema.field(n) for n in chosen])
    found = suggest_columns(schema)
    if chosen:
        left_out = [n for n in chosen if not any(n in names for names in found.values())]
        if left_out:
            raise ColumnTypeError(
                f"--columns {','.join(left_out)}: not numeric, so not loadable; leave "
                f"{'it' if len(left_out) == 1 else 'them'} out, or encode as numbers first"
            )
    return found


def _loader_options(args: argparse.Namespace, dataset: Dataset | None = None) -> dict[str, Any]:
    """The loader keywords the command line gives (columns: see `bench_columns`)."""
    shuffle: bool | str = "global" if args.shuffle == "global" else args.shuffle == "true"
    return {
        **bench_columns(args, dataset),
        "batch_size": args.batch_size,
        "shuffle": shuffle,
        "shuffle_within_batch": not args.stored_order,
        "seed": args.seed,
        "fill_null": parse_fill_null(args.fill_null),
        "cache": None if args.cache == "none" else args.cache,
        "cache_dir": args.cache_dir,
        "cache_max_bytes": args.cache_max_bytes,
        "sparse_names": split_names(args.sparse) or None,
        "sparse_max": _sparse_max(args.sparse_max),
        # (given only when asked for: JaxLoader, which always pads, refuses it)
        **({"sparse_as_dense": True} if args.sparse_as_dense else {}),
        "drop_last": args.drop_last,
        "prefetch": args.prefetch,
        "chunk_rows": args.chunk_rows,
        "parts_per_chunk": args.parts_per_chunk,
        "global_rank": args.rank,
        "global_size": args.ranks,
        "cont_dtype": args.cont_dtype,
        "label_dtype": args.label_dtype,
        **({} if args.cat_dtype is None else {"cat_dtype": args.cat_dtype}),
    }


def _sparse_max(text: str | None) -> dict[str, int] | None:
    if text is None:
        return None
    found = {}
    for name, value in name_pairs(text, "--sparse-max").items():
        try:
            found[name] = int(value)
        except ValueError:
            raise InvalidArgumentError(
                f"--sparse-max {name} must be an integer, got {value!r}"
            ) from None
    return found


def _batches(args: argparse.Namespace, options: dict[str, Any]) -> tuple[Iterable[Any], Loader]:
    """The iterable to time, and the core loader whose statistics describe it."""
    dataset = Dataset(args.path)
    device = getattr(args, "device", None)
    if args.framework == "torch":
        from tabloader.torch import DLDataLoader, TorchAsyncItr

        torch_dataset = TorchAsyncItr(dataset, device=device, **options)
        torch_loader = DLDataLoader(torch_dataset, batch_size=None, collate_fn=lambda x: x)
        return torch_loader, torch_dataset.loader
    if args.framework == "tensorflow":
        from tabloader.tensorflow import KerasSequenceLoader

        keras_loader = KerasSequenceLoader(dataset, device=device, **options)

        def items() -> Iterable[Any]:
            for i in range(len(keras_loader)):
                yield keras_loader[i]
            keras_loader.on_epoch_end()

        return _Repeatable(items), keras_loader.loader
    if args.framework == "jax":
        from tabloader.jax import JaxLoader

        jax_loader = JaxLoader(dataset, device=device, **options)
        return jax_loader, jax_loader.loader
    loader = Loader(dataset, device=device, **options)
    return loader, loader


class _Repeatable:
    def __init__(self, make: Any) -> None:
        self.make = make

    def __iter__(self) -> Any:
        return iter(self.make())


def _what_was_measured(args: argparse.Namespace, loader: Loader, rows: int) -> str:
    lists = set(loader.sparse_names)
    kinds = {
        "cats": len([c for c in loader.cats if c not in lists]),
        "conts": len(loader.conts),
        "labels": len(loader.labels),
        "list columns": len(lists),
    }
    columns = ", ".join(f"{n} {k[:-1] if n == 1 else k}" for k, n in kinds.items() if n)
    shuffle = "global" if loader.shuffle == "global" else "on" if loader.shuffle else "off"
    if loader.shuffle and not loader.shuffle_within_batch:
        shuffle += " (rows in stored order within a batch)"
    cache = getattr(loader.cache, "mode", None) if loader.cache is not None else None
    return (
        f"measured: {MEASURED[args.framework]} on {loader.device}; "
        f"{counted(args.epochs, 'epoch')} of {rows:,} rows "
        f"(rank {loader.global_rank} of {loader.global_size}) in batches of "
        f"{loader.batch_size:,}; {columns}; shuffle {shuffle}; cache {cache or 'none'}"
        + (f"; --fill-null {args.fill_null}" if args.fill_null is not None else "")
    )


_BENCH_EXAMPLES = """\
examples:
  tabloader bench data/train                         the suggested columns, one epoch
  tabloader bench data/train --fill-null 0 --epochs 3 --batch-size 8192
  tabloader bench data/train --cats C1,C2 --conts I1,I2 --labels label --framework torch
  tabloader bench data/train --columns C1,I1,label --shuffle global --cache memory
  tabloader bench data/train --sparse genres --device cuda

It prints what it measured (adapter, device, epochs, rows, batch size, shuffle, cache),
each epoch's time, rows/s and batches/s end to end, and where the time went: the
loader's background work (read, assemble, shuffle and slice) and the time the loop
waited for data.
"""

EPILOG = _BENCH_EXAMPLES
